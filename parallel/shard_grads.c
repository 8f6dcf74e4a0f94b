/* ctrain — the sharding engine's gradients: grad-ready hooks, reduce-scatters in a
 * fixed order, finish, the all-gather after the step, clipping (see parallel/shard.h). */
#include "parallel/shard_internal.h"

#include <math.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "optim/clip.h"

/* The dtype gradients are reduced in. */
static ct_dtype reduce_dtype(const ct_shard *s, const shard_unit *u)
{
    if (s->low) return cti_shard_grad_dtype(s, u);
    return s->cfg.reduce_dtype ? s->cfg.reduce_dtype : u->flat->dtype;
}

/* The unit's gradients of this step in one padded buffer: the persistent one
 * (OPTIMIZER; a parameter whose .grad is not its view, because zero_grad dropped it,
 * is copied in and its view restored, or zeroed when it has none), else a new buffer
 * the parameters' gradients are copied into and then dropped; under reduce_dtype a
 * 16-bit copy of it. */

static ct_tensor *pack(ct_shard *s, shard_unit *u)
{
    ct_tensor *flat = u->flat_grad;
    const bool persistent = flat != NULL;
    if (!persistent) {
        flat = ct_tensor_empty_on(u->flat->device, u->flat->dtype, 1, (const int64_t[]){u->plan->padded});
        if (!flat || ct_tensor_fill_(flat, 0)) return NULL;
    }
    for (int k = 0; k < u->plan->nparams; k++) {
        const ct_shard_param *sp = &u->plan->params[k];
        ct_tensor *p = sp->param;
        if (persistent && p->grad && p->grad->storage == flat->storage) continue;
        ct_tensor *region = ct_tensor_from_storage(flat->storage, flat->dtype, p->ndim, p->shape, NULL,
                                                   flat->offset + sp->offset);
        if (!region) return NULL;
        if (p->grad ? ct_tensor_copy_(region, p->grad) : persistent ? ct_tensor_fill_(region, 0) : CT_OK) return NULL;
        if (persistent && p->requires_grad) {
            if (ct_tensor_set_grad(p, region)) return NULL;
        } else if (!persistent) {
            ct_tensor_zero_grad(p);
        }
    }
    return reduce_dtype(s, u) == flat->dtype ? flat : ct_tensor_cast(flat, reduce_dtype(s, u));
}

static ct_status submit_reduce(ct_shard *s, shard_unit *u)
{
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *in = pack(s, u);
    if (in && !u->grad_shard) { /* offloaded: the step's reduced slice, until finish moves it */
        ct_tensor *g = ct_tensor_empty_on(in->device, cti_shard_grad_dtype(s, u), 1, (const int64_t[]){u->plan->shard});
        if (g) u->grad_shard = ct_tensor_retain(g);
        else in = NULL;
    }
    ct_tensor *out = u->grad_shard;
    if (in && in->dtype != out->dtype) { /* reduce_dtype: reduced in 16 bits, widened in finish */
        ct_tensor *low = ct_tensor_empty_on(in->device, in->dtype, 1, (const int64_t[]){u->plan->shard});
        if (low) out = u->reduced_low = ct_tensor_retain(low);
        else in = NULL;
    }
    /* the packed buffer is ours to give up (ZeRO-1's persistent one is zeroed after) */
    ct_work *w = in ? ct_pg_reduce_scatter_consume(s->reduce_pg, out, in, CT_REDUCE_MEAN) : NULL;
    if (!w) st = ct_error_prefix("shard: reducing unit '%s' (rank %d): ", cti_shard_unit_label(u), s->rank);
    else {
        u->reduce = (shard_op){.work = w, .keep = in == u->flat_grad ? NULL : ct_tensor_retain(in),
                               .t_submit = cti_shard_now()};
        cti_shard_count_sent(s, u->plan->padded * (int64_t)ct_dtype_size(in->dtype), s->sworld, 1);
    }
    ct_frame_pop();
    return st;
}

#define MAX_REDUCES_IN_FLIGHT 2

static int reduces_in_flight(const ct_shard *s)
{
    int n = 0;
    for (int i = 0; i < s->plan.nunits; i++) n += s->units[i].reduce.work != NULL;
    return n;
}

