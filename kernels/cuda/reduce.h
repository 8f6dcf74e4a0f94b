/* ctrain — CUDA reductions (kernels/cuda/reduce.cu).
 *
 * The contract is the CPU one (kernels/cpu/reduce.h), with "GPU" for "CPU":
 * kernels/reduce.c has checked everything; x is on a GPU and any strided view; bit
 * d of mask is set for each reduced dim d of x; out is contiguous with one element
 * per combination of x's kept dims, in x's dim order; out's dtype is the op's
 * result dtype (kernels/reduce.h); MAX/MIN/argmax only see non-empty reductions.
 * Kernels are queued on the current stream of x's device; nothing waits for them.
 *
 * Float sums accumulate in double and round once, as on the CPU; the order
 * depends on the shape only (never on the device), so results are reproducible.
 * The *_ref twins run one thread per output over the reduced elements in
 * row-major order with their own index arithmetic and a double (int64 for
 * integer sums) accumulator.
 *
 * Plain C with C linkage: kernels/reduce.c includes it.
 */
#ifndef CT_KERNELS_CUDA_REDUCE_H
#define CT_KERNELS_CUDA_REDUCE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* kernels/reduce.h has no C++ guards of its own */
#include "kernels/reduce.h"

ct_status cti_cuda_reduce(ct_reduce_op op, ct_tensor *out, const ct_tensor *x, uint32_t mask);
ct_status cti_cuda_reduce_ref(ct_reduce_op op, ct_tensor *out, const ct_tensor *x, uint32_t mask);
/* out = sum((x - mean)^2) / (N - correction), two passes; NaN when N <= correction. */
ct_status cti_cuda_var(ct_tensor *out, const ct_tensor *x, uint32_t mask, int64_t correction);
ct_status cti_cuda_var_ref(ct_tensor *out, const ct_tensor *x, uint32_t mask, int64_t correction);
/* out (I64) = index along dim (0 <= dim < x->ndim, or 0 for a 0-d x) of the first
 * maximum, or of the first NaN. */
ct_status cti_cuda_argmax(ct_tensor *out, const ct_tensor *x, int dim);
ct_status cti_cuda_argmax_ref(ct_tensor *out, const ct_tensor *x, int dim);

#ifdef __cplusplus
}
#endif

#endif
