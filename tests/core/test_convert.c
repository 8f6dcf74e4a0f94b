/* Tests for core/convert.c against independent references:
 *   - decoding: the format formula (-1)^s * 2^(e-bias) * (1 + m/2^M) (subnormals
 *     2^(1-bias) * m/2^M) evaluated in double, for every bit pattern;
 *   - encoding: a brute-force table of every finite value of the target (built from
 *     the same formula), a binary search for the two neighbours of the input and an
 *     exact comparison with their midpoint (ties to the even encoding; the value one
 *     ulp above the largest finite one stands for overflow);
 *   - for f16, the x86 F16C instructions;
 *   - C casts and the stated integer rules for ct_convert_n.
 */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/convert.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* ---- failure reporting: only mismatches reach Criterion (millions of checks) ---- */

static long n_fail;
#define MISMATCH(...)                                                                    \
    do {                                                                                 \
        if (n_fail++ < 12) cr_expect_fail(__VA_ARGS__);                                  \
    } while (0)
#define EXPECT_NO_MISMATCH() cr_assert_eq(n_fail, 0, "%ld mismatches in total", n_fail)

/* ---- PRNG ------------------------------------------------------------------------ */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t splitmix64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static double f64_of(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
static uint64_t bits_of_f64(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* ---- the formats, from the spec -------------------------------------------------- */

typedef struct spec {
    const char *name;
    int nbits, ebits, mbits, bias;
    bool ieee; /* all-ones exponent = inf (m = 0) / NaN; else (E4M3) only S.1111.111 is NaN */
} spec;

static const spec F16 = {"f16", 16, 5, 10, 15, true};
static const spec BF16 = {"bf16", 16, 8, 7, 127, true};
static const spec E4M3 = {"e4m3", 8, 4, 3, 7, false};
static const spec E5M2 = {"e5m2", 8, 5, 2, 15, true};

static bool spec_is_nan(const spec *f, uint32_t bits)
{
    uint32_t e = (bits >> f->mbits) & ((1u << f->ebits) - 1u), m = bits & ((1u << f->mbits) - 1u);
    if (e != (1u << f->ebits) - 1u) return false;
    return f->ieee ? m != 0 : m == (1u << f->mbits) - 1u;
}

static double spec_decode(const spec *f, uint32_t bits)
{
    int s = (int)(bits >> (f->nbits - 1)) & 1;
    int e = (int)((bits >> f->mbits) & ((1u << f->ebits) - 1u));
    int m = (int)(bits & ((1u << f->mbits) - 1u));
    double v;
    if (spec_is_nan(f, bits)) return NAN;
    if (f->ieee && e == (1 << f->ebits) - 1) v = INFINITY;
    else if (e == 0) v = ldexp((double)m, 1 - f->bias - f->mbits);
    else v = ldexp(1.0 + ldexp((double)m, -f->mbits), e - f->bias);
    return s ? -v : v;
}

/* Every finite non-negative value in encoding order, plus the overflow stand-in. */
typedef struct table {
    const spec *f;
    int n;
    double vals[1 << 15];
    uint32_t encs[1 << 15];
    double next_val;   /* max + ulp(max): anything rounding here has overflowed */
    uint32_t max_enc;
    uint32_t inf_enc;  /* E4M3: its NaN, the non-saturating overflow result */
} table;

static table T_F16, T_BF16, T_E4M3, T_E5M2;

static void table_build(table *t, const spec *f)
{
    t->f = f;
    t->n = 0;
    for (uint32_t b = 0; b < (1u << (f->nbits - 1)); b++) {
        double v = spec_decode(f, b);
        if (isnan(v) || isinf(v)) continue;
        cr_assert(t->n == 0 || v > t->vals[t->n - 1], "%s table not increasing at 0x%x", f->name, b);
        t->vals[t->n] = v;
        t->encs[t->n] = b;
        t->n++;
    }
    t->max_enc = t->encs[t->n - 1];
    t->next_val = t->vals[t->n - 1] + (t->vals[t->n - 1] - t->vals[t->n - 2]);
    t->inf_enc = f->ieee ? ((1u << f->ebits) - 1u) << f->mbits : 0x7Fu;
}

static void tables_init(void)
{
    table_build(&T_F16, &F16);
    table_build(&T_BF16, &BF16);
    table_build(&T_E4M3, &E4M3);
    table_build(&T_E5M2, &E5M2);
}

/* Expected encoding of the non-NaN x (exact as a double). */
static uint32_t ref_round(const table *t, double x, bool sat)
{
    uint32_t sign = signbit(x) ? 1u << (t->f->nbits - 1) : 0u;
    uint32_t ovf = sat ? t->max_enc : t->inf_enc;
    double a = fabs(x);
    if (a >= t->next_val) return sign | ovf; /* inf included */
    int lo = 0, hi = t->n - 1;               /* largest i with vals[i] <= a */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (t->vals[mid] <= a) lo = mid;
        else hi = mid - 1;
    }
    if (t->vals[lo] == a) return sign | t->encs[lo];
    double up = lo + 1 < t->n ? t->vals[lo + 1] : t->next_val;
    double midpoint = (t->vals[lo] + up) * 0.5; /* exact: both have <= 12 significant bits */
    int pick;
    if (a < midpoint) pick = lo;
    else if (a > midpoint) pick = lo + 1;
    else pick = (t->encs[lo] & 1u) ? lo + 1 : lo; /* the neighbour of encs[lo] is encs[lo]+1 */
    return pick == t->n ? sign | ovf : sign | t->encs[pick];
}

/* ---- per-input checks ------------------------------------------------------------- */

static void expect_enc(const table *t, const char *fn, double x, bool xnan, uint32_t got, bool sat)
{
    if (xnan) {
        if (!spec_is_nan(t->f, got)) MISMATCH("%s(NaN %a): 0x%x is not a NaN", fn, x, got);
        return;
    }
    uint32_t want = ref_round(t, x, sat);
    if (got != want) MISMATCH("%s(%a, sat=%d): got 0x%x want 0x%x", fn, x, (int)sat, got, want);
}

static void check_f32(float x)
{
    double d = x;
    bool nan = isnan(x);
    expect_enc(&T_F16, "f32_to_f16", d, nan, ct_f32_to_f16(x), false);
    expect_enc(&T_BF16, "f32_to_bf16", d, nan, ct_f32_to_bf16(x), false);
    expect_enc(&T_E4M3, "f32_to_e4m3", d, nan, ct_f32_to_e4m3(x, false), false);
    expect_enc(&T_E4M3, "f32_to_e4m3", d, nan, ct_f32_to_e4m3(x, true), true);
    expect_enc(&T_E5M2, "f32_to_e5m2", d, nan, ct_f32_to_e5m2(x, false), false);
    expect_enc(&T_E5M2, "f32_to_e5m2", d, nan, ct_f32_to_e5m2(x, true), true);
#if defined(__F16C__)
    uint16_t hw = _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT), sw = ct_f32_to_f16(x);
    if (hw != sw) MISMATCH("f32_to_f16(%a) [0x%08x]: 0x%04x, F16C says 0x%04x", d, bits_of_f32(x), sw, hw);
#endif
}

