/* Tests for precision/fp8.c: the recipe's defaults and errors, the scale update
 * against values worked out by hand, quantisation (fast against the plain loop, and
 * both against the format's rules), and the fp8 GEMM against an exact reference. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/tensor.h"
#include "precision/fp8.h"

static void frame_in(void) { ct_frame_push(); }
static void frame_out(void) { ct_frame_pop(); }
TestSuite(precision_fp8, .init = frame_in, .fini = frame_out);

/* ---- recipe ------------------------------------------------------------------------------ */

Test(precision_fp8, recipe_defaults_and_roles)
{
    ct_fp8_recipe r;
    cr_assert_eq(ct_fp8_recipe_resolve(NULL, &r), CT_OK);
    cr_expect_eq(r.format, CT_FP8_HYBRID);
    cr_expect_eq(r.amax_history_len, 1024);
    cr_expect_eq(r.margin, 0);
    cr_expect_eq(r.amax_compute_algo, CT_FP8_AMAX_MAX);
    cr_expect_not(r.fp8_embedding_and_head);
    cr_expect_eq(ct_fp8_dtype(&r, CT_FP8_FORWARD), CT_DTYPE_F8_E4M3);
    cr_expect_eq(ct_fp8_dtype(&r, CT_FP8_BACKWARD), CT_DTYPE_F8_E5M2);
    r.format = CT_FP8_E4M3;
    cr_expect_eq(ct_fp8_dtype(&r, CT_FP8_BACKWARD), CT_DTYPE_F8_E4M3);
    cr_expect_str_eq(ct_fp8_format_name(CT_FP8_HYBRID), "hybrid");
    cr_expect_str_eq(ct_fp8_amax_algo_name(CT_FP8_AMAX_MOST_RECENT), "most_recent");
    cr_expect_eq(ct_fp8_max(CT_DTYPE_F8_E4M3), ct_e4m3_to_f32(0x7E)); /* the largest finite patterns */
    cr_expect_eq(ct_fp8_max(CT_DTYPE_F8_E5M2), ct_e5m2_to_f32(0x7B));
}

Test(precision_fp8, bad_recipes_name_the_field)
{
    ct_fp8_recipe r;
    struct {
        ct_fp8_recipe in;
        const char *want;
    } bad[] = {
        {{.amax_history_len = -3}, "amax_history_len -3 is outside 1 .. 1048576"},
        {{.margin = 65}, "margin 65 is outside 0 .. 64"},
        {{.format = (ct_fp8_format)7}, "format 7 is not HYBRID"},
        {{.amax_compute_algo = (ct_fp8_amax_algo)2}, "amax_compute_algo 2 is not max"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(ct_fp8_recipe_resolve(&bad[i].in, &r), CT_ERR_INVALID);
        cr_expect(strstr(ct_last_error(), bad[i].want) != NULL, "%s", ct_last_error());
    }
}

/* ---- delayed scaling ---------------------------------------------------------------------- */

Test(precision_fp8, scale_updates_match_the_hand_computation)
{
    ct_fp8_meta m;
    ct_fp8_recipe r = {.amax_history_len = 4, .margin = 1};
    cr_assert_eq(ct_fp8_meta_init(&m, &r, CT_FP8_FORWARD), CT_OK);
    cr_expect_eq(m.dtype, CT_DTYPE_F8_E4M3);
    cr_expect_eq(m.scale, 1.0f);                /* nothing seen yet */
    ct_fp8_meta_observe(&m, 1.5f);
    ct_fp8_meta_observe(&m, 2.0f);              /* the step's amax is the larger */
    ct_fp8_meta_step(&m);
    cr_expect_eq(m.scale, 112.0f);              /* 448 / 2 / 2^1 */
    ct_fp8_meta_observe(&m, 8.0f);
    ct_fp8_meta_step(&m);
    cr_expect_eq(m.scale, 28.0f);               /* max(2, 8): 448 / 8 / 2 */
    ct_fp8_meta_step(&m);                       /* a step that saw nothing records 0 */
    cr_expect_eq(m.scale, 28.0f);
    ct_fp8_meta_observe(&m, 0.5f);
    ct_fp8_meta_step(&m);                       /* history 2, 8, 0, 0.5: still 8 */
    cr_expect_eq(m.scale, 28.0f);
    ct_fp8_meta_observe(&m, 0.5f);
    ct_fp8_meta_step(&m);                       /* the 2 leaves: 8, 0, 0.5, 0.5 */
    cr_expect_eq(m.scale, 28.0f);
    ct_fp8_meta_observe(&m, 0.25f);
    ct_fp8_meta_step(&m);                       /* the 8 leaves: 0, 0.5, 0.5, 0.25 -> 0.5 */
    cr_expect_eq(m.scale, 448.0f);              /* 448 / 0.5 / 2 */
    cr_expect_eq(ct_fp8_meta_amax(&m), 0.5f);
    ct_fp8_meta_observe(&m, NAN);               /* an overflowing step keeps the scale */
    ct_fp8_meta_step(&m);
    cr_expect_eq(m.scale, 448.0f);
    ct_fp8_meta_free(&m);

    /* most_recent, E5M2 gradients, no margin */
    r = (ct_fp8_recipe){.amax_history_len = 3, .amax_compute_algo = CT_FP8_AMAX_MOST_RECENT};
    cr_assert_eq(ct_fp8_meta_init(&m, &r, CT_FP8_BACKWARD), CT_OK);
    cr_expect_eq(m.dtype, CT_DTYPE_F8_E5M2);
    ct_fp8_meta_observe(&m, 1024.0f);
    ct_fp8_meta_step(&m);
    cr_expect_eq(m.scale, 56.0f);               /* 57344 / 1024 */
    ct_fp8_meta_observe(&m, 7.0f);
    ct_fp8_meta_step(&m);
    cr_expect_eq(m.scale, 8192.0f);             /* 57344 / 7, the newest only */
    ct_fp8_meta_free(&m);
}

/* ---- quantisation ------------------------------------------------------------------------ */

Test(precision_fp8, quantize_rounds_saturates_and_reports_amax)
{
    float v[] = {0.0f, -0.0f, 1.0f, 1.0625f, 1.1875f, -3.3f, 300.0f, 1000.0f, -1e9f, 1e-9f};
    ct_tensor *x = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(10));
    memcpy(ct_tensor_data(x), v, sizeof v);
    float amax = 0;
    ct_tensor *q = ct_fp8_quantize(x, CT_DTYPE_F8_E4M3, 2.0f, &amax);
    cr_assert_not_null(q, "%s", ct_last_error());
    cr_expect_eq(amax, 1e9f);
    cr_expect_eq(q->amax, 1e9f);
    cr_expect_eq(q->scale, 2.0f);
    const uint8_t *p = ct_tensor_data(q);
    /* x * 2, rounded to E4M3 (3 mantissa bits), saturating at 448 */
    double want[] = {0, -0.0, 2, 2.0 /* 2.125 ties to even 2 */, 2.5 /* 2.375 ties to 2.5 */, -6.5, 448, 448, -448, 0};
    for (int i = 0; i < 10; i++)
        cr_expect_eq(ct_e4m3_to_f32(p[i]), (float)want[i], "element %d: %g -> %g, want %g", i, (double)v[i],
                     (double)ct_e4m3_to_f32(p[i]), want[i]);
    cr_expect(signbit(ct_e4m3_to_f32(p[1])), "-0 keeps its sign");
}

