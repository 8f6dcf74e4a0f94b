/* Tensor-level entry points of kernels/foreach.h: argument checks and dispatch to
 * the device kernels (kernels/cpu/foreach.c, kernels/cuda/foreach.cu). */
#include "kernels/foreach.h"

#include <math.h>

#include "core/threads_internal.h"
#include "kernels/cpu/foreach.h"
#include "kernels/dispatch_internal.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/foreach.h"
#endif

static const ct_scale_fn scale_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_scale_,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_scale_,
#endif
};
static const ct_clamp_fn clamp_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_clamp_abs_,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_clamp_abs_,
#endif
};
static const ct_norm_partial_fn norm_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_norm_partial,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_norm_partial,
#endif
};
static const ct_unscale_fn unscale_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_unscale_,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_unscale_,
#endif
};

/* f32 or f64, contiguous, with memory. */
static ct_status check(const char *op, const ct_tensor *x, bool f32_only)
{
    char d[200];
    if (!x) return cti_kernel_null_input(op, "x");
    if (ct_tensor_require_data(x, op)) return ct_last_status();
    if ((x->dtype != CT_DTYPE_F32 && (f32_only || x->dtype != CT_DTYPE_F64)) || !ct_tensor_is_contiguous(x))
        return ct_error_set(CT_ERR_INVALID, "%s: %s; want %s, contiguous", op, ct_tensor_describe(x, d, sizeof d),
                            f32_only ? "f32" : "f32 or f64");
    return CT_OK;
}

ct_status ct_kernel_scale_(ct_tensor *x, double coef)
{
    if (check("scale_", x, false)) return ct_last_status();
    if (!scale_impl[x->device.type]) return cti_kernel_unavailable("scale_", x->device);
    cti_threads_sync();
    return scale_impl[x->device.type](x, coef);
}

ct_status ct_kernel_clamp_abs_(ct_tensor *x, double v)
{
    if (check("clamp_abs_", x, false)) return ct_last_status();
    if (!(v >= 0)) return ct_error_set(CT_ERR_INVALID, "clamp_abs_: the bound must be >= 0, got %g", v);
    if (!clamp_impl[x->device.type]) return cti_kernel_unavailable("clamp_abs_", x->device);
    cti_threads_sync();
    return clamp_impl[x->device.type](x, v);
}

ct_status ct_kernel_norm_partial(const ct_tensor *x, double p, double *out)
{
    if (!out) return ct_error_set(CT_ERR_INVALID, "norm_partial: out is NULL");
    *out = NAN;
    if (check("norm_partial", x, false)) return ct_last_status();
    if (!(p > 0)) return ct_error_set(CT_ERR_INVALID, "norm_partial: p must be > 0 (2, 1, INFINITY, ...), got %g", p);
    if (!norm_impl[x->device.type]) return cti_kernel_unavailable("norm_partial", x->device);
    int kind = isinf(p) ? 3 : p == 2 ? 0 : p == 1 ? 1 : 2;
    cti_threads_sync();
    if (ct_tensor_numel(x) == 0) {
        *out = 0;
        return CT_OK;
    }
    return norm_impl[x->device.type](x, kind, p, out);
}

ct_status ct_kernel_unscale_(int n, ct_tensor *const *grads, float inv, bool *found_inf)
{
    char a[200], b[200];
    if (!found_inf || n < 0 || (n > 0 && !grads))
        return ct_error_set(CT_ERR_INVALID, "unscale_: need n >= 0, n gradients and found_inf");
    const ct_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!grads[i]) continue;
        if (check("unscale_", grads[i], true)) return ct_error_prefix("gradient %d: ", i);
        if (!first) first = grads[i];
        else if (!ct_device_equal(first->device, grads[i]->device))
            return ct_error_set(CT_ERR_INVALID, "unscale_: gradients on different devices: %s and %s (gradient %d)",
                                ct_tensor_describe(first, a, sizeof a), ct_tensor_describe(grads[i], b, sizeof b), i);
    }
    *found_inf = false;
    if (!first) return CT_OK;
    if (!unscale_impl[first->device.type]) return cti_kernel_unavailable("unscale_", first->device);
    cti_threads_sync();
    return unscale_impl[first->device.type](n, grads, inv, found_inf);
}
