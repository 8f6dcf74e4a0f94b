/* Differentiable elementwise ops: binary with broadcasting, scalar forms, unary.
 *
 * Backward of a broadcasting binary op: each operand's gradient is computed at
 * the broadcast shape and summed back to the operand's shape
 * (ct_kernel_sum_to_shape); an operand that was not broadcast skips the sum.
 * Nodes save only what their backward reads, and only for the inputs that need
 * a gradient (mul saves b for da and a for db).
 */
#include "autograd/autocast_cast_internal.h"
#include "autograd/node.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

/* ---- helpers ----------------------------------------------------------------------- */

/* gy itself as a new reference in the current frame (identity backward). */
static ct_tensor *pass_through(ct_tensor *gy) { return ct_frame_adopt(ct_tensor_retain(gy)); }

/* g (at the broadcast shape) summed down to the shape of the recorded input. */
static ct_tensor *sum_to_input(ct_tensor *g, const ct_tensor *meta)
{
    if (!g) return NULL;
    if (ct_tensor_same_shape(g, meta)) return g;
    return ct_kernel_sum_to_shape(g, meta->ndim, meta->shape);
}

static ct_tensor *scalar_like(const ct_tensor *t, double v) { return ct_tensor_full_on(t->device, t->dtype, 0, NULL, v); }

static ct_status status_of(const ct_tensor *t) { return t ? CT_OK : ct_last_status(); }

/* ---- binary ------------------------------------------------------------------------- */

typedef struct {
    ct_binary_op op;
    int8_t ia, ib, iy; /* saved index of a, b, y; -1 when not saved */
} binary_ctx;

static ct_status binary_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const binary_ctx *c = ct_node_ctx(n);
    const ct_tensor *ma = ct_node_input_meta(n, 0), *mb = ct_node_input_meta(n, 1);
    ct_tensor *a = c->ia >= 0 ? ct_node_saved(n, c->ia) : NULL;
    ct_tensor *b = c->ib >= 0 ? ct_node_saved(n, c->ib) : NULL;
    ct_tensor *y = c->iy >= 0 ? ct_node_saved(n, c->iy) : NULL;
    bool need_a = ct_node_input_needs_grad(n, 0), need_b = ct_node_input_needs_grad(n, 1);
    ct_tensor *ga = NULL, *gb = NULL;
    switch (c->op) {
    case CT_BINARY_ADD:
        if (need_a) ga = pass_through(gy);
        if (need_b) gb = pass_through(gy);
        break;
    case CT_BINARY_SUB:
        if (need_a) ga = pass_through(gy);
        if (need_b) gb = ct_kernel_unary(CT_UNARY_NEG, gy);
        break;
    case CT_BINARY_MUL:
        if (need_a) ga = ct_kernel_binary(CT_BINARY_MUL, gy, b);
        if (need_b) gb = ct_kernel_binary(CT_BINARY_MUL, gy, a);
        break;
    case CT_BINARY_DIV: {
        /* y = a / b: da = g / b; db = -g a / b^2 = -(g / b) a / b */
        ct_tensor *g_b = ct_kernel_binary(CT_BINARY_DIV, gy, b);
        if (need_a) ga = g_b;
        if (need_b)
            gb = ct_kernel_unary(CT_UNARY_NEG,
                                 ct_kernel_binary(CT_BINARY_DIV, ct_kernel_binary(CT_BINARY_MUL, g_b, a), b));
        break;
    }
    case CT_BINARY_POW: {
        ct_tensor *zero = scalar_like(gy, 0.0);
        if (need_a) {
            /* da = g b a^(b-1), 0 where b == 0 (so 0^0 has slope 0, not NaN) */
            ct_tensor *t = ct_kernel_binary(CT_BINARY_POW, a, ct_kernel_binary_scalar(CT_BINARY_SUB, b, 1.0));
            t = ct_kernel_binary(CT_BINARY_MUL, ct_kernel_binary(CT_BINARY_MUL, t, b), gy);
            ga = ct_kernel_where(ct_kernel_binary_scalar(CT_BINARY_EQ, b, 0.0), zero, t);
        }
        if (need_b) {
            /* db = g y ln(a), 0 where a == 0 and b >= 0 (y is then 0 or 1 and flat in b) */
            ct_tensor *t = ct_kernel_binary(CT_BINARY_MUL, ct_kernel_binary(CT_BINARY_MUL, gy, y),
                                            ct_kernel_unary(CT_UNARY_LOG, a));
            ct_tensor *flat = ct_kernel_binary(CT_BINARY_MIN, ct_kernel_binary_scalar(CT_BINARY_EQ, a, 0.0),
                                               ct_kernel_binary_scalar(CT_BINARY_GE, b, 0.0));
            gb = ct_kernel_where(flat, zero, t);
        }
        break;
    }
    case CT_BINARY_MAX:
    case CT_BINARY_MIN: {
        /* torch.maximum's rule: the winner gets g, the loser 0, a tie g/2 each */
        ct_tensor *h = ct_kernel_where(ct_kernel_binary(CT_BINARY_EQ, a, b),
                                       ct_kernel_binary_scalar(CT_BINARY_MUL, gy, 0.5), gy);
        ct_tensor *zero = scalar_like(gy, 0.0);
        ct_binary_op a_loses = c->op == CT_BINARY_MAX ? CT_BINARY_LT : CT_BINARY_GT;
        ct_binary_op b_loses = c->op == CT_BINARY_MAX ? CT_BINARY_GT : CT_BINARY_LT;
        if (need_a) ga = ct_kernel_where(ct_kernel_binary(a_loses, a, b), zero, h);
        if (need_b) gb = ct_kernel_where(ct_kernel_binary(b_loses, a, b), zero, h);
        break;
    }
    default:
        return ct_error_set(CT_ERR_INTERNAL, "%s backward: unexpected op %d", ct_node_op(n), (int)c->op);
    }
    if (need_a && !(gx[0] = sum_to_input(ga, ma))) return ct_last_status();
    if (need_b && !(gx[1] = sum_to_input(gb, mb))) return ct_last_status();
    return CT_OK;
}