/* Retires submitted reduce-scatters oldest first, stopping at the first still
 * running unless more than max are in flight (then it waits for it): a retired
 * one's packed input is freed, and under HYBRID its slice's all-reduce over the
 * replicas starts at once. Oldest first keeps those all-reduces in the same order
 * on every rank. */
static ct_status retire(ct_shard *s, int max)
{
    for (int k = 0; k < s->next_reduce; k++) {
        shard_unit *u = &s->units[s->reduce_order[k]];
        if (!u->reduce.work) continue;
        if (reduces_in_flight(s) <= max) {
            bool done = false;
            if (!ct_work_test(u->reduce.work, &done) && !done) break;
        }
        ct_status st = cti_shard_op_wait(s, &u->reduce);
        if (st) return st;
        if (s->replica_pg) {
            ct_tensor *g = u->reduced_low ? u->reduced_low : u->grad_shard;
            ct_work *w = ct_pg_allreduce(s->replica_pg, g, CT_REDUCE_MEAN);
            if (!w) return ct_last_status();
            u->replica = (shard_op){.work = w, .t_submit = cti_shard_now()};
            cti_shard_count_sent(s, ct_tensor_numel(g) * (int64_t)ct_dtype_size(g->dtype), s->replicas, 2);
        }
    }
    return CT_OK;
}

/* Submits the reductions of the units that are ready, in reduce_order: a unit whose
 * turn has not come waits for the ones before it, so every rank issues the same
 * collectives in the same order. At most two are in flight, so at most two units'
 * packed gradients are alive beside backward's own. */
static ct_status submit_ready(ct_shard *s)
{
    ct_status st = CT_OK;
    while (!st && s->next_reduce < s->plan.nunits) {
        shard_unit *u = &s->units[s->reduce_order[s->next_reduce]];
        if (!u->grads_ready) break;
        st = retire(s, MAX_REDUCES_IN_FLIGHT - 1);
        if (st) break;
        s->next_reduce++;
        st = submit_reduce(s, u);
        /* overlap_comm off: the reduction is waited for before backward goes on */
        if (!st && s->cfg.no_overlap_comm) st = retire(s, 0);
    }
    return st ? st : retire(s, MAX_REDUCES_IN_FLIGHT);
}

static void unit_done(ct_shard *s, shard_unit *u)
{
    u->grads_ready = true;
    /* every node that used the unit's parameters has run (their gradients are final) */
    if (u->nreq == u->plan->nparams) cti_shard_reshard(s, u);
}

static ct_status grad_ready(ct_tensor *leaf, void *data)
{
    (void)leaf;
    shard_unit *u = data;
    ct_shard *s = u->engine;
    /* the counts start afresh in every backward, whether or not the units' module
     * forwards ran (layers may be called directly, parameters used in plain ops): the
     * first hook of a new backward resets every unit, so that none is taken for
     * ready on the strength of the previous backward */
    const uint64_t pass = ct_backward_pass();
    if (s->pass != pass) {
        s->pass = pass;
        for (int i = 0; i < s->plan.nunits; i++) {
            s->units[i].pending = s->units[i].nreq;
            s->units[i].grads_ready = false;
        }
    }
    s->pass_open = true;
    if (--u->pending > 0) return CT_OK;
    unit_done(s, u);
    if (s->cfg.backward_prefetch == CT_PREFETCH_BACKWARD_POST) cti_shard_prefetch_previous(s, u);
    return s->sync ? submit_ready(s) : CT_OK;
}

ct_status cti_shard_grad_hooks_install(ct_shard *s)
{
    for (int i = 0; i < s->plan.nunits; i++)
        for (int k = 0; k < s->plan.units[i].nparams; k++) {
            ct_tensor *p = s->plan.units[i].params[k].param;
            if (!p->requires_grad) continue;
            ct_status st = ct_tensor_on_grad_ready(p, grad_ready, &s->units[i]);
            if (st) return st;
        }
    return CT_OK;
}

void cti_shard_grad_hooks_remove(ct_shard *s)
{
    for (int i = 0; s->units && i < s->plan.nunits; i++)
        for (int k = 0; k < s->plan.units[i].nparams; k++) ct_tensor_clear_grad_hooks(s->plan.units[i].params[k].param);
}

void ct_shard_set_sync(ct_shard *s, bool sync)
{
    if (s) s->sync = sync;
}

/* ---- finish ------------------------------------------------------------------------ */

