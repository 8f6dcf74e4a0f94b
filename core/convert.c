/* ctrain — element type conversions (see convert.h for the formats and rules).
 *
 * Narrowing works on the IEEE bit pattern of the source. For a finite source
 * |x| = sig * 2^(e - P) (P = 23 for f32, 52 for f64; sig has its implicit bit),
 * a target with M mantissa bits and bias B keeps the top M+1 bits of sig when
 * e >= emin = 1 - B, and emin - e fewer when the result is subnormal. The dropped
 * bits decide the rounding (above half: up; exactly half: up if the kept part is
 * odd). The kept part q is then added to (e + B - 1) << M, so a carry out of the
 * mantissa moves into the exponent field, a subnormal that rounds up becomes the
 * smallest normal, and the largest finite value rounds into the overflow
 * encoding; anything above the target's largest finite encoding has overflowed.
 *
 * Everything here is branch-free selects on integers, so the bulk loops of
 * ct_convert_n vectorize (AVX2 variable shifts); with F16C the f32 <-> f16 loops
 * use the hardware instructions, which give the same bits (NaNs included).
 */
#include "core/convert.h"
#include "core/convert_bits.h"

#include <math.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

uint16_t ct_f32_to_f16(float f) { return cti_f32_to_f16_bits(f); }
uint16_t ct_f32_to_bf16(float f) { return cti_f32_to_bf16_bits(f); }
uint8_t ct_f32_to_e4m3(float f, bool saturate) { return cti_f32_to_e4m3_bits(f, saturate); }
uint8_t ct_f32_to_e5m2(float f, bool saturate) { return cti_f32_to_e5m2_bits(f, saturate); }

uint16_t ct_f64_to_f16(double d) { return cti_f64_to_f16_bits(d); }
uint16_t ct_f64_to_bf16(double d) { return cti_f64_to_bf16_bits(d); }
uint8_t ct_f64_to_e4m3(double d, bool saturate) { return cti_f64_to_e4m3_bits(d, saturate); }
uint8_t ct_f64_to_e5m2(double d, bool saturate) { return cti_f64_to_e5m2_bits(d, saturate); }

float ct_f16_to_f32(uint16_t h) { return cti_f16_bits_to_f32(h); }
float ct_bf16_to_f32(uint16_t h) { return cti_bf16_bits_to_f32(h); }
float ct_e4m3_to_f32(uint8_t v) { return cti_e4m3_bits_to_f32(v); }
float ct_e5m2_to_f32(uint8_t v) { return cti_e5m2_bits_to_f32(v); }

/* ---- bulk loops -------------------------------------------------------------------- */

/* Loops from an f32 source (the hot paths for kernels). */
static void f32_to_f16_n(uint16_t *restrict d, const float *restrict s, int64_t n)
{
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(d + i), h);
    }
#endif
    for (; i < n; i++) d[i] = (uint16_t)narrow_f32(s[i], FMT_F16, false);
}

static void f32_to_bf16_n(uint16_t *restrict d, const float *restrict s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) d[i] = bf16_narrow(s[i]);
}

static void f32_to_e4m3_n(uint8_t *restrict d, const float *restrict s, int64_t n, bool sat)
{
    if (sat)
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)narrow_f32(s[i], FMT_E4M3, true);
    else
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)narrow_f32(s[i], FMT_E4M3, false);
}

static void f32_to_e5m2_n(uint8_t *restrict d, const float *restrict s, int64_t n, bool sat)
{
    if (sat)
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)narrow_f32(s[i], FMT_E5M2, true);
    else
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)narrow_f32(s[i], FMT_E5M2, false);
}

static void f16_to_f32_n(float *restrict d, const uint16_t *restrict s, int64_t n)
{
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) d[i] = f32_from_bits(f16_widen_bits(s[i]));
}

static void bf16_to_f32_n(float *restrict d, const uint16_t *restrict s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) d[i] = f32_from_bits(bf16_widen_bits(s[i]));
}

