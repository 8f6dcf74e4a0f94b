/* Differentiable views, reshapes, concatenation and casts. Forward is the core
 * view function (core/view.c), so a result shares x's storage; the node makes
 * the view differentiable. Backward hands gy back in x's layout, as a view of
 * gy where one exists (reshape, permute, concat) to save a copy. */
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "autograd/ops_shape.h"
#include "core/frame.h"
#include "kernels/dispatch_internal.h"
#include "kernels/reduce.h"

/* Attaches a node with one input x and ctx (csize bytes) to y. */
static ct_tensor *record(ct_tensor *y, ct_tensor *x, const char *op, ct_backward_fn fn, const void *ctx,
                         size_t csize)
{
    if (!y || !ct_autograd_needed(1, (const ct_tensor *const *)&x)) return y;
    ct_node *n = ct_node_new(op, fn, 1, &x);
    if (!n) return NULL;
    if (csize) memcpy(ct_node_ctx(n), ctx, csize);
    return ct_node_attach(n, y) ? NULL : y;
}

static ct_status done(ct_tensor *g) { return g ? CT_OK : ct_last_status(); }

/* ---- reshapes --------------------------------------------------------------------------- */

static ct_status reshape_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const ct_tensor *m = ct_node_input_meta(n, 0);
    return done(gx[0] = ct_tensor_reshape(gy, m->ndim, m->shape));
}

ct_tensor *ct_view(ct_tensor *x, int ndim, const int64_t *shape)
{
    return record(ct_tensor_view(x, ndim, shape), x, "view", reshape_backward, NULL, 0);
}

ct_tensor *ct_reshape(ct_tensor *x, int ndim, const int64_t *shape)
{
    return record(ct_tensor_reshape(x, ndim, shape), x, "reshape", reshape_backward, NULL, 0);
}

ct_tensor *ct_flatten(ct_tensor *x) { return record(ct_tensor_flatten(x), x, "flatten", reshape_backward, NULL, 0); }

ct_tensor *ct_squeeze(ct_tensor *x, int dim)
{
    return record(ct_tensor_squeeze(x, dim), x, "squeeze", reshape_backward, NULL, 0);
}

ct_tensor *ct_unsqueeze(ct_tensor *x, int dim)
{
    return record(ct_tensor_unsqueeze(x, dim), x, "unsqueeze", reshape_backward, NULL, 0);
}

/* ---- permutations ------------------------------------------------------------------------ */

typedef struct {
    int inv[CT_MAX_DIMS]; /* gx = permute(gy, inv) */
} permute_ctx;

static ct_status permute_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const permute_ctx *c = ct_node_ctx(n);
    return done(gx[0] = ct_tensor_permute(gy, c->inv));
}

ct_tensor *ct_transpose(ct_tensor *x, int d0, int d1)
{
    ct_tensor *y = ct_tensor_transpose(x, d0, d1);
    if (!y) return NULL;
    permute_ctx c;
    for (int d = 0; d < x->ndim; d++) c.inv[d] = d;
    d0 = d0 < 0 ? d0 + x->ndim : d0;
    d1 = d1 < 0 ? d1 + x->ndim : d1;
    c.inv[d0] = d1, c.inv[d1] = d0;
    return record(y, x, "transpose", permute_backward, &c, sizeof c);
}

ct_tensor *ct_permute(ct_tensor *x, const int *dims)
{
    ct_tensor *y = ct_tensor_permute(x, dims);
    if (!y) return NULL;
    permute_ctx c;
    for (int i = 0; i < x->ndim; i++) c.inv[dims[i] < 0 ? dims[i] + x->ndim : dims[i]] = i;
    return record(y, x, "permute", permute_backward, &c, sizeof c);
}

/* ---- sub-views ----------------------------------------------------------------------------- */

typedef enum { SUB_SLICE, SUB_NARROW, SUB_SELECT } sub_kind;

typedef struct {
    sub_kind kind;
    int dim;
    int64_t a, b, step; /* the call's arguments, replayed on the gradient */
} sub_ctx;

static ct_tensor *sub_view(ct_tensor *t, const sub_ctx *c)
{
    switch (c->kind) {
    case SUB_SLICE: return ct_tensor_slice(t, c->dim, c->a, c->b, c->step);
    case SUB_NARROW: return ct_tensor_narrow(t, c->dim, c->a, c->b);
    case SUB_SELECT: return ct_tensor_select(t, c->dim, c->a);
    }
    return NULL;
}

