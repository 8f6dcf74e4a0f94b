/* `ctrain launch` flags -> ct_launch_opts, the help text, and the environment
 * each rank gets (tools/launch.h; user documentation in docs/launch.md).
 *
 * Flags are accelerate's names. Both `--flag value` and `--flag=value` work, and
 * `--num-processes` is read as `--num_processes` (accelerate accepts both). The
 * first argument that is not a flag is PROGRAM; it and everything after it belong
 * to the program, so its own flags are never taken for the launcher's. `--` ends
 * the flags explicitly.
 */
#include "tools/launch.h"

#include "accel/plugins.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

extern char **environ;

#define MAX_PROCESSES (1 << 20)
#define MAX_MONITOR_S 3600.0
#define MAX_RDZV_S 86400.0

typedef enum {
    F_NUM_PROCESSES, F_NUM_MACHINES, F_MACHINE_RANK, F_MAIN_IP, F_MAIN_PORT, F_CPU,
    F_THREADS, F_GRAD_ACCUM, F_MIXED_PRECISION, F_TEE, F_LOG_DIR, F_MAX_RESTARTS,
    F_MONITOR, F_FP8_FORMAT, F_FP8_HISTORY, F_FP8_ALGO, F_FP8_MARGIN, F_FP8_EMBEDDING_AND_HEAD, F_CONFIG_FILE,
    F_GPU_IDS, F_DEBUG, F_HELP, F_RDZV_BACKEND, F_MIN_NODES, F_MAX_NODES, F_RDZV_TIMEOUT, F_RDZV_LAST_CALL,
    F_SAME_NETWORK,
} flag_id;

static const struct {
    const char *name;
    flag_id id;
    bool takes_value;
} FLAGS[] = {
    {"num_processes", F_NUM_PROCESSES, true},
    {"num_machines", F_NUM_MACHINES, true},
    {"machine_rank", F_MACHINE_RANK, true},
    {"main_process_ip", F_MAIN_IP, true},
    {"main_process_port", F_MAIN_PORT, true},
    {"cpu", F_CPU, false},
    {"num_cpu_threads_per_process", F_THREADS, true},
    {"gradient_accumulation_steps", F_GRAD_ACCUM, true},
    {"mixed_precision", F_MIXED_PRECISION, true},
    {"tee", F_TEE, true},
    {"log_dir", F_LOG_DIR, true},
    {"max_restarts", F_MAX_RESTARTS, true},
    {"monitor_interval", F_MONITOR, true},
    {"fp8_format", F_FP8_FORMAT, true},
    {"fp8_amax_history_len", F_FP8_HISTORY, true},
    {"fp8_amax_compute_algo", F_FP8_ALGO, true},
    {"fp8_margin", F_FP8_MARGIN, true},
    {"fp8_embedding_and_head", F_FP8_EMBEDDING_AND_HEAD, false},
    {"config_file", F_CONFIG_FILE, true},
    {"gpu_ids", F_GPU_IDS, true},
    {"debug", F_DEBUG, false},
    {"help", F_HELP, false},
    {"rdzv_backend", F_RDZV_BACKEND, true},
    {"min_nodes", F_MIN_NODES, true},
    {"max_nodes", F_MAX_NODES, true},
    {"rdzv_timeout", F_RDZV_TIMEOUT, true},
    {"rdzv_last_call", F_RDZV_LAST_CALL, true},
    {"same_network", F_SAME_NETWORK, true}, /* the value is optional: a bare flag means true */
};

static ct_status parse_int(const char *flag, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || isspace((unsigned char)*v) || *end || errno || x < lo || x > hi)
        return ct_error_set(CT_ERR_INVALID, "--%s '%s': expected a whole number from %ld to %ld", flag, v, lo, hi);
    *out = (int)x;
    return CT_OK;
}

/* ---- sharding flags: checked here with the library's parsers, passed on as CTRAIN_* ---- */

static ct_status check_stage(const char *v)
{
    int x;
    return parse_int("zero_stage", v, 0, 3, &x);
}
static ct_status check_device(const char *v)
{
    bool b;
    return ct_offload_device_parse(v, &b);
}
static ct_status check_path(const char *v)
{
    return *v ? CT_OK : ct_error_set(CT_ERR_INVALID, "an empty path");
}
static ct_status check_clip(const char *v)
{
    char *end;
    double x = strtod(v, &end);
    return *v && !*end && x >= 0 ? CT_OK : ct_error_set(CT_ERR_INVALID, "'%s': expected a number >= 0", v);
}
static ct_status check_strategy(const char *v)
{
    ct_shard_strategy x;
    return ct_fsdp_strategy_parse(v, &x);
}
static ct_status check_wrap(const char *v)
{
    ct_wrap_policy x;
    return ct_fsdp_wrap_policy_parse(v, &x);
}
static ct_status check_names(const char *v)
{
    return *v ? CT_OK : ct_error_set(CT_ERR_INVALID, "an empty list of module types");
}
static ct_status check_count(const char *v)
{
    int x;
    return parse_int("fsdp_min_num_params", v, 1, 0x7fffffff, &x);
}
static ct_status check_bool(const char *v)
{
    bool b;
    return ct_bool_parse(v, &b);
}
static ct_status check_prefetch(const char *v)
{
    ct_backward_prefetch x;
    return ct_fsdp_backward_prefetch_parse(v, &x);
}
static ct_status check_sd(const char *v)
{
    bool b;
    return ct_fsdp_state_dict_type_parse(v, &b);
}

