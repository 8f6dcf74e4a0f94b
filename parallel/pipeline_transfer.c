/* The pipeline engine's transfers: activations (with a header) to the next stage,
 * gradients back to the previous one, over the engine's group; and what a run holds
 * per micro-batch. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "parallel/pipeline_internal.h"

double cti_pipeline_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for a receive, counting the time as waiting. */
static ct_status wait_recv(ct_pipeline *p, ct_work *w)
{
    double t0 = cti_pipeline_now();
    ct_status st = ct_work_wait(w);
    p->stats.wait_s += cti_pipeline_now() - t0;
    return st;
}

/* Waits for w (if any), frees it, clears the pointer. */
static ct_status finish(ct_work **w)
{
    if (!*w) return CT_OK;
    ct_status st = ct_work_wait(*w);
    ct_work_free(*w);
    *w = NULL;
    return st;
}

static void drop(ct_tensor **t)
{
    ct_tensor_release(*t);
    *t = NULL;
}

void cti_pipeline_expect_reset(ct_pipeline *p)
{
    p->exp_known = p->cfg.in_ndim > 0;
    p->exp_dtype = p->cfg.in_dtype;
    p->exp_ndim = p->cfg.in_ndim;
    for (int d = 0; d < p->cfg.in_ndim; d++) p->exp_shape[d] = p->cfg.in_shape[d];
}

/* A new tensor owned by the caller (not by a frame). */
static ct_tensor *owned_empty(ct_dtype dt, int ndim, const int64_t *shape)
{
    ct_tensor *t = NULL;
    CT_FRAME {
        t = ct_tensor_empty(dt, ndim, shape);
        if (t) ct_tensor_retain(t);
    }
    return t;
}

ct_status cti_pipeline_post_activation(ct_pipeline *p, int m)
{
    cti_micro_slot *s = &p->slots[m];
    if (s->hdr_recv) return CT_OK;
    int prev = p->stage - 1;
    s->hdr_in = owned_empty(CT_DTYPE_I64, 1, (const int64_t[]){CTI_PP_HDR_LEN});
    if (!s->hdr_in) return cti_pipeline_fail(p, m, "recv activation header");
    s->hdr_recv = ct_pg_recv(p->g, s->hdr_in, prev, p->cfg.tag + CTI_PP_TAG_HEADER);
    if (!s->hdr_recv) return cti_pipeline_fail(p, m, "recv activation header");
    if (!p->exp_known) return CT_OK; /* the header will say how much to receive */
    s->in = owned_empty(p->exp_dtype, p->exp_ndim, p->exp_shape);
    s->act_recv = s->in ? ct_pg_recv(p->g, s->in, prev, p->cfg.tag + CTI_PP_TAG_ACTIVATION) : NULL;
    if (!s->act_recv) return cti_pipeline_fail(p, m, "recv activation");
    return CT_OK;
}

static const char *shape_of(ct_dtype dt, int ndim, const int64_t *shape, char *buf, int cap)
{
    char sh[96];
    snprintf(buf, (size_t)cap, "%s %s", ct_dtype_name(dt), ct_shape_str(ndim, shape, sh, sizeof sh));
    return buf;
}

/* What a header says the run is: the schedule, or a forward-only evaluation. */
static int64_t run_kind(const ct_pipeline *p) { return p->eval ? CTI_PP_KIND_EVAL : (int64_t)p->cfg.schedule; }

static const char *run_kind_name(int64_t kind)
{
    return kind == CTI_PP_KIND_EVAL ? "forward-only (evaluation)" : ct_pipeline_kind_name((ct_pipeline_kind)kind);
}

