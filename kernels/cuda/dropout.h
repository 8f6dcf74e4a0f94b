/* ctrain — CUDA dropout kernels (see kernels/dropout.h for the math and the mask rule).
 *
 * Contract (checked by kernels/dropout.c): tensors contiguous and on one GPU, of one
 * shape; x, y, dy, dx f32, f64, bf16 or f16 (y like x, dx like dy); mask u8 (u8 or
 * bool in the backward); 0 <= p <= 1; rng non-NULL. Outputs are overwritten, on the
 * current stream of the tensors' device. The words come from the same Philox
 * counters as on the CPU (core/philox_bits.h), and rng advances exactly as
 * ct_rng_u32 would, so a seed and offset give the CPU's mask bit for bit. The _ref
 * versions are one thread per element in double, recomputing its Philox block. */
#ifndef CT_KERNELS_CUDA_DROPOUT_H
#define CT_KERNELS_CUDA_DROPOUT_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/philox.h"
#include "core/tensor.h"

ct_status cti_cuda_dropout(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask);
ct_status cti_cuda_dropout_ref(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask);
ct_status cti_cuda_dropout_backward(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx);
ct_status cti_cuda_dropout_backward_ref(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx);

#ifdef __cplusplus
}
#endif

#endif