static ct_tensor *binary(ct_binary_op op, ct_tensor *a, ct_tensor *b)
{
    cti_autocast_pair(CT_AC_BINARY, &a, &b);
    ct_tensor *y = ct_kernel_binary(op, a, b);
    ct_tensor *in[2] = {a, b};
    if (!y || !ct_autograd_needed(2, (const ct_tensor *const *)in)) return y;
    ct_node *n = ct_node_new(ct_binary_op_name(op), binary_backward, 2, in);
    if (!n) return NULL;
    binary_ctx *c = ct_node_ctx(n);
    *c = (binary_ctx){op, -1, -1, -1};
    bool need_a = ct_node_input_needs_grad(n, 0), need_b = ct_node_input_needs_grad(n, 1);
    bool save_a = false, save_b = false, save_y = false;
    switch (op) {
    case CT_BINARY_MUL: save_a = need_b, save_b = need_a; break;
    case CT_BINARY_DIV: save_a = need_b, save_b = true; break;
    case CT_BINARY_POW: save_a = save_b = true, save_y = need_b; break;
    case CT_BINARY_MAX:
    case CT_BINARY_MIN: save_a = save_b = true; break;
    default: break;
    }
    int k = 0;
    ct_status st = CT_OK;
    if (save_a && !(st = ct_node_save(n, a, false))) c->ia = (int8_t)k++;
    if (!st && save_b && !(st = ct_node_save(n, b, false))) c->ib = (int8_t)k++;
    if (!st && save_y && !(st = ct_node_save(n, y, true))) c->iy = (int8_t)k++;
    if (st) {
        ct_node_discard(n);
        return NULL;
    }
    return ct_node_attach(n, y) ? NULL : y;
}

