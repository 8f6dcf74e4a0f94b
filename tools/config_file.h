/* The launch configuration file: what `ctrain config` writes and `ctrain launch
 * --config_file` reads (user documentation: docs/launch.md, "Configuration files").
 *
 * The format is HuggingFace Accelerate's (its ClusterConfig): a YAML mapping of
 * compute_environment, distributed_type, mixed_precision, num_machines, machine_rank,
 * num_processes, main_process_ip, main_process_port, gpu_ids, use_cpu, ... with
 * nested deepspeed_config, fsdp_config and megatron_lm_config mappings. A file
 * Accelerate wrote (YAML, or the JSON `accelerate config default` writes) loads here,
 * and what ctrain writes loads in Accelerate.
 *
 * tools/config_file.c  the schema: the libyaml reader and the checks;
 * tools/config_write.c the libyaml writer (Accelerate's layout);
 * tools/config_launch.c what a file means to launch (ct_cluster_config_launch_args);
 * tools/config_ask.c   the terminal questionnaire that fills a ct_cluster_config;
 * tools/config_cmd.c   `ctrain config [default|show|update]`.
 *
 * These are the `ctrain` command's functions: they report failures through
 * ct_error_set / ct_last_error and never exit().
 */
#ifndef CT_TOOLS_CONFIG_FILE_H
#define CT_TOOLS_CONFIG_FILE_H

#include <stdbool.h>
#include <stdio.h>

#include "core/error.h"

/* Accelerate's distributed_type values that ctrain runs. */
typedef enum {
    CT_DIST_NO,          /* one process */
    CT_DIST_MULTI_CPU,   /* several processes on CPUs (DDP) */
    CT_DIST_MULTI_GPU,   /* several processes, one GPU each (DDP) */
    CT_DIST_DEEPSPEED,   /* ZeRO through deepspeed_config */
    CT_DIST_FSDP,        /* sharding through fsdp_config */
    CT_DIST_MEGATRON_LM, /* megatron_lm_config (tensor / pipeline parallel) */
} ct_dist_type;

/* One configuration. Strings are "" when not set; numbers use the sentinel in their
 * comment. The defaults (ct_cluster_config_defaults) are Accelerate's. */
typedef struct ct_cluster_config {
    char compute_environment[32]; /* "LOCAL_MACHINE" (the only one ctrain runs) */
    ct_dist_type distributed_type;
    char mixed_precision[8];      /* "no", "fp16", "bf16", "fp8" */
    bool use_cpu;
    int num_machines;             /* >= 1 */
    int machine_rank;             /* 0 .. num_machines-1 */
    int num_processes;            /* total across machines, >= 1 */
    char main_process_ip[256];    /* "" = 127.0.0.1 */
    int main_process_port;        /* -1 = not set (launch's default); 0 = a free port */
    char gpu_ids[256];            /* "all" or "0,1,3"; "" = not set */
    int num_cpu_threads_per_process; /* 0 = not set (launch derives it) */
    int gradient_accumulation_steps; /* 0 = not set (top level, as `accelerate launch` has it) */
    bool downcast_bf16;
    char rdzv_backend[32];        /* "static" (default) or "c10d"; ctrain's store is static */
    bool same_network;            /* multi-node: the machines share a network */
    bool debug;                   /* CTRAIN_DEBUG: collective signature checks and verbose errors */
    char main_training_function[64]; /* Accelerate's key; kept, unused by ctrain ("main") */
    bool enable_cpu_affinity;

    struct { /* fp8_config (Accelerate's FP8RecipeKwargs names) */
        char fp8_format[16];      /* "HYBRID" or "E4M3"; "" = default */
        int amax_history_len;     /* 0 = default */
        char amax_compute_algo[16]; /* "max" or "most_recent"; "" = default */
        int margin;               /* -1 = default */
    } fp8;

    struct { /* deepspeed_config, when distributed_type is DEEPSPEED */
        int zero_stage;                   /* 0..3 */
        char offload_optimizer_device[8]; /* "none" or "cpu" ("nvme" is refused) */
        char offload_param_device[8];     /* "none" or "cpu" */
        int gradient_accumulation_steps;  /* >= 1 */
        double gradient_clipping;         /* < 0 = not set ("none" in the file) */
        char deepspeed_config_file[1024]; /* a ds_config.json; "" = none */
        bool zero3_init_flag;
        char zero3_save_16bit_model[8];   /* Accelerate's key, kept; "" = not set */
    } deepspeed;

    struct { /* fsdp_config, when distributed_type is FSDP (Accelerate's fsdp_* keys) */
        char sharding_strategy[32];       /* FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD */
        bool offload_params;
        char auto_wrap_policy[32];        /* TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP; "" = not set (no wrap) */
        char transformer_layer_cls_to_wrap[256]; /* comma-separated module types */
        long min_num_params;              /* SIZE_BASED_WRAP; 0 = not set */
        char backward_prefetch[32];       /* BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH */
        char state_dict_type[32];         /* FULL_STATE_DICT, SHARDED_STATE_DICT */
        bool forward_prefetch;
        bool use_orig_params;             /* Accelerate's key, kept */
        bool sync_module_states;
        bool cpu_ram_efficient_loading;   /* Accelerate's key, kept */
        bool reshard_after_forward;       /* true unless SHARD_GRAD_OP */
        int version;                      /* fsdp_version 1 or 2; 0 = not set */
        bool activation_checkpointing;    /* Accelerate's key, kept */
    } fsdp;

    struct { /* megatron_lm_config, when distributed_type is MEGATRON_LM */
        int tp_degree, pp_degree, num_micro_batches; /* >= 1 */
        bool sequence_parallelism, use_distributed_optimizer;
        double gradient_clipping;         /* < 0 = not set */
        bool recompute_activations;
    } megatron;
    /* Set by ct_cluster_config_read: the file's deepspeed_config / fsdp_config mapping
     * has keys. With distributed_type MEGATRON_LM that strategy then shards over the
     * data-parallel axis of the tensor-parallel model (a ctrain extension; Accelerate's
     * files carry empty mappings there, which do not count). */
    bool has_deepspeed_config, has_fsdp_config;

    /* Set by ct_cluster_config_read: the keys of the file that Accelerate writes and
     * ctrain accepts without using (tpu_*, dynamo_config, ...), comma-separated, those
     * with a value other than null, false or empty. The writer does not write them. */
    char ignored[512];
} ct_cluster_config;

