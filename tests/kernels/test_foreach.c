/* Tests for the gradient-list kernels (kernels/foreach.h) on the CPU: the blocked
 * norm partial against the plain loop, every norm kind, scale and clamp against
 * their definitions, unscale's inf/NaN flag, and the argument errors. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "ctrain.h"
#include "kernels/cpu/foreach.h"

static ct_tensor *rand_t(ct_dtype dt, int64_t n, uint64_t seed)
{
    ct_rng r;
    ct_rng_init(&r, seed);
    ct_tensor *f = ct_tensor_empty(CT_DTYPE_F64, 1, &n);
    ct_rng_uniform_f64(&r, ct_tensor_data(f), n, -3, 3);
    return dt == CT_DTYPE_F64 ? f : ct_tensor_cast(f, dt);
}

Test(foreach, norm_partial_matches_the_plain_loop)
{
    static const double ps[] = {2, 1, 3.5, INFINITY};
    static const int kinds[] = {0, 1, 2, 3};
    static const int64_t sizes[] = {1, 7, 8192, 8193, 100003};
    CT_FRAME {
        for (int d = 0; d < 2; d++)
            for (size_t s = 0; s < 5; s++)
                for (int k = 0; k < 4; k++) {
                    ct_tensor *x = rand_t(d ? CT_DTYPE_F64 : CT_DTYPE_F32, sizes[s], 7 + s);
                    double fast, ref;
                    cr_assert_eq(ct_kernel_norm_partial(x, ps[k], &fast), CT_OK, "%s", ct_last_error());
                    cr_assert_eq(cti_cpu_norm_partial_ref(x, kinds[k], ps[k], &ref), CT_OK);
                    cr_assert(fabs(fast - ref) <= 1e-12 * fabs(ref), "p %g, n %lld: %.17g vs %.17g", ps[k],
                              (long long)sizes[s], fast, ref);
                }
    }
}

Test(foreach, norm_partial_keeps_nan_for_max)
{
    CT_FRAME {
        ct_tensor *x = rand_t(CT_DTYPE_F32, 20000, 3);
        ((float *)ct_tensor_data(x))[12345] = NAN;
        double v;
        cr_assert_eq(ct_kernel_norm_partial(x, INFINITY, &v), CT_OK);
        cr_assert(isnan(v));
        cr_assert_eq(ct_kernel_norm_partial(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(0)), 2, &v), CT_OK);
        cr_assert_eq(v, 0.0);
    }
}

Test(foreach, scale_clamp_and_unscale)
{
    CT_FRAME {
        ct_tensor *x = rand_t(CT_DTYPE_F32, 1000, 5), *c = ct_tensor_clone(x);
        cr_assert_eq(ct_kernel_scale_(x, 0.37), CT_OK);
        for (int i = 0; i < 1000; i++)
            cr_assert_eq(((float *)ct_tensor_data(x))[i], ((float *)ct_tensor_data(c))[i] * 0.37f);
        cr_assert_eq(ct_kernel_clamp_abs_(x, 0.5), CT_OK);
        for (int i = 0; i < 1000; i++) cr_assert_leq(fabsf(((float *)ct_tensor_data(x))[i]), 0.5f);
        ct_tensor *g[3] = {rand_t(CT_DTYPE_F32, 100, 1), NULL, rand_t(CT_DTYPE_F32, 70000, 2)};
        bool inf = true;
        cr_assert_eq(ct_kernel_unscale_(3, g, 0.25f, &inf), CT_OK);
        cr_assert_not(inf);
        ((float *)ct_tensor_data(g[2]))[65000] = 1e38f;
        cr_assert_eq(ct_kernel_unscale_(3, g, 1e10f, &inf), CT_OK);
        cr_assert(inf, "1e38 * 1e10 overflows f32");
    }
}

Test(foreach, bad_arguments_are_named)
{
    CT_FRAME {
        double v;
        ct_tensor *h = ct_tensor_zeros(CT_DTYPE_F16, CT_SHAPE(4));
        cr_assert_eq(ct_kernel_norm_partial(h, 2, &v), CT_ERR_INVALID);
        cr_assert(strstr(ct_last_error(), "norm_partial") && strstr(ct_last_error(), "f16[4]"), "%s", ct_last_error());
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4, 4));
        cr_assert_eq(ct_kernel_scale_(ct_tensor_transpose(x, 0, 1), 2), CT_ERR_INVALID, "not contiguous");
        cr_assert_eq(ct_kernel_norm_partial(x, -1, &v), CT_ERR_INVALID);
        cr_assert_eq(ct_kernel_clamp_abs_(x, -1), CT_ERR_INVALID);
        bool inf;
        ct_tensor *d = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2));
        cr_assert_eq(ct_kernel_unscale_(1, &d, 1, &inf), CT_ERR_INVALID, "unscale takes f32 only");
    }
}
