/* ctrain — the sharding engine (parallel/shard.h) over the data-parallel axis of a
 * model sharded for tensor parallelism (accel/megatron.c): ZeRO-1/2/3, FSDP's
 * strategies and Megatron's distributed optimizer at tp x dp.
 *
 * Every tp rank's model has the same structure and the same local shapes (the heads,
 * the MLP width and the padded vocabulary split evenly), so the engine's plan over
 * mesh->dp_group is the same on every tp rank: slice i of the optimizer holds
 * elements [b, e) of the same flattened local parameter on each tp rank of one dp
 * index. That is what the steps below rely on.
 *
 *   reduction     the engine reduce-scatters (mean) the local gradients over dp,
 *                 during backward under ZeRO-2/3;
 *   tp sync       sequence parallelism leaves the replicated parameters' gradients as
 *                 partial sums over the sequence chunks: instead of the full
 *                 gradients (gone under ZeRO-2/3), the reduced slices of those
 *                 parameters are summed over tp. Both are linear maps on the same
 *                 elements (sum over tp of the mean over dp = mean over dp of the
 *                 sum over tp), so the order gives the same gradients up to rounding;
 *   clip          sum over the slices of |g|^p, the tp-sharded parameters' on every
 *                 rank, the replicated ones' on tp rank 0 only (the tp ranks hold the
 *                 same values), and under HYBRID only on the first shard group (the
 *                 other groups hold copies); summed (max for INFINITY) over the world.
 *
 * Under a pipeline (accel/megatron_pp.c; every strategy) each stage's engine holds that stage's parameters (ct_shard_config.params) and is
 * synchronised once per step: the micro-batches accumulate full gradients, the tied
 * and tp sums run on them, then the reduce-scatter over dp. The tp sync of the slices
 * above is then not needed, and the clip counts the tied embedding on its stage (the
 * first) only.
 *
 * Checkpoints stay whole-model files (accel/megatron_checkpoint.c): a moment slice is
 * put back into the local parameter's shape by a sum over dp of each rank's part
 * (zeros elsewhere, exact), then gathered over tp as without the engine.
 */
#include "accel/accelerator_internal.h"
#include "accel/megatron_checkpoint_internal.h"
#include "accel/megatron_zero_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "dist/env.h"
#include "dist/work.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "optim/clip.h"
#include "parallel/shard_state.h"

ct_status cti_accel_megatron_zero_settings(ct_accelerator *a, const char *source)
{
    if (a->sharding.sharded_state_dict && (a->mlm.tp_degree > 1 || a->mlm.pp_degree > 1))
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "accelerator: Megatron-LM (%s, tp_degree %d, pp_degree %d) with %s's SHARDED_STATE_DICT "
                            "is not supported: checkpoints under tensor and pipeline parallelism hold the whole "
                            "model; use FULL_STATE_DICT",
                            source, a->mlm.tp_degree, a->mlm.pp_degree,
                            a->sharding.source ? a->sharding.source : "the sharding");
    /* Megatron's distributed optimizer is ZeRO-1 over the data-parallel axis; a
     * sharding strategy given beside it shards at least as much */
    if (a->mlm.use_distributed_optimizer && a->cfg.shard.strategy == CT_SHARD_NO_SHARD)
        a->cfg.shard.strategy = CT_SHARD_OPTIMIZER;
    return CT_OK;
}

ct_status cti_accel_megatron_zero_prepare(ct_accelerator *a, ct_module *model)
{
    ct_shard_config sc = a->cfg.shard;
    if (!sc.param_dtype) sc.param_dtype = a->mp;
    /* a pipeline stage shards its own parameters; the plan is the same on every dp rank
     * of the stage (they hold the same stage) */
    if (a->pp) sc.params = ct_pipeline_model_params(a->pp);
    /* HYBRID's default shard group: the data-parallel ranks of one machine (the tp
     * ranks of a dp index are neighbours, so a machine holds LOCAL_WORLD_SIZE / tp) */
    if (sc.strategy == CT_SHARD_HYBRID && !sc.shard_group_size) {
        int local = 0;
        ct_status st = ct_dist_env_int("LOCAL_WORLD_SIZE", a->mesh->world_size, 1, &local);
        if (st) return st;
        if (local % a->mesh->tp)
            return ct_error_set(CT_ERR_INVALID,
                                "HYBRID: LOCAL_WORLD_SIZE %d is not a multiple of tp %d, so no shard group of "
                                "whole machines exists over dp; set the shard group size (ranks of dp) explicitly",
                                local, a->mesh->tp);
        sc.shard_group_size = local / a->mesh->tp;
    }
    if (!(a->shard = ct_shard_new(a->mesh->dp_group, model, &sc)))
        return ct_error_prefix("%s over the data-parallel axis (dp %d): ", ct_shard_strategy_name(sc.strategy),
                               a->mesh->dp);
    return CT_OK;
}

