#include "kernels/dispatch_internal.h"

ct_status cti_kernel_unavailable(const char *op, ct_device dev)
{
    char d[32];
    return ct_error_set(CT_ERR_UNSUPPORTED, "%s: no kernel for %s in this build (ctrain was built without %s support)",
                        op, ct_device_str(dev, d, sizeof d), dev.type == CT_DEVICE_CUDA ? "CUDA" : "that device's");
}

ct_status cti_kernel_same_device(const char *op, const ct_tensor *const *ts, int n)
{
    const ct_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        /* every entry point that checks devices reads its tensors next */
        if (ct_tensor_require_data(ts[i], op)) return ct_last_status();
        if (!first) {
            first = ts[i];
        } else if (!ct_device_equal(first->device, ts[i]->device)) {
            char a[200], b[200];
            return ct_error_set(CT_ERR_INVALID, "%s: tensors on different devices: %s and %s", op,
                                ct_tensor_describe(first, a, sizeof a), ct_tensor_describe(ts[i], b, sizeof b));
        }
    }
    return CT_OK;
}

bool cti_kernel_is_float(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16;
}

bool cti_kernel_is_fp8(ct_dtype dt) { return dt == CT_DTYPE_F8_E4M3 || dt == CT_DTYPE_F8_E5M2; }

ct_dtype cti_kernel_stat_dtype(ct_dtype dt) { return dt == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32; }

bool cti_kernel_is_row_shaped(const ct_tensor *t, const ct_tensor *x)
{
    if (t->ndim != x->ndim - 1) return false;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != x->shape[d]) return false;
    return true;
}

ct_status cti_kernel_check_float(const char *op, const char *name, const ct_tensor *t)
{
    char a[200];
    if (cti_kernel_is_float(t->dtype)) return CT_OK;
    return ct_error_set(CT_ERR_INVALID, "%s: %s must be f32, f64, bf16 or f16, got %s", op, name,
                        ct_tensor_describe(t, a, sizeof a));
}

ct_status cti_kernel_check_float_rows(const char *op, const char *name, const ct_tensor *t, const char *row)
{
    char a[200];
    if (cti_kernel_is_float(t->dtype) && t->ndim >= 1) return CT_OK;
    return ct_error_set(CT_ERR_INVALID, "%s: %s must be an f32, f64, bf16 or f16 tensor of shape (..., %s), got %s",
                        op, name, row, ct_tensor_describe(t, a, sizeof a));
}

ct_status cti_kernel_check_same(const char *op, const char *an, const ct_tensor *a, const char *bn,
                               const ct_tensor *b)
{
    char da[200], db[200];
    if (ct_tensor_same_shape(a, b) && a->dtype == b->dtype) return CT_OK;
    return ct_error_set(CT_ERR_INVALID, "%s: %s %s and %s %s must have the same shape and dtype", op, an,
                        ct_tensor_describe(a, da, sizeof da), bn, ct_tensor_describe(b, db, sizeof db));
}

ct_status cti_kernel_unsupported_dtype(const char *op, const ct_tensor *t)
{
    char d[200];
    if (cti_kernel_is_fp8(t->dtype))
        return ct_error_set(CT_ERR_UNSUPPORTED, "%s: %s is fp8; use ct_tensor_cast to f32 or bf16 first", op,
                            ct_tensor_describe(t, d, sizeof d));
    return ct_error_set(CT_ERR_UNSUPPORTED, "%s: not supported for %s %s; use ct_tensor_cast to a float dtype first",
                        op, t->dtype == CT_DTYPE_BOOL ? "bool" : "integer", ct_tensor_describe(t, d, sizeof d));
}

ct_status cti_kernel_null_input(const char *op, const char *name)
{
    if (ct_last_status() != CT_OK) return ct_last_status();
    return ct_error_set(CT_ERR_INVALID, "%s: %s is NULL", op, name);
}

const ct_tensor *cti_kernel_contiguous(const ct_tensor *t)
{
    return !t || ct_tensor_is_contiguous(t) ? t : ct_tensor_clone(t);
}
