/* ctrain — CPU elementwise kernels (kernels/cpu/binary.c, unary.c; references in elementwise.c).
 *
 * Contract with the caller (kernels/elementwise.c has checked all of it): every
 * tensor is on the CPU; inputs broadcast to out's shape; dtypes are the ones the
 * op supports (see kernels/elementwise.h); out has no two elements at one
 * address; out either is exactly an input (same storage, offset and strides
 * where it matters) or does not overlap it. Inputs may be strided or expanded.
 *
 * Each fast kernel has a *_ref twin: one element at a time through
 * ct_scalar_load, math in double (int64 for integer ops), rounded once by
 * ct_scalar_store, with its own index arithmetic (no core/iter_internal.h), so tests
 * compare two independent implementations.
 */
#ifndef CT_KERNELS_CPU_ELEMENTWISE_H
#define CT_KERNELS_CPU_ELEMENTWISE_H

#include "kernels/elementwise.h"

/* out = a op b. out is a's dtype, or BOOL for comparisons. */
ct_status cti_cpu_binary(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b);
ct_status cti_cpu_binary_ref(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b);
/* out = a op s (reversed: s op a). Integer dtypes: s holds an integer in range. */
ct_status cti_cpu_binary_scalar(ct_binary_op op, ct_tensor *out, const ct_tensor *a, double s, bool reversed);
ct_status cti_cpu_binary_scalar_ref(ct_binary_op op, ct_tensor *out, const ct_tensor *a, double s,
                                    bool reversed);
/* out = cond ? a : b; cond BOOL; out, a, b one dtype. */
ct_status cti_cpu_where(ct_tensor *out, const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b);
ct_status cti_cpu_where_ref(ct_tensor *out, const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b);

/* out = f(x), same shape and dtype. */
ct_status cti_cpu_unary(ct_unary_op op, ct_tensor *out, const ct_tensor *x);
ct_status cti_cpu_unary_ref(ct_unary_op op, ct_tensor *out, const ct_tensor *x);
/* gin = gout * f'(x) (overwritten); same shapes, float dtypes. x or y may be NULL
 * where kernels/elementwise.h allows it. */
ct_status cti_cpu_unary_backward(ct_unary_op op, ct_tensor *gin, const ct_tensor *gout, const ct_tensor *x,
                                 const ct_tensor *y);
ct_status cti_cpu_unary_backward_ref(ct_unary_op op, ct_tensor *gin, const ct_tensor *gout,
                                     const ct_tensor *x, const ct_tensor *y);

/* ---- shared by the CPU elementwise files; not public ---------------------- */

/* Strides (elements) of t broadcast to an ndim-d shape: 0 on new and stretched dims.
 * t must broadcast to shape. */
void cti_cpu_ew_bcast_strides(const ct_tensor *t, int ndim, const int64_t *shape, int64_t *strides);

/* One piece of a row: p[k] is operand k's first element, s[k] its stride in
 * elements along the row, n the element count (n <= CT_CPU_EW_PIECE). */
typedef void (*ct_cpu_ew_row_fn)(const void *ctx, char *const *p, const int64_t *s, int64_t n);
#define CT_CPU_EW_PIECE 8192

/* Walks nops operands (base pointers, element sizes, element strides already
 * broadcast to the ndim-d shape) with core/iter_internal.h and calls fn on pieces of rows,
 * OpenMP-parallel over pieces for large shapes. Operand 0 is the output. */
void cti_cpu_ew_run(int ndim, const int64_t *shape, int nops, char *const *base, const int64_t *const *strides,
                    const size_t *esize, ct_cpu_ew_row_fn fn, const void *ctx);

/* Low-precision rows: n elements of f16/bf16/f32 at p (element stride s, 0 =
 * broadcast) to/from a contiguous f32 buffer. Exact on load; round to nearest
 * even on store. */
void cti_cpu_ew_load_f32(ct_dtype dt, const char *p, int64_t s, int64_t n, float *dst);
void cti_cpu_ew_store_f32(ct_dtype dt, char *p, int64_t s, int64_t n, const float *src);

#endif
