/* Tests for kernels/softmax.c and kernels/cpu/softmax.c: the references against
 * values worked out by hand and against finite differences, the fast kernels
 * against the references on odd shapes, dims, layouts and dtypes. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/softmax.h"
#include "kernels/softmax.h"
#include "tests/kernels/util.h"

typedef ct_status (*fwd_fn)(const ct_tensor *, ct_tensor *, int);
typedef ct_status (*bwd_fn)(const ct_tensor *, const ct_tensor *, ct_tensor *, int);

static ct_tensor *run_fwd(fwd_fn f, const ct_tensor *x, int dim)
{
    ct_tensor *y = ct_tensor_empty_like(x);
    cr_assert_eq(f(x, y, dim), CT_OK, "%s", ct_last_error());
    return y;
}

static ct_tensor *run_bwd(bwd_fn f, const ct_tensor *dy, const ct_tensor *y, int dim)
{
    ct_tensor *dx = ct_tensor_empty_like(y);
    cr_assert_eq(f(dy, y, dx, dim), CT_OK, "%s", ct_last_error());
    return dx;
}

Test(softmax, reference_matches_hand_values)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2, 3), (double[]){1, 2, 3, 0, 0, 0});
        /* e^k / (e + e^2 + e^3) and log of it; a constant row is uniform */
        const double sm[6] = {0.09003057317038046, 0.24472847105479767, 0.6652409557748219, 1. / 3, 1. / 3, 1. / 3};
        const double lsm[6] = {-2.4076059644443806, -1.4076059644443806, -0.4076059644443804,
                               -1.0986122886681098, -1.0986122886681098, -1.0986122886681098};
        ct_tensor *y = run_fwd(cti_cpu_softmax_ref, x, 1), *ly = run_fwd(cti_cpu_log_softmax_ref, x, 1);
        ct_tensor *yf = ct_kernel_softmax(x, -1), *lyf = ct_kernel_log_softmax(x, 1);
        for (int i = 0; i < 6; i++) {
            cr_assert_float_eq(((double *)ct_tensor_data(y))[i], sm[i], 1e-15);
            cr_assert_float_eq(((double *)ct_tensor_data(ly))[i], lsm[i], 1e-15);
            cr_assert_float_eq(((double *)ct_tensor_data(yf))[i], sm[i], 1e-15);
            cr_assert_float_eq(((double *)ct_tensor_data(lyf))[i], lsm[i], 1e-15);
        }
        /* over dim 0 the columns (1, 0), (2, 0), (3, 0): softmax = (e^k, 1) / (e^k + 1) */
        ct_tensor *c = ct_kernel_softmax(x, 0);
        for (int k = 1; k <= 3; k++) {
            cr_assert_float_eq(ct_tensor_get(c, (int64_t[]){0, k - 1}), exp(k) / (exp(k) + 1), 1e-15);
            cr_assert_float_eq(ct_tensor_get(c, (int64_t[]){1, k - 1}), 1 / (exp(k) + 1), 1e-15);
        }
        /* backward by hand: y = (.25, .75), dy = (1, 0): sum(dy*y) = .25, dx = y * (dy - .25) */
        ct_tensor *y2 = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), (double[]){0.25, 0.75});
        ct_tensor *dy2 = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), (double[]){1, 0});
        ct_tensor *dx2 = run_bwd(cti_cpu_softmax_backward_ref, dy2, y2, 0);
        cr_assert_float_eq(ct_tensor_get(dx2, (int64_t[]){0}), 0.25 * 0.75, 1e-15);
        cr_assert_float_eq(ct_tensor_get(dx2, (int64_t[]){1}), -0.75 * 0.25, 1e-15);
        /* log_softmax backward: dx = dy - exp(y) * sum(dy) with y = log(.25, .75), dy = (1, 1) */
        ct_tensor *ly2 = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), (double[]){log(0.25), log(0.75)});
        ct_tensor *ones = ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(2));
        ct_tensor *ldx2 = run_bwd(cti_cpu_log_softmax_backward_ref, ones, ly2, 0);
        cr_assert_float_eq(ct_tensor_get(ldx2, (int64_t[]){0}), 0.5, 1e-15);
        cr_assert_float_eq(ct_tensor_get(ldx2, (int64_t[]){1}), -0.5, 1e-15);
        /* 0-d: one element, probability 1 */
        ct_tensor *s = ct_kernel_softmax(ct_tensor_scalar(CT_DTYPE_F32, 3.5), -1);
        cr_assert_eq(s->ndim, 0);
        cr_assert_eq(ct_tensor_item(s), 1.0);
        cr_assert_eq(ct_tensor_item(ct_kernel_log_softmax(ct_tensor_scalar(CT_DTYPE_F32, 3.5), 0)), 0.0);
    }
}

