/* Tensor-level fused cross-entropy: argument checks, output allocation,
 * dispatch to the device kernels (kernels/cpu/loss.c). */
#include "kernels/loss.h"

#include "core/frame.h"
#include "core/threads.h"
#include "kernels/cpu/loss.h"
#include "kernels/dispatch.h"

static const ct_cross_entropy_fn cross_entropy_impl[CT_DEVICE_TYPE_COUNT] = {[CT_DEVICE_CPU] = ct_cpu_cross_entropy};
static const ct_cross_entropy_backward_fn cross_entropy_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = ct_cpu_cross_entropy_backward};

static bool float_dtype(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16;
}

static ct_dtype lse_dtype(const ct_tensor *logits)
{
    return logits->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32;
}

/* t has logits' shape without the last dim. */
static bool row_shaped(const ct_tensor *t, const ct_tensor *logits)
{
    if (t->ndim != logits->ndim - 1) return false;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != logits->shape[d]) return false;
    return true;
}

static ct_status check_logits_targets(const char *op, const ct_tensor *logits, const ct_tensor *targets)
{
    char a[200], b[200];
    if (!float_dtype(logits->dtype) || logits->ndim < 1)
        return ct_error_set(CT_ERR_INVALID, "%s: logits must be an f32, f64, bf16 or f16 tensor of shape (..., V), got %s",
                            op, ct_tensor_describe(logits, a, sizeof a));
    if ((targets->dtype != CT_DTYPE_I64 && targets->dtype != CT_DTYPE_I32) || !row_shaped(targets, logits))
        return ct_error_set(CT_ERR_INVALID,
                            "%s: targets %s must be i64 or i32 with the logits' shape without its last dim (logits %s)",
                            op, ct_tensor_describe(targets, a, sizeof a), ct_tensor_describe(logits, b, sizeof b));
    return CT_OK;
}

/* t itself when contiguous, else a contiguous copy in the current frame. */
static const ct_tensor *contiguous(const ct_tensor *t) { return ct_tensor_is_contiguous(t) ? t : ct_tensor_clone(t); }

ct_tensor *ct_kernel_cross_entropy(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                   ct_tensor **lse)
{
    const char *op = "cross_entropy";
    if (lse) *lse = NULL;
    if (!logits || !targets) return NULL;
    if (check_logits_targets(op, logits, targets)) return NULL;
    if (ct_kernel_same_device(op, (const ct_tensor *[]){logits, targets}, 2)) return NULL;
    ct_cross_entropy_fn fn = cross_entropy_impl[logits->device.type];
    if (!fn) {
        ct_kernel_unavailable(op, logits->device);
        return NULL;
    }
    ct_tensor *loss = ct_tensor_empty_on(logits->device, logits->dtype, 0, logits->shape);
    ct_tensor *lt = lse ? ct_tensor_empty_on(logits->device, lse_dtype(logits), targets->ndim, targets->shape) : NULL;
    if (!loss || (lse && !lt)) return NULL;
    ct_threads_sync();
    ct_frame_push();
    const ct_tensor *lc = contiguous(logits), *tc = contiguous(targets);
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
    if (!float_dtype(dloss->dtype) || ct_tensor_numel(dloss) != 1) {
        ct_error_set(CT_ERR_INVALID, "%s: dloss must be one f32, f64, bf16 or f16 element, got %s", op,
                     ct_tensor_describe(dloss, a, sizeof a));
        return NULL;
    }
    if (lse->dtype != lse_dtype(logits) || !row_shaped(lse, logits)) {
        ct_error_set(CT_ERR_INVALID, "%s: lse %s must be %s with the logits' shape without its last dim (logits %s)", op,
                     ct_tensor_describe(lse, a, sizeof a), ct_dtype_name(lse_dtype(logits)),
                     ct_tensor_describe(logits, b, sizeof b));
        return NULL;
    }
    if (ct_kernel_same_device(op, (const ct_tensor *[]){dloss, logits, targets, lse}, 4)) return NULL;
    ct_cross_entropy_backward_fn fn = cross_entropy_backward_impl[logits->device.type];
    if (!fn) {
        ct_kernel_unavailable(op, logits->device);
        return NULL;
    }
    ct_tensor *dlogits = ct_tensor_empty_on(logits->device, logits->dtype, logits->ndim, logits->shape);
    if (!dlogits) return NULL;
    ct_threads_sync();
    ct_frame_push();
    const ct_tensor *lc = contiguous(logits), *tc = contiguous(targets), *sc = contiguous(lse);
    ct_status st = lc && tc && sc ? fn(dloss, lc, tc, sc, ignore_index, dlogits) : ct_last_status();
    ct_frame_pop();
    return st ? NULL : dlogits;
}
