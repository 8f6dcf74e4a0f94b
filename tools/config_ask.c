/* `ctrain config`'s questionnaire (tools/config_ask.h): Accelerate's questions of
 * `accelerate config` (its get_cluster_input), in its order, limited to what ctrain
 * runs and to what this machine has.
 *
 * The answers go to a copy of the configuration, which replaces *c only after the
 * last answer: input that ends early leaves the caller's configuration as it was. */
#include "tools/config_ask.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* launch's limits (tools/launch_args.c), so a configuration it writes launches */
#define MAX_PROCESSES 1048576
#define MAX_THREADS 65536
#define MAX_ACCUM (1 << 30)

typedef struct {
    FILE *in, *out;
    char *line; /* getline's buffer, owned here */
    size_t cap;
    const char *ans; /* the last answer, trimmed (points into line) */
} asker;

/* Reads one answer line. At end of input: CT_ERR_INVALID naming the question. */
static ct_status read_answer(asker *a, const char *topic)
{
    if (fflush(a->out) != 0)
        return ct_error_set(CT_ERR_IO, "config: cannot write the question about %s: %s", topic, strerror(errno));
    ssize_t n = getline(&a->line, &a->cap, a->in);
    if (n < 0) {
        /* the prompt's line stays open otherwise, and the error follows it */
        fputc('\n', a->out);
        return ct_error_set(CT_ERR_INVALID, "config: the answers ended before the question about %s", topic);
    }
    char *s = a->line, *e = a->line + n;
    while (s < e && isspace((unsigned char)*s)) s++;
    while (e > s && isspace((unsigned char)e[-1])) e--;
    *e = 0;
    a->ans = s;
    return CT_OK;
}

#define TRY(x)                          \
    do {                                \
        ct_status st_ = (x);            \
        if (st_ != CT_OK) return st_;   \
    } while (0)

/* ---- the question kinds ------------------------------------------------------------ */

static ct_status ask_yes_no(asker *a, const char *topic, const char *q, bool def, bool *v)
{
    for (;;) {
        fprintf(a->out, "%s %s: ", q, def ? "[YES/no]" : "[yes/NO]");
        TRY(read_answer(a, topic));
        const char *s = a->ans;
        if (!*s) { *v = def; return CT_OK; }
        if (!strcasecmp(s, "y") || !strcasecmp(s, "yes")) { *v = true; return CT_OK; }
        if (!strcasecmp(s, "n") || !strcasecmp(s, "no")) { *v = false; return CT_OK; }
        fprintf(a->out, "Please enter yes or no (y, yes, n or no, in any case), not \"%s\".\n", s);
    }
}

/* A whole number in lo..hi that is a multiple of step (step 1: any). */
static ct_status ask_long(asker *a, const char *topic, const char *q, long lo, long hi, long step, long def,
                          long *v)
{
    for (;;) {
        fprintf(a->out, "%s [%ld]: ", q, def);
        TRY(read_answer(a, topic));
        if (!*a->ans) { *v = def; return CT_OK; }
        char *end;
        errno = 0;
        long x = strtol(a->ans, &end, 10);
        if (!*end && errno == 0 && x >= lo && x <= hi && x % step == 0) { *v = x; return CT_OK; }
        if (step > 1)
            fprintf(a->out, "Please enter a multiple of %ld from %ld to %ld, not \"%s\".\n", step, lo, hi, a->ans);
        else
            fprintf(a->out, "Please enter a whole number from %ld to %ld, not \"%s\".\n", lo, hi, a->ans);
    }
}

static ct_status ask_int(asker *a, const char *topic, const char *q, int lo, int hi, int step, int def, int *v)
{
    long x;
    TRY(ask_long(a, topic, q, lo, hi, step, def, &x));
    *v = (int)x;
    return CT_OK;
}

static ct_status ask_double(asker *a, const char *topic, const char *q, double lo, double def, double *v)
{
    for (;;) {
        fprintf(a->out, "%s [%g]: ", q, def);
        TRY(read_answer(a, topic));
        if (!*a->ans) { *v = def; return CT_OK; }
        char *end;
        double x = strtod(a->ans, &end);
        if (!*end && x >= lo && x < 1e300) { *v = x; return CT_OK; } /* x >= lo also refuses nan */
        fprintf(a->out, "Please enter a number >= %g, not \"%s\".\n", lo, a->ans);
    }
}

