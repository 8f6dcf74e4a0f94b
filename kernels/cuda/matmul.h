/* ctrain — CUDA matmul and linear (kernels/cuda/matmul.cu, the references in
 * kernels/cuda/matmul_ref.cu). Plain C, so kernels/matmul.c can include it.
 *
 * cti_cuda_matmul is the CUDA slot of kernels/matmul.c's table, with the contract of
 * kernels/cpu/matmul.h: out (B..., M, N) = alpha * op(a) @ op(b) + beta * out, a and
 * b strided views of one float dtype, out contiguous of the result's shape and a's
 * dtype (or f32 for bf16/f16 inputs), beta = 0 never reads out. cuBLASLt runs it:
 * f32 with f32 math (TF32 tensor cores when ct_cuda_allow_tf32()), f64 in f64,
 * bf16/f16 with f32 accumulation rounded once to out's dtype.
 */
#ifndef CT_KERNELS_CUDA_MATMUL_H
#define CT_KERNELS_CUDA_MATMUL_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/tensor.h"

ct_status cti_cuda_matmul(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b,
                          double alpha, double beta);
/* Reference: one thread per output element, the K products summed in double in k
 * order, alpha/beta applied in double, stored once. Any strides for a, b and out. */
ct_status cti_cuda_matmul_ref(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b,
                              double alpha, double beta);

/* y (R, O) = x (R, I) @ w (I, O) + bias (O), then GPT-2's tanh-GELU when gelu; the
 * layout of ct_linear (w stored (in, out)). y contiguous, x and w of y's dtype with
 * any strides, bias contiguous or NULL. bf16/f16: cuBLASLt's bias(+GELU) epilogue on
 * the f32 accumulator, rounded once; f32: the bias epilogue, then the GELU of
 * kernels/cpu/unary.c in f32; f64: the GEMM, then bias and GELU in double. */
ct_status cti_cuda_linear(ct_tensor *y, const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias, bool gelu);
/* Reference: one thread per output element, everything in double, stored once. */
ct_status cti_cuda_linear_ref(ct_tensor *y, const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias, bool gelu);

#ifdef __cplusplus
}
#endif

#endif
