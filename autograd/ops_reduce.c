/* Differentiable reductions: sum, mean, max, min, var.
 *
 * The kernel checks the dims and names the op; once it has succeeded the dims
 * are valid and are recorded in the node as a bit mask over x's dims. Backward
 * views gy with x's rank (reduced dims as size 1, whether or not keepdim was
 * asked for) and broadcasts it back over x's shape.
 */
#include <string.h>

#include "autograd/autocast_cast_internal.h"
#include "autograd/node.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

typedef struct {
    uint32_t mask;      /* bit d: dim d of x was reduced */
    int64_t correction; /* var */
    int nkept;          /* max/min: dims of x not reduced */
    int perm[CT_MAX_DIMS];
} reduce_ctx;

/* Valid dims (the kernel has checked them) as a bit mask over an ndim-d tensor. */
static uint32_t dims_mask(int ndim, const int *dims, int ndims)
{
    if (ndims == 0) return ndim ? (uint32_t)((1u << ndim) - 1) : 0u;
    uint32_t m = 0;
    for (int i = 0; ndim && i < ndims; i++) m |= 1u << (dims[i] < 0 ? dims[i] + ndim : dims[i]);
    return m;
}

static int64_t reduced_count(const ct_tensor *meta, uint32_t mask)
{
    int64_t n = 1;
    for (int d = 0; d < meta->ndim; d++)
        if ((mask >> d) & 1) n *= meta->shape[d];
    return n;
}

/* gy viewed with x's rank: reduced dims have size 1. */
static ct_tensor *grad_keepdim(ct_tensor *gy, const ct_tensor *meta, uint32_t mask)
{
    int64_t shape[CT_MAX_DIMS];
    for (int d = 0; d < meta->ndim; d++) shape[d] = (mask >> d) & 1 ? 1 : meta->shape[d];
    return ct_tensor_reshape(gy, meta->ndim, shape);
}

static ct_tensor *record(ct_tensor *y, ct_tensor *x, const char *op, ct_backward_fn fn, const reduce_ctx *c,
                         ct_tensor *saved, bool saved_is_output)
{
    ct_node *n = ct_node_new(op, fn, 1, &x);
    if (!n) return NULL;
    memcpy(ct_node_ctx(n), c, sizeof *c);
    if (saved && ct_node_save(n, saved, saved_is_output)) {
        ct_node_discard(n);
        return NULL;
    }
    return ct_node_attach(n, y) ? NULL : y;
}

static bool needs_node(ct_tensor *y, ct_tensor *x)
{
    return y && ct_dtype_is_float(y->dtype) && ct_autograd_needed(1, (const ct_tensor *const *)&x);
}

/* ---- sum, mean -------------------------------------------------------------------- */

/* dx = broadcast(gy) (sum), broadcast(gy) / N (mean); a fresh contiguous tensor */
static ct_status sum_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const reduce_ctx *c = ct_node_ctx(n);
    const ct_tensor *m = ct_node_input_meta(n, 0);
    ct_tensor *g = ct_tensor_expand(grad_keepdim(gy, m, c->mask), m->ndim, m->shape);
    gx[0] = ct_tensor_contiguous(g);
    return gx[0] ? CT_OK : ct_last_status();
}

static ct_status mean_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const reduce_ctx *c = ct_node_ctx(n);
    const ct_tensor *m = ct_node_input_meta(n, 0);
    int64_t count = reduced_count(m, c->mask);
    ct_tensor *g = ct_tensor_expand(grad_keepdim(gy, m, c->mask), m->ndim, m->shape);
    gx[0] = ct_kernel_binary_scalar(CT_BINARY_MUL, g, count ? 1.0 / (double)count : 0.0);
    return gx[0] ? CT_OK : ct_last_status();
}

ct_tensor *ct_sum(ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    x = cti_autocast_arg(CT_AC_REDUCTION, x);
    ct_tensor *y = ct_kernel_sum(x, dims, ndims, keepdim);
    if (!needs_node(y, x)) return y;
    reduce_ctx c = {.mask = dims_mask(x->ndim, dims, ndims)};
    return record(y, x, "sum", sum_backward, &c, NULL, false);
}

ct_tensor *ct_mean(ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    x = cti_autocast_arg(CT_AC_REDUCTION, x);
    ct_tensor *y = ct_kernel_mean(x, dims, ndims, keepdim);
    if (!needs_node(y, x)) return y;
    reduce_ctx c = {.mask = dims_mask(x->ndim, dims, ndims)};
    return record(y, x, "mean", mean_backward, &c, NULL, false);
}

ct_tensor *ct_sum_all(ct_tensor *x) { return ct_sum(x, NULL, 0, false); }
ct_tensor *ct_mean_all(ct_tensor *x) { return ct_mean(x, NULL, 0, false); }

/* ---- var ------------------------------------------------------------------------------ */