static void check_f64(double x)
{
    bool nan = isnan(x);
    expect_enc(&T_F16, "f64_to_f16", x, nan, ct_f64_to_f16(x), false);
    expect_enc(&T_BF16, "f64_to_bf16", x, nan, ct_f64_to_bf16(x), false);
    expect_enc(&T_E4M3, "f64_to_e4m3", x, nan, ct_f64_to_e4m3(x, false), false);
    expect_enc(&T_E4M3, "f64_to_e4m3", x, nan, ct_f64_to_e4m3(x, true), true);
    expect_enc(&T_E5M2, "f64_to_e5m2", x, nan, ct_f64_to_e5m2(x, false), false);
    expect_enc(&T_E5M2, "f64_to_e5m2", x, nan, ct_f64_to_e5m2(x, true), true);
}

/* ---- decoding: every bit pattern ---------------------------------------------------- */

typedef float (*decode_fn)(uint32_t);
static float dec_f16(uint32_t b) { return ct_f16_to_f32((uint16_t)b); }
static float dec_bf16(uint32_t b) { return ct_bf16_to_f32((uint16_t)b); }
static float dec_e4m3(uint32_t b) { return ct_e4m3_to_f32((uint8_t)b); }
static float dec_e5m2(uint32_t b) { return ct_e5m2_to_f32((uint8_t)b); }

static uint32_t enc(const spec *f, float x, bool sat)
{
    if (f == &F16) return ct_f32_to_f16(x);
    if (f == &BF16) return ct_f32_to_bf16(x);
    if (f == &E4M3) return ct_f32_to_e4m3(x, sat);
    return ct_f32_to_e5m2(x, sat);
}

static ct_dtype dtype_of(const spec *f)
{
    if (f == &F16) return CT_DTYPE_F16;
    if (f == &BF16) return CT_DTYPE_BF16;
    if (f == &E4M3) return CT_DTYPE_F8_E4M3;
    return CT_DTYPE_F8_E5M2;
}

static void check_decode_all(const spec *f, decode_fn dec)
{
    uint32_t count = 1u << f->nbits;
    static float bulk[1 << 16];
    static uint8_t raw[1 << 17];
    for (uint32_t b = 0; b < count; b++) {
        if (f->nbits == 16) {
            uint16_t h = (uint16_t)b;
            memcpy(raw + 2 * b, &h, 2);
        } else {
            raw[b] = (uint8_t)b;
        }
    }
    cr_assert_eq(ct_convert_n(CT_DTYPE_F32, bulk, dtype_of(f), raw, count, false), CT_OK);
    for (uint32_t b = 0; b < count; b++) {
        float got = dec(b);
        double want = spec_decode(f, b);
        if (bits_of_f32(got) != bits_of_f32(bulk[b]))
            MISMATCH("%s 0x%x: scalar %a, bulk %a", f->name, b, (double)got, (double)bulk[b]);
        if (isnan(want)) {
            if (!isnan(got)) MISMATCH("%s 0x%x: got %a, want NaN", f->name, b, (double)got);
            for (int sat = 0; sat < 2; sat++)
                if (!spec_is_nan(f, enc(f, got, sat)))
                    MISMATCH("%s 0x%x: NaN encodes back to non-NaN 0x%x", f->name, b, enc(f, got, sat));
            continue;
        }
        if ((double)got != want || !signbit(got) != !signbit(want))
            MISMATCH("%s 0x%x: got %a, want %a", f->name, b, (double)got, want);
        for (int sat = 0; sat < 2; sat++)
            if (enc(f, got, sat) != b && !(sat && isinf(got) && f->nbits == 8)) /* inf saturates */
                MISMATCH("%s 0x%x: round trip gives 0x%x (sat=%d)", f->name, b, enc(f, got, sat), sat);
    }
}

