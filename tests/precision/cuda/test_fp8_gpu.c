/* GPU conformance for precision/fp8.c's GPU side (kernels/cuda/fp8.cu): quantisation
 * bit-for-bit against the CPU (values, saturation, amax with NaN), the fp8 GEMM
 * (cuBLASLt fp8 on sm_89+, the bf16 fallback elsewhere and for sizes and formats the
 * fp8 kernels do not take) against the CPU's exact emulation, and the plain CUDA
 * references against the CPU references. */
#include <string.h>

#include "tests/gpu_conformance.h"

static const ct_dtype q_src[] = {CT_DTYPE_F32, CT_DTYPE_BF16, CT_DTYPE_F16};
static const ct_dtype q_fmt[] = {CT_DTYPE_F8_E4M3, CT_DTYPE_F8_E5M2};

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b)); }

/* quantize and quantize_ref of x on the GPU vs the CPU: same bits, same amax. */
static void q_check(const ct_tensor *x, ct_tensor *gx, ct_dtype fmt, float scale, const char *what)
{
    CT_FRAME {
        float a = -1, ga = -1, ar = -1, gar = -1;
        ct_tensor *q = ct_fp8_quantize(x, fmt, scale, &a);
        ct_tensor *gq = ct_fp8_quantize(gx, fmt, scale, &ga);
        char w[200];
        snprintf(w, sizeof w, "%s -> %s scale %g", what, ct_dtype_name(fmt), (double)scale);
        gpu_expect_equal(gq, q, w);
        cr_assert(same_bits(a, ga), "%s: amax GPU %.9g, CPU %.9g", w, (double)ga, (double)a);
        cr_assert(gq->scale == scale && same_bits(gq->amax, ga), "%s: the result's scale/amax", w);
        cr_assert(gq->device.type == CT_DEVICE_CUDA, "%s: result not on the GPU", w);
        ct_tensor *qr = ct_fp8_quantize_ref(x, fmt, scale, &ar);
        ct_tensor *gqr = ct_fp8_quantize_ref(gx, fmt, scale, &gar);
        gpu_expect_equal(gqr, qr, w);
        cr_assert(same_bits(ar, gar), "%s: reference amax GPU %.9g, CPU %.9g", w, (double)gar, (double)ar);
    }
}

Test(gpu_fp8, quantize_bits_and_amax_match_the_cpu)
{
    GPU_REQUIRE();
    /* 300001 elements: more than the fast kernel's 1024 blocks of 256 cover in one sweep */
    static const int64_t sizes[] = {1, 1000, 300001};
    for (size_t s = 0; s < 3; s++)
        for (size_t d = 0; d < 3; d++)
            for (size_t f = 0; f < 2; f++) CT_FRAME {
                    /* values past e4m3's 448 (saturated) and below its smallest subnormal */
                    ct_tensor *x = gpu_rand_cpu(q_src[d], 1, &sizes[s], 10 + s, -700, 700);
                    char w[100];
                    snprintf(w, sizeof w, "%s[%lld]", ct_dtype_name(q_src[d]), (long long)sizes[s]);
                    q_check(x, gpu_of(x), q_fmt[f], 0.75f, w);
                    q_check(x, gpu_of(x), q_fmt[f], 1e-3f, w);
                }
}

Test(gpu_fp8, quantize_nan_strided_and_empty)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *x = gpu_rand_cpu(CT_DTYPE_F32, 1, (int64_t[]){5000}, 20, -3, 3);
        ((float *)ct_tensor_data(x))[4321] = NAN;
        q_check(x, gpu_of(x), CT_DTYPE_F8_E4M3, 100.0f, "f32 with a NaN");
        q_check(x, gpu_of(x), CT_DTYPE_F8_E5M2, 100.0f, "f32 with a NaN");
        /* a transposed view: quantised in its logical (row-major) order */
        ct_tensor *m = gpu_rand_cpu(CT_DTYPE_BF16, 2, (int64_t[]){37, 53}, 21, -2, 2);
        q_check(ct_tensor_transpose(m, 0, 1), ct_tensor_transpose(gpu_of(m), 0, 1), CT_DTYPE_F8_E4M3, 64.0f,
                "transposed bf16");
        ct_tensor *e = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(0, 4));
        float ga = -1;
        ct_tensor *ge = ct_fp8_quantize(gpu_of(e), CT_DTYPE_F8_E4M3, 1.0f, &ga);
        cr_assert_not_null(ge, "%s", ct_last_error());
        cr_assert(ga == 0.0f && ct_tensor_numel(ge) == 0);
    }
}

/* Random values in [-1, 1] quantised with the scale that maps 1 to the format's max,
 * stored (r, c). */
