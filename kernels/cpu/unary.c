/* CPU unary elementwise ops and their backward.
 *
 *   x (...) -> y (same shape); y = f(x)
 *   gout, x, y (...) -> gin (same shape); gin = gout * f'(x), overwritten
 *
 * exp, tanh and sigmoid in f32 are branch-free Cephes polynomials (exp is
 * cti_cpu_expf of kernels/cpu/vmath.h, tanh and sigmoid are built on it below)
 * instead of libm calls, because a libm call per element keeps gcc from
 * vectorising the loop and GELU/SiLU sit in every transformer MLP. They are
 * within a few ulp of the correctly rounded result. log, sqrt, pow and erf
 * stay libm calls (gcc will not vectorise them without -fno-math-errno), as does
 * all of f64. Why no `restrict` on y and x: see binary.c (in place is allowed).
 *
 * Stable forms: sigmoid(x) = 1/(1+e) for x >= 0 and e/(1+e) for x < 0 with
 * e = exp(-|x|), so exp never overflows; 0.5(1 + tanh(u)) = sigmoid(2u), so
 * GELU-tanh's left tail keeps its relative precision; GELU-erf uses erfc(-z)
 * for 1 + erf(z) for the same reason. GELU-tanh in f32 takes sigmoid(2u) as
 * 1/(1 + exp(-2u)) directly: as accurate (exp's relative error carries through
 * 1 + E and the reciprocal), and a shorter dependent chain, which is what these
 * loops are bound by. Where exp(-2u) overflows (x < -10.4) it gives 0 for a true
 * value below 1e-41; the two-sided form would give that subnormal. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vmath.h"

/* tanh: odd polynomial below |x| = 0.625 (where 1 - 2/(e^2x + 1) would cancel),
 * else 1 - 2/(exp(2|x|) + 1) with x's sign. */
static inline float ew_tanhf(float x)
{
    float z = x * x;
    float p = -5.70498872745E-3f;
    p = p * z + 2.06390887954E-2f;
    p = p * z - 5.37397155531E-2f;
    p = p * z + 1.33314422036E-1f;
    p = p * z - 3.33332819422E-1f;
    float small = p * z * x + x;
    float ax = fabsf(x);
    float big = copysignf(1.0f - 2.0f / (cti_cpu_expf(2.0f * ax) + 1.0f), x);
    return ct_cpu_sel_f32(ax < 0.625f, small, big);
}

static inline float ew_sigmoidf(float x)
{
    float e = cti_cpu_expf(-fabsf(x));
    float s = 1.0f / (1.0f + e);
    return ct_cpu_sel_f32(x >= 0.0f, s, e * s);
}

static inline double ew_sigmoid(double x)
{
    double e = exp(-fabs(x));
    double s = 1.0 / (1.0 + e);
    return x >= 0.0 ? s : e * s;
}

#define GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define GELU_C 0.044715

/* exp(-2u) for GELU-tanh's u = k (x + c x^3) */
static inline float ew_gelu_expf(float x)
{
    return cti_cpu_expf((float)(-2.0 * GELU_K) * CT_CPU_FMAF((float)GELU_C * x * x, x, x));
}

/* sigmoid(2u), one-sided (see the top comment) */
static inline float ew_gelu_sigf(float x) { return 1.0f / (1.0f + ew_gelu_expf(x)); }

static inline double ew_gelu_sig(double x) { return ew_sigmoid(2.0 * GELU_K * (x + GELU_C * x * x * x)); }

/* x sigmoid(2u) = x / (1 + exp(-2u)) */
static inline float ew_gelu_tanhf(float x) { return x / (1.0f + ew_gelu_expf(x)); }

static inline double ew_gelu_tanh(double x)
{
    double u = GELU_K * (x + GELU_C * x * x * x);
    return x * ew_sigmoid(2.0 * u);
}

/* ---- forward ------------------------------------------------------------------------- */