Test(convert, decode_f16_every_pattern)
{
    check_decode_all(&F16, dec_f16);
#if defined(__F16C__)
    for (uint32_t b = 0; b < 65536; b++) {
        float hw = _cvtsh_ss((unsigned short)b), sw = ct_f16_to_f32((uint16_t)b);
        if (bits_of_f32(hw) != bits_of_f32(sw))
            MISMATCH("f16 0x%04x: 0x%08x, F16C says 0x%08x", b, bits_of_f32(sw), bits_of_f32(hw));
    }
#endif
    EXPECT_NO_MISMATCH();
}

Test(convert, decode_bf16_every_pattern)
{
    check_decode_all(&BF16, dec_bf16);
    EXPECT_NO_MISMATCH();
}

Test(convert, decode_e4m3_every_pattern)
{
    check_decode_all(&E4M3, dec_e4m3);
    EXPECT_NO_MISMATCH();
}

Test(convert, decode_e5m2_every_pattern)
{
    check_decode_all(&E5M2, dec_e5m2);
    EXPECT_NO_MISMATCH();
}

/* The spec values themselves, written out by hand, so the reference is pinned too. */
Test(convert, spec_landmarks)
{
    tables_init();
    cr_expect_eq(spec_decode(&E4M3, 0x7E), 448.0);
    cr_expect_eq(spec_decode(&E4M3, 0x01), 0x1p-9);
    cr_expect(isnan(spec_decode(&E4M3, 0x7F)) && isnan(spec_decode(&E4M3, 0xFF)));
    cr_expect_eq(spec_decode(&E4M3, 0x78), 256.0); /* S.1111.000 is a number */
    cr_expect_eq(spec_decode(&E5M2, 0x7B), 57344.0);
    cr_expect_eq(spec_decode(&E5M2, 0x01), 0x1p-16);
    cr_expect_eq(spec_decode(&E5M2, 0xFC), -INFINITY);
    cr_expect_eq(spec_decode(&F16, 0x7BFF), 65504.0);
    cr_expect_eq(spec_decode(&F16, 0x0001), 0x1p-24);
    cr_expect_eq(spec_decode(&BF16, 0x0001), 0x1p-133);
    cr_expect_eq(T_E4M3.n, 127);
    cr_expect_eq(T_E5M2.n, 124);
    cr_expect_eq(T_E4M3.next_val, 480.0);
    cr_expect_eq(T_E5M2.next_val, 65536.0);

    /* E4M3: 464 is the midpoint 448|480 and 448 (0x7E) is even; above it overflows. */
    cr_expect_eq(ct_f32_to_e4m3(464.0f, false), 0x7E);
    cr_expect_eq(ct_f32_to_e4m3(464.5f, false), 0x7F);
    cr_expect_eq(ct_f32_to_e4m3(464.5f, true), 0x7E);
    cr_expect_eq(ct_f32_to_e4m3(-1e9f, false), 0xFF);
    cr_expect_eq(ct_f32_to_e4m3(-1e9f, true), 0xFE);
    cr_expect_eq(ct_f32_to_e4m3(INFINITY, false), 0x7F);
    cr_expect_eq(ct_f32_to_e4m3(-INFINITY, true), 0xFE);
    cr_expect_eq(ct_f32_to_e4m3(0x1p-10f, false), 0x00);        /* half the min subnormal */
    cr_expect_eq(ct_f32_to_e4m3(-0x1.000002p-10f, false), 0x81);
    cr_expect_eq(ct_f32_to_e4m3(0x3p-10f, false), 0x02);        /* 1.5 subnormal ulps -> even */
    cr_expect_eq(ct_f32_to_e4m3(0xFp-10f, false), 0x08);        /* 7.5 ulps -> min normal */
    /* E5M2: 61440 is the midpoint 57344|65536, 65536 (0x7C) even: overflow. */
    cr_expect_eq(ct_f32_to_e5m2(61440.0f, false), 0x7C);
    cr_expect_eq(ct_f32_to_e5m2(61440.0f, true), 0x7B);
    cr_expect_eq(ct_f32_to_e5m2(61439.996f, false), 0x7B);
    cr_expect_eq(ct_f32_to_e5m2(-INFINITY, false), 0xFC);
    cr_expect_eq(ct_f32_to_e5m2(0x1p-17f, false), 0x00);
    cr_expect_eq(ct_f32_to_e5m2(NAN, true) & 0x7F, 0x7E);
    /* f16 */
    cr_expect_eq(ct_f32_to_f16(65520.0f), 0x7C00);
    cr_expect_eq(ct_f32_to_f16(65519.996f), 0x7BFF);
    cr_expect_eq(ct_f32_to_f16(0x1p-25f), 0x0000);
    cr_expect_eq(ct_f32_to_f16(0x1.000002p-25f), 0x0001);
    cr_expect_eq(ct_f32_to_f16(-0.0f), 0x8000);
    cr_expect_eq(ct_f32_to_f16(f32_of(0x7F800001u)), 0x7E00); /* sNaN quieted, never inf */
    /* bf16 */
    cr_expect_eq(ct_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);
    cr_expect_eq(ct_f32_to_bf16(1.0f + 0x3p-8f), 0x3F82);
    cr_expect_eq(ct_f32_to_bf16(FLT_MAX), 0x7F80);
    cr_expect_eq(ct_f32_to_bf16(f32_of(0x7F800001u)), 0x7FC0);
    cr_expect_eq(ct_f32_to_bf16(f32_of(0xFF800001u)), 0xFFC0);
    /* f64: the double midpoint plus 2^-60 must not collapse to a tie through f32. */
    cr_expect_eq(ct_f64_to_bf16(1.0 + 0x1p-8 + 0x1p-52), 0x3F81);
    cr_expect_eq(ct_f64_to_f16(1.0 + 0x1p-11 + 0x1p-52), 0x3C01);
    cr_expect_eq(ct_f64_to_e4m3(1.0 + 0x1p-4 + 0x1p-52, false), 0x39);
    cr_expect_eq(ct_f64_to_e5m2(1.0 + 0x1p-3 + 0x1p-52, false), 0x3D);
    cr_expect_eq(ct_f64_to_e5m2(1e300, true), 0x7B);
    cr_expect_eq(ct_f64_to_bf16(1e300), 0x7F80);
    cr_expect_eq(ct_f64_to_bf16(-1e-300), 0x8000);
}

