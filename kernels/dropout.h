/* ctrain — dropout, forward and backward.
 *
 * x (any shape) -> y, mask (x's shape, u8); element i in row-major order is
 * kept iff u32_i >= p * 2^32, where u32_0, u32_1, ... are the next n = numel(x)
 * words of the Philox stream rng (ct_rng_u32, core/philox.h):
 *   y = mask ? x / (1 - p) : 0,      mask = 1 where kept, 0 where dropped
 * so the mask depends only on (seed, offset, n), never on the thread count or
 * the device, and a strided x gets the same mask as its contiguous copy. rng
 * advances by the words used (n rounded up to a multiple of 4); NULL means the
 * process generator (ct_rng_default). p = 0 returns a copy of x and an all-ones
 * mask, p = 1 zeros and an all-zeros mask; neither reads the stream. p outside
 * [0, 1] (or NaN) is an error.
 *
 * dtypes: x f32, f64, bf16 or f16; y has x's dtype (bf16/f16 scaled in f32 and
 * rounded once). The backward is dx = dy * mask / (1 - p) (zeros for p = 1),
 * with mask u8 or bool.
 *
 * Results are NEW REFERENCES OWNED BY THE CURRENT FRAME, or NULL with an error
 * naming the op and its operands. A NULL input returns NULL and keeps the earlier
 * error.
 */
#ifndef CT_KERNELS_DROPOUT_H
#define CT_KERNELS_DROPOUT_H

#include "core/api.h"
#include "core/philox.h"
#include "core/tensor.h"

/* Device functions (kernels/cpu/dropout.h). Tensors contiguous and checked;
 * 0 <= p <= 1; rng non-NULL. Outputs are overwritten. */
typedef ct_status (*ct_dropout_fn)(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask);
typedef ct_status (*ct_dropout_backward_fn)(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx);

/* Returns y; *mask (when mask is non-NULL) receives the mask, or NULL on failure. */
CT_API ct_tensor *ct_kernel_dropout(const ct_tensor *x, double p, ct_rng *rng, ct_tensor **mask);
/* dx = dy * mask / (1 - p), from the mask ct_kernel_dropout returned (new reference, current frame). */
CT_API ct_tensor *ct_kernel_dropout_backward(const ct_tensor *dy, const ct_tensor *mask, double p);

#endif