/* Checks m's header against this stage's run; sets the expectation from micro-batch 0. */
static ct_status check_header(ct_pipeline *p, int m, const int64_t *h)
{
    int prev = p->stage - 1;
    if (h[CTI_PP_HDR_MAGIC] != CTI_PP_MAGIC)
        return ct_error_set(CT_ERR_FORMAT,
                            "stage %d sent a header that is not the pipeline's (is tag %d used for something else?)",
                            prev, p->cfg.tag + CTI_PP_TAG_HEADER);
    if (h[CTI_PP_HDR_M] != p->num_micro)
        return ct_error_set(CT_ERR_PEER,
                            "stage %d runs %lld micro-batches, this stage %d: every stage must be given the same number",
                            prev, (long long)h[CTI_PP_HDR_M], p->num_micro);
    if (h[CTI_PP_HDR_KIND] != run_kind(p))
        return ct_error_set(CT_ERR_PEER, "stage %d runs the %s schedule, this stage %s: every stage must run the same",
                            prev, run_kind_name(h[CTI_PP_HDR_KIND]), run_kind_name(run_kind(p)));
    if (h[CTI_PP_HDR_MICRO] != m)
        return ct_error_set(CT_ERR_PEER, "stage %d sent micro-batch %lld where %d was due", prev,
                            (long long)h[CTI_PP_HDR_MICRO], m);
    ct_dtype dt = (ct_dtype)h[CTI_PP_HDR_DTYPE];
    int ndim = (int)h[CTI_PP_HDR_NDIM];
    if (h[CTI_PP_HDR_DTYPE] < 0 || h[CTI_PP_HDR_DTYPE] >= CT_DTYPE_COUNT || ndim < 0 || ndim > CT_MAX_DIMS)
        return ct_error_set(CT_ERR_FORMAT, "stage %d sent a header with dtype %lld and %d dimensions", prev,
                            (long long)h[CTI_PP_HDR_DTYPE], ndim);
    const int64_t *shape = h + CTI_PP_HDR_SHAPE;
    char got[128], want[128];
    if (!ct_dtype_is_float(dt))
        return ct_error_set(CT_ERR_INVALID, "stage %d sent an activation of %s: activations need a float dtype", prev,
                            shape_of(dt, ndim, shape, got, sizeof got));
    if (!p->exp_known) {
        p->exp_known = true;
        p->exp_dtype = dt;
        p->exp_ndim = ndim;
        for (int d = 0; d < ndim; d++) p->exp_shape[d] = shape[d];
        return CT_OK;
    }
    bool same = dt == p->exp_dtype && ndim == p->exp_ndim;
    for (int d = 0; same && d < ndim; d++) same = shape[d] == p->exp_shape[d];
    if (same) return CT_OK;
    return ct_error_set(CT_ERR_INVALID, "stage %d sent an activation of %s, this stage expects %s (%s)", prev,
                        shape_of(dt, ndim, shape, got, sizeof got),
                        shape_of(p->exp_dtype, p->exp_ndim, p->exp_shape, want, sizeof want),
                        p->cfg.in_ndim ? "its configured in_shape" : "the shape of micro-batch 0");
}

ct_status cti_pipeline_take_activation(ct_pipeline *p, int m)
{
    cti_micro_slot *s = &p->slots[m];
    char op[64];
    snprintf(op, sizeof op, "recv activation from stage %d", p->stage - 1);
    ct_status st = cti_pipeline_post_activation(p, m);
    if (st) return st;
    if (wait_recv(p, s->hdr_recv)) return cti_pipeline_fail(p, m, op);
    if (check_header(p, m, ct_tensor_data(s->hdr_in))) return cti_pipeline_fail(p, m, op);
    if (!s->act_recv) { /* micro-batch 0 without a configured shape: now it is known */
        s->in = owned_empty(p->exp_dtype, p->exp_ndim, p->exp_shape);
        s->act_recv = s->in ? ct_pg_recv(p->g, s->in, p->stage - 1, p->cfg.tag + CTI_PP_TAG_ACTIVATION) : NULL;
        if (!s->act_recv) return cti_pipeline_fail(p, m, op);
    }
    if (wait_recv(p, s->act_recv)) return cti_pipeline_fail(p, m, op);
    ct_work_free(s->act_recv);
    s->act_recv = NULL;
    ct_work_free(s->hdr_recv);
    s->hdr_recv = NULL;
    drop(&s->hdr_in);
    p->stats.bytes_received += (int64_t)ct_tensor_nbytes(s->in);
    /* a leaf of this stage's graph: its .grad after backward is what goes back */
    if (ct_tensor_set_requires_grad(s->in, true)) return cti_pipeline_fail(p, m, op);
    return CT_OK;
}

ct_status cti_pipeline_send_activation(ct_pipeline *p, int m)
{
    cti_micro_slot *s = &p->slots[m];
    int next = p->stage + 1;
    char op[64], d[128], dev[32];
    snprintf(op, sizeof op, "send activation to stage %d", next);
    ct_tensor *y = s->out;
    if (y->device.type != CT_DEVICE_CPU || !ct_dtype_is_float(y->dtype)) {
        ct_error_set(CT_ERR_UNSUPPORTED,
                     "the forward returned %s on %s: activations between stages must be CPU tensors of a float dtype",
                     ct_tensor_describe(y, d, sizeof d), ct_device_str(y->device, dev, sizeof dev));
        return cti_pipeline_fail(p, m, op);
    }
    ct_status st = CT_OK;
    CT_FRAME {
        int64_t h[CTI_PP_HDR_LEN] = {0};
        h[CTI_PP_HDR_MAGIC] = CTI_PP_MAGIC;
        h[CTI_PP_HDR_MICRO] = m;
        h[CTI_PP_HDR_M] = p->num_micro;
        h[CTI_PP_HDR_KIND] = run_kind(p);
        h[CTI_PP_HDR_DTYPE] = y->dtype;
        h[CTI_PP_HDR_NDIM] = y->ndim;
        for (int i = 0; i < y->ndim; i++) h[CTI_PP_HDR_SHAPE + i] = y->shape[i];
        ct_tensor *hdr = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(CTI_PP_HDR_LEN), h);
        /* the sends hold their tensors until done; a strided output goes as a copy */
        ct_tensor *data = NULL;
        CT_NO_GRAD { data = ct_tensor_is_contiguous(y) ? y : ct_tensor_contiguous(y); }
        s->hdr_send = hdr ? ct_pg_send(p->g, hdr, next, p->cfg.tag + CTI_PP_TAG_HEADER) : NULL;
        s->act_send = s->hdr_send && data ? ct_pg_send(p->g, data, next, p->cfg.tag + CTI_PP_TAG_ACTIVATION) : NULL;
        if (!s->act_send) st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    }
    if (st) return cti_pipeline_fail(p, m, op);
    p->stats.bytes_sent += (int64_t)ct_tensor_nbytes(y);
    if (p->eval) return CT_OK; /* forward only: no gradient comes back */
    /* the gradient comes back the same way: its receive waits from now on */
    s->grad_in = owned_empty(y->dtype, y->ndim, y->shape);
    s->grad_recv = s->grad_in ? ct_pg_recv(p->g, s->grad_in, next, p->cfg.tag + CTI_PP_TAG_GRADIENT) : NULL;
    if (!s->grad_recv) {
        snprintf(op, sizeof op, "recv gradient from stage %d", next);
        return cti_pipeline_fail(p, m, op);
    }
    return CT_OK;
}