#define EW_LOOP1(TI, EXPR)                                                                         \
    do {                                                                                           \
        if (so == 1 && sx == 1) {                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const TI x = xp[i];                                                                \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const TI x = xp[i * sx];                                                           \
                o[i * so] = (EXPR);                                                                \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static void un_f32(ct_unary_op op, float *o, int64_t so, const float *xp, int64_t sx, int64_t n)
{
    switch (op) {
    case CT_UNARY_NEG: EW_LOOP1(float, -x); break;
    case CT_UNARY_ABS: EW_LOOP1(float, fabsf(x)); break;
    case CT_UNARY_EXP: EW_LOOP1(float, cti_cpu_expf(x)); break;
    case CT_UNARY_LOG: EW_LOOP1(float, logf(x)); break;
    case CT_UNARY_SQRT: EW_LOOP1(float, sqrtf(x)); break;
    case CT_UNARY_RSQRT: EW_LOOP1(float, 1.0f / sqrtf(x)); break;
    case CT_UNARY_TANH: EW_LOOP1(float, ew_tanhf(x)); break;
    case CT_UNARY_SIGMOID: EW_LOOP1(float, ew_sigmoidf(x)); break;
    case CT_UNARY_RELU: EW_LOOP1(float, ct_cpu_sel_f32(x < 0.0f, 0.0f, x)); break;
    case CT_UNARY_GELU_TANH: EW_LOOP1(float, ew_gelu_tanhf(x)); break;
    case CT_UNARY_GELU_ERF: EW_LOOP1(float, 0.5f * x * erfcf(-x * (float)M_SQRT1_2)); break;
    default: EW_LOOP1(float, x * ew_sigmoidf(x)); break;
    }
}

static void un_f64(ct_unary_op op, double *o, int64_t so, const double *xp, int64_t sx, int64_t n)
{
    switch (op) {
    case CT_UNARY_NEG: EW_LOOP1(double, -x); break;
    case CT_UNARY_ABS: EW_LOOP1(double, fabs(x)); break;
    case CT_UNARY_EXP: EW_LOOP1(double, exp(x)); break;
    case CT_UNARY_LOG: EW_LOOP1(double, log(x)); break;
    case CT_UNARY_SQRT: EW_LOOP1(double, sqrt(x)); break;
    case CT_UNARY_RSQRT: EW_LOOP1(double, 1.0 / sqrt(x)); break;
    case CT_UNARY_TANH: EW_LOOP1(double, tanh(x)); break;
    case CT_UNARY_SIGMOID: EW_LOOP1(double, ew_sigmoid(x)); break;
    case CT_UNARY_RELU: EW_LOOP1(double, x < 0.0 ? 0.0 : x); break;
    case CT_UNARY_GELU_TANH: EW_LOOP1(double, ew_gelu_tanh(x)); break;
    case CT_UNARY_GELU_ERF: EW_LOOP1(double, 0.5 * x * erfc(-x * M_SQRT1_2)); break;
    default: EW_LOOP1(double, x * ew_sigmoid(x)); break;
    }
}

/* NEG, ABS, RELU on integers, wrapping like C unsigned arithmetic (-INT_MIN = INT_MIN). */
#define DEF_UN_INT(NAME, T, U)                                                                     \
    static void NAME(ct_unary_op op, T *o, int64_t so, const T *xp, int64_t sx, int64_t n)         \
    {                                                                                              \
        switch (op) {                                                                              \
        case CT_UNARY_NEG: EW_LOOP1(T, (T)((U)0 - (U)x)); break;                                   \
        case CT_UNARY_ABS: EW_LOOP1(T, x < 0 ? (T)((U)0 - (U)x) : x); break;                       \
        default: EW_LOOP1(T, x < 0 ? (T)0 : x); break;                                             \
        }                                                                                          \
    }
DEF_UN_INT(un_i32, int32_t, uint32_t)
DEF_UN_INT(un_i64, int64_t, uint64_t)

/* u8 has no negative values: ABS and RELU copy. */
static void un_u8(ct_unary_op op, uint8_t *o, int64_t so, const uint8_t *xp, int64_t sx, int64_t n)
{
    if (op == CT_UNARY_NEG) EW_LOOP1(uint8_t, (uint8_t)(0u - x));
    else EW_LOOP1(uint8_t, x);
}

typedef struct un_ctx {
    ct_unary_op op;
    ct_dtype dt;
} un_ctx;

enum { HALF_CHUNK = 512 };

static void un_row(const void *vctx, char *const *p, const int64_t *s, int64_t n)
{
    const un_ctx *c = vctx;
    switch (c->dt) {
    case CT_DTYPE_F32: un_f32(c->op, (float *)p[0], s[0], (const float *)p[1], s[1], n); break;
    case CT_DTYPE_F64: un_f64(c->op, (double *)p[0], s[0], (const double *)p[1], s[1], n); break;
    case CT_DTYPE_I32: un_i32(c->op, (int32_t *)p[0], s[0], (const int32_t *)p[1], s[1], n); break;
    case CT_DTYPE_I64: un_i64(c->op, (int64_t *)p[0], s[0], (const int64_t *)p[1], s[1], n); break;
    case CT_DTYPE_U8: un_u8(c->op, (uint8_t *)p[0], s[0], (const uint8_t *)p[1], s[1], n); break;
    default: { /* f16, bf16: through f32, rounded once */
        float buf[HALF_CHUNK];
        for (int64_t off = 0; off < n; off += HALF_CHUNK) {
            const int64_t m = n - off < HALF_CHUNK ? n - off : HALF_CHUNK;
            cti_cpu_ew_load_f32(c->dt, p[1] + off * s[1] * 2, s[1], m, buf);
            un_f32(c->op, buf, 1, buf, 1, m);
            cti_cpu_ew_store_f32(c->dt, p[0] + off * s[0] * 2, s[0], m, buf);
        }
    }
    }
}

// x (...) -> out (same shape); out = f(x); out overwritten (may be x)
ct_status cti_cpu_unary(ct_unary_op op, ct_tensor *out, const ct_tensor *x)
{
    un_ctx c = {.op = op, .dt = x->dtype};
    char *base[2] = {ct_tensor_data(out), ct_tensor_data(x)};
    const int64_t *strides[2] = {out->strides, x->strides};
    size_t es[2] = {ct_dtype_size(out->dtype), ct_dtype_size(x->dtype)};
    cti_cpu_ew_run(out->ndim, out->shape, 2, base, strides, es, un_row, &c);
    return CT_OK;
}

/* ---- backward ------------------------------------------------------------------------ */

/* gi[i] = g[i] * f'(x[i]), over contiguous buffers (gathered when strided). y is
 * f(x) or NULL; x may be NULL when y is given for EXP/TANH/SIGMOID. gi is a new
 * tensor or a scratch buffer, never an input, so restrict holds. */
#define DEF_BWD(NAME, T, SEL, EXP, TANH, SIGMOID, GSIG, ERFC, SQRT)                                    \
    static void NAME(ct_unary_op op, T *restrict gi, const T *restrict g, const T *restrict x,     \
                     const T *restrict y, int64_t n)                                               \
    {                                                                                              \
        const T k = (T)GELU_K, c = (T)GELU_C;                                                      \
        switch (op) {                                                                              \
        case CT_UNARY_NEG:                                                                         \
            for (int64_t i = 0; i < n; i++) gi[i] = -g[i];                                         \
            break;                                                                                 \
        case CT_UNARY_ABS:                                                                         \
            for (int64_t i = 0; i < n; i++) gi[i] = g[i] * (T)((x[i] > 0) - (x[i] < 0));          \
            break;                                                                                 \
        case CT_UNARY_EXP:                                                                         \
            if (y) for (int64_t i = 0; i < n; i++) gi[i] = g[i] * y[i];                            \
            else for (int64_t i = 0; i < n; i++) gi[i] = g[i] * EXP(x[i]);                         \
            break;                                                                                 \
        case CT_UNARY_LOG:                                                                         \
            for (int64_t i = 0; i < n; i++) gi[i] = g[i] / x[i];                                   \
            break;                                                                                 \
        case CT_UNARY_SQRT:                                                                        \
            for (int64_t i = 0; i < n; i++) gi[i] = (T)0.5 * g[i] / SQRT(x[i]);                    \
            break;                                                                                 \
        case CT_UNARY_RSQRT:                                                                       \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T r = (T)1 / SQRT(x[i]);                                                           \
                gi[i] = (T)-0.5 * g[i] * r * r * r;                                                \
            }                                                                                      \
            break;                                                                                 \
        case CT_UNARY_TANH:                                                                        \
            if (y) for (int64_t i = 0; i < n; i++) gi[i] = g[i] * ((T)1 - y[i] * y[i]);             \
            else for (int64_t i = 0; i < n; i++) {                                                 \
                T t = TANH(x[i]);                                                                  \
                gi[i] = g[i] * ((T)1 - t * t);                                                     \
            }                                                                                      \
            break;                                                                                 \
        case CT_UNARY_SIGMOID:                                                                     \
            if (y) for (int64_t i = 0; i < n; i++) gi[i] = g[i] * y[i] * ((T)1 - y[i]);             \
            else for (int64_t i = 0; i < n; i++) {                                                 \
                T s = SIGMOID(x[i]);                                                               \
                gi[i] = g[i] * s * ((T)1 - s);                                                     \
            }                                                                                      \
            break;                                                                                 \
        case CT_UNARY_RELU: /* NaN x passes g, as PyTorch's threshold_backward */                  \
            for (int64_t i = 0; i < n; i++) gi[i] = SEL(x[i] <= 0, (T)0, g[i]);                    \
            break;                                                                                 \
        case CT_UNARY_GELU_TANH:                                                                   \
            /* 0.5(1+t) = s and 0.5(1-t^2) = 2 s (1-s) with s = sigmoid(2u) */                     \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T xi = x[i], s = GSIG(xi);                                                         \
                gi[i] = g[i] * (s + (T)2 * xi * s * ((T)1 - s) * k * ((T)1 + (T)3 * c * xi * xi)); \
            }                                                                                      \
            break;                                                                                 \
        case CT_UNARY_GELU_ERF:                                                                    \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T xi = x[i];                                                                       \
                gi[i] = g[i] * ((T)0.5 * ERFC(-xi * (T)M_SQRT1_2) +                                \
                                xi * EXP((T)-0.5 * xi * xi) * (T)(0.5 * M_2_SQRTPI * M_SQRT1_2));  \
            }                                                                                      \
            break;                                                                                 \
        default: /* SILU */                                                                        \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T xi = x[i], s = SIGMOID(xi);                                                      \
                gi[i] = g[i] * s * ((T)1 + xi * ((T)1 - s));                                       \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
    }