/* One entry of a numbered list: its name (what the file holds, or what Accelerate
 * shows), another spelling accepted as the answer (may be NULL), a note. */
typedef struct {
    const char *name, *alias, *note;
} choice;

/* Shows the numbered list; the answer is a number or a name (any case). */
static ct_status ask_choice(asker *a, const char *topic, const char *q, const choice *ch, int n, int def, int *v)
{
    for (;;) {
        fprintf(a->out, "%s\n", q);
        for (int i = 0; i < n; i++)
            fprintf(a->out, "  %d) %s%s%s%s\n", i, ch[i].name, ch[i].note ? "  (" : "", ch[i].note ? ch[i].note : "",
                    ch[i].note ? ")" : "");
        fprintf(a->out, "Number or name [%d: %s]: ", def, ch[def].name);
        TRY(read_answer(a, topic));
        const char *s = a->ans;
        if (!*s) { *v = def; return CT_OK; }
        char *end;
        long k = strtol(s, &end, 10);
        if (isdigit((unsigned char)*s) && !*end && k >= 0 && k < n) { *v = (int)k; return CT_OK; }
        for (int i = 0; i < n; i++)
            if (!strcasecmp(s, ch[i].name) || (ch[i].alias && !strcasecmp(s, ch[i].alias))) { *v = i; return CT_OK; }
        fprintf(a->out, "Please enter a number from 0 to %d or one of: ", n - 1);
        for (int i = 0; i < n; i++) fprintf(a->out, "%s%s", i ? ", " : "", ch[i].name);
        fprintf(a->out, "; not \"%s\".\n", s);
    }
}

/* Checks an answer; on refusal writes why (a sentence) to why. */
typedef bool (*str_check)(const char *s, const void *ctx, char *why, size_t n);

/* A string of fewer than cap bytes; def "" means the question has no default and an
 * empty answer is asked again. */
static ct_status ask_string(asker *a, const char *topic, const char *q, const char *def, str_check check,
                            const void *ctx, char *dst, size_t cap)
{
    char why[512];
    for (;;) {
        if (*def) fprintf(a->out, "%s [%s]: ", q, def);
        else fprintf(a->out, "%s ", q);
        TRY(read_answer(a, topic));
        const char *s = *a->ans ? a->ans : def;
        why[0] = 0;
        if (!*s) snprintf(why, sizeof why, "An answer is needed here.");
        else if (strlen(s) >= cap) snprintf(why, sizeof why, "At most %zu characters, please.", cap - 1);
        if (!why[0] && (!check || check(s, ctx, why, sizeof why))) {
            memmove(dst, s, strlen(s) + 1); /* s may be dst itself (the default) */
            return CT_OK;
        }
        fprintf(a->out, "%s\n", why);
    }
}

/* ---- the answers' checks ----------------------------------------------------------- */

static bool check_host(const char *s, const void *ctx, char *why, size_t n)
{
    (void)ctx;
    for (const char *p = s; *p; p++)
        if (isspace((unsigned char)*p) || !isprint((unsigned char)*p)) {
            snprintf(why, n, "Please enter one address or host name (no spaces), not \"%s\".", s);
            return false;
        }
    return true;
}

/* ctx: the GPUs this machine has and the local processes that need one each */
typedef struct {
    int gpus, local;
} gpu_need;