Test(precision_fp8, quantize_fast_matches_the_reference)
{
    for (int d = 0; d < 2; d++) {
        ct_dtype dt = d ? CT_DTYPE_F8_E5M2 : CT_DTYPE_F8_E4M3;
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(37, 129), 0, 300);
        /* strided: the transpose, so both paths walk a non-contiguous view */
        ct_tensor *xt = ct_tensor_transpose(x, 0, 1);
        float a1 = 0, a2 = 0;
        ct_tensor *q1 = ct_fp8_quantize(xt, dt, 0.75f, &a1), *q2 = ct_fp8_quantize_ref(xt, dt, 0.75f, &a2);
        cr_assert(q1 && q2, "%s", ct_last_error());
        cr_expect_eq(memcmp(ct_tensor_data(q1), ct_tensor_data(q2), 37 * 129), 0, "%s: fast and reference differ",
                     ct_dtype_name(dt));
        float want = 0;
        const float *px = ct_tensor_data(x);
        for (int i = 0; i < 37 * 129; i++) want = fmaxf(want, fabsf(px[i]));
        cr_expect_eq(a1, want);
        cr_expect_eq(a2, want);
    }
    /* 16-bit inputs widen exactly first: the same bytes as quantising their f32 values */
    for (int s = 0; s < 2; s++) {
        ct_dtype src = s ? CT_DTYPE_F16 : CT_DTYPE_BF16;
        ct_tensor *x32 = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(5, 700), 0, 3);
        ct_tensor *x16 = ct_tensor_cast(x32, src), *back = ct_tensor_cast(x16, CT_DTYPE_F32);
        float a1 = 0, a2 = 0, a3 = 0;
        ct_tensor *q1 = ct_fp8_quantize(x16, CT_DTYPE_F8_E4M3, 40.0f, &a1);
        ct_tensor *q2 = ct_fp8_quantize_ref(x16, CT_DTYPE_F8_E4M3, 40.0f, &a2);
        ct_tensor *q3 = ct_fp8_quantize_ref(back, CT_DTYPE_F8_E4M3, 40.0f, &a3);
        cr_assert(q1 && q2 && q3, "%s", ct_last_error());
        cr_expect_eq(memcmp(ct_tensor_data(q1), ct_tensor_data(q2), 3500), 0, "%s: fast and reference differ",
                     ct_dtype_name(src));
        cr_expect_eq(memcmp(ct_tensor_data(q2), ct_tensor_data(q3), 3500), 0, "%s: not its f32 value's bytes",
                     ct_dtype_name(src));
        cr_expect(a1 == a3 && a2 == a3);
    }
    ct_tensor *y = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3));
    ((float *)ct_tensor_data(y))[1] = NAN;
    float a = 0;
    cr_assert_not_null(ct_fp8_quantize(y, CT_DTYPE_F8_E4M3, 1.0f, &a));
    cr_expect(isnan(a), "a NaN input gives a NaN amax");
}

