/* Differentiable nn ops (autograd/ops_nn.h): thin wrappers that run a fused
 * forward kernel, save what its backward kernel needs and record a node.
 * Argument checks are the kernels' own; their messages already name the op
 * ("softmax", "layernorm", ...) and every operand's shape. */
#include "autograd/autocast_cast_internal.h"
#include "autograd/ops_nn.h"

#include "autograd/node.h"
#include "core/frame.h"
#include "kernels/attention.h"
#include "kernels/dispatch_internal.h"
#include "kernels/dropout.h"
#include "kernels/embedding.h"
#include "kernels/loss.h"
#include "kernels/norm.h"
#include "kernels/softmax.h"

/* Attaches n to y after the saves (their first failure in st); a node that
 * could not be completed is discarded so nothing leaks. */
static ct_tensor *finish(ct_node *n, ct_status st, ct_tensor *y)
{
    if (!n) return NULL;
    if (st) {
        ct_node_discard(n);
        return NULL;
    }
    return ct_node_attach(n, y) ? NULL : y;
}

static ct_status status_of(bool ok) { return ok ? CT_OK : (ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL); }

/* ---- softmax / log_softmax ----------------------------------------------------- */

typedef struct {
    int dim;
} softmax_ctx;

// saved: y (the output). dx = y * (dy - sum_dim(dy * y)), overwritten
static ct_status softmax_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const softmax_ctx *c = ct_node_ctx(n);
    gx[0] = ct_kernel_softmax_backward(gy, ct_node_saved(n, 0), c->dim);
    return status_of(gx[0] != NULL);
}

// saved: y = log_softmax(x). dx = dy - exp(y) * sum_dim(dy), overwritten
static ct_status log_softmax_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const softmax_ctx *c = ct_node_ctx(n);
    gx[0] = ct_kernel_log_softmax_backward(gy, ct_node_saved(n, 0), c->dim);
    return status_of(gx[0] != NULL);
}

static ct_tensor *softmax_common(const char *op, ct_tensor *y, ct_backward_fn backward, ct_tensor *x, int dim)
{
    if (!y || !ct_autograd_needed(1, (const ct_tensor *const *)&x)) return y;
    ct_node *n = ct_node_new(op, backward, 1, &x);
    if (!n) return NULL;
    ((softmax_ctx *)ct_node_ctx(n))->dim = dim;
    return finish(n, ct_node_save(n, y, true), y);
}

ct_tensor *ct_softmax(ct_tensor *x, int dim)
{
    x = cti_autocast_arg(CT_AC_SOFTMAX, x);
    return softmax_common("softmax", ct_kernel_softmax(x, dim), softmax_backward, x, dim);
}

ct_tensor *ct_log_softmax(ct_tensor *x, int dim)
{
    x = cti_autocast_arg(CT_AC_LOG_SOFTMAX, x);
    return softmax_common("log_softmax", ct_kernel_log_softmax(x, dim), log_softmax_backward, x, dim);
}

/* ---- layernorm / rmsnorm ------------------------------------------------------- */

typedef struct {
    bool has_w;
} norm_ctx;

/* g cast to the dtype input i had when recorded (a no-op in the common case). */
static ct_tensor *as_input_dtype(const ct_node *n, int i, ct_tensor *g)
{
    const ct_tensor *m = ct_node_input_meta(n, i);
    if (!g || g->dtype == m->dtype) return g;
    return ct_tensor_cast(g, m->dtype);
}

// inputs x (..., C), w (C), b (C); saved x, [w], mean, rstd.
// dx, dw, db: new tensors from the kernel (overwritten); only the needed ones are computed.
static ct_status layernorm_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const norm_ctx *c = ct_node_ctx(n);
    int s = 0;
    ct_tensor *x = ct_node_saved(n, s++);
    ct_tensor *w = c->has_w ? ct_node_saved(n, s++) : NULL;
    ct_tensor *mean = ct_node_saved(n, s++), *rstd = ct_node_saved(n, s++);
    bool want_x = ct_node_input_needs_grad(n, 0), want_w = ct_node_input_needs_grad(n, 1);
    bool want_b = ct_node_input_needs_grad(n, 2);
    ct_tensor *dx = NULL, *dw = NULL, *db = NULL;
    ct_status st = ct_kernel_layernorm_backward(gy, x, w, mean, rstd, want_x ? &dx : NULL, want_w ? &dw : NULL,
                                                want_b ? &db : NULL);
    if (st) return st;
    /* the kernel returns dw in w's dtype and db in w's (or x's) dtype; b may differ */
    gx[0] = dx;
    gx[1] = dw;
    gx[2] = as_input_dtype(n, 2, db);
    return status_of(!want_b || gx[2]);
}