/* Every midpoint between neighbours (subnormal/normal boundary, max/overflow and
 * 0/min-subnormal included), on both sides, in f32 and f64, both signs. */
static void check_ties(const table *t)
{
    for (int i = 0; i < t->n; i++) {
        double lo = t->vals[i], hi = i + 1 < t->n ? t->vals[i + 1] : t->next_val;
        double mid = (lo + hi) * 0.5;
        for (int s = 0; s < 2; s++) {
            double m = s ? -mid : mid;
            float mf = (float)m;
            cr_assert_eq((double)mf, m, "midpoint %a not exact in f32", m);
            check_f32(mf);
            check_f32(nextafterf(mf, INFINITY));
            check_f32(nextafterf(mf, -INFINITY));
            check_f32((float)(s ? -lo : lo));
            check_f64(m);
            check_f64(nextafter(m, INFINITY));
            check_f64(nextafter(m, -INFINITY));
            check_f64(s ? -lo : lo);
        }
    }
}

Test(convert, ties_and_boundaries)
{
    tables_init();
    check_ties(&T_F16);
    check_ties(&T_BF16);
    check_ties(&T_E4M3);
    check_ties(&T_E5M2);
    EXPECT_NO_MISMATCH();
}

Test(convert, special_values)
{
    tables_init();
    const uint32_t f32s[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                             0xFFC00000u, 0x7F800001u, 0xFFBFFFFFu, 0x7FFFFFFFu, 0x7F7FFFFFu,
                             0xFF7FFFFFu, 0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00800000u};
    for (size_t i = 0; i < sizeof f32s / sizeof *f32s; i++) check_f32(f32_of(f32s[i]));
    const uint64_t f64s[] = {0x0000000000000000ull, 0x8000000000000000ull, 0x7FF0000000000000ull,
                             0xFFF0000000000000ull, 0x7FF8000000000000ull, 0x7FF0000000000001ull,
                             0xFFFFFFFFFFFFFFFFull, 0x7FEFFFFFFFFFFFFFull, 0x0000000000000001ull,
                             0x8010000000000000ull, 0x47EFFFFFE0000000ull, 0x47EFFFFFF0000000ull};
    for (size_t i = 0; i < sizeof f64s / sizeof *f64s; i++) check_f64(f64_of(f64s[i]));
    /* signed zeros keep their sign; NaNs keep theirs too */
    cr_expect_eq(ct_f32_to_e4m3(-0.0f, true), 0x80);
    cr_expect_eq(ct_f32_to_e5m2(-0.0f, false), 0x80);
    cr_expect_eq(ct_f64_to_f16(-0.0), 0x8000);
    cr_expect_eq(ct_f32_to_e4m3(-NAN, true), 0xFF);
    cr_expect(signbit(ct_e4m3_to_f32(0x80)) && ct_e4m3_to_f32(0x80) == 0.0f);
    EXPECT_NO_MISMATCH();
}

/* ---- random inputs ------------------------------------------------------------------ */

/* A random f32 near a format's range: exponent from two below its smallest
 * subnormal to two above its largest; mantissa random, or with only the bits just
 * below the target's precision set, which lands on and next to midpoints. */
static float random_in_range(const spec *f)
{
    uint64_t r = splitmix64();
    int lo = 1 - f->bias - f->mbits - 2, hi = (1 << f->ebits) - 1 - f->bias + 2;
    if (lo < -149) lo = -149;
    if (hi > 127) hi = 127;
    int e = lo + (int)(r % (uint64_t)(hi - lo + 1));
    uint32_t mant = (uint32_t)(r >> 32) & 0x7FFFFFu;
    switch ((r >> 60) & 3) {
    case 0: mant &= ~((1u << (23 - f->mbits - 2)) - 1u); break; /* exact, midpoints */
    case 1: mant |= 1u; break;
    default: break;
    }
    double v = ldexp(1.0 + ldexp((double)mant, -23), e);
    float x = (float)v; /* e below -126 rounds into f32 subnormals: still a valid input */
    return (r >> 59) & 1 ? -x : x;
}

Test(convert, random_f32_bit_patterns)
{
    tables_init();
    for (int i = 0; i < 1000000; i++) check_f32(f32_of((uint32_t)splitmix64()));
    EXPECT_NO_MISMATCH();
}

