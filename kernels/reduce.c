/* Reductions: dim parsing, dtype rules, output allocation, per-device dispatch.
 * The math lives in kernels/cpu/reduce.c. */
#include "kernels/reduce.h"

#include <string.h>

#include "core/threads_internal.h"
#include "kernels/cpu/reduce.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/reduce.h"
#endif
#include "kernels/dispatch_internal.h"

typedef ct_status (*reduce_fn)(ct_reduce_op, ct_tensor *, const ct_tensor *, uint32_t);
typedef ct_status (*var_fn)(ct_tensor *, const ct_tensor *, uint32_t, int64_t);
typedef ct_status (*argmax_fn)(ct_tensor *, const ct_tensor *, int);

#ifdef CT_HAVE_CUDA
#define CUDA_SLOT(fn) , [CT_DEVICE_CUDA] = fn
#else
#define CUDA_SLOT(fn)
#endif
static const reduce_fn reduce_impl[CT_DEVICE_TYPE_COUNT] = {[CT_DEVICE_CPU] = cti_cpu_reduce CUDA_SLOT(cti_cuda_reduce)};
static const var_fn var_impl[CT_DEVICE_TYPE_COUNT] = {[CT_DEVICE_CPU] = cti_cpu_var CUDA_SLOT(cti_cuda_var)};
static const argmax_fn argmax_impl[CT_DEVICE_TYPE_COUNT] = {[CT_DEVICE_CPU] = cti_cpu_argmax CUDA_SLOT(cti_cuda_argmax)};
#undef CUDA_SLOT

static const char *const reduce_names[CT_REDUCE_OP_COUNT] = {"sum", "mean", "max", "min"};

