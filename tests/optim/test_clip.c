/* Tests for optim/clip.c: norms and clipping against hand computations and a plain
 * double loop; shard partials; layouts; determinism across thread counts. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "optim/clip.h"
#include "tests/optim/util.h"

/* A parameter of g's shape whose grad is a tensor holding vals. */
static ct_tensor *param_with_grad(ct_dtype dt, int ndim, const int64_t *shape, const double *vals)
{
    ct_tensor *p = ct_tensor_zeros(dt, ndim, shape);
    ct_tensor *g64 = ct_tensor_from_data(CT_DTYPE_F64, ndim, shape, vals);
    set_grad(p, ct_tensor_cast(g64, dt));
    return p;
}

static double grad_at(const ct_tensor *p, int64_t i)
{
    return p->grad->dtype == CT_DTYPE_F64 ? ((const double *)ct_tensor_data(p->grad))[i]
                                          : ((const float *)ct_tensor_data(p->grad))[i];
}

/* grads {3, 4} and {-12}: 2-norm 13, 1-norm 19, inf-norm 12, 3-norm (27 + 64 + 1728)^(1/3) */
Test(clip, norms_by_hand)
{
    CT_FRAME {
        for (int d = 0; d < 2; d++) {
            const ct_dtype dt = d ? CT_DTYPE_F64 : CT_DTYPE_F32;
            ct_tensor *p[3] = {param_with_grad(dt, CT_SHAPE(2), (const double[]){3, 4}),
                               ct_tensor_zeros(dt, CT_SHAPE(5)), /* no grad: skipped */
                               param_with_grad(dt, CT_SHAPE(1, 1), (const double[]){-12})};
            cr_assert_eq(ct_grad_norm(3, p, 2), 13);
            cr_assert_eq(ct_grad_norm(3, p, 1), 19);
            cr_assert_eq(ct_grad_norm(3, p, INFINITY), 12);
            cr_assert_float_eq(ct_grad_norm(3, p, 3), cbrt(1819), 1e-12);
            cr_assert_eq(ct_grad_norm_sq(3, p), 169);
            cr_assert_eq(ct_grad_norm(0, NULL, 2), 0);
            cr_assert_eq(ct_grad_norm(1, p + 1, INFINITY), 0);
        }
    }
}

Test(clip, clip_grad_norm_scales_only_above_max)
{
    CT_FRAME {
        for (int d = 0; d < 2; d++) {
            const ct_dtype dt = d ? CT_DTYPE_F64 : CT_DTYPE_F32;
            ct_tensor *p[2] = {param_with_grad(dt, CT_SHAPE(2), (const double[]){3, 4}),
                               param_with_grad(dt, CT_SHAPE(1), (const double[]){-12})};
            /* above: returns the pre-clip norm, scales by 6.5 / (13 + 1e-6) */
            cr_assert_eq(ct_clip_grad_norm(2, p, 6.5, 2), 13);
            const double c = 6.5 / (13 + 1e-6), tol = d ? 1e-15 : 1e-6;
            cr_assert_float_eq(grad_at(p[0], 0), 3 * c, tol);
            cr_assert_float_eq(grad_at(p[0], 1), 4 * c, tol);
            cr_assert_float_eq(grad_at(p[1], 0), -12 * c, tol);
            cr_assert_float_eq(ct_grad_norm(2, p, 2), 6.5, 1e-6);
            /* below (and exactly at) max: the bits stay */
            double before[3] = {grad_at(p[0], 0), grad_at(p[0], 1), grad_at(p[1], 0)};
            const double n1 = ct_clip_grad_norm(2, p, 100, 2);
            cr_assert_float_eq(n1, 6.5, 1e-6);
            cr_assert(grad_at(p[0], 0) == before[0] && grad_at(p[0], 1) == before[1] && grad_at(p[1], 0) == before[2]);
            /* inf-norm: max |g| = 12 -> scale by 3 / (12 + 1e-6) */
            ct_tensor *q = param_with_grad(dt, CT_SHAPE(3), (const double[]){1, -12, 5});
            cr_assert_eq(ct_clip_grad_norm(1, &q, 3, INFINITY), 12);
            cr_assert_float_eq(grad_at(q, 1), -12 * 3 / (12 + 1e-6), tol);
            cr_assert_float_eq(grad_at(q, 2), 5 * 3 / (12 + 1e-6), tol);
        }
    }
}

/* A NaN or inf gradient: the norm comes back non-finite and nothing is scaled. */
Test(clip, non_finite_norm_leaves_grads)
{
    CT_FRAME {
        ct_tensor *p[2] = {param_with_grad(CT_DTYPE_F32, CT_SHAPE(2), (const double[]){3, NAN}),
                           param_with_grad(CT_DTYPE_F32, CT_SHAPE(1), (const double[]){100})};
        cr_assert(isnan(ct_clip_grad_norm(2, p, 1, 2)));
        cr_assert(isnan(ct_clip_grad_norm(2, p, 1, INFINITY)), "a NaN must win over larger values in the max");
        cr_assert_eq(grad_at(p[0], 0), 3);
        cr_assert_eq(grad_at(p[1], 0), 100);
        ct_tensor *q = param_with_grad(CT_DTYPE_F64, CT_SHAPE(2), (const double[]){-INFINITY, 1});
        cr_assert(isinf(ct_clip_grad_norm(1, &q, 1, 2)));
        cr_assert_eq(grad_at(q, 1), 1);
        cr_assert_eq(ct_clip_coef(NAN, 1), 1);
        cr_assert_eq(ct_clip_coef(0.5, 1), 1);
        cr_assert_float_eq(ct_clip_coef(4, 1), 1 / (4 + 1e-6), 1e-16);
    }
}

