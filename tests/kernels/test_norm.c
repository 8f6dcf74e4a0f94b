/* Tests for kernels/norm.c and kernels/cpu/norm.c: the references against values
 * worked out by hand and against finite differences, the fast kernels against
 * the references on odd shapes, layouts and dtypes. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/norm.h"
#include "kernels/norm.h"
#include "tests/kernels/util.h"

static ct_dtype stat_dt(ct_dtype dt) { return dt == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32; }

/* Runs the ref forward on contiguous copies; outputs in the current frame. */
static void ref_forward(bool rms, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps,
                        ct_tensor **y, ct_tensor **mean, ct_tensor **rstd)
{
    *y = ct_tensor_empty_like(x);
    *mean = ct_tensor_empty(stat_dt(x->dtype), x->ndim - 1, x->shape);
    *rstd = ct_tensor_empty(stat_dt(x->dtype), x->ndim - 1, x->shape);
    const ct_tensor *wc = w ? ct_tensor_clone(w) : NULL, *bc = b ? ct_tensor_clone(b) : NULL;
    ct_status st = rms ? cti_cpu_rmsnorm_ref(ct_tensor_clone(x), wc, eps, *y, *rstd)
                       : cti_cpu_layernorm_ref(ct_tensor_clone(x), wc, bc, eps, *y, *mean, *rstd);
    cr_assert_eq(st, CT_OK);
}

Test(norm, reference_matches_hand_values)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1, 4), (double[]){1, 2, 3, 4});
        ct_tensor *w = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(4), (double[]){1, 2, 1, 2});
        ct_tensor *b = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(4), (double[]){0, 1, 0, 1});
        /* mean 2.5, var (2.25 + .25 + .25 + 2.25) / 4 = 1.25 */
        const double r = 1 / sqrt(1.25), xh[4] = {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r};
        ct_tensor *y, *mean, *rstd;
        ref_forward(false, x, w, b, 0, &y, &mean, &rstd);
        cr_assert_float_eq(ct_tensor_item(mean), 2.5, 1e-15);
        cr_assert_float_eq(ct_tensor_item(rstd), r, 1e-15);
        const double wv[4] = {1, 2, 1, 2}, bv[4] = {0, 1, 0, 1};
        for (int i = 0; i < 4; i++)
            cr_assert_float_eq(((double *)ct_tensor_data(y))[i], xh[i] * wv[i] + bv[i], 1e-15);
        ct_tensor *yf, *mf, *rf;
        cr_assert_eq(ct_kernel_layernorm(x, w, b, 0, &yf, &mf, &rf), CT_OK);
        cr_assert_lt(rel_err(yf, y), 1e-15);
        /* rmsnorm: mean(x^2) = 30 / 4 */
        ref_forward(true, x, NULL, NULL, 0, &y, &mean, &rstd);
        cr_assert_float_eq(ct_tensor_item(rstd), 1 / sqrt(7.5), 1e-15);
        for (int i = 0; i < 4; i++)
            cr_assert_float_eq(((double *)ct_tensor_data(y))[i], (i + 1) / sqrt(7.5), 1e-15);
        /* eps enters under the root: var 0 gives y = 0 and rstd = 1 / sqrt(eps) */
        ct_tensor *c = ct_tensor_full(CT_DTYPE_F64, CT_SHAPE(2, 3), 7);
        cr_assert_eq(ct_kernel_layernorm(c, NULL, NULL, 0.25, &yf, NULL, &rf), CT_OK);
        cr_assert_eq(ct_tensor_get(rf, (int64_t[]){1}), 2.0);
        cr_assert_eq(ct_tensor_get(yf, (int64_t[]){1, 2}), 0.0);
        /* backward by hand, C = 2, rmsnorm without w, x = (3, 4), eps = 0: rstd = 1 / sqrt(12.5),
         * d/dx of sum(dy * x * rstd) with dy = (1, 0) is rstd * ((1, 0) - x * x0 * rstd^2 / 2) */
        ct_tensor *x2 = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), (double[]){3, 4});
        ct_tensor *dy2 = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), (double[]){1, 0});
        ct_tensor *r2 = ct_tensor_scalar(CT_DTYPE_F64, 1 / sqrt(12.5)), *dx2 = ct_tensor_empty_like(x2);
        cr_assert_eq(cti_cpu_rmsnorm_backward_ref(dy2, x2, NULL, r2, dx2, NULL), CT_OK);
        const double rs = 1 / sqrt(12.5);
        cr_assert_float_eq(ct_tensor_get(dx2, (int64_t[]){0}), rs * (1 - 9 * rs * rs / 2), 1e-15);
        cr_assert_float_eq(ct_tensor_get(dx2, (int64_t[]){1}), rs * (0 - 12 * rs * rs / 2), 1e-15);
    }
}