static ct_status check_degree(const char *v)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || isspace((unsigned char)*v) || *end || errno || x < 1 || x > MAX_PROCESSES)
        return ct_error_set(CT_ERR_INVALID, "'%s': expected a whole number from 1 to %d", v, MAX_PROCESSES);
    return CT_OK;
}

/* Which --use_* flag a sharding flag needs. */
enum { USE_DEEPSPEED, USE_FSDP, USE_MEGATRON_LM };
static const char *const USE_NAMES[] = {"use_deepspeed", "use_fsdp", "use_megatron_lm"};

static const struct {
    const char *name, *env;
    ct_status (*check)(const char *v);
    int needs;      /* USE_* */
    bool bare_true; /* a boolean that may stand alone: --flag means --flag true */
} SHARDING_FLAGS[] = {
    {"zero_stage", "CTRAIN_ZERO_STAGE", check_stage, USE_DEEPSPEED, false},
    {"offload_optimizer_device", "CTRAIN_OFFLOAD_OPTIMIZER_DEVICE", check_device, USE_DEEPSPEED, false},
    {"offload_param_device", "CTRAIN_OFFLOAD_PARAM_DEVICE", check_device, USE_DEEPSPEED, false},
    {"deepspeed_config_file", "CTRAIN_DEEPSPEED_CONFIG_FILE", check_path, USE_DEEPSPEED, false},
    {"gradient_clipping", "CTRAIN_GRADIENT_CLIPPING", check_clip, USE_DEEPSPEED, false},
    {"fsdp_sharding_strategy", "CTRAIN_FSDP_SHARDING_STRATEGY", check_strategy, USE_FSDP, false},
    {"fsdp_auto_wrap_policy", "CTRAIN_FSDP_AUTO_WRAP_POLICY", check_wrap, USE_FSDP, false},
    {"fsdp_transformer_layer_cls_to_wrap", "CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP", check_names, USE_FSDP, false},
    {"fsdp_min_num_params", "CTRAIN_FSDP_MIN_NUM_PARAMS", check_count, USE_FSDP, false},
    {"fsdp_offload_params", "CTRAIN_FSDP_OFFLOAD_PARAMS", check_bool, USE_FSDP, false},
    {"fsdp_backward_prefetch", "CTRAIN_FSDP_BACKWARD_PREFETCH", check_prefetch, USE_FSDP, false},
    {"fsdp_forward_prefetch", "CTRAIN_FSDP_FORWARD_PREFETCH", check_bool, USE_FSDP, false},
    {"fsdp_reshard_after_forward", "CTRAIN_FSDP_RESHARD_AFTER_FORWARD", check_bool, USE_FSDP, false},
    {"fsdp_state_dict_type", "CTRAIN_FSDP_STATE_DICT_TYPE", check_sd, USE_FSDP, false},
    {"fsdp_sync_module_states", "CTRAIN_FSDP_SYNC_MODULE_STATES", check_bool, USE_FSDP, false},
    {"megatron_lm_tp_degree", "CTRAIN_MEGATRON_TP_DEGREE", check_degree, USE_MEGATRON_LM, false},
    {"megatron_lm_pp_degree", "CTRAIN_MEGATRON_PP_DEGREE", check_degree, USE_MEGATRON_LM, false},
    {"megatron_lm_num_micro_batches", "CTRAIN_MEGATRON_NUM_MICRO_BATCHES", check_degree, USE_MEGATRON_LM, false},
    {"megatron_lm_sequence_parallelism", "CTRAIN_MEGATRON_SEQUENCE_PARALLELISM", check_bool, USE_MEGATRON_LM, true},
    {"megatron_lm_use_distributed_optimizer", "CTRAIN_MEGATRON_USE_DISTRIBUTED_OPTIMIZER", check_bool,
     USE_MEGATRON_LM, true},
    {"megatron_lm_gradient_clipping", "CTRAIN_MEGATRON_GRADIENT_CLIPPING", check_clip, USE_MEGATRON_LM, false},
};
#define NSHARDING ((int)(sizeof SHARDING_FLAGS / sizeof *SHARDING_FLAGS))
_Static_assert(NSHARDING <= (int)(sizeof((ct_launch_opts *)0)->sharding / sizeof(char *)), "ct_launch_opts.sharding");

static int sharding_flag(const char *name)
{
    for (int i = 0; i < NSHARDING; i++)
        if (!strcmp(SHARDING_FLAGS[i].name, name)) return i;
    return -1;
}

static int sharding_int(const ct_launch_opts *o, const char *name)
{
    int i = sharding_flag(name);
    return o->sharding[i] ? atoi(o->sharding[i]) : 1;
}