static bool check_gpu_ids(const char *s, const void *ctx, char *why, size_t n)
{
    const gpu_need *g = ctx;
    if (!strcasecmp(s, "all")) {
        if (g->gpus >= g->local) return true;
        snprintf(why, n, "This machine has %d GPU(s) for %d process(es) here.", g->gpus, g->local);
        return false;
    }
    bool seen[1024] = {false};
    int count = 0;
    for (const char *p = s;;) {
        char *end;
        long id = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
        if (id < 0 || id >= g->gpus || (*end && *end != ',')) {
            snprintf(why, n, "Please enter \"all\" or GPU ids from 0 to %d separated by commas (\"0,1\"), not \"%s\".",
                     g->gpus - 1, s);
            return false;
        }
        if (seen[id]) {
            snprintf(why, n, "GPU %ld is listed twice in \"%s\".", id, s);
            return false;
        }
        seen[id] = true;
        count++;
        if (!*end) break;
        p = end + 1;
    }
    if (count >= g->local) return true;
    snprintf(why, n, "%d process(es) run on this machine, one GPU each: list at least %d ids, not \"%s\".", g->local,
             g->local, s);
    return false;
}

static bool check_readable_file(const char *s, const void *ctx, char *why, size_t n)
{
    (void)ctx;
    struct stat st;
    if (stat(s, &st) != 0 || access(s, R_OK) != 0) {
        snprintf(why, n, "Cannot read %s: %s. Please enter the path of a readable ds_config.json.", s, strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, n, "%s is not a file. Please enter the path of a ds_config.json.", s);
        return false;
    }
    return true;
}

/* FSDP's module type names: identifiers separated by commas */
static bool check_names(const char *s, const void *ctx, char *why, size_t n)
{
    (void)ctx;
    bool start = true;
    for (const char *p = s; *p; p++) {
        bool ok = *p == ',' ? !start : isalnum((unsigned char)*p) || *p == '_' || *p == '.';
        if (!ok) {
            snprintf(why, n, "Please enter module type names separated by commas (\"Block\", \"Block,MLP\"), not \"%s\".",
                     s);
            return false;
        }
        start = *p == ',';
    }
    if (!start) return true;
    snprintf(why, n, "\"%s\" ends with a comma: please enter the names without an empty one.", s);
    return false;
}

/* ---- the questionnaire ------------------------------------------------------------- */

enum { KIND_NO, KIND_MULTI_CPU, KIND_MULTI_GPU };

static const choice ENVIRONMENTS[] = {
    {"This machine", "LOCAL_MACHINE", NULL},
    {"AWS (Amazon SageMaker)", "AMAZON_SAGEMAKER", "not run by ctrain"},
};

static const choice KINDS[] = {
    {"No distributed training", "NO", NULL},
    {"multi-CPU", "MULTI_CPU", NULL},
    {"multi-GPU", "MULTI_GPU", NULL},
};

static const choice ZERO_STAGES[] = {
    {"0", NULL, "nothing sharded: DDP"},
    {"1", NULL, "optimizer state sharded"},
    {"2", NULL, "optimizer state and gradients sharded"},
    {"3", NULL, "optimizer state, gradients and parameters sharded"},
};

/* "nvme" (Accelerate's third choice) is not offered: ctrain offloads to memory only */
static const choice OFFLOAD_DEVICES[] = {{"none", NULL, NULL}, {"cpu", NULL, NULL}};

static const choice FSDP_STRATEGIES[] = {
    {"FULL_SHARD", NULL, "parameters, gradients and optimizer state sharded"},
    {"SHARD_GRAD_OP", NULL, "gradients and optimizer state sharded"},
    {"NO_SHARD", NULL, "replicated: DDP"},
    {"HYBRID_SHARD", NULL, "FULL_SHARD within a machine, replicated across machines"},
};

static const choice FSDP_WRAPS[] = {
    {"TRANSFORMER_BASED_WRAP", NULL, NULL}, {"SIZE_BASED_WRAP", NULL, NULL}, {"NO_WRAP", NULL, NULL}};
static const choice FSDP_PREFETCHES[] = {
    {"BACKWARD_PRE", NULL, NULL}, {"BACKWARD_POST", NULL, NULL}, {"NO_PREFETCH", NULL, NULL}};
static const choice FSDP_STATE_DICTS[] = {{"FULL_STATE_DICT", NULL, NULL}, {"SHARDED_STATE_DICT", NULL, NULL}};
static const choice PRECISIONS[] = {{"no", NULL, NULL}, {"fp16", NULL, NULL}, {"bf16", NULL, NULL}, {"fp8", NULL, NULL}};
static const choice FP8_FORMATS[] = {
    {"HYBRID", NULL, "E4M3 forward, E5M2 gradients"}, {"E4M3", NULL, "E4M3 throughout"}};