/* fast (through ct_kernel_*) vs ref, forward and backward, for one configuration. */
static void check_fast_vs_ref(bool rms, ct_tensor *x, ct_tensor *w, ct_tensor *b, const char *what)
{
    double tol = tol_for_f64(x->dtype, 1e-10), eps = 1e-5;
    ct_tensor *y, *mean = NULL, *rstd, *yr, *meanr, *rstdr;
    ct_status st = rms ? ct_kernel_rmsnorm(x, w, eps, &y, &rstd) : ct_kernel_layernorm(x, w, b, eps, &y, &mean, &rstd);
    cr_assert_eq(st, CT_OK, "%s", ct_last_error());
    ref_forward(rms, x, w, b, eps, &yr, &meanr, &rstdr);
    cr_assert_leq(rel_err(y, yr), tol, "%s y: %g", what, rel_err(y, yr));
    cr_assert_leq(rel_err(rstd, rstdr), 1e-6, "%s rstd: %g", what, rel_err(rstd, rstdr));
    if (!rms) cr_assert_leq(rel_err(mean, meanr), 1e-6, "%s mean: %g", what, rel_err(mean, meanr));

    ct_tensor *dy = ct_tensor_randn(x->dtype, x->ndim, x->shape, 0, 1);
    ct_tensor *dx, *dw = NULL, *db = NULL;
    st = rms ? ct_kernel_rmsnorm_backward(dy, x, w, rstd, &dx, &dw)
             : ct_kernel_layernorm_backward(dy, x, w, mean, rstd, &dx, &dw, b ? &db : NULL);
    cr_assert_eq(st, CT_OK, "%s", ct_last_error());
    cr_assert_eq(dw != NULL, w != NULL);
    cr_assert_eq(db != NULL, !rms && b != NULL);
    ct_tensor *dxr = ct_tensor_empty_like(x), *dwr = w ? ct_tensor_empty_like(w) : NULL;
    ct_tensor *dbr = db ? ct_tensor_empty_like(db) : NULL;
    ct_tensor *dyc = ct_tensor_clone(dy), *xc = ct_tensor_clone(x), *wc = w ? ct_tensor_clone(w) : NULL;
    st = rms ? cti_cpu_rmsnorm_backward_ref(dyc, xc, wc, rstd, dxr, dwr)
             : cti_cpu_layernorm_backward_ref(dyc, xc, wc, mean, rstd, dxr, dwr, dbr);
    cr_assert_eq(st, CT_OK);
    cr_assert_leq(rel_err(dx, dxr), tol, "%s dx: %g", what, rel_err(dx, dxr));
    if (w) cr_assert_leq(rel_err(dw, dwr), tol, "%s dw: %g", what, rel_err(dw, dwr));
    if (db) cr_assert_leq(rel_err(db, dbr), tol, "%s db: %g", what, rel_err(db, dbr));
}

Test(norm, fast_matches_reference)
{
    ct_set_seed(11);
    const int64_t ns[] = {1, 7, 33}, cs[] = {1, 3, 17, 257};
    for (int d = 0; d < 4; d++)
        for (int a = 0; a < 3; a++)
            for (int c = 0; c < 4; c++) CT_FRAME {
                    ct_dtype dt = float_dtypes[d];
                    char what[80];
                    snprintf(what, sizeof what, "%s N=%ld C=%ld", ct_dtype_name(dt), (long)ns[a], (long)cs[c]);
                    ct_tensor *x = ct_tensor_randn(dt, CT_SHAPE(ns[a], cs[c]), 0.5, 2);
                    ct_tensor *w = ct_tensor_randn(dt, CT_SHAPE(cs[c]), 1, 0.5);
                    ct_tensor *b = ct_tensor_randn(dt, CT_SHAPE(cs[c]), 0, 0.5);
                    for (int rms = 0; rms < 2; rms++) {
                        check_fast_vs_ref(rms, x, w, b, what);
                        check_fast_vs_ref(rms, x, w, NULL, what);
                        check_fast_vs_ref(rms, x, NULL, NULL, what);
                    }
                }
}

