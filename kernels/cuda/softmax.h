/* ctrain — CUDA softmax / log-softmax kernels (see kernels/softmax.h for the math).
 *
 * Contract (checked by kernels/softmax.c): every tensor contiguous, on one GPU, with
 * the same shape and dtype (f32, f64, bf16, f16); dim in [0, ndim) (0 for a 0-d
 * tensor). Outputs are overwritten, on the current stream of the tensors' device.
 * The _ref versions are one thread per softmax line, every element through double;
 * the tests compare both against the CPU reference. */
#ifndef CT_KERNELS_CUDA_SOFTMAX_H
#define CT_KERNELS_CUDA_SOFTMAX_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/tensor.h"

ct_status cti_cuda_softmax(const ct_tensor *x, ct_tensor *y, int dim);
ct_status cti_cuda_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim);
ct_status cti_cuda_log_softmax(const ct_tensor *x, ct_tensor *y, int dim);
ct_status cti_cuda_log_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim);

ct_status cti_cuda_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status cti_cuda_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status cti_cuda_log_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status cti_cuda_log_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);

#ifdef __cplusplus
}
#endif

#endif
