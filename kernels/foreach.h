/* ctrain — in-place kernels over gradient lists: what clipping and the fp16 loss
 * scaler do to every gradient of a step (optim/clip.c, precision/loss_scaler.c).
 *
 *   ct_kernel_scale_       x <- x * coef, in x's precision (PyTorch's mul_ by a scalar)
 *   ct_kernel_clamp_abs_   x <- clamp(x, -v, v); a NaN stays NaN
 *   ct_kernel_norm_partial the partial of one tensor for a global p-norm, in double:
 *                          p = 2: sum x^2; p = 1: sum |x|; other finite p: sum |x|^p;
 *                          p = inf: max |x| (a NaN wins). Blocks of 8192 elements are
 *                          reduced in a fixed order, so the bits never depend on thread
 *                          or block counts; the result is on the host.
 *   ct_kernel_unscale_     every gradient g <- g * inv in f32 and *found_inf = whether
 *                          any result is inf or NaN: one pass per tensor and, on a GPU,
 *                          one host synchronisation for the whole list.
 *
 * Tensors: f32 or f64 (unscale: f32), contiguous, any device (a list may not mix
 * devices in unscale). Errors name the op and the tensor. */
#ifndef CT_KERNELS_FOREACH_H
#define CT_KERNELS_FOREACH_H

#include <stdbool.h>

#include "core/api.h"
#include "core/tensor.h"

CT_API ct_status ct_kernel_scale_(ct_tensor *x, double coef);
CT_API ct_status ct_kernel_clamp_abs_(ct_tensor *x, double v);
CT_API ct_status ct_kernel_norm_partial(const ct_tensor *x, double p, double *out);
CT_API ct_status ct_kernel_unscale_(int n, ct_tensor *const *grads, float inv, bool *found_inf);

/* Device functions (kernels/cpu/foreach.c, kernels/cuda/foreach.cu); arguments
 * checked by the entry points. kind: 0 sum x^2, 1 sum |x|, 2 sum |x|^p, 3 max |x|. */
typedef ct_status (*ct_scale_fn)(ct_tensor *x, double coef);
typedef ct_status (*ct_clamp_fn)(ct_tensor *x, double v);
typedef ct_status (*ct_norm_partial_fn)(const ct_tensor *x, int kind, double p, double *out);
typedef ct_status (*ct_unscale_fn)(int n, ct_tensor *const *grads, float inv, bool *found_inf);

#endif