static ct_status sharding_check(const ct_launch_opts *o)
{
    /* --use_megatron_lm composes with either: ZeRO or FSDP over the data-parallel axis */
    if (o->use_deepspeed && o->use_fsdp)
        return ct_error_set(CT_ERR_INVALID, "--use_deepspeed and --use_fsdp were both given: choose one");
    for (int i = 0; i < NSHARDING; i++) {
        if (!o->sharding[i]) continue;
        bool on = (bool[]){o->use_deepspeed, o->use_fsdp, o->use_megatron_lm}[SHARDING_FLAGS[i].needs];
        if (!on) return ct_error_set(CT_ERR_INVALID, "--%s needs --%s", SHARDING_FLAGS[i].name,
                                     USE_NAMES[SHARDING_FLAGS[i].needs]);
    }
    if (o->use_megatron_lm) {
        /* world = dp x tp x pp (parallel/mesh.h): the ranks would refuse it at prepare */
        int tp = sharding_int(o, "megatron_lm_tp_degree"), pp = sharding_int(o, "megatron_lm_pp_degree");
        if (o->num_processes % ((long)tp * pp))
            return ct_error_set(CT_ERR_INVALID,
                                "--num_processes %d is not divisible by --megatron_lm_tp_degree %d x "
                                "--megatron_lm_pp_degree %d = %ld (world = dp x tp x pp)",
                                o->num_processes, tp, pp, (long)tp * pp);
        const char *sp = o->sharding[sharding_flag("megatron_lm_sequence_parallelism")];
        bool on = false;
        if (sp && !ct_bool_parse(sp, &on) && on && tp == 1)
            return ct_error_set(CT_ERR_INVALID, "--megatron_lm_sequence_parallelism needs --megatron_lm_tp_degree > 1 "
                                                "(it splits the sequence over the tensor-parallel ranks)");
    }
    return CT_OK;
}

static const char *const PRECISIONS[] = {"no", "fp16", "bf16", "fp8"};
static const char *const FP8_FORMATS[] = {"hybrid", "e4m3"};
static const char *const FP8_ALGOS[] = {"max", "most_recent"};

void ct_launch_usage(FILE *f)
{
    fputs("usage: ctrain launch [flags] PROGRAM [ARGS...]\n"
          "\n"
          "Starts this machine's ranks of a job of --num_processes processes, prefixes their\n"
          "output [rankN], forwards SIGINT/SIGTERM, and stops every rank when one fails.\n"
          "Flags take `--flag value` or `--flag=value`; `--` ends the flags.\n"
          "\n"
          "  --config_file PATH           a launch configuration (Accelerate's format; `ctrain config`\n"
          "                               writes one): its values are the defaults the flags\n"
          "                               override. Without it, the default file is read when it\n"
          "                               exists ($CTRAIN_CONFIG_FILE, else\n"
          "                               ~/.cache/ctrain/default_config.yaml)\n"
          "  --num_processes N            processes in total, across machines (default 1)\n"
          "  --num_machines M             machines in the job (default 1); M must divide N\n"
          "  --machine_rank R             this machine's index, 0..M-1 (default 0)\n"
          "  --main_process_ip ADDR       address of rank 0's machine (default 127.0.0.1)\n"
          "  --main_process_port P        rank 0's rendezvous port (default 29500);\n"
          "                               0 picks a free port (one machine only)\n"
          "  --cpu                        run on the CPU even where a GPU exists (CTRAIN_USE_CPU=1)\n"
          "  --gpu_ids all|IDS            the GPUs this machine's ranks use, e.g. 0,2 (sets\n"
          "                               CUDA_VISIBLE_DEVICES; at least one per local rank)\n"
          "  --debug                      debugging run (as accelerate launch --debug): CTRAIN_DEBUG=1 for\n"
          "                               the program, and CUDA work synchronous (CTRAIN_CUDA_SYNC=1) so a\n"
          "                               kernel's fault is reported at its own op; collectives are\n"
          "                               checked across ranks with or without it\n"
          "  --num_cpu_threads_per_process T\n"
          "                               threads per rank (default: online cores / local ranks;\n"
          "                               an exported OMP_NUM_THREADS is kept unless T is given)\n"
          "  --gradient_accumulation_steps K\n"
          "                               micro-steps per optimizer step\n"
          "  --mixed_precision no|fp16|bf16|fp8\n"
          "  --fp8_format HYBRID|E4M3     fp8: E4M3 forward and E5M2 gradients (HYBRID, default),\n"
          "                               or E4M3 throughout\n"
          "  --fp8_amax_history_len N     fp8: steps of amax history per tensor (default 1024)\n"
          "  --fp8_amax_compute_algo max|most_recent\n"
          "                               fp8: the scale follows the history's max (default) or\n"
          "                               its newest amax\n"
          "  --fp8_margin M               fp8: scales 2^M smaller than the range allows (default 0)\n"
          "  --fp8_embedding_and_head     fp8: the tied embedding's head product in fp8 too\n"
          "                               (default: bf16)\n"
          "\n"
          "Sharding (docs/strategies.md), as accelerate's flags:\n"
          "  --use_deepspeed              ZeRO through DeepSpeed's settings:\n"
          "  --zero_stage 0|1|2|3         0 replicated (DDP), 1 optimizer state, 2 + gradients,\n"
          "                               3 + parameters sharded\n"
          "  --offload_optimizer_device none|cpu\n"
          "  --offload_param_device none|cpu   (stage 3)\n"
          "  --deepspeed_config_file PATH a ds_config.json (\"auto\" values filled in)\n"
          "  --gradient_clipping NORM     clip the global gradient norm before each step\n"
          "  --use_fsdp                   sharding through FSDP's settings:\n"
          "  --fsdp_sharding_strategy FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD (or 1..4)\n"
          "  --fsdp_auto_wrap_policy NO_WRAP|TRANSFORMER_BASED_WRAP|SIZE_BASED_WRAP\n"
          "  --fsdp_transformer_layer_cls_to_wrap NAMES   module types, comma-separated (Block)\n"
          "  --fsdp_min_num_params N      SIZE_BASED_WRAP's threshold (default 100000000)\n"
          "  --fsdp_offload_params true|false\n"
          "  --fsdp_backward_prefetch BACKWARD_PRE|BACKWARD_POST|NO_PREFETCH\n"
          "  --fsdp_forward_prefetch true|false\n"
          "  --fsdp_reshard_after_forward true|false\n"
          "  --fsdp_state_dict_type FULL_STATE_DICT|SHARDED_STATE_DICT\n"
          "  --fsdp_sync_module_states true|false\n"
          "  --use_megatron_lm            Megatron-LM tensor and pipeline parallelism (world =\n"
          "                               dp x tp x pp; with --use_deepspeed or --use_fsdp those\n"
          "                               shard over dp):\n"
          "  --megatron_lm_tp_degree N    tensor-parallel ranks (default 1); N x pp must divide\n"
          "                               --num_processes\n"
          "  --megatron_lm_pp_degree N    pipeline stages (default 1): the model's layers cut\n"
          "                               into N stages, trained with the 1F1B schedule\n"
          "  --megatron_lm_num_micro_batches N   micro-batches each batch is cut into for the\n"
          "                               pipeline (default 1; must divide the batch size)\n"
          "  --megatron_lm_sequence_parallelism [true|false]   activations split along the\n"
          "                               sequence over the tensor-parallel ranks\n"
          "  --megatron_lm_use_distributed_optimizer [true|false]   optimizer state sharded\n"
          "                               over the data-parallel ranks\n"
          "  --megatron_lm_gradient_clipping NORM   clip the global gradient norm before each step\n"
          "\n"
          "  --tee 0|1|2|3                also write each rank's stdout (1), stderr (2) or both (3)\n"
          "                               to files in --log_dir (default 3 with --log_dir, else 0)\n"
          "  --log_dir DIR                where rank{N}.stdout and rank{N}.stderr go (created)\n"
          "  --max_restarts N             restart the local ranks up to N times after a failure\n"
          "                               (default 0)\n"
          "  --monitor_interval SECONDS   how often the ranks are checked on (default 0.1)\n"
          "\n"
          "Elastic training (torchrun's --nnodes MIN:MAX; docs/launch.md, \"Elastic training\"):\n"
          "  --rdzv_backend static|c10d   static (default): a fixed set of machines; c10d: rounds of\n"
          "                               a rendezvous served by machine rank 0's launcher on\n"
          "                               --main_process_port; a failure or a node's arrival starts a\n"
          "                               new round and the ranks restart with the nodes present\n"
          "  --min_nodes N, --max_nodes M  the node range (c10d); --num_processes / M ranks per node,\n"
          "                               --num_machines is M\n"
          "  --rdzv_timeout SECONDS       a round must reach --min_nodes within it (default 900)\n"
          "  --rdzv_last_call SECONDS     with --min_nodes joined, wait this long for more (default 3)\n"
          "  --same_network [true|false]  Accelerate's flag: accepted; the machines reach\n"
          "                               --main_process_ip either way\n"
          "  -h, --help                   this text\n"
          "\n"
          "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
          "MASTER_ADDR, MASTER_PORT, CTRAIN_RESTART_COUNT, CTRAIN_JOB_ID and CTRAIN_STORE_TOKEN\n"
          "(c10d: also GROUP_WORLD_SIZE and CTRAIN_RDZV_ROUND).\n"
          "Exit status: 0 when every rank exits 0, else the first failing rank's status\n"
          "(128+signal if it was killed); 2 for a usage error, 127 when PROGRAM is not found.\n"
          "Details: docs/launch.md.\n",
          f);
}