/* Accelerate's defaults for a one-machine, one-process, CPU (use_cpu when no GPU can
 * be used) configuration. */
void ct_cluster_config_defaults(ct_cluster_config *c);

/* Where the default file is: $CTRAIN_CONFIG_FILE, else $HOME/.cache/ctrain/default_config.yaml
 * (XDG_CACHE_HOME respected). Writes at most n bytes; CT_ERR_INVALID when there is no
 * home directory to put it in. */
ct_status ct_cluster_config_default_path(char *buf, size_t n);

/* Reads path (YAML, or JSON, which YAML includes) into *c over the defaults. Unknown
 * keys, bad values and a file that is a DeepSpeed ds_config.json rather than a launch
 * configuration are CT_ERR_INVALID naming the file, the line, the key and what is
 * allowed there. *old is set when the file uses a spelling or layout that
 * ct_cluster_config_write would write differently (what `ctrain config update` fixes);
 * old may be NULL. */
ct_status ct_cluster_config_read(const char *path, ct_cluster_config *c, bool *old);

/* gpu_ids, in a file or as launch's --gpu_ids: "all", or distinct GPU indices 0..1023
 * separated by commas (spaces around them allowed). */
bool ct_gpu_ids_valid(const char *v);
/* The indices a valid gpu_ids other than "all" names. */
int ct_gpu_ids_count(const char *v);

/* Checks the combination (num_processes a multiple of num_machines, machine_rank in
 * range, the sections that fit distributed_type, ...). CT_ERR_INVALID naming the keys. */
ct_status ct_cluster_config_check(const ct_cluster_config *c);

/* Writes *c as Accelerate-format YAML (libyaml's emitter) to path, creating its
 * folder; the file is replaced whole (written to a temporary file and renamed). */
ct_status ct_cluster_config_write(const ct_cluster_config *c, const char *path);

/* The same YAML on an open stream (for `ctrain config show`). */
ct_status ct_cluster_config_print(const ct_cluster_config *c, FILE *f);

/* The `ctrain launch` flags a configuration amounts to, in launch's spelling
 * ("--num_processes", "2", "--use_deepspeed", "--zero_stage", "3", ...): launch puts
 * them before the command line's own flags, so the command line wins. Without
 * with_sharding the strategy's flags (--use_deepspeed / --use_fsdp and theirs) are
 * left out: the command line chose a strategy of its own. MEGATRON_LM gives
 * --use_megatron_lm and the --megatron_lm_* flags of megatron_lm_config. */
#define CT_CLUSTER_LAUNCH_ARGS_MAX 64
typedef struct ct_cluster_launch_args {
    int argc;
    const char *argv[CT_CLUSTER_LAUNCH_ARGS_MAX]; /* static strings or in buf */
    char buf[4096];
    size_t used;
} ct_cluster_launch_args;
ct_status ct_cluster_config_launch_args(const ct_cluster_config *c, bool with_sharding, ct_cluster_launch_args *a);

/* distributed_type's spelling in the file ("NO", "MULTI_CPU", ...). */
const char *ct_dist_type_name(ct_dist_type t);

#endif