Test(convert, random_f32_in_format_ranges)
{
    tables_init();
    const spec *fs[4] = {&F16, &BF16, &E4M3, &E5M2};
    for (int i = 0; i < 3000000; i++) check_f32(random_in_range(fs[i & 3]));
    EXPECT_NO_MISMATCH();
}

/* f64 inputs: random 52-bit mantissas near each range, and midpoints nudged by
 * a few f64 ulps, where rounding through f32 first would produce a false tie. */
Test(convert, random_f64_single_rounding)
{
    tables_init();
    const table *ts[4] = {&T_F16, &T_BF16, &T_E4M3, &T_E5M2};
    for (int i = 0; i < 400000; i++) {
        const table *t = ts[i & 3];
        uint64_t r = splitmix64();
        float base = random_in_range(t->f);
        uint64_t b = bits_of_f64((double)base) ^ (r & 0xFFFFFFFull);
        check_f64(f64_of(b));
        int k = (int)(r >> 40) % (t->n - 1);
        double mid = (t->vals[k] + t->vals[k + 1]) * 0.5;
        int64_t nudge = (int64_t)((r >> 20) & 7) - 4; /* a few ulps either way */
        double x = f64_of(bits_of_f64(mid) + (uint64_t)nudge);
        check_f64((r >> 63) ? -x : x);
    }
    for (int i = 0; i < 200000; i++) check_f64(f64_of(splitmix64()));
    EXPECT_NO_MISMATCH();
}

/* ---- bulk conversion against the same references ------------------------------------ */

#define BULK_N 100003 /* not a multiple of any vector width */

Test(convert, bulk_from_f32_and_f64)
{
    tables_init();
    static float xf[BULK_N];
    static double xd[BULK_N];
    static uint16_t h[BULK_N];
    static uint8_t q[BULK_N];
    const spec *fs[4] = {&F16, &BF16, &E4M3, &E5M2};
    const table *ts[4] = {&T_F16, &T_BF16, &T_E4M3, &T_E5M2};
    for (int i = 0; i < BULK_N; i++) {
        uint64_t r = splitmix64();
        xf[i] = (r & 7) == 0 ? f32_of((uint32_t)(r >> 32)) : random_in_range(fs[r % 4]);
        xd[i] = f64_of(bits_of_f64(xf[i]) ^ ((r >> 8) & 0xFFFFFFu));
    }
    for (int k = 0; k < 4; k++) {
        const table *t = ts[k];
        ct_dtype dt = dtype_of(t->f);
        for (int sat = 0; sat < 2; sat++) {
            void *out = t->f->nbits == 16 ? (void *)h : (void *)q;
            cr_assert_eq(ct_convert_n(dt, out, CT_DTYPE_F32, xf, BULK_N, sat), CT_OK);
            for (int i = 0; i < BULK_N; i++)
                expect_enc(t, "bulk f32", xf[i], isnan(xf[i]), t->f->nbits == 16 ? h[i] : q[i],
                           sat && t->f->nbits == 8);
            cr_assert_eq(ct_convert_n(dt, out, CT_DTYPE_F64, xd, BULK_N, sat), CT_OK);
            for (int i = 0; i < BULK_N; i++)
                expect_enc(t, "bulk f64", xd[i], isnan(xd[i]), t->f->nbits == 16 ? h[i] : q[i],
                           sat && t->f->nbits == 8);
        }
    }
    EXPECT_NO_MISMATCH();
}

/* ---- ct_convert_n: all 10 x 10 dtype pairs ------------------------------------------- */

static const ct_dtype ALL[CT_DTYPE_COUNT] = {CT_DTYPE_F32,     CT_DTYPE_F64,     CT_DTYPE_F16, CT_DTYPE_BF16,
                                             CT_DTYPE_F8_E4M3, CT_DTYPE_F8_E5M2, CT_DTYPE_I32, CT_DTYPE_I64,
                                             CT_DTYPE_U8,      CT_DTYPE_BOOL};

static bool is_int_dt(ct_dtype dt)
{
    return dt == CT_DTYPE_I32 || dt == CT_DTYPE_I64 || dt == CT_DTYPE_U8 || dt == CT_DTYPE_BOOL;
}

static const table *table_of(ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F16: return &T_F16;
    case CT_DTYPE_BF16: return &T_BF16;
    case CT_DTYPE_F8_E4M3: return &T_E4M3;
    case CT_DTYPE_F8_E5M2: return &T_E5M2;
    default: return NULL;
    }
}

/* The true value of one source element: a double (float sources and every integer
 * used here are exact in a double) plus, for integer sources, the integer. */
typedef struct value {
    double d;
    int64_t i;
    bool is_int;
} value;

/* Writes the element of dt closest to v (test-side encoding, for building inputs)
 * and returns the value the element really holds. */
static value make_float_elem(ct_dtype dt, double v, unsigned char *out)
{
    value r = {0, 0, false};
    const table *t = table_of(dt);
    if (dt == CT_DTYPE_F32) {
        float f = (float)v;
        memcpy(out, &f, 4);
        r.d = f;
    } else if (dt == CT_DTYPE_F64) {
        memcpy(out, &v, 8);
        r.d = v;
    } else {
        uint32_t b = isnan(v) ? (t->f->ieee ? t->inf_enc | 1u : 0x7Fu) : ref_round(t, v, true);
        if (t->f->nbits == 16) {
            uint16_t h = (uint16_t)b;
            memcpy(out, &h, 2);
        } else {
            out[0] = (uint8_t)b;
        }
        r.d = spec_decode(t->f, b);
    }
    return r;
}