/* What tensor parallelism does with param (one of the prepared model's): *sharded when
 * its record splits it over tp; returns true when its gradient is a partial sum over
 * tp (sequence parallelism's replicated parameters). */
static bool tp_kind(const ct_accelerator *a, const ct_tensor *param, bool *sharded)
{
    *sharded = false;
    if (!strcmp(a->model->type, "GPT")) {
        const ct_gpt_tp_shard *r = ct_gpt_tp_shard_of((const ct_gpt *)a->model, NULL, param);
        if (!r) return false;
        *sharded = r->shard.dim >= 0;
        return a->mlm.sequence_parallelism && r->partial_grad;
    }
    const ct_tp_shard *r = ct_llama_tp_shard_of((const ct_llama *)a->model, param);
    if (!r) return false;
    *sharded = r->dim >= 0;
    return a->mlm.sequence_parallelism && !*sharded;
}

ct_status cti_accel_megatron_zero_sync(ct_accelerator *a)
{
    if (!a->mlm.sequence_parallelism) return CT_OK;
    int n = 0;
    ct_tensor *const *sl = ct_shard_slices(a->shard, &n);
    ct_work **w = calloc((size_t)n + 1, sizeof *w);
    if (!w) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    ct_status st = CT_OK;
    int nw = 0;
    /* the same slices on every tp rank (same plan): each is issued before the first
     * wait, so they overlap */
    for (int i = 0; i < n && !st; i++) {
        const ct_tensor *param = NULL;
        const char *name = NULL;
        bool sharded;
        ct_tensor *g = sl[i]->grad;
        if (ct_shard_slice_part(a->shard, i, &name, &param, NULL, NULL)) st = ct_last_status();
        else if (!g || !ct_tensor_numel(g) || !tp_kind(a, param, &sharded)) continue;
        else if (!ct_tensor_is_contiguous(g))
            st = ct_error_set(CT_ERR_INTERNAL, "the gradient slice of '%s' is not contiguous", name);
        else if (!(w[nw++] = ct_pg_allreduce(a->mesh->tp_group, g, CT_REDUCE_SUM)))
            st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    }
    st = ct_work_run_all(w, nw, st);
    free(w);
    return st ? ct_error_prefix("summing the sequence-parallel gradient slices over tp %d: ", a->mesh->tp) : CT_OK;
}

double cti_accel_megatron_zero_clip(ct_accelerator *a, double max_norm, double norm_type)
{
    if (!(max_norm >= 0) || !(norm_type > 0)) {
        ct_error_set(CT_ERR_INVALID, "accelerator_clip_grad_norm: max_norm %g, norm_type %g; want max_norm >= 0 and "
                                     "norm_type > 0 or INFINITY", max_norm, norm_type);
        return NAN;
    }
    int n = 0;
    ct_tensor *const *sl = ct_shard_slices(a->shard, &n);
    ct_tensor **mine = calloc((size_t)n + 1, sizeof *mine), **all = calloc((size_t)n + 1, sizeof *all);
    int nm = 0, na = 0;
    ct_status st = mine && all ? CT_OK : ct_error_set(CT_ERR_NOMEM, "out of memory");
    /* the slices this rank counts: every one under HYBRID's first group, of which the
     * tp-replicated ones on tp rank 0 only */
    const bool writer = ct_shard_writes_parts(a->shard);
    for (int i = 0; i < n && !st; i++) {
        const ct_tensor *param = NULL;
        bool sharded;
        if (ct_shard_slice_part(a->shard, i, NULL, &param, NULL, NULL)) st = ct_last_status();
        if (st || !sl[i]->grad) continue;
        all[na++] = sl[i];
        tp_kind(a, param, &sharded);
        /* a pipeline's tied embedding once, on the stage that owns it (the first) */
        const int owner = cti_accel_megatron_pp_owner(a, param);
        if (writer && (sharded || a->mesh->tp_rank == 0) && (owner < 0 || owner == a->mesh->pp_rank))
            mine[nm++] = sl[i];
    }
    /* every rank reaches the allreduce, also after a local error (NaN then spreads) */
    if (!st) ct_error_clear(); /* a NaN with an error is bad input; without, a NaN gradient */
    double partial = st ? NAN : ct_grad_norm_partial(nm, mine, norm_type);
    bool failed = st || ct_last_status();
    double total = NAN;
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1), &partial);
        if (t && !ct_work_run(ct_pg_allreduce(a->pg, t, isinf(norm_type) ? CT_REDUCE_MAX : CT_REDUCE_SUM)))
            total = ct_grad_norm_from_partial(*(const double *)ct_tensor_data(t), norm_type);
        else
            failed = true;
    }
    if (!failed && isfinite(total) && ct_grad_scale(na, all, ct_clip_coef(total, max_norm))) failed = true;
    free(mine), free(all);
    if (failed) {
        ct_error_prefix("accelerator_clip_grad_norm (tp %d x pp %d x dp %d, %s): ", a->mesh->tp, a->mesh->pp, a->mesh->dp,
                        ct_shard_strategy_name(ct_shard_stats_get(a->shard).strategy));
        return NAN;
    }
    return total;
}