/* ---- values ------------------------------------------------------------------ */


static ct_status parse_value(ct_launch_opts *o, flag_id id, const char *flag, const char *v)
{
    switch (id) {
    case F_NUM_PROCESSES: return parse_int(flag, v, 1, MAX_PROCESSES, &o->num_processes);
    case F_NUM_MACHINES:
        o->num_machines_given = true;
        return parse_int(flag, v, 1, MAX_PROCESSES, &o->num_machines);
    case F_MIN_NODES: return parse_int(flag, v, 1, MAX_PROCESSES, &o->min_nodes);
    case F_MAX_NODES: return parse_int(flag, v, 1, MAX_PROCESSES, &o->max_nodes);
    case F_RDZV_BACKEND:
        if (strcmp(v, "static") && strcmp(v, "c10d"))
            return ct_error_set(CT_ERR_INVALID, "--rdzv_backend '%s': expected static or c10d (etcd is not supported)",
                                v);
        o->rdzv_backend = !strcmp(v, "static") ? "static" : "c10d";
        return CT_OK;
    case F_SAME_NETWORK: return ct_bool_parse(v, &o->same_network) ? ct_error_prefix("--same_network: ") : CT_OK;
    case F_RDZV_TIMEOUT:
    case F_RDZV_LAST_CALL: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        bool last = id == F_RDZV_LAST_CALL;
        if (!*v || isspace((unsigned char)*v) || *end || errno || !isfinite(x) || (last ? x < 0 : x <= 0) ||
            x > MAX_RDZV_S)
            return ct_error_set(CT_ERR_INVALID, "--%s '%s': expected seconds, %s and at most %g", flag, v,
                                last ? "0 or more" : "more than 0", MAX_RDZV_S);
        *(last ? &o->rdzv_last_call_s : &o->rdzv_timeout_s) = x;
        return CT_OK;
    }
    case F_MACHINE_RANK: return parse_int(flag, v, 0, MAX_PROCESSES - 1, &o->machine_rank);
    case F_MAIN_PORT: return parse_int(flag, v, 0, 65535, &o->main_process_port);
    case F_GRAD_ACCUM: return parse_int(flag, v, 1, 1 << 30, &o->grad_accum);
    case F_TEE: return parse_int(flag, v, 0, 3, &o->tee);
    case F_MAX_RESTARTS: return parse_int(flag, v, 0, 1 << 30, &o->max_restarts);
    case F_THREADS:
        o->threads_explicit = true;
        return parse_int(flag, v, 1, 1 << 16, &o->threads);
    case F_MAIN_IP: {
        size_t n = strlen(v);
        if (n == 0 || n >= sizeof o->main_process_ip)
            return ct_error_set(CT_ERR_INVALID, "--main_process_ip '%s': expected a host name or address of 1 to %zu characters",
                                v, sizeof o->main_process_ip - 1);
        memcpy(o->main_process_ip, v, n + 1);
        return CT_OK;
    }
    case F_MIXED_PRECISION:
        for (size_t i = 0; i < sizeof PRECISIONS / sizeof *PRECISIONS; i++)
            if (!strcmp(v, PRECISIONS[i])) {
                o->mixed_precision = PRECISIONS[i];
                return CT_OK;
            }
        return ct_error_set(CT_ERR_INVALID, "--mixed_precision '%s': expected no, fp16, bf16 or fp8", v);
    case F_FP8_FORMAT:
    case F_FP8_ALGO: {
        const char *const *names = id == F_FP8_FORMAT ? FP8_FORMATS : FP8_ALGOS;
        for (int i = 0; i < 2; i++)
            if (!strcasecmp(v, names[i])) {
                *(id == F_FP8_FORMAT ? &o->fp8_format : &o->fp8_amax_compute_algo) = names[i];
                return CT_OK;
            }
        return ct_error_set(CT_ERR_INVALID, "--%s '%s': expected %s", flag, v,
                            id == F_FP8_FORMAT ? "HYBRID or E4M3" : "max or most_recent");
    }
    case F_FP8_HISTORY: return parse_int(flag, v, 1, 1 << 20, &o->fp8_amax_history_len);
    case F_FP8_MARGIN:
        o->fp8_margin_given = true;
        return parse_int(flag, v, 0, 64, &o->fp8_margin);
    case F_CONFIG_FILE:
        if (!*v) return ct_error_set(CT_ERR_INVALID, "--config_file: expected a file, got an empty string");
        o->config_file = v;
        return CT_OK;
    case F_GPU_IDS:
        if (!ct_gpu_ids_valid(v) || strlen(v) >= sizeof o->gpu_ids)
            return ct_error_set(CT_ERR_INVALID, "--gpu_ids '%s': expected all, or GPU indices separated by commas "
                                                "(0,2)", v);
        memcpy(o->gpu_ids, v, strlen(v) + 1);
        return CT_OK;
    case F_LOG_DIR:
        if (!*v) return ct_error_set(CT_ERR_INVALID, "--log_dir: expected a directory, got an empty string");
        o->log_dir = v;
        return CT_OK;
    case F_MONITOR: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (!*v || isspace((unsigned char)*v) || *end || errno || !isfinite(x) || x <= 0 || x > MAX_MONITOR_S)
            return ct_error_set(CT_ERR_INVALID, "--monitor_interval '%s': expected seconds, more than 0 and at most %g",
                                v, MAX_MONITOR_S);
        o->monitor_interval_s = x;
        return CT_OK;
    }
    case F_CPU:
    case F_FP8_EMBEDDING_AND_HEAD:
    case F_DEBUG:
    case F_HELP: break;
    }
    return ct_error_set(CT_ERR_INVALID, "--%s takes no value", flag);
}

