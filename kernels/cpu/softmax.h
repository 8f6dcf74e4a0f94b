/* ctrain — CPU softmax / log-softmax kernels (see kernels/softmax.h for the math).
 *
 * Contract (checked by kernels/softmax.c): every tensor is contiguous, on the
 * CPU, with the same shape and dtype (f32, f64, bf16, f16); dim is in [0, ndim)
 * (0 for a 0-d tensor). Outputs are overwritten. The _ref versions are plain
 * loops in double that the tests compare the fast ones against.
 */
#ifndef CT_KERNELS_CPU_SOFTMAX_H
#define CT_KERNELS_CPU_SOFTMAX_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/cpu/vmath.h"

ct_status cti_cpu_softmax(const ct_tensor *x, ct_tensor *y, int dim);
ct_status cti_cpu_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim);
ct_status cti_cpu_log_softmax(const ct_tensor *x, ct_tensor *y, int dim);
ct_status cti_cpu_log_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim);

ct_status cti_cpu_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status cti_cpu_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status cti_cpu_log_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status cti_cpu_log_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);

/* ---- row helpers shared with the cross-entropy kernels (kernels/cpu/loss.c) ----
 *
 * The f32 exponentials come from cti_cpu_expf (kernels/cpu/vmath.h), whose loops
 * vectorise; the row maximum is written with GCC/Clang generic vectors (8 lanes;
 * AVX2 when built with -march=native, two SSE halves otherwise).
 */
typedef float ct_cpu_f32x8 __attribute__((vector_size(32)));
typedef int32_t ct_cpu_i32x8 __attribute__((vector_size(32)));
typedef float ct_cpu_f32x4 __attribute__((vector_size(16)));
typedef double ct_cpu_f64x4 __attribute__((vector_size(32)));

/* Vectors never cross a function boundary by value: without AVX that changes the
 * ABI and GCC warns (-Wpsabi), so the helpers take pointers and get inlined. */
#define CT_CPU_SPLAT8(v) {(v), (v), (v), (v), (v), (v), (v), (v)}
/* lanes of a where mask m is all ones, of b where it is 0 */
#define CT_CPU_SELECT8(m, a, b) ((ct_cpu_f32x8)(((m) & (ct_cpu_i32x8)(a)) | (~(m) & (ct_cpu_i32x8)(b))))

/* Row reductions keep 8 independent partial results, combined in a fixed order at
 * the end: the same bits for any thread count. Sums of exponentials are in double.
 *   row_max(x, n)            max x[i]; -inf for n = 0 (NaNs are skipped, but then
 *                            exp(NaN - m) makes the sum NaN anyway)
 *   expsum(x, m, out, n)     sum exp(x[i] - m), also stored in out[i] unless out is NULL
 *   exp_sub(x, m, out, n)    out[i] = exp(x[i] - m[i])                              */
static inline float cti_cpu_row_max_f32(const float *restrict x, int64_t n)
{
    ct_cpu_f32x8 acc = CT_CPU_SPLAT8(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        ct_cpu_f32x8 v;
        memcpy(&v, x + i, sizeof v);
        acc = CT_CPU_SELECT8(v > acc, v, acc);
    }
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int k = 0; k < 8; k++) m = acc[k] > m ? acc[k] : m;
    return m;
}

static inline double cti_cpu_expsum_f32(const float *restrict x, float m, float *restrict out, int64_t n)
{
    /* lanes 0-3 and 4-7 of the partial sums, in two double vectors: written as a
     * loop over 8 doubles, gcc sometimes leaves the widening adds scalar */
    ct_cpu_f64x4 acc_lo = {0}, acc_hi = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float e[8];
        for (int k = 0; k < 8; k++) e[k] = cti_cpu_expf(x[i + k] - m);
        if (out) memcpy(out + i, e, sizeof e);
        ct_cpu_f32x4 lo, hi;
        memcpy(&lo, e, sizeof lo);
        memcpy(&hi, e + 4, sizeof hi);
        acc_lo += __builtin_convertvector(lo, ct_cpu_f64x4);
        acc_hi += __builtin_convertvector(hi, ct_cpu_f64x4);
    }
    double s = 0;
    for (; i < n; i++) {
        float e = cti_cpu_expf(x[i] - m);
        if (out) out[i] = e;
        s += e;
    }
    for (int k = 0; k < 4; k++) s += acc_lo[k];
    for (int k = 0; k < 4; k++) s += acc_hi[k];
    return s;
}

static inline void cti_cpu_exp_sub_f32(const float *restrict x, const float *restrict m, float *restrict out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = cti_cpu_expf(x[i] - m[i]);
}

/* f64 twins with libm's exp (f64 serves gradient checks, not speed). */
static inline double cti_cpu_row_max_f64(const double *restrict x, int64_t n)
{
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static inline double cti_cpu_expsum_f64(const double *restrict x, double m, double *restrict out, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = exp(x[i] - m);
        if (out) out[i] = e;
        s += e;
    }
    return s;
}

static inline void cti_cpu_exp_sub_f64(const double *restrict x, const double *restrict m, double *restrict out,
                                       int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = exp(x[i] - m[i]);
}

#endif
