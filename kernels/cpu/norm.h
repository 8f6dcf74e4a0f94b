/* ctrain — CPU layernorm / rmsnorm kernels (see kernels/norm.h for the math).
 *
 * Contract (checked by kernels/norm.c): tensors contiguous and on the CPU; x, y,
 * dy, dx (rows, C) of one dtype (f32, f64, bf16, f16); w, b, dw, db (C) of any of
 * those dtypes; mean and rstd (rows) f32, f64 for f64 x. Optional inputs and
 * unwanted outputs are NULL. Every output is overwritten. The _ref versions are
 * plain loops in double that the tests compare the fast ones against.
 */
#ifndef CT_KERNELS_CPU_NORM_H
#define CT_KERNELS_CPU_NORM_H

#include "core/tensor.h"

ct_status cti_cpu_layernorm(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                            ct_tensor *mean, ct_tensor *rstd);
ct_status cti_cpu_layernorm_ref(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                                ct_tensor *mean, ct_tensor *rstd);
ct_status cti_cpu_layernorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                     const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                     ct_tensor *db);
ct_status cti_cpu_layernorm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                         const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                         ct_tensor *db);

ct_status cti_cpu_rmsnorm(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y, ct_tensor *rstd);
ct_status cti_cpu_rmsnorm_ref(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y, ct_tensor *rstd);
ct_status cti_cpu_rmsnorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                   const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw);
ct_status cti_cpu_rmsnorm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                       const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw);

#endif