DEF_BWD(bwd_f32, float, ct_cpu_sel_f32, cti_cpu_expf, ew_tanhf, ew_sigmoidf, ew_gelu_sigf, erfcf, sqrtf)
DEF_BWD(bwd_f64, double, ct_cpu_sel_f64, exp, tanh, ew_sigmoid, ew_gelu_sig, erfc, sqrt)

typedef struct bwd_ctx {
    ct_unary_op op;
    ct_dtype dt;
    int ix, iy; /* operand slots of x and y, -1 when absent */
} bwd_ctx;

static void gather_f64(const char *p, int64_t s, int64_t n, double *dst)
{
    for (int64_t i = 0; i < n; i++) memcpy(&dst[i], p + i * s * 8, 8);
}

static void bwd_row(const void *vctx, char *const *p, const int64_t *s, int64_t n)
{
    const bwd_ctx *c = vctx;
    const bool contiguous = s[0] == 1 && s[1] == 1 && (c->ix < 0 || s[c->ix] == 1) && (c->iy < 0 || s[c->iy] == 1);
    if (contiguous && c->dt == CT_DTYPE_F32) {
        bwd_f32(c->op, (float *)p[0], (const float *)p[1], c->ix < 0 ? NULL : (const float *)p[c->ix],
                c->iy < 0 ? NULL : (const float *)p[c->iy], n);
        return;
    }
    if (contiguous && c->dt == CT_DTYPE_F64) {
        bwd_f64(c->op, (double *)p[0], (const double *)p[1], c->ix < 0 ? NULL : (const double *)p[c->ix],
                c->iy < 0 ? NULL : (const double *)p[c->iy], n);
        return;
    }
    /* strided rows and f16/bf16: gather into scratch, compute, scatter */
    enum { CH = 256 };
    const int64_t es = (int64_t)ct_dtype_size(c->dt);
    for (int64_t off = 0; off < n; off += CH) {
        const int64_t m = n - off < CH ? n - off : CH;
        if (c->dt == CT_DTYPE_F64) {
            double g[CH], x[CH], y[CH], gi[CH];
            gather_f64(p[1] + off * s[1] * es, s[1], m, g);
            if (c->ix >= 0) gather_f64(p[c->ix] + off * s[c->ix] * es, s[c->ix], m, x);
            if (c->iy >= 0) gather_f64(p[c->iy] + off * s[c->iy] * es, s[c->iy], m, y);
            bwd_f64(c->op, gi, g, c->ix < 0 ? NULL : x, c->iy < 0 ? NULL : y, m);
            for (int64_t i = 0; i < m; i++) memcpy(p[0] + (off + i) * s[0] * es, &gi[i], 8);
        } else {
            float g[CH], x[CH], y[CH], gi[CH];
            cti_cpu_ew_load_f32(c->dt, p[1] + off * s[1] * es, s[1], m, g);
            if (c->ix >= 0) cti_cpu_ew_load_f32(c->dt, p[c->ix] + off * s[c->ix] * es, s[c->ix], m, x);
            if (c->iy >= 0) cti_cpu_ew_load_f32(c->dt, p[c->iy] + off * s[c->iy] * es, s[c->iy], m, y);
            bwd_f32(c->op, gi, g, c->ix < 0 ? NULL : x, c->iy < 0 ? NULL : y, m);
            cti_cpu_ew_store_f32(c->dt, p[0] + off * s[0] * es, s[0], m, gi);
        }
    }
}

// gout, x, y (...) -> gin (same shape); gin = gout * f'(x); gin overwritten
ct_status cti_cpu_unary_backward(ct_unary_op op, ct_tensor *gin, const ct_tensor *gout, const ct_tensor *x,
                                 const ct_tensor *y)
{
    bwd_ctx c = {.op = op, .dt = gin->dtype, .ix = -1, .iy = -1};
    char *base[4] = {ct_tensor_data(gin), ct_tensor_data(gout)};
    const int64_t *strides[4] = {gin->strides, gout->strides};
    size_t es[4] = {ct_dtype_size(gin->dtype), ct_dtype_size(gin->dtype)};
    int nops = 2;
    if (x) {
        c.ix = nops;
        base[nops] = ct_tensor_data(x), strides[nops] = x->strides, es[nops] = es[0];
        nops++;
    }
    if (y) {
        c.iy = nops;
        base[nops] = ct_tensor_data(y), strides[nops] = y->strides, es[nops] = es[0];
        nops++;
    }
    cti_cpu_ew_run(gin->ndim, gin->shape, nops, base, strides, es, bwd_row, &c);
    return CT_OK;
}