Test(norm, mixed_dtypes_batched_and_non_contiguous)
{
    ct_set_seed(12);
    CT_FRAME {
        /* bf16 activations with f32 parameters; f64 x with f32 parameters */
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_BF16, CT_SHAPE(2, 3, 17), 0, 1);
        ct_tensor *w = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(17), 1, 0.5);
        ct_tensor *b = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(17), 0, 0.5);
        for (int rms = 0; rms < 2; rms++) {
            check_fast_vs_ref(rms, x, w, b, "bf16 x, f32 w b");
            check_fast_vs_ref(rms, ct_tensor_cast(x, CT_DTYPE_F64), w, b, "f64 x, f32 w b");
        }
        ct_tensor *y, *rstd;
        cr_assert_eq(ct_kernel_rmsnorm(x, w, 1e-5, &y, &rstd), CT_OK);
        cr_assert_eq(y->dtype, CT_DTYPE_BF16);
        cr_assert_eq(rstd->dtype, CT_DTYPE_F32);
        cr_assert_eq(rstd->ndim, 2);
        /* transposed and step-sliced x, strided w */
        for (int d = 0; d < 4; d++) {
            ct_tensor *base = ct_tensor_randn(float_dtypes[d], CT_SHAPE(19, 9), 0, 1);
            ct_tensor *xt = ct_tensor_transpose(base, 0, 1), *xs = ct_tensor_slice(base, 0, 0, 19, 2);
            ct_tensor *wt = ct_tensor_slice(ct_tensor_randn(float_dtypes[d], CT_SHAPE(38), 1, 0.3), 0, 0, 38, 2);
            ct_tensor *bs = ct_tensor_slice(ct_tensor_randn(float_dtypes[d], CT_SHAPE(9), 0, 0.3), 0, 0, 9, 1);
            for (int rms = 0; rms < 2; rms++) {
                check_fast_vs_ref(rms, xt, wt, ct_tensor_randn(float_dtypes[d], CT_SHAPE(19), 0, 1), "transposed");
                check_fast_vs_ref(rms, xs, ct_tensor_randn(float_dtypes[d], CT_SHAPE(9), 0, 1), bs, "sliced");
            }
        }
    }
}

Test(norm, variance_is_stable_far_from_zero)
{
    ct_set_seed(13);
    CT_FRAME {
        /* x = 1e4 + N(0, 1): E[x^2] - E[x]^2 in f32 would lose every digit of the variance */
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(7, 513), 1e4, 1);
        ct_tensor *y, *mean, *rstd, *yr, *meanr, *rstdr;
        cr_assert_eq(ct_kernel_layernorm(x, NULL, NULL, 0, &y, &mean, &rstd), CT_OK);
        ref_forward(false, x, NULL, NULL, 0, &yr, &meanr, &rstdr);
        cr_assert_leq(rel_err(rstd, rstdr), 1e-6, "%g", rel_err(rstd, rstdr));
        cr_assert_leq(rel_err(y, yr), 1e-6, "%g", rel_err(y, yr));
        /* and the ref agrees with the spread we drew: rstd close to 1 */
        for (int i = 0; i < 7; i++) cr_assert_float_eq(ct_tensor_get(rstdr, (int64_t[]){i}), 1.0, 0.1);
    }
}