static value make_int_elem(ct_dtype dt, int64_t v, unsigned char *out)
{
    value r = {0, 0, true};
    switch (dt) {
    case CT_DTYPE_I32: {
        int32_t x = (int32_t)(uint32_t)(uint64_t)v;
        memcpy(out, &x, 4);
        r.i = x;
        break;
    }
    case CT_DTYPE_I64: memcpy(out, &v, 8); r.i = v; break;
    case CT_DTYPE_U8: out[0] = (uint8_t)(uint64_t)v; r.i = out[0]; break;
    default: /* bool: any nonzero byte is true; keep a 2 to check that */
        out[0] = v == 0 ? 0 : v == 2 ? 2 : 1;
        r.i = out[0] != 0;
        break;
    }
    r.d = (double)r.i;
    return r;
}

/* The expected destination bytes (nan_ok: the element must be a NaN of dst). */
static void expected_elem(ct_dtype dst, value v, bool sat, unsigned char *out, bool *nan_ok)
{
    *nan_ok = false;
    const table *t = table_of(dst);
    if (t) {
        if (isnan(v.d)) {
            *nan_ok = true;
            return;
        }
        uint32_t b = ref_round(t, v.d, sat);
        if (t->f->nbits == 16) {
            uint16_t h = (uint16_t)b;
            memcpy(out, &h, 2);
        } else {
            out[0] = (uint8_t)b;
        }
        return;
    }
    switch (dst) {
    case CT_DTYPE_F32: {
        float f = v.is_int ? (float)v.i : (float)v.d;
        if (isnan(f)) *nan_ok = true;
        memcpy(out, &f, 4);
        return;
    }
    case CT_DTYPE_F64: {
        double d = v.is_int ? (double)v.i : v.d;
        if (isnan(d)) *nan_ok = true;
        memcpy(out, &d, 8);
        return;
    }
    case CT_DTYPE_BOOL: out[0] = v.is_int ? v.i != 0 : (v.d != 0 || isnan(v.d)); return;
    default: break;
    }
    int64_t lo = dst == CT_DTYPE_I32 ? INT32_MIN : dst == CT_DTYPE_U8 ? 0 : INT64_MIN;
    int64_t hi = dst == CT_DTYPE_I32 ? INT32_MAX : dst == CT_DTYPE_U8 ? 255 : INT64_MAX;
    int64_t r;
    if (v.is_int) {
        r = v.i; /* wrapped below by the cast */
    } else if (isnan(v.d)) {
        r = 0;
    } else {
        double tr = trunc(v.d);
        if (tr <= (double)lo) r = lo; /* (double)INT64_MIN is exact */
        else if (tr >= 0x1p63 || (dst != CT_DTYPE_I64 && tr >= (double)hi)) r = hi;
        else r = (int64_t)tr;
    }
    switch (dst) {
    case CT_DTYPE_I32: {
        int32_t x = (int32_t)(uint32_t)(uint64_t)r;
        memcpy(out, &x, 4);
        return;
    }
    case CT_DTYPE_I64: memcpy(out, &r, 8); return;
    default: out[0] = (uint8_t)(uint64_t)r; return;
    }
}

static bool elem_is_nan(ct_dtype dt, const unsigned char *p)
{
    const table *t = table_of(dt);
    if (t) {
        uint32_t b = t->f->nbits == 16 ? (uint32_t)(p[0] | p[1] << 8) : p[0];
        return spec_is_nan(t->f, b);
    }
    if (dt == CT_DTYPE_F32) {
        float f;
        memcpy(&f, p, 4);
        return isnan(f);
    }
    if (dt == CT_DTYPE_F64) {
        double d;
        memcpy(&d, p, 8);
        return isnan(d);
    }
    return false;
}

