/* Tests for kernels/dropout.c and kernels/cpu/dropout.c: the mask rule against
 * words drawn from the stream here, mask statistics, reproducibility across
 * seeds and thread counts, and the backward against finite differences. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/dropout.h"
#include "kernels/dropout.h"
#include "tests/kernels/util.h"

static int64_t count_kept(const ct_tensor *mask)
{
    int64_t k = 0;
    const uint8_t *m = ct_tensor_data(mask);
    for (int64_t i = 0; i < ct_tensor_numel(mask); i++) k += m[i];
    return k;
}

Test(dropout, mask_follows_the_stream_rule)
{
    CT_FRAME {
        const double ps[] = {0.1, 0.5, 0.9, 1e-12};
        for (int k = 0; k < 4; k++) {
            double p = ps[k];
            ct_rng rng, copy;
            ct_rng_init(&rng, 1234 + k);
            copy = rng;
            ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(37, 29), 0, 1), *mask;
            ct_tensor *y = ct_kernel_dropout(x, p, &rng, &mask);
            cr_assert_not_null(y, "%s", ct_last_error());
            cr_assert_eq(mask->dtype, CT_DTYPE_U8);
            /* 1073 words used, rounded up to whole blocks */
            cr_assert_eq(rng.offset, 1076);
            uint32_t w[37 * 29];
            ct_rng_u32(&copy, w, 37 * 29);
            const float *xp = ct_tensor_data(x), *yp = ct_tensor_data(y);
            const uint8_t *m = ct_tensor_data(mask);
            for (int i = 0; i < 37 * 29; i++) {
                bool keep = (double)w[i] >= p * 4294967296.0;
                cr_assert_eq(m[i], keep, "element %d", i);
                cr_assert_eq(yp[i], keep ? xp[i] * (float)(1 / (1 - p)) : 0.0f);
            }
        }
        /* the boundary: a word equal to p * 2^32 is kept, one just below it is dropped */
        ct_rng rng;
        ct_rng_init(&rng, 42);
        uint32_t w[4];
        ct_rng_u32(&(ct_rng){rng.seed, rng.offset}, w, 4);
        ct_tensor *x = ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(4)), *mask;
        double at = w[0] / 4294967296.0, above = (w[0] + 0.5) / 4294967296.0;
        ct_kernel_dropout(x, at, &(ct_rng){rng.seed, rng.offset}, &mask);
        cr_assert_eq(((uint8_t *)ct_tensor_data(mask))[0], 1, "u32 == p * 2^32 is kept");
        ct_kernel_dropout(x, above, &(ct_rng){rng.seed, rng.offset}, &mask);
        cr_assert_eq(((uint8_t *)ct_tensor_data(mask))[0], 0, "u32 < p * 2^32 is dropped");
    }
}

Test(dropout, fraction_kept_within_five_sigma)
{
    CT_FRAME {
        const int64_t n = 1 << 20;
        const double ps[] = {0.1, 0.5, 0.9};
        ct_tensor *x = ct_tensor_ones(CT_DTYPE_BF16, CT_SHAPE(n));
        for (int k = 0; k < 3; k++) {
            ct_tensor *mask;
            ct_tensor *y = ct_kernel_dropout(x, ps[k], NULL, &mask);
            double frac = (double)count_kept(mask) / (double)n, sigma = sqrt(ps[k] * (1 - ps[k]) / (double)n);
            cr_assert_leq(fabs(frac - (1 - ps[k])), 5 * sigma, "p = %g kept %g", ps[k], frac);
            /* kept elements are scaled: the mean stays near 1 */
            double *yp = f64_data(y), s = 0;
            for (int64_t i = 0; i < n; i++) s += yp[i];
            cr_assert_float_eq(s / (double)n, 1.0, 0.02, "p = %g mean %g", ps[k], s / (double)n);
        }
    }
}