/* --rdzv_backend, --min_nodes, --max_nodes: the node range (torchrun's --nnodes MIN:MAX);
 * num_machines becomes max_nodes. */
static ct_status check_elastic(ct_launch_opts *o)
{
    bool range = o->min_nodes || o->max_nodes;
    if (o->rdzv_backend && !strcmp(o->rdzv_backend, "static")) {
        if (range && o->min_nodes != o->max_nodes)
            return ct_error_set(CT_ERR_INVALID,
                                "--rdzv_backend static needs a fixed node count, got --min_nodes %d --max_nodes %d: "
                                "use --rdzv_backend c10d for a range",
                                o->min_nodes, o->max_nodes);
        if (range) o->num_machines = o->max_nodes ? o->max_nodes : o->min_nodes;
        return CT_OK;
    }
    if (!range && !o->rdzv_backend) return CT_OK; /* static, as always */
    o->elastic = true;
    if (!o->max_nodes) o->max_nodes = o->num_machines_given || !o->min_nodes ? o->num_machines : o->min_nodes;
    if (!o->min_nodes) o->min_nodes = o->max_nodes;
    if (o->min_nodes > o->max_nodes)
        return ct_error_set(CT_ERR_INVALID, "--min_nodes %d is more than --max_nodes %d", o->min_nodes,
                            o->max_nodes);
    if (o->num_machines_given && o->num_machines != o->max_nodes)
        return ct_error_set(CT_ERR_INVALID,
                            "--num_machines %d and --max_nodes %d differ: give one (num_machines is max_nodes)",
                            o->num_machines, o->max_nodes);
    o->num_machines = o->max_nodes;
    if (o->num_processes % o->max_nodes)
        return ct_error_set(CT_ERR_INVALID,
                            "--num_processes %d is not a multiple of --max_nodes %d (each node runs num_processes / "
                            "max_nodes ranks, whether --min_nodes %d or more nodes take part)",
                            o->num_processes, o->max_nodes, o->min_nodes);
    if (o->machine_rank >= o->max_nodes)
        return ct_error_set(CT_ERR_INVALID, "--machine_rank %d is out of range for --max_nodes %d (0 to %d)",
                            o->machine_rank, o->max_nodes, o->max_nodes - 1);
    return CT_OK;
}