Test(convert, convert_n_all_dtype_pairs)
{
    tables_init();
    static const double fvals[] = {0.0,   -0.0,      1.0,       -1.0,   0.5,     2.5,     -2.5,   3.75,
                                   -7.9,  100.0,     127.0,     200.0,  255.0,   255.9,   256.0,  300.0,
                                   -0.9,  -129.0,    448.0,     464.0,  500.0,   60000.0, 65504.0, 70000.0,
                                   3e9,   -3e9,      2147483647.5, -2147483648.9, 2147483648.0, -2147483649.0,
                                   9.3e18, -9.3e18,  1e20,      -1e20,  1e300,   1e-6,    -1e-30, 0x1p-9,
                                   0x3p-17, NAN,     -NAN,      INFINITY, -INFINITY};
    static const int64_t ivals[] = {0,     1,      -1,     2,          7,           127,
                                    128,   255,    256,    -128,       -129,        300,
                                    -300,  448,    464,    65504,      65520,       70000,
                                    INT32_MAX, INT32_MIN, (int64_t)INT32_MAX + 1, 10000000000,
                                    -(1ll << 40), (1ll << 53), -(1ll << 53) + 1, 16777217};
    enum { NF = sizeof fvals / sizeof *fvals, NI = sizeof ivals / sizeof *ivals, NMAX = 64 };
    int pairs = 0;
    for (int si = 0; si < CT_DTYPE_COUNT; si++) {
        ct_dtype st = ALL[si];
        size_t ss = ct_dtype_size(st);
        unsigned char src[NMAX * 8];
        value vals[NMAX];
        int n = is_int_dt(st) ? NI : NF;
        for (int k = 0; k < n; k++)
            vals[k] = is_int_dt(st) ? make_int_elem(st, ivals[k], src + k * ss)
                                    : make_float_elem(st, fvals[k], src + k * ss);
        for (int di = 0; di < CT_DTYPE_COUNT; di++) {
            ct_dtype dt = ALL[di];
            size_t ds = ct_dtype_size(dt);
            for (int sat = 0; sat < 2; sat++) {
                unsigned char dst[NMAX * 8], want[8];
                memset(dst, 0xA5, sizeof dst);
                cr_assert_eq(ct_convert_n(dt, dst, st, src, n, sat), CT_OK, "%s -> %s: %s",
                             ct_dtype_name(st), ct_dtype_name(dt), ct_last_error());
                for (int k = 0; k < n; k++) {
                    bool nan_ok;
                    if (dt == st) { /* same dtype: memcpy */
                        memcpy(want, src + k * ss, ss);
                        nan_ok = false;
                    } else {
                        expected_elem(dt, vals[k], sat && (dt == CT_DTYPE_F8_E4M3 || dt == CT_DTYPE_F8_E5M2),
                                      want, &nan_ok);
                    }
                    const unsigned char *got = dst + k * ds;
                    bool ok = nan_ok ? elem_is_nan(dt, got) : memcmp(got, want, ds) == 0;
                    if (!ok) {
                        uint64_t g = 0, w = 0;
                        memcpy(&g, got, ds);
                        memcpy(&w, want, ds);
                        MISMATCH("%s -> %s (sat=%d) elem %d (value %a / %lld): got 0x%llx want 0x%llx%s",
                                 ct_dtype_name(st), ct_dtype_name(dt), sat, k, vals[k].d,
                                 (long long)vals[k].i, (unsigned long long)g, (unsigned long long)w,
                                 nan_ok ? " (a NaN)" : "");
                    }
                }
                /* nothing written past n */
                for (size_t b = (size_t)n * ds; b < sizeof dst; b++)
                    if (dst[b] != 0xA5) {
                        MISMATCH("%s -> %s wrote past the end", ct_dtype_name(st), ct_dtype_name(dt));
                        break;
                    }
            }
            pairs++;
        }
    }
    cr_expect_eq(pairs, 100);
    EXPECT_NO_MISMATCH();
}

/* Spot values for the rules, spelled out by hand. */
Test(convert, convert_n_rules_by_hand)
{
    float f[] = {NAN, -NAN, INFINITY, -INFINITY, 3e9f, -3e9f, -0.99f, 2.99f, 1e30f};
    int32_t i32[9];
    int64_t i64[9];
    uint8_t u8[9], b[9];
    cr_assert_eq(ct_convert_n(CT_DTYPE_I32, i32, CT_DTYPE_F32, f, 9, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_I64, i64, CT_DTYPE_F32, f, 9, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_U8, u8, CT_DTYPE_F32, f, 9, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_BOOL, b, CT_DTYPE_F32, f, 9, false), CT_OK);
    int32_t w32[] = {0, 0, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, 0, 2, INT32_MAX};
    int64_t w64[] = {0, 0, INT64_MAX, INT64_MIN, 3000000000, -3000000000, 0, 2, INT64_MAX};
    uint8_t wu8[] = {0, 0, 255, 0, 255, 0, 0, 2, 255};
    for (int k = 0; k < 9; k++) {
        cr_expect_eq(i32[k], w32[k], "i32[%d]", k);
        cr_expect_eq(i64[k], w64[k], "i64[%d]", k);
        cr_expect_eq(u8[k], wu8[k], "u8[%d]", k);
        cr_expect_eq(b[k], 1, "bool[%d]", k);
    }
    int64_t big[] = {(1ll << 32) + 5, -1, 0x1FF, -129};
    int32_t o32[4];
    uint8_t o8[4];
    cr_assert_eq(ct_convert_n(CT_DTYPE_I32, o32, CT_DTYPE_I64, big, 4, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_U8, o8, CT_DTYPE_I64, big, 4, false), CT_OK);
    cr_expect(o32[0] == 5 && o32[1] == -1 && o32[2] == 0x1FF && o32[3] == -129);
    cr_expect(o8[0] == 5 && o8[1] == 255 && o8[2] == 0xFF && o8[3] == 127);
    /* saturate only matters for fp8: f16 still overflows to inf */
    float over = 1e6f;
    uint16_t h;
    cr_assert_eq(ct_convert_n(CT_DTYPE_F16, &h, CT_DTYPE_F32, &over, 1, true), CT_OK);
    cr_expect_eq(h, 0x7C00);
}

