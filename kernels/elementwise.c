/* Elementwise ops: argument checks, output allocation, per-device dispatch.
 * The math lives in kernels/cpu/binary.c and kernels/cpu/unary.c. */
#include "kernels/elementwise.h"

#include <math.h>

#include "core/frame.h"
#include "core/threads_internal.h"
#include "kernels/cpu/elementwise.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/elementwise.h"
#endif
#include "kernels/dispatch_internal.h"

typedef ct_status (*binary_fn)(ct_binary_op, ct_tensor *, const ct_tensor *, const ct_tensor *);
typedef ct_status (*binary_scalar_fn)(ct_binary_op, ct_tensor *, const ct_tensor *, double, bool);
typedef ct_status (*unary_fn)(ct_unary_op, ct_tensor *, const ct_tensor *);
typedef ct_status (*unary_backward_fn)(ct_unary_op, ct_tensor *, const ct_tensor *, const ct_tensor *,
                                       const ct_tensor *);
typedef ct_status (*where_fn)(ct_tensor *, const ct_tensor *, const ct_tensor *, const ct_tensor *);

#ifdef CT_HAVE_CUDA
#define CUDA_SLOT(fn) , [CT_DEVICE_CUDA] = fn
#else
#define CUDA_SLOT(fn)
#endif

static const binary_fn binary_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_binary CUDA_SLOT(cti_cuda_binary)};
static const binary_scalar_fn binary_scalar_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_binary_scalar CUDA_SLOT(cti_cuda_binary_scalar)};
static const unary_fn unary_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_unary CUDA_SLOT(cti_cuda_unary)};
static const unary_backward_fn unary_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_unary_backward CUDA_SLOT(cti_cuda_unary_backward)};
static const where_fn where_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_where CUDA_SLOT(cti_cuda_where)};
#undef CUDA_SLOT