ct_tensor *ct_layernorm(ct_tensor *x, ct_tensor *w, ct_tensor *b, double eps)
{
    x = cti_autocast_arg(CT_AC_LAYERNORM, x);
    w = cti_autocast_arg(CT_AC_LAYERNORM, w);
    b = cti_autocast_arg(CT_AC_LAYERNORM, b);
    ct_tensor *in[3] = {x, w, b};
    ct_tensor *y = NULL, *mean = NULL, *rstd = NULL;
    bool need = ct_autograd_needed(3, (const ct_tensor *const *)in);
    if (ct_kernel_layernorm(x, w, b, eps, &y, need ? &mean : NULL, need ? &rstd : NULL)) return NULL;
    if (!need) return y;
    ct_node *n = ct_node_new("layernorm", layernorm_backward, 3, in);
    if (!n) return NULL;
    ((norm_ctx *)ct_node_ctx(n))->has_w = w != NULL;
    ct_status st = ct_node_save(n, x, false);
    if (!st && w) st = ct_node_save(n, w, false);
    if (!st) st = ct_node_save(n, mean, false);
    if (!st) st = ct_node_save(n, rstd, false);
    return finish(n, st, y);
}

// inputs x (..., C), w (C); saved x, [w], rstd. dx, dw new tensors (overwritten).
static ct_status rmsnorm_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const norm_ctx *c = ct_node_ctx(n);
    int s = 0;
    ct_tensor *x = ct_node_saved(n, s++);
    ct_tensor *w = c->has_w ? ct_node_saved(n, s++) : NULL;
    ct_tensor *rstd = ct_node_saved(n, s++);
    bool want_x = ct_node_input_needs_grad(n, 0), want_w = ct_node_input_needs_grad(n, 1);
    ct_tensor *dx = NULL, *dw = NULL;
    ct_status st = ct_kernel_rmsnorm_backward(gy, x, w, rstd, want_x ? &dx : NULL, want_w ? &dw : NULL);
    if (st) return st;
    gx[0] = dx;
    gx[1] = dw;
    return CT_OK;
}

ct_tensor *ct_rmsnorm(ct_tensor *x, ct_tensor *w, double eps)
{
    x = cti_autocast_arg(CT_AC_RMSNORM, x);
    w = cti_autocast_arg(CT_AC_RMSNORM, w);
    ct_tensor *in[2] = {x, w};
    ct_tensor *y = NULL, *rstd = NULL;
    bool need = ct_autograd_needed(2, (const ct_tensor *const *)in);
    if (ct_kernel_rmsnorm(x, w, eps, &y, need ? &rstd : NULL)) return NULL;
    if (!need) return y;
    ct_node *n = ct_node_new("rmsnorm", rmsnorm_backward, 2, in);
    if (!n) return NULL;
    ((norm_ctx *)ct_node_ctx(n))->has_w = w != NULL;
    ct_status st = ct_node_save(n, x, false);
    if (!st && w) st = ct_node_save(n, w, false);
    if (!st) st = ct_node_save(n, rstd, false);
    return finish(n, st, y);
}

/* ---- embedding --------------------------------------------------------------------- */

static bool grad_dtype(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16;
}

// input weight (V, C); saved ids. dweight = zeros (V, C), then dweight[ids[i]] += dout[i]
// (the scatter-add sums repeated ids).
static ct_status embedding_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const ct_tensor *m = ct_node_input_meta(n, 0);
    ct_tensor *dw = ct_tensor_zeros_on(m->device, m->dtype, m->ndim, m->shape);
    if (!dw) return ct_last_status();
    ct_status st = ct_kernel_embedding_backward(dw, gy, ct_node_saved(n, 0));
    if (st) return st;
    gx[0] = dw;
    return CT_OK;
}

ct_tensor *ct_embedding(ct_tensor *weight, ct_tensor *ids)
{
    ct_tensor *y = ct_kernel_embedding(weight, ids);
    if (!y || !ct_autograd_needed(1, (const ct_tensor *const *)&weight)) return y;
    if (!grad_dtype(weight->dtype)) {
        char a[200];
        ct_error_set(CT_ERR_INVALID, "embedding: weight %s requires grad; its backward supports f32, f64, bf16 and "
                     "f16 tables only", ct_tensor_describe(weight, a, sizeof a));
        return NULL;
    }
    ct_node *n = ct_node_new("embedding", embedding_backward, 1, &weight);
    if (!n) return NULL;
    return finish(n, ct_node_save(n, ids, false), y);
}

/* ---- dropout --------------------------------------------------------------------------- */

typedef struct {
    double p;
} dropout_ctx;

