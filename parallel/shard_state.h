/* ctrain — the sharding engine's state as parts: what each rank holds of each
 * parameter, for sharded checkpoints (SHARDED_STATE_DICT), without gathering.
 */
#ifndef CT_PARALLEL_SHARD_STATE_H
#define CT_PARALLEL_SHARD_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "parallel/shard.h"

/* This rank's part of one parameter (SHARDED_STATE_DICT): elements [begin, end) of
 * the flattened parameter, and their values (1-d, end - begin elements, f32: the
 * master's values when there is one). */
typedef struct ct_shard_part {
    const char *name;       /* the parameter's dotted name in the model (borrowed from the plan) */
    const ct_tensor *param; /* the parameter: its shape (borrowed) */
    ct_dtype dtype;         /* the full parameter's dtype, as ct_shard_gather_full gives it:
                             * the master copy's where there is one, else the parameter's */
    int64_t begin, end;
    ct_tensor *values;      /* owned by the current frame */
} ct_shard_part;

/* The parts this rank holds, one per parameter its slices reach (in plan order; a
 * tied weight once), into *parts (malloc'd, the caller frees it; the values live in
 * the current frame). The shard group's ranks together hold every element once;
 * under HYBRID each group holds them all, and *writer is true only on the first
 * group's ranks, so that one copy is written. Local: no collective. */
CT_API ct_status ct_shard_local_parts(const ct_shard *s, ct_shard_part **parts, int *n, bool *writer);

/* Where ct_shard_load_params reads parameters from: a checkpoint as its caller knows
 * it (one full file, or the parts of a sharded one written with any world size). */
typedef struct ct_shard_source {
    /* The shape of parameter name in the checkpoint into *ndim and shape (room for
     * CT_MAX_DIMS); false when the checkpoint has no such parameter. */
    bool (*shape)(void *ctx, const char *name, int *ndim, int64_t *shape);
    /* Elements [begin, end) of the flattened parameter name into dst (1-d, end - begin
     * elements, f32, contiguous). A status + error naming the file on failure. */
    ct_status (*read)(void *ctx, const char *name, int64_t begin, int64_t end, ct_tensor *dst);
    void *ctx;
} ct_shard_source;

/* Writes every parameter of the engine's plan from src into this rank's state: for
 * each unit, elements [r*shard, (r+1)*shard) of its flat layout (r this rank's place
 * in its shard group) into the master slice (CPU offload, 16-bit parameters) and the compute slice
 * (converted to its dtype), and each parameter whole into the unit's full buffer
 * where one is kept (OPTIMIZER, GRAD_OP, a shard group of one) or the unit is
 * gathered now; the optimizer's slices, views of these, see the new values. Every
 * parameter's shape is checked before anything is read, and everything is read
 * before anything is written: a missing parameter or a wrong shape (the error names
 * it and both shapes) leaves the engine as it was. Local: no collective (collectives
 * in flight are waited for first); every rank of the job loads its own part. The
 * optimizer's state is not touched. After ct_shard_gather_full under 16-bit
 * parameters, the model goes back to its 16-bit copies (written here); after
 * ct_shard_detach, the plain parameters are written whole. */
CT_API ct_status ct_shard_load_params(ct_shard *s, const ct_shard_source *src);

#endif
