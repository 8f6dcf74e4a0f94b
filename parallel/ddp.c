/* ctrain — DDP (parallel/ddp.h): buckets filled from grad-ready hooks, reduced on the
 * comm thread while backward continues. */
#include "parallel/ddp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "autograd/autograd.h"
#include "parallel/module_sync_internal.h"
#include "core/frame.h"

typedef struct bucket {
    int first, n;       /* params [first, first + n) of ddp.order */
    int64_t numel;
    ct_tensor *flat;    /* numel elements of the parameters' dtype, owned */
    ct_tensor *wire;    /* the compressed copy, or NULL */
    int pending;        /* parameters of this round not yet copied in */
    ct_work *work;      /* in flight, or NULL */
    double t_submit;
} bucket;

typedef struct hook_ctx {
    ct_ddp *d;
    int i; /* index into order */
} hook_ctx;

struct ct_ddp {
    ct_pg *pg;    /* own: a sub-group of every rank of the group given (see ct_ddp_new) */
    ct_pg *world; /* the group given (borrowed): the last bucket's */
    ct_ddp_config cfg;
    int np;
    ct_tensor **order;  /* parameters in reverse registration order, retained */
    int *bucket_of;     /* per order index */
    int64_t *offset;    /* element offset in its bucket */
    bool *ready;        /* copied in this round */
    hook_ctx *ctx;
    bucket *b;
    int nb;
    bool sync;
    bool round;         /* a synchronised backward has started filling buckets */
    int next_submit;    /* buckets [0, next_submit) are submitted this round */
    double inline_s;    /* this round: the training thread's time inside submits that
                         * reduced directly (the shm direct allreduce) */
    ct_ddp_stats stats;
};

static double now_s(void) { return (double)uv_hrtime() * 1e-9; }

/* A (numel) view of param i's slot in its bucket, shaped like the parameter. */
static ct_tensor *slot_view(ct_ddp *d, int i)
{
    const ct_tensor *p = d->order[i];
    ct_tensor *flat = d->b[d->bucket_of[i]].flat;
    return ct_tensor_view(ct_tensor_narrow(flat, 0, d->offset[i], ct_tensor_numel(p)), p->ndim, p->shape);
}

static ct_status submit(ct_ddp *d, int k)
{
    bucket *b = &d->b[k];
    ct_status st = CT_OK;
    if (b->wire && (st = ct_tensor_copy_(b->wire, b->flat))) return ct_error_prefix("ddp: bucket %d: ", k);
    b->t_submit = now_s();
    /* The last bucket fills when backward is over, and ct_ddp_finish waits for it at
     * once: nothing is left to overlap, so it goes on the group given, where (with
     * shm) this thread reduces it directly inside the submit, several times faster
     * than the comm thread. The others overlap with backward on the sub-group. */
    ct_pg *g = k == d->nb - 1 ? d->world : d->pg;
    b->work = ct_pg_allreduce(g, b->wire ? b->wire : b->flat, CT_REDUCE_MEAN);
    if (!b->work) return ct_error_prefix("ddp: bucket %d (%lld elements): ", k, (long long)b->numel);
    /* a work complete on return was reduced by this thread inside the submit: all
     * of that time was communication the training thread waited for */
    bool done = false;
    (void)ct_work_test(b->work, &done); /* its status is reported at the wait */
    if (done) d->inline_s += now_s() - b->t_submit;
    return CT_OK;
}

/* Submits the full buckets at the head of the queue, in bucket order. */
static ct_status submit_ready(ct_ddp *d)
{
    while (d->next_submit < d->nb && d->b[d->next_submit].pending == 0) {
        ct_status st = submit(d, d->next_submit);
        if (st) return st;
        d->next_submit++;
    }
    return CT_OK;
}

/* Waits for every bucket in flight and forgets the round (results unused). */
static ct_status drain(ct_ddp *d)
{
    ct_status first = CT_OK;
    for (int k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        if (!b->work) continue;
        ct_status st = ct_work_wait(b->work);
        if (st && !first) first = st;
        ct_work_free(b->work);
        b->work = NULL;
    }
    return first;
}