static void e4m3_to_f32_n(float *restrict d, const uint8_t *restrict s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) d[i] = f32_from_bits(e4m3_widen_bits(s[i]));
}

static void e5m2_to_f32_n(float *restrict d, const uint8_t *restrict s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) d[i] = f32_from_bits(f16_widen_bits((uint32_t)s[i] << 8));
}

/* f32-exact sources (f32, f16, bf16, fp8, u8, bool) widen into f32. */
static void widen_to_f32(float *restrict d, ct_dtype st, const void *restrict src, int64_t n)
{
    switch (st) {
    case CT_DTYPE_F32: memcpy(d, src, (size_t)n * sizeof(float)); break;
    case CT_DTYPE_F16: f16_to_f32_n(d, src, n); break;
    case CT_DTYPE_BF16: bf16_to_f32_n(d, src, n); break;
    case CT_DTYPE_F8_E4M3: e4m3_to_f32_n(d, src, n); break;
    case CT_DTYPE_F8_E5M2: e5m2_to_f32_n(d, src, n); break;
    case CT_DTYPE_U8: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
        break;
    }
    case CT_DTYPE_BOOL: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i] != 0 ? 1.0f : 0.0f;
        break;
    }
    default: CT_ASSERT(!"widen_to_f32: not an f32-exact dtype");
    }
}

/* f32 into f32-class targets (f32, f16, bf16, fp8). */
static void narrow_from_f32(ct_dtype dt, void *restrict dst, const float *restrict s, int64_t n,
                            bool sat)
{
    switch (dt) {
    case CT_DTYPE_F32: memcpy(dst, s, (size_t)n * sizeof(float)); break;
    case CT_DTYPE_F16: f32_to_f16_n(dst, s, n); break;
    case CT_DTYPE_BF16: f32_to_bf16_n(dst, s, n); break;
    case CT_DTYPE_F8_E4M3: f32_to_e4m3_n(dst, s, n, sat); break;
    case CT_DTYPE_F8_E5M2: f32_to_e5m2_n(dst, s, n, sat); break;
    default: CT_ASSERT(!"narrow_from_f32: not an f32-class dtype");
    }
}

/* Any source into f64: exact, except i64, which is rounded to odd (see
 * i64_to_f64_odd) because every caller rounds it again to a narrower target. */
static void load_f64(double *restrict d, ct_dtype st, const void *restrict src, int64_t n)
{
    switch (st) {
    case CT_DTYPE_F64: memcpy(d, src, (size_t)n * sizeof(double)); break;
    case CT_DTYPE_I32: {
        const int32_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = (double)s[i];
        break;
    }
    case CT_DTYPE_I64: {
        const int64_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = i64_to_f64_odd(s[i]);
        break;
    }
    default: {
        float tmp[256];
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256;
            widen_to_f32(tmp, st, (const char *)src + (size_t)i * ct_dtype_size(st), m);
            for (int64_t j = 0; j < m; j++) d[i + j] = (double)tmp[j];
        }
    }
    }
}

static void store_f64(ct_dtype dt, void *restrict dst, const double *restrict s, int64_t n, bool sat)
{
    switch (dt) {
    case CT_DTYPE_F32: {
        float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
        break;
    }
    case CT_DTYPE_F64: memcpy(dst, s, (size_t)n * sizeof(double)); break;
    case CT_DTYPE_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (uint16_t)narrow_f64(s[i], FMT_F16, false);
        break;
    }
    case CT_DTYPE_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (uint16_t)narrow_f64(s[i], FMT_BF16, false);
        break;
    }
    case CT_DTYPE_F8_E4M3: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)narrow_f64(s[i], FMT_E4M3, sat);
        break;
    }
    case CT_DTYPE_F8_E5M2: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)narrow_f64(s[i], FMT_E5M2, sat);
        break;
    }
    case CT_DTYPE_I32: {
        int32_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = f64_to_i32(s[i]);
        break;
    }
    case CT_DTYPE_I64: {
        int64_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = f64_to_i64(s[i]);
        break;
    }
    case CT_DTYPE_U8: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = f64_to_u8(s[i]);
        break;
    }
    case CT_DTYPE_BOOL: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = s[i] != 0.0; /* NaN != 0 */
        break;
    }
    default: CT_ASSERT(!"store_f64: bad dtype");
    }
}

