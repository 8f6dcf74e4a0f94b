/* ctrain — CPU fused cross-entropy kernels (see kernels/loss.h for the math).
 *
 * Contract (checked by kernels/loss.c): tensors contiguous and on the CPU;
 * logits (rows, V) f32, f64, bf16 or f16; targets (rows) i64 or i32; loss 0-d of
 * the logits' dtype; lse (rows) f32, f64 for f64 logits (NULL allowed in the
 * forward); dloss one element of a float dtype; dlogits like logits. Target values
 * are validated here: one out of range (and not ignore_index) returns
 * CT_ERR_INVALID with a message naming the op, the position, the value and V,
 * before anything is written. Outputs are overwritten. The _ref versions are plain
 * loops in double, and the ref backward recomputes the softmax without lse.
 */
#ifndef CT_KERNELS_CPU_LOSS_H
#define CT_KERNELS_CPU_LOSS_H

#include <stdint.h>

#include "core/tensor.h"

ct_status cti_cpu_cross_entropy(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                ct_tensor *loss, ct_tensor *lse);
ct_status cti_cpu_cross_entropy_ref(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                    ct_tensor *loss, ct_tensor *lse);
ct_status cti_cpu_cross_entropy_backward(const ct_tensor *dloss, const ct_tensor *logits, const ct_tensor *targets,
                                         const ct_tensor *lse, int64_t ignore_index, ct_tensor *dlogits);
ct_status cti_cpu_cross_entropy_backward_ref(const ct_tensor *dloss, const ct_tensor *logits,
                                             const ct_tensor *targets, const ct_tensor *lse, int64_t ignore_index,
                                             ct_tensor *dlogits);

#endif
