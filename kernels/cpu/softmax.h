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

ct_status ct_cpu_softmax(const ct_tensor *x, ct_tensor *y, int dim);
ct_status ct_cpu_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim);
ct_status ct_cpu_log_softmax(const ct_tensor *x, ct_tensor *y, int dim);
ct_status ct_cpu_log_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim);

ct_status ct_cpu_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status ct_cpu_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status ct_cpu_log_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);
ct_status ct_cpu_log_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);

/* ---- row helpers shared with the cross-entropy kernels (kernels/cpu/loss.c) ----
 *
 * libm's expf is a call the compiler cannot vectorise without -ffast-math, and a
 * scalar exp with clamps gets its edge cases turned into branches, so the f32
 * exponential is written once with GCC/Clang generic vectors (8 lanes; AVX2 when
 * built with -march=native, two SSE halves otherwise) and once as a scalar twin
 * for row tails, doing the same operations.
 *
 * exp(x): Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, and the Cephes
 * degree-7 polynomial for e^r; max relative error about 2 ulp where the result is
 * a normal float. The edges come out of the arithmetic: NaN stays NaN; -inf gives
 * exactly +0 (the clamp to -88 makes n = -127, whose scale 2^-127 is built as +0);
 * results below FLT_MIN lose precision or flush to 0; x > 88.37 gives +inf (true
 * values there reach 3.4e38; softmax and cross-entropy only use x <= 0).
 */
typedef float ct_cpu_f32x8 __attribute__((vector_size(32)));
typedef int32_t ct_cpu_i32x8 __attribute__((vector_size(32)));

/* Vectors never cross a function boundary by value: without AVX that changes the
 * ABI and GCC warns (-Wpsabi), so the helpers take pointers and get inlined. */
#define CT_CPU_SPLAT8(v) {(v), (v), (v), (v), (v), (v), (v), (v)}
/* lanes of a where mask m is all ones, of b where it is 0 */
#define CT_CPU_SELECT8(m, a, b) ((ct_cpu_f32x8)(((m) & (ct_cpu_i32x8)(a)) | (~(m) & (ct_cpu_i32x8)(b))))

/* out[k] = exp(x[k] - m[k]) for k < 8 (m NULL: exp(x[k] - m0)); out may be x. */
static inline void ct_cpu_expf8(const float *x, const float *m, float m0, float *out)
{
    const ct_cpu_f32x8 lo = CT_CPU_SPLAT8(-88.0f), hi = CT_CPU_SPLAT8(88.8f), nmin = CT_CPU_SPLAT8(-127.0f);
    const ct_cpu_f32x8 magic = CT_CPU_SPLAT8(12582912.0f), log2e = CT_CPU_SPLAT8(1.44269504088896341f);
    const ct_cpu_f32x8 c1 = CT_CPU_SPLAT8(0.693359375f), c2 = CT_CPU_SPLAT8(-2.12194440e-4f);
    const ct_cpu_f32x8 p0 = CT_CPU_SPLAT8(1.9875691500e-4f), p1 = CT_CPU_SPLAT8(1.3981999507e-3f);
    const ct_cpu_f32x8 p2 = CT_CPU_SPLAT8(8.3334519073e-3f), p3 = CT_CPU_SPLAT8(4.1665795894e-2f);
    const ct_cpu_f32x8 p4 = CT_CPU_SPLAT8(1.6666665459e-1f), p5 = CT_CPU_SPLAT8(5.0000001201e-1f);
    const ct_cpu_f32x8 one = CT_CPU_SPLAT8(1.0f);
    const ct_cpu_i32x8 bias = CT_CPU_SPLAT8(127);
    ct_cpu_f32x8 v, mv = CT_CPU_SPLAT8(m0);
    memcpy(&v, x, sizeof v);
    if (m) memcpy(&mv, m, sizeof mv);
    v -= mv;
    ct_cpu_f32x8 xc = CT_CPU_SELECT8(v < lo, lo, v); /* NaN passes through both clamps */
    xc = CT_CPU_SELECT8(xc > hi, hi, xc);
    ct_cpu_f32x8 n = (xc * log2e + magic) - magic; /* round to nearest: 1.5 * 2^23 pushes out the fraction */
    ct_cpu_f32x8 r = xc - n * c1;                  /* exact: c1 has 9 significant bits */
    r = r - n * c2;
    ct_cpu_f32x8 p = p0;
    p = p * r + p1;
    p = p * r + p2;
    p = p * r + p3;
    p = p * r + p4;
    p = p * r + p5;
    p = p * r * r + r + one;
    ct_cpu_f32x8 nc = CT_CPU_SELECT8(n > nmin, n, nmin); /* NaN -> -127: the conversion stays defined */
    ct_cpu_i32x8 bits = (__builtin_convertvector(nc, ct_cpu_i32x8) + bias) << 23; /* 2^n: +0 .. +inf */
    v = p * (ct_cpu_f32x8)bits;
    memcpy(out, &v, sizeof v);
}

/* The scalar twin of ct_cpu_expf8 for row tails: the same operations, so the same bits. */
static inline float ct_cpu_expf(float x)
{
    float xc = x < -88.0f ? -88.0f : x;
    xc = xc > 88.8f ? 88.8f : xc;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    float nc = n > -127.0f ? n : -127.0f;
    int32_t bits = ((int32_t)nc + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Row reductions keep 8 independent partial results, combined in a fixed order at
 * the end: the same bits for any thread count. Sums of exponentials are in double.
 *   row_max(x, n)            max x[i]; -inf for n = 0 (NaNs are skipped, but then
 *                            exp(NaN - m) makes the sum NaN anyway)
 *   expsum(x, m, out, n)     sum exp(x[i] - m), also stored in out[i] unless out is NULL
 *   exp_sub(x, m, out, n)    out[i] = exp(x[i] - m[i])                              */
static inline float ct_cpu_row_max_f32(const float *restrict x, int64_t n)
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

static inline double ct_cpu_expsum_f32(const float *restrict x, float m, float *restrict out, int64_t n)
{
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float e[8];
        ct_cpu_expf8(x + i, NULL, m, e);
        if (out) memcpy(out + i, e, sizeof e);
        for (int k = 0; k < 8; k++) acc[k] += e[k];
    }
    double s = 0;
    for (; i < n; i++) {
        float e = ct_cpu_expf(x[i] - m);
        if (out) out[i] = e;
        s += e;
    }
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}

static inline void ct_cpu_exp_sub_f32(const float *restrict x, const float *restrict m, float *restrict out, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) ct_cpu_expf8(x + i, m + i, 0, out + i);
    for (; i < n; i++) out[i] = ct_cpu_expf(x[i] - m[i]);
}

/* f64 twins with libm's exp (f64 serves gradient checks, not speed). */
static inline double ct_cpu_row_max_f64(const double *restrict x, int64_t n)
{
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static inline double ct_cpu_expsum_f64(const double *restrict x, double m, double *restrict out, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = exp(x[i] - m);
        if (out) out[i] = e;
        s += e;
    }
    return s;
}

static inline void ct_cpu_exp_sub_f64(const double *restrict x, const double *restrict m, double *restrict out,
                                      int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = exp(x[i] - m[i]);
}

#endif
