/* Tensor-level embedding: argument checks, output allocation, dispatch to the
 * device kernels (kernels/cpu/embedding.c). */
#include "kernels/embedding.h"

#include "core/frame.h"
#include "core/threads_internal.h"
#include "kernels/cpu/embedding.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/embedding.h"
#define CUDA_SLOT(fn) [CT_DEVICE_CUDA] = fn,
#else
#define CUDA_SLOT(fn)
#endif
#include "kernels/dispatch_internal.h"

static const ct_embedding_fn embedding_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_embedding, CUDA_SLOT(cti_cuda_embedding)};
static const ct_embedding_backward_fn embedding_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_embedding_backward, CUDA_SLOT(cti_cuda_embedding_backward)};

static ct_status check_ids(const char *op, const ct_tensor *ids, const ct_tensor *table)
{
    char a[200], b[200];
    if ((ids->dtype != CT_DTYPE_I64 && ids->dtype != CT_DTYPE_I32) || ids->ndim + 1 > CT_MAX_DIMS)
        return ct_error_set(CT_ERR_INVALID, "%s: ids %s must be i64 or i32 with at most %d dims (table %s)", op,
                            ct_tensor_describe(ids, a, sizeof a), CT_MAX_DIMS - 1,
                            ct_tensor_describe(table, b, sizeof b));
    return CT_OK;
}

ct_tensor *ct_kernel_embedding(const ct_tensor *weight, const ct_tensor *ids)
{
    const char *op = "embedding";
    char a[200];
    if (!weight || !ids) return NULL;
    if (weight->ndim != 2) {
        ct_error_set(CT_ERR_INVALID, "%s: weight must be a (V, C) table, got %s", op,
                     ct_tensor_describe(weight, a, sizeof a));
        return NULL;
    }
    if (check_ids(op, ids, weight)) return NULL;
    if (cti_kernel_same_device(op, (const ct_tensor *[]){weight, ids}, 2)) return NULL;
    ct_embedding_fn fn = embedding_impl[weight->device.type];
    if (!fn) {
        cti_kernel_unavailable(op, weight->device);
        return NULL;
    }
    int64_t shape[CT_MAX_DIMS];
    for (int d = 0; d < ids->ndim; d++) shape[d] = ids->shape[d];
    shape[ids->ndim] = weight->shape[1];
    ct_tensor *out = ct_tensor_empty_on(weight->device, weight->dtype, ids->ndim + 1, shape);
    if (!out) return NULL;
    out->scale = weight->scale;
    out->amax = weight->amax;
    cti_threads_sync();
    ct_frame_push();
    const ct_tensor *wc = cti_kernel_contiguous(weight), *ic = cti_kernel_contiguous(ids);
    ct_status st = wc && ic ? fn(wc, ic, out) : ct_last_status();
    ct_frame_pop();
    return st ? NULL : out;
}

ct_status ct_kernel_embedding_backward(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids)
{
    const char *op = "embedding_backward";
    char a[200], b[200], c[200];
    if (!dweight || !dout || !ids) return cti_kernel_null_input(op, !dweight ? "dweight" : !dout ? "dout" : "ids");
    if (dweight->ndim != 2 || !cti_kernel_is_float(dweight->dtype))
        return ct_error_set(CT_ERR_INVALID, "%s: dweight must be an f32, f64, bf16 or f16 (V, C) table, got %s", op,
                            ct_tensor_describe(dweight, a, sizeof a));
    ct_status st = check_ids(op, ids, dweight);
    if (st) return st;
    bool ok = cti_kernel_is_float(dout->dtype) && dout->ndim == ids->ndim + 1 &&
              dout->shape[ids->ndim] == dweight->shape[1];
    for (int d = 0; ok && d < ids->ndim; d++) ok = dout->shape[d] == ids->shape[d];
    if (!ok)
        return ct_error_set(CT_ERR_INVALID,
                            "%s: dout %s must be f32, f64, bf16 or f16 with shape ids + [C] (ids %s, dweight %s)", op,
                            ct_tensor_describe(dout, a, sizeof a), ct_tensor_describe(ids, b, sizeof b),
                            ct_tensor_describe(dweight, c, sizeof c));
    st = cti_kernel_same_device(op, (const ct_tensor *[]){dweight, dout, ids}, 3);
    if (st) return st;
    ct_embedding_backward_fn fn = embedding_backward_impl[dweight->device.type];
    if (!fn) return cti_kernel_unavailable(op, dweight->device);
    cti_threads_sync();
    ct_frame_push();
    /* a strided dweight accumulates in a contiguous copy that is written back */
    ct_tensor *target = ct_tensor_is_contiguous(dweight) ? dweight : ct_tensor_clone(dweight);
    const ct_tensor *dc = cti_kernel_contiguous(dout), *ic = cti_kernel_contiguous(ids);
    st = target && dc && ic ? fn(target, dc, ic) : ct_last_status();
    if (!st && target != dweight) st = ct_tensor_copy_(dweight, target);
    ct_frame_pop();
    return st;
}
