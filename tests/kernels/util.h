/* Helpers shared by the kernel tests (tests/kernels/test_*.c): comparisons in
 * double, the tolerances they are held to, random inputs and error-message checks.
 *
 * Tensors these helpers return are new references owned by the current frame,
 * like the library's own; comparisons that make temporaries free them in a frame
 * of their own. */
#ifndef CT_TESTS_KERNELS_UTIL_H
#define CT_TESTS_KERNELS_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"

/* The float dtypes every kernel takes, in the order the tests loop over them (the
 * order fixes which random draws each dtype gets). */
static const ct_dtype float_dtypes[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

/* The relative error a fast kernel may have against its double reference: f32
 * 1e-6, bf16/f16 (and anything else) 1e-2, f64 `f64_tol` (double paths differ in
 * how far they are from the reference); tol_for uses 1e-12 for f64. */
static inline double tol_for_f64(ct_dtype dt, double f64_tol)
{
    return dt == CT_DTYPE_F64 ? f64_tol : dt == CT_DTYPE_F32 ? 1e-6 : 1e-2;
}

static inline double tol_for(ct_dtype dt) { return tol_for_f64(dt, 1e-12); }

/* t's elements as doubles in row-major order of its logical shape (a contiguous
 * f64 copy in the current frame, so callers may write to it). */
static inline double *f64_data(const ct_tensor *t)
{
    ct_tensor *c = ct_tensor_cast(t, CT_DTYPE_F64);
    cr_assert_not_null(c, "%s", ct_last_error());
    return ct_tensor_data(c);
}

/* A tensor of dtype dt holding the doubles v (cast from f64). */
static inline ct_tensor *from_f64(ct_dtype dt, int ndim, const int64_t *shape, const double *v)
{
    ct_tensor *t = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F64, ndim, shape, v), dt);
    cr_assert_not_null(t, "%s", ct_last_error());
    return t;
}

/* ||x - ref|| / ||ref|| over n doubles (absolute when ref is all zeros). Strict
 * (nonfinite_ok false): any NaN or infinity in either makes it INFINITY. With
 * nonfinite_ok, equal values (infinities) and NaN in both places count as equal,
 * and any other non-finite value as INFINITY. */
static inline double rel_err_n(const double *x, const double *ref, int64_t n, bool nonfinite_ok)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(ref[i])) {
            if (nonfinite_ok && (x[i] == ref[i] || (isnan(x[i]) && isnan(ref[i])))) continue;
            return INFINITY;
        }
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline double rel_err_tensors(const ct_tensor *x, const ct_tensor *ref, bool nonfinite_ok)
{
    cr_assert_not_null(x, "%s", ct_last_error());
    cr_assert_not_null(ref, "%s", ct_last_error());
    cr_assert(ct_tensor_same_shape(x, ref), "shapes differ");
    double e = 0;
    CT_FRAME { e = rel_err_n(f64_data(x), f64_data(ref), ct_tensor_numel(ref), nonfinite_ok); }
    return e;
}

/* rel_err_n over two tensors of one shape (any dtypes and layouts). */
static inline double rel_err(const ct_tensor *x, const ct_tensor *ref) { return rel_err_tensors(x, ref, false); }
static inline double rel_err_nan(const ct_tensor *x, const ct_tensor *ref)
{
    return rel_err_tensors(x, ref, true);
}

/* sum a[i] * b[i] over all elements, in double. */
static inline double dot(const ct_tensor *a, const ct_tensor *b)
{
    double s = 0;
    CT_FRAME {
        double *x = f64_data(a), *y = f64_data(b);
        for (int64_t i = 0; i < ct_tensor_numel(a); i++) s += x[i] * y[i];
    }
    return s;
}

/* Every element is finite. */
static inline bool all_finite(const ct_tensor *t)
{
    bool ok = true;
    CT_FRAME {
        const double *p = f64_data(t);
        for (int64_t i = 0; i < ct_tensor_numel(t); i++) ok = ok && isfinite(p[i]);
    }
    return ok;
}

/* The same size and the same bytes (contiguous tensors). */
static inline bool same_bits(const ct_tensor *a, const ct_tensor *b)
{
    return ct_tensor_nbytes(a) == ct_tensor_nbytes(b) &&
           memcmp(ct_tensor_data(a), ct_tensor_data(b), ct_tensor_nbytes(a)) == 0;
}

/* Random i64 or i32 ids in [0, V), one uniform draw per element: from only
 * `distinct` values when distinct > 0 (so they repeat), and each replaced by
 * `ignore` with probability ignore_p (cross-entropy's ignore_index). */
static inline ct_tensor *random_ids(ct_dtype dt, int ndim, const int64_t *shape, int64_t V, int64_t distinct,
                                    double ignore_p, int64_t ignore)
{
    ct_tensor *u = ct_tensor_rand(CT_DTYPE_F64, ndim, shape, 0, 1);
    ct_tensor *t = ct_tensor_empty(dt, ndim, shape);
    cr_assert(u && t, "%s", ct_last_error());
    double *up = ct_tensor_data(u);
    for (int64_t i = 0; i < ct_tensor_numel(t); i++) {
        int64_t v = up[i] < ignore_p ? ignore
                    : distinct > 0   ? ((int64_t)(up[i] * (double)distinct) * 7919) % V
                                     : (int64_t)(up[i] * (double)V) % V;
        if (dt == CT_DTYPE_I64) ((int64_t *)ct_tensor_data(t))[i] = v;
        else ((int32_t *)ct_tensor_data(t))[i] = (int32_t)v;
    }
    return t;
}

/* Element i of a contiguous i64 or i32 id tensor. */
static inline int64_t id_at(const ct_tensor *ids, int64_t i)
{
    return ids->dtype == CT_DTYPE_I64 ? ((int64_t *)ct_tensor_data(ids))[i] : ((int32_t *)ct_tensor_data(ids))[i];
}

/* ERROR_HAS("op", "f32[2, 3]", ...): the last error message holds every string.
 * EXPECT_ERROR(failed, "op", ...): also asserts `failed` (the call's result says
 * it failed). A failure names the checking line. */
static inline void error_has_at(const char *file, int line, const char *const *needles)
{
    const char *msg = ct_last_error();
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(msg, needles[i]), "%s:%d: message \"%s\" lacks \"%s\"", file, line, msg, needles[i]);
}
#define ERROR_HAS(...) error_has_at(__FILE__, __LINE__, (const char *const[]){__VA_ARGS__, NULL})
#define EXPECT_ERROR(failed, ...)                           \
    do {                                                    \
        cr_assert((failed), "expected a failure: %s", #failed); \
        ERROR_HAS(__VA_ARGS__);                             \
    } while (0)

#endif
