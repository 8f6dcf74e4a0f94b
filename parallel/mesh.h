/* ctrain — the device mesh: world = pp x dp x tp, with one process group per axis.
 *
 *     ct_mesh *m = ct_mesh_new(world, &(ct_mesh_config){ .dp = 2, .tp = 2, .pp = 2 });
 *     ... ct_column_linear_new(m->tp_group, ...), DDP over m->dp_group, stages over pp ...
 *     ct_mesh_free(m);
 *
 * Placement (Megatron's order): tensor parallelism innermost, then data, then
 * pipeline, so the ranks of one tensor-parallel group are neighbours (one host, the
 * fastest links) and a pipeline stage is a contiguous block of dp * tp ranks:
 *
 *     world rank = (pp_i * dp + dp_i) * tp + tp_i
 *
 * With hybrid sharding the data axis is split dp = dp_replicate x dp_shard with the
 * shard axis inner (dp_i = rep_i * dp_shard + shard_i), as torch's HSDP mesh
 * (replicate, shard): a shard group is dp_shard consecutive data-parallel ranks.
 *
 * Groups. Every axis gets a sub-group of the world group holding this rank and the
 * ranks that differ from it only in that axis' coordinate, ordered by that
 * coordinate (so a group's rank is the coordinate): tp_group, dp_group, pp_group,
 * dp_shard_group, dp_replicate_group. ct_mesh_new is collective over the world
 * group: every rank creates every group of every axis, in the same order, because
 * ct_pg_new_subgroup is collective over its parent (dist/pg.h). An axis of degree 1
 * still gets its one-rank group, so callers never test for NULL.
 */
#ifndef CT_PARALLEL_MESH_H
#define CT_PARALLEL_MESH_H

#include <stdint.h>

#include "core/api.h"
#include "core/error.h"
#include "dist/pg.h"

/* Zero means default for every field. */
typedef struct ct_mesh_config {
    int dp, tp, pp; /* degrees; default dp = world / (tp * pp), tp = 1, pp = 1 */
    /* Hybrid sharding: dp = dp_replicate * dp_shard. Default dp_shard = dp /
     * dp_replicate (or dp when both are 0), dp_replicate = dp / dp_shard. */
    int dp_replicate, dp_shard;
} ct_mesh_config;

typedef struct ct_mesh {
    int world_size, rank; /* in the world group */
    int dp, tp, pp, dp_replicate, dp_shard;
    /* this rank's coordinates: rank = (pp_rank * dp + dp_rank) * tp + tp_rank and
     * dp_rank = dp_replicate_rank * dp_shard + dp_shard_rank */
    int dp_rank, tp_rank, pp_rank, dp_replicate_rank, dp_shard_rank;
    /* The pipeline neighbours: world ranks of the previous and next stage with the
     * same dp and tp coordinates; -1 on the first (prev) and last (next) stage. */
    int pp_prev, pp_next;
    ct_pg *world;                                                      /* borrowed */
    ct_pg *tp_group, *dp_group, *pp_group, *dp_shard_group, *dp_replicate_group; /* owned */
} ct_mesh;

/* Checks the layout without making groups: every degree >= 1, world_size ==
 * dp * tp * pp and dp == dp_replicate * dp_shard, after filling in defaults into
 * *out (may be NULL). The error names the numbers ("mesh: world size 8 != dp 2 x
 * tp 3 x pp 1 = 6"). */
CT_API ct_status ct_mesh_layout(int world_size, const ct_mesh_config *cfg, ct_mesh_config *out);

/* The mesh over world (borrowed; it must outlive the mesh): checks the layout and
 * creates the axis groups. Collective over world; every rank passes the same cfg
 * (the group creation checks it). NULL cfg: pure data parallelism. New handle, owned
 * by the caller (ct_mesh_free); NULL with the error set. */
CT_API ct_mesh *ct_mesh_new(ct_pg *world, const ct_mesh_config *cfg);
/* Frees the axis groups and the mesh (not the world group); NULL is fine. */
CT_API void ct_mesh_free(ct_mesh *m);

/* The world rank at coordinates (dp_i, tp_i, pp_i); -1 when one is out of range. */
CT_API int ct_mesh_rank_at(const ct_mesh *m, int dp_i, int tp_i, int pp_i);

/* Checks that a model fits the layout: tp divides n_head, tp and n_kv_head (0 =
 * n_head) divide one another, and pp <= n_layer. Grouped-query attention splits the
 * key/value heads over tp when tp divides n_kv_head; when n_kv_head divides tp, each
 * rank keeps the one key/value head its query heads use, replicated over tp /
 * n_kv_head consecutive ranks (as vLLM does). The vocabulary needs no check: it is
 * padded to a multiple of tp (nn/tp_layers.h). The error names the numbers ("mesh:
 * tp 4 and n_kv_head 3: neither divides the other ..."). */
CT_API ct_status ct_mesh_check_model(const ct_mesh_config *layout, int64_t n_head, int64_t n_kv_head, int64_t n_layer);

#endif