ct_status cti_pipeline_take_gradient(ct_pipeline *p, int m)
{
    cti_micro_slot *s = &p->slots[m];
    char op[64];
    snprintf(op, sizeof op, "recv gradient from stage %d", p->stage + 1);
    if (wait_recv(p, s->grad_recv)) return cti_pipeline_fail(p, m, op);
    ct_work_free(s->grad_recv);
    s->grad_recv = NULL;
    p->stats.bytes_received += (int64_t)ct_tensor_nbytes(s->grad_in);
    return CT_OK;
}

ct_status cti_pipeline_send_gradient(ct_pipeline *p, int m)
{
    cti_micro_slot *s = &p->slots[m];
    char op[64];
    snprintf(op, sizeof op, "send gradient to stage %d", p->stage - 1);
    ct_tensor *gx = s->in->grad;
    ct_status st = CT_OK;
    CT_FRAME {
        /* an input the stage did not use has no gradient: it is zero */
        if (!gx) gx = ct_tensor_zeros_like(s->in);
        else if (!ct_tensor_is_contiguous(gx)) gx = ct_tensor_contiguous(gx);
        s->grad_send = gx ? ct_pg_send(p->g, gx, p->stage - 1, p->cfg.tag + CTI_PP_TAG_GRADIENT) : NULL;
        if (!s->grad_send) st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
        else p->stats.bytes_sent += (int64_t)ct_tensor_nbytes(gx);
    }
    return st ? cti_pipeline_fail(p, m, op) : CT_OK;
}

/* Frees the finished sends of micro-batches before m: a gradient's buffer goes as
 * soon as its transfer is done, not at the end of the run. */
static ct_status reap_sends(ct_pipeline *p, int m)
{
    for (int i = 0; i < m; i++) {
        cti_micro_slot *s = &p->slots[i];
        if (!s->grad_send) continue;
        bool done = false;
        ct_status st = ct_work_test(s->grad_send, &done);
        if (!done) continue;
        ct_work_free(s->grad_send);
        s->grad_send = NULL;
        if (st) {
            char op[64];
            snprintf(op, sizeof op, "send gradient to stage %d", p->stage - 1);
            return cti_pipeline_fail(p, i, op);
        }
    }
    return CT_OK;
}

ct_status cti_pipeline_slot_release(ct_pipeline *p, int m)
{
    cti_micro_slot *s = &p->slots[m];
    char op[64];
    snprintf(op, sizeof op, "send activation to stage %d", p->stage + 1);
    /* the next stage sent m's gradient, so it has m's activation: these are done */
    ct_status st = finish(&s->hdr_send);
    if (!st) st = finish(&s->act_send);
    if (st) return cti_pipeline_fail(p, m, op);
    drop(&s->in);
    drop(&s->out);
    drop(&s->grad_in);
    return reap_sends(p, m);
}

ct_status cti_pipeline_sends_wait(ct_pipeline *p)
{
    char op[64];
    for (int i = 0; i < p->num_micro; i++) {
        cti_micro_slot *s = &p->slots[i];
        snprintf(op, sizeof op, "send gradient to stage %d", p->stage - 1);
        if (finish(&s->grad_send)) return cti_pipeline_fail(p, i, op);
        snprintf(op, sizeof op, "send activation to stage %d", p->stage + 1);
        if (finish(&s->hdr_send) || finish(&s->act_send)) return cti_pipeline_fail(p, i, op);
    }
    return CT_OK;
}

void cti_pipeline_slots_clear(ct_pipeline *p)
{
    if (!p->slots) return;
    for (int i = 0; i < p->num_micro; i++) {
        cti_micro_slot *s = &p->slots[i];
        ct_work *w[] = {s->hdr_recv, s->act_recv, s->grad_recv, s->hdr_send, s->act_send, s->grad_send};
        for (size_t k = 0; k < sizeof w / sizeof *w; k++) ct_work_free(w[k]);
        ct_tensor_release(s->in);
        ct_tensor_release(s->out);
        ct_tensor_release(s->hdr_in);
        ct_tensor_release(s->grad_in);
    }
    free(p->slots);
    p->slots = NULL;
    p->live = 0;
    p->live_bytes = 0;
}