static void reset_round(ct_ddp *d)
{
    for (int k = 0; k < d->nb; k++) d->b[k].pending = d->b[k].n;
    memset(d->ready, 0, (size_t)d->np * sizeof *d->ready);
    d->round = false;
    d->next_submit = 0;
    d->inline_s = 0;
}

static ct_status copy_in(ct_ddp *d, int i, const ct_tensor *g)
{
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *v = slot_view(d, i);
        if (!v) st = ct_last_status();
        else if (g) st = ct_tensor_copy_(v, g);
        else st = ct_tensor_fill_(v, 0.0);
    }
    return st;
}

static ct_status on_grad_ready(ct_tensor *leaf, void *data)
{
    hook_ctx *c = data;
    ct_ddp *d = c->d;
    if (!d->sync) return CT_OK;
    if (d->ready[c->i]) {
        /* a second synchronised backward before ct_ddp_finish: the reductions in
         * flight hold stale sums (.grad now has both passes); start over */
        ct_status st = drain(d);
        reset_round(d);
        if (st) return st;
    }
    d->round = true;
    ct_status st = copy_in(d, c->i, leaf->grad);
    if (st) return ct_error_prefix("ddp: gradient of parameter %d: ", c->i);
    d->ready[c->i] = true;
    d->b[d->bucket_of[c->i]].pending--;
    return submit_ready(d);
}

/* Every rank must wrap the same parameter list: (count, elements) compared through
 * the group with one MAX allreduce of (n, numel, -n, -numel). */
static ct_status check_same_model(ct_ddp *d, int64_t numel)
{
    ct_status st = CT_OK;
    CT_FRAME {
        int64_t v[4] = {d->np, numel, -(int64_t)d->np, -numel};
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(4), v);
        ct_work *w = t ? ct_pg_allreduce(d->pg, t, CT_REDUCE_MAX) : NULL;
        st = w ? ct_work_wait(w) : ct_last_status();
        ct_work_free(w);
        if (!st) {
            const int64_t *r = ct_tensor_data(t);
            if (r[0] != -r[2] || r[1] != -r[3])
                st = ct_error_set(CT_ERR_INVALID,
                                  "ddp: the ranks wrap different models: %lld to %lld parameters, %lld to %lld "
                                  "elements across the group (rank %d has %d parameters, %lld elements)",
                                  (long long)-r[2], (long long)r[0], (long long)-r[3], (long long)r[1],
                                  ct_pg_rank(d->pg), d->np, (long long)numel);
        }
    }
    return st;
}

static ct_status broadcast_all(ct_ddp *d, ct_module *model)
{
    ct_param_list all = {0};
    ct_status st = ct_module_named_tensors(model, true, &all);
    if (!st) st = cti_dist_broadcast_tensors(d->pg, &all, 0, "ddp");
    ct_param_list_free(&all);
    return st;
}

static ct_status build_buckets(ct_ddp *d)
{
    const double mib = 1024.0 * 1024.0;
    double cap_first = (d->cfg.first_bucket_cap_mb > 0 ? d->cfg.first_bucket_cap_mb : 1.0) * mib;
    double cap = (d->cfg.bucket_cap_mb > 0 ? d->cfg.bucket_cap_mb : 25.0) * mib;
    d->b = calloc((size_t)(d->np ? d->np : 1), sizeof *d->b);
    if (!d->b) return ct_error_set(CT_ERR_NOMEM, "ddp: out of memory");
    for (int i = 0; i < d->np; i++) {
        const ct_tensor *p = d->order[i];
        double bytes = (double)ct_tensor_nbytes(p);
        bucket *cur = d->nb ? &d->b[d->nb - 1] : NULL;
        double limit = d->nb == 1 ? cap_first : cap;
        bool fits = cur && d->order[cur->first]->dtype == p->dtype &&
                    (double)(cur->numel * (int64_t)ct_dtype_size(p->dtype)) + bytes <= limit;
        if (!fits) cur = &d->b[d->nb++], cur->first = i;
        d->bucket_of[i] = d->nb - 1;
        d->offset[i] = cur->numel;
        cur->numel += ct_tensor_numel(p);
        cur->n++;
    }
    for (int k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        ct_dtype dt = d->order[b->first]->dtype;
        b->flat = ct_tensor_retain(ct_tensor_zeros(dt, CT_SHAPE(b->numel)));
        if (!b->flat) return ct_last_status();
        if (d->cfg.compress && d->cfg.compress != dt) {
            b->wire = ct_tensor_retain(ct_tensor_zeros(d->cfg.compress, CT_SHAPE(b->numel)));
            if (!b->wire) return ct_last_status();
        }
        b->pending = b->n;
    }
    return CT_OK;
}