Test(dropout, same_seed_same_mask_any_thread_count)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(513, 257), 0, 1);
        ct_tensor *masks[3], *ys[3];
        const int threads[3] = {1, 2, 4};
        for (int k = 0; k < 3; k++) {
            ct_rng rng;
            ct_rng_init(&rng, 99);
            ct_set_num_threads(threads[k]);
            ys[k] = ct_kernel_dropout(x, 0.3, &rng, &masks[k]);
        }
        ct_set_num_threads(0);
        for (int k = 1; k < 3; k++) {
            cr_assert(same_bits(masks[0], masks[k]));
            cr_assert(same_bits(ys[0], ys[k]));
        }
        /* another seed, or the same stream further on, gives another mask */
        ct_rng a, b;
        ct_rng_init(&a, 100);
        ct_rng_init(&b, 99);
        ct_tensor *m1, *m2, *m3;
        ct_kernel_dropout(x, 0.3, &a, &m1);
        ct_kernel_dropout(x, 0.3, &b, &m2);
        ct_kernel_dropout(x, 0.3, &b, &m3);
        cr_assert(!same_bits(m1, masks[0]));
        cr_assert(same_bits(m2, masks[0]));
        cr_assert(!same_bits(m3, m2));
        /* the process generator: ct_set_seed makes it repeat */
        ct_set_seed(7);
        ct_tensor *d1, *d2;
        ct_kernel_dropout(x, 0.3, NULL, &d1);
        ct_set_seed(7);
        ct_kernel_dropout(x, 0.3, NULL, &d2);
        cr_assert(same_bits(d1, d2));
    }
}

Test(dropout, fast_matches_reference_all_dtypes_and_layouts)
{
    ct_set_seed(41);
    for (int d = 0; d < 4; d++) CT_FRAME {
            ct_dtype dt = float_dtypes[d];
            ct_tensor *base = ct_tensor_randn(dt, CT_SHAPE(33, 17), 0, 1);
            ct_tensor *views[2] = {base, ct_tensor_transpose(base, 0, 1)};
            for (int v = 0; v < 2; v++) {
                ct_rng r1, r2;
                ct_rng_init(&r1, 5);
                r2 = r1;
                ct_tensor *mask, *y = ct_kernel_dropout(views[v], 0.4, &r1, &mask);
                ct_tensor *xc = ct_tensor_clone(views[v]);
                ct_tensor *yr = ct_tensor_empty_like(xc), *mr = ct_tensor_empty(CT_DTYPE_U8, 2, xc->shape);
                cr_assert_eq(cti_cpu_dropout_ref(xc, 0.4, &r2, yr, mr), CT_OK);
                cr_assert_eq(r1.offset, r2.offset);
                cr_assert(same_bits(mask, mr));
                double *a = f64_data(y), *b = f64_data(yr), tol = dt == CT_DTYPE_F64 ? 1e-15 : dt == CT_DTYPE_F32 ? 1e-7 : 1e-2;
                for (int i = 0; i < 33 * 17; i++) cr_assert_float_eq(a[i], b[i], tol * (1 + fabs(b[i])));
                /* backward vs ref, and vs dy * mask / (1 - p) directly */
                ct_tensor *dy = ct_tensor_randn(dt, 2, xc->shape, 0, 1);
                ct_tensor *dx = ct_kernel_dropout_backward(dy, mask, 0.4), *dxr = ct_tensor_empty_like(dy);
                cr_assert_eq(cti_cpu_dropout_backward_ref(dy, mask, 0.4, dxr), CT_OK);
                double *g = f64_data(dx), *gr = f64_data(dxr), *dyp = f64_data(dy);
                const uint8_t *m = ct_tensor_data(mask);
                for (int i = 0; i < 33 * 17; i++) {
                    cr_assert_float_eq(g[i], gr[i], tol * (1 + fabs(gr[i])));
                    cr_assert_float_eq(g[i], dyp[i] * m[i] / 0.6, tol * (1 + fabs(gr[i])));
                }
            }
        }
}