static void load_i64(int64_t *restrict d, ct_dtype st, const void *restrict src, int64_t n)
{
    switch (st) {
    case CT_DTYPE_I32: {
        const int32_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
        break;
    }
    case CT_DTYPE_I64: memcpy(d, src, (size_t)n * sizeof(int64_t)); break;
    case CT_DTYPE_U8: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
        break;
    }
    case CT_DTYPE_BOOL: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i] != 0;
        break;
    }
    default: CT_ASSERT(!"load_i64: not an integer dtype");
    }
}

/* Two's complement wrap, as a C cast (the i32 case goes through uint32_t, which
 * gcc and clang define as modulo 2^32). */
static void store_i64(ct_dtype dt, void *restrict dst, const int64_t *restrict s, int64_t n)
{
    switch (dt) {
    case CT_DTYPE_I32: {
        int32_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (int32_t)(uint32_t)(uint64_t)s[i];
        break;
    }
    case CT_DTYPE_I64: memcpy(dst, s, (size_t)n * sizeof(int64_t)); break;
    case CT_DTYPE_U8: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)(uint64_t)s[i];
        break;
    }
    case CT_DTYPE_BOOL: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = s[i] != 0;
        break;
    }
    default: CT_ASSERT(!"store_i64: not an integer dtype");
    }
}

static bool is_int_class(ct_dtype dt)
{
    return dt == CT_DTYPE_I32 || dt == CT_DTYPE_I64 || dt == CT_DTYPE_U8 || dt == CT_DTYPE_BOOL;
}

/* Targets reachable from f32 with one rounding of an f32 value. */
static bool is_f32_class(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F16 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F8_E4M3 ||
           dt == CT_DTYPE_F8_E5M2;
}

/* Sources whose every value is exact in f32. */
static bool is_f32_exact(ct_dtype dt)
{
    return is_f32_class(dt) || dt == CT_DTYPE_U8 || dt == CT_DTYPE_BOOL;
}

#define CONVERT_BLOCK 256

