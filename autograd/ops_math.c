/* Differentiable matmul (batched, with transposes) and linear.
 *
 * C = op(A) @ op(B) with op(T) = T or T^T over the last two dims. Backward, per
 * transpose combination (dC has C's shape; each product is one GEMM call with
 * the transposes folded into the GEMM, never materialised):
 *   ta tb   dA                     dB
 *   0  0    dC @ B^T               A^T @ dC
 *   0  1    dC @ B                 dC^T @ A
 *   1  0    B @ dC^T               A @ dC
 *   1  1    B^T @ dC^T             dC^T @ A^T
 * An operand whose batch dims were broadcast gets the sum of these over the
 * broadcast batch entries. Instead of materialising the per-entry products and
 * summing them, the sum is formed inside the GEMM: when the gradient has the
 * form sum_i P_i^T Q_i for an operand without batch dims (dB of A @ B and of
 * A @ B^T, the weight of a linear layer) the batch is folded into the GEMM's K
 * dimension (one call); other broadcasts accumulate entry by entry with beta = 1
 * into the gradient, in a fixed order.
 */
#include <string.h>

#include "autograd/autocast_cast_internal.h"
#include "autograd/node.h"
#include "autograd/ops_fp8.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "kernels/dispatch_internal.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"

/* ---- matmul ---------------------------------------------------------------------- */

typedef struct {
    bool ta, tb;
    int8_t ia, ib; /* saved index of a and b, -1 when not saved */
} matmul_ctx;

static int64_t prod(int n, const int64_t *s)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= s[i];
    return p;
}

/* The 2-D matrix of t (batch dims right-aligned against bc, size-1 dims
 * broadcast) for row-major entry i of the batch shape bc (nb dims): a view. */
static ct_tensor *batch_entry(ct_tensor *t, int64_t i, int nb, const int64_t *bc)
{
    int64_t idx[CT_MAX_DIMS];
    for (int d = nb - 1; d >= 0; d--) {
        idx[d] = i % bc[d];
        i /= bc[d];
    }
    int nt = t->ndim - 2;
    for (int e = 0; e < nt && t; e++) t = ct_tensor_select(t, 0, t->shape[0] == 1 ? 0 : idx[e + nb - nt]);
    return t;
}

/* Gradient of one matmul operand X (meta mx) as sum over the batch of
 * op_p(P) @ op_q(Q), where exactly one of P, Q is dC (gy) and the other is the
 * partner operand Y. p_is_gy says which. */
static ct_tensor *matmul_operand_grad(const ct_tensor *mx, ct_tensor *gy, ct_tensor *y, bool p_is_gy, bool tp,
                                      bool tq)
{
    ct_tensor *P = p_is_gy ? gy : y, *Q = p_is_gy ? y : gy;
    int nbx = mx->ndim - 2, nbc = gy->ndim - 2;
    int64_t nx = prod(nbx, mx->shape), nc = prod(nbc, gy->shape);
    if (nx == nc) { /* no batch dim of X was broadcast (up to leading 1s) */
        ct_tensor *g = ct_kernel_matmul(P, Q, tp, tq);
        return ct_tensor_same_shape(g, mx) || !g ? g : ct_tensor_reshape(g, mx->ndim, mx->shape);
    }
    int64_t r = mx->shape[mx->ndim - 2], c = mx->shape[mx->ndim - 1];
    if (nx == 1 && tp && !tq && nc > 0) {
        /* X has no batch of its own and the product is sum_i P_i^T Q_i, i.e. the
         * batch stacks the rows both P_i and Q_i are summed over: one GEMM of
         * P as (batch*rows, r) with Q as (batch*rows, c). (dB of A @ B and A @ B^T.) */
        ct_tensor *P2 = ct_tensor_reshape(P, CT_SHAPE(-1, r));
        ct_tensor *Q2 = ct_tensor_reshape(Q, CT_SHAPE(-1, c));
        ct_tensor *g = ct_kernel_matmul(P2, Q2, true, false);
        return g ? ct_tensor_reshape(g, mx->ndim, mx->shape) : NULL;
    }
    /* general broadcast: accumulate entry by entry (beta = 1), in a fixed order */
    ct_tensor *g = ct_tensor_zeros_on(mx->device, mx->dtype, mx->ndim, mx->shape);
    ct_status st = g ? CT_OK : ct_last_status();
    for (int64_t i = 0; i < nc && !st; i++) {
        ct_frame_push();
        ct_tensor *go = batch_entry(g, i, nbc, gy->shape);
        ct_tensor *pi = batch_entry(P, i, nbc, gy->shape), *qi = batch_entry(Q, i, nbc, gy->shape);
        st = go && pi && qi ? ct_kernel_matmul_out(go, pi, qi, tp, tq, 1.0, 1.0) : ct_last_status();
        ct_frame_pop();
    }
    return st ? NULL : g;
}

