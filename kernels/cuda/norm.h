/* ctrain — CUDA layernorm / rmsnorm kernels (see kernels/norm.h for the math).
 *
 * Contract (checked by kernels/norm.c): tensors contiguous and on one GPU; x, y, dy,
 * dx (rows, C) of one dtype (f32, f64, bf16, f16); w, b, dw, db (C) of any of those
 * dtypes; mean and rstd (rows) f32, f64 for f64 x. Optional inputs and unwanted
 * outputs are NULL. Every output is overwritten, on the current stream of the
 * tensors' device. The _ref versions are one thread per row (per column for dw and
 * db) in double; the tests compare both against the CPU reference. */
#ifndef CT_KERNELS_CUDA_NORM_H
#define CT_KERNELS_CUDA_NORM_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/tensor.h"

ct_status cti_cuda_layernorm(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                             ct_tensor *mean, ct_tensor *rstd);
ct_status cti_cuda_layernorm_ref(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                                 ct_tensor *mean, ct_tensor *rstd);
ct_status cti_cuda_layernorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                      const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                      ct_tensor *db);
ct_status cti_cuda_layernorm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                          const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                          ct_tensor *db);

ct_status cti_cuda_rmsnorm(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y, ct_tensor *rstd);
ct_status cti_cuda_rmsnorm_ref(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y, ct_tensor *rstd);
ct_status cti_cuda_rmsnorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                    const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw);
ct_status cti_cuda_rmsnorm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                        const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw);

#ifdef __cplusplus
}
#endif

#endif