static ct_status point_slices(ct_shard *s)
{
    for (int i = 0; i < s->nslices; i++) {
        if (s->slice_unit[i] < 0) continue;
        const shard_unit *u = &s->units[s->slice_unit[i]];
        const ct_tensor *g = u->master_grad ? u->master_grad : u->grad_shard;
        ct_tensor *v = ct_tensor_from_storage(g->storage, g->dtype, 1, s->slices[i]->shape, NULL,
                                              g->offset + s->slice_offset[i]);
        ct_status st = v ? ct_tensor_set_grad(s->slices[i], v) : ct_last_status();
        if (st) return st;
    }
    return CT_OK;
}

ct_status ct_shard_finish(ct_shard *s)
{
    if (!s) return ct_error_set(CT_ERR_INVALID, "shard_finish: engine is NULL");
    if (s->detached)
        return ct_error_set(CT_ERR_INVALID, "shard_finish (rank %d): the model was unwrapped (its parameters are "
                                            "plain again); it no longer trains sharded", s->rank);
    if (!s->sync || !s->pass_open) return CT_OK;
    ct_status st = CT_OK;
    ct_frame_push();
    /* units whose parameters took no part count as zero gradients, on every rank */
    for (int i = 0; i < s->plan.nunits; i++)
        if (!s->units[i].grads_ready) unit_done(s, &s->units[i]);
    st = submit_ready(s);
    if (!st) st = retire(s, 0);
    /* HYBRID: the same slice's mean over the shard groups */
    for (int i = 0; i < s->plan.nunits; i++) {
        ct_status w = cti_shard_op_wait(s, &s->units[i].reduce);
        ct_status r = cti_shard_op_wait(s, &s->units[i].replica);
        if (!st) st = w ? w : r;
    }
    /* reduce_dtype: the 16-bit reduced slices widen into the f32 ones */
    for (int i = 0; i < s->plan.nunits && !st; i++) {
        shard_unit *u = &s->units[i];
        if (!u->reduced_low) continue;
        st = ct_tensor_copy_(u->grad_shard, u->reduced_low);
        ct_tensor_release(u->reduced_low);
        u->reduced_low = NULL;
    }
    /* the reduced gradients go to the masters' side, in f32: CPU offload keeps a buffer
     * for them there (and lets the compute side's go), param_dtype makes one for this
     * step (freed after it) */
    for (int i = 0; i < s->plan.nunits && !st; i++) {
        shard_unit *u = &s->units[i];
        if (!u->master || !u->grad_shard) continue;
        if (!u->master_grad) {
            ct_tensor *g = ct_tensor_empty_on(u->master->device, CT_DTYPE_F32, 1, (const int64_t[]){u->plan->shard});
            if (!g) {
                st = ct_last_status();
                break;
            }
            u->master_grad = ct_tensor_retain(g);
        }
        st = ct_tensor_copy_(u->master_grad, u->grad_shard);
        if (s->cfg.offload_optimizer) {
            ct_tensor_release(u->grad_shard);
            u->grad_shard = NULL;
        }
    }
    /* ZeRO-1's full buffers start the next step from zero */
    for (int i = 0; i < s->plan.nunits && !st; i++)
        if (s->units[i].flat_grad) st = ct_tensor_fill_(s->units[i].flat_grad, 0);
    if (!st) st = point_slices(s);
    /* prefetches nobody used, and units kept from their forward, are freed */
    for (int i = 0; i < s->plan.nunits; i++) {
        ct_status w = cti_shard_gather_land(s, &s->units[i]);
        cti_shard_reshard(s, &s->units[i]);
        if (!st) st = w;
    }
    ct_frame_pop();
    s->next_reduce = 0;
    s->order_known = true;
    s->pass_open = false;
    return st ? ct_error_prefix("shard_finish (rank %d): ", s->rank) : CT_OK;
}