static const choice FP8_ALGOS[] = {{"max", NULL, "the history's maximum"}, {"most_recent", NULL, "the newest amax"}};

#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

/* The index of name in ch (any case), or def when it is not there. */
static int index_of(const choice *ch, int n, const char *name, int def)
{
    for (int i = 0; i < n; i++)
        if (!strcasecmp(name, ch[i].name)) return i;
    return def;
}

static ct_status ask_machines(asker *a, ct_cluster_config *c)
{
    TRY(ask_int(a, "the number of machines",
                "How many different machines will you use (use more than 1 for multi-node training)?", 1,
                MAX_PROCESSES / 2, 1, c->num_machines >= 1 ? c->num_machines : 1, &c->num_machines));
    if (c->num_machines == 1) {
        c->machine_rank = 0;
        return CT_OK;
    }
    int rank = c->machine_rank >= 0 && c->machine_rank < c->num_machines ? c->machine_rank : 0;
    char q[128];
    snprintf(q, sizeof q, "What is the rank of this machine (0 to %d)?", c->num_machines - 1);
    TRY(ask_int(a, "this machine's rank", q, 0, c->num_machines - 1, 1, rank, &c->machine_rank));
    TRY(ask_string(a, "the main process's address",
                   "What is the IP address of the machine that will host the main process?", c->main_process_ip,
                   check_host, NULL, c->main_process_ip, sizeof c->main_process_ip));
    /* 0 (a free port) only works on one machine: the others could not learn it */
    int port = c->main_process_port >= 1 ? c->main_process_port : 29500;
    TRY(ask_int(a, "the main process's port", "What is the port you will use to communicate with the main process?",
                1, 65535, 1, port, &c->main_process_port));
    TRY(ask_yes_no(a, "the machines' network",
                   "Are all the machines on the same local network? Answer `no` if nodes are on the cloud and/or on "
                   "different network hosts",
                   c->same_network, &c->same_network));
    if (!c->same_network) {
        /* Accelerate asks this only then: the static rendezvous, or c10d's rounds
         * (tools/launch_rdzv.h: elastic, survives a lost machine) */
        static const choice BACKENDS[] = {{"static", NULL, "a fixed set of machines"},
                                          {"c10d", NULL, "elastic: rounds of the launchers at the main process"}};
        int k;
        TRY(ask_choice(a, "the rendezvous backend", "What rendezvous backend will you use?", BACKENDS, N_OF(BACKENDS),
                       !strcmp(c->rdzv_backend, "c10d"), &k));
        snprintf(c->rdzv_backend, sizeof c->rdzv_backend, "%s", BACKENDS[k].name);
    }
    return CT_OK;
}

