/* ctrain — softmax and log-softmax over one dimension, forward and backward.
 *
 * Along dim (negative counts from the end), with m = max over the dim:
 *   softmax      y = exp(x - m) / sum exp(x - m)
 *   log_softmax  y = (x - m) - log(sum exp(x - m))
 * Subtracting the max keeps both finite for any finite input (logits of +-1e4
 * included). A 0-d tensor is a one-element dim (dim 0 or -1).
 *
 * dtypes: f32, f64, bf16, f16; bf16/f16 are computed in f32 and rounded once to
 * the input dtype. Inputs may be non-contiguous; outputs are new contiguous
 * tensors of the input's dtype and shape.
 *
 * Every function returns a NEW REFERENCE OWNED BY THE CURRENT FRAME, or NULL with
 * an error naming the op and its operands (ct_last_error). A NULL input returns
 * NULL and keeps the earlier error.
 */
#ifndef CT_KERNELS_SOFTMAX_H
#define CT_KERNELS_SOFTMAX_H

#include "core/api.h"
#include "core/tensor.h"

/* Device functions (kernels/cpu/softmax.h). Inputs contiguous with the same shape
 * and dtype as the output; dim already normalised to [0, ndim) (0 for 0-d). */
typedef ct_status (*ct_softmax_fn)(const ct_tensor *x, ct_tensor *y, int dim);
typedef ct_status (*ct_softmax_backward_fn)(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);

/* Softmax of x along dim, without autograd (new reference, current frame). */
CT_API ct_tensor *ct_kernel_softmax(const ct_tensor *x, int dim);
/* Log-softmax of x along dim, without autograd (new reference, current frame). */
CT_API ct_tensor *ct_kernel_log_softmax(const ct_tensor *x, int dim);
/* y is the forward output. dx = y * (dy - sum(dy * y)), the sum along dim. */
CT_API ct_tensor *ct_kernel_softmax_backward(const ct_tensor *dy, const ct_tensor *y, int dim);
/* y is the forward output (log-probabilities). dx = dy - exp(y) * sum(dy). */
CT_API ct_tensor *ct_kernel_log_softmax_backward(const ct_tensor *dy, const ct_tensor *y, int dim);

#endif
