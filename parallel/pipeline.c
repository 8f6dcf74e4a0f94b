/* The pipeline engine: one rank's stage, running a GPipe or 1F1B schedule with
 * point-to-point transfers of activations (forward) and their gradients (backward).
 * See pipeline.h for the contract. */
#include "parallel/pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "parallel/pipeline_internal.h"

#define DEFAULT_TAG 0x5050

ct_pipeline *ct_pipeline_new(ct_pg *stages, int stage, ct_pipeline_forward_fn fwd, void *ctx,
                             const ct_pipeline_config *cfg)
{
    ct_pipeline_config c = cfg ? *cfg : (ct_pipeline_config){0};
    int n = stages ? ct_pg_size(stages) : 1;
    if (!fwd) {
        ct_error_set(CT_ERR_INVALID, "pipeline: no forward function for stage %d", stage);
        return NULL;
    }
    if (stages ? stage != ct_pg_rank(stages) : stage != 0) {
        ct_error_set(CT_ERR_INVALID,
                     "pipeline: stage %d given on group rank %d of %d: group rank i runs stage i (make the group "
                     "with the ranks in stage order)",
                     stage, stages ? ct_pg_rank(stages) : 0, n);
        return NULL;
    }
    if (c.schedule != CT_PIPELINE_1F1B && c.schedule != CT_PIPELINE_GPIPE) {
        ct_error_set(CT_ERR_INVALID, "pipeline: unknown schedule %d (allowed: CT_PIPELINE_1F1B, CT_PIPELINE_GPIPE)",
                     (int)c.schedule);
        return NULL;
    }
    if (c.in_ndim < 0 || c.in_ndim > CT_MAX_DIMS) {
        ct_error_set(CT_ERR_INVALID, "pipeline: in_ndim %d outside [0, %d]", c.in_ndim, CT_MAX_DIMS);
        return NULL;
    }
    for (int d = 0; d < c.in_ndim; d++)
        if (c.in_shape[d] < 0) {
            ct_error_set(CT_ERR_INVALID, "pipeline: in_shape[%d] = %lld is negative", d, (long long)c.in_shape[d]);
            return NULL;
        }
    if (c.in_ndim && !ct_dtype_is_float(c.in_dtype)) {
        ct_error_set(CT_ERR_INVALID, "pipeline: in_dtype %s: activations need a float dtype (they get gradients)",
                     ct_dtype_name(c.in_dtype));
        return NULL;
    }
    if (!c.tag) c.tag = DEFAULT_TAG;
    ct_pipeline *p = calloc(1, sizeof *p);
    if (!p) {
        ct_error_set(CT_ERR_NOMEM, "pipeline: out of memory");
        return NULL;
    }
    p->cfg = c;
    p->stage = stage;
    p->num_stages = n;
    p->fwd = fwd;
    p->ctx = ctx;
    p->grad_scale = 1.0;
    if (n > 1) {
        /* a group of the engine's own: freeing it on a failure tells the other stages
         * at once, without touching the caller's group */
        int ranks[n];
        for (int i = 0; i < n; i++) ranks[i] = i;
        p->g = ct_pg_new_subgroup(stages, ranks, n);
        if (!p->g) {
            ct_error_prefix("pipeline stage %d of %d: making its group: ", stage, n);
            free(p);
            return NULL;
        }
    }
    return p;
}

int ct_pipeline_stage(const ct_pipeline *p) { return p ? p->stage : -1; }
int ct_pipeline_num_stages(const ct_pipeline *p) { return p ? p->num_stages : 0; }
ct_pipeline_stats ct_pipeline_stats_get(const ct_pipeline *p) { return p ? p->stats : (ct_pipeline_stats){0}; }

/* ---- failure ------------------------------------------------------------------------------- */

ct_status cti_pipeline_fail(ct_pipeline *p, int micro, const char *op)
{
    ct_status st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    if (micro >= 0)
        ct_error_prefix("pipeline stage %d of %d, micro-batch %d, %s: ", p->stage, p->num_stages, micro, op);
    else
        ct_error_prefix("pipeline stage %d of %d, %s: ", p->stage, p->num_stages, op);
    return st;
}

/* Breaks the pipeline after a failure: the group goes first, so every transfer still
 * pending fails at once (here and, for those with this stage, on the peers), then the
 * run's works and tensors go. The failure's message survives the cleanup. */
static ct_status abort_run(ct_pipeline *p, ct_status st)
{
    snprintf(p->broken_msg, sizeof p->broken_msg, "%s", ct_last_error());
    p->broken = st;
    ct_pg_free(p->g);
    p->g = NULL;
    cti_pipeline_slots_clear(p);
    ct_error_set(st, "%s", p->broken_msg);
    return st;
}

/* ---- one run ---------------------------------------------------------------------------------- */

