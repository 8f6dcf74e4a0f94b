/* ctrain — the sharding engine over the data-parallel axis of a tensor-parallel model
 * (accel/megatron_zero.c). Not installed. Every function but the settings takes the
 * Accelerator after prepare made the engine over mesh->dp_group (a->shard and
 * a->mesh both set). */
#ifndef CT_ACCEL_MEGATRON_ZERO_INTERNAL_H
#define CT_ACCEL_MEGATRON_ZERO_INTERNAL_H

#include "accel/accelerator_internal.h"

/* At ct_accelerator_new, once the Megatron-LM settings are resolved (source names
 * them for messages): use_distributed_optimizer becomes ZeRO-1 (OPTIMIZER) unless a
 * sharding strategy (other than NO_SHARD) was given; refuses what cannot compose with
 * tp (SHARDED_STATE_DICT). */
ct_status cti_accel_megatron_zero_settings(ct_accelerator *a, const char *source);
/* At prepare, after the model was sharded over tp, with dp > 1: the engine over
 * mesh->dp_group with the Accelerator's shard config (param_dtype from the mixed
 * precision as for the plain strategies; HYBRID's default shard group: the dp ranks of
 * one machine) into a->shard. Collective over dp. */
ct_status cti_accel_megatron_zero_prepare(ct_accelerator *a, ct_module *model);
/* After ct_shard_finish: sums over tp the reduced gradient slices of the parameters
 * whose gradients are partial sums under sequence parallelism. Collective over tp. */
ct_status cti_accel_megatron_zero_sync(ct_accelerator *a);
/* The global norm_type-norm over every axis of the slices' gradients, clipped to
 * max_norm. Collective over the world. NAN + error. */
double cti_accel_megatron_zero_clip(ct_accelerator *a, double max_norm, double norm_type);
/* A state x of optimizer slice i (elements [b, e) of the flattened local parameter
 * param; x may be NULL: no state here) put back into param's local shape (f32): the
 * sum over dp of every rank's part. Collective over dp, every rank calls it for every
 * slice and key. Current frame; NULL + error. */
ct_tensor *cti_accel_megatron_zero_local(ct_accelerator *a, int i, const ct_tensor *x, const ct_tensor *param,
                                         int64_t b, int64_t e);
/* The largest of step over dp (a parameter's step count: ranks whose slice misses it
 * never stepped it). Collective over dp; -1 on error. */
int64_t cti_accel_megatron_zero_step(ct_accelerator *a, int64_t step);
/* Load: all (the model's named tensors, buffers too) and got[i] each one's local
 * shard sliced from a whole checkpoint (same shape): the parameters go through the
 * engine (ct_shard_load_params), the buffers are copied. Local: no collective. */
ct_status cti_accel_megatron_zero_load(ct_accelerator *a, const ct_param_list *all, ct_tensor **got);

#endif