/* Large random gradients (several blocks, threaded) against a plain double loop; the
 * 2-norm of a list equals the combination of its shards' partials; the same bits
 * with 1 and 4 threads; a strided gradient is scaled in place. */
Test(clip, large_grads_shards_threads_layouts)
{
    ct_set_seed(77);
    CT_FRAME {
        const int64_t shapes[4][2] = {{300, 257}, {1, 1}, {33, 1000}, {5, 3}};
        ct_tensor *p[4];
        double want_sq = 0, want_1 = 0, want_max = 0;
        for (int i = 0; i < 4; i++) {
            ct_dtype dt = i % 2 ? CT_DTYPE_F64 : CT_DTYPE_F32;
            p[i] = ct_tensor_zeros(dt, 2, shapes[i]);
            set_grad(p[i], ct_tensor_randn(dt, 2, shapes[i], 0, 1 + i));
            for (int64_t k = 0; k < ct_tensor_numel(p[i]); k++) {
                const double g = grad_at(p[i], k);
                want_sq += g * g, want_1 += fabs(g), want_max = fmax(want_max, fabs(g));
            }
        }
        cr_assert_float_eq(ct_grad_norm_sq(4, p) / want_sq, 1, 1e-12);
        cr_assert_float_eq(ct_grad_norm(4, p, 1) / want_1, 1, 1e-12);
        cr_assert_eq(ct_grad_norm(4, p, INFINITY), want_max);
        const double shards = ct_grad_norm_sq(1, p) + ct_grad_norm_sq(3, p + 1);
        cr_assert_float_eq(ct_grad_norm_from_partial(shards, 2) / sqrt(want_sq), 1, 1e-12);
        const double m1 = fmax(ct_grad_norm_partial(2, p, INFINITY), ct_grad_norm_partial(2, p + 2, INFINITY));
        cr_assert_eq(ct_grad_norm_from_partial(m1, INFINITY), want_max);

        ct_set_num_threads(1);
        const double n1 = ct_grad_norm_sq(4, p);
        ct_set_num_threads(4);
        const double n4 = ct_grad_norm_sq(4, p);
        ct_set_num_threads(0);
        cr_assert(n1 == n4, "norm depends on the thread count: %.17g vs %.17g", n1, n4);

        /* clipping to half the norm, with p[0]'s grad given as a transposed view */
        ct_tensor *gt = ct_tensor_transpose(ct_tensor_contiguous(ct_tensor_transpose(p[0]->grad, 0, 1)), 0, 1);
        cr_assert(!ct_tensor_is_contiguous(gt));
        ct_tensor *orig = ct_tensor_clone(p[0]->grad);
        set_grad(p[0], gt);
        const double total = ct_clip_grad_norm(4, p, sqrt(want_sq) / 2, 2);
        cr_assert_float_eq(total / sqrt(want_sq), 1, 1e-12);
        const double c = (float)(sqrt(want_sq) / 2 / (total + 1e-6));
        const float *o = ct_tensor_data(orig);
        for (int64_t k = 0; k < 300 * 257; k += 101) {
            const double got = ct_tensor_get(p[0]->grad, (const int64_t[]){k / 257, k % 257});
            cr_assert_eq(got, (double)(o[k] * (float)c), "element %ld", (long)k);
        }
        cr_assert_float_eq(ct_grad_norm(4, p, 2) / (sqrt(want_sq) / 2), 1, 1e-6);
    }
}

Test(clip, clip_grad_value)
{
    CT_FRAME {
        ct_tensor *p = param_with_grad(CT_DTYPE_F32, CT_SHAPE(6), (const double[]){-3, -0.5, 0, 0.25, 7, NAN});
        ct_tensor *q = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2)); /* no grad */
        ct_tensor *l[2] = {p, q};
        cr_assert_eq(ct_clip_grad_value(2, l, 0.5), CT_OK);
        const double want[5] = {-0.5, -0.5, 0, 0.25, 0.5};
        for (int i = 0; i < 5; i++) cr_assert_eq(grad_at(p, i), want[i], "element %d", i);
        cr_assert(isnan(grad_at(p, 5)));
        cr_assert_null(q->grad);
        cr_assert_neq(ct_clip_grad_value(1, &p, -1), CT_OK);
        ERROR_HAS("clip_value");
    }
}

Test(clip, bad_input)
{
    CT_FRAME {
        ct_tensor *p = param_with_grad(CT_DTYPE_F32, CT_SHAPE(2), (const double[]){1, 2});
        cr_assert(isnan(ct_clip_grad_norm(1, &p, -1, 2)));
        ERROR_HAS("max_norm");
        cr_assert(isnan(ct_clip_grad_norm(1, &p, 1, 0)));
        ERROR_HAS("norm_type");
        cr_assert(isnan(ct_clip_grad_norm(1, &p, 1, NAN)));
        ERROR_HAS("norm_type");
        cr_assert(isnan(ct_clip_grad_norm(-1, &p, 1, 2)));
        ERROR_HAS("n >= 0");
        cr_assert(isnan(ct_grad_norm_sq(2, NULL)));
        ct_tensor *l[2] = {p, NULL};
        cr_assert(isnan(ct_grad_norm(2, l, 2)));
        ERROR_HAS("parameter 1 is NULL");
        ct_tensor *h = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3));
        ct_tensor_set_name(h, "wte.weight");
        set_grad(h, ct_tensor_zeros(CT_DTYPE_BF16, CT_SHAPE(3)));
        cr_assert(isnan(ct_clip_grad_norm(1, &h, 1, 2)));
        ERROR_HAS("wte.weight");
        ERROR_HAS("bf16[3]");
        cr_assert_neq(ct_grad_scale(1, &p, NAN), CT_OK);
        ERROR_HAS("coef");
        cr_assert_eq(grad_at(p, 1), 2);
    }
}