// saved: mask (u8). dx = dy * mask / (1 - p), overwritten
static ct_status dropout_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const dropout_ctx *c = ct_node_ctx(n);
    gx[0] = ct_kernel_dropout_backward(gy, ct_node_saved(n, 0), c->p);
    return status_of(gx[0] != NULL);
}

ct_tensor *ct_dropout(ct_tensor *x, double p, bool training, ct_rng *rng)
{
    if (!x) return NULL;
    if (!(p >= 0 && p <= 1)) { /* NaN too; checked even in eval mode so a bad config shows at once */
        char a[200];
        ct_error_set(CT_ERR_INVALID, "dropout: p = %g must lie in [0, 1] (x %s)", p, ct_tensor_describe(x, a, sizeof a));
        return NULL;
    }
    if (!training || p == 0) return ct_frame_adopt(ct_tensor_retain(x));
    ct_tensor *mask = NULL;
    bool need = ct_autograd_needed(1, (const ct_tensor *const *)&x);
    ct_tensor *y = ct_kernel_dropout(x, p, rng, need ? &mask : NULL);
    if (!y || !need) return y;
    ct_node *n = ct_node_new("dropout", dropout_backward, 1, &x);
    if (!n) return NULL;
    ((dropout_ctx *)ct_node_ctx(n))->p = p;
    return finish(n, ct_node_save(n, mask, false), y);
}

/* ---- cross-entropy -------------------------------------------------------------------- */

typedef struct {
    int64_t ignore_index;
} cross_entropy_ctx;

// input logits (..., V); saved logits, targets, lse (...).
// dlogits = (softmax(logits) - onehot(t)) * dloss / count, 0 on ignored rows; overwritten
static ct_status cross_entropy_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const cross_entropy_ctx *c = ct_node_ctx(n);
    gx[0] = ct_kernel_cross_entropy_backward(gy, ct_node_saved(n, 0), ct_node_saved(n, 1), ct_node_saved(n, 2),
                                             c->ignore_index);
    return status_of(gx[0] != NULL);
}

ct_tensor *ct_cross_entropy(ct_tensor *logits, ct_tensor *targets, int64_t ignore_index)
{
    logits = cti_autocast_arg(CT_AC_CROSS_ENTROPY, logits);
    ct_tensor *lse = NULL;
    bool need = ct_autograd_needed(1, (const ct_tensor *const *)&logits);
    ct_tensor *loss = ct_kernel_cross_entropy(logits, targets, ignore_index, need ? &lse : NULL);
    if (!loss || !need) return loss;
    ct_node *n = ct_node_new("cross_entropy", cross_entropy_backward, 1, &logits);
    if (!n) return NULL;
    ((cross_entropy_ctx *)ct_node_ctx(n))->ignore_index = ignore_index;
    ct_status st = ct_node_save(n, logits, false);
    if (!st) st = ct_node_save(n, targets, false);
    if (!st) st = ct_node_save(n, lse, false);
    return finish(n, st, loss);
}

/* ---- attention ----------------------------------------------------------------------- */

typedef struct {
    bool causal;
    double scale;
} attention_ctx;

// inputs q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv); saved q, k, v, out, lse (B,H,T).
// The kernel writes all of dq, dk, dv (new, overwritten); only the needed ones are passed on.
static ct_status attention_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const attention_ctx *c = ct_node_ctx(n);
    ct_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    ct_status st = ct_kernel_attention_backward(gy, ct_node_saved(n, 0), ct_node_saved(n, 1), ct_node_saved(n, 2),
                                                ct_node_saved(n, 3), ct_node_saved(n, 4), c->causal, c->scale, &dq,
                                                &dk, &dv);
    if (st) return st;
    if (ct_node_input_needs_grad(n, 0)) gx[0] = dq;
    if (ct_node_input_needs_grad(n, 1)) gx[1] = dk;
    if (ct_node_input_needs_grad(n, 2)) gx[2] = dv;
    return CT_OK;
}

ct_tensor *ct_attention(ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal, double scale)
{
    q = cti_autocast_arg(CT_AC_ATTENTION, q);
    k = cti_autocast_arg(CT_AC_ATTENTION, k);
    v = cti_autocast_arg(CT_AC_ATTENTION, v);
    ct_tensor *in[3] = {q, k, v};
    ct_tensor *lse = NULL;
    bool need = ct_autograd_needed(3, (const ct_tensor *const *)in);
    ct_tensor *out = ct_kernel_attention(q, k, v, causal, scale, need ? &lse : NULL);
    if (!out || !need) return out;
    ct_node *n = ct_node_new("attention", attention_backward, 3, in);
    if (!n) return NULL;
    attention_ctx *c = ct_node_ctx(n);
    c->causal = causal;
    c->scale = scale;
    ct_status st = CT_OK;
    for (int i = 0; i < 3 && !st; i++) st = ct_node_save(n, in[i], false);
    if (!st) st = ct_node_save(n, out, true);
    if (!st) st = ct_node_save(n, lse, false);
    return finish(n, st, out);
}