/* gx = zeros of x's shape with gy written into the same sub-view of it */
static ct_status sub_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const ct_tensor *m = ct_node_input_meta(n, 0);
    ct_tensor *g = ct_tensor_zeros_on(m->device, m->dtype, m->ndim, m->shape);
    ct_tensor *v = g ? sub_view(g, ct_node_ctx(n)) : NULL;
    if (!v || ct_tensor_copy_(v, gy)) return ct_last_status();
    gx[0] = g;
    return CT_OK;
}

static ct_tensor *sub(ct_tensor *x, const char *op, sub_ctx c)
{
    return record(sub_view(x, &c), x, op, sub_backward, &c, sizeof c);
}

ct_tensor *ct_slice(ct_tensor *x, int dim, int64_t start, int64_t end, int64_t step)
{
    return sub(x, "slice", (sub_ctx){SUB_SLICE, dim, start, end, step});
}

ct_tensor *ct_narrow(ct_tensor *x, int dim, int64_t start, int64_t length)
{
    return sub(x, "narrow", (sub_ctx){SUB_NARROW, dim, start, length, 1});
}

ct_tensor *ct_select(ct_tensor *x, int dim, int64_t index)
{
    return sub(x, "select", (sub_ctx){SUB_SELECT, dim, index, 0, 1});
}

/* ---- expand ---------------------------------------------------------------------------------- */

static ct_status expand_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const ct_tensor *m = ct_node_input_meta(n, 0);
    return done(gx[0] = ct_kernel_sum_to_shape(gy, m->ndim, m->shape));
}

ct_tensor *ct_expand(ct_tensor *x, int ndim, const int64_t *shape)
{
    return record(ct_tensor_expand(x, ndim, shape), x, "expand", expand_backward, NULL, 0);
}

/* ---- copies and casts ---------------------------------------------------------------------- */

static ct_status identity_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    (void)n;
    gx[0] = ct_frame_adopt(ct_tensor_retain(gy));
    return CT_OK;
}

ct_tensor *ct_contiguous(ct_tensor *x)
{
    if (!x) return NULL;
    if (ct_tensor_is_contiguous(x)) return ct_frame_adopt(ct_tensor_retain(x));
    return record(ct_tensor_clone(x), x, "contiguous", identity_backward, NULL, 0);
}

ct_tensor *ct_clone(ct_tensor *x) { return record(ct_tensor_clone(x), x, "clone", identity_backward, NULL, 0); }

static ct_status cast_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    return done(gx[0] = ct_tensor_cast(gy, ct_node_input_meta(n, 0)->dtype));
}

ct_tensor *ct_cast(ct_tensor *x, ct_dtype dt)
{
    ct_tensor *y = ct_tensor_cast(x, dt);
    if (!y || !ct_dtype_is_float(dt)) return y;
    return record(y, x, "cast", cast_backward, NULL, 0);
}

/* ---- concat, stack ----------------------------------------------------------------------- */

/* gx[i] = gy narrowed to input i's extent along dim (a view) */
static ct_status concat_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    int dim = *(const int *)ct_node_ctx(n);
    int64_t off = 0;
    for (int i = 0; i < ct_node_ninputs(n); i++) {
        int64_t len = ct_node_input_meta(n, i)->shape[dim];
        if (ct_node_input_needs_grad(n, i) && !(gx[i] = ct_tensor_narrow(gy, dim, off, len))) return ct_last_status();
        off += len;
    }
    return CT_OK;
}

/* Checks the inputs of concat; normalises *dim. */
static ct_status concat_check(int n, ct_tensor *const *ts, int *dim)
{
    char d0[200], di[200];
    if (n < 1 || !ts) return ct_error_set(CT_ERR_INVALID, "concat: needs at least one tensor (n = %d)", n);
    for (int i = 0; i < n; i++)
        if (!ts[i]) return ct_last_status() ? ct_last_status() : ct_error_set(CT_ERR_INVALID, "concat: tensor %d is NULL", i);
    const ct_tensor *t0 = ts[0];
    int d = *dim < 0 ? *dim + t0->ndim : *dim;
    if (t0->ndim < 1 || d < 0 || d >= t0->ndim)
        return ct_error_set(CT_ERR_INVALID, "concat: dim %d out of range for %s", *dim,
                            ct_tensor_describe(t0, d0, sizeof d0));
    ct_status st = cti_kernel_same_device("concat", (const ct_tensor *const *)ts, n);
    if (st) return st;
    for (int i = 1; i < n; i++) {
        const ct_tensor *t = ts[i];
        bool ok = t->ndim == t0->ndim && t->dtype == t0->dtype;
        for (int k = 0; ok && k < t0->ndim; k++) ok = k == d || t->shape[k] == t0->shape[k];
        if (!ok)
            return ct_error_set(CT_ERR_INVALID,
                                "concat: tensor %d %s does not match tensor 0 %s (same dtype and sizes except dim %d)",
                                i, ct_tensor_describe(t, di, sizeof di), ct_tensor_describe(t0, d0, sizeof d0), d);
    }
    *dim = d;
    return CT_OK;
}