Test(precision_fp8, quantize_rejects_bad_arguments)
{
    ct_tensor *x = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4));
    cr_expect_null(ct_fp8_quantize(x, CT_DTYPE_BF16, 1.0f, NULL));
    cr_expect(strstr(ct_last_error(), "want an f32, bf16 or f16 CPU tensor and f8_e4m3 or f8_e5m2") != NULL, "%s", ct_last_error());
    cr_expect_null(ct_fp8_quantize(x, CT_DTYPE_F8_E4M3, 0.0f, NULL));
    cr_expect(strstr(ct_last_error(), "scale 0 is not a finite positive number") != NULL, "%s", ct_last_error());
    cr_expect_null(ct_fp8_quantize(ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(4)), CT_DTYPE_F8_E4M3, 1.0f, NULL));
}

/* ---- GEMM -------------------------------------------------------------------------------- */

/* An fp8 tensor of small integers (exact in both formats), with the given scale. */
static ct_tensor *int_fp8(ct_dtype dt, int64_t r, int64_t c, unsigned seed, float scale)
{
    ct_tensor *x = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(r, c));
    float *p = ct_tensor_data(x);
    for (int64_t i = 0; i < r * c; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)((int)(seed >> 16) % 17 - 8) / scale; /* -8 .. 8 after scaling */
    }
    return ct_fp8_quantize(x, dt, scale, NULL);
}

Test(precision_fp8, gemm_equals_the_exact_product)
{
    /* integers up to 8: products up to 64, sums over K = 96 up to 6144, all exact in f32,
     * so any summation order gives the exact value */
    ct_tensor *a = int_fp8(CT_DTYPE_F8_E4M3, 33, 96, 1, 4.0f), *b = int_fp8(CT_DTYPE_F8_E5M2, 96, 21, 2, 0.5f);
    cr_assert(a && b, "%s", ct_last_error());
    ct_tensor *got = ct_fp8_matmul(a, b, false, false), *ref = ct_fp8_matmul_ref(a, b, false, false);
    cr_assert(got && ref, "%s", ct_last_error());
    const uint8_t *pa = ct_tensor_data(a), *pb = ct_tensor_data(b);
    const float *g = ct_tensor_data(got), *r = ct_tensor_data(ref);
    for (int i = 0; i < 33; i++)
        for (int j = 0; j < 21; j++) {
            double s = 0;
            for (int k = 0; k < 96; k++) s += (double)ct_e4m3_to_f32(pa[i * 96 + k]) * ct_e5m2_to_f32(pb[k * 21 + j]);
            double want = s / (4.0 * 0.5);
            cr_expect_eq(g[i * 21 + j], (float)want, "(%d, %d): %g, want %g", i, j, (double)g[i * 21 + j], want);
            cr_expect_eq(r[i * 21 + j], (float)want);
        }
}

Test(precision_fp8, gemm_transposes_and_random_values)
{
    ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(40, 24), 0, 1);
    ct_tensor *y = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(17, 40), 0, 1);
    ct_tensor *a = ct_fp8_quantize(x, CT_DTYPE_F8_E4M3, 100.0f, NULL), *b = ct_fp8_quantize(y, CT_DTYPE_F8_E4M3, 50.0f, NULL);
    cr_assert(a && b);
    /* op(a) = a^T (24, 40), op(b) = b^T (40, 17) */
    ct_tensor *got = ct_fp8_matmul(a, b, true, true), *ref = ct_fp8_matmul_ref(a, b, true, true);
    cr_assert(got && ref, "%s", ct_last_error());
    cr_expect_eq(got->shape[0], 24);
    cr_expect_eq(got->shape[1], 17);
    const float *g = ct_tensor_data(got), *r = ct_tensor_data(ref);
    for (int i = 0; i < 24 * 17; i++)
        cr_expect(fabsf(g[i] - r[i]) <= 1e-5f * fmaxf(1.0f, fabsf(r[i])), "%d: %g vs %g", i, (double)g[i], (double)r[i]);
    cr_expect_null(ct_fp8_matmul(a, b, false, false)); /* (40, 24) @ (17, 40): inner sizes differ */
    cr_expect(strstr(ct_last_error(), "matching inner sizes") != NULL, "%s", ct_last_error());
    cr_expect_null(ct_fp8_matmul(x, b, true, true));
}
