/* ctrain — the sharding settings as users know them from Accelerate: a DeepSpeed
 * plugin (or a DeepSpeed ds_config.json), an FSDP plugin, or the same settings from
 * `ctrain launch` flags, turned into the sharding engine's configuration
 * (parallel/shard.h).
 *
 *   DeepSpeed                        the engine
 *   zero_stage 0                     NO_SHARD (DDP)
 *   zero_stage 1 / 2 / 3             OPTIMIZER / GRAD_OP / FULL, no_wrap (one unit)
 *   bf16 / fp16 (mixed precision)    param_dtype bf16 / f16: 16-bit parameters beside
 *                                    f32 masters, as DeepSpeed keeps them
 *   offload_optimizer_device cpu     offload_optimizer
 *   offload_param_device cpu         offload_optimizer too (stage 3 only; the
 *                                    parameters' master copy lives with the optimizer)
 *   gradient_clipping > 0            the Accelerator clips to it before every step
 *   gradient_accumulation_steps      the Accelerator's
 *   config_file                      a ds_config.json (accel/ds_config.h): its
 *                                    zero_optimization, fp16, bf16, batch sizes,
 *                                    gradient_accumulation_steps, gradient_clipping and
 *                                    communication_data_type (reduce_dtype); given in it
 *                                    (absent or "auto": the engine's defaults):
 *     reduce_bucket_size             size_based_wrap, min_num_params of it (the units
 *                                    are the buckets gradients are reduced in)
 *     allgather_bucket_size          allgather_bucket
 *     stage3_prefetch_bucket_size    prefetch_bucket (0: no prefetch)
 *     stage3_param_persistence_threshold   persistence_threshold
 *     overlap_comm false             no_overlap_comm
 *
 *   FSDP                             the engine
 *   sharding_strategy FULL_SHARD (1), SHARD_GRAD_OP (2), NO_SHARD (3), HYBRID_SHARD (4)
 *                                    FULL, GRAD_OP, NO_SHARD (DDP), HYBRID
 *   auto_wrap_policy NO_WRAP, TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP   wrap.policy
 *   transformer_cls_names_to_wrap    wrap.classes (comma-separated module types)
 *   min_num_params                   wrap.min_num_params
 *   cpu_offload                      offload_optimizer
 *   backward_prefetch BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH
 *   forward_prefetch, reshard_after_forward, sync_module_states
 *   state_dict_type FULL_STATE_DICT, SHARDED_STATE_DICT
 *   param_dtype fp32, bf16, fp16     param_dtype (NULL: bf16/fp16 under that mixed precision,
 *                                    bf16 under fp8, as Accelerate's FSDP policy)
 *   reduce_dtype fp32, bf16, fp16    reduce_dtype (NULL: param_dtype)
 *
 * Names are matched without regard to case. The launcher passes its flags as
 * CTRAIN_* variables (docs/launch.md): CTRAIN_USE_DEEPSPEED=1 with CTRAIN_ZERO_STAGE,
 * CTRAIN_OFFLOAD_OPTIMIZER_DEVICE, CTRAIN_OFFLOAD_PARAM_DEVICE,
 * CTRAIN_DEEPSPEED_CONFIG_FILE, CTRAIN_GRADIENT_CLIPPING; CTRAIN_USE_FSDP=1 with
 * CTRAIN_FSDP_SHARDING_STRATEGY, CTRAIN_FSDP_AUTO_WRAP_POLICY,
 * CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP, CTRAIN_FSDP_MIN_NUM_PARAMS,
 * CTRAIN_FSDP_OFFLOAD_PARAMS, CTRAIN_FSDP_BACKWARD_PREFETCH,
 * CTRAIN_FSDP_FORWARD_PREFETCH, CTRAIN_FSDP_RESHARD_AFTER_FORWARD,
 * CTRAIN_FSDP_STATE_DICT_TYPE, CTRAIN_FSDP_SYNC_MODULE_STATES (true/false, 1/0).
 *
 *   Megatron-LM                      the Accelerator (docs/strategies.md, "Megatron-LM
 *                                    through the Accelerator")
 *   tp_degree                        tensor-parallel ranks: a mesh world = pp x dp x tp
 *                                    (parallel/mesh.h), the model sharded over tp
 *   pp_degree                        pipeline stages: the model's layers cut into stages
 *                                    (parallel/pipeline_model.h), the 1F1B schedule run
 *                                    by the model's loss function (accel/megatron_pp.c)
 *   num_micro_batches                micro-batches per batch (pp_degree > 1 only; it
 *                                    must divide the batch size)
 *   sequence_parallelism             activations split along the sequence over tp
 *   use_distributed_optimizer        the optimizer state sharded over dp (ZeRO-1; a
 *                                    DeepSpeed or FSDP strategy beside it replaces it);
 *                                    under a pipeline, each stage's over its dp ranks
 *   with a DeepSpeed or FSDP plugin  that strategy over the data-parallel axis instead of
 *   (or their launcher flags)        DDP: the engine over the mesh's dp group
 *                                    (accel/megatron_zero.c); SHARDED_STATE_DICT is refused
 *                                    with tp_degree or pp_degree > 1 (checkpoints hold the
 *                                    whole model). Under a pipeline each stage's engine
 *                                    shards that stage over its dp ranks, reducing once
 *                                    per step (accel/megatron_pp.c)
 *   gradient_clipping > 0            clip the global norm over every axis before each step
 *
 * From the launcher (--use_megatron_lm): CTRAIN_USE_MEGATRON_LM=1 with
 * CTRAIN_MEGATRON_TP_DEGREE, CTRAIN_MEGATRON_PP_DEGREE, CTRAIN_MEGATRON_NUM_MICRO_BATCHES,
 * CTRAIN_MEGATRON_SEQUENCE_PARALLELISM, CTRAIN_MEGATRON_USE_DISTRIBUTED_OPTIMIZER
 * (true/false) and CTRAIN_MEGATRON_GRADIENT_CLIPPING.
 */
