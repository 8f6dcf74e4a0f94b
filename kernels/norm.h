/* ctrain — layer normalisation and RMS normalisation over the last dim, forward
 * and backward.
 *
 * x (..., C); each row of C elements is normalised on its own:
 *   layernorm  mean = sum(x) / C,  var = sum((x - mean)^2) / C (two passes),
 *              rstd = 1 / sqrt(var + eps),  y = (x - mean) * rstd * w + b
 *   rmsnorm    rstd = 1 / sqrt(sum(x^2) / C + eps),  y = x * rstd * w
 * w (C) and b (C) are optional (NULL = 1 and 0) and may be of any float dtype
 * (f32, f64, bf16, f16); they are used in the compute dtype.
 *
 * dtypes: x f32, f64, bf16 or f16; y has x's dtype. bf16/f16 are computed in f32.
 * mean and rstd (the shape of x without its last dim) are f32, f64 for f64 x;
 * they are saved for backward.
 *
 * Outputs go through pointer-to-pointer arguments: each is a NEW REFERENCE OWNED
 * BY THE CURRENT FRAME, or NULL when not computed. An output pointer that is NULL
 * means "not wanted" (y is required). On failure every output is set to NULL and
 * an error names the op and its operands. A NULL required input returns non-zero
 * and keeps the earlier error.
 */
#ifndef CT_KERNELS_NORM_H
#define CT_KERNELS_NORM_H

#include "core/api.h"
#include "core/tensor.h"

/* Device functions (kernels/cpu/norm.h). Tensors contiguous and checked; optional
 * inputs and unwanted outputs are NULL; outputs are overwritten. */
typedef ct_status (*ct_layernorm_fn)(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps,
                                     ct_tensor *y, ct_tensor *mean, ct_tensor *rstd);
typedef ct_status (*ct_layernorm_backward_fn)(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                              const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx,
                                              ct_tensor *dw, ct_tensor *db);
typedef ct_status (*ct_rmsnorm_fn)(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y,
                                   ct_tensor *rstd);
typedef ct_status (*ct_rmsnorm_backward_fn)(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                            const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw);

/* x (..., C), w (C) or NULL, b (C) or NULL, eps >= 0 -> y (..., C), mean and rstd (...). */
CT_API ct_status ct_kernel_layernorm(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps,
                                     ct_tensor **y, ct_tensor **mean, ct_tensor **rstd);

/* dy and x (..., C), w (C) or NULL, mean and rstd from the forward. With
 * xhat = (x - mean) * rstd and g = dy * w:
 *   dx = rstd * (g - mean_C(g) - xhat * mean_C(g * xhat))
 *   dw = sum over rows of dy * xhat   (only when w is given; w's dtype)
 *   db = sum over rows of dy          (w's dtype, x's dtype without w)
 * All three are new tensors (overwritten, not accumulated). */
CT_API ct_status ct_kernel_layernorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                              const ct_tensor *mean, const ct_tensor *rstd, ct_tensor **dx,
                                              ct_tensor **dw, ct_tensor **db);

/* x (..., C), w (C) or NULL, eps >= 0 -> y (..., C), rstd (...). */
CT_API ct_status ct_kernel_rmsnorm(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor **y, ct_tensor **rstd);

/* With xhat = x * rstd and g = dy * w:
 *   dx = rstd * (g - xhat * mean_C(g * xhat))
 *   dw = sum over rows of dy * xhat   (only when w is given; w's dtype)
 * Both new tensors. */
CT_API ct_status ct_kernel_rmsnorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                            const ct_tensor *rstd, ct_tensor **dx, ct_tensor **dw);

#endif
