/* The launch configuration's schema, its reader (libyaml's document loader) and its
 * checks (tools/config_file.h; user documentation: docs/launch.md, "Configuration
 * files").
 *
 * The keys are Accelerate's ClusterConfig fields and the keys of its nested
 * sections, as `accelerate config` writes them. Each key has one row in a table:
 * how its value is parsed, where it goes, and whether the current writer always
 * writes it (a file without such a key is `old`: `ctrain config update` rewrites
 * it). Keys Accelerate writes that mean nothing to ctrain (TPU, dynamo, IPEX, ...)
 * are accepted and their names remembered; any other key is an error naming the
 * file, the line and the keys allowed there.
 */
#include "tools/config_file.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

#include "accel/plugins.h"

/* ---- the schema ------------------------------------------------------------------- */

typedef enum {
    V_STR,      /* char[size]; null leaves the default */
    V_BOOL,     /* bool: true/false, yes/no, on/off, 1/0 */
    V_INT,      /* int in [lo, hi] */
    V_LONG,     /* long in [lo, hi] */
    V_CLIP,     /* double >= 0, or "none"/null: -1 (not set) */
    V_CHOICE,   /* char[size], one of choices (any case), stored in the choice's spelling */
    V_IGNORED,  /* accepted, not used */
    V_SECTION,  /* a nested mapping */
    V_SPECIAL,  /* parsed by special() */
} value_kind;

typedef struct section section;

typedef struct key {
    const char *name;
    value_kind kind;
    size_t off, size;
    long lo, hi;
    const char *const *choices; /* NULL-terminated */
    const section *sub;         /* V_SECTION */
    const char *alias_of;       /* an older spelling of this key: reading it sets old */
    bool written;               /* the writer always writes it in this section */
} key;

struct section {
    const char *name; /* "" for the top level */
    const key *keys;
    int nkeys;
};

#define OFF(f) offsetof(ct_cluster_config, f), sizeof(((ct_cluster_config *)0)->f)

