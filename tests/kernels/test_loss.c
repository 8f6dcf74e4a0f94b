/* Tests for kernels/loss.c and kernels/cpu/loss.c: the references against
 * -log softmax[target] worked out by hand and against finite differences, the
 * fast kernels against the references on odd shapes, dtypes and ignored rows. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/loss.h"
#include "kernels/loss.h"
#include "tests/kernels/util.h"

#define IGNORE (-100)
#define IGNORED_SHARE 0.25 /* random targets: about a quarter ignored, or none (0) */

static ct_tensor *ref_loss(const ct_tensor *logits, const ct_tensor *targets, ct_tensor **lse)
{
    ct_tensor *loss = ct_tensor_empty(logits->dtype, 0, logits->shape);
    *lse = ct_tensor_empty(logits->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32, targets->ndim, targets->shape);
    cr_assert_eq(cti_cpu_cross_entropy_ref(ct_tensor_clone(logits), ct_tensor_clone(targets), IGNORE, loss, *lse), CT_OK);
    return loss;
}

static ct_tensor *ref_grad(const ct_tensor *dloss, const ct_tensor *logits, const ct_tensor *targets)
{
    ct_tensor *d = ct_tensor_empty(logits->dtype, logits->ndim, logits->shape);
    cr_assert_eq(
        cti_cpu_cross_entropy_backward_ref(dloss, ct_tensor_clone(logits), ct_tensor_clone(targets), NULL, IGNORE, d),
        CT_OK);
    return d;
}

Test(loss, reference_matches_hand_values)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2, 3), (double[]){1, 2, 3, 0, 0, 0});
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2), (int64_t[]){2, 0});
        /* -log softmax: row 0 target 2: log(e + e^2 + e^3) - 3; row 1: log 3 */
        const double l0 = 0.4076059644443804, l1 = 1.0986122886681098, lse0 = 3.4076059644443806;
        ct_tensor *lse, *loss = ref_loss(x, t, &lse);
        cr_assert_float_eq(ct_tensor_item(loss), (l0 + l1) / 2, 1e-15);
        cr_assert_float_eq(ct_tensor_get(lse, (int64_t[]){0}), lse0, 1e-15);
        cr_assert_float_eq(ct_tensor_get(lse, (int64_t[]){1}), l1, 1e-15);
        ct_tensor *lf, *fast = ct_kernel_cross_entropy(x, t, IGNORE, &lf);
        cr_assert_float_eq(ct_tensor_item(fast), (l0 + l1) / 2, 1e-15);
        cr_assert_lt(rel_err(lf, lse), 1e-15);

        /* row 1 ignored: the mean is over row 0 only */
        ct_tensor *ti = ct_tensor_from_data(CT_DTYPE_I32, CT_SHAPE(2), (int32_t[]){2, IGNORE});
        cr_assert_float_eq(ct_tensor_item(ct_kernel_cross_entropy(x, ti, IGNORE, NULL)), l0, 1e-15);
        cr_assert_float_eq(ct_tensor_item(ref_loss(x, ti, &lse)), l0, 1e-15);
        /* ignore_index may be a valid class */
        cr_assert_float_eq(ct_tensor_item(ct_kernel_cross_entropy(x, t, 0, NULL)), l0, 1e-15);
        /* nothing counted: NaN, like PyTorch */
        ct_tensor *none = ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(2), IGNORE);
        cr_assert(isnan(ct_tensor_item(ct_kernel_cross_entropy(x, none, IGNORE, NULL))));

        /* backward by hand, dloss = 2, count = 2: row r gets (softmax - onehot) * 1 */
        const double p0[3] = {0.09003057317038046, 0.24472847105479767, 0.6652409557748219};
        ct_tensor *dloss = ct_tensor_scalar(CT_DTYPE_F64, 2);
        ct_tensor *g = ref_grad(dloss, x, t), *gf = ct_kernel_cross_entropy_backward(dloss, x, t, lf, IGNORE);
        for (int v = 0; v < 3; v++) {
            double e0 = p0[v] - (v == 2), e1 = 1.0 / 3 - (v == 0);
            cr_assert_float_eq(ct_tensor_get(g, (int64_t[]){0, v}), e0, 1e-15);
            cr_assert_float_eq(ct_tensor_get(g, (int64_t[]){1, v}), e1, 1e-15);
            cr_assert_float_eq(ct_tensor_get(gf, (int64_t[]){0, v}), e0, 1e-15);
            cr_assert_float_eq(ct_tensor_get(gf, (int64_t[]){1, v}), e1, 1e-15);
        }
        /* ignored row: zeros, and the scale is dloss / 1 */
        ct_tensor *gi = ct_kernel_cross_entropy_backward(dloss, x, ti, lf, IGNORE);
        for (int v = 0; v < 3; v++) {
            cr_assert_float_eq(ct_tensor_get(gi, (int64_t[]){0, v}), 2 * (p0[v] - (v == 2)), 1e-15);
            cr_assert_eq(ct_tensor_get(gi, (int64_t[]){1, v}), 0.0);
        }
        /* all ignored: zeros, not NaN */
        ct_tensor *gn = ct_kernel_cross_entropy_backward(dloss, x, none, lf, IGNORE);
        for (int i = 0; i < 6; i++) cr_assert_eq(((double *)ct_tensor_data(gn))[i], 0.0);
    }
}