static ct_status ask_deepspeed(asker *a, ct_cluster_config *c)
{
    bool json;
    TRY(ask_yes_no(a, "a DeepSpeed json file", "Do you want to specify a json file to a DeepSpeed config?",
                   c->deepspeed.deepspeed_config_file[0] != 0, &json));
    if (json) {
        TRY(ask_string(a, "the DeepSpeed json file's path", "Please enter the path to the json DeepSpeed config file:",
                       c->deepspeed.deepspeed_config_file, check_readable_file, NULL, c->deepspeed.deepspeed_config_file,
                       sizeof c->deepspeed.deepspeed_config_file));
    } else {
        c->deepspeed.deepspeed_config_file[0] = 0;
        int stage = c->deepspeed.zero_stage >= 0 && c->deepspeed.zero_stage <= 3 ? c->deepspeed.zero_stage : 2;
        TRY(ask_choice(a, "the ZeRO stage", "What should be your DeepSpeed's ZeRO optimization stage?", ZERO_STAGES,
                       N_OF(ZERO_STAGES), stage, &c->deepspeed.zero_stage));
        int k = 0;
        /* Accelerate asks from stage 2; ctrain also offloads stage 1's optimizer state */
        if (c->deepspeed.zero_stage >= 1)
            TRY(ask_choice(a, "the optimizer state's offload", "Where to offload optimizer states?", OFFLOAD_DEVICES,
                           2, index_of(OFFLOAD_DEVICES, 2, c->deepspeed.offload_optimizer_device, 0), &k));
        snprintf(c->deepspeed.offload_optimizer_device, sizeof c->deepspeed.offload_optimizer_device, "%s",
                 OFFLOAD_DEVICES[k].name);
        k = 0;
        if (c->deepspeed.zero_stage == 3)
            TRY(ask_choice(a, "the parameters' offload", "Where to offload parameters?", OFFLOAD_DEVICES, 2,
                           index_of(OFFLOAD_DEVICES, 2, c->deepspeed.offload_param_device, 0), &k));
        snprintf(c->deepspeed.offload_param_device, sizeof c->deepspeed.offload_param_device, "%s",
                 OFFLOAD_DEVICES[k].name);
        int steps = c->deepspeed.gradient_accumulation_steps >= 1 ? c->deepspeed.gradient_accumulation_steps : 1;
        TRY(ask_int(a, "DeepSpeed's gradient accumulation steps",
                    "How many gradient accumulation steps you're passing in your script?", 1, MAX_ACCUM, 1, steps,
                    &c->deepspeed.gradient_accumulation_steps));
        bool clip;
        TRY(ask_yes_no(a, "gradient clipping", "Do you want to use gradient clipping?",
                       c->deepspeed.gradient_clipping >= 0, &clip));
        if (clip)
            TRY(ask_double(a, "the gradient clipping value", "What is the gradient clipping value?", 0,
                           c->deepspeed.gradient_clipping >= 0 ? c->deepspeed.gradient_clipping : 1.0,
                           &c->deepspeed.gradient_clipping));
        else
            c->deepspeed.gradient_clipping = -1;
    }
    /* with a json file the stage is the file's: the flag is asked in case it is 3 */
    if (json || c->deepspeed.zero_stage == 3)
        TRY(ask_yes_no(a, "zero3_init_flag",
                       "Do you want to enable `deepspeed.zero.Init` when using ZeRO Stage-3 for constructing massive "
                       "models?",
                       c->deepspeed.zero3_init_flag, &c->deepspeed.zero3_init_flag));
    else
        c->deepspeed.zero3_init_flag = false;
    return CT_OK;
}