static const char *const PRECISIONS[] = {"no", "fp16", "bf16", "fp8", NULL};
static const char *const DIST_TYPES[] = {"NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP", "MEGATRON_LM", NULL};
static const char *const RDZV[] = {"static", "c10d", "etcd", "etcd-v2", NULL};
static const char *const DEVICES[] = {"none", "cpu", NULL};
static const char *const FP8_FORMATS[] = {"HYBRID", "E4M3", NULL};
static const char *const FP8_ALGOS[] = {"max", "most_recent", NULL};
static const char *const STRATEGIES[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", NULL};
static const char *const WRAPS[] = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP", NULL};
static const char *const PREFETCHES[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH", NULL};
static const char *const STATE_DICTS[] = {"FULL_STATE_DICT", "SHARDED_STATE_DICT", NULL};

const char *ct_dist_type_name(ct_dist_type t)
{
    return (unsigned)t < 6 ? DIST_TYPES[t] : "?";
}

static const key FP8_KEYS[] = {
    {"fp8_format", V_CHOICE, OFF(fp8.fp8_format), 0, 0, FP8_FORMATS, NULL, NULL, false},
    {"amax_history_len", V_INT, OFF(fp8.amax_history_len), 1, 1 << 20, NULL, NULL, NULL, false},
    {"amax_history_length", V_INT, OFF(fp8.amax_history_len), 1, 1 << 20, NULL, NULL, "amax_history_len", false},
    {"amax_compute_algo", V_CHOICE, OFF(fp8.amax_compute_algo), 0, 0, FP8_ALGOS, NULL, NULL, false},
    {"amax_compute_algorithm", V_CHOICE, OFF(fp8.amax_compute_algo), 0, 0, FP8_ALGOS, NULL, "amax_compute_algo", false},
    {"margin", V_INT, OFF(fp8.margin), 0, 64, NULL, NULL, NULL, false},
    /* Transformer Engine's and MS-AMP's settings: ctrain's fp8 is its own */
    {"backend", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"use_autocast_during_eval", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"interval", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"override_linear_precision", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"optimization_level", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
};

static const key DS_KEYS[] = {
    {"zero_stage", V_INT, OFF(deepspeed.zero_stage), 0, 3, NULL, NULL, NULL, false},
    {"offload_optimizer_device", V_SPECIAL, OFF(deepspeed.offload_optimizer_device), 0, 0, DEVICES, NULL, NULL, false},
    {"offload_param_device", V_SPECIAL, OFF(deepspeed.offload_param_device), 0, 0, DEVICES, NULL, NULL, false},
    {"gradient_accumulation_steps", V_INT, OFF(deepspeed.gradient_accumulation_steps), 1, 1 << 30, NULL, NULL, NULL,
     false},
    {"gradient_clipping", V_CLIP, OFF(deepspeed.gradient_clipping), 0, 0, NULL, NULL, NULL, false},
    {"deepspeed_config_file", V_SPECIAL, OFF(deepspeed.deepspeed_config_file), 0, 0, NULL, NULL, NULL, false},
    {"zero3_init_flag", V_BOOL, OFF(deepspeed.zero3_init_flag), 0, 0, NULL, NULL, NULL, false},
    {"zero3_save_16bit_model", V_SPECIAL, OFF(deepspeed.zero3_save_16bit_model), 0, 0, NULL, NULL, NULL, false},
    {"deepspeed_multinode_launcher", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"deepspeed_hostfile", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"deepspeed_exclusion_filter", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"deepspeed_inclusion_filter", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"deepspeed_moe_layer_cls_names", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"offload_optimizer_nvme_path", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"offload_param_nvme_path", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
};

static const key FSDP_KEYS[] = {
    {"fsdp_sharding_strategy", V_SPECIAL, OFF(fsdp.sharding_strategy), 0, 0, STRATEGIES, NULL, NULL, true},
    {"fsdp_offload_params", V_BOOL, OFF(fsdp.offload_params), 0, 0, NULL, NULL, NULL, true},
    {"fsdp_auto_wrap_policy", V_CHOICE, OFF(fsdp.auto_wrap_policy), 0, 0, WRAPS, NULL, NULL, true},
    {"fsdp_transformer_layer_cls_to_wrap", V_STR, OFF(fsdp.transformer_layer_cls_to_wrap), 0, 0, NULL, NULL, NULL,
     false},
    {"fsdp_min_num_params", V_LONG, OFF(fsdp.min_num_params), 1, LONG_MAX, NULL, NULL, NULL, false},
    {"fsdp_backward_prefetch", V_CHOICE, OFF(fsdp.backward_prefetch), 0, 0, PREFETCHES, NULL, NULL, true},
    {"fsdp_backward_prefetch_policy", V_CHOICE, OFF(fsdp.backward_prefetch), 0, 0, PREFETCHES, NULL,
     "fsdp_backward_prefetch", false},
    {"fsdp_state_dict_type", V_CHOICE, OFF(fsdp.state_dict_type), 0, 0, STATE_DICTS, NULL, NULL, true},
    {"fsdp_forward_prefetch", V_BOOL, OFF(fsdp.forward_prefetch), 0, 0, NULL, NULL, NULL, true},
    {"fsdp_use_orig_params", V_BOOL, OFF(fsdp.use_orig_params), 0, 0, NULL, NULL, NULL, true},
    {"fsdp_sync_module_states", V_BOOL, OFF(fsdp.sync_module_states), 0, 0, NULL, NULL, NULL, true},
    {"fsdp_cpu_ram_efficient_loading", V_BOOL, OFF(fsdp.cpu_ram_efficient_loading), 0, 0, NULL, NULL, NULL, true},
    {"fsdp_reshard_after_forward", V_BOOL, OFF(fsdp.reshard_after_forward), 0, 0, NULL, NULL, NULL, false},
    {"fsdp_version", V_INT, OFF(fsdp.version), 1, 2, NULL, NULL, NULL, false},
    {"fsdp_activation_checkpointing", V_BOOL, OFF(fsdp.activation_checkpointing), 0, 0, NULL, NULL, NULL, true},
};

static const key MEGATRON_KEYS[] = {
    {"megatron_lm_tp_degree", V_INT, OFF(megatron.tp_degree), 1, 1 << 20, NULL, NULL, NULL, true},
    {"megatron_lm_pp_degree", V_INT, OFF(megatron.pp_degree), 1, 1 << 20, NULL, NULL, NULL, true},
    {"megatron_lm_num_micro_batches", V_INT, OFF(megatron.num_micro_batches), 1, 1 << 20, NULL, NULL, NULL, true},
    {"megatron_lm_sequence_parallelism", V_BOOL, OFF(megatron.sequence_parallelism), 0, 0, NULL, NULL, NULL, true},
    {"megatron_lm_use_distributed_optimizer", V_BOOL, OFF(megatron.use_distributed_optimizer), 0, 0, NULL, NULL,
     NULL, true},
    {"megatron_lm_gradient_clipping", V_CLIP, OFF(megatron.gradient_clipping), 0, 0, NULL, NULL, NULL, true},
    {"megatron_lm_recompute_activations", V_BOOL, OFF(megatron.recompute_activations), 0, 0, NULL, NULL, NULL, true},
};

#define NKEYS(a) ((int)(sizeof(a) / sizeof *(a)))
static const section FP8_SECTION = {"fp8_config", FP8_KEYS, NKEYS(FP8_KEYS)};
static const section DS_SECTION = {"deepspeed_config", DS_KEYS, NKEYS(DS_KEYS)};
static const section FSDP_SECTION = {"fsdp_config", FSDP_KEYS, NKEYS(FSDP_KEYS)};
static const section MEGATRON_SECTION = {"megatron_lm_config", MEGATRON_KEYS, NKEYS(MEGATRON_KEYS)};

static const key TOP_KEYS[] = {
    {"compute_environment", V_SPECIAL, OFF(compute_environment), 0, 0, NULL, NULL, NULL, true},
    {"distributed_type", V_SPECIAL, 0, 0, 0, 0, DIST_TYPES, NULL, NULL, true},
    {"mixed_precision", V_SPECIAL, OFF(mixed_precision), 0, 0, PRECISIONS, NULL, NULL, false},
    {"use_cpu", V_BOOL, OFF(use_cpu), 0, 0, NULL, NULL, NULL, true},
    {"debug", V_BOOL, OFF(debug), 0, 0, NULL, NULL, NULL, true},
    {"num_processes", V_INT, OFF(num_processes), 1, 1 << 20, NULL, NULL, NULL, true},
    {"machine_rank", V_INT, OFF(machine_rank), 0, (1 << 20) - 1, NULL, NULL, NULL, true},
    {"num_machines", V_INT, OFF(num_machines), 1, 1 << 20, NULL, NULL, NULL, true},
    {"gpu_ids", V_SPECIAL, OFF(gpu_ids), 0, 0, NULL, NULL, NULL, false},
    {"main_process_ip", V_STR, OFF(main_process_ip), 0, 0, NULL, NULL, NULL, false},
    {"main_process_port", V_INT, OFF(main_process_port), 0, 65535, NULL, NULL, NULL, false},
    {"rdzv_backend", V_CHOICE, OFF(rdzv_backend), 0, 0, RDZV, NULL, NULL, true},
    {"same_network", V_BOOL, OFF(same_network), 0, 0, NULL, NULL, NULL, true},
    {"main_training_function", V_STR, OFF(main_training_function), 0, 0, NULL, NULL, NULL, true},
    {"enable_cpu_affinity", V_BOOL, OFF(enable_cpu_affinity), 0, 0, NULL, NULL, NULL, true},
    {"downcast_bf16", V_BOOL, OFF(downcast_bf16), 0, 0, NULL, NULL, NULL, true},
    /* ctrain's own: `accelerate launch` flags without a ClusterConfig field */
    {"num_cpu_threads_per_process", V_INT, OFF(num_cpu_threads_per_process), 1, 1 << 16, NULL, NULL, NULL, false},
    {"gradient_accumulation_steps", V_INT, OFF(gradient_accumulation_steps), 1, 1 << 30, NULL, NULL, NULL, false},
    {"fp8_config", V_SECTION, 0, 0, 0, 0, NULL, &FP8_SECTION, NULL, false},
    {"deepspeed_config", V_SECTION, 0, 0, 0, 0, NULL, &DS_SECTION, NULL, false},
    {"fsdp_config", V_SECTION, 0, 0, 0, 0, NULL, &FSDP_SECTION, NULL, false},
    {"megatron_lm_config", V_SECTION, 0, 0, 0, 0, NULL, &MEGATRON_SECTION, NULL, false},
    /* Accelerate's, unused by ctrain: TPU pods, torch dynamo, IPEX, mpirun, its TP */
    {"tpu_name", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"tpu_zone", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"tpu_use_cluster", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"tpu_use_sudo", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"tpu_vm", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"tpu_env", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"command_file", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"commands", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"dynamo_config", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"ipex_config", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"mpirun_config", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    {"tp_config", V_IGNORED, 0, 0, 0, 0, NULL, NULL, NULL, false},
    /* older spellings Accelerate still converts */
    {"fp16", V_SPECIAL, 0, 0, 0, 0, NULL, NULL, "mixed_precision", false},
    {"dynamo_backend", V_IGNORED, 0, 0, 0, 0, NULL, NULL, "dynamo_config", false},
};
static const section TOP_SECTION = {"", TOP_KEYS, NKEYS(TOP_KEYS)};

/* A DeepSpeed ds_config.json's own top-level keys: a file with one of them is not a
 * launch configuration. */
static const char *const DS_JSON_KEYS[] = {
    "zero_optimization", "train_batch_size", "train_micro_batch_size_per_gpu", "bf16", "optimizer", "scheduler",
    "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "gradient_clipping",
    "communication_data_type", "amp", "activation_checkpointing", "flops_profiler", NULL,
};

/* ---- reading ------------------------------------------------------------------------ */

typedef struct {
    const char *path;
    yaml_document_t *doc;
    ct_cluster_config *c;
    bool *old;
    bool fp16_key; /* the old `fp16: true` */
} reader;

static int line_of(const yaml_node_t *n)
{
    return (int)n->start_mark.line + 1;
}

static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

/* A value that says nothing: null, false, 0-length, an empty mapping or sequence. */
static bool is_empty(const yaml_node_t *n)
{
    if (is_null(n)) return true;
    if (n->type == YAML_MAPPING_NODE) return n->data.mapping.pairs.top == n->data.mapping.pairs.start;
    if (n->type == YAML_SEQUENCE_NODE) return n->data.sequence.items.top == n->data.sequence.items.start;
    const char *v = (const char *)n->data.scalar.value;
    bool b;
    return !*v || (!ct_bool_parse(v, &b) && !b);
}

static const char *kind_name(const yaml_node_t *n)
{
    return n->type == YAML_MAPPING_NODE ? "a mapping" : n->type == YAML_SEQUENCE_NODE ? "a list" : "a value";
}

static void list_keys(const section *s, char *buf, size_t n)
{
    size_t w = 0;
    buf[0] = 0;
    for (int i = 0; i < s->nkeys && w < n; i++)
        w += (size_t)snprintf(buf + w, n - w, "%s%s", i ? ", " : "", s->keys[i].name);
}

static ct_status bad_value(const reader *r, const yaml_node_t *n, const section *s, const key *k, const char *v,
                           const char *allowed)
{
    return ct_error_set(CT_ERR_INVALID, "%s:%d: %s%s%s '%s': expected %s", r->path, line_of(n), s->name,
                        *s->name ? "." : "", k->name, v, allowed);
}

static void choices_text(const char *const *choices, char *buf, size_t n)
{
    size_t w = 0;
    buf[0] = 0;
    for (int i = 0; choices[i] && w < n; i++)
        w += (size_t)snprintf(buf + w, n - w, "%s%s", i == 0 ? "" : choices[i + 1] ? ", " : " or ", choices[i]);
}

/* Index of v in choices (any case), or -1. */
static int choice_of(const char *const *choices, const char *v)
{
    for (int i = 0; choices[i]; i++)
        if (!strcasecmp(choices[i], v)) return i;
    return -1;
}

static ct_status set_string(const reader *r, const yaml_node_t *n, const section *s, const key *k, const char *v)
{
    size_t len = strlen(v);
    if (len >= k->size) {
        char allowed[64];
        snprintf(allowed, sizeof allowed, "at most %zu characters", k->size - 1);
        return bad_value(r, n, s, k, v, allowed);
    }
    memcpy((char *)r->c + k->off, v, len + 1);
    return CT_OK;
}

static ct_status set_choice(const reader *r, const yaml_node_t *n, const section *s, const key *k, const char *v)
{
    int i = choice_of(k->choices, v);
    if (i < 0) {
        char allowed[256];
        choices_text(k->choices, allowed, sizeof allowed);
        return bad_value(r, n, s, k, v, allowed);
    }
    return set_string(r, n, s, k, k->choices[i]);
}

bool ct_gpu_ids_valid(const char *v)
{
    if (!strcmp(v, "all")) return true;
    const char *p = v;
    long seen[256];
    int n = 0;
    for (;;) {
        char *end;
        if (*p < '0' || *p > '9') return false;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || x > 1023 || n == 256) return false;
        for (int i = 0; i < n; i++)
            if (seen[i] == x) return false;
        seen[n++] = x;
        p = end;
        while (*p == ' ') p++;
        if (!*p) return true;
        if (*p++ != ',') return false;
        while (*p == ' ') p++;
    }
}

static ct_status special(reader *r, const yaml_node_t *n, const section *s, const key *k, const char *v)
{
    ct_cluster_config *c = r->c;
    const char *name = k->name;
    if (!strcmp(name, "compute_environment")) {
        if (strcmp(v, "LOCAL_MACHINE"))
            return bad_value(r, n, s, k, v,
                             !strcmp(v, "AMAZON_SAGEMAKER")
                                 ? "LOCAL_MACHINE (ctrain runs jobs on machines it starts itself, not on SageMaker)"
                                 : "LOCAL_MACHINE");
        return set_string(r, n, s, k, v);
    }
    if (!strcmp(name, "distributed_type")) {
        int i = choice_of(DIST_TYPES, v);
        if (i < 0)
            return bad_value(r, n, s, k, v,
                             "NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP or MEGATRON_LM (ctrain has no XPU, NPU, MLU, "
                             "MUSA, TPU (XLA) or Accelerate TP backend)");
        c->distributed_type = (ct_dist_type)i;
        return CT_OK;
    }
    if (!strcmp(name, "mixed_precision")) {
        /* PyYAML reads a plain `no` as false; Accelerate then runs without mixed precision */
        if (!strcasecmp(v, "false")) v = "no";
        return set_choice(r, n, s, k, v);
    }
    if (!strcmp(name, "fp16")) { /* Accelerate's first spelling of mixed_precision */
        bool b;
        if (ct_bool_parse(v, &b)) return bad_value(r, n, s, k, v, "true or false");
        r->fp16_key = b;
        *r->old = true;
        return CT_OK;
    }
    if (!strcmp(name, "gpu_ids")) {
        if (!ct_gpu_ids_valid(v))
            return bad_value(r, n, s, k, v, "all, or GPU indices separated by commas (0,2), each once");
        return set_string(r, n, s, k, v);
    }
    if (!strcmp(name, "offload_optimizer_device") || !strcmp(name, "offload_param_device")) {
        if (!strcasecmp(v, "nvme"))
            return bad_value(r, n, s, k, v, "none or cpu (ctrain offloads to the CPU's memory, not to NVMe)");
        return set_choice(r, n, s, k, v);
    }
    if (!strcmp(name, "deepspeed_config_file")) /* Accelerate's questionnaire default is "none" */
        return set_string(r, n, s, k, strcasecmp(v, "none") ? v : "");
    if (!strcmp(name, "zero3_save_16bit_model")) {
        bool b;
        if (ct_bool_parse(v, &b)) return bad_value(r, n, s, k, v, "true or false");
        return set_string(r, n, s, k, b ? "true" : "false");
    }
    if (!strcmp(name, "fsdp_sharding_strategy")) {
        /* Accelerate wrote 1..4 (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD) before it wrote names */
        if (v[0] >= '1' && v[0] <= '4' && !v[1]) {
            *r->old = true;
            v = STRATEGIES[v[0] - '1'];
        }
        ct_shard_strategy x;
        if (choice_of(STRATEGIES, v) < 0 || ct_fsdp_strategy_parse(v, &x))
            return bad_value(r, n, s, k, v, "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, or 1..4");
        return set_choice(r, n, s, k, v);
    }
    return ct_error_set(CT_ERR_INTERNAL, "config: no parser for key '%s'", name);
}

static ct_status read_section(reader *r, const yaml_node_t *map, const section *s);

static ct_status read_value(reader *r, const yaml_node_t *n, const section *s, const key *k)
{
    if (k->kind == V_IGNORED) return CT_OK;
    if (k->kind == V_SECTION) {
        if (is_null(n)) return CT_OK;
        if (n->type != YAML_MAPPING_NODE)
            return ct_error_set(CT_ERR_INVALID, "%s:%d: %s: expected a mapping of %s keys, found %s", r->path,
                                line_of(n), k->name, k->name, kind_name(n));
        const bool keys = n->data.mapping.pairs.top > n->data.mapping.pairs.start;
        if (keys && !strcmp(k->name, "deepspeed_config")) r->c->has_deepspeed_config = true;
        if (keys && !strcmp(k->name, "fsdp_config")) r->c->has_fsdp_config = true;
        return read_section(r, n, k->sub);
    }
    if (n->type != YAML_SCALAR_NODE)
        return ct_error_set(CT_ERR_INVALID, "%s:%d: %s%s%s: expected a single value, found %s", r->path, line_of(n),
                            s->name, *s->name ? "." : "", k->name, kind_name(n));
    if (is_null(n)) {
        if (k->kind == V_CLIP) *(double *)((char *)r->c + k->off) = -1;
        if (!strcmp(k->name, "distributed_type"))
            return ct_error_set(CT_ERR_INVALID, "%s:%d: distributed_type is empty: expected NO, MULTI_CPU, "
                                                "MULTI_GPU, DEEPSPEED, FSDP or MEGATRON_LM", r->path, line_of(n));
        if (!strcmp(k->name, "mixed_precision")) r->c->mixed_precision[0] = 0;
        if (!strcmp(k->name, "deepspeed_config_file")) r->c->deepspeed.deepspeed_config_file[0] = 0;
        return CT_OK; /* null: the default */
    }
    const char *v = (const char *)n->data.scalar.value;
    void *dst = (char *)r->c + k->off;
    switch (k->kind) {
    case V_STR: return set_string(r, n, s, k, v);
    case V_CHOICE: return set_choice(r, n, s, k, v);
    case V_SPECIAL: return special(r, n, s, k, v);
    case V_BOOL:
        if (ct_bool_parse(v, (bool *)dst)) return bad_value(r, n, s, k, v, "true or false");
        return CT_OK;
    case V_INT:
    case V_LONG: {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < k->lo || x > k->hi) {
            char allowed[80];
            if (k->hi == LONG_MAX) snprintf(allowed, sizeof allowed, "a whole number >= %ld", k->lo);
            else snprintf(allowed, sizeof allowed, "a whole number from %ld to %ld", k->lo, k->hi);
            return bad_value(r, n, s, k, v, allowed);
        }
        if (k->kind == V_INT) *(int *)dst = (int)x;
        else *(long *)dst = x;
        return CT_OK;
    }
    case V_CLIP: {
        if (!strcasecmp(v, "none")) {
            *(double *)dst = -1;
            return CT_OK;
        }
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (!*v || *end || errno || !(x >= 0) || x > 1e300)
            return bad_value(r, n, s, k, v, "a number >= 0, or none");
        *(double *)dst = x;
        return CT_OK;
    }
    case V_IGNORED:
    case V_SECTION: break;
    }
    return CT_OK;
}

static void note_ignored(reader *r, const section *s, const char *name, const yaml_node_t *v)
{
    if (is_empty(v)) return;
    char *b = r->c->ignored;
    size_t w = strlen(b);
    snprintf(b + w, sizeof r->c->ignored - w, "%s%s%s%s", w ? ", " : "", s->name, *s->name ? "." : "", name);
}

static ct_status read_section(reader *r, const yaml_node_t *map, const section *s)
{
    int seen_line[64] = {0};
    CT_ASSERT(s->nkeys <= 64);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(r->doc, p->key), *vn = yaml_document_get_node(r->doc, p->value);
        if (kn->type != YAML_SCALAR_NODE)
            return ct_error_set(CT_ERR_INVALID, "%s:%d: %s%sa key that is %s: keys are names", r->path, line_of(kn),
                                s->name, *s->name ? ": " : "", kind_name(kn));
        const char *name = (const char *)kn->data.scalar.value;
        int i = 0;
        while (i < s->nkeys && strcmp(s->keys[i].name, name)) i++;
        if (i == s->nkeys) {
            char allowed[1200];
            list_keys(s, allowed, sizeof allowed);
            return ct_error_set(CT_ERR_INVALID, "%s:%d: unknown key '%s'%s%s (allowed%s%s: %s)", r->path,
                                line_of(kn), name, *s->name ? " in " : " at the top level", s->name,
                                *s->name ? " in " : "", s->name, allowed);
        }
        if (seen_line[i])
            return ct_error_set(CT_ERR_INVALID, "%s:%d: key '%s' given twice (first on line %d)", r->path,
                                line_of(kn), name, seen_line[i]);
        seen_line[i] = line_of(kn);
        const key *k = &s->keys[i];
        if (k->alias_of) *r->old = true;
        if (k->kind == V_IGNORED) note_ignored(r, s, name, vn);
        if (read_value(r, vn, s, k)) return ct_last_status();
    }
    /* the aliases' targets count as present; a key the writer writes and the file lacks is old */
    for (int i = 0; i < s->nkeys; i++) {
        if (!s->keys[i].written || seen_line[i]) continue;
        bool alias_seen = false;
        for (int j = 0; j < s->nkeys; j++)
            alias_seen = alias_seen || (seen_line[j] && s->keys[j].alias_of && !strcmp(s->keys[j].alias_of, s->keys[i].name));
        if (!alias_seen) *r->old = true;
    }
    return CT_OK;
}

/* A ds_config.json given where a launch configuration belongs. */
static ct_status check_not_ds_config(const reader *r, const yaml_node_t *root)
{
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(r->doc, p->key), *vn = yaml_document_get_node(r->doc, p->value);
        if (kn->type != YAML_SCALAR_NODE) continue;
        const char *name = (const char *)kn->data.scalar.value;
        /* `fp16: true` is Accelerate's old key; `fp16: {...}` is DeepSpeed's block */
        bool ds = choice_of(DS_JSON_KEYS, name) >= 0 || (!strcmp(name, "fp16") && vn->type == YAML_MAPPING_NODE);
        if (ds)
            return ct_error_set(CT_ERR_INVALID,
                                "%s:%d: '%s' is a key of a DeepSpeed ds_config.json, and this file looks like one. A "
                                "launch configuration describes the machines and processes (distributed_type, "
                                "num_processes, deepspeed_config: {zero_stage, ...}); a ds_config.json describes "
                                "the DeepSpeed engine. Pass the ds_config.json to launch with "
                                "--deepspeed_config_file FILE, or name it in a launch configuration as "
                                "deepspeed_config: {deepspeed_config_file: FILE} (ctrain config default writes one "
                                "to start from)",
                                r->path, line_of(kn), name);
    }
    return CT_OK;
}

ct_status ct_cluster_config_read(const char *path, ct_cluster_config *c, bool *old)
{
    bool old_local = false;
    if (!old) old = &old_local;
    *old = false;
    struct stat st;
    if (stat(path, &st) != 0)
        return ct_error_set(CT_ERR_IO, "config: cannot read '%s': %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return ct_error_set(CT_ERR_INVALID, "config: '%s' is a directory: expected a configuration file (YAML)", path);
    FILE *f = fopen(path, "rb");
    if (!f) return ct_error_set(CT_ERR_IO, "config: cannot open '%s': %s", path, strerror(errno));

    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return ct_error_set(CT_ERR_NOMEM, "config: '%s': libyaml could not start a parser", path);
    }
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        ct_status s = ct_error_set(CT_ERR_INVALID, "%s:%d:%d: not valid YAML: %s%s%s", path,
                                   (int)parser.problem_mark.line + 1, (int)parser.problem_mark.column + 1,
                                   parser.problem ? parser.problem : "a syntax error",
                                   parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        fclose(f);
        return s;
    }
    yaml_parser_delete(&parser);
    fclose(f);

    ct_status s = CT_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    ct_cluster_config next;
    ct_cluster_config_defaults(&next);
    /* a file sets what it names; the rest are Accelerate's defaults for a loaded file
     * (its process_config: use_cpu false, mixed_precision None: launch's own default) */
    next.use_cpu = false;
    next.mixed_precision[0] = 0;
    next.ignored[0] = 0;
    reader r = {.path = path, .doc = &doc, .c = &next, .old = old};
    if (!root || is_null(root)) {
        s = ct_error_set(CT_ERR_INVALID, "config: '%s' is empty: expected a mapping of launch settings "
                                         "(`ctrain config default` writes one)", path);
    } else if (root->type != YAML_MAPPING_NODE) {
        s = ct_error_set(CT_ERR_INVALID, "%s:%d: expected a mapping of launch settings (compute_environment: ..., "
                                         "distributed_type: ..., ...), found %s", path, line_of(root), kind_name(root));
    } else if (!(s = check_not_ds_config(&r, root)) && !(s = read_section(&r, root, &TOP_SECTION))) {
        bool has_type = false;
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
            yaml_node_t *kn = yaml_document_get_node(&doc, p->key);
            has_type = has_type || !strcmp((const char *)kn->data.scalar.value, "distributed_type");
        }
        if (!has_type)
            s = ct_error_set(CT_ERR_INVALID, "config: '%s' has no distributed_type (NO, MULTI_CPU, MULTI_GPU, "
                                             "DEEPSPEED, FSDP or MEGATRON_LM): Accelerate requires it too", path);
        /* Accelerate: `fp16: true` counts only where mixed_precision is not given */
        if (r.fp16_key && !next.mixed_precision[0]) snprintf(next.mixed_precision, 8, "fp16");
        if (!s && next.distributed_type == CT_DIST_DEEPSPEED && next.deepspeed.deepspeed_config_file[0]) {
            /* As Accelerate: with a ds_config.json the engine's settings come from it alone */
            const char *clash[] = {"zero_stage", "offload_optimizer_device", "offload_param_device",
                                   "gradient_accumulation_steps", "gradient_clipping", "zero3_save_16bit_model"};
            yaml_node_t *ds = NULL;
            for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++)
                if (!strcmp((const char *)yaml_document_get_node(&doc, p->key)->data.scalar.value, "deepspeed_config"))
                    ds = yaml_document_get_node(&doc, p->value);
            for (yaml_node_pair_t *p = ds->data.mapping.pairs.start; !s && p < ds->data.mapping.pairs.top; p++) {
                yaml_node_t *kn = yaml_document_get_node(&doc, p->key);
                for (size_t i = 0; i < sizeof clash / sizeof *clash && !s; i++)
                    if (!strcmp((const char *)kn->data.scalar.value, clash[i]) &&
                        !is_null(yaml_document_get_node(&doc, p->value)))
                        s = ct_error_set(CT_ERR_INVALID,
                                         "%s:%d: deepspeed_config.%s is given beside deepspeed_config_file: the "
                                         "ds_config.json sets the engine's settings; set it there (or remove "
                                         "deepspeed_config_file)",
                                         path, line_of(kn), clash[i]);
            }
        }
    }
    yaml_document_delete(&doc);
    if (!s) *c = next;
    return s;
}