ct_tensor *ct_add(ct_tensor *a, ct_tensor *b) { return binary(CT_BINARY_ADD, a, b); }
ct_tensor *ct_sub(ct_tensor *a, ct_tensor *b) { return binary(CT_BINARY_SUB, a, b); }
ct_tensor *ct_mul(ct_tensor *a, ct_tensor *b) { return binary(CT_BINARY_MUL, a, b); }
ct_tensor *ct_div(ct_tensor *a, ct_tensor *b) { return binary(CT_BINARY_DIV, a, b); }
ct_tensor *ct_pow(ct_tensor *a, ct_tensor *b) { return binary(CT_BINARY_POW, a, b); }
ct_tensor *ct_maximum(ct_tensor *a, ct_tensor *b) { return binary(CT_BINARY_MAX, a, b); }
ct_tensor *ct_minimum(ct_tensor *a, ct_tensor *b) { return binary(CT_BINARY_MIN, a, b); }

/* ---- with a scalar ---------------------------------------------------------------- */

typedef enum { SC_ADD, SC_MUL, SC_DIV, SC_POW, SC_RSUB, SC_RDIV } scalar_kind;

typedef struct {
    scalar_kind kind;
    double s;
} scalar_ctx;

static ct_status scalar_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const scalar_ctx *c = ct_node_ctx(n);
    ct_tensor *x = ct_node_saved(n, 0);
    switch (c->kind) {
    case SC_ADD: gx[0] = pass_through(gy); break;
    case SC_MUL: gx[0] = ct_kernel_binary_scalar(CT_BINARY_MUL, gy, c->s); break;
    case SC_DIV: gx[0] = ct_kernel_binary_scalar(CT_BINARY_DIV, gy, c->s); break;
    case SC_RSUB: gx[0] = ct_kernel_unary(CT_UNARY_NEG, gy); break;
    case SC_POW:
        /* dx = g p x^(p-1); p == 0 is flat everywhere (x^0 = 1, even at 0) */
        if (c->s == 0.0) {
            gx[0] = ct_tensor_zeros_on(gy->device, gy->dtype, gy->ndim, gy->shape);
        } else {
            ct_tensor *t = ct_kernel_binary_scalar(CT_BINARY_POW, x, c->s - 1.0);
            gx[0] = ct_kernel_binary(CT_BINARY_MUL, gy, ct_kernel_binary_scalar(CT_BINARY_MUL, t, c->s));
        }
        break;
    case SC_RDIV:
        /* y = s / x: dx = -s g / x^2 */
        gx[0] = ct_kernel_binary_scalar(CT_BINARY_MUL,
                                        ct_kernel_binary(CT_BINARY_DIV, gy, ct_kernel_binary(CT_BINARY_MUL, x, x)),
                                        -c->s);
        break;
    }
    return status_of(gx[0]);
}

static ct_tensor *scalar_op(scalar_kind kind, ct_tensor *x, double s)
{
    ct_tensor *y = NULL;
    switch (kind) {
    case SC_ADD: y = ct_kernel_binary_scalar(CT_BINARY_ADD, x, s); break;
    case SC_MUL: y = ct_kernel_binary_scalar(CT_BINARY_MUL, x, s); break;
    case SC_DIV: y = ct_kernel_binary_scalar(CT_BINARY_DIV, x, s); break;
    case SC_POW: y = ct_kernel_binary_scalar(CT_BINARY_POW, x, s); break;
    case SC_RSUB: y = ct_kernel_rbinary_scalar(CT_BINARY_SUB, s, x); break;
    case SC_RDIV: y = ct_kernel_rbinary_scalar(CT_BINARY_DIV, s, x); break;
    }
    if (!y || !ct_autograd_needed(1, (const ct_tensor *const *)&x)) return y;
    static const char *const names[] = {"add_scalar", "mul_scalar", "div_scalar",
                                        "pow_scalar", "rsub_scalar", "rdiv_scalar"};
    ct_node *n = ct_node_new(names[kind], scalar_backward, 1, &x);
    if (!n) return NULL;
    *(scalar_ctx *)ct_node_ctx(n) = (scalar_ctx){kind, s};
    if ((kind == SC_POW || kind == SC_RDIV) && ct_node_save(n, x, false)) {
        ct_node_discard(n);
        return NULL;
    }
    return ct_node_attach(n, y) ? NULL : y;
}

