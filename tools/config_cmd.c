/* `ctrain config [default|show|update]` (tools/config_cmd.h). */
#include "tools/config_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cuda.h"
#include "tools/config_ask.h"
#include "tools/config_file.h"
#include "tools/launch.h"

extern char **environ;

/* The configuration code's messages start "config: "; after "ctrain config ...: " that
 * would say it twice. */
static const char *last_error(void)
{
    const char *m = ct_last_error();
    return strncmp(m, "config: ", 8) ? m : m + 8;
}

static void usage_ask(FILE *f)
{
    fputs("usage: ctrain config [--config_file PATH]\n"
          "       ctrain config default|show|update [...]   (ctrain config SUBCOMMAND --help)\n"
          "\n"
          "Asks Accelerate's questions on this terminal and writes the answers as the launch\n"
          "configuration that `ctrain launch` reads. An existing file's values are offered as\n"
          "the defaults.\n"
          "\n"
          "  --config_file PATH   where to write (default: $CTRAIN_CONFIG_FILE, else\n"
          "                       ~/.cache/ctrain/default_config.yaml)\n"
          "  -h, --help           this text\n"
          "\n"
          "Subcommands:\n"
          "  default   write the defaults without questions (as `accelerate config default`)\n"
          "  show      print a configuration and what `ctrain launch` does with it\n"
          "  update    rewrite a configuration of an older form in the current one\n",
          f);
}

static void usage_default(FILE *f)
{
    fputs("usage: ctrain config default [--config_file PATH] [--mixed_precision no|fp16|bf16|fp8]\n"
          "\n"
          "Writes a configuration for this machine without questions, as `accelerate config\n"
          "default`: one process per GPU (MULTI_GPU when there are several), or one process\n"
          "on the CPU when no GPU can be used. An existing file is left as it is.\n"
          "\n"
          "  --config_file PATH            where to write (default: $CTRAIN_CONFIG_FILE, else\n"
          "                                ~/.cache/ctrain/default_config.yaml)\n"
          "  --mixed_precision no|fp16|bf16|fp8   (default no)\n"
          "  -h, --help                    this text\n",
          f);
}

static void usage_show(FILE *f)
{
    fputs("usage: ctrain config show [FILE]\n"
          "\n"
          "Prints the configuration FILE (default: $CTRAIN_CONFIG_FILE, else\n"
          "~/.cache/ctrain/default_config.yaml) as ctrain writes it, then what `ctrain launch`\n"
          "does with it: processes, machines, strategy, precision, and the launch flags and\n"
          "environment of rank 0 it amounts to.\n"
          "\n"
          "  --config_file PATH   the same as FILE\n"
          "  -h, --help           this text\n",
          f);
}

static void usage_update(FILE *f)
{
    fputs("usage: ctrain config update [--config_file PATH]\n"
          "\n"
          "Reads a configuration written by an older ctrain or Accelerate (numeric\n"
          "fsdp_sharding_strategy, fsdp_backward_prefetch_policy, fp16: true, missing keys,\n"
          "...) and rewrites it in the current form, keeping every value ctrain uses.\n"
          "\n"
          "  --config_file PATH   the file (default: $CTRAIN_CONFIG_FILE, else\n"
          "                       ~/.cache/ctrain/default_config.yaml)\n"
          "  -h, --help           this text\n",
          f);
}

typedef struct {
    const char *config_file;
    const char *mixed_precision;
    const char *positional;
    bool help;
} cmd_args;

