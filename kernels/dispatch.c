#include "kernels/dispatch.h"

ct_status ct_kernel_unavailable(const char *op, ct_device dev)
{
    char d[32];
    return ct_error_set(CT_ERR_UNSUPPORTED, "%s: no kernel for %s in this build (ctrain was built without %s support)",
                        op, ct_device_str(dev, d, sizeof d), dev.type == CT_DEVICE_CUDA ? "CUDA" : "that device's");
}

ct_status ct_kernel_same_device(const char *op, const ct_tensor *const *ts, int n)
{
    const ct_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
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
