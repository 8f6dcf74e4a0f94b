/* ctrain — matrix multiplication, 2-D and batched.
 *
 *   a (..., M, K), or (..., K, M) when trans_a      op(a) = trans_a ? a^T : a   (M, K)
 *   b (..., K, N), or (..., N, K) when trans_b      op(b) = trans_b ? b^T : b   (K, N)
 *   out (bcast..., M, N) = op(a) @ op(b)
 * over the last two dims; the leading (batch) dims broadcast with numpy rules, so
 * (2,1,3,4) @ (5,4,6) -> (2,5,3,6). Both inputs need >= 2 dims and one dtype:
 * f32 or f64 (OpenBLAS / oneDNN GEMM), bf16 or f16 (f32 accumulation, the result
 * rounded once to the input dtype). Inputs may be strided views: a transposed or
 * row-sliced matrix goes to the GEMM as is (leading dimension = its stride); other
 * layouts are copied first. Which library runs is chosen in kernels/cpu/matmul.h.
 */
#ifndef CT_KERNELS_MATMUL_H
#define CT_KERNELS_MATMUL_H

#include <stdbool.h>

#include "core/api.h"
#include "core/tensor.h"

/* op(a) @ op(b). New reference, owned by the current frame; NULL and an error
 * (naming the op and both operands) on a shape, dtype or device mismatch. */
CT_API ct_tensor *ct_kernel_matmul(const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b);

/* out = alpha * op(a) @ op(b) + beta * out, into an existing contiguous out of the
 * result's shape and the inputs' dtype, or f32 for bf16/f16 inputs (the f32
 * accumulation then is the result, never rounded to 16 bits). beta = 0 never reads
 * out (NaNs there do not propagate); backward passes accumulate with beta = 1. */
CT_API ct_status ct_kernel_matmul_out(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                                      bool trans_b, double alpha, double beta);

/* y (..., out) = x (..., in) @ w (in, out) + bias (out), then GPT-2's tanh-GELU
 * (CT_UNARY_GELU_TANH) when gelu: the layout of ct_linear (w stored (in, out), the
 * HuggingFace Conv1D one); bias may be NULL. x, w, bias: one float dtype, one
 * device; x may be strided. On the CPU the existing kernels compose it (bias copied
 * into y, the GEMM adds x @ w with beta = 1, then the GELU); on a GPU cuBLASLt's
 * bias / bias+GELU epilogues fuse it into the GEMM (kernels/cuda/matmul.h), so a
 * bf16/f16 result is rounded once instead of up to three times. New reference, owned
 * by the current frame; NULL and an error naming the operands otherwise. */
CT_API ct_tensor *ct_kernel_linear(const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias, bool gelu);

#endif