static ct_status ask_fsdp(asker *a, ct_cluster_config *c)
{
    int k;
    TRY(ask_choice(a, "the sharding strategy", "What should be your sharding strategy?", FSDP_STRATEGIES,
                   N_OF(FSDP_STRATEGIES), index_of(FSDP_STRATEGIES, N_OF(FSDP_STRATEGIES), c->fsdp.sharding_strategy, 0),
                   &k));
    snprintf(c->fsdp.sharding_strategy, sizeof c->fsdp.sharding_strategy, "%s", FSDP_STRATEGIES[k].name);
    c->fsdp.reshard_after_forward = strcmp(FSDP_STRATEGIES[k].name, "SHARD_GRAD_OP") != 0;
    /* NO_SHARD keeps everything on every rank: there is no slice to offload */
    if (strcmp(FSDP_STRATEGIES[k].name, "NO_SHARD"))
        TRY(ask_yes_no(a, "offloading parameters", "Do you want to offload parameters and gradients to CPU?",
                       c->fsdp.offload_params, &c->fsdp.offload_params));
    else
        c->fsdp.offload_params = false;
    TRY(ask_choice(a, "the auto wrap policy", "What should be your auto wrap policy?", FSDP_WRAPS, N_OF(FSDP_WRAPS),
                   index_of(FSDP_WRAPS, N_OF(FSDP_WRAPS), c->fsdp.auto_wrap_policy, 0), &k));
    snprintf(c->fsdp.auto_wrap_policy, sizeof c->fsdp.auto_wrap_policy, "%s", FSDP_WRAPS[k].name);
    if (k == 0) {
        if (!c->fsdp.transformer_layer_cls_to_wrap[0])
            snprintf(c->fsdp.transformer_layer_cls_to_wrap, sizeof c->fsdp.transformer_layer_cls_to_wrap, "Block");
        TRY(ask_string(a, "the layer classes to wrap",
                       "Specify the comma-separated list of transformer layer class names (case-sensitive) to wrap "
                       "(the GPT's is `Block`):",
                       c->fsdp.transformer_layer_cls_to_wrap, check_names, NULL, c->fsdp.transformer_layer_cls_to_wrap,
                       sizeof c->fsdp.transformer_layer_cls_to_wrap));
    } else if (k == 1) {
        TRY(ask_long(a, "the minimum number of parameters",
                     "What should be your FSDP's minimum number of parameters for Default Auto Wrapping Policy?", 1,
                     0x7fffffff, 1, c->fsdp.min_num_params >= 1 ? c->fsdp.min_num_params : 100000000,
                     &c->fsdp.min_num_params));
    }
    TRY(ask_choice(a, "the backward prefetch", "What should be your FSDP's backward prefetch policy?", FSDP_PREFETCHES,
                   N_OF(FSDP_PREFETCHES), index_of(FSDP_PREFETCHES, N_OF(FSDP_PREFETCHES), c->fsdp.backward_prefetch, 0),
                   &k));
    snprintf(c->fsdp.backward_prefetch, sizeof c->fsdp.backward_prefetch, "%s", FSDP_PREFETCHES[k].name);
    TRY(ask_choice(a, "the state dict type", "What should be your FSDP's state dict type?", FSDP_STATE_DICTS,
                   N_OF(FSDP_STATE_DICTS),
                   index_of(FSDP_STATE_DICTS, N_OF(FSDP_STATE_DICTS), c->fsdp.state_dict_type, 0), &k));
    snprintf(c->fsdp.state_dict_type, sizeof c->fsdp.state_dict_type, "%s", FSDP_STATE_DICTS[k].name);
    TRY(ask_yes_no(a, "forward prefetch", "Do you want to enable FSDP's forward prefetch policy?",
                   c->fsdp.forward_prefetch, &c->fsdp.forward_prefetch));
    TRY(ask_yes_no(a, "use_orig_params", "Do you want to enable FSDP's `use_orig_params` feature?",
                   c->fsdp.use_orig_params, &c->fsdp.use_orig_params));
    TRY(ask_yes_no(a, "CPU RAM efficient loading", "Do you want to enable CPU RAM efficient model loading?",
                   c->fsdp.cpu_ram_efficient_loading, &c->fsdp.cpu_ram_efficient_loading));
    /* efficient loading builds the model on rank 0 only: the others need the broadcast */
    if (c->fsdp.cpu_ram_efficient_loading)
        c->fsdp.sync_module_states = true;
    else
        TRY(ask_yes_no(a, "syncing module states",
                       "Do you want each individually wrapped FSDP unit to broadcast module parameters from rank 0 at "
                       "the start?",
                       c->fsdp.sync_module_states, &c->fsdp.sync_module_states));
    return CT_OK;
}

/* The number of processes, the GPUs or threads they use. */
static ct_status ask_processes(asker *a, const ct_config_ask_machine *m, int kind, ct_cluster_config *c)
{
    int machines = c->num_machines;
    if (c->distributed_type == CT_DIST_NO) {
        c->num_processes = 1;
    } else {
        /* multi-CPU and multi-GPU need two ranks; DeepSpeed and FSDP also run as one */
        int lo = kind == KIND_NO ? 1 : 2;
        lo = (lo + machines - 1) / machines * machines;
        int hi = c->use_cpu ? MAX_PROCESSES / machines * machines : m->gpus * machines;
        int def = c->num_processes >= lo && c->num_processes <= hi && c->num_processes % machines == 0
                      ? c->num_processes
                      : lo;
        char q[160];
        snprintf(q, sizeof q, "How many %s should be used for distributed training%s?",
                 c->use_cpu ? "processes" : "GPU(s)", machines > 1 ? " (in total, across all machines)" : "");
        TRY(ask_int(a, "the number of processes", q, lo, hi, machines, def, &c->num_processes));
    }
    int local = c->num_processes / machines;
    if (!c->use_cpu) {
        gpu_need need = {m->gpus, local};
        if (!c->gpu_ids[0] || !check_gpu_ids(c->gpu_ids, &need, (char[8]){0}, 8))
            snprintf(c->gpu_ids, sizeof c->gpu_ids, "all");
        TRY(ask_string(a, "the GPU ids",
                       "What GPU(s) (by id) should be used for training on this machine as a comma-separated list?",
                       c->gpu_ids, check_gpu_ids, &need, c->gpu_ids, sizeof c->gpu_ids));
    } else {
        c->gpu_ids[0] = 0;
        int def = c->num_cpu_threads_per_process >= 1 ? c->num_cpu_threads_per_process : m->cores / local;
        TRY(ask_int(a, "the CPU threads per process", "How many CPU threads should each process use?", 1, MAX_THREADS,
                    1, def < 1 ? 1 : def, &c->num_cpu_threads_per_process));
    }
    return CT_OK;
}

