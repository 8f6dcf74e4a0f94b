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

#include <math.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* ---- narrowing ----------------------------------------------------------------- */

/* Target format. nbits: 8 or 16; M mantissa bits; B bias; max_enc the largest
 * finite magnitude encoding; has_inf: IEEE-like inf/NaN (else E4M3: all-ones is
 * the only NaN and there is no infinity). */
#define FMT_F16 16, 10, 15, 0x7BFFu, true
#define FMT_BF16 16, 7, 127, 0x7F7Fu, true
#define FMT_E4M3 8, 3, 7, 0x7Eu, false
#define FMT_E5M2 8, 2, 15, 0x7Bu, true

/* RNE magnitude encoding of the f32 magnitude a (bits, sign cleared); may exceed
 * max_enc (overflow; an infinite a always does). Input subnormals are
 * mant * 2^(-126-23): exponent field 1, no implicit bit. */
static inline uint32_t round_mag_f32(uint32_t a, int M, int B)
{
    int32_t ebits = (int32_t)(a >> 23);
    int32_t eb = ebits > 1 ? ebits : 1; /* subnormals share exponent 1 - 127 */
    uint32_t sig = (a & 0x7FFFFFu) | (ebits ? 0x800000u : 0u);
    int32_t extra = 128 - B - eb > 0 ? 128 - B - eb : 0; /* emin - e when subnormal */
    /* 25 drops all 24 bits with the half point above sig: rounds to 0. */
    int32_t shift = 23 - M + extra < 25 ? 23 - M + extra : 25;
    /* RNE: add half - 1, plus 1 when the kept part is odd, then truncate */
    uint32_t q = (sig + ((1u << (shift - 1)) - 1u) + ((sig >> shift) & 1u)) >> shift;
    uint32_t base = extra > 0 ? 0u : (uint32_t)(eb - 128 + B) << M;
    return base + q;
}

/* The same from an f64 magnitude (bits, sign cleared). */
static inline uint64_t round_mag_f64(uint64_t a, int M, int B)
{
    int32_t ebits = (int32_t)(a >> 52);
    int32_t eb = ebits > 1 ? ebits : 1;
    uint64_t sig = (a & 0xFFFFFFFFFFFFFull) | (ebits ? 1ull << 52 : 0u);
    int32_t extra = 1024 - B - eb > 0 ? 1024 - B - eb : 0;
    int32_t shift = 52 - M + extra < 54 ? 52 - M + extra : 54;
    uint64_t q = (sig + ((1ull << (shift - 1)) - 1u) + ((sig >> shift) & 1u)) >> shift;
    uint64_t base = extra > 0 ? 0u : (uint64_t)(eb - 1024 + B) << M;
    return base + q;
}

/* Overflow result: saturate -> max finite; else inf, or E4M3's NaN. */
static inline uint32_t overflow_enc(int M, uint32_t max_enc, bool has_inf, bool sat, int nbits)
{
    uint32_t inf_enc = ((1u << (nbits - 1 - M)) - 1u) << M;
    return sat ? max_enc : has_inf ? inf_enc : inf_enc | ((1u << M) - 1u);
}

/* NaN result: IEEE-like formats keep the top payload bits and set the quiet bit
 * (mant = the source mantissa field, P its width). */
static inline uint32_t nan_enc(int M, bool has_inf, int nbits, uint64_t mant, int P)
{
    uint32_t inf_enc = ((1u << (nbits - 1 - M)) - 1u) << M;
    return has_inf ? inf_enc | (1u << (M - 1)) | (uint32_t)(mant >> (P - M))
                   : inf_enc | ((1u << M) - 1u);
}

static inline uint32_t narrow_f32(float f, int nbits, int M, int B, uint32_t max_enc, bool has_inf,
                                  bool sat)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 31) << (nbits - 1);
    uint32_t a = u & 0x7FFFFFFFu;
    /* an infinite a lands above max_enc too */
    uint32_t r = round_mag_f32(a, M, B);
    r = r > max_enc ? overflow_enc(M, max_enc, has_inf, sat, nbits) : r;
    r = a > 0x7F800000u ? nan_enc(M, has_inf, nbits, a & 0x7FFFFFu, 23) : r;
    return sign | r;
}

static inline uint32_t narrow_f64(double d, int nbits, int M, int B, uint32_t max_enc, bool has_inf,
                                  bool sat)
{
    uint64_t u = f64_bits(d);
    uint32_t sign = (uint32_t)(u >> 63) << (nbits - 1);
    uint64_t a = u & 0x7FFFFFFFFFFFFFFFull;
    uint64_t r = round_mag_f64(a, M, B);
    uint32_t r32 = r > max_enc ? overflow_enc(M, max_enc, has_inf, sat, nbits) : (uint32_t)r;
    r32 = a > 0x7FF0000000000000ull ? nan_enc(M, has_inf, nbits, a & 0xFFFFFFFFFFFFFull, 52) : r32;
    return sign | r32;
}

/* bf16 is the top half of an f32: RNE on the low 16 bits; a carry out of the
 * mantissa moves into the exponent and the largest finite values round to inf. */
static inline uint16_t bf16_narrow(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t qnan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? qnan : r);
}