/* "[0, -1]" into buf. */
static const char *dims_str(const int *dims, int ndims, char *buf, int cap)
{
    int n = snprintf(buf, cap, "[");
    for (int i = 0; i < ndims && n < cap; i++) n += snprintf(buf + n, cap - n, "%s%d", i ? ", " : "", dims[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* Bit d of *mask for each reduced dim d; ndims == 0 means all. A 0-d x takes 0 or -1. */
static ct_status parse_dims(const char *op, const ct_tensor *x, const int *dims, int ndims, uint32_t *mask)
{
    char d[200], ds[160];
    *mask = 0;
    if (ndims < 0 || (ndims > 0 && !dims))
        return ct_error_set(CT_ERR_INVALID, "%s: bad dim list (ndims %d, dims %s) for %s", op, ndims,
                            dims ? "given" : "NULL", ct_tensor_describe(x, d, sizeof d));
    if (ndims == 0) {
        *mask = x->ndim ? (uint32_t)((1u << x->ndim) - 1) : 0u;
        return CT_OK;
    }
    const int range = x->ndim ? x->ndim : 1;
    for (int i = 0; i < ndims; i++) {
        int k = dims[i];
        if (k < -range || k >= range)
            return ct_error_set(CT_ERR_INVALID, "%s: dim %d out of range for %s (dims %s; expected %d..%d)", op, k,
                                ct_tensor_describe(x, d, sizeof d), dims_str(dims, ndims, ds, sizeof ds), -range,
                                range - 1);
        if (x->ndim == 0) continue;
        if (k < 0) k += x->ndim;
        if ((*mask >> k) & 1)
            return ct_error_set(CT_ERR_INVALID, "%s: dim %d appears twice in dims %s for %s", op, k,
                                dims_str(dims, ndims, ds, sizeof ds), ct_tensor_describe(x, d, sizeof d));
        *mask |= 1u << k;
    }
    return CT_OK;
}

/* Output shape: reduced dims dropped, or kept as 1. */
static void reduced_shape(const ct_tensor *x, uint32_t mask, bool keepdim, int *ndim, int64_t *shape)
{
    int n = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!((mask >> d) & 1)) shape[n++] = x->shape[d];
        else if (keepdim) shape[n++] = 1;
    }
    *ndim = n;
}

/* max/min/argmax have no identity: a reduced dim of size 0 is an error. */
static ct_status check_nonempty(const char *op, const ct_tensor *x, uint32_t mask)
{
    for (int d = 0; d < x->ndim; d++) {
        if (((mask >> d) & 1) && x->shape[d] == 0) {
            char s[200];
            return ct_error_set(CT_ERR_INVALID, "%s: reduction over dim %d of size 0 in %s has no identity", op, d,
                                ct_tensor_describe(x, s, sizeof s));
        }
    }
    return CT_OK;
}

static ct_status check_dtype(const char *op, const ct_tensor *x, bool ints_ok)
{
    if (cti_kernel_is_float(x->dtype) || (ints_ok && !ct_dtype_is_float(x->dtype))) return CT_OK;
    return cti_kernel_unsupported_dtype(op, x);
}

static ct_tensor *reduce(ct_reduce_op op, const ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    if (!x) return NULL;
    cti_threads_sync();
    const char *name = reduce_names[op];
    uint32_t mask;
    if (ct_tensor_require_data(x, name) || check_dtype(name, x, op != CT_REDUCE_MEAN) || parse_dims(name, x, dims, ndims, &mask)) return NULL;
    if ((op == CT_REDUCE_MAX || op == CT_REDUCE_MIN) && check_nonempty(name, x, mask)) return NULL;
    if (!reduce_impl[x->device.type]) {
        cti_kernel_unavailable(name, x->device);
        return NULL;
    }
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    reduced_shape(x, mask, keepdim, &ndim, shape);
    ct_dtype dt = op == CT_REDUCE_SUM && !ct_dtype_is_float(x->dtype) ? CT_DTYPE_I64 : x->dtype;
    ct_tensor *out = ct_tensor_empty_on(x->device, dt, ndim, shape);
    if (!out || reduce_impl[x->device.type](op, out, x, mask)) return NULL;
    return out;
}

ct_tensor *ct_kernel_sum(const ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    return reduce(CT_REDUCE_SUM, x, dims, ndims, keepdim);
}

ct_tensor *ct_kernel_mean(const ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    return reduce(CT_REDUCE_MEAN, x, dims, ndims, keepdim);
}

ct_tensor *ct_kernel_max(const ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    return reduce(CT_REDUCE_MAX, x, dims, ndims, keepdim);
}

ct_tensor *ct_kernel_min(const ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    return reduce(CT_REDUCE_MIN, x, dims, ndims, keepdim);
}

ct_tensor *ct_kernel_var(const ct_tensor *x, const int *dims, int ndims, int64_t correction, bool keepdim)
{
    if (!x) return NULL;
    cti_threads_sync();
    uint32_t mask;
    if (check_dtype("var", x, false) || parse_dims("var", x, dims, ndims, &mask)) return NULL;
    if (!var_impl[x->device.type]) {
        cti_kernel_unavailable("var", x->device);
        return NULL;
    }
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    reduced_shape(x, mask, keepdim, &ndim, shape);
    ct_tensor *out = ct_tensor_empty_on(x->device, x->dtype, ndim, shape);
    if (!out || var_impl[x->device.type](out, x, mask, correction)) return NULL;
    return out;
}

ct_tensor *ct_kernel_argmax(const ct_tensor *x, int dim, bool keepdim)
{
    if (!x) return NULL;
    cti_threads_sync();
    uint32_t mask;
    if (ct_tensor_require_data(x, "argmax") || check_dtype("argmax", x, true) || parse_dims("argmax", x, &dim, 1, &mask) ||
        check_nonempty("argmax", x, mask))
        return NULL;
    if (!argmax_impl[x->device.type]) {
        cti_kernel_unavailable("argmax", x->device);
        return NULL;
    }
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    reduced_shape(x, mask, keepdim, &ndim, shape);
    ct_tensor *out = ct_tensor_empty_on(x->device, CT_DTYPE_I64, ndim, shape);
    if (!out) return NULL;
    if (ct_tensor_numel(out) == 0) return out;
    int d = 0;
    for (; d < x->ndim && !((mask >> d) & 1); d++) {}
    if (argmax_impl[x->device.type](out, x, x->ndim ? d : 0)) return NULL;
    return out;
}

ct_tensor *ct_kernel_sum_to_shape(const ct_tensor *x, int ndim, const int64_t *shape)
{
    if (!x) return NULL;
    cti_threads_sync();
    char d[200], s[160];
    if (ndim < 0 || ndim > x->ndim || (ndim > 0 && !shape)) {
        ct_error_set(CT_ERR_INVALID, "sum_to_shape: cannot sum %s to a %d-d shape", ct_tensor_describe(x, d, sizeof d),
                     ndim);
        return NULL;
    }
    const int lead = x->ndim - ndim;
    uint32_t mask = lead ? (uint32_t)((1u << lead) - 1) : 0u;
    for (int i = 0; i < ndim; i++) {
        const int64_t xs = x->shape[lead + i];
        if (shape[i] == xs) continue;
        if (shape[i] != 1) {
            ct_error_set(CT_ERR_INVALID, "sum_to_shape: %s does not broadcast to %s (dim %d: %lld vs %lld)",
                         ct_shape_str(ndim, shape, s, sizeof s), ct_tensor_describe(x, d, sizeof d), i,
                         (long long)shape[i], (long long)xs);
            return NULL;
        }
        mask |= 1u << (lead + i);
    }
    if (ct_tensor_require_data(x, "sum_to_shape") || check_dtype("sum_to_shape", x, true)) return NULL;
    if (!reduce_impl[x->device.type]) {
        cti_kernel_unavailable("sum_to_shape", x->device);
        return NULL;
    }
    ct_tensor *out = ct_tensor_empty_on(x->device, ct_dtype_is_float(x->dtype) ? x->dtype : CT_DTYPE_I64, ndim, shape);
    if (!out || reduce_impl[x->device.type](CT_REDUCE_SUM, out, x, mask)) return NULL;
    return out;
}