/* The combinations, once every flag is read. */
static ct_status check_opts(ct_launch_opts *o, bool tee_given)
{
    if (check_elastic(o)) return ct_last_status();
    if (o->num_processes % o->num_machines)
        return ct_error_set(CT_ERR_INVALID,
                            "--num_processes %d is not a multiple of --num_machines %d (each machine runs "
                            "num_processes / num_machines ranks)",
                            o->num_processes, o->num_machines);
    if (o->machine_rank >= o->num_machines)
        return ct_error_set(CT_ERR_INVALID, "--machine_rank %d is out of range for --num_machines %d (0 to %d)",
                            o->machine_rank, o->num_machines, o->num_machines - 1);
    if (o->main_process_port == 0 && o->num_machines > 1)
        return ct_error_set(CT_ERR_INVALID,
                            "--main_process_port 0 (pick a free port) works only with --num_machines 1: "
                            "the other machines could not learn the port; give a fixed port");
    if (tee_given && o->tee && !o->log_dir)
        return ct_error_set(CT_ERR_INVALID, "--tee %d needs --log_dir DIR (where the per-rank files go)", o->tee);
    if (o->log_dir && !tee_given) o->tee = 3;
    o->local_processes = o->num_processes / o->num_machines;
    if (o->gpu_ids[0] && strcmp(o->gpu_ids, "all") && !o->cpu) {
        int n = ct_gpu_ids_count(o->gpu_ids);
        if (n < o->local_processes)
            return ct_error_set(CT_ERR_INVALID,
                                "--gpu_ids '%s' names %d GPU(s) for %d local processes (--num_processes %d on %d "
                                "machine(s)): each process needs a GPU of its own",
                                o->gpu_ids, n, o->local_processes, o->num_processes, o->num_machines);
    }
    if (!o->threads_explicit) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long t = cores > 0 ? cores / o->local_processes : 1;
        o->threads = t > 1 ? (int)t : 1;
    }
    return CT_OK;
}

/* Reads the flags of argv[1..argc-1] into *o up to PROGRAM; *prog is PROGRAM's
 * index (argc when there is none). */
static ct_status parse_flags(int argc, char **argv, ct_launch_opts *o, bool *tee_given, int *prog)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "-h")) {
            o->help = true;
            continue;
        }
        if (a[0] != '-') break; /* PROGRAM */
        if (a[1] != '-')
            return ct_error_set(CT_ERR_INVALID, "unknown flag '%s' (ctrain launch --help lists the flags)", a);

        const char *eq = strchr(a + 2, '=');
        size_t n = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        char name[64];
        if (n == 0 || n >= sizeof name)
            return ct_error_set(CT_ERR_INVALID, "unknown flag '%s' (ctrain launch --help lists the flags)", a);
        for (size_t k = 0; k < n; k++) name[k] = a[2 + k] == '-' ? '_' : a[2 + k];
        name[n] = 0;

        if (!strcmp(name, "use_deepspeed") || !strcmp(name, "use_fsdp") || !strcmp(name, "use_megatron_lm")) {
            if (eq) return ct_error_set(CT_ERR_INVALID, "--%s takes no value (got '%s')", name, a);
            if (name[4] == 'd') o->use_deepspeed = true;
            else if (name[4] == 'f') o->use_fsdp = true;
            else o->use_megatron_lm = true;
            continue;
        }
        int sf = sharding_flag(name);
        if (sf >= 0) {
            const char *v = eq ? eq + 1 : NULL;
            bool b;
            /* a bare boolean: the next argument is its value only when it reads as one */
            if (!v && SHARDING_FLAGS[sf].bare_true && (i + 1 >= argc || ct_bool_parse(argv[i + 1], &b))) {
                ct_error_clear();
                v = "true";
            }
            if (!v) {
                if (i + 1 >= argc) return ct_error_set(CT_ERR_INVALID, "--%s needs a value", name);
                v = argv[++i];
            }
            if (SHARDING_FLAGS[sf].check(v))
                return strncmp(ct_last_error(), "--", 2) ? ct_error_prefix("--%s: ", name) : ct_last_status();
            o->sharding[sf] = v;
            continue;
        }
        size_t f = 0, nf = sizeof FLAGS / sizeof *FLAGS;
        while (f < nf && strcmp(FLAGS[f].name, name)) f++;
        if (f == nf)
            return ct_error_set(CT_ERR_INVALID, "unknown flag '--%s' (ctrain launch --help lists the flags)", name);

        if (!FLAGS[f].takes_value) {
            if (eq) return ct_error_set(CT_ERR_INVALID, "--%s takes no value (got '%s')", name, a);
            if (FLAGS[f].id == F_CPU) o->cpu = true;
            else if (FLAGS[f].id == F_FP8_EMBEDDING_AND_HEAD) o->fp8_embedding_and_head = true;
            else if (FLAGS[f].id == F_DEBUG) o->debug = true;
            else o->help = true;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        bool b;
        /* --same_network alone means true (Accelerate's store_true); a boolean after it is its value */
        if (!v && FLAGS[f].id == F_SAME_NETWORK && (i + 1 >= argc || ct_bool_parse(argv[i + 1], &b))) {
            ct_error_clear();
            v = "true";
        }
        if (!v) {
            if (i + 1 >= argc) return ct_error_set(CT_ERR_INVALID, "--%s needs a value", name);
            v = argv[++i];
        }
        if (FLAGS[f].id == F_TEE) *tee_given = true;
        if (parse_value(o, FLAGS[f].id, name, v)) return ct_last_status();
    }
    *prog = i;
    return CT_OK;
}