static ct_status ask_precision(asker *a, ct_cluster_config *c)
{
    int k;
    TRY(ask_choice(a, "mixed precision", "Do you wish to use mixed precision?", PRECISIONS, N_OF(PRECISIONS),
                   index_of(PRECISIONS, N_OF(PRECISIONS), c->mixed_precision, 0), &k));
    snprintf(c->mixed_precision, sizeof c->mixed_precision, "%s", PRECISIONS[k].name);
    if (k != 3) return CT_OK;
    /* the recipe's questions, Accelerate's for its TransformerEngine backend */
    TRY(ask_int(a, "the fp8 margin", "What margin should be used for gradient scaling?", 0, 64, 1,
                c->fp8.margin >= 0 ? c->fp8.margin : 0, &c->fp8.margin));
    TRY(ask_choice(a, "the fp8 format", "Which weight format should be used?", FP8_FORMATS, 2,
                   index_of(FP8_FORMATS, 2, c->fp8.fp8_format, 0), &k));
    snprintf(c->fp8.fp8_format, sizeof c->fp8.fp8_format, "%s", FP8_FORMATS[k].name);
    TRY(ask_int(a, "the amax history length",
                "What length of history should be used for the amax scaling factor computation?", 1, 1 << 20, 1,
                c->fp8.amax_history_len >= 1 ? c->fp8.amax_history_len : 1024, &c->fp8.amax_history_len));
    TRY(ask_choice(a, "the amax algorithm", "Which algorithm should be used for the amax scaling factor computation?",
                   FP8_ALGOS, 2, index_of(FP8_ALGOS, 2, c->fp8.amax_compute_algo, 0), &k));
    snprintf(c->fp8.amax_compute_algo, sizeof c->fp8.amax_compute_algo, "%s", FP8_ALGOS[k].name);
    return CT_OK;
}

/* The machine type the file's values stand for (the default offered). */
static int kind_of(const ct_cluster_config *c, const ct_config_ask_machine *m)
{
    switch (c->distributed_type) {
    case CT_DIST_NO: return KIND_NO;
    case CT_DIST_MULTI_CPU: return KIND_MULTI_CPU;
    case CT_DIST_MULTI_GPU: return m->gpus > 0 ? KIND_MULTI_GPU : KIND_MULTI_CPU;
    default:
        if (c->num_processes <= 1) return KIND_NO;
        return c->use_cpu || m->gpus == 0 ? KIND_MULTI_CPU : KIND_MULTI_GPU;
    }
}