Test(dropout, p_zero_and_one)
{
    CT_FRAME {
        for (int d = 0; d < 4; d++) {
            ct_tensor *x = ct_tensor_randn(float_dtypes[d], CT_SHAPE(5, 7), 0, 1), *mask;
            ct_rng rng;
            ct_rng_init(&rng, 3);
            ct_tensor *y = ct_kernel_dropout(x, 0, &rng, &mask);
            cr_assert(same_bits(y, x));
            cr_assert_eq(count_kept(mask), 35);
            cr_assert_eq(rng.offset, 0, "p = 0 reads no words");
            ct_tensor *dx = ct_kernel_dropout_backward(x, mask, 0);
            cr_assert(same_bits(dx, x));
            y = ct_kernel_dropout(x, 1, &rng, &mask);
            cr_assert_eq(count_kept(mask), 0);
            cr_assert_eq(rng.offset, 0, "p = 1 reads no words");
            double *yp = f64_data(y), *dp = f64_data(ct_kernel_dropout_backward(x, mask, 1));
            for (int i = 0; i < 35; i++) cr_assert(yp[i] == 0 && dp[i] == 0);
            /* a bool mask works in the backward */
            ct_tensor *bm = ct_tensor_ones(CT_DTYPE_BOOL, CT_SHAPE(5, 7));
            dp = f64_data(ct_kernel_dropout_backward(x, bm, 0.5));
            double *xp = f64_data(x);
            for (int i = 0; i < 35; i++) cr_assert_float_eq(dp[i], 2 * xp[i], 1e-2 * (1 + fabs(xp[i])));
        }
    }
}

Test(dropout, backward_matches_finite_differences)
{
    CT_FRAME {
        const double h = 1e-6, p = 0.35;
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(4, 9), 0, 1), *mask;
        ct_tensor *dy = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(4, 9), 0, 1);
        ct_rng start;
        ct_rng_init(&start, 77);
        ct_rng r = start;
        cr_assert_not_null(ct_kernel_dropout(x, p, &r, &mask));
        ct_tensor *dx = ct_kernel_dropout_backward(dy, mask, p);
        double *xp = ct_tensor_data(x), *dyp = ct_tensor_data(dy);
        for (int i = 0; i < 36; i++) {
            double keep = xp[i], l[2];
            for (int s = 0; s < 2; s++) CT_FRAME {
                    ct_rng rs = start; /* the same mask every time */
                    xp[i] = keep + (s ? -h : h);
                    double *y = ct_tensor_data(ct_kernel_dropout(x, p, &rs, NULL));
                    l[s] = 0;
                    for (int j = 0; j < 36; j++) l[s] += dyp[j] * y[j];
                }
            xp[i] = keep;
            double fd = (l[0] - l[1]) / (2 * h);
            cr_assert_float_eq(((double *)ct_tensor_data(dx))[i], fd, 1e-8);
        }
    }
}

Test(dropout, errors_name_op_and_operands)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3)), *mask;
        cr_assert_null(ct_kernel_dropout(x, 1.5, NULL, &mask));
        cr_assert_null(mask);
        ERROR_HAS("dropout", "p = 1.5", "f32[2, 3]");
        cr_assert_null(ct_kernel_dropout(x, -0.1, NULL, NULL));
        cr_assert_null(ct_kernel_dropout(x, NAN, NULL, NULL));
        ERROR_HAS("dropout", "nan");
        cr_assert_null(ct_kernel_dropout(ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2)), 0.5, NULL, NULL));
        ERROR_HAS("dropout", "i64[2]");
        ct_tensor *m = ct_tensor_zeros(CT_DTYPE_U8, CT_SHAPE(3, 2));
        cr_assert_null(ct_kernel_dropout_backward(x, m, 0.5));
        ERROR_HAS("dropout_backward", "u8[3, 2]", "f32[2, 3]");
        cr_assert_null(ct_kernel_dropout_backward(x, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3)), 0.5));
        ERROR_HAS("dropout_backward");
        cr_assert_null(ct_kernel_dropout_backward(x, ct_tensor_zeros(CT_DTYPE_U8, CT_SHAPE(2, 3)), 2));
        ERROR_HAS("dropout_backward", "p = 2");
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_kernel_dropout(NULL, 0.5, NULL, NULL));
        cr_assert_null(ct_kernel_dropout_backward(x, NULL, 0.5));
        cr_assert_str_eq(ct_last_error(), "earlier failure");
    }
}