static void opts_defaults(ct_launch_opts *o)
{
    *o = (ct_launch_opts){
        .num_processes = 1, .num_machines = 1, .main_process_ip = "127.0.0.1",
        .main_process_port = CT_LAUNCH_DEFAULT_PORT, .monitor_interval_s = 0.1,
        .rdzv_timeout_s = CT_LAUNCH_DEFAULT_RDZV_TIMEOUT_S, .rdzv_last_call_s = CT_LAUNCH_DEFAULT_RDZV_LAST_CALL_S,
    };
}

/* The configuration file's flags into *o, before the command line's (accelerate
 * launch's order: the file's values are defaults the flags override). */
static ct_status apply_config(ct_launch_opts *o, const char *given, bool cmdline_strategy)
{
    char path[1024];
    bool is_default = !given;
    if (given) {
        snprintf(path, sizeof path, "%s", given);
    } else {
        struct stat st;
        if (ct_cluster_config_default_path(path, sizeof path) || stat(path, &st) != 0) return CT_OK;
    }
    ct_cluster_config c;
    if (ct_cluster_config_read(path, &c, NULL)) return ct_last_status();
    if (ct_cluster_config_check(&c)) return ct_error_prefix("'%s': ", path);
    if (ct_cluster_config_launch_args(&c, !cmdline_strategy, &o->file_args)) return ct_error_prefix("'%s': ", path);
    snprintf(o->config_path, sizeof o->config_path, "%s", path);
    o->config_default = is_default;
    /* flag parsing counts from argv[1]: argv[0] is the command's name */
    char *fa[CT_CLUSTER_LAUNCH_ARGS_MAX + 1] = {"launch"};
    for (int k = 0; k < o->file_args.argc; k++) fa[k + 1] = (char *)o->file_args.argv[k];
    bool tee_given = false;
    int prog;
    if (parse_flags(o->file_args.argc + 1, fa, o, &tee_given, &prog))
        return ct_error_prefix("the configuration '%s': ", path);
    o->num_machines_given = false; /* the file's value yields to --max_nodes */
    return CT_OK;
}

ct_status ct_launch_args_parse(int argc, char **argv, ct_launch_opts *o)
{
    opts_defaults(o);
    bool tee_given = false;
    int i;
    if (parse_flags(argc, argv, o, &tee_given, &i)) return ct_last_status();
    if (o->help) return CT_OK;
    /* again, over the file's values */
    const char *given = o->config_file;
    bool strategy = o->use_deepspeed || o->use_fsdp || o->use_megatron_lm;
    opts_defaults(o);
    if (apply_config(o, given, strategy)) return ct_last_status();
    tee_given = false;
    if (parse_flags(argc, argv, o, &tee_given, &i)) return ct_last_status();
    if (i >= argc)
        return ct_error_set(CT_ERR_INVALID, "no PROGRAM given (usage: ctrain launch [flags] PROGRAM [ARGS...])");
    if (!argv[i][0]) return ct_error_set(CT_ERR_INVALID, "PROGRAM is an empty string");
    o->program_argv = argv + i;
    ct_status st = check_opts(o, tee_given);
    if (!st) st = sharding_check(o);
    /* The ranks' store refuses a store of another job on the same port (dist/store.h):
     * a job id per launch, unless the user exported one. Launchers on several
     * machines cannot agree on a random one, so there CTRAIN_JOB_ID is the user's. */
    const char *user = getenv("CTRAIN_JOB_ID");
    if (!st && o->num_machines == 1 && !(user && *user)) {
        uint64_t r[2];
        if (uv_random(NULL, NULL, r, sizeof r, 0, NULL))
            r[0] = (uint64_t)getpid() << 32 ^ (uint64_t)uv_hrtime(), r[1] = (uint64_t)uv_hrtime();
        snprintf(o->job_id, sizeof o->job_id, "%016llx%016llx", (unsigned long long)r[0], (unsigned long long)r[1]);
    }
    /* The store and the transports admit only connections that present the job's
     * token (dist/store.h): an exported one is passed on, else one machine draws a
     * random one. It is not secret from whoever can read the ranks' environment. */
    const char *token = getenv("CTRAIN_STORE_TOKEN");
    if (!st && token && *token) {
        if (strlen(token) > CT_STORE_MAX_TOKEN)
            return ct_error_set(CT_ERR_INVALID, "CTRAIN_STORE_TOKEN is %zu bytes; at most %d", strlen(token),
                                CT_STORE_MAX_TOKEN);
        snprintf(o->store_token, sizeof o->store_token, "%s", token);
    } else if (!st && o->num_machines == 1) {
        uint64_t r[2];
        if (uv_random(NULL, NULL, r, sizeof r, 0, NULL))
            return ct_error_set(CT_ERR_IO, "cannot draw a random store token (uv_random failed); export "
                                           "CTRAIN_STORE_TOKEN instead");
        snprintf(o->store_token, sizeof o->store_token, "%016llx%016llx", (unsigned long long)r[0],
                 (unsigned long long)r[1]);
    }
    return st;
}

