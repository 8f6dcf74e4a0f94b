/* Helpers for the tensor-parallel tests: deterministic inputs every rank can make
 * alike, and comparisons that report into the rank's message. */
#ifndef CT_TESTS_PARALLEL_TP_CHECK_H
#define CT_TESTS_PARALLEL_TP_CHECK_H

#include <math.h>

#include "autograd/ops.h"
#include "core/tensor.h"
#include "tests/dist/ranks.h"

/* A tensor of dtype dt whose element i is sin(0.37 i + 1.7 salt) * scale: the same on
 * every rank for the same salt, different for different salts. */
static inline ct_tensor *det_tensor(ct_dtype dt, int ndim, const int64_t *shape, double salt, double scale)
{
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_F64, ndim, shape);
    if (!t) return NULL;
    double *p = ct_tensor_data(t);
    for (int64_t i = 0, n = ct_tensor_numel(t); i < n; i++) p[i] = sin(0.37 * (double)i + 1.7 * salt) * scale;
    return ct_tensor_cast(t, dt);
}

/* indices [start, end) of t along dim, zeros past t's end (written here, not the library's) */
static inline ct_tensor *slice_padded(ct_tensor *t, int dim, int64_t start, int64_t end)
{
    int64_t have = t->shape[dim] - start;
    have = have < 0 ? 0 : have > end - start ? end - start : have;
    ct_tensor *parts[2];
    int np = 0;
    if (have > 0) parts[np++] = ct_narrow(t, dim, start, have);
    if (have < end - start) {
        int64_t shape[CT_MAX_DIMS];
        for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
        shape[dim] = end - start - have;
        parts[np++] = ct_tensor_zeros(t->dtype, t->ndim, shape);
    }
    return np == 1 ? parts[0] : ct_concat(np, parts, dim);
}

/* rms(got - want) / max(1, rms(want)): rel_err's measure over the whole tensor;
 * INFINITY when the shapes differ or one is NULL. Why per tensor after training: Adam
 * divides by sqrt(v), so a gradient element that is a sum cancelling to near zero
 * carries its rounding differences (summation order over the ranks) into a step of up
 * to lr, and a few elements in 10^5 may differ by a fraction of lr; a wrong slice, a
 * missed sync or a batch seen twice moves a whole row or tensor by lr per step, orders
 * of magnitude above the tolerance. */
static inline double rel_rms(const ct_tensor *got, const ct_tensor *want)
{
    if (!got || !want || !ct_tensor_same_shape(got, want)) return INFINITY;
    ct_tensor *a = ct_tensor_contiguous(ct_tensor_cast(got, CT_DTYPE_F64));
    ct_tensor *b = ct_tensor_contiguous(ct_tensor_cast(want, CT_DTYPE_F64));
    if (!a || !b) return INFINITY;
    const double *p = ct_tensor_data(a), *q = ct_tensor_data(b);
    double d = 0, w = 0;
    int64_t n = ct_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) d += (p[i] - q[i]) * (p[i] - q[i]), w += q[i] * q[i];
    return sqrt(d / (double)n) / fmax(1.0, sqrt(w / (double)n));
}

/* max over elements of |got - want| / max(1, |want|); INFINITY when the shapes differ
 * or one is NULL */
static inline double rel_err(const ct_tensor *got, const ct_tensor *want)
{
    if (!got || !want || !ct_tensor_same_shape(got, want)) return INFINITY;
    ct_tensor *a = ct_tensor_contiguous(ct_tensor_cast(got, CT_DTYPE_F64));
    ct_tensor *b = ct_tensor_contiguous(ct_tensor_cast(want, CT_DTYPE_F64));
    if (!a || !b) return INFINITY;
    const double *p = ct_tensor_data(a), *q = ct_tensor_data(b);
    double e = 0;
    for (int64_t i = 0, n = ct_tensor_numel(a); i < n; i++) {
        double d = fabs(p[i] - q[i]) / fmax(1.0, fabs(q[i]));
        if (!(d <= e)) e = d; /* NaN wins */
    }
    return e;
}

/* Reports "what" when got is not within tol of want; returns 1 then, else 0. */
static inline int expect_close(rank_ctx *c, const char *what, const ct_tensor *got, const ct_tensor *want, double tol)
{
    double e = rel_err(got, want);
    if (e <= tol) return 0;
    char a[160], b[160];
    report(c, "rank %d: %s: got %s, want %s, relative error %g > %g%s%s", c->rank, what,
           got ? ct_tensor_describe(got, a, sizeof a) : "NULL", want ? ct_tensor_describe(want, b, sizeof b) : "NULL",
           e, tol, got ? "" : ": ", got ? "" : ct_last_error());
    return 1;
}

/* Reports when msg (an error, or NULL for none) does not contain part. */
static inline int expect_error(rank_ctx *c, const char *what, bool failed, const char *part)
{
    const char *msg = ct_last_error();
    if (failed && msg && strstr(msg, part)) return 0;
    report(c, "rank %d: %s: %s, message \"%s\"; want an error naming \"%s\"", c->rank, what,
           failed ? "failed" : "did not fail", msg ? msg : "", part);
    return 1;
}

#endif