#ifndef CT_ACCEL_PLUGINS_H
#define CT_ACCEL_PLUGINS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "accel/ds_config.h"
#include "core/error.h"
#include "parallel/shard.h"
#include "precision/loss_scaler.h"

/* A setting whose default is on: zero (DEFAULT) takes the default. */
typedef enum ct_flag { CT_FLAG_DEFAULT, CT_FLAG_ON, CT_FLAG_OFF } ct_flag;

typedef struct ct_deepspeed_plugin {
    int zero_stage;                       /* 0 (replicated), 1, 2, 3 */
    const char *offload_optimizer_device; /* "none" (NULL) or "cpu" */
    const char *offload_param_device;     /* "none" (NULL) or "cpu"; stage 3 only */
    int gradient_accumulation_steps;      /* 0: the Accelerator's */
    double gradient_clipping;             /* > 0: clip the global norm to it before each step */
    const char *config_file;              /* a ds_config.json; the fields above must then be
                                           * left unset or agree with it */
} ct_deepspeed_plugin;

typedef struct ct_fsdp_plugin {
    const char *sharding_strategy;  /* FULL_SHARD (NULL), SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, or 1..4 */
    const char *auto_wrap_policy;   /* NO_WRAP (NULL), TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP */
    const char *transformer_cls_names_to_wrap; /* e.g. "Block"; several: "Block,MLP" */
    int64_t min_num_params;         /* SIZE_BASED_WRAP: 0 = 100000000 (FSDP's default) */
    bool cpu_offload;
    const char *backward_prefetch;  /* BACKWARD_PRE (NULL), BACKWARD_POST, NO_PREFETCH */
    bool forward_prefetch;
    ct_flag reshard_after_forward;  /* default on */
    const char *state_dict_type;    /* FULL_STATE_DICT (NULL) or SHARDED_STATE_DICT */
    ct_flag sync_module_states;     /* default on: rank 0's parameters on every rank */
    const char *param_dtype;        /* the parameters the model computes with: "fp32", "bf16" or
                                     * "fp16" beside f32 masters (MixedPrecision.param_dtype);
                                     * NULL: the Accelerator's mixed precision */
    const char *reduce_dtype;       /* the gradients' reduction: "fp32", "bf16" or "fp16"
                                     * (MixedPrecision.reduce_dtype); NULL: param_dtype's */
} ct_fsdp_plugin;

#define CT_SHARDING_MAX_CLASSES 16