/* ---- each rank's environment ----------------------------------------------------- */

typedef struct {
    const char *name;
    char value[1024];
} env_var;

static bool env_name_is(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return !strncmp(entry, name, n) && entry[n] == '=';
}

char **ct_launch_env_new(const ct_launch_opts *o, int local_rank, int port, int restart_count)
{
    return ct_launch_env_round(o, local_rank, port, restart_count, o->machine_rank, -1, -1);
}

/* nodes < 0: the static rendezvous (the flags' machine rank and world size) */
char **ct_launch_env_round(const ct_launch_opts *o, int local_rank, int port, int restart_count, int node_rank,
                           int nodes, int round)
{
    env_var set[64];
    int ns = 0;
#define SETF(NAME, ...) (set[ns].name = (NAME), snprintf(set[ns].value, sizeof set[ns].value, __VA_ARGS__), ns++)
    SETF("RANK", "%d", node_rank * o->local_processes + local_rank);
    SETF("LOCAL_RANK", "%d", local_rank);
    SETF("WORLD_SIZE", "%d", nodes < 0 ? o->num_processes : nodes * o->local_processes);
    SETF("LOCAL_WORLD_SIZE", "%d", o->local_processes);
    SETF("GROUP_RANK", "%d", node_rank);
    SETF("MASTER_ADDR", "%s", o->main_process_ip);
    SETF("MASTER_PORT", "%d", port);
    SETF("CTRAIN_RESTART_COUNT", "%d", restart_count);
    if (nodes >= 0) {
        SETF("GROUP_WORLD_SIZE", "%d", nodes);
        SETF("CTRAIN_RDZV_ROUND", "%d", round);
    }
    if (o->job_id[0]) SETF("CTRAIN_JOB_ID", "%s", o->job_id);
    if (o->store_token[0]) SETF("CTRAIN_STORE_TOKEN", "%s", o->store_token);
    if (o->cpu) SETF("CTRAIN_USE_CPU", "1");
    if (o->gpu_ids[0] && strcmp(o->gpu_ids, "all")) SETF("CUDA_VISIBLE_DEVICES", "%s", o->gpu_ids);
    if (o->debug) {
        SETF("CTRAIN_DEBUG", "1");
        /* asynchronous kernel faults otherwise surface at the next synchronisation,
         * named with the ops queued since (core/cuda_runtime.c) */
        if (!getenv("CTRAIN_CUDA_SYNC")) SETF("CTRAIN_CUDA_SYNC", "1");
    }
    /* The default thread count defers to a user's OMP_NUM_THREADS; an explicit
     * --num_cpu_threads_per_process is a request for this launch and wins. */
    if (o->threads_explicit || !getenv("OMP_NUM_THREADS")) {
        SETF("OMP_NUM_THREADS", "%d", o->threads);
        SETF("CTRAIN_NUM_THREADS", "%d", o->threads);
    }
    if (o->grad_accum) SETF("CTRAIN_GRADIENT_ACCUMULATION_STEPS", "%d", o->grad_accum);
    if (o->mixed_precision) SETF("CTRAIN_MIXED_PRECISION", "%s", o->mixed_precision);
    if (o->fp8_format) SETF("CTRAIN_FP8_FORMAT", "%s", o->fp8_format);
    if (o->fp8_amax_history_len) SETF("CTRAIN_FP8_AMAX_HISTORY_LEN", "%d", o->fp8_amax_history_len);
    if (o->fp8_amax_compute_algo) SETF("CTRAIN_FP8_AMAX_COMPUTE_ALGO", "%s", o->fp8_amax_compute_algo);
    if (o->fp8_margin_given) SETF("CTRAIN_FP8_MARGIN", "%d", o->fp8_margin);
    if (o->fp8_embedding_and_head) SETF("CTRAIN_FP8_EMBEDDING_AND_HEAD", "1");
    if (o->use_deepspeed) SETF("CTRAIN_USE_DEEPSPEED", "1");
    if (o->use_fsdp) SETF("CTRAIN_USE_FSDP", "1");
    if (o->use_megatron_lm) SETF("CTRAIN_USE_MEGATRON_LM", "1");
    for (int k = 0; k < NSHARDING; k++)
        if (o->sharding[k]) SETF(SHARDING_FLAGS[k].env, "%s", o->sharding[k]);
#undef SETF

    size_t n = 0;
    while (environ && environ[n]) n++;
    char **env = calloc(n + (size_t)ns + 1, sizeof *env);
    if (!env) {
        ct_error_set(CT_ERR_NOMEM, "launch: environment of local rank %d: out of memory", local_rank);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool replaced = false;
        for (int s = 0; s < ns && !replaced; s++) replaced = env_name_is(environ[i], set[s].name);
        if (replaced) continue;
        if (!(env[k++] = strdup(environ[i]))) goto nomem;
    }
    for (int s = 0; s < ns; s++) {
        size_t len = strlen(set[s].name) + 1 + strlen(set[s].value) + 1;
        if (!(env[k] = malloc(len))) goto nomem;
        snprintf(env[k++], len, "%s=%s", set[s].name, set[s].value);
    }
    return env;
nomem:
    ct_launch_env_free(env);
    ct_error_set(CT_ERR_NOMEM, "launch: environment of local rank %d: out of memory", local_rank);
    return NULL;
}

void ct_launch_env_free(char **env)
{
    if (!env) return;
    for (size_t i = 0; env[i]; i++) free(env[i]);
    free(env);
}