static ct_status matmul_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const matmul_ctx *c = ct_node_ctx(n);
    ct_tensor *a = c->ia >= 0 ? ct_node_saved(n, c->ia) : NULL;
    ct_tensor *b = c->ib >= 0 ? ct_node_saved(n, c->ib) : NULL;
    bool ta = c->ta, tb = c->tb;
    if (ct_node_input_needs_grad(n, 0)) {
        const ct_tensor *ma = ct_node_input_meta(n, 0);
        /* see the table at the top of the file */
        if (!ta) gx[0] = matmul_operand_grad(ma, gy, b, true, false, !tb);
        else gx[0] = matmul_operand_grad(ma, gy, b, false, tb, true);
        if (!gx[0]) return ct_last_status();
    }
    if (ct_node_input_needs_grad(n, 1)) {
        const ct_tensor *mb = ct_node_input_meta(n, 1);
        if (!tb) gx[1] = matmul_operand_grad(mb, gy, a, false, !ta, false);
        else gx[1] = matmul_operand_grad(mb, gy, a, true, true, ta);
        if (!gx[1]) return ct_last_status();
    }
    return CT_OK;
}

ct_tensor *ct_matmul_t(ct_tensor *a, ct_tensor *b, bool trans_a, bool trans_b)
{
    a = cti_autocast_arg(CT_AC_MATMUL, a);
    b = cti_autocast_arg(CT_AC_MATMUL, b);
    ct_tensor *y = ct_kernel_matmul(a, b, trans_a, trans_b);
    ct_tensor *in[2] = {a, b};
    if (!y || !ct_autograd_needed(2, (const ct_tensor *const *)in)) return y;
    ct_node *n = ct_node_new("matmul", matmul_backward, 2, in);
    if (!n) return NULL;
    matmul_ctx *c = ct_node_ctx(n);
    *c = (matmul_ctx){trans_a, trans_b, -1, -1};
    int k = 0;
    ct_status st = CT_OK;
    /* dA reads B, dB reads A */
    if (ct_node_input_needs_grad(n, 1) && !(st = ct_node_save(n, a, false))) c->ia = (int8_t)k++;
    if (!st && ct_node_input_needs_grad(n, 0) && !(st = ct_node_save(n, b, false))) c->ib = (int8_t)k++;
    if (st) {
        ct_node_discard(n);
        return NULL;
    }
    return ct_node_attach(n, y) ? NULL : y;
}

ct_tensor *ct_matmul(ct_tensor *a, ct_tensor *b) { return ct_matmul_t(a, b, false, false); }

/* ---- linear -------------------------------------------------------------------------- */

typedef struct {
    int8_t ix, iw; /* saved index of x2 (x as (N, in)) and w; -1 when not saved */
} linear_ctx;

/* x (..., in) -> y (..., out) = x @ w + b; saved: x2 = x as (N, in) for dw, w for dx.
 * Backward, with dy2 = dy as (N, out), all overwritten (fresh tensors):
 *   dx = dy2 @ w^T (N, in) -> x's shape;  dw = x2^T @ dy2 (in, out);  db = sum_N dy2 (out) */