ct_status ct_shard_after_step(ct_shard *s)
{
    if (!s) return ct_error_set(CT_ERR_INVALID, "shard_after_step: engine is NULL");
    if (s->detached)
        return ct_error_set(CT_ERR_INVALID, "shard_after_step (rank %d): the model was unwrapped; it no longer "
                                            "trains sharded", s->rank);
    ct_status st = CT_OK;
    /* FULL/HYBRID with a master (CPU offload, param_dtype): the updated masters into
     * the compute slices, which the next forward gathers from */
    if (s->free_params)
        for (int i = 0; i < s->plan.nunits && !st; i++)
            if (s->units[i].master) st = ct_tensor_copy_(s->units[i].shard, s->units[i].master);
    /* each rank's updated slice (its master, rounded, when there is one) into
     * everyone's full parameters, for every unit that keeps them; under OPTIMIZER and
     * GRAD_OP the slice is a view of the output, so it travels from a copy, each copy
     * overlapping the previous unit's all-gather. allgather_bucket bounds the elements
     * in flight; without overlap_comm each gather is waited for at once. */
    ct_frame_push();
    int64_t inflight = 0;
    int oldest = 0;
    for (int i = 0; i < s->plan.nunits && !st; i++) {
        shard_unit *u = &s->units[i];
        if (!cti_shard_keeps_full(s, u)) continue;
        for (; oldest < i && inflight && s->cfg.allgather_bucket && inflight + u->plan->padded > s->cfg.allgather_bucket;
             oldest++) {
            if (!s->units[oldest].gather.work) continue;
            inflight -= s->units[oldest].plan->padded;
            st = cti_shard_gather_land(s, &s->units[oldest]);
            if (st) break;
        }
        if (st) break;
        ct_tensor *in = !u->master ? ct_tensor_clone(u->shard)
                        : u->master->dtype == u->flat->dtype ? u->master
                                                             : ct_tensor_cast(u->master, u->flat->dtype);
        ct_work *w = in ? ct_pg_allgather(s->gather_pg, u->flat, in) : NULL;
        if (!w) st = ct_last_status();
        else u->gather = (shard_op){.work = w, .keep = ct_tensor_retain(in), .t_submit = cti_shard_now()};
        inflight += u->plan->padded;
        s->run_gathers++;
        cti_shard_count_sent(s, u->plan->padded * (int64_t)ct_dtype_size(u->flat->dtype), s->sworld, 1);
        if (!st && s->cfg.no_overlap_comm) {
            st = cti_shard_gather_land(s, u);
            inflight -= u->plan->padded;
        }
    }
    for (int i = 0; i < s->plan.nunits; i++) {
        if (!cti_shard_keeps_full(s, &s->units[i])) continue;
        ct_status w = cti_shard_gather_land(s, &s->units[i]);
        if (!st) st = w;
    }
    ct_frame_pop();
    /* param_dtype without offload: the step's f32 gradients go, with the slices' views */
    if (s->low && !s->cfg.offload_optimizer) {
        for (int i = 0; i < s->plan.nunits; i++) {
            ct_tensor_release(s->units[i].master_grad);
            s->units[i].master_grad = NULL;
        }
        for (int i = 0; i < s->nslices; i++) ct_tensor_zero_grad(s->slices[i]);
    }
    cti_shard_step_done(s);
    return st ? ct_error_prefix("shard_after_step (rank %d): ", s->rank) : CT_OK;
}

/* ---- clipping ------------------------------------------------------------------------ */

double ct_shard_clip_grad_norm(ct_shard *s, double max_norm, double norm_type)
{
    if (!s || !s->slices) {
        ct_error_set(CT_ERR_INVALID, "shard_clip_grad_norm: %s", !s ? "engine is NULL" : "no optimizer prepared");
        return NAN;
    }
    if (!(max_norm >= 0)) {
        ct_error_set(CT_ERR_INVALID, "shard_clip_grad_norm: max_norm = %g; expected >= 0", max_norm);
        return NAN;
    }
    double partial = ct_grad_norm_partial(s->nslices, s->slices, norm_type);
    if (isnan(partial) && ct_last_status()) return NAN;
    /* the slices of the shard group tile the model once (replicas hold equal copies) */
    double total = NAN;
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1), &partial);
        ct_work *w = t ? ct_pg_allreduce(s->reduce_pg, t, isinf(norm_type) ? CT_REDUCE_MAX : CT_REDUCE_SUM) : NULL;
        ct_status st = ct_work_run(w);
        if (!st) total = ct_grad_norm_from_partial(*(const double *)ct_tensor_data(t), norm_type);
        else ct_error_prefix("shard_clip_grad_norm (rank %d): ", s->rank);
    }
    if (isnan(total) && ct_last_status()) return NAN;
    if (ct_grad_scale(s->nslices, s->slices, ct_clip_coef(total, max_norm))) return NAN;
    return total;
}
