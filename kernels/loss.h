/* ctrain — fused cross-entropy loss (log-softmax + negative log-likelihood, mean
 * over the counted targets), forward and backward.
 *
 * logits (..., V) f32, f64, bf16 or f16; targets (...) i64 or i32 (logits' shape
 * without the last dim; the usual case is logits (N, V), targets (N)). Per row r
 * with target t_r != ignore_index:
 *   lse_r  = m_r + log(sum_v exp(logits[r, v] - m_r)),  m_r = max_v logits[r, v]
 *   loss   = sum_r (lse_r - logits[r, t_r]) / count,   count = #rows not ignored
 * Subtracting the row max keeps this finite for logits of any finite size. With
 * no counted row the loss is NaN (0 / 0), as in PyTorch.
 *
 * The loss is a 0-d tensor of the logits' dtype (bf16/f16 computed in f32).
 * lse (the targets' shape) is f32, f64 for f64 logits, and is computed for every
 * row, ignored ones included.
 *
 * A target outside [0, V) that is not ignore_index is an error naming the op, its
 * position, its value and V; nothing is computed.
 *
 * Results are NEW REFERENCES OWNED BY THE CURRENT FRAME, or NULL with an error
 * naming the op and its operands. A NULL input returns NULL and keeps the earlier
 * error.
 */
#ifndef CT_KERNELS_LOSS_H
#define CT_KERNELS_LOSS_H

#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

/* Device functions (kernels/cpu/loss.h). Tensors contiguous and checked except
 * for target values, which the device function validates; lse may be NULL in the
 * forward. Outputs are overwritten. */
typedef ct_status (*ct_cross_entropy_fn)(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                         ct_tensor *loss, ct_tensor *lse);
typedef ct_status (*ct_cross_entropy_backward_fn)(const ct_tensor *dloss, const ct_tensor *logits,
                                                  const ct_tensor *targets, const ct_tensor *lse,
                                                  int64_t ignore_index, ct_tensor *dlogits);

/* Returns the loss; *lse (when lse is non-NULL) receives the row log-sum-exp for
 * backward, or NULL on failure. */
CT_API ct_tensor *ct_kernel_cross_entropy(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                          ct_tensor **lse);

/* dloss: one element (0-d usually), any float dtype. Returns dlogits (logits'
 * shape and dtype), a new tensor:
 *   dlogits[r, v] = (softmax(logits[r])[v] - [v == t_r]) * dloss / count
 * and 0 on ignored rows (all rows when count = 0). */
CT_API ct_tensor *ct_kernel_cross_entropy_backward(const ct_tensor *dloss, const ct_tensor *logits,
                                                   const ct_tensor *targets, const ct_tensor *lse, int64_t ignore_index);

#endif
