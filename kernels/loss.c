/* Tensor-level fused cross-entropy: argument checks, output allocation,
 * dispatch to the device kernels (kernels/cpu/loss.c). */
#include "kernels/loss.h"

#include "core/frame.h"
#include "core/threads_internal.h"
#include "kernels/cpu/loss.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/loss.h"
#define CUDA_SLOT(fn) [CT_DEVICE_CUDA] = fn,
#else
#define CUDA_SLOT(fn)
#endif
#include "kernels/dispatch_internal.h"

static const ct_cross_entropy_fn cross_entropy_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_cross_entropy, CUDA_SLOT(cti_cuda_cross_entropy)};
static const ct_cross_entropy_backward_fn cross_entropy_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_cross_entropy_backward, CUDA_SLOT(cti_cuda_cross_entropy_backward)};

static ct_status check_logits_targets(const char *op, const ct_tensor *logits, const ct_tensor *targets)
{
    char a[200], b[200];
    ct_status st = cti_kernel_check_float_rows(op, "logits", logits, "V");
    if (st) return st;
    if ((targets->dtype != CT_DTYPE_I64 && targets->dtype != CT_DTYPE_I32) ||
        !cti_kernel_is_row_shaped(targets, logits))
        return ct_error_set(CT_ERR_INVALID,
                            "%s: targets %s must be i64 or i32 with the logits' shape without its last dim (logits %s)",
                            op, ct_tensor_describe(targets, a, sizeof a), ct_tensor_describe(logits, b, sizeof b));
    return CT_OK;
}

ct_tensor *ct_kernel_cross_entropy(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                   ct_tensor **lse)
{
    const char *op = "cross_entropy";
    if (lse) *lse = NULL;
    if (!logits || !targets) return NULL;
    if (check_logits_targets(op, logits, targets)) return NULL;
    if (cti_kernel_same_device(op, (const ct_tensor *[]){logits, targets}, 2)) return NULL;
    ct_cross_entropy_fn fn = cross_entropy_impl[logits->device.type];
    if (!fn) {
        cti_kernel_unavailable(op, logits->device);
        return NULL;
    }
    ct_tensor *loss = ct_tensor_empty_on(logits->device, logits->dtype, 0, logits->shape);
    ct_dtype lse_dt = cti_kernel_stat_dtype(logits->dtype);
    ct_tensor *lt = lse ? ct_tensor_empty_on(logits->device, lse_dt, targets->ndim, targets->shape) : NULL;
    if (!loss || (lse && !lt)) return NULL;
    cti_threads_sync();
    ct_frame_push();
    const ct_tensor *lc = cti_kernel_contiguous(logits), *tc = cti_kernel_contiguous(targets);
    ct_status st = lc && tc ? fn(lc, tc, ignore_index, loss, lt) : ct_last_status();
    ct_frame_pop();
    if (st) return NULL;
    if (lse) *lse = lt;
    return loss;
}

ct_tensor *ct_kernel_cross_entropy_backward(const ct_tensor *dloss, const ct_tensor *logits,
                                            const ct_tensor *targets, const ct_tensor *lse, int64_t ignore_index)
{
    const char *op = "cross_entropy_backward";
    char a[200], b[200];
    if (!dloss || !logits || !targets || !lse) return NULL;
    if (check_logits_targets(op, logits, targets)) return NULL;
    if (!cti_kernel_is_float(dloss->dtype) || ct_tensor_numel(dloss) != 1) {
        ct_error_set(CT_ERR_INVALID, "%s: dloss must be one f32, f64, bf16 or f16 element, got %s", op,
                     ct_tensor_describe(dloss, a, sizeof a));
        return NULL;
    }
    if (lse->dtype != cti_kernel_stat_dtype(logits->dtype) || !cti_kernel_is_row_shaped(lse, logits)) {
        ct_error_set(CT_ERR_INVALID, "%s: lse %s must be %s with the logits' shape without its last dim (logits %s)", op,
                     ct_tensor_describe(lse, a, sizeof a), ct_dtype_name(cti_kernel_stat_dtype(logits->dtype)),
                     ct_tensor_describe(logits, b, sizeof b));
        return NULL;
    }
    if (cti_kernel_same_device(op, (const ct_tensor *[]){dloss, logits, targets, lse}, 4)) return NULL;
    ct_cross_entropy_backward_fn fn = cross_entropy_backward_impl[logits->device.type];
    if (!fn) {
        cti_kernel_unavailable(op, logits->device);
        return NULL;
    }
    ct_tensor *dlogits = ct_tensor_empty_on(logits->device, logits->dtype, logits->ndim, logits->shape);
    if (!dlogits) return NULL;
    cti_threads_sync();
    ct_frame_push();
    const ct_tensor *lc = cti_kernel_contiguous(logits), *tc = cti_kernel_contiguous(targets);
    const ct_tensor *sc = cti_kernel_contiguous(lse);
    ct_status st = lc && tc && sc ? fn(dloss, lc, tc, sc, ignore_index, dlogits) : ct_last_status();
    ct_frame_pop();
    return st ? NULL : dlogits;
}
