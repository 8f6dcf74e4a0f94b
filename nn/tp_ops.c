/* ctrain — tensor-parallel communication ops (nn/tp_ops.h).
 *
 * The collectives work on contiguous buffers; gathering or scattering along a dim
 * other than the first is done by viewing the tensor as (A, S, B) (A the product of
 * the dims before dim, S its size, B the product after) and permuting the rank axis:
 *   all-gather: buffer (n, A, s, B) from the group -> permute (A, n, s, B) -> (A, n*s, B)
 *   reduce-scatter: x (A, n, s, B) -> permute (n, A, s, B) -> block r of the sum (A, s, B)
 */
#include "nn/tp_ops.h"

#include "autograd/node.h"
#include "core/frame.h"

typedef struct {
    ct_pg *g; /* borrowed: it must outlive the graph */
    int dim;
} tp_ctx;

/* The op's context for messages: "tp_split (rank 1 of 2, x f32[4, 6])". */
static ct_status fail_prefix(const char *op, ct_pg *g, const ct_tensor *x)
{
    char a[160];
    return ct_error_prefix("%s (rank %d of %d, x %s): ", op, ct_pg_rank(g), ct_pg_size(g),
                           x ? ct_tensor_describe(x, a, sizeof a) : "NULL");
}

static ct_status check(const char *op, ct_pg *g, const ct_tensor *x, int *dim)
{
    char a[160];
    if (!g) return ct_error_set(CT_ERR_INVALID, "%s: NULL process group", op);
    if (x->dtype != CT_DTYPE_F32 && x->dtype != CT_DTYPE_F64 && x->dtype != CT_DTYPE_BF16 &&
        x->dtype != CT_DTYPE_F16)
        return ct_error_set(CT_ERR_INVALID, "%s (rank %d of %d): x %s: dtype %s; want f32, f64, bf16 or f16", op,
                            ct_pg_rank(g), ct_pg_size(g), ct_tensor_describe(x, a, sizeof a), ct_dtype_name(x->dtype));
    if (x->device.type != CT_DEVICE_CPU)
        return ct_error_set(CT_ERR_UNSUPPORTED, "%s (rank %d of %d): x %s: only CPU tensors are supported", op,
                            ct_pg_rank(g), ct_pg_size(g), ct_tensor_describe(x, a, sizeof a));
    if (dim) {
        int d = *dim < 0 ? *dim + x->ndim : *dim;
        if (x->ndim < 1 || d < 0 || d >= x->ndim)
            return ct_error_set(CT_ERR_INVALID, "%s (rank %d of %d): dim %d is out of range for x %s", op,
                                ct_pg_rank(g), ct_pg_size(g), *dim, ct_tensor_describe(x, a, sizeof a));
        *dim = d;
    }
    return CT_OK;
}

/* (A, S, B) of x around dim */
static void around(const ct_tensor *x, int dim, int64_t *A, int64_t *S, int64_t *B)
{
    *A = 1, *B = 1;
    for (int i = 0; i < dim; i++) *A *= x->shape[i];
    for (int i = dim + 1; i < x->ndim; i++) *B *= x->shape[i];
    *S = x->shape[dim];
}

/* ---- the collectives, without autograd -------------------------------------------- */

static ct_tensor *allreduce_sum(ct_pg *g, ct_tensor *x)
{
    ct_tensor *in = ct_tensor_contiguous(x), *out = ct_tensor_empty_like(x);
    if (!in || !out || ct_work_run(ct_pg_allreduce_out(g, out, in, CT_REDUCE_SUM))) return NULL;
    return out;
}