/* ---- the combination ---------------------------------------------------------------- */

int ct_gpu_ids_count(const char *v)
{
    int n = 1;
    for (; *v; v++) n += *v == ',';
    return n;
}

ct_status ct_cluster_config_check(const ct_cluster_config *c)
{
    if (strcmp(c->compute_environment, "LOCAL_MACHINE"))
        return ct_error_set(CT_ERR_INVALID, "config: compute_environment '%s': expected LOCAL_MACHINE",
                            c->compute_environment);
    if (c->num_machines < 1 || c->num_processes < 1)
        return ct_error_set(CT_ERR_INVALID, "config: num_machines %d and num_processes %d must be at least 1",
                            c->num_machines, c->num_processes);
    if (c->num_processes % c->num_machines)
        return ct_error_set(CT_ERR_INVALID,
                            "config: num_processes %d is not a multiple of num_machines %d (each machine runs "
                            "num_processes / num_machines processes)",
                            c->num_processes, c->num_machines);
    if (c->machine_rank < 0 || c->machine_rank >= c->num_machines)
        return ct_error_set(CT_ERR_INVALID, "config: machine_rank %d is out of range for num_machines %d (0 to %d)",
                            c->machine_rank, c->num_machines, c->num_machines - 1);
    if (c->distributed_type == CT_DIST_NO && c->num_processes > 1)
        return ct_error_set(CT_ERR_INVALID,
                            "config: distributed_type NO runs one process, but num_processes is %d: use MULTI_CPU "
                            "or MULTI_GPU (or DEEPSPEED, FSDP) for several",
                            c->num_processes);
    if (c->distributed_type == CT_DIST_MULTI_GPU && c->use_cpu)
        return ct_error_set(CT_ERR_INVALID, "config: distributed_type MULTI_GPU with use_cpu true: use MULTI_CPU to "
                                            "run several processes on CPUs");
    if (c->main_process_port == 0 && c->num_machines > 1)
        return ct_error_set(CT_ERR_INVALID, "config: main_process_port 0 (a free port) works only with num_machines "
                                            "1: the other machines could not learn the port");
    if (c->num_machines > 1 && !c->main_process_ip[0])
        return ct_error_set(CT_ERR_INVALID, "config: num_machines %d needs main_process_ip (the address of machine 0)",
                            c->num_machines);
    if (c->gpu_ids[0] && !ct_gpu_ids_valid(c->gpu_ids))
        return ct_error_set(CT_ERR_INVALID, "config: gpu_ids '%s': expected all, or GPU indices separated by commas",
                            c->gpu_ids);
    if (c->gpu_ids[0] && strcmp(c->gpu_ids, "all") && !c->use_cpu && c->num_machines == 1 &&
        ct_gpu_ids_count(c->gpu_ids) < c->num_processes)
        return ct_error_set(CT_ERR_INVALID, "config: gpu_ids '%s' names %d GPU(s) for num_processes %d: one GPU per "
                                            "process on this machine",
                            c->gpu_ids, ct_gpu_ids_count(c->gpu_ids), c->num_processes);
    if (c->mixed_precision[0] && choice_of(PRECISIONS, c->mixed_precision) < 0)
        return ct_error_set(CT_ERR_INVALID, "config: mixed_precision '%s': expected no, fp16, bf16 or fp8",
                            c->mixed_precision);
    if (c->distributed_type == CT_DIST_DEEPSPEED && !c->deepspeed.deepspeed_config_file[0]) {
        const char *od = c->deepspeed.offload_optimizer_device, *pd = c->deepspeed.offload_param_device;
        if (c->deepspeed.zero_stage < 0 || c->deepspeed.zero_stage > 3)
            return ct_error_set(CT_ERR_INVALID, "config: deepspeed_config.zero_stage %d: expected 0, 1, 2 or 3",
                                c->deepspeed.zero_stage);
        if (!strcmp(pd, "cpu") && c->deepspeed.zero_stage != 3)
            return ct_error_set(CT_ERR_INVALID, "config: deepspeed_config.offload_param_device cpu needs zero_stage 3 "
                                                "(zero_stage is %d)", c->deepspeed.zero_stage);
        if (!strcmp(od, "cpu") && c->deepspeed.zero_stage == 0)
            return ct_error_set(CT_ERR_INVALID, "config: deepspeed_config.offload_optimizer_device cpu needs "
                                                "zero_stage 1, 2 or 3 (zero_stage is 0)");
    }
    if (c->distributed_type == CT_DIST_FSDP) {
        if (!strcmp(c->fsdp.auto_wrap_policy, "TRANSFORMER_BASED_WRAP") && !c->fsdp.transformer_layer_cls_to_wrap[0])
            return ct_error_set(CT_ERR_INVALID,
                                "config: fsdp_config.fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP needs "
                                "fsdp_transformer_layer_cls_to_wrap (the module types to wrap; the GPT's is Block)");
        if (c->fsdp.offload_params && !strcmp(c->fsdp.sharding_strategy, "NO_SHARD"))
            return ct_error_set(CT_ERR_INVALID, "config: fsdp_config.fsdp_offload_params true needs a sharded "
                                                "fsdp_sharding_strategy (NO_SHARD replicates everything)");
    }
    return CT_OK;
}
