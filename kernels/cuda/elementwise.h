/* ctrain — CUDA elementwise kernels (kernels/cuda/binary.cu, unary.cu).
 *
 * The contract is the CPU one (kernels/cpu/elementwise.h), with "GPU" for "CPU":
 * kernels/elementwise.c has checked everything; every tensor is on one GPU; inputs
 * broadcast to out's shape; out and the inputs may be any strided or expanded
 * views; out is either exactly an input (in place) or disjoint from it. Kernels
 * are queued on the current stream of out's device; nothing waits for them.
 *
 * The fast kernels fold the broadcast shape into as few dims as the strides
 * allow and take a flat loop when every operand is then contiguous. Their
 * *_ref twins run one thread per output element with their own index arithmetic
 * on the unfolded shapes, compute in double (int64 with wrap-around for integer
 * ops), and round once, as the CPU references do; tests compare both against
 * the CPU.
 *
 * Plain C with C linkage: kernels/elementwise.c includes it.
 */
#ifndef CT_KERNELS_CUDA_ELEMENTWISE_H
#define CT_KERNELS_CUDA_ELEMENTWISE_H

#ifdef __cplusplus
extern "C" {
#endif

/* kernels/elementwise.h has no C++ guards of its own */
#include "kernels/elementwise.h"

/* out = a op b; out is a's dtype, or BOOL for comparisons. */
ct_status cti_cuda_binary(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b);
ct_status cti_cuda_binary_ref(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b);
/* out = a op s (reversed: s op a); s in the compute type as kernels/elementwise.h says. */
ct_status cti_cuda_binary_scalar(ct_binary_op op, ct_tensor *out, const ct_tensor *a, double s, bool reversed);
ct_status cti_cuda_binary_scalar_ref(ct_binary_op op, ct_tensor *out, const ct_tensor *a, double s,
                                     bool reversed);
/* out = cond ? a : b; cond BOOL; out, a, b one dtype (moved as opaque words). */
ct_status cti_cuda_where(ct_tensor *out, const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b);
ct_status cti_cuda_where_ref(ct_tensor *out, const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b);

/* out = f(x), same shape and dtype. */
ct_status cti_cuda_unary(ct_unary_op op, ct_tensor *out, const ct_tensor *x);
ct_status cti_cuda_unary_ref(ct_unary_op op, ct_tensor *out, const ct_tensor *x);
/* gin = gout * f'(x) (overwritten); one shape, float dtypes; x or y may be NULL
 * where kernels/elementwise.h allows it. */
ct_status cti_cuda_unary_backward(ct_unary_op op, ct_tensor *gin, const ct_tensor *gout, const ct_tensor *x,
                                  const ct_tensor *y);
ct_status cti_cuda_unary_backward_ref(ct_unary_op op, ct_tensor *gin, const ct_tensor *gout,
                                      const ct_tensor *x, const ct_tensor *y);

#ifdef __cplusplus
}
#endif

#endif