/* ---- checkpoints ---------------------------------------------------------------------- */

ct_tensor *cti_accel_megatron_zero_local(ct_accelerator *a, int i, const ct_tensor *x, const ct_tensor *param,
                                         int64_t b, int64_t e)
{
    /* each rank's part in place, zeros elsewhere, summed over dp: every element comes
     * from the one rank (of the first shard group under HYBRID) that holds it, x + 0
     * is exact */
    ct_tensor *out = ct_tensor_zeros(CT_DTYPE_F32, param->ndim, param->shape);
    ct_tensor *flat = out ? ct_tensor_view(out, 1, (const int64_t[]){ct_tensor_numel(out)}) : NULL;
    ct_status st = flat ? CT_OK : ct_last_status();
    if (!st && x && b < e && ct_shard_writes_parts(a->shard)) {
        if (ct_tensor_numel(x) != e - b)
            st = ct_error_set(CT_ERR_INTERNAL, "optimizer slice %d: a state of %lld elements for [%lld, %lld)", i,
                              (long long)ct_tensor_numel(x), (long long)b, (long long)e);
        else
            st = ct_tensor_copy_(ct_tensor_narrow(flat, 0, b, e - b),
                                 ct_tensor_view(ct_tensor_contiguous((ct_tensor *)x), 1, (const int64_t[]){e - b}));
    }
    if (!st) st = ct_work_run(ct_pg_allreduce(a->mesh->dp_group, out, CT_REDUCE_SUM));
    if (st) {
        ct_error_prefix("optimizer slice %d over dp %d: ", i, a->mesh->dp);
        return NULL;
    }
    return out;
}

int64_t cti_accel_megatron_zero_step(ct_accelerator *a, int64_t step)
{
    int64_t out = -1;
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), &step);
        if (t && !ct_work_run(ct_pg_allreduce(a->mesh->dp_group, t, CT_REDUCE_MAX)))
            out = *(const int64_t *)ct_tensor_data(t);
    }
    return out;
}

/* ct_shard_load_params' source: the local shards already sliced from the file */
typedef struct local_src {
    const ct_param_list *all;
    ct_tensor **got;
} local_src;

static int find(const local_src *s, const char *name)
{
    for (int i = 0; i < s->all->n; i++)
        if (!strcmp(s->all->names[i], name)) return i;
    return -1;
}

static bool src_shape(void *ctx, const char *name, int *ndim, int64_t *shape)
{
    const local_src *s = ctx;
    int i = find(s, name);
    if (i < 0) return false;
    *ndim = s->got[i]->ndim;
    memcpy(shape, s->got[i]->shape, (size_t)*ndim * sizeof *shape);
    return true;
}

static ct_status src_read(void *ctx, const char *name, int64_t begin, int64_t end, ct_tensor *dst)
{
    const local_src *s = ctx;
    int i = find(s, name);
    if (i < 0) return ct_error_set(CT_ERR_INTERNAL, "no '%s' among the loaded tensors", name);
    ct_tensor *flat = ct_tensor_view(ct_tensor_contiguous(s->got[i]), 1, (const int64_t[]){ct_tensor_numel(s->got[i])});
    ct_tensor *part = flat ? ct_tensor_narrow(flat, 0, begin, end - begin) : NULL;
    ct_tensor *f32 = part ? ct_tensor_cast(part, dst->dtype) : NULL;
    return f32 ? ct_tensor_copy_(dst, f32) : ct_last_status();
}

ct_status cti_accel_megatron_zero_load(ct_accelerator *a, const ct_param_list *all, ct_tensor **got)
{
    ct_param_list params = {0};
    ct_status st = ct_module_named_tensors(a->model, false, &params);
    /* the parameters through the engine (its slices, masters and gathered buffers);
     * the buffers as they are */
    local_src src = {all, got};
    if (!st) st = ct_shard_load_params(a->shard, &(ct_shard_source){src_shape, src_read, &src});
    for (int i = 0; i < all->n && !st; i++) {
        bool is_param = false;
        for (int k = 0; k < params.n && !is_param; k++) is_param = !strcmp(params.names[k], all->names[i]);
        if (!is_param && ct_tensor_copy_(all->tensors[i], got[i])) st = ct_error_prefix("'%s': ", all->names[i]);
    }
    ct_param_list_free(&params);
    return st;
}