static void check_fast_vs_ref(ct_tensor *x, ct_tensor *t, const char *what)
{
    double tol = tol_for(x->dtype);
    ct_tensor *lse, *lser;
    ct_tensor *loss = ct_kernel_cross_entropy(x, t, IGNORE, &lse);
    cr_assert_not_null(loss, "%s: %s", what, ct_last_error());
    ct_tensor *lossr = ref_loss(x, t, &lser);
    cr_assert_eq(loss->dtype, x->dtype);
    cr_assert_eq(lse->dtype, x->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32);
    if (isnan(ct_tensor_item(lossr))) /* every target ignored */
        cr_assert(isnan(ct_tensor_item(loss)), "%s", what);
    else
        cr_assert_leq(rel_err(loss, lossr), tol, "%s loss: %g", what, rel_err(loss, lossr));
    cr_assert_leq(rel_err(lse, lser), x->dtype == CT_DTYPE_F64 ? 1e-12 : 1e-6, "%s lse", what);
    ct_tensor *dloss = ct_tensor_scalar(CT_DTYPE_F32, 1.7);
    ct_tensor *d = ct_kernel_cross_entropy_backward(dloss, x, t, lse, IGNORE);
    cr_assert_not_null(d, "%s: %s", what, ct_last_error());
    ct_tensor *dr = ref_grad(dloss, x, t);
    cr_assert_leq(rel_err(d, dr), tol, "%s dlogits: %g", what, rel_err(d, dr));
}

Test(loss, fast_matches_reference)
{
    ct_set_seed(21);
    const int64_t ns[] = {1, 7, 33}, vs[] = {1, 3, 17, 257};
    for (int d = 0; d < 4; d++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++) CT_FRAME {
                    ct_dtype dt = float_dtypes[d];
                    char what[80];
                    snprintf(what, sizeof what, "%s N=%ld V=%ld", ct_dtype_name(dt), (long)ns[a], (long)vs[b]);
                    ct_tensor *x = ct_tensor_randn(dt, CT_SHAPE(ns[a], vs[b]), 0, 3);
                    check_fast_vs_ref(x, random_ids(CT_DTYPE_I64, CT_SHAPE(ns[a]), vs[b], 0, 0, IGNORE), what);
                    ct_tensor *t = random_ids(CT_DTYPE_I32, CT_SHAPE(ns[a]), vs[b], 0, IGNORED_SHARE, IGNORE);
                    check_fast_vs_ref(x, t, what);
                }
}

Test(loss, batched_and_non_contiguous)
{
    ct_set_seed(22);
    for (int d = 0; d < 4; d++) CT_FRAME {
            ct_dtype dt = float_dtypes[d];
            /* (B, T, V) logits with (B, T) targets */
            check_fast_vs_ref(ct_tensor_randn(dt, CT_SHAPE(2, 5, 129), 0, 2),
                              random_ids(CT_DTYPE_I64, CT_SHAPE(2, 5), 129, 0, IGNORED_SHARE, IGNORE), "(2,5,129)");
            /* logits stored (V, N) and transposed; targets a strided slice */
            ct_tensor *x = ct_tensor_transpose(ct_tensor_randn(dt, CT_SHAPE(65, 9), 0, 2), 0, 1);
            ct_tensor *t18 = random_ids(CT_DTYPE_I32, CT_SHAPE(18), 65, 0, IGNORED_SHARE, IGNORE);
            ct_tensor *t = ct_tensor_slice(t18, 0, 0, 18, 2);
            cr_assert(!ct_tensor_is_contiguous(x) && !ct_tensor_is_contiguous(t));
            check_fast_vs_ref(x, t, "transposed");
        }
}

