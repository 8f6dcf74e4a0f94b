/* ctrain — the device mesh (parallel/mesh.h). */
#include "parallel/mesh.h"

#include <stdlib.h>

/* A degree given as 0 defaults to what the others leave; the checks below name every
 * number the user gave or got by default. */
ct_status ct_mesh_layout(int world_size, const ct_mesh_config *cfg, ct_mesh_config *out)
{
    ct_mesh_config c = cfg ? *cfg : (ct_mesh_config){0};
    if (world_size < 1) return ct_error_set(CT_ERR_INVALID, "mesh: world size %d must be at least 1", world_size);
    if (c.dp < 0 || c.tp < 0 || c.pp < 0 || c.dp_replicate < 0 || c.dp_shard < 0)
        return ct_error_set(CT_ERR_INVALID,
                            "mesh: degrees must be at least 1 (0 = default): dp %d, tp %d, pp %d, "
                            "dp_replicate %d, dp_shard %d",
                            c.dp, c.tp, c.pp, c.dp_replicate, c.dp_shard);
    if (!c.tp) c.tp = 1;
    if (!c.pp) c.pp = 1;
    if (!c.dp) {
        int64_t tp_pp = (int64_t)c.tp * c.pp;
        if (world_size % tp_pp)
            return ct_error_set(CT_ERR_INVALID, "mesh: world size %d is not a multiple of tp %d x pp %d = %lld",
                                world_size, c.tp, c.pp, (long long)tp_pp);
        c.dp = (int)(world_size / tp_pp);
    }
    if ((int64_t)c.dp * c.tp * c.pp != world_size)
        return ct_error_set(CT_ERR_INVALID, "mesh: world size %d != dp %d x tp %d x pp %d = %lld", world_size, c.dp,
                            c.tp, c.pp, (long long)c.dp * c.tp * c.pp);
    if (!c.dp_replicate && !c.dp_shard) c.dp_shard = c.dp;
    if (!c.dp_shard) {
        if (c.dp % c.dp_replicate)
            return ct_error_set(CT_ERR_INVALID, "mesh: dp %d is not a multiple of dp_replicate %d", c.dp,
                                c.dp_replicate);
        c.dp_shard = c.dp / c.dp_replicate;
    }
    if (!c.dp_replicate) {
        if (c.dp % c.dp_shard)
            return ct_error_set(CT_ERR_INVALID, "mesh: dp %d is not a multiple of dp_shard %d", c.dp, c.dp_shard);
        c.dp_replicate = c.dp / c.dp_shard;
    }
    if ((int64_t)c.dp_replicate * c.dp_shard != c.dp)
        return ct_error_set(CT_ERR_INVALID, "mesh: dp %d != dp_replicate %d x dp_shard %d = %lld", c.dp,
                            c.dp_replicate, c.dp_shard, (long long)c.dp_replicate * c.dp_shard);
    if (out) *out = c;
    return CT_OK;
}

ct_status ct_mesh_check_model(const ct_mesh_config *layout, int64_t n_head, int64_t n_kv_head, int64_t n_layer)
{
    int tp = layout && layout->tp > 0 ? layout->tp : 1, pp = layout && layout->pp > 0 ? layout->pp : 1;
    if (n_kv_head <= 0) n_kv_head = n_head;
    if (n_head < 1 || n_layer < 1)
        return ct_error_set(CT_ERR_INVALID, "mesh: model with n_head %lld and n_layer %lld; want both >= 1",
                            (long long)n_head, (long long)n_layer);
    if (n_head % tp)
        return ct_error_set(CT_ERR_INVALID, "mesh: tp %d does not divide n_head %lld", tp, (long long)n_head);
    /* tp > n_kv_head: each key/value head is replicated over tp / n_kv_head ranks */
    if (n_kv_head % tp && tp % n_kv_head)
        return ct_error_set(CT_ERR_INVALID, "mesh: tp %d and n_kv_head %lld: neither divides the other (grouped-query "
                            "attention splits the key/value heads over tp or replicates each over tp / n_kv_head "
                            "ranks)", tp, (long long)n_kv_head);
    if (pp > n_layer)
        return ct_error_set(CT_ERR_INVALID, "mesh: pp %d is larger than the layer count %lld", pp, (long long)n_layer);
    return CT_OK;
}

int ct_mesh_rank_at(const ct_mesh *m, int dp_i, int tp_i, int pp_i)
{
    if (!m || dp_i < 0 || dp_i >= m->dp || tp_i < 0 || tp_i >= m->tp || pp_i < 0 || pp_i >= m->pp) return -1;
    return (pp_i * m->dp + dp_i) * m->tp + tp_i;
}

/* The axes, each as the world ranks of the group of one fixed choice of the other
 * coordinates: ranks[k] = base + k * stride for k < size. */
enum { AX_TP, AX_DP, AX_PP, AX_DP_SHARD, AX_DP_REPLICATE, AX_COUNT };
static const char *const axis_names[AX_COUNT] = {"tp", "dp", "pp", "dp_shard", "dp_replicate"};

