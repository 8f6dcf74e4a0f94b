/* ctrain — reductions: sum, mean, max, min, var, argmax, sum_to_shape.
 *
 * Every function returns a NEW REFERENCE OWNED BY THE CURRENT FRAME (a new
 * contiguous tensor), or NULL with an error naming the op, the dims and the
 * input. A NULL input returns NULL and keeps the earlier message.
 *
 * Dims. dims[0..ndims) may be negative (counted from the end) and must be
 * distinct; ndims == 0 reduces over every dim. keepdim keeps each reduced dim
 * with size 1, as in PyTorch. A 0-d input accepts dim 0 or -1 (a no-op).
 *
 * Dtypes and precision.
 *   f32, f64, f16, bf16: sum, mean and var accumulate in double, in an order
 *     fixed by the input's shape and strides (never by the thread count), and
 *     round once to the input's dtype; max, min are exact.
 *   i32, i64, u8, bool: sum (result I64, wrapping on overflow, as PyTorch),
 *     max, min (same dtype), argmax; mean and var ask for a cast to float.
 *   fp8: rejected (cast first).
 * NaN propagates through max/min; argmax returns the first NaN's index (as
 * PyTorch), else the first maximum's.
 * Empty reductions: sum = 0, mean = NaN, var = NaN; max, min and argmax over an
 * empty dim are errors. var with N <= correction elements is NaN.
 */
#ifndef CT_KERNELS_REDUCE_H
#define CT_KERNELS_REDUCE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

typedef enum ct_reduce_op { CT_REDUCE_SUM, CT_REDUCE_MEAN, CT_REDUCE_MAX, CT_REDUCE_MIN, CT_REDUCE_OP_COUNT } ct_reduce_op;

/* Sum over dims[0..ndims) (ndims 0: every dim), keeping them as size 1 when keepdim (new
 * reference, current frame). */
CT_API ct_tensor *ct_kernel_sum(const ct_tensor *x, const int *dims, int ndims, bool keepdim);
/* Mean over dims, as ct_kernel_sum (new reference, current frame). */
CT_API ct_tensor *ct_kernel_mean(const ct_tensor *x, const int *dims, int ndims, bool keepdim);
/* Maximum over dims, as ct_kernel_sum; NaN propagates (new reference, current frame). */
CT_API ct_tensor *ct_kernel_max(const ct_tensor *x, const int *dims, int ndims, bool keepdim);
/* Minimum over dims, as ct_kernel_sum; NaN propagates (new reference, current frame). */
CT_API ct_tensor *ct_kernel_min(const ct_tensor *x, const int *dims, int ndims, bool keepdim);
/* Index (I64) of the largest element along dim. */
CT_API ct_tensor *ct_kernel_argmax(const ct_tensor *x, int dim, bool keepdim);
/* sum((x - mean)^2) / (N - correction): correction 1 = unbiased (PyTorch's
 * default), 0 = population. Float dtypes only. */
CT_API ct_tensor *ct_kernel_var(const ct_tensor *x, const int *dims, int ndims, int64_t correction, bool keepdim);

/* Sums x down to shape (ndim dims), the inverse of broadcasting shape to x's
 * shape (autograd's gradient of a broadcasting op): leading dims of x are summed
 * away, and dims where shape has 1 and x does not are summed with keepdim.
 * shape must broadcast to x's shape. The result has exactly `shape` and the
 * dtype ct_kernel_sum gives; when shape equals x's shape it is a copy. */
CT_API ct_tensor *ct_kernel_sum_to_shape(const ct_tensor *x, int ndim, const int64_t *shape);

#endif