/* ---- attention on a fused qkv projection ----------------------------------------------------- */

typedef struct {
    bool causal;
    double scale;
    int64_t n_head;
} attention_qkv_ctx;

/* Columns [off, off + C) of x (B,T,W), split into H heads of D = C/H, as a (B,H,T,D)
 * view: element (b,h,t,d) = x[b, t, off + h*D + d]. x must be contiguous. */
static ct_tensor *heads_view(ct_tensor *x, int64_t off, int64_t C, int64_t H)
{
    const int64_t B = x->shape[0], T = x->shape[1];
    return ct_tensor_transpose(ct_tensor_view(ct_tensor_narrow(x, 2, off, C), CT_SHAPE(B, T, H, C / H)), 1, 2);
}

// input qkv (B,T,3C); saved qkv (contiguous), out (B,T,C), lse (B,H,T). The kernel writes dq, dk, dv
// straight into the three column blocks of one (B,T,3C) gradient (every element).
static ct_status attention_qkv_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const attention_qkv_ctx *c = ct_node_ctx(n);
    ct_tensor *qkv = ct_node_saved(n, 0), *g = ct_tensor_contiguous(gy); /* qkv: saved contiguous */
    if (!g) return ct_last_status();
    const int64_t C = qkv->shape[2] / 3, H = c->n_head;
    ct_tensor *dx = ct_tensor_empty_on(qkv->device, qkv->dtype, qkv->ndim, qkv->shape);
    if (!dx) return ct_last_status();
    ct_status st = ct_kernel_attention_backward_into(
        heads_view(g, 0, C, H), heads_view(qkv, 0, C, H), heads_view(qkv, C, C, H), heads_view(qkv, 2 * C, C, H),
        heads_view(ct_node_saved(n, 1), 0, C, H), ct_node_saved(n, 2), c->causal, c->scale, heads_view(dx, 0, C, H),
        heads_view(dx, C, C, H), heads_view(dx, 2 * C, C, H));
    if (st) return st;
    gx[0] = dx;
    return CT_OK;
}

ct_tensor *ct_attention_qkv(ct_tensor *qkv, int64_t n_head, bool causal, double scale)
{
    qkv = cti_autocast_arg(CT_AC_ATTENTION, qkv);
    if (!qkv) return NULL;
    char d[200];
    if (qkv->ndim != 3 || n_head < 1 || qkv->shape[2] < 3 || qkv->shape[2] % (3 * n_head) != 0) {
        ct_error_set(CT_ERR_INVALID,
                     "attention_qkv: qkv %s must be (B, T, 3C) with C a multiple of n_head = %lld (C >= 1)",
                     ct_tensor_describe(qkv, d, sizeof d), (long long)n_head);
        return NULL;
    }
    const int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, H = n_head;
    ct_tensor *x = ct_tensor_contiguous(qkv);
    ct_tensor *out = ct_tensor_empty_on(qkv->device, qkv->dtype, CT_SHAPE(B, T, C));
    bool need = ct_autograd_needed(1, (const ct_tensor *const *)&qkv);
    ct_tensor *lse = need ? ct_tensor_empty_on(qkv->device, cti_kernel_stat_dtype(qkv->dtype), CT_SHAPE(B, H, T)) : NULL;
    if (!x || !out || (need && !lse)) return NULL;
    if (ct_kernel_attention_into(heads_view(x, 0, C, H), heads_view(x, C, C, H), heads_view(x, 2 * C, C, H), causal,
                                 scale, heads_view(out, 0, C, H), lse)) {
        ct_error_prefix("attention_qkv (qkv %s, n_head %lld): ", ct_tensor_describe(qkv, d, sizeof d),
                        (long long)n_head);
        return NULL;
    }
    if (!need) return out;
    ct_node *n = ct_node_new("attention_qkv", attention_qkv_backward, 1, &qkv);
    if (!n) return NULL;
    attention_qkv_ctx *c = ct_node_ctx(n);
    c->causal = causal;
    c->scale = scale;
    c->n_head = n_head;
    /* the contiguous qkv the heads were read from, so backward does not copy it again */
    ct_status st = ct_node_save(n, x, false);
    if (!st) st = ct_node_save(n, out, true);
    if (!st) st = ct_node_save(n, lse, false);
    return finish(n, st, out);
}
