/* ctrain — whole tensors and shards of a model sharded for tensor parallelism, for
 * checkpoints (accel/megatron_checkpoint.c). Not installed. Every function takes the
 * Accelerator after prepare sharded its model (a->mesh set); p is a tensor of that
 * model (a parameter or a buffer), replicated when it has no shard record. */
#ifndef CT_ACCEL_MEGATRON_CHECKPOINT_INTERNAL_H
#define CT_ACCEL_MEGATRON_CHECKPOINT_INTERNAL_H

#include "accel/accelerator_internal.h"

/* The whole (unsharded, unpadded) shape of p. */
void cti_accel_megatron_full_shape(const ct_accelerator *a, const ct_tensor *p, int *ndim, int64_t *shape);
/* The whole tensor of x, a tensor shaped and sharded like p (p itself, or one of its
 * optimizer moments): all-gathered over tp, the parts reassembled, padding dropped; a
 * copy when p is replicated. A collective over the tp group. Current frame; NULL +
 * error. */
ct_tensor *cti_accel_megatron_gather_like(ct_accelerator *a, const ct_tensor *p, ct_tensor *x);
/* This rank's shard of whole (p's whole shape; the caller checked it), as p's dtype:
 * the slicing of prepare's sharding, padding zero. No collective. Current frame. */
ct_tensor *cti_accel_megatron_slice_like(const ct_accelerator *a, const ct_tensor *p, ct_tensor *whole);
/* Under pipeline parallelism too: the whole tensor of x (shaped and sharded like p) on
 * every stage, gathered over tp on the stage that holds p and sent from there over
 * the pp group; x is ignored (may be NULL) on the other stages. *out NULL when the
 * holder has no x (an optimizer moment before the first step). Without a pipeline,
 * cti_accel_megatron_gather_like (x NULL: *out NULL). Collective over tp and pp. */
ct_status cti_accel_megatron_gather_any(ct_accelerator *a, const ct_tensor *p, ct_tensor *x, ct_tensor **out);
/* *v from the stage that holds p (every stage passes its own; no-op without a pipeline
 * or for a tensor every stage holds). Collective over pp. */
ct_status cti_accel_megatron_share_i64(ct_accelerator *a, const ct_tensor *p, int64_t *v);
/* The model's named tensors (buffers too) with each tensor replaced by its whole one
 * (current frame; the list's names owned, ct_param_list_free). A collective over tp
 * (and pp). */
ct_status cti_accel_megatron_model_tensors(ct_accelerator *a, ct_param_list *out);
/* ct_accelerator_load_model into the prepared sharded model: a whole safetensors
 * file (or a sharded model checkpoint directory), every name and whole shape checked
 * before any tensor changes; each rank takes its shard. No collective. */
ct_status cti_accel_megatron_load_model(ct_accelerator *a, const char *path);

/* The GPT's tensor-parallel dropout generators (ct_gpt_tp_dropout_rng): one per rank
 * (one stream per tp rank under sequence parallelism; each data-parallel index its
 * own), in a file of their own, "seed" and "offset" i64 [world] (row = world rank) and
 * "layout" i64 [4] = {tp, dp, sequence parallel, pp} (files with [3]: pp 1). */
#define CT_CKPT_TP_RNG "tp_dropout_rng.safetensors"
/* Every rank's generator into out[0..2] (current frame): the three tensors above, or
 * all NULL (CT_OK) when the model has no such generator (the Llama). A collective over
 * the world group: every rank calls it. */
ct_status cti_accel_megatron_rng_gather(ct_accelerator *a, ct_tensor *out[3]);
/* This rank's generator from checkpoint dir into *out, *found true; *found false (CT_OK)
 * when the model has none, the checkpoint holds none (saved without tensor parallelism),
 * or under sequence parallelism at another tp degree (the chunks, so the masks, differ):
 * or at another pp degree: *why says which for a note. Same layout: this rank's row;
 * another data-parallel degree: the stream of this tp rank at dp index 0 of its stage;
 * without sequence parallelism at another tp degree: the stage's first rank's (every tp
 * rank draws that one stream). No collective. */
ct_status cti_accel_megatron_rng_stage(const ct_accelerator *a, const char *dir, bool *found, ct_rng *out,
                                       const char **why);
/* fp8's scaling state as one process holds it (accel/megatron_pp_fp8.c): this rank's
 * exported metas (ct_fp8_state_export), or under a pipeline every stage's rows in stage
 * order (a collective over the pp group; current frame). */
ct_status cti_accel_megatron_fp8_export(ct_accelerator *a, ct_tensor *out[4]);
/* The rows [*begin, *begin + *count) of a saved fp8 state of n rows that are this
 * rank's stage's (all without a pipeline); *why set (and nothing to take) when the rows
 * do not fit the model's layers. No collective. */
ct_status cti_accel_megatron_fp8_rows(const ct_accelerator *a, int64_t n, int64_t *begin, int64_t *count,
                                      const char **why);
/* Puts a staged generator into the model. */
void cti_accel_megatron_rng_commit(ct_accelerator *a, const ct_rng *r);

#endif
