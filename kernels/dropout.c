/* Tensor-level dropout: argument checks, output allocation, dispatch to the
 * device kernels (kernels/cpu/dropout.c). */
#include "kernels/dropout.h"

#include "core/frame.h"
#include "core/threads_internal.h"
#include "kernels/cpu/dropout.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/dropout.h"
#define CUDA_SLOT(fn) [CT_DEVICE_CUDA] = fn,
#else
#define CUDA_SLOT(fn)
#endif
#include "kernels/dispatch_internal.h"

static const ct_dropout_fn dropout_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_dropout, CUDA_SLOT(cti_cuda_dropout)};
static const ct_dropout_backward_fn dropout_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_dropout_backward, CUDA_SLOT(cti_cuda_dropout_backward)};

static bool check_p(const char *op, double p, const ct_tensor *t)
{
    char a[200];
    if (p >= 0 && p <= 1) return true; /* false for NaN too */
    ct_error_set(CT_ERR_INVALID, "%s: p = %g must lie in [0, 1] (x %s)", op, p, ct_tensor_describe(t, a, sizeof a));
    return false;
}

ct_tensor *ct_kernel_dropout(const ct_tensor *x, double p, ct_rng *rng, ct_tensor **mask)
{
    const char *op = "dropout";
    if (mask) *mask = NULL;
    if (!x) return NULL;
    if (cti_kernel_check_float(op, "x", x) || !check_p(op, p, x) || ct_tensor_require_data(x, op)) return NULL;
    ct_dropout_fn fn = dropout_impl[x->device.type];
    if (!fn) {
        cti_kernel_unavailable(op, x->device);
        return NULL;
    }
    ct_tensor *y = ct_tensor_empty_on(x->device, x->dtype, x->ndim, x->shape);
    ct_tensor *m = ct_tensor_empty_on(x->device, CT_DTYPE_U8, x->ndim, x->shape);
    if (!y || !m) return NULL;
    cti_threads_sync();
    ct_frame_push();
    const ct_tensor *xc = cti_kernel_contiguous(x);
    ct_status st = xc ? fn(xc, p, rng ? rng : ct_rng_default(), y, m) : ct_last_status();
    ct_frame_pop();
    if (st) return NULL;
    if (mask) *mask = m;
    return y;
}

ct_tensor *ct_kernel_dropout_backward(const ct_tensor *dy, const ct_tensor *mask, double p)
{
    const char *op = "dropout_backward";
    char a[200], b[200];
    if (!dy || !mask) return NULL;
    if (!cti_kernel_is_float(dy->dtype) || (mask->dtype != CT_DTYPE_U8 && mask->dtype != CT_DTYPE_BOOL) ||
        !ct_tensor_same_shape(dy, mask)) {
        ct_error_set(CT_ERR_INVALID, "%s: dy %s (f32, f64, bf16 or f16) and mask %s (u8 or bool) must have one shape", op,
                     ct_tensor_describe(dy, a, sizeof a), ct_tensor_describe(mask, b, sizeof b));
        return NULL;
    }
    if (!check_p(op, p, dy)) return NULL;
    if (cti_kernel_same_device(op, (const ct_tensor *[]){dy, mask}, 2)) return NULL;
    ct_dropout_backward_fn fn = dropout_backward_impl[dy->device.type];
    if (!fn) {
        cti_kernel_unavailable(op, dy->device);
        return NULL;
    }
    ct_tensor *dx = ct_tensor_empty_on(dy->device, dy->dtype, dy->ndim, dy->shape);
    if (!dx) return NULL;
    cti_threads_sync();
    ct_frame_push();
    const ct_tensor *dc = cti_kernel_contiguous(dy), *mc = cti_kernel_contiguous(mask);
    ct_status st = dc && mc ? fn(dc, mc, p, dx) : ct_last_status();
    ct_frame_pop();
    return st ? NULL : dx;
}