/* Forward copy into one new tensor, with a node over all n (<= CT_NODE_MAX_INPUTS when recording). */
static ct_tensor *concat_direct(int n, ct_tensor *const *ts, int dim, bool record_node)
{
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, ts[0]->shape, sizeof shape);
    shape[dim] = 0;
    for (int i = 0; i < n; i++) shape[dim] += ts[i]->shape[dim];
    ct_tensor *y = ct_tensor_empty_on(ts[0]->device, ts[0]->dtype, ts[0]->ndim, shape);
    if (!y) return NULL;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        ct_frame_push();
        ct_tensor *v = ct_tensor_narrow(y, dim, off, ts[i]->shape[dim]);
        ct_status st = v ? ct_tensor_copy_(v, ts[i]) : ct_last_status();
        ct_frame_pop();
        if (st) return NULL;
        off += ts[i]->shape[dim];
    }
    if (!record_node) return y;
    ct_node *nd = ct_node_new("concat", concat_backward, n, ts);
    if (!nd) return NULL;
    *(int *)ct_node_ctx(nd) = dim;
    return ct_node_attach(nd, y) ? NULL : y;
}

ct_tensor *ct_concat(int n, ct_tensor *const *tensors, int dim)
{
    if (concat_check(n, tensors, &dim)) return NULL;
    bool grad = ct_autograd_needed(n, (const ct_tensor *const *)tensors);
    if (!grad || n <= CT_NODE_MAX_INPUTS) return concat_direct(n, tensors, dim, grad);
    /* a node has at most CT_NODE_MAX_INPUTS edges: join groups first, then the groups */
    int ng = (n + CT_NODE_MAX_INPUTS - 1) / CT_NODE_MAX_INPUTS;
    ct_tensor **groups = malloc((size_t)ng * sizeof *groups);
    if (!groups) {
        ct_error_set(CT_ERR_NOMEM, "concat: out of memory for %d groups", ng);
        return NULL;
    }
    ct_tensor *y = NULL;
    int i = 0;
    for (; i < ng; i++) {
        int lo = i * CT_NODE_MAX_INPUTS, cnt = n - lo < CT_NODE_MAX_INPUTS ? n - lo : CT_NODE_MAX_INPUTS;
        if (!(groups[i] = ct_concat(cnt, tensors + lo, dim))) break;
    }
    if (i == ng) y = ct_concat(ng, groups, dim);
    free(groups);
    return y;
}

ct_tensor *ct_stack(int n, ct_tensor *const *tensors, int dim)
{
    char d0[200], di[200];
    if (n < 1 || !tensors) {
        ct_error_set(CT_ERR_INVALID, "stack: needs at least one tensor (n = %d)", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!tensors[i]) return NULL;
    const ct_tensor *t0 = tensors[0];
    int d = dim < 0 ? dim + t0->ndim + 1 : dim;
    if (d < 0 || d > t0->ndim || t0->ndim >= CT_MAX_DIMS) {
        ct_error_set(CT_ERR_INVALID, "stack: dim %d out of range for %s", dim, ct_tensor_describe(t0, d0, sizeof d0));
        return NULL;
    }
    for (int i = 1; i < n; i++) {
        if (!ct_tensor_same_shape(tensors[i], t0) || tensors[i]->dtype != t0->dtype) {
            ct_error_set(CT_ERR_INVALID, "stack: tensor %d %s does not match tensor 0 %s (one shape and dtype)", i,
                         ct_tensor_describe(tensors[i], di, sizeof di), ct_tensor_describe(t0, d0, sizeof d0));
            return NULL;
        }
    }
    ct_tensor **u = malloc((size_t)n * sizeof *u);
    if (!u) {
        ct_error_set(CT_ERR_NOMEM, "stack: out of memory for %d tensors", n);
        return NULL;
    }
    ct_tensor *y = NULL;
    int i = 0;
    for (; i < n; i++)
        if (!(u[i] = ct_unsqueeze(tensors[i], d))) break;
    if (i == n) y = ct_concat(n, u, d);
    free(u);
    return y;
}
