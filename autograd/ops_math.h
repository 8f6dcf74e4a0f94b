/* ctrain — differentiable elementwise ops, activations, matmul and reductions.
 *
 * Every function returns a NEW REFERENCE OWNED BY THE CURRENT FRAME, computed by
 * the kernels (kernels/elementwise.h, kernels/matmul.h, kernels/reduce.h), and
 * records a graph node when grad mode is on and an input requires grad. A NULL
 * input gives NULL and keeps the earlier error; a bad call gives NULL with a
 * message naming the op and the operands (e.g. "add: cannot broadcast f32[3]
 * cpu with f32[4] cpu").
 *
 * Binary ops broadcast with numpy rules (0-d tensors broadcast to anything);
 * operands share one dtype (no promotion). The gradient of a broadcast operand
 * is summed back to its shape. Scalars are converted to the op's compute type
 * (f32 for f32/f16/bf16 tensors, f64 for f64).
 *
 * Derivatives at kinks and ties, matching PyTorch:
 *   relu'(0) = 0, abs'(0) = 0;
 *   maximum/minimum: the larger (smaller) operand gets the gradient; on a tie
 *     each operand gets half of it (torch.maximum's rule);
 *   pow(a, b): d/db = y ln(a), taken as 0 where a == 0 and b >= 0;
 *     d/da = b a^(b-1), taken as 0 where b == 0;
 *   max/min over dims: the whole gradient goes to the first extreme element in
 *     row-major order of the reduced dims (torch.max(dim)'s index).
 */
#ifndef CT_AUTOGRAD_OPS_MATH_H
#define CT_AUTOGRAD_OPS_MATH_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

/* ---- binary, broadcasting ---------------------------------------------------- */

/* a + b elementwise, broadcasting. */
CT_API ct_tensor *ct_add(ct_tensor *a, ct_tensor *b);
/* a - b elementwise, broadcasting. */
CT_API ct_tensor *ct_sub(ct_tensor *a, ct_tensor *b);
/* a * b elementwise, broadcasting. */
CT_API ct_tensor *ct_mul(ct_tensor *a, ct_tensor *b);
/* a / b elementwise, broadcasting. */
CT_API ct_tensor *ct_div(ct_tensor *a, ct_tensor *b);
/* a ^ b elementwise. */
CT_API ct_tensor *ct_pow(ct_tensor *a, ct_tensor *b);
/* Elementwise max / min; NaN propagates. */
CT_API ct_tensor *ct_maximum(ct_tensor *a, ct_tensor *b);
CT_API ct_tensor *ct_minimum(ct_tensor *a, ct_tensor *b);

/* ---- with a scalar ------------------------------------------------------------- */

/* x + s elementwise. */
CT_API ct_tensor *ct_add_scalar(ct_tensor *x, double s);  /* x + s */
/* x * s elementwise. */
CT_API ct_tensor *ct_mul_scalar(ct_tensor *x, double s);  /* x * s */
/* x / s elementwise. */
CT_API ct_tensor *ct_div_scalar(ct_tensor *x, double s);  /* x / s */
/* x ^ p elementwise. */
CT_API ct_tensor *ct_pow_scalar(ct_tensor *x, double p);  /* x ^ p */
/* s - x elementwise. */
CT_API ct_tensor *ct_rsub_scalar(double s, ct_tensor *x); /* s - x */
/* s / x elementwise. */
CT_API ct_tensor *ct_rdiv_scalar(double s, ct_tensor *x); /* s / x */

/* ---- unary ------------------------------------------------------------------------ */

/* -x elementwise. */
CT_API ct_tensor *ct_neg(ct_tensor *x);
/* e ^ x elementwise. */
CT_API ct_tensor *ct_exp(ct_tensor *x);
/* Natural logarithm elementwise. */
CT_API ct_tensor *ct_log(ct_tensor *x);
/* Square root elementwise. */
CT_API ct_tensor *ct_sqrt(ct_tensor *x);
/* 1 / sqrt(x) elementwise. */
CT_API ct_tensor *ct_rsqrt(ct_tensor *x); /* 1 / sqrt(x) */
/* Hyperbolic tangent elementwise. */
CT_API ct_tensor *ct_tanh(ct_tensor *x);
/* 1 / (1 + e ^ -x) elementwise. */
CT_API ct_tensor *ct_sigmoid(ct_tensor *x);
/* max(x, 0) elementwise. */
CT_API ct_tensor *ct_relu(ct_tensor *x);
/* GPT-2's gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
CT_API ct_tensor *ct_gelu(ct_tensor *x);
/* Exact gelu: 0.5 x (1 + erf(x / sqrt 2)). */
CT_API ct_tensor *ct_gelu_erf(ct_tensor *x);
/* x * sigmoid(x) elementwise. */
CT_API ct_tensor *ct_silu(ct_tensor *x); /* x sigmoid(x) */
/* |x| elementwise. */
CT_API ct_tensor *ct_abs(ct_tensor *x);

/* ---- matmul and linear ---------------------------------------------------------- */

/* a (..., M, K) @ b (..., K, N) -> (bcast..., M, N); batch dims broadcast (numpy
 * rules); both inputs need >= 2 dims. */
CT_API ct_tensor *ct_matmul(ct_tensor *a, ct_tensor *b);
/* op(a) @ op(b) with op(t) = t^T (last two dims) when the flag is set, without
 * materialising the transpose: a (..., K, M) when trans_a, b (..., N, K) when trans_b. */
CT_API ct_tensor *ct_matmul_t(ct_tensor *a, ct_tensor *b, bool trans_a, bool trans_b);
/* y (..., out) = x (..., in) @ w (in, out) + b (out), the HuggingFace Conv1D
 * layout (w stored (in, out)); b may be NULL. The bias is added by the GEMM
 * itself (beta = 1), and backward computes dw = x^T dy over all leading dims in
 * one GEMM. */
CT_API ct_tensor *ct_linear(ct_tensor *x, ct_tensor *w, ct_tensor *b);

/* ---- reductions ----------------------------------------------------------------- */

/* dims[0..ndims) may be negative and must be distinct; ndims == 0 reduces over
 * every dim; keepdim keeps reduced dims with size 1. Float dtypes (sum also takes
 * integers, giving i64 without a gradient). */
CT_API ct_tensor *ct_sum(ct_tensor *x, const int *dims, int ndims, bool keepdim);
CT_API ct_tensor *ct_mean(ct_tensor *x, const int *dims, int ndims, bool keepdim);
/* Largest / smallest value over dims; the gradient goes to the first such element. */
CT_API ct_tensor *ct_max(ct_tensor *x, const int *dims, int ndims, bool keepdim);
CT_API ct_tensor *ct_min(ct_tensor *x, const int *dims, int ndims, bool keepdim);
/* sum((x - mean)^2) / (N - correction); correction 1 = unbiased, 0 = population. */
CT_API ct_tensor *ct_var(ct_tensor *x, const int *dims, int ndims, int64_t correction, bool keepdim);
/* 0-d sum / mean of every element. */
CT_API ct_tensor *ct_sum_all(ct_tensor *x);
CT_API ct_tensor *ct_mean_all(ct_tensor *x);

#endif