/* Number of groups of axis a and the world ranks of group g. */
static int axis_groups(const ct_mesh *m, int a, int g, int *ranks)
{
    int tp = m->tp, dp = m->dp, pp = m->pp, sh = m->dp_shard, rep = m->dp_replicate;
    int ngroups = 0, n = 0;
    switch (a) {
    case AX_TP: /* g = pp_i * dp + dp_i */
        ngroups = pp * dp;
        for (int k = 0; ranks && k < tp; k++) ranks[n++] = g * tp + k;
        break;
    case AX_DP: /* g = pp_i * tp + tp_i */
        ngroups = pp * tp;
        for (int k = 0; ranks && k < dp; k++) ranks[n++] = ct_mesh_rank_at(m, k, g % tp, g / tp);
        break;
    case AX_PP: /* g = dp_i * tp + tp_i */
        ngroups = dp * tp;
        for (int k = 0; ranks && k < pp; k++) ranks[n++] = ct_mesh_rank_at(m, g / tp, g % tp, k);
        break;
    case AX_DP_SHARD: { /* g = (pp_i * rep + rep_i) * tp + tp_i */
        ngroups = pp * rep * tp;
        int tp_i = g % tp, rep_i = (g / tp) % rep, pp_i = g / (tp * rep);
        for (int k = 0; ranks && k < sh; k++) ranks[n++] = ct_mesh_rank_at(m, rep_i * sh + k, tp_i, pp_i);
        break;
    }
    case AX_DP_REPLICATE: { /* g = (pp_i * sh + sh_i) * tp + tp_i */
        ngroups = pp * sh * tp;
        int tp_i = g % tp, sh_i = (g / tp) % sh, pp_i = g / (tp * sh);
        for (int k = 0; ranks && k < rep; k++) ranks[n++] = ct_mesh_rank_at(m, k * sh + sh_i, tp_i, pp_i);
        break;
    }
    }
    return ngroups;
}

static ct_pg **axis_slot(ct_mesh *m, int a)
{
    switch (a) {
    case AX_TP: return &m->tp_group;
    case AX_DP: return &m->dp_group;
    case AX_PP: return &m->pp_group;
    case AX_DP_SHARD: return &m->dp_shard_group;
    default: return &m->dp_replicate_group;
    }
}

ct_mesh *ct_mesh_new(ct_pg *world, const ct_mesh_config *cfg)
{
    if (!world) {
        ct_error_set(CT_ERR_INVALID, "ct_mesh_new: NULL world group");
        return NULL;
    }
    ct_mesh_config c;
    if (ct_mesh_layout(ct_pg_size(world), cfg, &c)) return NULL;
    ct_mesh *m = calloc(1, sizeof *m);
    if (!m) {
        ct_error_set(CT_ERR_NOMEM, "ct_mesh_new: out of memory");
        return NULL;
    }
    m->world = world;
    m->world_size = ct_pg_size(world);
    m->rank = ct_pg_rank(world);
    m->dp = c.dp, m->tp = c.tp, m->pp = c.pp, m->dp_replicate = c.dp_replicate, m->dp_shard = c.dp_shard;
    m->tp_rank = m->rank % m->tp;
    m->dp_rank = (m->rank / m->tp) % m->dp;
    m->pp_rank = m->rank / (m->tp * m->dp);
    m->dp_shard_rank = m->dp_rank % m->dp_shard;
    m->dp_replicate_rank = m->dp_rank / m->dp_shard;
    m->pp_prev = ct_mesh_rank_at(m, m->dp_rank, m->tp_rank, m->pp_rank - 1);
    m->pp_next = ct_mesh_rank_at(m, m->dp_rank, m->tp_rank, m->pp_rank + 1);

    /* Every rank walks every group of every axis in the same order (collective over
     * world); only a member gets a handle back. */
    int *ranks = malloc(sizeof(int) * (size_t)m->world_size);
    if (!ranks) {
        free(m);
        ct_error_set(CT_ERR_NOMEM, "ct_mesh_new: out of memory");
        return NULL;
    }
    for (int a = 0; a < AX_COUNT; a++) {
        int ngroups = axis_groups(m, a, 0, NULL);
        for (int g = 0; g < ngroups; g++) {
            int n = 0;
            axis_groups(m, a, g, ranks);
            switch (a) {
            case AX_TP: n = m->tp; break;
            case AX_DP: n = m->dp; break;
            case AX_PP: n = m->pp; break;
            case AX_DP_SHARD: n = m->dp_shard; break;
            default: n = m->dp_replicate; break;
            }
            ct_pg *sub = ct_pg_new_subgroup(world, ranks, n);
            if (!sub && ct_last_status()) {
                ct_error_prefix("ct_mesh_new (rank %d, dp %d x tp %d x pp %d): %s group %d of %d: ", m->rank, m->dp,
                                m->tp, m->pp, axis_names[a], g, ngroups);
                free(ranks);
                ct_mesh_free(m);
                return NULL;
            }
            if (sub) *axis_slot(m, a) = sub;
        }
    }
    free(ranks);
    return m;
}

void ct_mesh_free(ct_mesh *m)
{
    if (!m) return;
    for (int a = 0; a < AX_COUNT; a++) ct_pg_free(*axis_slot(m, a));
    free(m);
}
