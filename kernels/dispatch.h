/* ctrain — kernel dispatch.
 *
 * Each op family (kernels/matmul.c, kernels/elementwise.c, ...) keeps one table
 * per op indexed by device type:
 *     static const ct_softmax_fn softmax_impl[CT_DEVICE_TYPE_COUNT] = {
 *         [CT_DEVICE_CPU] = ct_cpu_softmax,   // CUDA slot filled when built with nvcc
 *     };
 * The tensor-level entry point (ct_kernel_softmax) checks its arguments, makes
 * the output and calls the slot for the inputs' device; the dtype switch lives
 * inside the device function. Every device function has a plain reference
 * version (double accumulation) beside it, named *_ref, that tests compare the
 * fast one against.
 */
#ifndef CT_KERNELS_DISPATCH_H
#define CT_KERNELS_DISPATCH_H

#include "core/tensor.h"

/* Records "op: no kernel for <device> (...)" and returns CT_ERR_UNSUPPORTED. */
ct_status ct_kernel_unavailable(const char *op, ct_device dev);
/* Checks that every non-NULL tensor among ts[0..n) is on one device and returns
 * CT_OK, else records an error naming op and the tensors. */
ct_status ct_kernel_same_device(const char *op, const ct_tensor *const *ts, int n);

#endif