static ct_tensor *gather_dim(ct_pg *g, ct_tensor *x, int dim)
{
    int n = ct_pg_size(g);
    int64_t A, s, B;
    around(x, dim, &A, &s, &B);
    ct_tensor *in = ct_tensor_contiguous(x);
    ct_tensor *buf = ct_tensor_empty(x->dtype, 4, (const int64_t[]){n, A, s, B});
    if (!in || !buf || ct_work_run(ct_pg_allgather(g, buf, in))) return NULL;
    int64_t shape[CT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[dim] *= n;
    if (A == 1) return ct_tensor_view(buf, x->ndim, shape);
    ct_tensor *p = ct_tensor_contiguous(ct_tensor_permute(buf, (const int[]){1, 0, 2, 3}));
    return ct_tensor_view(p, x->ndim, shape);
}

static ct_status check_divisible(const char *op, ct_pg *g, const ct_tensor *x, int dim)
{
    int n = ct_pg_size(g);
    if (x->shape[dim] % n) {
        char a[160];
        return ct_error_set(CT_ERR_INVALID, "%s (rank %d of %d): dim %d of x %s (%lld) is not a multiple of the %d ranks",
                            op, ct_pg_rank(g), n, dim, ct_tensor_describe(x, a, sizeof a), (long long)x->shape[dim], n);
    }
    return CT_OK;
}

static ct_tensor *split_dim(ct_pg *g, ct_tensor *x, int dim)
{
    int64_t s = x->shape[dim] / ct_pg_size(g);
    return ct_tensor_clone(ct_tensor_narrow(x, dim, ct_pg_rank(g) * s, s));
}

static ct_tensor *reduce_scatter_dim(ct_pg *g, ct_tensor *x, int dim)
{
    int n = ct_pg_size(g);
    int64_t A, S, B;
    around(x, dim, &A, &S, &B);
    int64_t s = S / n;
    ct_tensor *in = ct_tensor_contiguous(x);
    if (in && A > 1)
        in = ct_tensor_contiguous(
            ct_tensor_permute(ct_tensor_view(in, 4, (const int64_t[]){A, n, s, B}), (const int[]){1, 0, 2, 3}));
    int64_t shape[CT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[dim] = s;
    ct_tensor *out = ct_tensor_empty(x->dtype, x->ndim, shape);
    if (!in || !out || ct_work_run(ct_pg_reduce_scatter(g, out, in, CT_REDUCE_SUM))) return NULL;
    return out;
}

/* ---- autograd ------------------------------------------------------------------------ */

static ct_tensor *record(const char *op, ct_backward_fn bw, ct_pg *g, int dim, ct_tensor *x, ct_tensor *y)
{
    if (!y) {
        fail_prefix(op, g, x);
        return NULL;
    }
    if (!ct_autograd_needed(1, (const ct_tensor *const *)&x)) return y;
    ct_node *n = ct_node_new(op, bw, 1, &x);
    if (!n) return NULL;
    tp_ctx *c = ct_node_ctx(n);
    c->g = g, c->dim = dim;
    return ct_node_attach(n, y) ? NULL : y;
}

static ct_status backward_done(ct_node *n, ct_tensor *gy, ct_tensor *gx)
{
    if (gx) return CT_OK;
    char op[64];
    snprintf(op, sizeof op, "%s backward", ct_node_op(n));
    return fail_prefix(op, ((tp_ctx *)ct_node_ctx(n))->g, gy);
}

// dx = allreduce_sum(dy), overwritten
static ct_status copy_to_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    gx[0] = allreduce_sum(((tp_ctx *)ct_node_ctx(n))->g, gy);
    return backward_done(n, gy, gx[0]);
}

// dx = dy (a new tensor: the engine may accumulate into it)
static ct_status identity_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    gx[0] = ct_tensor_clone(gy);
    return backward_done(n, gy, gx[0]);
}

// dx = all-gather(dy) along dim
static ct_status gather_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const tp_ctx *c = ct_node_ctx(n);
    gx[0] = gather_dim(c->g, gy, c->dim);
    return backward_done(n, gy, gx[0]);
}

// dx = chunk r of dy along dim
static ct_status split_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const tp_ctx *c = ct_node_ctx(n);
    gx[0] = split_dim(c->g, gy, c->dim);
    return backward_done(n, gy, gx[0]);
}

// dx = chunk r of the sum over ranks of dy along dim
static ct_status reduce_scatter_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const tp_ctx *c = ct_node_ctx(n);
    gx[0] = reduce_scatter_dim(c->g, gy, c->dim);
    return backward_done(n, gy, gx[0]);
}

ct_tensor *ct_tp_copy_to(ct_pg *g, ct_tensor *x)
{
    const char *op = "tp_copy_to";
    if (!x || check(op, g, x, NULL)) return NULL;
    /* a new tensor object over x's data: the node belongs to it, not to x */
    return record(op, copy_to_backward, g, 0, x, ct_detach(x));
}

ct_tensor *ct_tp_reduce_from(ct_pg *g, ct_tensor *x)
{
    const char *op = "tp_reduce_from";
    if (!x || check(op, g, x, NULL)) return NULL;
    return record(op, identity_backward, g, 0, x, allreduce_sum(g, x));
}

ct_tensor *ct_tp_split(ct_pg *g, ct_tensor *x, int dim)
{
    const char *op = "tp_split";
    if (!x || check(op, g, x, &dim) || check_divisible(op, g, x, dim)) return NULL;
    return record(op, gather_backward, g, dim, x, split_dim(g, x, dim));
}

ct_tensor *ct_tp_scatter_to_sequence(ct_pg *g, ct_tensor *x, int dim)
{
    const char *op = "tp_scatter_to_sequence";
    if (!x || check(op, g, x, &dim) || check_divisible(op, g, x, dim)) return NULL;
    return record(op, gather_backward, g, dim, x, split_dim(g, x, dim));
}

ct_tensor *ct_tp_gather(ct_pg *g, ct_tensor *x, int dim)
{
    const char *op = "tp_gather";
    if (!x || check(op, g, x, &dim)) return NULL;
    return record(op, split_backward, g, dim, x, gather_dim(g, x, dim));
}

ct_tensor *ct_tp_gather_from_sequence(ct_pg *g, ct_tensor *x, int dim)
{
    const char *op = "tp_gather_from_sequence";
    if (!x || check(op, g, x, &dim)) return NULL;
    return record(op, reduce_scatter_backward, g, dim, x, gather_dim(g, x, dim));
}

ct_tensor *ct_tp_reduce_scatter_to_sequence(ct_pg *g, ct_tensor *x, int dim)
{
    const char *op = "tp_reduce_scatter_to_sequence";
    if (!x || check(op, g, x, &dim) || check_divisible(op, g, x, dim)) return NULL;
    return record(op, gather_backward, g, dim, x, reduce_scatter_dim(g, x, dim));
}
