/* ctrain — the bit-level conversions between element types, shared by the CPU
 * (core/convert.c) and the CUDA kernels (core/cuda_copy.cu, kernels/cuda/), so that
 * both devices round every value to the same bits. The formats and rules are in
 * core/convert.h; the method in core/convert.c.
 *
 * Compiled as C these are static inline functions; compiled by nvcc they are
 * __host__ __device__ as well (CTI_HD). Not part of the public API. */
#ifndef CT_CORE_CONVERT_BITS_H
#define CT_CORE_CONVERT_BITS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CTI_HD __host__ __device__
#else
#define CTI_HD
#endif

CTI_HD static inline uint32_t f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

CTI_HD static inline float f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

CTI_HD static inline uint64_t f64_bits(double d)
{
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(d);
#else
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
#endif
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
CTI_HD static inline uint32_t round_mag_f32(uint32_t a, int M, int B)
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
CTI_HD static inline uint64_t round_mag_f64(uint64_t a, int M, int B)
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
CTI_HD static inline uint32_t overflow_enc(int M, uint32_t max_enc, bool has_inf, bool sat, int nbits)
{
    uint32_t inf_enc = ((1u << (nbits - 1 - M)) - 1u) << M;
    return sat ? max_enc : has_inf ? inf_enc : inf_enc | ((1u << M) - 1u);
}

/* NaN result: IEEE-like formats keep the top payload bits and set the quiet bit
 * (mant = the source mantissa field, P its width). */
CTI_HD static inline uint32_t nan_enc(int M, bool has_inf, int nbits, uint64_t mant, int P)
{
    uint32_t inf_enc = ((1u << (nbits - 1 - M)) - 1u) << M;
    return has_inf ? inf_enc | (1u << (M - 1)) | (uint32_t)(mant >> (P - M))
                   : inf_enc | ((1u << M) - 1u);
}

CTI_HD static inline uint32_t narrow_f32(float f, int nbits, int M, int B, uint32_t max_enc, bool has_inf,
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

CTI_HD static inline uint32_t narrow_f64(double d, int nbits, int M, int B, uint32_t max_enc, bool has_inf,
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
CTI_HD static inline uint16_t bf16_narrow(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t qnan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? qnan : r);
}



/* ---- widening (exact) ------------------------------------------------------------ */

/* bits(m * 2^-p) for an integer 0 <= m < 2^nb whose value is a normal f32:
 * 2^msb * (m / 2^msb). Integer-only, and msb is a count of compares rather than
 * a clz or an int->float conversion, so gcc if-converts it and the bulk loops
 * vectorize; the result never depends on DAZ/FTZ. */
CTI_HD static inline uint32_t scaled_int_bits(uint32_t m, uint32_t p, int nb)
{
    uint32_t msb = 0;
    for (int j = 1; j < nb; j++) msb += m >= (1u << j);
    uint32_t r = ((127u + msb - p) << 23) | ((m << (23u - msb)) & 0x7FFFFFu);
    return m ? r : 0u;
}

/* f16: normal -> rebias the exponent by 127 - 15 = 112; subnormal m -> m * 2^-24;
 * inf/NaN -> f32 inf/NaN with the payload on top, quieted. */
CTI_HD static inline uint32_t f16_widen_bits(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t em = h & 0x7FFFu;
    uint32_t normal = (em << 13) + (112u << 23);
    uint32_t sub = scaled_int_bits(em & 0x3FFu, 24u, 10);
    uint32_t special = 0x7F800000u | ((em & 0x3FFu) << 13) | (em > 0x7C00u ? 0x400000u : 0u);
    uint32_t r = em >= 0x7C00u ? special : em >= 0x400u ? normal : sub;
    return sign | r;
}

CTI_HD static inline uint32_t bf16_widen_bits(uint32_t h)
{
    uint32_t u = h << 16;
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? u | 0x400000u : u;
}

/* E4M3: normal -> rebias by 127 - 7 = 120; subnormal m -> m * 2^-9; 0x7F -> NaN. */
CTI_HD static inline uint32_t e4m3_widen_bits(uint32_t v)
{
    uint32_t sign = (v & 0x80u) << 24;
    uint32_t em = v & 0x7Fu;
    uint32_t normal = (em << 20) + (120u << 23);
    uint32_t sub = scaled_int_bits(em & 0x7u, 9u, 3);
    uint32_t r = em == 0x7Fu ? 0x7FC00000u : em >= 8u ? normal : sub;
    return sign | r;
}

/* ---- integers ------------------------------------------------------------------ */

/* Float -> int: truncate toward zero, saturate, NaN -> 0. The bounds are the
 * first values whose truncation leaves the range. */
CTI_HD static inline int32_t f64_to_i32(double d)
{
    if (!(d > -2147483649.0)) return d != d ? 0 : INT32_MIN;
    if (d >= 2147483648.0) return INT32_MAX;
    return (int32_t)d;
}

CTI_HD static inline int64_t f64_to_i64(double d)
{
    if (!(d >= -0x1p63)) return d != d ? 0 : INT64_MIN;
    if (d >= 0x1p63) return INT64_MAX;
    return (int64_t)d;
}

CTI_HD static inline uint8_t f64_to_u8(double d)
{
    if (!(d > -1.0)) return 0; /* NaN too */
    if (d >= 255.0) return 255;
    return (uint8_t)d;
}

/* i64 -> f64 rounded to odd: truncate to 53 significant bits and set the last
 * kept bit if anything was dropped. Rounding that once more to nearest-even at
 * p <= 51 bits gives the same result as rounding the integer directly, so i64
 * reaches f32/f16/bf16/fp8 with a single rounding. */
CTI_HD static inline double i64_to_f64_odd(int64_t v)
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

/* The same narrowings and widenings by format name. */
CTI_HD static inline uint16_t cti_f32_to_f16_bits(float f) { return (uint16_t)narrow_f32(f, FMT_F16, false); }
CTI_HD static inline uint16_t cti_f32_to_bf16_bits(float f) { return bf16_narrow(f); }
CTI_HD static inline uint8_t cti_f32_to_e4m3_bits(float f, bool sat) { return (uint8_t)narrow_f32(f, FMT_E4M3, sat); }
CTI_HD static inline uint8_t cti_f32_to_e5m2_bits(float f, bool sat) { return (uint8_t)narrow_f32(f, FMT_E5M2, sat); }
CTI_HD static inline uint16_t cti_f64_to_f16_bits(double d) { return (uint16_t)narrow_f64(d, FMT_F16, false); }
CTI_HD static inline uint16_t cti_f64_to_bf16_bits(double d) { return (uint16_t)narrow_f64(d, FMT_BF16, false); }
CTI_HD static inline uint8_t cti_f64_to_e4m3_bits(double d, bool sat) { return (uint8_t)narrow_f64(d, FMT_E4M3, sat); }
CTI_HD static inline uint8_t cti_f64_to_e5m2_bits(double d, bool sat) { return (uint8_t)narrow_f64(d, FMT_E5M2, sat); }
CTI_HD static inline float cti_f16_bits_to_f32(uint16_t h) { return f32_from_bits(f16_widen_bits(h)); }
CTI_HD static inline float cti_bf16_bits_to_f32(uint16_t h) { return f32_from_bits(bf16_widen_bits(h)); }
CTI_HD static inline float cti_e4m3_bits_to_f32(uint8_t v) { return f32_from_bits(e4m3_widen_bits(v)); }
/* E5M2 is the top byte of an f16. */
CTI_HD static inline float cti_e5m2_bits_to_f32(uint8_t v) { return f32_from_bits(f16_widen_bits((uint32_t)v << 8)); }

#endif