ct_ddp *ct_ddp_new(ct_pg *pg, ct_module *model, const ct_ddp_config *cfg)
{
    if (!pg || !model) {
        ct_error_set(CT_ERR_INVALID, "ddp_new: %s is NULL", !pg ? "process group" : "model");
        return NULL;
    }
    ct_ddp_config c = cfg ? *cfg : (ct_ddp_config){0};
    if (c.compress && c.compress != CT_DTYPE_BF16 && c.compress != CT_DTYPE_F16 && c.compress != CT_DTYPE_F32) {
        ct_error_set(CT_ERR_INVALID, "ddp_new: compress = %s; allowed: bf16, f16 (or none)", ct_dtype_name(c.compress));
        return NULL;
    }
    if (c.bucket_cap_mb < 0 || c.first_bucket_cap_mb < 0 || !isfinite(c.bucket_cap_mb) ||
        !isfinite(c.first_bucket_cap_mb)) {
        ct_error_set(CT_ERR_INVALID, "ddp_new: bucket_cap_mb = %g, first_bucket_cap_mb = %g; need finite values >= 0 "
                     "(0 = default 25 and 1)", c.bucket_cap_mb, c.first_bucket_cap_mb);
        return NULL;
    }
    ct_ddp *d = calloc(1, sizeof *d);
    if (!d) {
        ct_error_set(CT_ERR_NOMEM, "ddp_new: out of memory");
        return NULL;
    }
    /* A sub-group of the same ranks runs every collective on the comm thread (the
     * world group's allreduce may run directly, inside the submit: dist/pg.h), so the
     * buckets reduce while backward goes on. */
    int n = ct_pg_size(pg), *all = malloc((size_t)n * sizeof *all);
    for (int i = 0; all && i < n; i++) all[i] = i;
    d->world = pg;
    d->pg = all ? ct_pg_new_subgroup(pg, all, n) : NULL;
    free(all);
    if (!d->pg) {
        if (!all) ct_error_set(CT_ERR_NOMEM, "ddp_new: out of memory");
        ct_error_prefix("ddp_new: ");
        free(d);
        return NULL;
    }
    d->cfg = c;
    d->sync = true;
    ct_param_list params = {0};
    ct_status st = ct_module_named_tensors(model, false, &params);
    int64_t numel = 0;
    if (!st) {
        d->order = calloc((size_t)(params.n ? params.n : 1), sizeof *d->order);
        d->bucket_of = calloc((size_t)(params.n ? params.n : 1), sizeof *d->bucket_of);
        d->offset = calloc((size_t)(params.n ? params.n : 1), sizeof *d->offset);
        d->ready = calloc((size_t)(params.n ? params.n : 1), sizeof *d->ready);
        d->ctx = calloc((size_t)(params.n ? params.n : 1), sizeof *d->ctx);
        if (!d->order || !d->bucket_of || !d->offset || !d->ready || !d->ctx)
            st = ct_error_set(CT_ERR_NOMEM, "ddp_new: out of memory");
    }
    for (int i = params.n - 1; i >= 0 && !st; i--) {
        ct_tensor *p = params.tensors[i];
        if (!p->requires_grad) continue;
        if (p->device.type != CT_DEVICE_CPU) {
            char dev[32];
            st = ct_error_set(CT_ERR_UNSUPPORTED, "ddp_new: %s is on %s; DDP runs on CPU tensors in this build",
                              params.names[i], ct_device_str(p->device, dev, sizeof dev));
            break;
        }
        d->order[d->np++] = ct_tensor_retain(p);
        numel += ct_tensor_numel(p);
    }
    ct_param_list_free(&params);
    if (!st) st = check_same_model(d, numel);
    if (!st && !c.no_broadcast) st = broadcast_all(d, model);
    CT_FRAME {
        if (!st) st = build_buckets(d);
    }
    for (int i = 0; i < d->np && !st; i++) {
        d->ctx[i] = (hook_ctx){d, i};
        st = ct_tensor_on_grad_ready(d->order[i], on_grad_ready, &d->ctx[i]);
    }
    if (st) {
        ct_error_prefix("%s", strncmp(ct_last_error(), "ddp", 3) ? "ddp_new: " : "");
        ct_ddp_free(d);
        return NULL;
    }
    d->stats.buckets = d->nb;
    for (int k = 0; k < d->nb; k++)
        d->stats.bytes += (int64_t)ct_tensor_nbytes(d->b[k].wire ? d->b[k].wire : d->b[k].flat);
    return d;
}