/* fast (through ct_kernel_*) vs ref for all four ops on one input. */
static void check_fast_vs_ref(ct_tensor *x, int dim, const char *what)
{
    double tol = tol_for(x->dtype);
    int nd = dim < 0 ? dim + x->ndim : dim;
    ct_tensor *xc = ct_tensor_clone(x);
    ct_tensor *dy = ct_tensor_randn(x->dtype, x->ndim, x->shape, 0, 1);
    ct_tensor *y = ct_kernel_softmax(x, dim), *ly = ct_kernel_log_softmax(x, dim);
    cr_assert_not_null(y, "%s", ct_last_error());
    cr_assert_not_null(ly, "%s", ct_last_error());
    ct_tensor *yr = run_fwd(cti_cpu_softmax_ref, xc, nd), *lyr = run_fwd(cti_cpu_log_softmax_ref, xc, nd);
    cr_assert_leq(rel_err(y, yr), tol, "softmax %s: %g", what, rel_err(y, yr));
    cr_assert_leq(rel_err(ly, lyr), tol, "log_softmax %s: %g", what, rel_err(ly, lyr));
    ct_tensor *dx = ct_kernel_softmax_backward(dy, y, dim), *ldx = ct_kernel_log_softmax_backward(dy, ly, dim);
    ct_tensor *dxr = run_bwd(cti_cpu_softmax_backward_ref, dy, y, nd);
    ct_tensor *ldxr = run_bwd(cti_cpu_log_softmax_backward_ref, dy, ly, nd);
    cr_assert_leq(rel_err(dx, dxr), tol, "softmax_backward %s: %g", what, rel_err(dx, dxr));
    cr_assert_leq(rel_err(ldx, ldxr), tol, "log_softmax_backward %s: %g", what, rel_err(ldx, ldxr));
}

Test(softmax, fast_matches_reference_last_dim)
{
    ct_set_seed(1);
    const int64_t ns[] = {1, 7, 33}, cs[] = {1, 3, 17, 257};
    for (int d = 0; d < 4; d++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++) CT_FRAME {
                    char what[64];
                    snprintf(what, sizeof what, "%s N=%ld C=%ld", ct_dtype_name(float_dtypes[d]), (long)ns[a],
                             (long)cs[b]);
                    check_fast_vs_ref(ct_tensor_randn(float_dtypes[d], CT_SHAPE(ns[a], cs[b]), 0, 3), -1, what);
                }
}

Test(softmax, fast_matches_reference_other_dims)
{
    ct_set_seed(2);
    for (int d = 0; d < 4; d++) CT_FRAME {
            ct_dtype dt = float_dtypes[d];
            ct_tensor *x = ct_tensor_randn(dt, CT_SHAPE(3, 17, 5), 0, 2);
            check_fast_vs_ref(x, 0, "(3,17,5) dim 0");
            check_fast_vs_ref(x, 1, "(3,17,5) dim 1");
            check_fast_vs_ref(x, -2, "(3,17,5) dim -2");
            /* inner = 300 spans two column blocks */
            check_fast_vs_ref(ct_tensor_randn(dt, CT_SHAPE(2, 7, 300), 0, 2), 1, "(2,7,300) dim 1");
            check_fast_vs_ref(ct_tensor_randn(dt, CT_SHAPE(1, 33, 1), 0, 2), 1, "(1,33,1) dim 1");
        }
}

Test(softmax, non_contiguous_inputs)
{
    ct_set_seed(3);
    for (int d = 0; d < 4; d++) CT_FRAME {
            ct_dtype dt = float_dtypes[d];
            ct_tensor *base = ct_tensor_randn(dt, CT_SHAPE(17, 33), 0, 2);
            ct_tensor *t = ct_tensor_transpose(base, 0, 1);
            cr_assert(!ct_tensor_is_contiguous(t));
            check_fast_vs_ref(t, -1, "transposed");
            check_fast_vs_ref(t, 0, "transposed dim 0");
            ct_tensor *s = ct_tensor_slice(base, 1, 1, 33, 3);
            cr_assert(!ct_tensor_is_contiguous(s));
            check_fast_vs_ref(s, 1, "sliced step 3");
            /* the result equals softmax of the contiguous copy, bit for bit */
            ct_tensor *a = ct_kernel_softmax(s, 1), *b = ct_kernel_softmax(ct_tensor_clone(s), 1);
            cr_assert(same_bits(a, b));
        }
}

