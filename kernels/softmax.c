/* Tensor-level softmax / log-softmax: argument checks, output allocation,
 * dispatch to the device kernels (kernels/cpu/softmax.c). */
#include "kernels/softmax.h"

#include "core/frame.h"
#include "core/threads_internal.h"
#include "kernels/cpu/softmax.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/softmax.h"
#define CUDA_SLOT(fn) [CT_DEVICE_CUDA] = fn,
#else
#define CUDA_SLOT(fn)
#endif
#include "kernels/dispatch_internal.h"

static const ct_softmax_fn softmax_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_softmax, CUDA_SLOT(cti_cuda_softmax)};
static const ct_softmax_fn log_softmax_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_log_softmax, CUDA_SLOT(cti_cuda_log_softmax)};
static const ct_softmax_backward_fn softmax_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_softmax_backward, CUDA_SLOT(cti_cuda_softmax_backward)};
static const ct_softmax_backward_fn log_softmax_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_log_softmax_backward, CUDA_SLOT(cti_cuda_log_softmax_backward)};

/* Checks t's dtype and normalises dim (a 0-d tensor has one dim of size 1). */
static bool check_input(const char *op, const char *name, const ct_tensor *t, int *dim)
{
    char a[200];
    if (cti_kernel_check_float(op, name, t)) return false;
    int n = t->ndim == 0 ? 1 : t->ndim;
    if (*dim < -n || *dim >= n) {
        ct_error_set(CT_ERR_INVALID, "%s: dim %d is out of range for %s %s (expected %d to %d)", op, *dim, name,
                     ct_tensor_describe(t, a, sizeof a), -n, n - 1);
        return false;
    }
    if (*dim < 0) *dim += n;
    return true;
}

static ct_tensor *forward(const char *op, const ct_softmax_fn *impl, const ct_tensor *x, int dim)
{
    if (!x) return NULL;
    if (!check_input(op, "x", x, &dim) || ct_tensor_require_data(x, op)) return NULL;
    ct_softmax_fn fn = impl[x->device.type];
    if (!fn) {
        cti_kernel_unavailable(op, x->device);
        return NULL;
    }
    ct_tensor *y = ct_tensor_empty_on(x->device, x->dtype, x->ndim, x->shape);
    if (!y) return NULL;
    cti_threads_sync();
    ct_frame_push();
    const ct_tensor *xc = cti_kernel_contiguous(x);
    ct_status st = xc ? fn(xc, y, dim) : ct_last_status();
    ct_frame_pop();
    return st == CT_OK ? y : NULL;
}

static ct_tensor *backward(const char *op, const ct_softmax_backward_fn *impl, const ct_tensor *dy,
                           const ct_tensor *y, int dim)
{
    if (!dy || !y) return NULL;
    if (cti_kernel_same_device(op, (const ct_tensor *[]){dy, y}, 2)) return NULL;
    if (cti_kernel_check_same(op, "dy", dy, "y", y) || !check_input(op, "y", y, &dim)) return NULL;
    ct_softmax_backward_fn fn = impl[y->device.type];
    if (!fn) {
        cti_kernel_unavailable(op, y->device);
        return NULL;
    }
    ct_tensor *dx = ct_tensor_empty_on(y->device, y->dtype, y->ndim, y->shape);
    if (!dx) return NULL;
    cti_threads_sync();
    ct_frame_push();
    const ct_tensor *dyc = cti_kernel_contiguous(dy), *yc = cti_kernel_contiguous(y);
    ct_status st = dyc && yc ? fn(dyc, yc, dx, dim) : ct_last_status();
    ct_frame_pop();
    return st == CT_OK ? dx : NULL;
}

ct_tensor *ct_kernel_softmax(const ct_tensor *x, int dim) { return forward("softmax", softmax_impl, x, dim); }

ct_tensor *ct_kernel_log_softmax(const ct_tensor *x, int dim)
{
    return forward("log_softmax", log_softmax_impl, x, dim);
}

ct_tensor *ct_kernel_softmax_backward(const ct_tensor *dy, const ct_tensor *y, int dim)
{
    return backward("softmax_backward", softmax_backward_impl, dy, y, dim);
}

ct_tensor *ct_kernel_log_softmax_backward(const ct_tensor *dy, const ct_tensor *y, int dim)
{
    return backward("log_softmax_backward", log_softmax_backward_impl, dy, y, dim);
}
