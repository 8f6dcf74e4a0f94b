/* ctrain — CPU reductions (kernels/cpu/reduce.c).
 *
 * Contract with the caller (kernels/reduce.c has checked it): x is on the CPU
 * and any strided view; bit d of mask is set for each reduced dim d of x; out
 * is contiguous with one element per combination of x's kept dims, in x's dim
 * order (so its shape may keep the reduced dims as 1 or drop them); out's dtype
 * is the op's result dtype (see kernels/reduce.h). MAX/MIN/argmax are only
 * called with a non-empty reduction.
 *
 * The *_ref twins loop over output elements and then over the reduced elements
 * in row-major order with ct_scalar_load and a double (int64 for integer sums)
 * accumulator and their own index arithmetic, for tests to compare against.
 */
#ifndef CT_KERNELS_CPU_REDUCE_H
#define CT_KERNELS_CPU_REDUCE_H

#include <stdint.h>

#include "kernels/reduce.h"

ct_status cti_cpu_reduce(ct_reduce_op op, ct_tensor *out, const ct_tensor *x, uint32_t mask);
ct_status cti_cpu_reduce_ref(ct_reduce_op op, ct_tensor *out, const ct_tensor *x, uint32_t mask);
/* out = sum((x - mean)^2) / (N - correction); NaN when N <= correction. */
ct_status cti_cpu_var(ct_tensor *out, const ct_tensor *x, uint32_t mask, int64_t correction);
ct_status cti_cpu_var_ref(ct_tensor *out, const ct_tensor *x, uint32_t mask, int64_t correction);
/* out (I64) = index along dim (0 <= dim < x->ndim, or 0 for a 0-d x) of the first
 * maximum, or of the first NaN. */
ct_status cti_cpu_argmax(ct_tensor *out, const ct_tensor *x, int dim);
ct_status cti_cpu_argmax_ref(ct_tensor *out, const ct_tensor *x, int dim);

#endif