/* What the Accelerator takes from a plugin, a ds_config or the launcher. */
typedef struct ct_sharding_settings {
    const char *source;          /* "deepspeed_plugin", "ds_config 'x.json'", "fsdp_plugin",
                                  * "ctrain launch --use_fsdp", ... for messages (static or in buf) */
    ct_shard_config shard;       /* strategy NO_SHARD: replicated */
    int gradient_accumulation_steps; /* 0: not set */
    double gradient_clipping;    /* 0: none */
    const char *mixed_precision; /* from a ds_config's fp16/bf16 blocks; NULL: not set */
    bool scaler_set;             /* a ds_config's fp16 block sets the loss scaler */
    ct_loss_scaler_config scaler;
    bool sharded_state_dict;     /* SHARDED_STATE_DICT */
    bool has_ds;                 /* a ds_config was read: prepare checks its batch sizes */
    ct_ds_config ds;
    char ds_path[512];
    char names[512];             /* storage of shard.wrap.classes */
    const char *classes[CT_SHARDING_MAX_CLASSES];
    char source_buf[600];
} ct_sharding_settings;

/* Megatron-LM's settings, with the names of Accelerate's MegatronLMPlugin. Zero means
 * default for every field. */
typedef struct ct_megatron_lm_plugin {
    int tp_degree;                  /* tensor-parallel degree; 0 = 1 */
    int pp_degree;                  /* pipeline stages; 0 = 1 */
    int num_micro_batches;          /* 0 = 1; pipelines only */
    bool sequence_parallelism;      /* needs tp_degree > 1 */
    bool use_distributed_optimizer; /* the optimizer state sharded over the data-parallel axis
                                     * (ZeRO-1 over the mesh's dp group) */
    double gradient_clipping;       /* > 0: clip to it before every step; 0 none */
} ct_megatron_lm_plugin;

/* The launcher's Megatron-LM settings: *on is set when CTRAIN_USE_MEGATRON_LM is true,
 * and then *out holds the CTRAIN_MEGATRON_* values (unset ones zero). A bad value is
 * an error naming the variable, the value and what is allowed. */
CT_API ct_status ct_megatron_lm_plugin_from_env(bool *on, ct_megatron_lm_plugin *out);
/* Fills in the defaults (degrees and micro-batches 1) into *out and checks p: degrees
 * and micro-batches >= 1 (0 = default), gradient_clipping >= 0 and finite,
 * sequence_parallelism only with tp_degree > 1. world > 0: world_size divisible by
 * tp_degree x pp_degree. Errors name the field, the value and what is allowed. */
CT_API ct_status ct_megatron_lm_plugin_resolve(const ct_megatron_lm_plugin *p, int world, ct_megatron_lm_plugin *out);

/* The settings of one of: deepspeed (plugin, may carry a config_file), fsdp (plugin),
 * or, when both are NULL, the launcher's CTRAIN_USE_DEEPSPEED / CTRAIN_USE_FSDP
 * variables; none of them: NO_SHARD. Both plugins, or both variables, is an error.
 * Every bad value is an error naming where it came from, the value and what is
 * allowed; a ds_config's warnings (unknown keys) are printed to stderr by rank 0
 * (rank_zero). */
CT_API ct_status ct_sharding_settings_resolve(const ct_deepspeed_plugin *ds, const ct_fsdp_plugin *fsdp, bool rank_zero,
                                              ct_sharding_settings *out);

/* At prepare, with the loader's batch size known (0: no loader): the ds_config's
 * batch sizes, accumulation steps, clipping and precision against the Accelerator's
 * (ct_ds_config_resolve). CT_OK without a ds_config. */
CT_API ct_status ct_sharding_settings_check_ds(ct_sharding_settings *s, int world, int64_t micro_batch, int grad_accum,
                                               double grad_clip, const char *mixed_precision);

/* The launcher's checks of single values (the same the ranks apply). */
CT_API ct_status ct_fsdp_strategy_parse(const char *v, ct_shard_strategy *out);
CT_API ct_status ct_fsdp_wrap_policy_parse(const char *v, ct_wrap_policy *out);
CT_API ct_status ct_fsdp_backward_prefetch_parse(const char *v, ct_backward_prefetch *out);
CT_API ct_status ct_fsdp_state_dict_type_parse(const char *v, bool *sharded);
CT_API ct_status ct_offload_device_parse(const char *v, bool *cpu);
/* Parses true/false, 1/0, yes/no, on/off into *out; CT_ERR_INVALID for anything else. */
CT_API ct_status ct_bool_parse(const char *v, bool *out); /* true/false, 1/0, yes/no, on/off */

#endif