/* Central differences in f64 of L = sum(dy * y(x, w, b)) for x, w and b. */
static void check_gradient(bool rms, bool with_w, bool with_b, int ndim, const int64_t *shape)
{
    const double eps = 1e-3, h = 1e-6;
    int64_t C = shape[ndim - 1];
    ct_tensor *x = ct_tensor_randn(CT_DTYPE_F64, ndim, shape, 0.3, 1);
    ct_tensor *dy = ct_tensor_randn(CT_DTYPE_F64, ndim, shape, 0, 1);
    ct_tensor *w = with_w ? ct_tensor_randn(CT_DTYPE_F64, 1, &C, 1, 0.5) : NULL;
    ct_tensor *b = with_b && !rms ? ct_tensor_randn(CT_DTYPE_F64, 1, &C, 0, 0.5) : NULL;
    ct_tensor *y, *mean = NULL, *rstd, *dx, *dw, *db = NULL;
    if (rms) {
        cr_assert_eq(ct_kernel_rmsnorm(x, w, eps, &y, &rstd), CT_OK);
        cr_assert_eq(ct_kernel_rmsnorm_backward(dy, x, w, rstd, &dx, &dw), CT_OK);
    } else {
        cr_assert_eq(ct_kernel_layernorm(x, w, b, eps, &y, &mean, &rstd), CT_OK);
        cr_assert_eq(ct_kernel_layernorm_backward(dy, x, w, mean, rstd, &dx, &dw, &db), CT_OK);
    }
    ct_tensor *params[3] = {x, w, b}, *grads[3] = {dx, dw, db};
    for (int p = 0; p < 3; p++) {
        if (!params[p]) continue;
        double *v = ct_tensor_data(params[p]), *g = ct_tensor_data(grads[p]);
        for (int64_t i = 0; i < ct_tensor_numel(params[p]); i++) {
            double keep = v[i], lp, lm;
            CT_FRAME {
                ct_tensor *yy;
                v[i] = keep + h;
                cr_assert_eq(rms ? ct_kernel_rmsnorm(x, w, eps, &yy, NULL)
                                 : ct_kernel_layernorm(x, w, b, eps, &yy, NULL, NULL), CT_OK);
                lp = dot(dy, yy);
                v[i] = keep - h;
                cr_assert_eq(rms ? ct_kernel_rmsnorm(x, w, eps, &yy, NULL)
                                 : ct_kernel_layernorm(x, w, b, eps, &yy, NULL, NULL), CT_OK);
                lm = dot(dy, yy);
                v[i] = keep;
            }
            double fd = (lp - lm) / (2 * h);
            cr_assert_float_eq(g[i], fd, 1e-7 * (1 + fabs(fd)), "%s grad %d[%ld]: %.12g vs fd %.12g",
                               rms ? "rmsnorm" : "layernorm", p, (long)i, g[i], fd);
        }
    }
    if (!rms && !with_b) {
        /* db is the sum of dy over rows whether or not b was used */
        double *d = ct_tensor_data(db), *dyp = ct_tensor_data(dy);
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t r = 0; r < ct_tensor_numel(dy) / C; r++) s += dyp[r * C + c];
            cr_assert_float_eq(d[c], s, 1e-12);
        }
    }
}

Test(norm, backward_matches_finite_differences)
{
    ct_set_seed(14);
    CT_FRAME {
        for (int rms = 0; rms < 2; rms++) {
            check_gradient(rms, true, true, CT_SHAPE(3, 5));
            check_gradient(rms, true, false, CT_SHAPE(2, 3, 4));
            check_gradient(rms, false, false, CT_SHAPE(4, 7));
            check_gradient(rms, true, true, CT_SHAPE(2, 1));
        }
    }
}

Test(norm, same_bits_for_any_thread_count)
{
    ct_set_seed(15);
    CT_FRAME {
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(300, 257), 0, 1);
        ct_tensor *dy = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(300, 257), 0, 1);
        ct_tensor *w = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(257), 1, 0.1);
        ct_tensor *out[2][4];
        const int threads[2] = {1, 4};
        for (int k = 0; k < 2; k++) {
            ct_tensor *mean, *rstd;
            ct_set_num_threads(threads[k]);
            cr_assert_eq(ct_kernel_layernorm(x, w, w, 1e-5, &out[k][0], &mean, &rstd), CT_OK);
            cr_assert_eq(ct_kernel_layernorm_backward(dy, x, w, mean, rstd, &out[k][1], &out[k][2], &out[k][3]),
                         CT_OK);
        }
        ct_set_num_threads(0);
        for (int j = 0; j < 4; j++)
            cr_assert(same_bits(out[0][j], out[1][j]), "output %d", j);
    }
}