/* dx = gy * 2 (x - mean) / (N - correction); x saved, mean recomputed */
static ct_status var_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const reduce_ctx *c = ct_node_ctx(n);
    const ct_tensor *m = ct_node_input_meta(n, 0);
    ct_tensor *x = ct_node_saved(n, 0);
    int dims[CT_MAX_DIMS], nd = 0;
    for (int d = 0; d < m->ndim; d++)
        if ((c->mask >> d) & 1) dims[nd++] = d;
    /* nd == 0 only for a 0-d x, where "every dim" is what we want */
    ct_tensor *xm = ct_kernel_binary(CT_BINARY_SUB, x, ct_kernel_mean(x, dims, nd, true));
    double denom = (double)(reduced_count(m, c->mask) - c->correction);
    ct_tensor *g = ct_kernel_binary_scalar(CT_BINARY_MUL, grad_keepdim(gy, m, c->mask), 2.0 / denom);
    gx[0] = ct_kernel_binary(CT_BINARY_MUL, g, xm);
    return gx[0] ? CT_OK : ct_last_status();
}

ct_tensor *ct_var(ct_tensor *x, const int *dims, int ndims, int64_t correction, bool keepdim)
{
    x = cti_autocast_arg(CT_AC_REDUCTION, x);
    ct_tensor *y = ct_kernel_var(x, dims, ndims, correction, keepdim);
    if (!needs_node(y, x)) return y;
    reduce_ctx c = {.mask = dims_mask(x->ndim, dims, ndims), .correction = correction};
    return record(y, x, "var", var_backward, &c, x, false);
}

/* ---- max, min ----------------------------------------------------------------------- */

/* Forward saves idx (kept..., 1), i64: the position of the first extreme element
 * among the reduced elements in row-major order, found by argmax over x permuted
 * to (kept..., reduced...) and flattened to (kept..., R). Backward scatters:
 *   dx_p (kept..., R) = (arange(R) == idx) ? gy : 0, then back to x's layout. */
static ct_status extreme_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const reduce_ctx *c = ct_node_ctx(n);
    const ct_tensor *m = ct_node_input_meta(n, 0);
    ct_tensor *idx = ct_node_saved(n, 0);
    int64_t pshape[CT_MAX_DIMS];
    int inv[CT_MAX_DIMS];
    for (int d = 0; d < m->ndim; d++) {
        pshape[d] = m->shape[c->perm[d]];
        inv[c->perm[d]] = d;
    }
    int64_t R = reduced_count(m, c->mask);
    ct_tensor *hit = ct_kernel_binary(CT_BINARY_EQ, ct_tensor_to(ct_tensor_arange(CT_DTYPE_I64, 0, (double)R, 1), idx->device),
                                      idx);
    ct_tensor *g = ct_kernel_where(hit, ct_tensor_reshape(gy, idx->ndim, idx->shape),
                                   ct_tensor_full_on(gy->device, gy->dtype, 0, NULL, 0.0));
    g = ct_tensor_permute(ct_tensor_reshape(g, m->ndim, pshape), inv);
    gx[0] = ct_tensor_contiguous(g);
    return gx[0] ? CT_OK : ct_last_status();
}

static ct_tensor *extreme(bool is_max, ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    ct_tensor *y = is_max ? ct_kernel_max(x, dims, ndims, keepdim) : ct_kernel_min(x, dims, ndims, keepdim);
    if (!needs_node(y, x)) return y;
    reduce_ctx c = {.mask = dims_mask(x->ndim, dims, ndims)};
    int64_t fshape[CT_MAX_DIMS];
    int k = 0;
    for (int d = 0; d < x->ndim; d++)
        if (!((c.mask >> d) & 1)) fshape[k] = x->shape[d], c.perm[k++] = d;
    c.nkept = k;
    for (int d = 0; d < x->ndim; d++)
        if ((c.mask >> d) & 1) c.perm[k++] = d;
    fshape[c.nkept] = reduced_count(x, c.mask);
    /* argmax of -x is the first minimum (NaN stays NaN, so the first NaN either way) */
    ct_tensor *src = is_max ? x : ct_kernel_unary(CT_UNARY_NEG, x);
    ct_tensor *flat = ct_tensor_reshape(ct_tensor_permute(src, c.perm), c.nkept + 1, fshape);
    ct_tensor *idx = ct_kernel_argmax(flat, -1, true);
    if (!idx) return NULL;
    return record(y, x, is_max ? "max" : "min", extreme_backward, &c, idx, false);
}

ct_tensor *ct_max(ct_tensor *x, const int *dims, int ndims, bool keepdim) { return extreme(true, x, dims, ndims, keepdim); }
ct_tensor *ct_min(ct_tensor *x, const int *dims, int ndims, bool keepdim) { return extreme(false, x, dims, ndims, keepdim); }