/* `--flag value`, `--flag=value`; which flags a subcommand takes is in allowed. */
static int parse(const char *cmd, int argc, char **argv, const char *const *allowed, bool positional, cmd_args *a)
{
    *a = (cmd_args){0};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            a->help = true;
            continue;
        }
        if (s[0] != '-' || !s[1]) {
            if (!positional || a->positional) {
                fprintf(stderr, "ctrain %s: unexpected argument '%s' (ctrain %s --help)\n", cmd, s, cmd);
                return 2;
            }
            a->positional = s;
            continue;
        }
        const char *name = s + (s[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        const char **dst = NULL;
        for (int k = 0; allowed[k]; k++)
            if (strlen(allowed[k]) == n && !strncmp(allowed[k], name, n))
                dst = !strcmp(allowed[k], "config_file") ? &a->config_file : &a->mixed_precision;
        if (!dst) {
            fprintf(stderr, "ctrain %s: unknown flag '%s' (ctrain %s --help lists the flags)\n", cmd, s, cmd);
            return 2;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v || !*v) {
            fprintf(stderr, "ctrain %s: --%.*s needs a value\n", cmd, (int)n, name);
            return 2;
        }
        *dst = v;
    }
    return 0;
}

static int path_or_default(const char *cmd, const char *given, char *path, size_t n)
{
    if (given) {
        snprintf(path, n, "%s", given);
        return 0;
    }
    if (ct_cluster_config_default_path(path, n)) {
        fprintf(stderr, "ctrain %s: %s; give --config_file PATH\n", cmd, last_error());
        return 1;
    }
    return 0;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- ctrain config (the questionnaire) ------------------------------------------------ */

static int config_ask(int argc, char **argv)
{
    static const char *const flags[] = {"config_file", NULL};
    cmd_args a;
    int rc = parse("config", argc, argv, flags, false, &a);
    if (rc) return rc;
    if (a.help) {
        usage_ask(stdout);
        return 0;
    }
    char path[1024];
    if ((rc = path_or_default("config", a.config_file, path, sizeof path))) return rc;
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
        fprintf(stderr, "ctrain config: the questionnaire needs a terminal (stdin and stdout); to write a "
                        "configuration without questions run `ctrain config default --config_file %s` and edit it\n",
                path);
        return 1;
    }
    ct_cluster_config c;
    ct_cluster_config_defaults(&c);
    if (exists(path) && ct_cluster_config_read(path, &c, NULL)) {
        fprintf(stderr, "ctrain config: %s (fix or remove the file to start from the defaults)\n", last_error());
        return 1;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    ct_config_ask_machine m = {.gpus = ct_cuda_device_count(), .cores = cores > 0 ? (int)cores : 1};
    if (ct_config_ask(stdin, stdout, &m, &c) || ct_cluster_config_check(&c) || ct_cluster_config_write(&c, path)) {
        fprintf(stderr, "ctrain config: %s\n", last_error());
        return 1;
    }
    printf("ctrain configuration saved at %s\n", path);
    return 0;
}

/* ---- ctrain config default ------------------------------------------------------------ */

static int config_default(int argc, char **argv)
{
    static const char *const flags[] = {"config_file", "mixed_precision", NULL};
    cmd_args a;
    int rc = parse("config default", argc, argv, flags, false, &a);
    if (rc) return rc;
    if (a.help) {
        usage_default(stdout);
        return 0;
    }
    const char *mp = a.mixed_precision ? a.mixed_precision : "no";
    if (strcmp(mp, "no") && strcmp(mp, "fp16") && strcmp(mp, "bf16") && strcmp(mp, "fp8")) {
        fprintf(stderr, "ctrain config default: --mixed_precision '%s': expected no, fp16, bf16 or fp8\n", mp);
        return 2;
    }
    char path[1024];
    if ((rc = path_or_default("config default", a.config_file, path, sizeof path))) return rc;
    if (exists(path)) { /* Accelerate's behaviour: keep it, say so, succeed */
        printf("Configuration already exists at %s, will not override. Run `ctrain config` manually, "
               "`ctrain config update` to bring it up to date, or pass a different --config_file.\n",
               path);
        return 0;
    }
    ct_cluster_config c;
    ct_cluster_config_defaults(&c);
    snprintf(c.mixed_precision, sizeof c.mixed_precision, "%s", mp);
    int gpus = ct_cuda_device_count();
    if (gpus > 0) {
        c.use_cpu = false;
        c.num_processes = gpus;
        c.distributed_type = gpus > 1 ? CT_DIST_MULTI_GPU : CT_DIST_NO;
    } else {
        c.use_cpu = true;
        c.num_processes = 1;
        c.distributed_type = CT_DIST_NO;
    }
    if (ct_cluster_config_write(&c, path)) {
        fprintf(stderr, "ctrain config default: %s\n", last_error());
        return 1;
    }
    printf("ctrain configuration saved at %s\n", path);
    return 0;
}

/* ---- ctrain config show --------------------------------------------------------------- */

static const char *strategy_text(const ct_cluster_config *c, char *buf, size_t n)
{
    static const char *const stage[] = {"parameters, gradients and optimizer state replicated (DDP)",
                                        "optimizer state sharded",
                                        "optimizer state and gradients sharded",
                                        "parameters, gradients and optimizer state sharded"};
    switch (c->distributed_type) {
    case CT_DIST_DEEPSPEED:
        if (c->deepspeed.deepspeed_config_file[0])
            snprintf(buf, n, "DeepSpeed, settings from the ds_config.json '%s'", c->deepspeed.deepspeed_config_file);
        else
            snprintf(buf, n, "DeepSpeed ZeRO-%d: %s; optimizer offload %s, parameter offload %s",
                     c->deepspeed.zero_stage, stage[c->deepspeed.zero_stage & 3],
                     c->deepspeed.offload_optimizer_device, c->deepspeed.offload_param_device);
        break;
    case CT_DIST_FSDP:
        snprintf(buf, n, "FSDP %s, %s%s%s, CPU offload %s, %s", c->fsdp.sharding_strategy, c->fsdp.auto_wrap_policy,
                 c->fsdp.transformer_layer_cls_to_wrap[0] ? " of " : "", c->fsdp.transformer_layer_cls_to_wrap,
                 c->fsdp.offload_params ? "on" : "off", c->fsdp.state_dict_type);
        break;
    case CT_DIST_MEGATRON_LM:
        snprintf(buf, n, "Megatron-LM: tensor parallel %d x pipeline %d, data parallel over the rest%s; sequence "
                         "parallelism %s, distributed optimizer %s",
                 c->megatron.tp_degree, c->megatron.pp_degree,
                 c->has_deepspeed_config ? " (sharded by deepspeed_config)"
                 : c->has_fsdp_config    ? " (sharded by fsdp_config)"
                                         : "",
                 c->megatron.sequence_parallelism ? "on" : "off", c->megatron.use_distributed_optimizer ? "on" : "off");
        break;
    default:
        snprintf(buf, n, "%s", c->num_processes > 1 ? "data parallel (DDP): every process holds the whole model"
                                                    : "one process");
        break;
    }
    return buf;
}

static bool in_environ(const char *entry)
{
    for (char **e = environ; e && *e; e++)
        if (!strcmp(*e, entry)) return true;
    return false;
}

static int config_show(int argc, char **argv)
{
    static const char *const flags[] = {"config_file", NULL};
    cmd_args a;
    int rc = parse("config show", argc, argv, flags, true, &a);
    if (rc) return rc;
    if (a.help) {
        usage_show(stdout);
        return 0;
    }
    if (a.positional && a.config_file) {
        fprintf(stderr, "ctrain config show: give FILE or --config_file, not both\n");
        return 2;
    }
    char path[1024];
    if ((rc = path_or_default("config show", a.positional ? a.positional : a.config_file, path, sizeof path)))
        return rc;
    ct_cluster_config c;
    bool old = false;
    if (ct_cluster_config_read(path, &c, &old)) {
        fprintf(stderr, "ctrain config show: %s\n", last_error());
        return 1;
    }
    printf("# %s%s\n", path, old ? " (an older form: `ctrain config update` rewrites it)" : "");
    fflush(stdout);
    if (ct_cluster_config_print(&c, stdout)) {
        fprintf(stderr, "ctrain config show: %s\n", last_error());
        return 1;
    }
    if (ct_cluster_config_check(&c)) {
        fprintf(stderr, "ctrain config show: '%s': %s\n", path, last_error());
        return 1;
    }
    char buf[1400];
    printf("\n# what `ctrain launch` does with it\n");
    int local = c.num_processes / c.num_machines;
    printf("processes:    %d in total; %d on this machine (machine_rank %d of %d machines)\n", c.num_processes, local,
           c.machine_rank, c.num_machines);
    char port[32];
    if (c.main_process_port < 0) snprintf(port, sizeof port, "%d", CT_LAUNCH_DEFAULT_PORT);
    else if (c.main_process_port == 0) snprintf(port, sizeof port, "a free port");
    else snprintf(port, sizeof port, "%d", c.main_process_port);
    printf("rendezvous:   %s:%s\n", c.main_process_ip[0] ? c.main_process_ip : "127.0.0.1", port);
    printf("devices:      %s\n", c.use_cpu || c.distributed_type == CT_DIST_MULTI_CPU ? "CPU"
                          : c.gpu_ids[0] && strcmp(c.gpu_ids, "all")               ? "the GPUs named in gpu_ids"
                                                                                     : "a GPU per process where there are GPUs, else the CPU");
    printf("strategy:     %s\n", strategy_text(&c, buf, sizeof buf));
    printf("precision:    %s\n", c.mixed_precision[0] ? c.mixed_precision : "not set (the program's)");
    if (c.ignored[0]) printf("ignored:      %s (Accelerate's keys that ctrain does not use)\n", c.ignored);

    ct_cluster_launch_args la;
    if (ct_cluster_config_launch_args(&c, true, &la)) {
        printf("launch:       refuses it: %s\n", last_error());
        return 1;
    }
    printf("flags:       ");
    for (int i = 0; i < la.argc; i++) printf(" %s", la.argv[i]);
    printf("\n");
    /* launch's own reading of the file gives rank 0's environment */
    char *largv[] = {"launch", "--config_file", path, "true", NULL};
    ct_launch_opts o;
    if (ct_launch_args_parse(4, largv, &o)) {
        printf("launch:       refuses it: %s\n", last_error());
        return 1;
    }
    char **env = ct_launch_env_new(&o, 0, o.main_process_port ? o.main_process_port : CT_LAUNCH_DEFAULT_PORT, 0);
    if (!env) {
        fprintf(stderr, "ctrain config show: %s\n", last_error());
        return 1;
    }
    printf("rank 0 gets:\n");
    for (char **e = env; *e; e++)
        if (!in_environ(*e) && strncmp(*e, "CTRAIN_JOB_ID=", 14) && strncmp(*e, "CTRAIN_STORE_TOKEN=", 19))
            printf("  %s\n", *e);
    ct_launch_env_free(env);
    return 0;
}

/* ---- ctrain config update ------------------------------------------------------------- */

static int config_update(int argc, char **argv)
{
    static const char *const flags[] = {"config_file", NULL};
    cmd_args a;
    int rc = parse("config update", argc, argv, flags, false, &a);
    if (rc) return rc;
    if (a.help) {
        usage_update(stdout);
        return 0;
    }
    char path[1024];
    if ((rc = path_or_default("config update", a.config_file, path, sizeof path))) return rc;
    ct_cluster_config c;
    bool old = false;
    if (ct_cluster_config_read(path, &c, &old)) {
        fprintf(stderr, "ctrain config update: %s\n", last_error());
        return 1;
    }
    if (!old) {
        printf("%s is already in the current form: nothing to update\n", path);
        return 0;
    }
    if (ct_cluster_config_write(&c, path)) {
        fprintf(stderr, "ctrain config update: %s\n", last_error());
        return 1;
    }
    printf("updated the configuration at %s to the current form\n", path);
    if (c.ignored[0]) printf("not kept (Accelerate's keys that ctrain does not use): %s\n", c.ignored);
    return 0;
}

int ct_config_main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "default")) return config_default(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "show")) return config_show(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "update")) return config_update(argc - 1, argv + 1);
    return config_ask(argc, argv);
}