static void count_live(ct_pipeline *p, cti_micro_slot *s, int delta)
{
    p->live += delta;
    p->live_bytes += delta * s->bytes;
    if (p->live > p->stats.peak_live) p->stats.peak_live = p->live;
    if (p->live_bytes > p->stats.peak_live_bytes) p->stats.peak_live_bytes = p->live_bytes;
}

static ct_status forward_step(ct_pipeline *p, int m, ct_tensor *const *inputs)
{
    cti_micro_slot *s = &p->slots[m];
    bool last = p->stage == p->num_stages - 1;
    if (p->stage == 0) {
        s->in = ct_tensor_retain(inputs[m]);
    } else {
        ct_status st = cti_pipeline_take_activation(p, m);
        /* the next micro-batch's transfer runs while this one computes */
        if (!st && m + 1 < p->num_micro) st = cti_pipeline_post_activation(p, m + 1);
        if (st) return st;
    }
    ct_frame_push();
    ct_tensor *y = p->fwd(p->ctx, s->in, m);
    if (y) s->out = ct_tensor_retain(y);
    ct_frame_pop();
    if (!y) {
        if (!ct_last_status()) ct_error_set(CT_ERR_INTERNAL, "the forward function returned NULL without an error");
        return cti_pipeline_fail(p, m, "forward");
    }
    s->bytes = (int64_t)ct_tensor_nbytes(s->in) + (int64_t)ct_tensor_nbytes(s->out);
    if (last) {
        if (ct_tensor_numel(s->out) != 1) {
            char d[128];
            ct_error_set(CT_ERR_INVALID, "the last stage's forward must return the loss (one element), not %s",
                         ct_tensor_describe(s->out, d, sizeof d));
            return cti_pipeline_fail(p, m, "forward");
        }
        p->loss_sum += ct_tensor_item(s->out);
    } else {
        ct_status st = cti_pipeline_send_activation(p, m);
        if (st) return st;
        if (s->grad_in) s->bytes += (int64_t)ct_tensor_nbytes(s->grad_in); /* posted by the send */
    }
    count_live(p, s, +1);
    return CT_OK;
}

static ct_status backward_step(ct_pipeline *p, int m)
{
    cti_micro_slot *s = &p->slots[m];
    bool last = p->stage == p->num_stages - 1;
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *gy = NULL;
    if (last) {
        /* the mean over micro-batches: each loss enters with weight 1/M (times the
         * caller's scale: accumulation's 1/k, fp16's loss scale) */
        gy = ct_tensor_full(s->out->dtype, s->out->ndim, s->out->shape, p->grad_scale / p->num_micro);
        if (!gy) st = cti_pipeline_fail(p, m, "backward");
    } else {
        st = cti_pipeline_take_gradient(p, m);
        gy = s->grad_in;
    }
    if (!st && ct_backward_with(s->out, gy, NULL)) st = cti_pipeline_fail(p, m, "backward");
    if (!st && p->stage > 0) st = cti_pipeline_send_gradient(p, m);
    ct_frame_pop();
    if (st) return st;
    count_live(p, s, -1);
    return cti_pipeline_slot_release(p, m);
}

static ct_status check_run(ct_pipeline *p, int num_micro, ct_tensor *const *inputs)
{
    if (p->broken)
        return ct_error_set(p->broken, "pipeline stage %d of %d: broken by an earlier failure (%s); make a new one",
                            p->stage, p->num_stages, p->broken_msg);
    if (num_micro < 1)
        return ct_error_set(CT_ERR_INVALID, "pipeline stage %d of %d: %d micro-batches: at least 1 is needed", p->stage,
                            p->num_stages, num_micro);
    if (p->stage > 0) return CT_OK;
    if (!inputs)
        return ct_error_set(CT_ERR_INVALID, "pipeline stage 0 of %d: no inputs for the %d micro-batches",
                            p->num_stages, num_micro);
    for (int m = 0; m < num_micro; m++)
        if (!inputs[m])
            return ct_error_set(CT_ERR_INVALID, "pipeline stage 0 of %d: input of micro-batch %d of %d is NULL",
                                p->num_stages, m, num_micro);
    return CT_OK;
}

/* values[0..n-1] of the last stage onto every stage: a sum with zeros from the
 * others (exact), rather than a broadcast, because no rank leaves an allreduce before
 * every rank has entered it. The run ends with it, so a stage may free its handle
 * (and its group) at once without failing a peer's transfer still on its way. */
static ct_status share_from_last(ct_pipeline *p, double *values, int n)
{
    if (!p->g || n == 0) return CT_OK;
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *t = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(n));
        if (t && p->stage == p->num_stages - 1) memcpy(ct_tensor_data(t), values, (size_t)n * sizeof *values);
        st = t ? ct_work_run(ct_pg_allreduce(p->g, t, CT_REDUCE_SUM)) : ct_last_status();
        if (!st) memcpy(values, ct_tensor_data(t), (size_t)n * sizeof *values);
    }
    return st;
}