static const char *const binary_names[CT_BINARY_OP_COUNT] = {
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"};
static const char *const unary_names[CT_UNARY_OP_COUNT] = {
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu_tanh", "gelu_erf", "silu"};

const char *ct_binary_op_name(ct_binary_op op)
{
    return (unsigned)op < CT_BINARY_OP_COUNT ? binary_names[op] : "invalid";
}

const char *ct_unary_op_name(ct_unary_op op)
{
    return (unsigned)op < CT_UNARY_OP_COUNT ? unary_names[op] : "invalid";
}

bool ct_binary_op_is_comparison(ct_binary_op op) { return op >= CT_BINARY_EQ && op < CT_BINARY_OP_COUNT; }

/* ---- checks -------------------------------------------------------------------------- */

static bool is_int(ct_dtype dt) { return dt == CT_DTYPE_I32 || dt == CT_DTYPE_I64 || dt == CT_DTYPE_U8; }

/* Whether op supports dtype dt; else records why, naming op and the operand t. */
static ct_status check_binary_dtype(const char *name, ct_binary_op op, const ct_tensor *t)
{
    ct_dtype dt = t->dtype;
    bool cmp = ct_binary_op_is_comparison(op), minmax = op == CT_BINARY_MAX || op == CT_BINARY_MIN;
    if (cti_kernel_is_float(dt)) return CT_OK;
    if (is_int(dt) && (cmp || minmax || op == CT_BINARY_ADD || op == CT_BINARY_SUB || op == CT_BINARY_MUL))
        return CT_OK;
    if (dt == CT_DTYPE_BOOL && (cmp || minmax)) return CT_OK;
    return cti_kernel_unsupported_dtype(name, t);
}

static ct_status check_unary_dtype(const char *name, ct_unary_op op, const ct_tensor *t)
{
    if (cti_kernel_is_float(t->dtype)) return CT_OK;
    if (is_int(t->dtype) && (op == CT_UNARY_NEG || op == CT_UNARY_ABS || op == CT_UNARY_RELU)) return CT_OK;
    return cti_kernel_unsupported_dtype(name, t);
}

/* All tensors on one device, and a kernel for that device (have_impl). */
static ct_status check_device(const char *name, const ct_tensor *const *ts, int n, bool have_impl)
{
    if (cti_kernel_same_device(name, ts, n)) return ct_last_status();
    return have_impl ? CT_OK : cti_kernel_unavailable(name, ts[0]->device);
}

/* Byte range [lo, hi) that t's elements span (strides may be any sign). */
static void byte_range(const ct_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    intptr_t a = 0, b = 0;
    for (int d = 0; d < t->ndim; d++) {
        intptr_t ext = (intptr_t)(t->shape[d] - 1) * (intptr_t)t->strides[d];
        if (ext < 0) a += ext;
        else b += ext;
    }
    intptr_t es = (intptr_t)ct_dtype_size(t->dtype);
    uintptr_t base = (uintptr_t)ct_tensor_data(t);
    *lo = base + (uintptr_t)(a * es);
    *hi = base + (uintptr_t)(b * es + es);
}

static bool overlaps(const ct_tensor *x, const ct_tensor *y)
{
    if (x->storage != y->storage || ct_tensor_numel(x) == 0 || ct_tensor_numel(y) == 0) return false;
    uintptr_t xl, xh, yl, yh;
    byte_range(x, &xl, &xh);
    byte_range(y, &yl, &yh);
    return xl < yh && yl < xh;
}

/* in, broadcast to out's shape, reads element i exactly where out writes element i. */
static bool same_view(const ct_tensor *out, const ct_tensor *in)
{
    if (ct_dtype_size(out->dtype) != ct_dtype_size(in->dtype) || ct_tensor_data(out) != ct_tensor_data(in))
        return false;
    int64_t st[CT_MAX_DIMS];
    cti_cpu_ew_bcast_strides(in, out->ndim, out->shape, st);
    for (int d = 0; d < out->ndim; d++)
        if (out->shape[d] > 1 && st[d] != out->strides[d]) return false;
    return true;
}

/* A destination may be an input exactly, or disjoint from it; anything else goes through a temporary. */
static bool needs_temp(const ct_tensor *out, const ct_tensor *const *in, int n)
{
    for (int k = 0; k < n; k++)
        if (in[k] && overlaps(out, in[k]) && !same_view(out, in[k])) return true;
    return false;
}

/* out must hold the result's shape and dtype, one element per address. */
static ct_status check_out(const char *name, const ct_tensor *out, int ndim, const int64_t *shape, ct_dtype dt)
{
    char o[200], s[160];
    bool shape_ok = out->ndim == ndim;
    for (int d = 0; shape_ok && d < ndim; d++) shape_ok = out->shape[d] == shape[d];
    if (!shape_ok || out->dtype != dt)
        return ct_error_set(CT_ERR_INVALID, "%s: out is %s but the result is %s%s", name,
                            ct_tensor_describe(out, o, sizeof o), ct_dtype_name(dt), ct_shape_str(ndim, shape, s, sizeof s));
    for (int d = 0; d < out->ndim; d++)
        if (out->strides[d] == 0 && out->shape[d] > 1)
            return ct_error_set(CT_ERR_INVALID, "%s: out %s is an expanded view (stride 0 on dim %d); write into a "
                                "tensor whose elements have distinct addresses", name, ct_tensor_describe(out, o, sizeof o), d);
    return CT_OK;
}

/* A NULL input keeps the earlier failure's status and message; a NULL out (or a
 * NULL input with no earlier failure) is an error of its own. Never CT_OK. */
static ct_status null_status(const char *name, const ct_tensor *out)
{
    return out ? cti_kernel_null_input(name, "an input") : ct_error_set(CT_ERR_INVALID, "%s: out is NULL", name);
}

/* ---- binary ----------------------------------------------------------------------------- */

/* Checks a op b and computes the result's shape and dtype. */
static ct_status binary_prepare(ct_binary_op op, const ct_tensor *a, const ct_tensor *b, int *ndim,
                                int64_t *shape, ct_dtype *dt)
{
    char da[200], db[200];
    if ((unsigned)op >= CT_BINARY_OP_COUNT) return ct_error_set(CT_ERR_INVALID, "binary: invalid op %d", (int)op);
    const char *name = ct_binary_op_name(op);
    if (a->dtype != b->dtype)
        return ct_error_set(CT_ERR_INVALID, "%s: dtypes differ: %s and %s; use ct_tensor_cast on one of them", name,
                            ct_tensor_describe(a, da, sizeof da), ct_tensor_describe(b, db, sizeof db));
    if (check_binary_dtype(name, op, a)) return ct_last_status();
    if (!ct_broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, ndim, shape))
        return ct_error_set(CT_ERR_INVALID, "%s: cannot broadcast %s with %s", name,
                            ct_tensor_describe(a, da, sizeof da), ct_tensor_describe(b, db, sizeof db));
    *dt = ct_binary_op_is_comparison(op) ? CT_DTYPE_BOOL : a->dtype;
    return check_device(name, (const ct_tensor *[]){a, b}, 2, binary_impl[a->device.type] != NULL);
}

ct_tensor *ct_kernel_binary(ct_binary_op op, const ct_tensor *a, const ct_tensor *b)
{
    if (!a || !b) return NULL;
    cti_threads_sync();
    int ndim = 0;
    int64_t shape[CT_MAX_DIMS];
    ct_dtype dt = CT_DTYPE_F32;
    if (binary_prepare(op, a, b, &ndim, shape, &dt)) return NULL;
    ct_tensor *out = ct_tensor_empty_on(a->device, dt, ndim, shape);
    if (!out || binary_impl[a->device.type](op, out, a, b)) return NULL;
    return out;
}

ct_status ct_kernel_binary_out(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b)
{
    if (!out || !a || !b) return null_status("binary_out", out);
    cti_threads_sync();
    int ndim = 0;
    int64_t shape[CT_MAX_DIMS];
    ct_dtype dt = CT_DTYPE_F32;
    if (binary_prepare(op, a, b, &ndim, shape, &dt)) return ct_last_status();
    if (cti_kernel_same_device(ct_binary_op_name(op), (const ct_tensor *[]){out, a}, 2)) return ct_last_status();
    if (check_out(ct_binary_op_name(op), out, ndim, shape, dt)) return ct_last_status();
    binary_fn fn = binary_impl[a->device.type];
    if (!needs_temp(out, (const ct_tensor *[]){a, b}, 2)) return fn(op, out, a, b);
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *tmp = ct_tensor_empty_on(out->device, dt, ndim, shape);
    if (!tmp) st = ct_last_status();
    else if (!(st = fn(op, tmp, a, b))) st = ct_tensor_copy_(out, tmp);
    ct_frame_pop();
    return st;
}

/* s must be exactly representable in an integer dtype (no silent truncation). */
static ct_status check_int_scalar(const char *name, const ct_tensor *a, double s)
{
    double lo, hi; /* inclusive */
    switch (a->dtype) {
    case CT_DTYPE_I32: lo = -2147483648.0, hi = 2147483647.0; break;
    case CT_DTYPE_I64: lo = -9223372036854775808.0, hi = 9223372036854774784.0; break;
    case CT_DTYPE_U8: lo = 0, hi = 255; break;
    case CT_DTYPE_BOOL: lo = 0, hi = 1; break;
    default: return CT_OK;
    }
    if (s == floor(s) && s >= lo && s <= hi) return CT_OK;
    char d[200];
    return ct_error_set(CT_ERR_INVALID, "%s: scalar %.17g is not a value of %s's dtype; use ct_tensor_cast to a float dtype first",
                        name, s, ct_tensor_describe(a, d, sizeof d));
}

static ct_tensor *binary_scalar(ct_binary_op op, const ct_tensor *a, double s, bool reversed)
{
    if (!a) return NULL;
    cti_threads_sync();
    if ((unsigned)op >= CT_BINARY_OP_COUNT) {
        ct_error_set(CT_ERR_INVALID, "binary_scalar: invalid op %d", (int)op);
        return NULL;
    }
    const char *name = ct_binary_op_name(op);
    if (check_binary_dtype(name, op, a) || check_int_scalar(name, a, s) || 
        check_device(name, &a, 1, binary_scalar_impl[a->device.type] != NULL))
        return NULL;
    ct_dtype dt = ct_binary_op_is_comparison(op) ? CT_DTYPE_BOOL : a->dtype;
    ct_tensor *out = ct_tensor_empty_on(a->device, dt, a->ndim, a->shape);
    if (!out || binary_scalar_impl[a->device.type](op, out, a, s, reversed)) return NULL;
    return out;
}

ct_tensor *ct_kernel_binary_scalar(ct_binary_op op, const ct_tensor *a, double s)
{
    return binary_scalar(op, a, s, false);
}

ct_tensor *ct_kernel_rbinary_scalar(ct_binary_op op, double s, const ct_tensor *a)
{
    return binary_scalar(op, a, s, true);
}

/* ---- unary ------------------------------------------------------------------------------- */

static ct_status unary_prepare(ct_unary_op op, const ct_tensor *x)
{
    if ((unsigned)op >= CT_UNARY_OP_COUNT) return ct_error_set(CT_ERR_INVALID, "unary: invalid op %d", (int)op);
    const char *name = ct_unary_op_name(op);
    if (check_unary_dtype(name, op, x)) return ct_last_status();
    return check_device(name, &x, 1, unary_impl[x->device.type] != NULL);
}

ct_tensor *ct_kernel_unary(ct_unary_op op, const ct_tensor *x)
{
    if (!x) return NULL;
    cti_threads_sync();
    if (unary_prepare(op, x)) return NULL;
    ct_tensor *out = ct_tensor_empty_on(x->device, x->dtype, x->ndim, x->shape);
    if (!out || unary_impl[x->device.type](op, out, x)) return NULL;
    return out;
}

ct_status ct_kernel_unary_out(ct_unary_op op, ct_tensor *out, const ct_tensor *x)
{
    if (!out || !x) return null_status("unary_out", out);
    cti_threads_sync();
    if (unary_prepare(op, x)) return ct_last_status();
    const char *name = ct_unary_op_name(op);
    if (cti_kernel_same_device(name, (const ct_tensor *[]){out, x}, 2)) return ct_last_status();
    if (check_out(name, out, x->ndim, x->shape, x->dtype)) return ct_last_status();
    unary_fn fn = unary_impl[x->device.type];
    if (!needs_temp(out, (const ct_tensor *[]){x}, 1)) return fn(op, out, x);
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *tmp = ct_tensor_empty_like(x);
    if (!tmp) st = ct_last_status();
    else if (!(st = fn(op, tmp, x))) st = ct_tensor_copy_(out, tmp);
    ct_frame_pop();
    return st;
}

ct_tensor *ct_kernel_unary_backward(ct_unary_op op, const ct_tensor *grad_out, const ct_tensor *x,
                                    const ct_tensor *y)
{
    if ((unsigned)op >= CT_UNARY_OP_COUNT) {
        ct_error_set(CT_ERR_INVALID, "unary_backward: invalid op %d", (int)op);
        return NULL;
    }
    bool y_suffices = y && (op == CT_UNARY_EXP || op == CT_UNARY_TANH || op == CT_UNARY_SIGMOID);
    if (!grad_out || (!x && !y_suffices)) return NULL;
    cti_threads_sync();
    char name[48], dg[200], dx[200], dy[200];
    snprintf(name, sizeof name, "%s backward", ct_unary_op_name(op));
    if (y_suffices) x = NULL; /* y is cheaper than recomputing f(x) */
    const ct_tensor *ts[3] = {grad_out, x, y};
    for (int k = 0; k < 3; k++) {
        if (!ts[k]) continue;
        if (!cti_kernel_is_float(ts[k]->dtype) || ts[k]->dtype != grad_out->dtype ||
            !ct_tensor_same_shape(ts[k], grad_out)) {
            ct_error_set(CT_ERR_INVALID, "%s: grad_out, x and y need one shape and one f32/f64/f16/bf16 dtype; got "
                         "grad_out %s, x %s, y %s", name, ct_tensor_describe(grad_out, dg, sizeof dg),
                         ct_tensor_describe(x, dx, sizeof dx), ct_tensor_describe(y, dy, sizeof dy));
            return NULL;
        }
    }
    if (check_device(name, ts, 3, unary_backward_impl[grad_out->device.type] != NULL)) return NULL;
    ct_tensor *gin = ct_tensor_empty_on(grad_out->device, grad_out->dtype, grad_out->ndim, grad_out->shape);
    if (!gin || unary_backward_impl[grad_out->device.type](op, gin, grad_out, x, y)) return NULL;
    return gin;
}

/* ---- where -------------------------------------------------------------------------------- */

ct_tensor *ct_kernel_where(const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b)
{
    if (!cond || !a || !b) return NULL;
    cti_threads_sync();
    char dc[200], da[200], db[200];
    ct_tensor_describe(cond, dc, sizeof dc);
    ct_tensor_describe(a, da, sizeof da);
    ct_tensor_describe(b, db, sizeof db);
    if (cond->dtype != CT_DTYPE_BOOL || a->dtype != b->dtype || cti_kernel_is_fp8(a->dtype)) {
        ct_error_set(CT_ERR_INVALID, "where: needs a bool condition and a, b of one non-fp8 dtype; got cond %s, a %s, b %s",
                     dc, da, db);
        return NULL;
    }
    int n1, n2;
    int64_t s1[CT_MAX_DIMS], s2[CT_MAX_DIMS];
    if (!ct_broadcast_shape(cond->ndim, cond->shape, a->ndim, a->shape, &n1, s1) ||
        !ct_broadcast_shape(n1, s1, b->ndim, b->shape, &n2, s2)) {
        ct_error_set(CT_ERR_INVALID, "where: cannot broadcast cond %s, a %s and b %s together", dc, da, db);
        return NULL;
    }
    if (check_device("where", (const ct_tensor *[]){cond, a, b}, 3, where_impl[a->device.type] != NULL))
        return NULL;
    ct_tensor *out = ct_tensor_empty_on(a->device, a->dtype, n2, s2);
    if (!out || where_impl[a->device.type](out, cond, a, b)) return NULL;
    return out;
}
