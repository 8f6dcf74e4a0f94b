/* Tests for core/philox.c: Random123 known answers, the documented stream layout,
 * determinism (seeds, split fills, thread counts), distribution statistics, the
 * unbiased bounded integer, and the process-wide default generator.
 *
 * Statistical bounds are 5 standard errors of the estimator at the given sample size
 * (a false failure about once in 3.5 million runs for a fixed seed family; the seeds are
 * fixed, so a run either always passes or always fails). */
#include "core/error.h"
#include "core/philox.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
static void omp_set_num_threads(int n) { (void)n; }
#endif

/* ---- known answers ------------------------------------------------------------------ */

/* Random123-1.09 examples/kat_vectors, lines "philox4x32 10 ctr[4] key[2] out[4]". */
static const struct {
    uint32_t ctr[4], key[2], out[4];
} kat[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

Test(philox, known_answer_vectors)
{
    for (size_t v = 0; v < sizeof kat / sizeof kat[0]; v++) {
        uint32_t out[4];
        ct_philox4x32_10(kat[v].ctr, kat[v].key, out);
        for (int k = 0; k < 4; k++)
            cr_assert_eq(out[k], kat[v].out[k], "vector %zu word %d: got %08x want %08x", v, k,
                         out[k], kat[v].out[k]);
    }
}

Test(philox, output_may_alias_counter)
{
    uint32_t c[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    ct_philox4x32_10(c, kat[2].key, c);
    cr_assert_eq(memcmp(c, kat[2].out, sizeof c), 0);
}

/* ---- stream layout ------------------------------------------------------------------- */

/* Word w of the stream, straight from the header's definition. */
static uint32_t ref_word(uint64_t seed, uint64_t w)
{
    uint64_t b = w / 4;
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
    uint32_t out[4];
    ct_philox4x32_10(ctr, key, out);
    return out[w % 4];
}

Test(philox, u32_follows_documented_counter_layout)
{
    const uint64_t seed = 0x0123456789abcdefull;
    /* start at block 2^32 + 5, so the high counter word is exercised */
    const uint64_t start = ((1ull << 32) + 5) * 4;
    ct_rng r = {seed, start};
    uint32_t out[11];
    ct_rng_u32(&r, out, 11);
    for (uint64_t i = 0; i < 11; i++)
        cr_assert_eq(out[i], ref_word(seed, start + i), "word %llu", (unsigned long long)i);
    cr_assert_eq(r.offset, start + 12);
}

Test(philox, uniform_maps_words_as_documented)
{
    const uint64_t seed = 99;
    ct_rng r;
    ct_rng_init(&r, seed);
    float f[7];
    ct_rng_uniform_f32(&r, f, 7, 0.0f, 1.0f);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(f[i], (float)(ref_word(seed, (uint64_t)i) >> 8) / 16777216.0f, "f32 %d", i);
    cr_assert_eq(r.offset, 8);

    double d[3];
    ct_rng_uniform_f64(&r, d, 3, 0.0, 1.0);
    for (int i = 0; i < 3; i++) {
        uint64_t lo = ref_word(seed, 8 + 2 * (uint64_t)i), hi = ref_word(seed, 9 + 2 * (uint64_t)i);
        double want = (double)(((hi << 32) | lo) >> 11) / 9007199254740992.0;
        cr_assert_eq(d[i], want, "f64 %d", i);
    }
    cr_assert_eq(r.offset, 8 + 8); /* 6 words used, rounded up to 8 */
}

Test(philox, normal_is_box_muller_on_documented_words)
{
    const uint64_t seed = 1234;
    const double two_pi = 6.283185307179586;
    ct_rng r;
    ct_rng_init(&r, seed);
    float f[7];
    ct_rng_normal_f32(&r, f, 7, 0.0f, 1.0f);
    for (int p = 0; 2 * p < 7; p++) {
        double u1 = ((ref_word(seed, 2 * (uint64_t)p) >> 8) + 1) / 16777216.0;
        double u2 = (ref_word(seed, 2 * (uint64_t)p + 1) >> 8) / 16777216.0;
        double rad = sqrt(-2.0 * log(u1));
        cr_assert_float_eq(f[2 * p], rad * cos(two_pi * u2), 2e-5, "f32 pair %d cos", p);
        if (2 * p + 1 < 7)
            cr_assert_float_eq(f[2 * p + 1], rad * sin(two_pi * u2), 2e-5, "f32 pair %d sin", p);
    }
    cr_assert_eq(r.offset, 8);

    double d[3];
    ct_rng_normal_f64(&r, d, 3, 0.0, 1.0);
    for (int p = 0; 2 * p < 3; p++) {
        uint64_t w = 8 + 4 * (uint64_t)p;
        uint64_t a = ((uint64_t)ref_word(seed, w + 1) << 32 | ref_word(seed, w)) >> 11;
        uint64_t b = ((uint64_t)ref_word(seed, w + 3) << 32 | ref_word(seed, w + 2)) >> 11;
        double u1 = (double)(a + 1) / 9007199254740992.0, u2 = (double)b / 9007199254740992.0;
        double rad = sqrt(-2.0 * log(u1));
        cr_assert_float_eq(d[2 * p], rad * cos(two_pi * u2), 1e-12, "f64 pair %d cos", p);
        if (2 * p + 1 < 3)
            cr_assert_float_eq(d[2 * p + 1], rad * sin(two_pi * u2), 1e-12, "f64 pair %d sin", p);
    }
    cr_assert_eq(r.offset, 16);
}

/* Seed 0, block 14883995 (found by search) starts with word 0x00000093: its top 24 bits
 * are 0, the smallest u1. A map to [0, 1) would take log(0); (0, 1] gives u1 = 2^-24 and
 * the largest radius sqrt(48 ln 2). */
Test(philox, normal_f32_never_takes_log_zero)
{
    ct_rng r = {0, 14883995ull * 4};
    cr_assert_eq(ref_word(0, r.offset), 0x00000093u);
    float f[2];
    ct_rng_normal_f32(&r, f, 2, 0.0f, 1.0f);
    double u2 = (0x9f72220cu >> 8) / 16777216.0, rad = sqrt(48.0 * log(2.0));
    cr_assert(isfinite(f[0]) && isfinite(f[1]), "%g %g", f[0], f[1]);
    cr_assert_float_eq(f[0], rad * cos(6.283185307179586 * u2), 2e-5);
    cr_assert_float_eq(f[1], rad * sin(6.283185307179586 * u2), 2e-5);
}

Test(philox, offset_accounting_rounds_to_blocks)
{
    ct_rng r = {5, 0};
    uint32_t u[9];
    float f[9];
    double d[9];
    ct_rng_u32(&r, u, 1);
    cr_assert_eq(r.offset, 4);
    ct_rng_uniform_f32(&r, f, 4, 0, 1);
    cr_assert_eq(r.offset, 8);
    ct_rng_uniform_f64(&r, d, 3, 0, 1); /* 6 words -> 8 */
    cr_assert_eq(r.offset, 16);
    ct_rng_normal_f32(&r, f, 9, 0, 1); /* 9 (pairs: 10) -> 12 */
    cr_assert_eq(r.offset, 28);
    ct_rng_normal_f64(&r, d, 1, 0, 1); /* one pair = 4 words */
    cr_assert_eq(r.offset, 32);
    (void)ct_rng_below(&r, 10);
    cr_assert_eq(r.offset, 36);
}

Test(philox, unaligned_offset_starts_at_next_block)
{
    ct_rng r = {77, 5};
    uint32_t u[4];
    ct_rng_u32(&r, u, 4);
    for (uint64_t i = 0; i < 4; i++)
        cr_assert_eq(u[i], ref_word(77, 8 + i));
    cr_assert_eq(r.offset, 12);
}

Test(philox, bad_input_does_nothing)
{
    ct_rng r = {1, 8};
    float f[4] = {42, 42, 42, 42};
    ct_error_clear();
    ct_rng_uniform_f32(&r, f, -1, 0, 1);
    cr_assert_eq(r.offset, 8);
    cr_assert_eq(f[0], 42.0f);
    cr_assert_eq(ct_last_status(), CT_ERR_INVALID);
    cr_assert_neq(strstr(ct_last_error(), "ct_rng_uniform_f32"), NULL, "%s", ct_last_error());

    ct_error_clear();
    ct_rng_normal_f32(&r, f, 0, 0, 1); /* n = 0: no-op, not an error */
    ct_rng_u32(&r, NULL, 0);
    cr_assert_eq(r.offset, 8);
    cr_assert_eq(ct_last_status(), CT_OK);

    ct_rng_u32(&r, NULL, 4);
    cr_assert_eq(ct_last_status(), CT_ERR_INVALID);
    cr_assert_eq(r.offset, 8);

    ct_error_clear();
    ct_rng_normal_f64(NULL, NULL, 4, 0, 1);
    ct_rng_uniform_f64(&r, NULL, -3, 0, 1);
    ct_rng_init(NULL, 3);
    cr_assert_eq(ct_last_status(), CT_ERR_INVALID);
    cr_assert_eq(ct_rng_below(NULL, 3), 0);
    cr_assert_eq(ct_rng_below(&r, 0), 0);
    cr_assert_eq(r.offset, 8);
}

/* ---- determinism --------------------------------------------------------------------- */

enum { K_U32, K_UF32, K_UF64, K_NF32, K_NF64, K_COUNT };
static const char *kind_name[K_COUNT] = {"u32", "uniform_f32", "uniform_f64", "normal_f32",
                                         "normal_f64"};
static size_t kind_size(int k) { return (k == K_UF64 || k == K_NF64) ? 8 : 4; }

static void fill(int kind, ct_rng *r, void *buf, int64_t n)
{
    switch (kind) {
    case K_U32: ct_rng_u32(r, buf, n); break;
    case K_UF32: ct_rng_uniform_f32(r, buf, n, -1.0f, 3.0f); break;
    case K_UF64: ct_rng_uniform_f64(r, buf, n, -1.0, 3.0); break;
    case K_NF32: ct_rng_normal_f32(r, buf, n, 0.5f, 2.0f); break;
    case K_NF64: ct_rng_normal_f64(r, buf, n, 0.5, 2.0); break;
    }
}

Test(philox, same_seed_same_stream_different_seeds_differ)
{
    enum { N = 1000 };
    static unsigned char a[N * 8], b[N * 8];
    for (int k = 0; k < K_COUNT; k++) {
        size_t bytes = N * kind_size(k);
        ct_rng r1, r2;
        ct_rng_init(&r1, 42);
        ct_rng_init(&r2, 42);
        fill(k, &r1, a, N);
        fill(k, &r2, b, N);
        cr_assert_eq(memcmp(a, b, bytes), 0, "%s: same seed differs", kind_name[k]);
        cr_assert_eq(r1.offset, r2.offset);
        fill(k, &r1, a, N); /* the stream moves on */
        cr_assert_neq(memcmp(a, b, bytes), 0, "%s: second fill repeats the first", kind_name[k]);

        /* seeds differing in the low word, and only in the high word */
        const uint64_t other[2] = {43, 42 | (1ull << 32)};
        for (int s = 0; s < 2; s++) {
            ct_rng_init(&r1, other[s]);
            fill(k, &r1, a, N);
            size_t same = 0;
            for (size_t i = 0; i < bytes; i += kind_size(k))
                same += memcmp(a + i, b + i, kind_size(k)) == 0;
            cr_assert_lt(same, 5, "%s: seed %llx shares %zu of %d values with seed 42",
                         kind_name[k], (unsigned long long)other[s], same, N);
        }
    }
}

Test(philox, split_fill_equals_one_fill)
{
    enum { N = 1003 };
    static unsigned char one[N * 8], split[N * 8];
    /* n1 a multiple of 4 elements (2 suffice for f64 fills: one block per 2 elements) */
    const int64_t n1s[] = {0, 4, 8, 500, 1000};
    for (int k = 0; k < K_COUNT; k++) {
        size_t es = kind_size(k);
        ct_rng r;
        ct_rng_init(&r, 7);
        fill(k, &r, one, N);
        uint64_t end = r.offset;
        for (size_t j = 0; j < sizeof n1s / sizeof n1s[0]; j++) {
            int64_t n1 = n1s[j];
            ct_rng_init(&r, 7);
            fill(k, &r, split, n1);
            fill(k, &r, split + (size_t)n1 * es, N - n1);
            cr_assert_eq(memcmp(one, split, N * es), 0, "%s: split at %lld differs", kind_name[k],
                         (long long)n1);
            cr_assert_eq(r.offset, end);
        }
    }
}

Test(philox, split_fill_at_odd_size_skips_to_next_block)
{
    /* n1 = 3 uses one block; the second fill starts at block 1, word 4, not word 3 */
    uint32_t a[8], b[3], c[5];
    ct_rng r;
    ct_rng_init(&r, 11);
    ct_rng_u32(&r, a, 8);
    ct_rng_init(&r, 11);
    ct_rng_u32(&r, b, 3);
    ct_rng_u32(&r, c, 5);
    cr_assert_eq(memcmp(a, b, sizeof b), 0);
    cr_assert_eq(memcmp(a + 4, c, 4 * sizeof c[0]), 0);
}

Test(philox, bitwise_identical_for_any_thread_count)
{
    const int64_t n = 1 << 20;
    unsigned char *ref = malloc((size_t)n * 8), *got = malloc((size_t)n * 8);
    cr_assert(ref && got);
    const int threads[] = {2, 4, 3};
    for (int k = 0; k < K_COUNT; k++) {
        size_t bytes = (size_t)n * kind_size(k);
        ct_rng r = {0xfeedface12345678ull, 4 * 1000};
        omp_set_num_threads(1);
        fill(k, &r, ref, n);
        uint64_t end = r.offset;
        for (int t = 0; t < 3; t++) {
            omp_set_num_threads(threads[t]);
            r = (ct_rng){0xfeedface12345678ull, 4 * 1000};
            memset(got, 0, bytes);
            fill(k, &r, got, n);
            cr_assert_eq(memcmp(ref, got, bytes), 0, "%s: %d threads differ from 1",
                         kind_name[k], threads[t]);
            cr_assert_eq(r.offset, end);
        }
        /* and the parallel fill agrees with small sequential pieces */
        r = (ct_rng){0xfeedface12345678ull, 4 * 1000};
        for (int64_t i = 0; i < n; i += 4096)
            fill(k, &r, got + (size_t)i * kind_size(k), 4096);
        cr_assert_eq(memcmp(ref, got, bytes), 0, "%s: pieces differ", kind_name[k]);
    }
    free(ref);
    free(got);
}

/* ---- statistics ---------------------------------------------------------------------- */

#define NSAMP 1000000

/* sum over bins of (obs - exp)^2 / exp with equal expected counts */
static double chi2_equal(const int64_t *count, int bins, int64_t total)
{
    double e = (double)total / bins, c = 0;
    for (int b = 0; b < bins; b++)
        c += ((double)count[b] - e) * ((double)count[b] - e) / e;
    return c;
}
/* a chi-square with df degrees of freedom has mean df, standard deviation sqrt(2 df) */
static void assert_chi2(double c, int df, const char *what)
{
    double lo = df - 5 * sqrt(2.0 * df), hi = df + 5 * sqrt(2.0 * df);
    cr_assert(c < hi && c > lo, "%s: chi2 = %.1f outside (%.1f, %.1f), df %d", what, c, lo, hi, df);
}

static void moments(const double *x, int64_t n, double *mean, double *var)
{
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i];
    *mean = s / n;
    for (int64_t i = 0; i < n; i++)
        ss += (x[i] - *mean) * (x[i] - *mean);
    *var = ss / (n - 1);
}

Test(philox, uniform_f32_moments_range_and_chi2)
{
    float *f = malloc(NSAMP * sizeof *f);
    double *x = malloc(NSAMP * sizeof *x);
    cr_assert(f && x);
    ct_rng r;
    ct_rng_init(&r, 2024);
    ct_rng_uniform_f32(&r, f, NSAMP, 0.0f, 1.0f);
    int64_t count[100] = {0};
    float mn = 1, mx = 0;
    for (int64_t i = 0; i < NSAMP; i++) {
        cr_assert(f[i] >= 0.0f && f[i] < 1.0f, "f[%lld] = %g", (long long)i, f[i]);
        mn = fminf(mn, f[i]);
        mx = fmaxf(mx, f[i]);
        count[(int)(f[i] * 100)]++;
        x[i] = f[i];
    }
    cr_assert(mn < 1e-4f && mx > 1 - 1e-4f, "range [%g, %g]", mn, mx);
    double mean, var;
    moments(x, NSAMP, &mean, &var);
    /* U(0,1): mean 1/2, var 1/12; SE(mean) = sqrt(1/12/n), SE(var) = sqrt((1/80 - 1/144)/n) */
    cr_assert_float_eq(mean, 0.5, 5 * sqrt(1.0 / 12 / NSAMP), "mean %g", mean);
    cr_assert_float_eq(var, 1.0 / 12, 5 * sqrt((1.0 / 80 - 1.0 / 144) / NSAMP), "var %g", var);
    assert_chi2(chi2_equal(count, 100, NSAMP), 99, "uniform_f32 100 bins");
    free(f);
    free(x);
}

Test(philox, uniform_f64_moments_range_and_chi2)
{
    double *x = malloc(NSAMP * sizeof *x);
    cr_assert(x);
    ct_rng r;
    ct_rng_init(&r, 31337);
    ct_rng_uniform_f64(&r, x, NSAMP, -2.0, 3.0);
    int64_t count[100] = {0};
    for (int64_t i = 0; i < NSAMP; i++) {
        cr_assert(x[i] >= -2.0 && x[i] < 3.0, "x[%lld] = %g", (long long)i, x[i]);
        count[(int)((x[i] + 2.0) / 5.0 * 100)]++;
    }
    double mean, var;
    moments(x, NSAMP, &mean, &var);
    /* U(a,b): mean (a+b)/2, var (b-a)^2/12; scale the unit SEs by (b-a), (b-a)^2 */
    cr_assert_float_eq(mean, 0.5, 5 * 5 * sqrt(1.0 / 12 / NSAMP), "mean %g", mean);
    cr_assert_float_eq(var, 25.0 / 12, 5 * 25 * sqrt((1.0 / 80 - 1.0 / 144) / NSAMP), "var %g", var);
    assert_chi2(chi2_equal(count, 100, NSAMP), 99, "uniform_f64 100 bins");
    free(x);
}

Test(philox, uniform_stays_below_hi_when_rounding_reaches_it)
{
    /* hi - lo tiny against lo: lo + (hi-lo)u rounds to hi for about half of all u */
    float f[4096];
    double d[4096];
    ct_rng r;
    ct_rng_init(&r, 3);
    ct_rng_uniform_f32(&r, f, 4096, 1.0f, nextafterf(1.0f, 2.0f));
    ct_rng_uniform_f64(&r, d, 4096, 1.0, nextafter(1.0, 2.0));
    for (int i = 0; i < 4096; i++) {
        cr_assert_eq(f[i], 1.0f);
        cr_assert_eq(d[i], 1.0);
    }
}

/* Checks a N(mu, sigma) sample: mean, variance, 4th standardized moment, lag-1
 * correlation (the two values of one Box-Muller pair), and a 100-bin chi-square on
 * Phi((x - mu) / sigma), which is U(0,1) when x is normal. */
static void check_normal(const double *x, int64_t n, double mu, double sigma, const char *what)
{
    double mean, var, m4 = 0, c1 = 0;
    moments(x, n, &mean, &var);
    int64_t count[100] = {0};
    for (int64_t i = 0; i < n; i++) {
        double z = (x[i] - mu) / sigma;
        m4 += z * z * z * z;
        if (i % 2 == 0 && i + 1 < n)
            c1 += z * (x[i + 1] - mu) / sigma;
        int b = (int)(0.5 * erfc(-z / sqrt(2.0)) * 100);
        count[b > 99 ? 99 : b]++;
    }
    m4 /= n;
    c1 /= n / 2;
    /* SE(mean) = sigma/sqrt(n); Var(z^2) = 2 so SE(var) = sigma^2 sqrt(2/n);
     * Var(z^4) = 105 - 9 so SE(m4) = sqrt(96/n); Var(z z') = 1 so SE(c1) = sqrt(1/(n/2)). */
    cr_assert_float_eq(mean, mu, 5 * sigma / sqrt((double)n), "%s: mean %g", what, mean);
    cr_assert_float_eq(var, sigma * sigma, 5 * sigma * sigma * sqrt(2.0 / n), "%s: var %g", what, var);
    cr_assert_float_eq(m4, 3.0, 5 * sqrt(96.0 / n), "%s: kurtosis %g", what, m4);
    cr_assert_float_eq(c1, 0.0, 5 * sqrt(2.0 / n), "%s: pair correlation %g", what, c1);
    assert_chi2(chi2_equal(count, 100, n), 99, what);
}

Test(philox, normal_f32_statistics)
{
    float *f = malloc(NSAMP * sizeof *f);
    double *x = malloc(NSAMP * sizeof *x);
    cr_assert(f && x);
    ct_rng r;
    ct_rng_init(&r, 555);
    ct_rng_normal_f32(&r, f, NSAMP, 0.0f, 1.0f);
    for (int64_t i = 0; i < NSAMP; i++) {
        cr_assert(isfinite(f[i]) && fabsf(f[i]) <= 5.8f, "f[%lld] = %g", (long long)i, f[i]);
        x[i] = f[i];
    }
    check_normal(x, NSAMP, 0.0, 1.0, "normal_f32 N(0,1)");
    ct_rng_normal_f32(&r, f, NSAMP, -3.0f, 0.25f);
    for (int64_t i = 0; i < NSAMP; i++)
        x[i] = f[i];
    check_normal(x, NSAMP, -3.0, 0.25, "normal_f32 N(-3,0.25)");
    free(f);
    free(x);
}

Test(philox, normal_f64_statistics)
{
    double *x = malloc(NSAMP * sizeof *x);
    cr_assert(x);
    ct_rng r;
    ct_rng_init(&r, 556);
    ct_rng_normal_f64(&r, x, NSAMP, 0.0, 1.0);
    for (int64_t i = 0; i < NSAMP; i++)
        cr_assert(isfinite(x[i]) && fabs(x[i]) <= 8.6, "x[%lld] = %g", (long long)i, x[i]);
    check_normal(x, NSAMP, 0.0, 1.0, "normal_f64 N(0,1)");
    ct_rng_normal_f64(&r, x, NSAMP, 10.0, 3.0);
    check_normal(x, NSAMP, 10.0, 3.0, "normal_f64 N(10,3)");
    free(x);
}

Test(philox, u32_bits_are_balanced)
{
    /* each of the 32 bit positions is set with probability 1/2: SE = sqrt(n/4) */
    enum { N = 1 << 18 };
    static uint32_t u[N];
    ct_rng r;
    ct_rng_init(&r, 8);
    ct_rng_u32(&r, u, N);
    for (int bit = 0; bit < 32; bit++) {
        int64_t ones = 0;
        for (int i = 0; i < N; i++)
            ones += (u[i] >> bit) & 1;
        cr_assert_float_eq((double)ones, N / 2.0, 5 * sqrt(N / 4.0), "bit %d: %lld ones", bit,
                           (long long)ones);
    }
}

/* ---- bounded integers ---------------------------------------------------------------- */

Test(philox, below_small_n_is_uniform)
{
    enum { N = 300000 };
    ct_rng r;
    ct_rng_init(&r, 17);
    int64_t count[3] = {0};
    for (int i = 0; i < N; i++) {
        uint64_t v = ct_rng_below(&r, 3);
        cr_assert_lt(v, 3);
        count[v]++;
    }
    assert_chi2(chi2_equal(count, 3, N), 2, "below(3)");
    cr_assert_eq(ct_rng_below(&r, 1), 0);
    for (int i = 0; i < 1000; i++)
        cr_assert_lt(ct_rng_below(&r, 10), 10);
}

/* For n = 3 * 2^62, plain x mod n over 64-bit x maps [n, 2^64) onto [0, 2^62), so the
 * first third of [0, n) would get half the draws instead of a third. Rejection must
 * remove that; the test also shows the check would catch the naive method. */
Test(philox, below_has_no_modulo_bias_for_large_n)
{
    enum { N = 60000 };
    const uint64_t ns[] = {3ull << 62, 3ull << 30};
    for (int t = 0; t < 2; t++) {
        const uint64_t n = ns[t], third = n / 3;
        ct_rng r;
        ct_rng_init(&r, 23);
        int64_t count[3] = {0}, naive[3] = {0};
        for (int i = 0; i < N; i++) {
            uint64_t v = ct_rng_below(&r, n);
            cr_assert_lt(v, n);
            count[v / third]++;
        }
        assert_chi2(chi2_equal(count, 3, N), 2, "below(3 * 2^k)");
        /* the naive reductions on the same stream: 64-bit x mod n, and 32-bit word mod n */
        ct_rng_init(&r, 23);
        uint32_t w[2 * N];
        ct_rng_u32(&r, w, 2 * N);
        for (int i = 0; i < N; i++) {
            uint64_t x = t == 0 ? ((uint64_t)w[2 * i + 1] << 32 | w[2 * i]) : w[i];
            naive[(x % n) / third]++;
        }
        cr_assert_gt(chi2_equal(naive, 3, N), 2 + 5 * sqrt(4.0), "naive modulo should fail");
    }
}

/* ---- default generator --------------------------------------------------------------- */

Test(philox, default_generator_seed_and_reset)
{
    ct_rng *d = ct_rng_default();
    cr_assert_not_null(d);
    cr_assert_eq(d, ct_rng_default());
    cr_assert_eq(d->seed, 0x5eed); /* each Criterion test runs in a fresh process */
    cr_assert_eq(d->offset, 0);

    uint32_t a[8], b[8];
    ct_rng ref;
    ct_rng_init(&ref, 0x5eed);
    ct_rng_u32(d, a, 8);
    ct_rng_u32(&ref, b, 8);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);

    ct_set_seed(123);
    cr_assert_eq(d->seed, 123);
    cr_assert_eq(d->offset, 0);
    ct_rng_init(&ref, 123);
    ct_rng_u32(d, a, 8);
    ct_rng_u32(&ref, b, 8);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

Test(philox, default_generator_is_thread_safe)
{
    /* 4 threads draw blocks concurrently; together they must get exactly the first
     * 4 * K blocks of the stream, each once (which thread gets which may vary). */
    enum { T = 4, K = 5000 };
    static uint32_t got[T * K * 4], want[T * K * 4];
    ct_set_seed(0xabcdef);
    omp_set_num_threads(T);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            ct_rng_u32(ct_rng_default(), got + ((size_t)t * K + (size_t)k) * 4, 4);
    cr_assert_eq(ct_rng_default()->offset, (uint64_t)T * K * 4);
    ct_rng ref;
    ct_rng_init(&ref, 0xabcdef);
    ct_rng_u32(&ref, want, T * K * 4);
    qsort(got, T * K * 4, sizeof got[0], cmp_u32);
    qsort(want, T * K * 4, sizeof want[0], cmp_u32);
    cr_assert_eq(memcmp(got, want, sizeof got), 0);
}