uint16_t ct_f32_to_f16(float f) { return (uint16_t)narrow_f32(f, FMT_F16, false); }
uint16_t ct_f32_to_bf16(float f) { return bf16_narrow(f); }
uint8_t ct_f32_to_e4m3(float f, bool saturate) { return (uint8_t)narrow_f32(f, FMT_E4M3, saturate); }
uint8_t ct_f32_to_e5m2(float f, bool saturate) { return (uint8_t)narrow_f32(f, FMT_E5M2, saturate); }

uint16_t ct_f64_to_f16(double d) { return (uint16_t)narrow_f64(d, FMT_F16, false); }
uint16_t ct_f64_to_bf16(double d) { return (uint16_t)narrow_f64(d, FMT_BF16, false); }
uint8_t ct_f64_to_e4m3(double d, bool saturate) { return (uint8_t)narrow_f64(d, FMT_E4M3, saturate); }
uint8_t ct_f64_to_e5m2(double d, bool saturate) { return (uint8_t)narrow_f64(d, FMT_E5M2, saturate); }

/* ---- widening (exact) ------------------------------------------------------------ */

/* bits(m * 2^-p) for an integer 0 <= m < 2^nb whose value is a normal f32:
 * 2^msb * (m / 2^msb). Integer-only, and msb is a count of compares rather than
 * a clz or an int->float conversion, so gcc if-converts it and the bulk loops
 * vectorize; the result never depends on DAZ/FTZ. */
static inline uint32_t scaled_int_bits(uint32_t m, uint32_t p, int nb)
{
    uint32_t msb = 0;
    for (int j = 1; j < nb; j++) msb += m >= (1u << j);
    uint32_t r = ((127u + msb - p) << 23) | ((m << (23u - msb)) & 0x7FFFFFu);
    return m ? r : 0u;
}

/* f16: normal -> rebias the exponent by 127 - 15 = 112; subnormal m -> m * 2^-24;
 * inf/NaN -> f32 inf/NaN with the payload on top, quieted. */
static inline uint32_t f16_widen_bits(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t em = h & 0x7FFFu;
    uint32_t normal = (em << 13) + (112u << 23);
    uint32_t sub = scaled_int_bits(em & 0x3FFu, 24u, 10);
    uint32_t special = 0x7F800000u | ((em & 0x3FFu) << 13) | (em > 0x7C00u ? 0x400000u : 0u);
    uint32_t r = em >= 0x7C00u ? special : em >= 0x400u ? normal : sub;
    return sign | r;
}

static inline uint32_t bf16_widen_bits(uint32_t h)
{
    uint32_t u = h << 16;
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? u | 0x400000u : u;
}

/* E4M3: normal -> rebias by 127 - 7 = 120; subnormal m -> m * 2^-9; 0x7F -> NaN. */
static inline uint32_t e4m3_widen_bits(uint32_t v)
{
    uint32_t sign = (v & 0x80u) << 24;
    uint32_t em = v & 0x7Fu;
    uint32_t normal = (em << 20) + (120u << 23);
    uint32_t sub = scaled_int_bits(em & 0x7u, 9u, 3);
    uint32_t r = em == 0x7Fu ? 0x7FC00000u : em >= 8u ? normal : sub;
    return sign | r;
}

float ct_f16_to_f32(uint16_t h) { return f32_from_bits(f16_widen_bits(h)); }
float ct_bf16_to_f32(uint16_t h) { return f32_from_bits(bf16_widen_bits(h)); }
float ct_e4m3_to_f32(uint8_t v) { return f32_from_bits(e4m3_widen_bits(v)); }
/* E5M2 is the top byte of an f16. */
float ct_e5m2_to_f32(uint8_t v) { return f32_from_bits(f16_widen_bits((uint32_t)v << 8)); }

/* ---- integers -------------------------------------------------------------------- */

/* Float -> int: truncate toward zero, saturate, NaN -> 0. The bounds are the
 * first values whose truncation leaves the range. */
static inline int32_t f64_to_i32(double d)
{
    if (!(d > -2147483649.0)) return d != d ? 0 : INT32_MIN;
    if (d >= 2147483648.0) return INT32_MAX;
    return (int32_t)d;
}

static inline int64_t f64_to_i64(double d)
{
    if (!(d >= -0x1p63)) return d != d ? 0 : INT64_MIN;
    if (d >= 0x1p63) return INT64_MAX;
    return (int64_t)d;
}

static inline uint8_t f64_to_u8(double d)
{
    if (!(d > -1.0)) return 0; /* NaN too */
    if (d >= 255.0) return 255;
    return (uint8_t)d;
}

/* i64 -> f64 rounded to odd: truncate to 53 significant bits and set the last
 * kept bit if anything was dropped. Rounding that once more to nearest-even at
 * p <= 51 bits gives the same result as rounding the integer directly, so i64
 * reaches f32/f16/bf16/fp8 with a single rounding. */
static double i64_to_f64_odd(int64_t v)
{
    uint64_t m = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    int s = 0;
    while ((m >> s) >= (1ull << 53)) s++;
    if (s) {
        uint64_t lost = m & ((1ull << s) - 1u);
        m = (m & ~((1ull << s) - 1u)) | (lost ? 1ull << s : 0u);
    }
    double d = (double)m; /* exact: at most 53 significant bits */
    return v < 0 ? -d : d;
}

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