void ct_ddp_set_sync(ct_ddp *d, bool sync)
{
    if (d) d->sync = sync;
}

bool ct_ddp_sync(const ct_ddp *d) { return d && d->sync; }

ct_status ct_ddp_finish(ct_ddp *d)
{
    if (!d) return ct_error_set(CT_ERR_INVALID, "ddp_finish: handle is NULL");
    if (!d->round) return CT_OK;
    ct_status st = CT_OK;
    /* parameters this backward did not reach: whatever .grad holds (earlier no_sync
     * micro-steps), else zero, on this rank */
    for (int i = 0; i < d->np && !st; i++) {
        if (d->ready[i]) continue;
        st = copy_in(d, i, d->order[i]->grad);
        d->ready[i] = true;
        d->b[d->bucket_of[i]].pending--;
    }
    if (!st) st = submit_ready(d);
    /* comm = the time the engine had reductions in flight: the union of the
     * buckets' [submitted, completed] intervals (they run in submission order) */
    double t0 = now_s(), comm = 0, busy_until = 0;
    for (int k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        if (!b->work) continue;
        ct_status ws = ct_work_wait(b->work);
        if (ws && !st) st = ws;
        double te = ct_work_end_time(b->work);
        if (te <= 0) te = now_s();
        double from = b->t_submit > busy_until ? b->t_submit : busy_until;
        if (te > from) comm += te - from;
        if (te > busy_until) busy_until = te;
        ct_work_free(b->work);
        b->work = NULL;
        if (!st && b->wire) st = ct_tensor_copy_(b->flat, b->wire);
    }
    for (int i = 0; i < d->np && !st; i++) {
        ct_tensor *p = d->order[i];
        if (!p->grad) {
            ct_tensor *g = ct_tensor_empty_on(p->device, p->dtype, p->ndim, p->shape);
            if (!g) {
                st = ct_last_status();
                break;
            }
            p->grad = ct_tensor_retain(g);
        }
        CT_FRAME {
            ct_tensor *v = slot_view(d, i);
            st = v ? ct_tensor_copy_(p->grad, v) : ct_last_status();
        }
    }
    if (!st) {
        /* blocked here while reductions ran, or inside a submit that reduced
         * directly: the part backward did not hide */
        double exposed = fmin(d->inline_s + (busy_until > t0 ? busy_until - t0 : 0), comm);
        d->stats.steps++;
        d->stats.comm_s = comm;
        d->stats.exposed_s = exposed;
        d->stats.total_comm_s += comm;
        d->stats.total_exposed_s += exposed;
    }
    reset_round(d);
    return st ? (strncmp(ct_last_error(), "ddp", 3) ? ct_error_prefix("ddp_finish: ") : st) : CT_OK;
}

ct_ddp_stats ct_ddp_stats_get(const ct_ddp *d) { return d ? d->stats : (ct_ddp_stats){0}; }

void ct_ddp_free(ct_ddp *d)
{
    if (!d) return;
    if (d->b) (void)drain(d);
    for (int i = 0; i < d->np; i++) {
        ct_tensor_clear_grad_hooks(d->order[i]);
        ct_tensor_release(d->order[i]);
    }
    for (int k = 0; k < d->nb; k++) {
        ct_tensor_release(d->b[k].flat);
        ct_tensor_release(d->b[k].wire);
    }
    free(d->b);
    free(d->order);
    free(d->bucket_of);
    free(d->offset);
    free(d->ready);
    free(d->ctx);
    ct_pg_free(d->pg);
    free(d);
}