/* The mean loss from the last stage to every stage. */
static ct_status share_loss(ct_pipeline *p, double *loss)
{
    double mean = p->loss_sum / p->num_micro;
    if (share_from_last(p, &mean, 1)) return cti_pipeline_fail(p, -1, "sharing the loss of the last stage");
    if (loss) *loss = mean;
    return CT_OK;
}

/* A run: the schedule's forwards and backwards, or (eval) the M forwards alone. */
static ct_status run(ct_pipeline *p, int num_micro, ct_tensor *const *inputs, double *loss, bool eval)
{
    const double t0 = cti_pipeline_now();
    ct_status st = check_run(p, num_micro, inputs);
    if (st) return st;
    ct_pipeline_action *acts = malloc(2 * (size_t)num_micro * sizeof *acts);
    p->slots = calloc((size_t)num_micro, sizeof *p->slots);
    if (!acts || !p->slots) {
        free(acts);
        free(p->slots);
        p->slots = NULL;
        return ct_error_set(CT_ERR_NOMEM, "pipeline stage %d: out of memory for %d micro-batches", p->stage, num_micro);
    }
    p->num_micro = num_micro;
    p->eval = eval;
    p->loss_sum = 0;
    p->live = 0;
    p->live_bytes = 0;
    p->stats.peak_live = 0;
    p->stats.peak_live_bytes = 0;
    cti_pipeline_expect_reset(p);
    st = ct_pipeline_schedule(p->cfg.schedule, p->num_stages, num_micro, p->stage, acts);
    if (eval) /* the forwards in order, nothing else */
        for (int m = 0; m < num_micro; m++) acts[m] = (ct_pipeline_action){.step = CT_PIPELINE_FORWARD, .micro = m};
    if (!st && p->stage > 0) st = cti_pipeline_post_activation(p, 0);
    for (int i = 0; !st && i < (eval ? 1 : 2) * num_micro; i++)
        st = acts[i].step == CT_PIPELINE_FORWARD ? forward_step(p, acts[i].micro, inputs)
                                                 : backward_step(p, acts[i].micro);
    if (!st) st = cti_pipeline_sends_wait(p);
    if (!st) st = share_loss(p, loss);
    free(acts);
    if (st) {
        abort_run(p, st);
    } else {
        cti_pipeline_slots_clear(p);
        p->stats.runs++;
    }
    p->stats.run_s += cti_pipeline_now() - t0;
    return st;
}

ct_status ct_pipeline_run(ct_pipeline *p, int num_micro, ct_tensor *const *inputs, double *loss)
{
    if (!p) return ct_error_set(CT_ERR_INVALID, "pipeline run: NULL pipeline");
    return run(p, num_micro, inputs, loss, false);
}

ct_status ct_pipeline_eval(ct_pipeline *p, int num_micro, ct_tensor *const *inputs, double *loss)
{
    if (!p) return ct_error_set(CT_ERR_INVALID, "pipeline eval: NULL pipeline");
    ct_status st;
    CT_NO_GRAD { st = run(p, num_micro, inputs, loss, true); }
    return st;
}

ct_status ct_pipeline_set_grad_scale(ct_pipeline *p, double scale)
{
    if (!p) return ct_error_set(CT_ERR_INVALID, "pipeline grad scale: NULL pipeline");
    if (!(scale > 0) || !isfinite(scale))
        return ct_error_set(CT_ERR_INVALID, "pipeline stage %d of %d: grad scale %g must be positive and finite",
                            p->stage, p->num_stages, scale);
    p->grad_scale = scale;
    return CT_OK;
}

ct_status ct_pipeline_broadcast_metrics(ct_pipeline *p, double *values, int n)
{
    if (!p) return ct_error_set(CT_ERR_INVALID, "pipeline metrics: NULL pipeline");
    if (n < 0 || (n > 0 && !values))
        return ct_error_set(CT_ERR_INVALID, "pipeline metrics: %d values at %p", n, (void *)values);
    if (p->broken)
        return ct_error_set(p->broken, "pipeline stage %d of %d: broken by an earlier failure (%s)", p->stage,
                            p->num_stages, p->broken_msg);
    if (share_from_last(p, values, n)) return cti_pipeline_fail(p, -1, "sharing the metrics of the last stage");
    return CT_OK;
}

void ct_pipeline_free(ct_pipeline *p)
{
    if (!p) return;
    ct_pg_free(p->g); /* first: nothing still pending can then wait */
    p->g = NULL;
    cti_pipeline_slots_clear(p);
    free(p);
}
