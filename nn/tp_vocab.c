/* ctrain — the vocabulary-parallel embedding and cross-entropy (nn/tp_layers.h). */
#include <math.h>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "nn/tp_internal.h"
#include "nn/tp_layers.h"
#include "nn/tp_ops.h"

int64_t ct_tp_vocab_padded(int64_t vocab, int n, int64_t multiple)
{
    if (vocab < 1 || n < 1) {
        ct_error_set(CT_ERR_INVALID, "tp_vocab_padded: vocabulary %lld over %d ranks; want both >= 1",
                     (long long)vocab, n);
        return -1;
    }
    int64_t step = (multiple > 0 ? multiple : 1) * n;
    return (vocab + step - 1) / step * step;
}

/* ---- embedding -------------------------------------------------------------------- */

ct_vocab_embedding *ct_vocab_embedding_new(ct_pg *g, const ct_tensor *weight, const ct_vocab_embedding_config *cfg)
{
    const char *op = "vocab_embedding_new";
    char a[160];
    if (cti_tp_check_group(op, g)) return NULL;
    if (!weight || weight->ndim != 2 || !ct_dtype_is_float(weight->dtype)) {
        ct_error_set(CT_ERR_INVALID, "%s: weight %s; want a 2-d float table (num, dim)", op,
                     weight ? ct_tensor_describe(weight, a, sizeof a) : "NULL");
        return NULL;
    }
    ct_vocab_embedding_config c = cfg ? *cfg : (ct_vocab_embedding_config){0};
    int n = ct_pg_size(g), r = ct_pg_rank(g);
    int64_t padded = ct_tp_vocab_padded(weight->shape[0], n, c.pad_multiple);
    if (padded < 0) return NULL;
    ct_vocab_embedding *m = ct_module_alloc(sizeof *m, "VocabParallelEmbedding", NULL);
    if (!m) return NULL;
    m->group = g, m->cfg = c, m->num = weight->shape[0], m->dim = weight->shape[1], m->num_padded = padded;
    m->start = r * (padded / n), m->end = m->start + padded / n;
    m->weight_shard = (ct_tp_shard){.dim = 0, .start = m->start, .end = m->end, .full = m->num};
    ct_frame_push();
    ct_tensor *w = cti_tp_take_slice(weight, 0, m->start, m->end);
    if (w && !ct_module_add_param(&m->base, "weight", w)) m->weight = w;
    ct_frame_pop();
    if (!m->weight) {
        ct_error_prefix("%s (rank %d of %d): ", op, r, n);
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

/* ids (...) of an integer dtype as a contiguous i64 tensor; an error names op and the
 * first id outside [0, hi) that is not *allowed (NULL: none is). */
static ct_tensor *ids_checked(const char *op, ct_pg *g, ct_tensor *ids, int64_t hi, const int64_t *allowed)
{
    char a[160];
    if (ids->dtype != CT_DTYPE_I64 && ids->dtype != CT_DTYPE_I32) {
        ct_error_set(CT_ERR_INVALID, "%s (rank %d of %d): ids %s; want i32 or i64", op, ct_pg_rank(g), ct_pg_size(g),
                     ct_tensor_describe(ids, a, sizeof a));
        return NULL;
    }
    ct_tensor *t = ct_tensor_contiguous(ct_tensor_cast(ids, CT_DTYPE_I64));
    if (!t) return NULL;
    const int64_t *p = ct_tensor_data(t);
    for (int64_t i = 0, cnt = ct_tensor_numel(t); i < cnt; i++)
        if ((p[i] < 0 || p[i] >= hi) && !(allowed && p[i] == *allowed)) {
            ct_error_set(CT_ERR_INVALID, "%s (rank %d of %d): id %lld at flat index %lld of %s is outside [0, %lld)",
                         op, ct_pg_rank(g), ct_pg_size(g), (long long)p[i], (long long)i,
                         ct_tensor_describe(ids, a, sizeof a), (long long)hi);
            return NULL;
        }
    return t;
}

ct_tensor *ct_vocab_embedding_forward(ct_vocab_embedding *m, ct_tensor *ids)
{
    if (!m || !ids || ct_module_forward_begin(&m->base)) return NULL;
    const char *op = "vocab_embedding";
    ct_tensor *y = NULL, *t = ids_checked(op, m->group, ids, m->num, NULL);
    if (t && ids->ndim + 1 > CT_MAX_DIMS) {
        ct_error_set(CT_ERR_INVALID, "%s: ids have %d dims; at most %d", op, ids->ndim, CT_MAX_DIMS - 1);
        t = NULL;
    }
    if (t) {
        /* local ids: id - start inside [start, end), else row 0 masked to zeros */
        int64_t shape[CT_MAX_DIMS];
        for (int i = 0; i < ids->ndim; i++) shape[i] = ids->shape[i];
        shape[ids->ndim] = 1;
        ct_tensor *local = ct_tensor_empty(CT_DTYPE_I64, ids->ndim, ids->shape);
        ct_tensor *mask = ct_tensor_empty(CT_DTYPE_F32, ids->ndim + 1, shape);
        if (local && mask) {
            const int64_t *p = ct_tensor_data(t);
            int64_t *q = ct_tensor_data(local);
            float *k = ct_tensor_data(mask);
            for (int64_t i = 0, cnt = ct_tensor_numel(t); i < cnt; i++) {
                bool mine = p[i] >= m->start && p[i] < m->end;
                q[i] = mine ? p[i] - m->start : 0;
                k[i] = mine ? 1.0f : 0.0f;
            }
            if (m->weight->dtype != CT_DTYPE_F32) mask = ct_tensor_cast(mask, m->weight->dtype);
            y = ct_mul(ct_embedding(m->weight, local), mask);
            y = m->cfg.sequence_parallel ? ct_tp_reduce_scatter_to_sequence(m->group, y, m->cfg.sequence_dim)
                                         : ct_tp_reduce_from(m->group, y);
        }
    }
    return ct_module_forward_end(&m->base, y);
}

/* ---- cross-entropy ----------------------------------------------------------------- */

typedef struct {
    ct_pg *g; /* borrowed */
    int64_t vocab_size, ignore_index, count;
} vce_ctx;

/* logits as a contiguous f32 tensor (a copy when it is another dtype or strided) */
static ct_tensor *as_f32(ct_tensor *x)
{
    return ct_tensor_contiguous(x->dtype == CT_DTYPE_F32 ? x : ct_tensor_cast(x, CT_DTYPE_F32));
}

// saved: logits (..., Vl), targets (...) i64, lse (N) f64.
// dlogits[i, j] = (exp(x[i, j] - lse[i]) - [start + j == t_i]) * dloss / count on the real
// columns of rows not ignored, 0 elsewhere; overwritten
static ct_status vce_backward(ct_node *nd, ct_tensor *gy, ct_tensor **gx)
{
    const vce_ctx *c = ct_node_ctx(nd);
    ct_tensor *logits = ct_node_saved(nd, 0);
    ct_tensor *x = as_f32(logits), *dx = ct_tensor_zeros(CT_DTYPE_F32, logits->ndim, logits->shape);
    if (!x || !dx) return ct_last_status();
    const int64_t *t = ct_tensor_data(ct_node_saved(nd, 1));
    const double *lse = ct_tensor_data(ct_node_saved(nd, 2));
    int64_t Vl = logits->shape[logits->ndim - 1], N = ct_tensor_numel(logits) / (Vl ? Vl : 1);
    int64_t start = ct_pg_rank(c->g) * Vl, nvalid = c->vocab_size - start;
    nvalid = nvalid < 0 ? 0 : nvalid > Vl ? Vl : nvalid;
    double scale = ct_tensor_item(gy) / (double)(c->count ? c->count : 1);
    const float *xp = ct_tensor_data(x);
    float *dp = ct_tensor_data(dx);
    for (int64_t i = 0; i < N; i++) {
        if (t[i] == c->ignore_index) continue;
        for (int64_t j = 0; j < nvalid; j++) {
            double p = exp((double)xp[i * Vl + j] - lse[i]) - (start + j == t[i] ? 1.0 : 0.0);
            dp[i * Vl + j] = (float)(p * scale);
        }
    }
    gx[0] = logits->dtype == CT_DTYPE_F32 ? dx : ct_tensor_cast(dx, logits->dtype);
    if (!gx[0]) return ct_last_status();
    return CT_OK;
}

ct_tensor *ct_vocab_parallel_cross_entropy(ct_pg *g, ct_tensor *logits, ct_tensor *targets, int64_t vocab_size,
                                           int64_t ignore_index)
{
    const char *op = "vocab_parallel_cross_entropy";
    char a[160], b[160];
    if (!logits || !targets || cti_tp_check_group(op, g)) return NULL;
    int n = ct_pg_size(g), r = ct_pg_rank(g);
    bool shape_ok = logits->ndim == targets->ndim + 1;
    for (int i = 0; shape_ok && i < targets->ndim; i++) shape_ok = logits->shape[i] == targets->shape[i];
    if (!shape_ok || !ct_dtype_is_float(logits->dtype) || logits->shape[logits->ndim - 1] < 1) {
        ct_error_set(CT_ERR_INVALID, "%s (rank %d of %d): logits %s and targets %s; want float logits (..., Vl >= 1) "
                     "and targets (...)",
                     op, r, n, ct_tensor_describe(logits, a, sizeof a), ct_tensor_describe(targets, b, sizeof b));
        return NULL;
    }
    int64_t Vl = logits->shape[logits->ndim - 1], N = ct_tensor_numel(targets), start = r * Vl;
    if (vocab_size < 1 || vocab_size > Vl * n) {
        ct_error_set(CT_ERR_INVALID, "%s (rank %d of %d): vocab_size %lld; want 1 .. %d ranks x %lld columns = %lld",
                     op, r, n, (long long)vocab_size, n, (long long)Vl, (long long)(Vl * n));
        return NULL;
    }
    ct_tensor *t = ids_checked(op, g, targets, vocab_size, &ignore_index);
    ct_tensor *x = t ? as_f32(logits) : NULL;
    ct_tensor *mx = ct_tensor_empty(CT_DTYPE_F32, 1, (const int64_t[]){N});
    ct_tensor *st = ct_tensor_zeros(CT_DTYPE_F64, 1, (const int64_t[]){2 * N});
    ct_tensor *lse = ct_tensor_empty(CT_DTYPE_F64, 1, (const int64_t[]){N});
    if (!x || !mx || !st || !lse) return NULL;
    int64_t nvalid = vocab_size - start;
    nvalid = nvalid < 0 ? 0 : nvalid > Vl ? Vl : nvalid;
    const float *xp = ct_tensor_data(x);
    const int64_t *tp = ct_tensor_data(t);
    float *mp = ct_tensor_data(mx);
    double *sp = ct_tensor_data(st), *lp = ct_tensor_data(lse);

    /* the global row max: this rank's real columns (-inf when it has only padding) */
    for (int64_t i = 0; i < N; i++) {
        float m = -INFINITY;
        for (int64_t j = 0; j < nvalid; j++) m = xp[i * Vl + j] > m ? xp[i * Vl + j] : m;
        mp[i] = m;
    }
    if (ct_work_run(ct_pg_allreduce(g, mx, CT_REDUCE_MAX))) goto failed;
    /* st[i] = sum_j exp(x - max), st[N + i] = the target's logit where this rank owns it */
    for (int64_t i = 0; i < N; i++) {
        double s = 0;
        for (int64_t j = 0; j < nvalid; j++) s += exp((double)xp[i * Vl + j] - mp[i]);
        sp[i] = s;
        if (tp[i] != ignore_index && tp[i] >= start && tp[i] < start + nvalid) sp[N + i] = xp[i * Vl + tp[i] - start];
    }
    if (ct_work_run(ct_pg_allreduce(g, st, CT_REDUCE_SUM))) goto failed;
    double total = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) {
        lp[i] = mp[i] + log(sp[i]);
        if (tp[i] == ignore_index) continue;
        total += lp[i] - sp[N + i];
        count++;
    }
    ct_tensor *loss = ct_tensor_scalar(CT_DTYPE_F32, count ? total / (double)count : NAN);
    if (!loss || !ct_autograd_needed(1, (const ct_tensor *const *)&logits)) return loss;
    ct_node *nd = ct_node_new(op, vce_backward, 1, &logits);
    if (!nd) return NULL;
    vce_ctx *c = ct_node_ctx(nd);
    *c = (vce_ctx){.g = g, .vocab_size = vocab_size, .ignore_index = ignore_index, .count = count};
    if (ct_node_save(nd, logits, false) || ct_node_save(nd, t, false) || ct_node_save(nd, lse, false)) {
        ct_node_discard(nd);
        return NULL;
    }
    return ct_node_attach(nd, loss) ? NULL : loss;

failed:
    ct_error_prefix("%s (rank %d of %d, logits %s): ", op, r, n, ct_tensor_describe(logits, a, sizeof a));
    return NULL;
}
