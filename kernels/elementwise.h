/* ctrain — elementwise ops with numpy broadcasting.
 *
 * Every function that returns a tensor returns a NEW REFERENCE OWNED BY THE
 * CURRENT FRAME: a new contiguous tensor of the broadcast shape. The *_out
 * variants write into a caller's tensor of exactly the result's shape and dtype
 * (any strides); out may be one of the inputs itself (same storage, offset and
 * strides: in place); any other overlap between out and an input is handled
 * through a temporary. A NULL input returns NULL (or non-zero) and keeps the
 * earlier error message.
 *
 * Broadcasting follows numpy: shapes are aligned at the right; a dimension of
 * size 1 (or a missing one) stretches to the other's size; 0-d tensors broadcast
 * to anything; size-0 dims give empty results.
 *
 * Dtypes. Operands of a binary op must have the same dtype (no implicit
 * promotion: the error names both; use ct_tensor_cast).
 *   f32, f64          computed in their own precision.
 *   f16, bf16         computed in f32 and rounded once to the dtype at the end.
 *   i32, i64, u8      ADD SUB MUL MAX MIN, comparisons, NEG ABS RELU, with two's
 *                     complement wrap-around on overflow; DIV, POW and the
 *                     transcendental ops ask for a cast to a float dtype.
 *   bool              comparisons, MAX (or), MIN (and).
 *   fp8               rejected: cast to f32/bf16 first.
 * Comparisons (EQ ... GE) return BOOL; NaN compares unequal to everything.
 * MAX and MIN propagate NaN (as torch.maximum / torch.minimum).
 *
 * Scalars (binary_scalar): s is converted to the op's compute type first: f32
 * for f32/f16/bf16 tensors (not to the tensor's own low precision), f64 for f64,
 * and for integer tensors s must be an integer the dtype can hold.
 */
#ifndef CT_KERNELS_ELEMENTWISE_H
#define CT_KERNELS_ELEMENTWISE_H

#include "core/api.h"
#include "core/tensor.h"

typedef enum ct_binary_op {
    CT_BINARY_ADD,
    CT_BINARY_SUB,
    CT_BINARY_MUL,
    CT_BINARY_DIV,
    CT_BINARY_POW,
    CT_BINARY_MAX,
    CT_BINARY_MIN,
    CT_BINARY_EQ,
    CT_BINARY_NE,
    CT_BINARY_LT,
    CT_BINARY_LE,
    CT_BINARY_GT,
    CT_BINARY_GE,
    CT_BINARY_OP_COUNT
} ct_binary_op;

/* y = f(x). GELU_TANH: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
 * GELU_ERF: 0.5 x (1 + erf(x / sqrt 2)); SILU: x sigmoid(x); RSQRT: 1 / sqrt(x);
 * RELU: max(x, 0) with NaN kept. SIGMOID, SILU and the GELUs are stable for
 * large |x| (no overflow, no catastrophic cancellation in the tails). */
typedef enum ct_unary_op {
    CT_UNARY_NEG,
    CT_UNARY_ABS,
    CT_UNARY_EXP,
    CT_UNARY_LOG,
    CT_UNARY_SQRT,
    CT_UNARY_RSQRT,
    CT_UNARY_TANH,
    CT_UNARY_SIGMOID,
    CT_UNARY_RELU,
    CT_UNARY_GELU_TANH,
    CT_UNARY_GELU_ERF,
    CT_UNARY_SILU,
    CT_UNARY_OP_COUNT
} ct_unary_op;

/* "add", "sub", ..., "ge" / "neg", ..., "silu"; "invalid" for a bad value. Static strings. */
CT_API const char *ct_binary_op_name(ct_binary_op op);
CT_API const char *ct_unary_op_name(ct_unary_op op);
/* True for EQ, NE, LT, LE, GT, GE (the ops whose result is BOOL). */
CT_API bool ct_binary_op_is_comparison(ct_binary_op op);

/* out = a op b with broadcasting. New reference, owned by the current frame. */
CT_API ct_tensor *ct_kernel_binary(ct_binary_op op, const ct_tensor *a, const ct_tensor *b);
/* out = a op s. New reference, owned by the current frame. */
CT_API ct_tensor *ct_kernel_binary_scalar(ct_binary_op op, const ct_tensor *a, double s);
/* out = s op a (1 - x, 1 / x, 2 ^ x). New reference, owned by the current frame. */
CT_API ct_tensor *ct_kernel_rbinary_scalar(ct_binary_op op, double s, const ct_tensor *a);
/* out = a op b into out, which has the broadcast shape and the result dtype. */
CT_API ct_status ct_kernel_binary_out(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b);

/* out = f(x). New reference, owned by the current frame. */
CT_API ct_tensor *ct_kernel_unary(ct_unary_op op, const ct_tensor *x);
/* out = f(x) into out (same shape and dtype as x; may be x itself). */
CT_API ct_status ct_kernel_unary_out(ct_unary_op op, ct_tensor *out, const ct_tensor *x);

/* Backward of y = f(x): grad_in = grad_out * f'(x), a new tensor (overwritten, not
 * accumulated) of grad_out's shape and dtype; float dtypes only. grad_out, x and y
 * have one shape and one dtype (no broadcasting). y = f(x) is optional: EXP, TANH
 * and SIGMOID use it when given (then x may be NULL), else recompute it from x;
 * the other ops read only x. Derivatives at kinks: ABS'(0) = 0, RELU'(0) = 0.
 * New reference, owned by the current frame. */
CT_API ct_tensor *ct_kernel_unary_backward(ct_unary_op op, const ct_tensor *grad_out, const ct_tensor *x,
                                           const ct_tensor *y);

/* out = cond ? a : b, broadcasting over all three. cond is BOOL; a and b share a
 * dtype (any non-fp8 dtype), which is out's. New reference, owned by the current frame. */
CT_API ct_tensor *ct_kernel_where(const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b);

#endif