static ct_status ask_all(asker *a, const ct_config_ask_machine *m, ct_cluster_config *c)
{
    int k;
    for (;;) {
        TRY(ask_choice(a, "the compute environment", "In which compute environment are you running?", ENVIRONMENTS,
                       N_OF(ENVIRONMENTS), 0, &k));
        if (k == 0) break;
        fprintf(a->out, "ctrain runs its processes on this machine (and on others given by the number of machines); "
                        "it does not start SageMaker jobs. Please choose 0: %s.\n",
                ENVIRONMENTS[0].name);
    }
    snprintf(c->compute_environment, sizeof c->compute_environment, "LOCAL_MACHINE");

    /* multi-GPU is offered only where there is a GPU */
    const ct_dist_type was = c->distributed_type;
    int kinds = m->gpus > 0 ? 3 : 2, kind;
    for (;;) {
        TRY(ask_choice(a, "the machine type", "Which type of machine are you using?", KINDS, kinds, kind_of(c, m),
                       &kind));
        if (kind == KIND_NO) {
            c->num_machines = 1;
            c->machine_rank = 0;
            break;
        }
        /* a one-machine file's same_network means nothing: offer Accelerate's default */
        if (c->num_machines <= 1) c->same_network = true;
        TRY(ask_machines(a, c));
        if (kind != KIND_MULTI_GPU || m->gpus * c->num_machines >= 2) break;
        fprintf(a->out, "multi-GPU needs two GPUs; this machine has one: choose \"%s\", or more than one machine.\n",
                KINDS[KIND_NO].name);
    }
    c->distributed_type = kind == KIND_NO ? CT_DIST_NO : kind == KIND_MULTI_CPU ? CT_DIST_MULTI_CPU : CT_DIST_MULTI_GPU;
    if (kind != KIND_NO)
        TRY(ask_yes_no(a, "checking distributed operations",
                       "Should distributed operations be checked while running for errors? This can avoid timeout "
                       "issues but will be slower.",
                       c->debug, &c->debug));

    if (m->gpus == 0 || kind == KIND_MULTI_CPU)
        c->use_cpu = true;
    else if (kind == KIND_MULTI_GPU)
        c->use_cpu = false;
    else
        TRY(ask_yes_no(a, "running on the CPU only",
                       "Do you want to run your training on CPU only (even if a GPU is available)?", c->use_cpu,
                       &c->use_cpu));

    bool ds, fsdp = false;
    TRY(ask_yes_no(a, "DeepSpeed", "Do you want to use DeepSpeed?", was == CT_DIST_DEEPSPEED, &ds));
    if (ds) {
        c->distributed_type = CT_DIST_DEEPSPEED;
        TRY(ask_deepspeed(a, c));
    } else if (kind != KIND_NO) {
        TRY(ask_yes_no(a, "FSDP", "Do you want to use FullyShardedDataParallel?", was == CT_DIST_FSDP, &fsdp));
        if (fsdp) {
            c->distributed_type = CT_DIST_FSDP;
            TRY(ask_fsdp(a, c));
        }
    }

    TRY(ask_processes(a, m, kind, c));

    /* a DeepSpeed json file sets the precision itself (its fp16 / bf16 blocks): left
     * unset, as Accelerate does, so that launch passes no --mixed_precision against it */
    if (ds && c->deepspeed.deepspeed_config_file[0])
        c->mixed_precision[0] = 0;
    else
        TRY(ask_precision(a, c));

    if (ds) {
        c->gradient_accumulation_steps = 0; /* deepspeed_config's count is the one */
    } else {
        int steps = c->gradient_accumulation_steps >= 1 ? c->gradient_accumulation_steps : 1;
        TRY(ask_int(a, "gradient accumulation steps", "How many gradient accumulation steps do you want to use?", 1,
                    MAX_ACCUM, 1, steps, &c->gradient_accumulation_steps));
    }
    return CT_OK;
}

ct_status ct_config_ask(FILE *in, FILE *out, const ct_config_ask_machine *m, ct_cluster_config *c)
{
    if (!in || !out || !m || !c) return ct_error_set(CT_ERR_INVALID, "config: ct_config_ask was given a NULL argument");
    if (m->gpus < 0 || m->gpus > 1024 || m->cores < 1)
        return ct_error_set(CT_ERR_INVALID, "config: a machine with %d GPU(s) and %d core(s) cannot be configured",
                            m->gpus, m->cores);
    asker a = {.in = in, .out = out};
    ct_cluster_config work = *c;
    fprintf(out, "Answer each question and press Enter; Enter alone takes the value in brackets.\n");
    ct_status st = ask_all(&a, m, &work);
    free(a.line);
    if (st == CT_OK) *c = work;
    if (fflush(out) != 0 && st == CT_OK)
        st = ct_error_set(CT_ERR_IO, "config: cannot write the questions: %s", strerror(errno));
    return st;
}