Test(loss, extreme_logits_are_stable)
{
    /* row (1e4, -1e4, 1e4 - 1, 0), l = log(1 + e^-1): -log softmax = (l, 2e4 + l, 1 + l, 1e4 + l) */
    const double l = log1p(exp(-1)), z = 1 + exp(-1);
    const double nll[4] = {l, 2e4 + l, 1 + l, 1e4 + l}, p[4] = {1 / z, 0, exp(-1) / z, 0};
    for (int d = 0; d < 2; d++) CT_FRAME {
            ct_dtype dt = d ? CT_DTYPE_F64 : CT_DTYPE_F32;
            double row[4] = {1e4, -1e4, 1e4 - 1, 0}, data[16];
            for (int i = 0; i < 16; i++) data[i] = row[i % 4];
            ct_tensor *x = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(4, 4), data), dt);
            ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(4), (int64_t[]){0, 1, 2, 3});
            ct_tensor *lse, *loss = ct_kernel_cross_entropy(x, t, IGNORE, &lse);
            double expect = (nll[0] + nll[1] + nll[2] + nll[3]) / 4;
            cr_assert(isfinite(ct_tensor_item(loss)));
            cr_assert_float_eq(ct_tensor_item(loss), expect, 1e-7 * expect);
            for (int k = 0; k < 4; k++) {
                /* each row alone: exact -log softmax[target] */
                ct_tensor *tk = ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(4), IGNORE);
                ct_tensor_set(tk, (int64_t[]){k}, k);
                double lk = ct_tensor_item(ct_kernel_cross_entropy(x, tk, IGNORE, NULL));
                cr_assert_float_eq(lk, nll[k], 1e-7 * nll[k], "target %d: %.10g vs %.10g", k, lk, nll[k]);
            }
            ct_tensor *g = ct_kernel_cross_entropy_backward(ct_tensor_scalar(dt, 4), x, t, lse, IGNORE);
            for (int r = 0; r < 4; r++)
                for (int v = 0; v < 4; v++) {
                    double gv = ct_tensor_get(g, (int64_t[]){r, v});
                    cr_assert(isfinite(gv));
                    cr_assert_float_eq(gv, p[v] - (v == r), 1e-6, "(%d, %d): %.9g", r, v, gv);
                }
        }
    CT_FRAME {
        for (int d = 0; d < 4; d++) {
            ct_tensor *x = ct_tensor_randn(float_dtypes[d], CT_SHAPE(9, 33), 0, 1e4);
            ct_tensor *t = random_ids(CT_DTYPE_I64, CT_SHAPE(9), 33, 0, IGNORED_SHARE, IGNORE), *lse;
            ct_tensor *loss = ct_kernel_cross_entropy(x, t, IGNORE, &lse);
            cr_assert(isfinite(ct_tensor_item(loss)));
            ct_tensor *g = ct_kernel_cross_entropy_backward(ct_tensor_scalar(CT_DTYPE_F32, 1), x, t, lse, IGNORE);
            cr_assert(all_finite(g));
        }
    }
}

Test(loss, backward_matches_finite_differences)
{
    ct_set_seed(23);
    CT_FRAME {
        const double h = 1e-6, dl = 0.7;
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(5, 7), 0, 2);
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(5), (int64_t[]){3, IGNORE, 0, 6, 3});
        ct_tensor *lse;
        cr_assert_not_null(ct_kernel_cross_entropy(x, t, IGNORE, &lse));
        ct_tensor *dloss = ct_tensor_scalar(CT_DTYPE_F64, dl);
        ct_tensor *g = ct_kernel_cross_entropy_backward(dloss, x, t, lse, IGNORE), *gr = ref_grad(dloss, x, t);
        double *xp = ct_tensor_data(x);
        for (int64_t i = 0; i < 35; i++) {
            double keep = xp[i], lp, lm;
            CT_FRAME {
                xp[i] = keep + h;
                lp = dl * ct_tensor_item(ct_kernel_cross_entropy(x, t, IGNORE, NULL));
                xp[i] = keep - h;
                lm = dl * ct_tensor_item(ct_kernel_cross_entropy(x, t, IGNORE, NULL));
                xp[i] = keep;
            }
            double fd = (lp - lm) / (2 * h);
            cr_assert_float_eq(((double *)ct_tensor_data(g))[i], fd, 1e-8, "[%ld] %.12g vs %.12g", (long)i,
                               ((double *)ct_tensor_data(g))[i], fd);
            cr_assert_float_eq(((double *)ct_tensor_data(gr))[i], fd, 1e-8);
        }
    }
}