Test(norm, optional_outputs_and_empty_inputs)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(4, 6), 0, 1), *y, *rstd, *dx, *dw;
        cr_assert_eq(ct_kernel_layernorm(x, NULL, NULL, 1e-5, &y, NULL, &rstd), CT_OK);
        cr_assert_not_null(y);
        ct_tensor *w = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(6));
        ct_tensor *r;
        cr_assert_eq(ct_kernel_rmsnorm(x, w, 1e-5, &y, &r), CT_OK);
        dw = x; /* set to NULL when not wanted */
        cr_assert_eq(ct_kernel_rmsnorm_backward(x, x, NULL, r, &dx, &dw), CT_OK);
        cr_assert_null(dw);
        cr_assert_eq(ct_kernel_rmsnorm_backward(x, x, w, r, NULL, &dw), CT_OK);
        cr_assert_not_null(dw);
        /* no rows: empty outputs, and dw is an empty sum (zeros) */
        ct_tensor *e = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(0, 6)), *mean;
        cr_assert_eq(ct_kernel_layernorm(e, w, w, 1e-5, &y, &mean, &rstd), CT_OK);
        cr_assert_eq(ct_tensor_numel(y), 0);
        ct_tensor *db;
        cr_assert_eq(ct_kernel_layernorm_backward(e, e, w, mean, rstd, &dx, &dw, &db), CT_OK);
        for (int i = 0; i < 6; i++) {
            cr_assert_eq(ct_tensor_get(dw, (int64_t[]){i}), 0.0);
            cr_assert_eq(ct_tensor_get(db, (int64_t[]){i}), 0.0);
        }
    }
}

Test(norm, errors_name_op_and_operands)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3)), *y, *mean, *rstd, *dx;
        ct_tensor *w4 = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(4));
        cr_assert_neq(ct_kernel_layernorm(x, w4, NULL, 1e-5, &y, &mean, &rstd), CT_OK);
        cr_assert_null(y);
        ERROR_HAS("layernorm", "f32[4]", "f32[2, 3]");
        cr_assert_neq(ct_kernel_rmsnorm(ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(2, 3)), NULL, 1e-5, &y, NULL), CT_OK);
        ERROR_HAS("rmsnorm", "i32[2, 3]");
        cr_assert_neq(ct_kernel_rmsnorm(x, NULL, -1, &y, NULL), CT_OK);
        ERROR_HAS("rmsnorm", "eps");
        cr_assert_neq(ct_kernel_layernorm(ct_tensor_scalar(CT_DTYPE_F32, 1), NULL, NULL, 0, &y, NULL, NULL), CT_OK);
        ERROR_HAS("layernorm");
        cr_assert_neq(ct_kernel_layernorm(x, NULL, NULL, 0, NULL, NULL, NULL), CT_OK);
        ERROR_HAS("layernorm", "y");

        cr_assert_eq(ct_kernel_layernorm(x, NULL, NULL, 1e-5, &y, &mean, &rstd), CT_OK);
        ct_tensor *dy = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3, 2));
        cr_assert_neq(ct_kernel_layernorm_backward(dy, x, NULL, mean, rstd, &dx, NULL, NULL), CT_OK);
        ERROR_HAS("layernorm_backward", "f32[3, 2]", "f32[2, 3]");
        ct_tensor *bad_stat = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3));
        cr_assert_neq(ct_kernel_layernorm_backward(x, x, NULL, bad_stat, rstd, &dx, NULL, NULL), CT_OK);
        ERROR_HAS("mean", "f32[3]");
        ct_tensor *stat64 = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2));
        cr_assert_neq(ct_kernel_rmsnorm_backward(x, x, NULL, stat64, &dx, NULL), CT_OK);
        ERROR_HAS("rmsnorm_backward", "f64[2]");
        /* NULL input: the earlier message is kept */
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_neq(ct_kernel_layernorm(NULL, NULL, NULL, 0, &y, NULL, NULL), CT_OK);
        cr_assert_neq(ct_kernel_rmsnorm_backward(x, x, NULL, NULL, &dx, NULL), CT_OK);
        cr_assert_str_eq(ct_last_error(), "earlier failure");
    }
}
