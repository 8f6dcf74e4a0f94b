/* ctrain — kernel dispatch.
 *
 * Each op family (kernels/matmul.c, kernels/elementwise.c, ...) keeps one table
 * per op indexed by device type:
 *     static const ct_softmax_fn softmax_impl[CT_DEVICE_TYPE_COUNT] = {
 *         [CT_DEVICE_CPU] = cti_cpu_softmax,   // CUDA slot filled when built with nvcc
 *     };
 * The tensor-level entry point (ct_kernel_softmax) checks its arguments, makes
 * the output and calls the slot for the inputs' device; the dtype switch lives
 * inside the device function. Every device function has a plain reference
 * version (double accumulation) beside it, named *_ref, that tests compare the
 * fast one against.
 */
#ifndef CT_KERNELS_DISPATCH_INTERNAL_H
#define CT_KERNELS_DISPATCH_INTERNAL_H

#include "core/tensor.h"

/* Records "op: no kernel for <device> (...)" and returns CT_ERR_UNSUPPORTED. */
ct_status cti_kernel_unavailable(const char *op, ct_device dev);
/* Checks that every non-NULL tensor among ts[0..n) is on one device and returns
 * CT_OK, else records an error naming op and the tensors. */
ct_status cti_kernel_same_device(const char *op, const ct_tensor *const *ts, int n);

/* ---- argument checks shared by the entry points ------------------------------
 * The ct_kernel_check_* functions return CT_OK, or record a message that names
 * op and the operand ("softmax: x must be f32, f64, bf16 or f16, got i64[2, 3]
 * cpu") and return CT_ERR_INVALID. */

/* f32, f64, bf16 or f16: the dtypes the float kernels take. */
bool cti_kernel_is_float(ct_dtype dt);
bool cti_kernel_is_fp8(ct_dtype dt);
/* The dtype of per-row statistics (lse, mean, rstd): f64 for f64 inputs, else f32. */
ct_dtype cti_kernel_stat_dtype(ct_dtype dt);
/* t has x's shape without its last dim (one value per row of x). */
bool cti_kernel_is_row_shaped(const ct_tensor *t, const ct_tensor *x);

/* "op: name must be f32, f64, bf16 or f16, got ...". */
ct_status cti_kernel_check_float(const char *op, const char *name, const ct_tensor *t);
/* A float tensor of rows of at least one dim: "op: name must be an f32, f64, bf16
 * or f16 tensor of shape (..., row), got ..." (row names the last dim: "C", "V"). */
ct_status cti_kernel_check_float_rows(const char *op, const char *name, const ct_tensor *t, const char *row);
/* "op: an A and bn B must have the same shape and dtype". */
ct_status cti_kernel_check_same(const char *op, const char *an, const ct_tensor *a, const char *bn,
                                const ct_tensor *b);
/* Records why op does not take t's dtype and returns CT_ERR_UNSUPPORTED: fp8 asks
 * for a cast to f32 or bf16 first, integer and bool dtypes for a cast to a float
 * dtype. */
ct_status cti_kernel_unsupported_dtype(const char *op, const ct_tensor *t);
/* A required input is NULL: keeps the earlier failure's status and message when
 * there is one (its NULL result is what the caller passed on), else records
 * "op: name is NULL" (CT_ERR_INVALID). Never CT_OK. */
ct_status cti_kernel_null_input(const char *op, const char *name);

/* t itself when contiguous (or NULL), else a contiguous copy in the current frame;
 * NULL when the copy fails (error recorded). */
const ct_tensor *cti_kernel_contiguous(const ct_tensor *t);

#endif