static ct_status linear_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const linear_ctx *c = ct_node_ctx(n);
    const ct_tensor *mx = ct_node_input_meta(n, 0), *mw = ct_node_input_meta(n, 1);
    ct_tensor *gy2 = ct_tensor_reshape(gy, CT_SHAPE(-1, mw->shape[1]));
    if (!gy2) return ct_last_status();
    if (ct_node_input_needs_grad(n, 0)) {
        ct_tensor *g = ct_kernel_matmul(gy2, ct_node_saved(n, c->iw), false, true);
        if (!(gx[0] = g ? ct_tensor_reshape(g, mx->ndim, mx->shape) : NULL)) return ct_last_status();
    }
    if (ct_node_input_needs_grad(n, 1)) {
        if (!(gx[1] = ct_kernel_matmul(ct_node_saved(n, c->ix), gy2, true, false))) return ct_last_status();
    }
    if (ct_node_input_needs_grad(n, 2)) {
        if (!(gx[2] = ct_kernel_sum(gy2, (int[]){0}, 1, false))) return ct_last_status();
    }
    return CT_OK;
}

ct_tensor *ct_linear(ct_tensor *x, ct_tensor *w, ct_tensor *b)
{
    if (!x || !w) return NULL;
    ct_fp8_state *fp8 = ct_fp8_linear_state(x, w);
    if (fp8) return ct_fp8_linear(fp8, x, w, b, false);
    x = cti_autocast_arg(CT_AC_LINEAR, x);
    w = cti_autocast_arg(CT_AC_LINEAR, w);
    b = cti_autocast_arg(CT_AC_LINEAR, b);
    if (!x || !w) return NULL;
    char dx[200], dw[200], db[200];
    const ct_tensor *ts[3] = {x, w, b};
    if (cti_kernel_same_device("linear", ts, 3)) return NULL;
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[0] ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[1])) || x->dtype != w->dtype || (b && b->dtype != w->dtype)) {
        ct_error_set(CT_ERR_INVALID,
                     "linear: x %s, w %s, b %s: need x (..., in), w (in, out), b (out) or NULL, one dtype",
                     ct_tensor_describe(x, dx, sizeof dx), ct_tensor_describe(w, dw, sizeof dw),
                     b ? ct_tensor_describe(b, db, sizeof db) : "NULL");
        return NULL;
    }
    int64_t in = w->shape[0], out = w->shape[1];
    ct_tensor *x2 = ct_tensor_reshape(x, CT_SHAPE(-1, in));
    if (!x2) return NULL;
    ct_tensor *y2 = ct_tensor_empty_on(x->device, x->dtype, CT_SHAPE(x2->shape[0], out));
    if (!y2) return NULL;
    /* y2 = b (broadcast over rows), then y2 += x2 @ w inside the GEMM */
    if (b && ct_tensor_copy_(y2, b)) return NULL;
    if (ct_kernel_matmul_out(y2, x2, w, false, false, 1.0, b ? 1.0 : 0.0)) {
        ct_error_prefix("linear: ");
        return NULL;
    }
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = out;
    ct_tensor *y = ct_tensor_view(y2, x->ndim, shape);
    ct_tensor *inputs[3] = {x, w, b};
    if (!y || !ct_autograd_needed(3, (const ct_tensor *const *)inputs)) return y;
    ct_node *n = ct_node_new("linear", linear_backward, 3, inputs);
    if (!n) return NULL;
    linear_ctx *c = ct_node_ctx(n);
    *c = (linear_ctx){-1, -1};
    int k = 0;
    ct_status st = CT_OK;
    if (ct_node_input_needs_grad(n, 1) && !(st = ct_node_save(n, x2, false))) c->ix = (int8_t)k++;
    if (!st && ct_node_input_needs_grad(n, 0) && !(st = ct_node_save(n, w, false))) c->iw = (int8_t)k++;
    if (st) {
        ct_node_discard(n);
        return NULL;
    }
    return ct_node_attach(n, y) ? NULL : y;
}
