/* CPU binary elementwise ops and where, with broadcasting.
 *
 *   a (...), b (...) -> out (broadcast shape); out[i] = a[i'] op b[i'']
 *
 * core/iter_internal.h folds the broadcast shape into rows whose inner strides are 1
 * (contiguous), 0 (a broadcast operand) or anything else; the row kernels below
 * pick a loop for the stride pattern once per row and switch on the op outside
 * the element loop, so the contiguous same-shape case and "row + broadcast
 * vector" ((N,C) + (C,): every row contiguous in all three) are plain loops that
 * gcc vectorises.
 *
 * Why no `restrict` on out and the inputs: ct_kernel_binary_out allows out to be
 * an input itself (in place). Exact aliasing is harmless to these loops (element
 * i is read before element i is written, and no other element is touched), but
 * restrict would make it undefined behaviour. gcc's runtime overlap check accepts
 * a distance of 0, so the in-place case still runs the vector loop.
 *
 * f16/bf16 go through f32 scratch buffers a few hundred elements at a time and
 * are rounded once on the way out. */
#include <math.h>
#include <string.h>

#include "core/convert.h"
#include "kernels/cpu/elementwise.h"

typedef union ew_scalar {
    float f;
    double d;
    int32_t i32;
    int64_t i64;
    uint8_t u8;
} ew_scalar;

typedef struct bin_ctx {
    ct_binary_op op;
    ct_dtype dt;   /* input dtype */
    bool cmp;      /* output is BOOL */
    bool scalar;   /* b (or a, when reversed) is s, in the compute type */
    bool reversed; /* s op a */
    ew_scalar s;
} bin_ctx;

/* o[i] = EXPR(x = a[i], y = b[i]) for one row, choosing the loop by stride
 * pattern: all contiguous, b broadcast, a broadcast, or general. */