ct_status ct_convert_n(ct_dtype dst_dt, void *dst, ct_dtype src_dt, const void *src, int64_t n,
                       bool saturate)
{
    if (!ct_dtype_is_valid(dst_dt) || !ct_dtype_is_valid(src_dt))
        return ct_error_set(CT_ERR_INVALID,
                            "ct_convert_n: invalid dtype in conversion %s (%d) -> %s (%d)",
                            ct_dtype_name(src_dt), (int)src_dt, ct_dtype_name(dst_dt), (int)dst_dt);
    if (n < 0)
        return ct_error_set(CT_ERR_INVALID, "ct_convert_n: %s -> %s: negative count %lld",
                            ct_dtype_name(src_dt), ct_dtype_name(dst_dt), (long long)n);
    if (n == 0) return CT_OK;
    if (!dst || !src)
        return ct_error_set(CT_ERR_INVALID, "ct_convert_n: %s -> %s: NULL %s buffer for %lld elements",
                            ct_dtype_name(src_dt), ct_dtype_name(dst_dt), dst ? "source" : "destination",
                            (long long)n);
    size_t dbytes = (size_t)n * ct_dtype_size(dst_dt), sbytes = (size_t)n * ct_dtype_size(src_dt);
    uintptr_t d0 = (uintptr_t)dst, s0 = (uintptr_t)src;
    if (d0 < s0 + sbytes && s0 < d0 + dbytes)
        return ct_error_set(CT_ERR_INVALID, "ct_convert_n: %s -> %s: source and destination overlap",
                            ct_dtype_name(src_dt), ct_dtype_name(dst_dt));

    if (dst_dt == src_dt) {
        memcpy(dst, src, dbytes);
        return CT_OK;
    }
    size_t dsz = ct_dtype_size(dst_dt), ssz = ct_dtype_size(src_dt);
    char *d = dst;
    const char *s = src;

    if (is_int_class(dst_dt) && is_int_class(src_dt)) {
        int64_t buf[CONVERT_BLOCK];
        for (int64_t i = 0; i < n; i += CONVERT_BLOCK) {
            int64_t m = n - i < CONVERT_BLOCK ? n - i : CONVERT_BLOCK;
            load_i64(buf, src_dt, s + (size_t)i * ssz, m);
            store_i64(dst_dt, d + (size_t)i * dsz, buf, m);
        }
        return CT_OK;
    }
    if (src_dt == CT_DTYPE_I64 && dst_dt == CT_DTYPE_F64) {
        const int64_t *si = src;
        double *dd = dst;
        for (int64_t i = 0; i < n; i++) dd[i] = (double)si[i];
        return CT_OK;
    }
    if (is_f32_exact(src_dt) && is_f32_class(dst_dt)) {
        if (src_dt == CT_DTYPE_F32) {
            narrow_from_f32(dst_dt, dst, src, n, saturate);
        } else if (dst_dt == CT_DTYPE_F32) {
            widen_to_f32(dst, src_dt, src, n);
        } else {
            float buf[CONVERT_BLOCK];
            for (int64_t i = 0; i < n; i += CONVERT_BLOCK) {
                int64_t m = n - i < CONVERT_BLOCK ? n - i : CONVERT_BLOCK;
                widen_to_f32(buf, src_dt, s + (size_t)i * ssz, m);
                narrow_from_f32(dst_dt, d + (size_t)i * dsz, buf, m, saturate);
            }
        }
        return CT_OK;
    }
    if (src_dt == CT_DTYPE_F64) {
        store_f64(dst_dt, dst, src, n, saturate);
    } else if (dst_dt == CT_DTYPE_F64) {
        load_f64(dst, src_dt, src, n);
    } else {
        double buf[CONVERT_BLOCK];
        for (int64_t i = 0; i < n; i += CONVERT_BLOCK) {
            int64_t m = n - i < CONVERT_BLOCK ? n - i : CONVERT_BLOCK;
            load_f64(buf, src_dt, s + (size_t)i * ssz, m);
            store_f64(dst_dt, d + (size_t)i * dsz, buf, m, saturate);
        }
    }
    return CT_OK;
}

/* ---- scalar access ------------------------------------------------------------------ */

double ct_scalar_load(ct_dtype dt, const void *p)
{
    switch (dt) {
    case CT_DTYPE_F32: {
        float v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case CT_DTYPE_F64: {
        double v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case CT_DTYPE_F16: {
        uint16_t v;
        memcpy(&v, p, sizeof v);
        return ct_f16_to_f32(v);
    }
    case CT_DTYPE_BF16: {
        uint16_t v;
        memcpy(&v, p, sizeof v);
        return ct_bf16_to_f32(v);
    }
    case CT_DTYPE_F8_E4M3: return ct_e4m3_to_f32(*(const uint8_t *)p);
    case CT_DTYPE_F8_E5M2: return ct_e5m2_to_f32(*(const uint8_t *)p);
    case CT_DTYPE_I32: {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case CT_DTYPE_I64: {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return (double)v;
    }
    case CT_DTYPE_U8: return *(const uint8_t *)p;
    case CT_DTYPE_BOOL: return *(const uint8_t *)p != 0;
    default: break;
    }
    ct_error_set(CT_ERR_INVALID, "ct_scalar_load: invalid dtype %d", (int)dt);
    return NAN;
}

void ct_scalar_store(ct_dtype dt, void *p, double v)
{
    if (!ct_dtype_is_valid(dt)) {
        ct_error_set(CT_ERR_INVALID, "ct_scalar_store: invalid dtype %d", (int)dt);
        return;
    }
    unsigned char tmp[8];
    store_f64(dt, tmp, &v, 1, false);
    memcpy(p, tmp, ct_dtype_size(dt));
}