Test(loss, same_bits_for_any_thread_count)
{
    ct_set_seed(24);
    CT_FRAME {
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_BF16, CT_SHAPE(64, 1031), 0, 3);
        ct_tensor *t = random_ids(CT_DTYPE_I64, CT_SHAPE(64), 1031, 0, IGNORED_SHARE, IGNORE);
        ct_tensor *loss[2], *g[2];
        const int threads[2] = {1, 4};
        for (int k = 0; k < 2; k++) {
            ct_tensor *lse;
            ct_set_num_threads(threads[k]);
            loss[k] = ct_kernel_cross_entropy(x, t, IGNORE, &lse);
            g[k] = ct_kernel_cross_entropy_backward(ct_tensor_scalar(CT_DTYPE_F32, 1), x, t, lse, IGNORE);
        }
        ct_set_num_threads(0);
        cr_assert(same_bits(loss[0], loss[1]));
        cr_assert(same_bits(g[0], g[1]));
    }
}

Test(loss, errors_name_op_position_and_value)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3, 5)), *lse;
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(3), (int64_t[]){1, 7, 2});
        cr_assert_null(ct_kernel_cross_entropy(x, t, IGNORE, &lse));
        cr_assert_null(lse);
        ERROR_HAS("cross_entropy", "target 7", "position [1]", "V = 5");
        ct_tensor *tn = ct_tensor_from_data(CT_DTYPE_I32, CT_SHAPE(3), (int32_t[]){1, 2, -1});
        cr_assert_null(ct_kernel_cross_entropy(x, tn, IGNORE, NULL));
        ERROR_HAS("target -1", "position [2]");
        ct_tensor *ok = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(3), (int64_t[]){1, 2, 3});
        cr_assert_not_null(ct_kernel_cross_entropy(x, ok, IGNORE, &lse));
        ct_tensor *one = ct_tensor_scalar(CT_DTYPE_F32, 1);
        cr_assert_null(ct_kernel_cross_entropy_backward(one, x, t, lse, IGNORE));
        ERROR_HAS("cross_entropy_backward", "target 7");
        /* multi-dim position */
        ct_tensor *x3 = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 2, 4));
        ct_tensor *t3 = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 2), (int64_t[]){0, 1, 2, 4});
        cr_assert_null(ct_kernel_cross_entropy(x3, t3, IGNORE, NULL));
        ERROR_HAS("position [1, 1]", "V = 4");
        /* shapes and dtypes */
        ct_tensor *t4 = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(4));
        cr_assert_null(ct_kernel_cross_entropy(x, t4, IGNORE, NULL));
        ERROR_HAS("cross_entropy", "i64[4]", "f32[3, 5]");
        cr_assert_null(ct_kernel_cross_entropy(x, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3)), IGNORE, NULL));
        ERROR_HAS("targets f32[3]");
        cr_assert_null(ct_kernel_cross_entropy(ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(3, 5)), ok, IGNORE, NULL));
        ERROR_HAS("logits", "i32[3, 5]");
        cr_assert_null(ct_kernel_cross_entropy_backward(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2)), x, ok, lse, IGNORE));
        ERROR_HAS("dloss", "f32[2]");
        cr_assert_null(ct_kernel_cross_entropy_backward(one, x, ok, ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(3)), IGNORE));
        ERROR_HAS("lse f64[3]");
        /* NULL input: the earlier message is kept */
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_kernel_cross_entropy(NULL, ok, IGNORE, NULL));
        cr_assert_null(ct_kernel_cross_entropy_backward(one, x, ok, NULL, IGNORE));
        cr_assert_str_eq(ct_last_error(), "earlier failure");
    }
}