/* i64 sources wider than 53 bits reach narrow floats with one rounding. */
Test(convert, i64_single_rounding)
{
    int64_t v[] = {(1ll << 60) + (1ll << 52) + 1, -((1ll << 60) + (1ll << 52) + 1), (1ll << 62) + (1ll << 38) + 1,
                   (1ll << 53) + 1, (1ll << 53) + 3, INT64_MAX, INT64_MIN};
    uint16_t bf[7], hf[7];
    float f[7];
    double d[7];
    uint8_t e5[7], e4s[7];
    cr_assert_eq(ct_convert_n(CT_DTYPE_BF16, bf, CT_DTYPE_I64, v, 7, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_F16, hf, CT_DTYPE_I64, v, 7, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_F32, f, CT_DTYPE_I64, v, 7, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_F64, d, CT_DTYPE_I64, v, 7, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_F8_E5M2, e5, CT_DTYPE_I64, v, 7, false), CT_OK);
    cr_assert_eq(ct_convert_n(CT_DTYPE_F8_E4M3, e4s, CT_DTYPE_I64, v, 7, true), CT_OK);
    /* 2^60 + 2^52 + 1 is above the bf16 midpoint 2^60 + 2^52 (via f64 it would tie to 2^60) */
    cr_expect_eq(bf[0], 0x5D81);
    cr_expect_eq(bf[1], 0xDD81);
    /* 2^62 + 2^38 + 1 is above the f32 midpoint 2^62 + 2^38 */
    cr_expect_eq(f[2], 0x1p62f + 0x1p39f);
    cr_expect_eq(d[3], 0x1p53);     /* tie -> even */
    cr_expect_eq(d[4], 0x1p53 + 4); /* tie -> even */
    cr_expect_eq(d[5], 0x1p63);
    cr_expect_eq(d[6], -0x1p63);
    cr_expect_eq(bf[5], 0x5F00);
    cr_expect_eq(bf[6], 0xDF00);
    cr_expect_eq(hf[5], 0x7C00);
    cr_expect_eq(hf[6], 0xFC00);
    cr_expect_eq(e5[5], 0x7C);
    cr_expect_eq(e5[6], 0xFC);
    cr_expect_eq(e4s[5], 0x7E);
    cr_expect_eq(e4s[6], 0xFE);
}

Test(convert, convert_n_rejects_bad_arguments)
{
    float src[4] = {1, 2, 3, 4}, dst[4];
    ct_error_clear();
    cr_expect_eq(ct_convert_n((ct_dtype)42, dst, CT_DTYPE_F32, src, 4, false), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "42") && strstr(ct_last_error(), "f32"), "message: %s", ct_last_error());
    cr_expect_eq(ct_last_status(), CT_ERR_INVALID);
    cr_expect_eq(ct_convert_n(CT_DTYPE_F16, dst, (ct_dtype)-1, src, 4, false), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "f16") != NULL, "message: %s", ct_last_error());
    cr_expect_eq(ct_convert_n(CT_DTYPE_BF16, dst, CT_DTYPE_F32, src, -1, false), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "bf16") && strstr(ct_last_error(), "f32"), "message: %s", ct_last_error());
    cr_expect_eq(ct_convert_n(CT_DTYPE_BF16, NULL, CT_DTYPE_F32, src, 4, false), CT_ERR_INVALID);
    cr_expect_eq(ct_convert_n(CT_DTYPE_BF16, (char *)src + 2, CT_DTYPE_F32, src, 4, false), CT_ERR_INVALID);
    cr_expect_eq(ct_convert_n(CT_DTYPE_BF16, NULL, CT_DTYPE_F32, NULL, 0, false), CT_OK);
    cr_expect_eq(ct_convert_n(CT_DTYPE_F32, dst, CT_DTYPE_F32, src, 4, false), CT_OK);
    cr_expect_eq(memcmp(dst, src, sizeof src), 0);
}

Test(convert, scalar_load_store)
{
    unsigned char buf[8];
    const double vals[] = {0.0, 1.0, -2.5, 300.7, 1e6, -1e6, NAN};
    for (int di = 0; di < CT_DTYPE_COUNT; di++) {
        ct_dtype dt = ALL[di];
        for (size_t k = 0; k < sizeof vals / sizeof *vals; k++) {
            unsigned char want[8];
            memset(buf, 0, sizeof buf);
            ct_scalar_store(dt, buf, vals[k]);
            cr_assert_eq(ct_convert_n(dt, want, CT_DTYPE_F64, &vals[k], 1, false), CT_OK);
            cr_expect_eq(memcmp(buf, want, ct_dtype_size(dt)), 0, "store %s %g", ct_dtype_name(dt), vals[k]);
            double back = ct_scalar_load(dt, buf), via;
            cr_assert_eq(ct_convert_n(CT_DTYPE_F64, &via, dt, buf, 1, false), CT_OK);
            cr_expect(back == via || (isnan(back) && isnan(via)), "load %s %g: %g vs %g", ct_dtype_name(dt),
                      vals[k], back, via);
        }
    }
    ct_scalar_store(CT_DTYPE_F8_E4M3, buf, 1000.0); /* non-saturating */
    cr_expect_eq(buf[0], 0x7F);
    ct_scalar_store(CT_DTYPE_BF16, buf, 1.0 + 0x1p-8 + 0x1p-40);
    cr_expect_eq(buf[0] | buf[1] << 8, 0x3F81);
    cr_expect_eq(ct_scalar_load(CT_DTYPE_F8_E5M2, &(uint8_t){0x7B}), 57344.0);
    int64_t big = INT64_MAX;
    cr_expect_eq(ct_scalar_load(CT_DTYPE_I64, &big), 0x1p63);
    ct_error_clear();
    cr_expect(isnan(ct_scalar_load((ct_dtype)77, buf)));
    cr_expect_eq(ct_last_status(), CT_ERR_INVALID);
}