ct_tensor *ct_add_scalar(ct_tensor *x, double s) { return scalar_op(SC_ADD, x, s); }
ct_tensor *ct_mul_scalar(ct_tensor *x, double s) { return scalar_op(SC_MUL, x, s); }
ct_tensor *ct_div_scalar(ct_tensor *x, double s) { return scalar_op(SC_DIV, x, s); }
ct_tensor *ct_pow_scalar(ct_tensor *x, double p) { return scalar_op(SC_POW, x, p); }
ct_tensor *ct_rsub_scalar(double s, ct_tensor *x) { return scalar_op(SC_RSUB, x, s); }
ct_tensor *ct_rdiv_scalar(double s, ct_tensor *x) { return scalar_op(SC_RDIV, x, s); }

/* ---- unary ------------------------------------------------------------------------- */

/* exp, tanh and sigmoid differentiate from their output; neg needs nothing; the
 * rest from their input. */
static bool uses_output(ct_unary_op op)
{
    return op == CT_UNARY_EXP || op == CT_UNARY_TANH || op == CT_UNARY_SIGMOID;
}

static ct_status unary_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    ct_unary_op op = *(const ct_unary_op *)ct_node_ctx(n);
    if (op == CT_UNARY_NEG) {
        gx[0] = ct_kernel_unary(CT_UNARY_NEG, gy);
    } else {
        ct_tensor *s = ct_node_saved(n, 0);
        gx[0] = uses_output(op) ? ct_kernel_unary_backward(op, gy, NULL, s) : ct_kernel_unary_backward(op, gy, s, NULL);
    }
    return status_of(gx[0]);
}

static ct_tensor *unary(ct_unary_op op, ct_tensor *x)
{
    ct_tensor *y = ct_kernel_unary(op, x);
    if (!y || !ct_autograd_needed(1, (const ct_tensor *const *)&x)) return y;
    ct_node *n = ct_node_new(ct_unary_op_name(op), unary_backward, 1, &x);
    if (!n) return NULL;
    *(ct_unary_op *)ct_node_ctx(n) = op;
    ct_status st = CT_OK;
    if (op != CT_UNARY_NEG) st = uses_output(op) ? ct_node_save(n, y, true) : ct_node_save(n, x, false);
    if (st) {
        ct_node_discard(n);
        return NULL;
    }
    return ct_node_attach(n, y) ? NULL : y;
}

ct_tensor *ct_neg(ct_tensor *x) { return unary(CT_UNARY_NEG, x); }
ct_tensor *ct_exp(ct_tensor *x) { return unary(CT_UNARY_EXP, x); }
ct_tensor *ct_log(ct_tensor *x) { return unary(CT_UNARY_LOG, x); }
ct_tensor *ct_sqrt(ct_tensor *x) { return unary(CT_UNARY_SQRT, x); }
ct_tensor *ct_rsqrt(ct_tensor *x) { return unary(CT_UNARY_RSQRT, x); }
ct_tensor *ct_tanh(ct_tensor *x) { return unary(CT_UNARY_TANH, x); }
ct_tensor *ct_sigmoid(ct_tensor *x) { return unary(CT_UNARY_SIGMOID, x); }
ct_tensor *ct_relu(ct_tensor *x) { return unary(CT_UNARY_RELU, x); }
ct_tensor *ct_gelu(ct_tensor *x) { return unary(CT_UNARY_GELU_TANH, x); }
ct_tensor *ct_gelu_erf(ct_tensor *x) { return unary(CT_UNARY_GELU_ERF, x); }
ct_tensor *ct_silu(ct_tensor *x) { return unary(CT_UNARY_SILU, x); }
ct_tensor *ct_abs(ct_tensor *x) { return unary(CT_UNARY_ABS, x); }
