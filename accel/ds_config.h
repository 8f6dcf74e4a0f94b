/* ctrain — DeepSpeed's ds_config.json as ctrain reads it: the sharding engine's
 * settings in DeepSpeed's words, so a config written for DeepSpeed or Accelerate
 * works unchanged.
 *
 * ct_ds_config_parse reads the JSON (cJSON) into a ct_ds_config: each key below with
 * its value checked, "auto" recorded where DeepSpeed allows it, and every key ctrain
 * does not use kept as a warning that names it. ct_ds_config_resolve then fills
 * "auto" and absent values from the Accelerator's settings and checks that they agree
 * (the batch sizes must multiply out; fp16 and bf16 must match mixed_precision).
 *
 *   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
 *       whole numbers >= 1 or "auto"; train_batch_size = micro batch x accumulation
 *       steps x world size
 *   gradient_clipping                 >= 0 or "auto" (0: no clipping)
 *   communication_data_type           "fp32", "fp16" or "bf16": the dtype gradients are
 *                                     reduced in (the engine's reduce_dtype)
 *   fp16.enabled                      true, false or "auto"
 *   fp16.loss_scale                   0 (dynamic, the default) or a fixed scale > 0
 *   fp16.initial_scale_power          0..63 (default 16: scale 65536)
 *   fp16.loss_scale_window            >= 1 clean steps before the scale doubles (1000)
 *   fp16.hysteresis                   >= 1 overflows before the scale halves (2)
 *   fp16.min_loss_scale               > 0 (1)
 *   bf16.enabled (or bfloat16.enabled) true, false or "auto"
 *   zero_optimization.stage           0, 1, 2 or 3 (default 0: replicated, as DDP)
 *   zero_optimization.offload_optimizer.device, .offload_param.device
 *                                     "none" or "cpu" (nvme is not supported); the
 *                                     parameters offload only at stage 3
 *   zero_optimization.reduce_bucket_size, .allgather_bucket_size,
 *   .stage3_prefetch_bucket_size, .stage3_param_persistence_threshold
 *                                     elements, whole numbers >= 0 (the first two
 *                                     >= 1), or "auto"
 *   zero_optimization.overlap_comm, .contiguous_gradients   true or false
 *   optimizer, scheduler              warned about: ctrain steps the optimizer and
 *                                     scheduler given to ct_accelerator_prepare
 */
#ifndef CT_ACCEL_DS_CONFIG_H
#define CT_ACCEL_DS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"

/* The values that may be "auto", in the order of ct_ds_config.from. */
typedef enum ct_ds_field {
    CT_DS_TRAIN_BATCH,
    CT_DS_MICRO_BATCH,
    CT_DS_GRAD_ACCUM,
    CT_DS_GRAD_CLIP,
    CT_DS_FP16,
    CT_DS_BF16,
    CT_DS_REDUCE_BUCKET,
    CT_DS_ALLGATHER_BUCKET,
    CT_DS_PREFETCH_BUCKET,
    CT_DS_PERSISTENCE,
    CT_DS_FIELD_COUNT
} ct_ds_field;

typedef enum ct_ds_from {
    CT_DS_ABSENT, /* not in the file: DeepSpeed's default, or the Accelerator's */
    CT_DS_GIVEN,  /* a value in the file */
    CT_DS_AUTO    /* "auto": the Accelerator's value */
} ct_ds_from;

typedef enum ct_ds_offload { CT_DS_OFFLOAD_NONE, CT_DS_OFFLOAD_CPU } ct_ds_offload;

#define CT_DS_MAX_WARNINGS 16

typedef struct ct_ds_config {
    ct_ds_from from[CT_DS_FIELD_COUNT];
    int64_t train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps;
    double gradient_clipping;
    struct {
        bool enabled;
        double loss_scale; /* 0: dynamic */
        int initial_scale_power;
        int64_t loss_scale_window;
        int hysteresis;
        double min_loss_scale;
    } fp16;
    bool bf16_enabled;
    char communication_data_type[8]; /* "fp32", "fp16", "bf16": the gradients' reduction; "" absent */
    struct {
        int stage;
        ct_ds_offload offload_optimizer, offload_param;
        int64_t reduce_bucket_size, allgather_bucket_size; /* elements */
        int64_t stage3_prefetch_bucket_size, stage3_param_persistence_threshold;
        bool overlap_comm, contiguous_gradients;
        bool overlap_comm_given;  /* overlap_comm is in the file */
    } zero;
    /* "ds_config 'NAME': unknown key 'a.b' (ignored)", ...; n_warnings counts them all,
     * the first CT_DS_MAX_WARNINGS are kept */
    int n_warnings;
    char warnings[CT_DS_MAX_WARNINGS][224];
} ct_ds_config;

/* What the Accelerator knows, for "auto" and absent values. */
typedef struct ct_ds_defaults {
    int world_size;           /* >= 1 */
    int64_t micro_batch;      /* the prepared loader's batch size; 0: not known yet */
    int64_t grad_accum;       /* the Accelerator's gradient_accumulation_steps; 0: not set */
    double grad_clip;         /* the Accelerator's clipping norm; < 0: not set */
    const char *mixed_precision; /* "no", "fp16", "bf16", "fp8", or NULL: not set */
    int64_t hidden_size;      /* the model's width, for "auto" bucket sizes; 0: unknown */
} ct_ds_defaults;

/* DeepSpeed's defaults, everything absent. */
CT_API void ct_ds_config_init(ct_ds_config *c);

/* Parses len bytes of JSON text; name (a file name) goes into every message. On error
 * *c is left as ct_ds_config_init made it and the message names the key, the value
 * and what is allowed (or the line and column of a JSON syntax error). */
CT_API ct_status ct_ds_config_parse(const char *text, size_t len, const char *name, ct_ds_config *c);

/* Reads and parses the file at path. */
CT_API ct_status ct_ds_config_load(const char *path, ct_ds_config *c);

/* Fills "auto" and absent values from d and checks the whole: the three batch
 * sizes multiply out (two given determine the third, which must then be a whole
 * number), the file's values agree with what the Accelerator set explicitly
 * (accumulation steps, clipping, mixed precision), fp16 and bf16 are not both on. */
CT_API ct_status ct_ds_config_resolve(ct_ds_config *c, const char *name, const ct_ds_defaults *d);

#endif
