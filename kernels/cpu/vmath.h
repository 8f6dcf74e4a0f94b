/* ctrain — vectorisable f32 math shared by the CPU kernels: the exponential of
 * softmax and cross-entropy (kernels/cpu/softmax.h, loss.c), of exp, tanh,
 * sigmoid, GELU and SiLU (kernels/cpu/unary.c) and of attention's probabilities
 * (kernels/cpu/attention.c).
 *
 * Why not libm: a call per element keeps gcc from vectorising the loop (it will
 * not without -fno-math-errno / -ffast-math), and a scalar exp with clamps gets
 * its edge cases turned into branches. These functions are branch-free scalar
 * code with selects on integer masks, so a plain loop over them vectorises (AVX2
 * with -march=native), and the vector body and the scalar tail of such a loop
 * give the same bits: an element's value never depends on its position.
 */
#ifndef CT_KERNELS_CPU_VMATH_H
#define CT_KERNELS_CPU_VMATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* a*b + c, fused (one rounding) where the target has FMA, so a polynomial step is one
 * instruction with one latency: these loops are latency-bound (a long dependent
 * chain per element, a few iterations in flight), measured 1.43 ns per GELU element
 * with separate multiply and add on Zen 3. gcc vectorises fmaf into vfmadd; without
 * FMA it would be a libm call, hence the plain form there. Either way the vector body
 * and the scalar tail compute the same expression. */
#ifdef __FMA__
#define CT_CPU_FMAF(a, b, c) fmaf((a), (b), (c))
#else
#define CT_CPU_FMAF(a, b, c) ((a) * (b) + (c))
#endif

/* c ? a : b on the bit patterns (f32 and f64). gcc (with the default
 * -ftrapping-math) will not if-convert a float ?: whose arms are computed, and
 * then does not vectorise the loop at all; integer masks it vectorises. Both arms
 * are always evaluated. */
#define CT_CPU_DEFINE_SEL(NAME, T, U)                 \
    static inline T NAME(bool c, T a, T b)            \
    {                                                 \
        U m = (U)0 - (U)c, ua, ub;                    \
        memcpy(&ua, &a, sizeof ua);                   \
        memcpy(&ub, &b, sizeof ub);                   \
        ua = (ua & m) | (ub & ~m);                    \
        memcpy(&a, &ua, sizeof a);                    \
        return a;                                     \
    }
CT_CPU_DEFINE_SEL(ct_cpu_sel_f32, float, uint32_t)
CT_CPU_DEFINE_SEL(ct_cpu_sel_f64, double, uint64_t)
#undef CT_CPU_DEFINE_SEL

/* e^x in f32. exp(x) = 2^n exp(r), n = round(x log2 e), r = x - n ln 2 (in two
 * parts, Cody-Waite: the first has 9 significant bits, so n * it is exact),
 * |r| <= ln2/2, and Cephes' degree-7 polynomial for exp(r). 2^n is applied in two
 * halves, so results between FLT_MAX / 2 and FLT_MAX stay finite, overflow gives
 * +inf, and results below FLT_MIN round once into the subnormals.
 *
 * Max error, measured against exp in double over every float (FMA build): 1.01 ulp
 * where the result is a normal float (x in [-87.33, 88.72]); below that an
 * absolute 0.75 * 2^-149 (three quarters of the smallest subnormal). Edges: NaN
 * gives NaN (x's, quieted), -inf and x < -103.97 give +0, +inf and x > 88.72 give
 * +inf. */
static inline float cti_cpu_expf(float x)
{
    /* NaN fails both comparisons and flows through the arithmetic into the result;
     * n is read from t's bits, so no float-to-int conversion ever sees it */
    float xc = ct_cpu_sel_f32(x < -104.0f, -104.0f, x);
    xc = ct_cpu_sel_f32(xc > 89.0f, 89.0f, xc);
    /* 1.5 * 2^23: n = round(x log2 e) in the low bits (the product is rounded before
     * the add even when fused: t's low bits only need n, which the fused form gives too) */
    float t = CT_CPU_FMAF(xc, 1.44269504088896341f, 12582912.0f);
    float nf = t - 12582912.0f;
    float r = CT_CPU_FMAF(nf, -0.693359375f, xc); /* exact: nf * ln2_hi has 9 + 9 bits */
    r = CT_CPU_FMAF(nf, 2.12194440e-4f, r);
    float p = 1.9875691500E-4f;
    p = CT_CPU_FMAF(p, r, 1.3981999507E-3f);
    p = CT_CPU_FMAF(p, r, 8.3334519073E-3f);
    p = CT_CPU_FMAF(p, r, 4.1665795894E-2f);
    p = CT_CPU_FMAF(p, r, 1.6666665459E-1f);
    p = CT_CPU_FMAF(p, r, 5.0000001201E-1f);
    float y = CT_CPU_FMAF(p, r * r, r) + 1.0f;
    /* 2^n = 2^floor(n/2) * 2^ceil(n/2), n in [-150, 128]: biased exponents
     * b >> 1 and b - (b >> 1) of b = n + 254, both in [52, 191] */
    uint32_t tb, b, e1, e2;
    memcpy(&tb, &t, sizeof tb);
    b = tb - (0x4B400000u - 254u);
    e1 = (b >> 1) << 23;
    e2 = (b - (b >> 1)) << 23;
    float s1, s2;
    memcpy(&s1, &e1, sizeof s1);
    memcpy(&s2, &e2, sizeof s2);
    return y * s1 * s2;
}

#endif