Test(softmax, extreme_logits_are_stable)
{
    /* exact answers: with z = 1 + e^-1, softmax = (1/z, 0, e^-1/z, 0) */
    const double z = 1 + exp(-1), l = log1p(exp(-1));
    const double sm[4] = {1 / z, 0, exp(-1) / z, 0};
    const double lsm[4] = {-l, -2e4 - l, -1 - l, -1e4 - l};
    const ct_dtype dts[2] = {CT_DTYPE_F32, CT_DTYPE_F64};
    for (int d = 0; d < 2; d++) CT_FRAME {
            ct_tensor *x = ct_tensor_cast(
                ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1, 4), (double[]){1e4, -1e4, 1e4 - 1, 0}), dts[d]);
            ct_tensor *y = ct_kernel_softmax(x, 1), *ly = ct_kernel_log_softmax(x, 1);
            for (int i = 0; i < 4; i++) {
                double v = ct_tensor_get(y, (int64_t[]){0, i}), lv = ct_tensor_get(ly, (int64_t[]){0, i});
                cr_assert(isfinite(v) && isfinite(lv));
                cr_assert_float_eq(v, sm[i], 1e-7);
                cr_assert_float_eq(lv, lsm[i], 1e-7 * fabs(lsm[i]) + 1e-7, "%d: %.9g vs %.9g", i, lv, lsm[i]);
            }
            ct_tensor *dy = ct_tensor_ones(dts[d], CT_SHAPE(1, 4));
            ct_tensor *dx = ct_kernel_log_softmax_backward(dy, ly, 1);
            for (int i = 0; i < 4; i++) cr_assert_float_eq(ct_tensor_get(dx, (int64_t[]){0, i}), 1 - 4 * sm[i], 1e-6);
        }
    CT_FRAME {
        /* whole rows of +-1e4 in every dtype, over the last and a middle dim */
        for (int d = 0; d < 4; d++) {
            ct_tensor *x = ct_tensor_randn(float_dtypes[d], CT_SHAPE(5, 9, 3), 0, 1e4);
            for (int dim = 1; dim <= 2; dim++) {
                cr_assert(all_finite(ct_kernel_softmax(x, dim)) && all_finite(ct_kernel_log_softmax(x, dim)));
            }
        }
    }
}

Test(softmax, vector_exp_accuracy_and_edges)
{
    /* every f32 from -87 to 88 in steps of ~1e-3, through the 8-lane and the scalar path */
    double worst = 0;
    for (int64_t k = 0; k < 175000; k += 8) {
        float in[8], out[8];
        for (int j = 0; j < 8; j++) in[j] = -87.0f + (float)(k + j) * 1e-3f;
        cti_cpu_exp_sub_f32(in, (const float[8]){0}, out, 8);
        for (int j = 0; j < 8; j++) {
            double ref = exp((double)in[j]), rel = fabs(out[j] - ref) / ref;
            worst = rel > worst ? rel : worst;
            cr_assert_eq(out[j], cti_cpu_expf(in[j]), "lanes and scalar tail agree at %g", in[j]);
        }
    }
    cr_assert_leq(worst, 2.5e-7, "max relative error %g (about 4 ulp)", worst);
    const float edge_in[8] = {-INFINITY, INFINITY, NAN, -1e30f, 0.0f, -100.0f, 100.0f, -0.0f};
    float out[8];
    cti_cpu_exp_sub_f32(edge_in, (const float[8]){0}, out, 8);
    cr_assert(out[0] == 0 && !signbit(out[0]));
    cr_assert(isinf(out[1]) && out[1] > 0);
    cr_assert(isnan(out[2]));
    cr_assert(out[3] == 0, "below the subnormals: +0");
    cr_assert(fabs(out[5] - exp(-100.0)) <= 0x1p-149, "a subnormal result within one subnormal step: %a", out[5]);
    cr_assert(out[4] == 1 && out[7] == 1);
    cr_assert(isinf(out[6]));
    for (int j = 0; j < 8; j++) {
        float e = cti_cpu_expf(edge_in[j]);
        cr_assert(isnan(e) ? isnan(out[j]) : e == out[j], "%d", j); /* NaN payloads may differ */
    }
}

Test(softmax, masked_and_nan_rows)
{
    CT_FRAME {
        for (int d = 0; d < 2; d++) {
            ct_dtype dt = d ? CT_DTYPE_F64 : CT_DTYPE_F32;
            /* -inf entries (an attention mask) get probability 0; the rest is a softmax of its own */
            double row[11] = {0.5, -INFINITY, 1.5, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 2.5, -INFINITY};
            ct_tensor *x = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1, 11), row), dt);
            double *y = f64_data(ct_kernel_softmax(x, 1)), *ly = f64_data(ct_kernel_log_softmax(x, 1));
            double z = exp(0.5) + exp(1.5) + exp(2.5);
            for (int i = 0; i < 11; i++) {
                double expect = isinf(row[i]) ? 0 : exp(row[i]) / z;
                cr_assert_float_eq(y[i], expect, 1e-7);
                if (isinf(row[i])) cr_assert(isinf(ly[i]) && ly[i] < 0);
                else cr_assert_float_eq(ly[i], row[i] - log(z), 1e-6);
            }
            /* a NaN poisons its row only */
            ct_tensor *xn = ct_tensor_zeros(dt, CT_SHAPE(2, 9));
            ct_tensor_set(xn, (int64_t[]){0, 4}, NAN);
            double *yn = f64_data(ct_kernel_softmax(xn, 1));
            for (int i = 0; i < 9; i++) {
                cr_assert(isnan(yn[i]));
                cr_assert_float_eq(yn[9 + i], 1.0 / 9, 1e-7);
            }
        }
    }
}