#define EW_LOOP2(TI, EXPR)                                                                         \
    do {                                                                                           \
        if (so == 1 && sa == 1 && sb == 1) {                                                       \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const TI x = a[i], y = b[i];                                                       \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else if (so == 1 && sa == 1 && sb == 0) {                                                \
            const TI y = b[0];                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const TI x = a[i];                                                                 \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else if (so == 1 && sa == 0 && sb == 1) {                                                \
            const TI x = a[0];                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const TI y = b[i];                                                                 \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const TI x = a[i * sa], y = b[i * sb];                                             \
                o[i * so] = (EXPR);                                                                \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* MAX/MIN propagate NaN: x wins when it is NaN, y when y is (the comparison is false). */
#define EW_MAXF(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))
#define EW_MINF(x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))

#define DEF_BIN_FLOAT(NAME, T, POW)                                                                \
    static void NAME(ct_binary_op op, T *o, int64_t so, const T *a, int64_t sa, const T *b,        \
                     int64_t sb, int64_t n)                                                        \
    {                                                                                              \
        switch (op) {                                                                              \
        case CT_BINARY_ADD: EW_LOOP2(T, x + y); break;                                             \
        case CT_BINARY_SUB: EW_LOOP2(T, x - y); break;                                             \
        case CT_BINARY_MUL: EW_LOOP2(T, x * y); break;                                             \
        case CT_BINARY_DIV: EW_LOOP2(T, x / y); break;                                             \
        case CT_BINARY_POW:                                                                        \
            if (sb == 0 && b[0] == 2) EW_LOOP2(T, ((void)y, x * x));                                       \
            else EW_LOOP2(T, POW(x, y));                                                           \
            break;                                                                                 \
        case CT_BINARY_MAX: EW_LOOP2(T, EW_MAXF(x, y)); break;                                     \
        default: EW_LOOP2(T, EW_MINF(x, y)); break;                                                \
        }                                                                                          \
    }
DEF_BIN_FLOAT(bin_f32, float, powf)
DEF_BIN_FLOAT(bin_f64, double, pow)

/* Integer arithmetic wraps: computed in the unsigned type U of the same width. */
#define DEF_BIN_INT(NAME, T, U)                                                                    \
    static void NAME(ct_binary_op op, T *o, int64_t so, const T *a, int64_t sa, const T *b,        \
                     int64_t sb, int64_t n)                                                        \
    {                                                                                              \
        switch (op) {                                                                              \
        case CT_BINARY_ADD: EW_LOOP2(T, (T)((U)x + (U)y)); break;                                  \
        case CT_BINARY_SUB: EW_LOOP2(T, (T)((U)x - (U)y)); break;                                  \
        case CT_BINARY_MUL: EW_LOOP2(T, (T)((U)x * (U)y)); break;                                  \
        case CT_BINARY_MAX: EW_LOOP2(T, x > y ? x : y); break;                                     \
        default: EW_LOOP2(T, x < y ? x : y); break;                                                \
        }                                                                                          \
    }
DEF_BIN_INT(bin_i32, int32_t, uint32_t)
DEF_BIN_INT(bin_i64, int64_t, uint64_t)
DEF_BIN_INT(bin_u8, uint8_t, uint8_t)

#define DEF_CMP(NAME, T)                                                                           \
    static void NAME(ct_binary_op op, uint8_t *o, int64_t so, const T *a, int64_t sa, const T *b,  \
                     int64_t sb, int64_t n)                                                        \
    {                                                                                              \
        switch (op) {                                                                              \
        case CT_BINARY_EQ: EW_LOOP2(T, x == y); break;                                             \
        case CT_BINARY_NE: EW_LOOP2(T, x != y); break;                                             \
        case CT_BINARY_LT: EW_LOOP2(T, x < y); break;                                              \
        case CT_BINARY_LE: EW_LOOP2(T, x <= y); break;                                             \
        case CT_BINARY_GT: EW_LOOP2(T, x > y); break;                                              \
        default: EW_LOOP2(T, x >= y); break;                                                       \
        }                                                                                          \
    }
DEF_CMP(cmp_f32, float)
DEF_CMP(cmp_f64, double)
DEF_CMP(cmp_i32, int32_t)
DEF_CMP(cmp_i64, int64_t)
DEF_CMP(cmp_u8, uint8_t)

/* Calls the typed kernel for native dtypes; pointers are already offset. */
static void bin_native(const bin_ctx *c, char *o, int64_t so, const char *a, int64_t sa, const char *b,
                       int64_t sb, int64_t n)
{
#define BIN_CALL(FN, T, TO) FN(c->op, (TO *)o, so, (const T *)a, sa, (const T *)b, sb, n)
    switch (c->dt) {
    case CT_DTYPE_F32: c->cmp ? BIN_CALL(cmp_f32, float, uint8_t) : BIN_CALL(bin_f32, float, float); break;
    case CT_DTYPE_F64: c->cmp ? BIN_CALL(cmp_f64, double, uint8_t) : BIN_CALL(bin_f64, double, double); break;
    case CT_DTYPE_I32: c->cmp ? BIN_CALL(cmp_i32, int32_t, uint8_t) : BIN_CALL(bin_i32, int32_t, int32_t); break;
    case CT_DTYPE_I64: c->cmp ? BIN_CALL(cmp_i64, int64_t, uint8_t) : BIN_CALL(bin_i64, int64_t, int64_t); break;
    default: c->cmp ? BIN_CALL(cmp_u8, uint8_t, uint8_t) : BIN_CALL(bin_u8, uint8_t, uint8_t); break; /* u8, bool */
    }
#undef BIN_CALL
}

enum { HALF_CHUNK = 512 };

/* f16/bf16: load to f32 (a scalar operand already is f32), compute, round once. */
static void bin_half(const bin_ctx *c, char *o, int64_t so, const char *a, int64_t sa, bool a_is_s,
                     const char *b, int64_t sb, bool b_is_s, int64_t n)
{
    float xa[HALF_CHUNK], xb[HALF_CHUNK], xo[HALF_CHUNK];
    const int64_t es = 2;
    for (int64_t off = 0; off < n; off += HALF_CHUNK) {
        const int64_t m = n - off < HALF_CHUNK ? n - off : HALF_CHUNK;
        const float *fa = a_is_s ? &c->s.f : xa, *fb = b_is_s ? &c->s.f : xb;
        if (!a_is_s) cti_cpu_ew_load_f32(c->dt, a + off * sa * es, sa, sa == 0 ? 1 : m, xa);
        if (!b_is_s) cti_cpu_ew_load_f32(c->dt, b + off * sb * es, sb, sb == 0 ? 1 : m, xb);
        const int64_t fsa = a_is_s || sa == 0 ? 0 : 1, fsb = b_is_s || sb == 0 ? 0 : 1;
        if (c->cmp) {
            cmp_f32(c->op, (uint8_t *)o + off * so, so, fa, fsa, fb, fsb, m);
        } else {
            bin_f32(c->op, xo, 1, fa, fsa, fb, fsb, m);
            cti_cpu_ew_store_f32(c->dt, o + off * so * es, so, m, xo);
        }
    }
}

static void bin_row(const void *vctx, char *const *p, const int64_t *s, int64_t n)
{
    const bin_ctx *c = vctx;
    const char *a = p[1], *b = p[2];
    int64_t sa = s[1], sb = s[2];
    bool a_is_s = false, b_is_s = false;
    if (c->scalar && c->reversed) {
        a = (const char *)&c->s, sa = 0, a_is_s = true;
        b = p[1], sb = s[1];
    } else if (c->scalar) {
        b = (const char *)&c->s, sb = 0, b_is_s = true;
    }
    if (c->dt == CT_DTYPE_F16 || c->dt == CT_DTYPE_BF16) bin_half(c, p[0], s[0], a, sa, a_is_s, b, sb, b_is_s, n);
    else bin_native(c, p[0], s[0], a, sa, b, sb, n);
}

// a (...), b (...) -> out (broadcast); out = a op b; out overwritten
ct_status cti_cpu_binary(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b)
{
    bin_ctx c = {.op = op, .dt = a->dtype, .cmp = ct_binary_op_is_comparison(op)};
    int64_t sa[CT_MAX_DIMS], sb[CT_MAX_DIMS];
    cti_cpu_ew_bcast_strides(a, out->ndim, out->shape, sa);
    cti_cpu_ew_bcast_strides(b, out->ndim, out->shape, sb);
    char *base[3] = {ct_tensor_data(out), ct_tensor_data(a), ct_tensor_data(b)};
    const int64_t *strides[3] = {out->strides, sa, sb};
    size_t es[3] = {ct_dtype_size(out->dtype), ct_dtype_size(a->dtype), ct_dtype_size(b->dtype)};
    cti_cpu_ew_run(out->ndim, out->shape, 3, base, strides, es, bin_row, &c);
    return CT_OK;
}

// a (...) -> out (same shape); out = a op s, or s op a when reversed; out overwritten
ct_status cti_cpu_binary_scalar(ct_binary_op op, ct_tensor *out, const ct_tensor *a, double s, bool reversed)
{
    bin_ctx c = {.op = op, .dt = a->dtype, .cmp = ct_binary_op_is_comparison(op), .scalar = true,
                 .reversed = reversed};
    switch (a->dtype) {
    case CT_DTYPE_F64: c.s.d = s; break;
    case CT_DTYPE_I32: c.s.i32 = (int32_t)s; break;
    case CT_DTYPE_I64: c.s.i64 = (int64_t)s; break;
    case CT_DTYPE_U8:
    case CT_DTYPE_BOOL: c.s.u8 = (uint8_t)s; break;
    default: c.s.f = (float)s; break; /* f32, f16, bf16 compute in f32 */
    }
    int64_t sa[CT_MAX_DIMS];
    cti_cpu_ew_bcast_strides(a, out->ndim, out->shape, sa);
    char *base[2] = {ct_tensor_data(out), ct_tensor_data(a)};
    const int64_t *strides[2] = {out->strides, sa};
    size_t es[2] = {ct_dtype_size(out->dtype), ct_dtype_size(a->dtype)};
    cti_cpu_ew_run(out->ndim, out->shape, 2, base, strides, es, bin_row, &c);
    return CT_OK;
}

/* ---- where ----------------------------------------------------------------------- */

/* Elements are moved as opaque words of the dtype's size, so every dtype works. */
#define DEF_WHERE(NAME, T)                                                                         \
    static void NAME(char *const *p, const int64_t *s, int64_t n)                                  \
    {                                                                                              \
        T *o = (T *)p[0];                                                                          \
        const uint8_t *c = (const uint8_t *)p[1];                                                  \
        const T *a = (const T *)p[2], *b = (const T *)p[3];                                        \
        if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {                                    \
            for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : b[i];                             \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) o[i * s[0]] = c[i * s[1]] ? a[i * s[2]] : b[i * s[3]]; \
        }                                                                                          \
    }
DEF_WHERE(where_1, uint8_t)
DEF_WHERE(where_2, uint16_t)
DEF_WHERE(where_4, uint32_t)
DEF_WHERE(where_8, uint64_t)

static void where_row(const void *vctx, char *const *p, const int64_t *s, int64_t n)
{
    switch (*(const size_t *)vctx) {
    case 1: where_1(p, s, n); break;
    case 2: where_2(p, s, n); break;
    case 4: where_4(p, s, n); break;
    default: where_8(p, s, n); break;
    }
}

// cond, a, b (broadcast) -> out; out = cond ? a : b; out overwritten
ct_status cti_cpu_where(ct_tensor *out, const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b)
{
    const ct_tensor *in[3] = {cond, a, b};
    int64_t st[3][CT_MAX_DIMS];
    for (int k = 0; k < 3; k++) cti_cpu_ew_bcast_strides(in[k], out->ndim, out->shape, st[k]);
    char *base[4] = {ct_tensor_data(out), ct_tensor_data(cond), ct_tensor_data(a), ct_tensor_data(b)};
    const int64_t *strides[4] = {out->strides, st[0], st[1], st[2]};
    const size_t es = ct_dtype_size(out->dtype);
    size_t esz[4] = {es, 1, es, es};
    cti_cpu_ew_run(out->ndim, out->shape, 4, base, strides, esz, where_row, &es);
    return CT_OK;
}
