/* ctrain — CUDA fp8 quantisation and fp8 GEMM (kernels/cuda/fp8.cu), the GPU side of
 * precision/fp8.h's ct_fp8_quantize and ct_fp8_matmul. Plain C, so precision/fp8.c
 * can include it.
 */
#ifndef CT_KERNELS_CUDA_FP8_H
#define CT_KERNELS_CUDA_FP8_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/tensor.h"

/* out (f8_e4m3 or f8_e5m2, contiguous, x's shape) = round(x * scale) saturated to the
 * format's finite range, x a contiguous f32, bf16 or f16 GPU tensor; *amax = max |x|
 * (NaN when x holds one; 0 for an empty x). The amax comes back to the host, so this
 * waits for the kernels. Fast: one pass quantises and leaves a max per block, a
 * second reduces those (no float atomics); the reference: one thread per element
 * and an integer atomicMax on the bits of |x| (order-free for non-negative floats). */
ct_status cti_cuda_fp8_quantize(ct_tensor *out, const ct_tensor *x, float scale, float *amax);
ct_status cti_cuda_fp8_quantize_ref(ct_tensor *out, const ct_tensor *x, float scale, float *amax);

/* out (M, N) f32 contiguous = op(a) @ op(b) / (a->scale * b->scale), a and b 2-D fp8
 * on one GPU. sm_89 and later: cuBLASLt's fp8 GEMM (f32 accumulation) when M, N, K
 * are multiples of 16 and the pair of formats is one it takes (not e5m2 x e5m2);
 * otherwise the fp8 values are widened exactly to bf16 and multiplied by the bf16
 * GEMM with f32 accumulation, as the CPU does. */
ct_status cti_cuda_fp8_matmul(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b);
/* Reference: one thread per output element, the products summed in f32 in k order,
 * then times 1 / (a->scale * b->scale) worked out in f32, as ct_fp8_matmul_ref. */
ct_status cti_cuda_fp8_matmul_ref(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                                  bool trans_b);

#ifdef __cplusplus
}
#endif

#endif
