/* ctrain — CUDA fused cross-entropy kernels (see kernels/loss.h for the math).
 *
 * Contract (checked by kernels/loss.c): tensors contiguous and on one GPU; logits
 * (rows, V) f32, f64, bf16 or f16; targets (rows) i64 or i32; loss 0-d of the logits'
 * dtype; lse (rows) f32, f64 for f64 logits (NULL allowed in the forward); dloss one
 * element of a float dtype; dlogits like logits. Target values are validated on the
 * device before anything is written: one out of range (and not ignore_index) returns
 * CT_ERR_INVALID with the CPU's message (op, position, value, V). That check copies
 * three numbers to the host (one synchronisation per call), because the API reports
 * a bad target as the call's own error. The _ref versions are one thread per row in
 * double, and the ref backward recomputes the softmax without lse. */
#ifndef CT_KERNELS_CUDA_LOSS_H
#define CT_KERNELS_CUDA_LOSS_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdint.h>

#include "core/tensor.h"

ct_status cti_cuda_cross_entropy(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                 ct_tensor *loss, ct_tensor *lse);
ct_status cti_cuda_cross_entropy_ref(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                     ct_tensor *loss, ct_tensor *lse);
ct_status cti_cuda_cross_entropy_backward(const ct_tensor *dloss, const ct_tensor *logits, const ct_tensor *targets,
                                          const ct_tensor *lse, int64_t ignore_index, ct_tensor *dlogits);
ct_status cti_cuda_cross_entropy_backward_ref(const ct_tensor *dloss, const ct_tensor *logits,
                                              const ct_tensor *targets, const ct_tensor *lse, int64_t ignore_index,
                                              ct_tensor *dlogits);

#ifdef __cplusplus
}
#endif

#endif