static ct_tensor *rand_fp8(ct_dtype fmt, int64_t r, int64_t c, uint64_t seed)
{
    ct_tensor *x = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){r, c}, seed, -1, 1);
    return ct_fp8_quantize(x, fmt, (float)ct_fp8_max(fmt), NULL);
}

/* op(a) @ op(b) / (sa sb) on the GPU vs the CPU's exact emulation; the CUDA reference vs
 * the CPU reference bit for bit (both sum exact products in f32 in k order and scale by
 * the same f32 factor).
 * The tolerance is the bf16 row, not the f32 one: Hopper's fp8 tensor cores keep their
 * partial sums in a narrower accumulator between promotions to f32 (cuBLASLt without
 * fast accumulation promotes every few MMA steps), so the sum carries more rounding than
 * an f32 loop, though far less than one bf16 ulp of the result for these sizes; the
 * fallback (bf16 GEMM, f32 accumulation) is well inside it too. A wrong layout or scale
 * misses it by orders of magnitude. */
static void mm_check(ct_dtype fa, ct_dtype fb, int64_t M, int64_t N, int64_t K, bool ta, bool tb, uint64_t seed)
{
    CT_FRAME {
        ct_tensor *a = ta ? rand_fp8(fa, K, M, seed) : rand_fp8(fa, M, K, seed);
        ct_tensor *b = tb ? rand_fp8(fb, N, K, seed + 1) : rand_fp8(fb, K, N, seed + 1);
        cr_assert(a && b, "%s", ct_last_error());
        char w[200];
        snprintf(w, sizeof w, "fp8_matmul %s%s @ %s%s, M=%lld N=%lld K=%lld", ct_dtype_name(fa), ta ? "^T" : "",
                 ct_dtype_name(fb), tb ? "^T" : "", (long long)M, (long long)N, (long long)K);
        ct_tensor *ref = ct_fp8_matmul_ref(a, b, ta, tb);
        ct_tensor *ga = gpu_of(a), *gb = gpu_of(b);
        gpu_expect_close_tol(ct_fp8_matmul(ga, gb, ta, tb), ref, gpu_tolerance_of(CT_DTYPE_BF16), w);
        gpu_expect_equal(ct_fp8_matmul_ref(ga, gb, ta, tb), ref, w);
    }
}

Test(gpu_fp8, gemm_fp8_layouts_and_formats)
{
    GPU_REQUIRE();
    static const ct_dtype pairs[][2] = {{CT_DTYPE_F8_E4M3, CT_DTYPE_F8_E4M3},
                                        {CT_DTYPE_F8_E4M3, CT_DTYPE_F8_E5M2},
                                        {CT_DTYPE_F8_E5M2, CT_DTYPE_F8_E4M3},
                                        {CT_DTYPE_F8_E5M2, CT_DTYPE_F8_E5M2}}; /* the last: always the fallback */
    for (size_t p = 0; p < 4; p++)
        for (int t = 0; t < 4; t++) {
            /* multiples of 16 (cuBLASLt fp8 where the GPU has it), then sizes that are not */
            mm_check(pairs[p][0], pairs[p][1], 32, 48, 64, t & 1, t >> 1, 100 + t);
            mm_check(pairs[p][0], pairs[p][1], 128, 16, 256, t & 1, t >> 1, 200 + t);
            mm_check(pairs[p][0], pairs[p][1], 17, 5, 33, t & 1, t >> 1, 300 + t);
            mm_check(pairs[p][0], pairs[p][1], 1, 1, 1, t & 1, t >> 1, 400 + t);
        }
}

Test(gpu_fp8, gemm_scales_and_errors)
{
    GPU_REQUIRE();
    CT_FRAME {
        /* scales other than the format max: alpha = 1 / (sa sb) must be applied once */
        ct_tensor *x = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){64, 96}, 50, -4, 4);
        ct_tensor *y = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){48, 96}, 51, -0.1, 0.1);
        ct_tensor *a = ct_fp8_quantize(x, CT_DTYPE_F8_E4M3, 50.0f, NULL);
        ct_tensor *b = ct_fp8_quantize(y, CT_DTYPE_F8_E4M3, 3000.0f, NULL);
        ct_tensor *ref = ct_fp8_matmul_ref(a, b, false, true);
        gpu_expect_close_tol(ct_fp8_matmul(gpu_of(a), gpu_of(b), false, true), ref, gpu_tolerance_of(CT_DTYPE_BF16),
                             "scales 50 and 3000");
        /* a CPU and a GPU operand */
        cr_assert_null(ct_fp8_matmul(gpu_of(a), b, false, true));
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
        /* shapes that do not fit, on the GPU */
        cr_assert_null(ct_fp8_matmul(gpu_of(a), gpu_of(b), false, false));
        cr_assert(strstr(ct_last_error(), "matching inner sizes"), "%s", ct_last_error());
    }
}