/* Central differences in f64 of L(x) = sum(dy * f(x)) against the backward kernel. */
static void check_gradient(bool lg, int64_t a, int64_t b, int64_t c, int dim)
{
    ct_tensor *x = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(a, b, c), 0, 1.5);
    ct_tensor *dy = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(a, b, c), 0, 1);
    ct_tensor *y = lg ? ct_kernel_log_softmax(x, dim) : ct_kernel_softmax(x, dim);
    ct_tensor *dx = lg ? ct_kernel_log_softmax_backward(dy, y, dim) : ct_kernel_softmax_backward(dy, y, dim);
    ct_tensor *dxr = run_bwd(lg ? cti_cpu_log_softmax_backward_ref : cti_cpu_softmax_backward_ref, dy, y, dim);
    double *xp = ct_tensor_data(x), h = 1e-5;
    for (int64_t i = 0; i < ct_tensor_numel(x); i++) {
        double keep = xp[i], lp, lm;
        CT_FRAME {
            xp[i] = keep + h;
            lp = dot(dy, lg ? ct_kernel_log_softmax(x, dim) : ct_kernel_softmax(x, dim));
            xp[i] = keep - h;
            lm = dot(dy, lg ? ct_kernel_log_softmax(x, dim) : ct_kernel_softmax(x, dim));
            xp[i] = keep;
        }
        double fd = (lp - lm) / (2 * h);
        cr_assert_float_eq(((double *)ct_tensor_data(dx))[i], fd, 1e-8, "%s dx[%ld] %.12g vs fd %.12g",
                           lg ? "log_softmax" : "softmax", (long)i, ((double *)ct_tensor_data(dx))[i], fd);
        cr_assert_float_eq(((double *)ct_tensor_data(dxr))[i], fd, 1e-8);
    }
}

Test(softmax, backward_matches_finite_differences)
{
    ct_set_seed(4);
    CT_FRAME {
        for (int lg = 0; lg < 2; lg++) {
            check_gradient(lg, 3, 2, 7, 2); /* rows */
            check_gradient(lg, 2, 5, 3, 1); /* columns */
            check_gradient(lg, 4, 1, 3, 0);
        }
    }
}

Test(softmax, same_bits_for_any_thread_count)
{
    ct_set_seed(5);
    CT_FRAME {
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(64, 1031), 0, 3);
        ct_tensor *xt = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(8, 129, 300), 0, 3);
        ct_tensor *r[2][2];
        const int threads[2] = {1, 4};
        for (int k = 0; k < 2; k++) {
            ct_set_num_threads(threads[k]);
            r[k][0] = ct_kernel_log_softmax(x, -1);
            r[k][1] = ct_kernel_softmax(xt, 1);
        }
        ct_set_num_threads(0);
        for (int j = 0; j < 2; j++)
            cr_assert(same_bits(r[0][j], r[1][j]));
    }
}

Test(softmax, empty_tensors)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(0, 5));
        ct_tensor *y = ct_kernel_softmax(x, 1);
        cr_assert_not_null(y);
        cr_assert_eq(ct_tensor_numel(y), 0);
        cr_assert_not_null(ct_kernel_log_softmax_backward(y, y, 0));
    }
}

Test(softmax, errors_name_op_and_operands)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3));
        ct_tensor *i = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2, 3));
        cr_assert_null(ct_kernel_softmax(i, 1));
        ERROR_HAS("softmax", "i64[2, 3]");
        cr_assert_null(ct_kernel_log_softmax(x, 2));
        ERROR_HAS("log_softmax", "dim 2", "f32[2, 3]");
        cr_assert_null(ct_kernel_softmax(x, -3));
        ct_tensor *dy = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3, 2));
        cr_assert_null(ct_kernel_softmax_backward(dy, x, 1));
        ERROR_HAS("softmax_backward", "f32[3, 2]", "f32[2, 3]");
        ct_tensor *dy64 = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2, 3));
        cr_assert_null(ct_kernel_log_softmax_backward(dy64, x, 1));
        ERROR_HAS("log_softmax_backward", "f64[2, 3]");
        /* NULL input: NULL result, the earlier message kept */
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_kernel_softmax(NULL, 0));
        cr_assert_null(ct_kernel_softmax_backward(NULL, x, 0));
        cr_assert_str_eq(ct_last_error(), "earlier failure");
    }
}
