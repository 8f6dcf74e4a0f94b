/* Tests for the fp8 linear (autograd/ops_fp8.c): forward and backward against f64
 * products of the reference-quantised operands (ct_fp8_quantize_ref), both weight
 * layouts, the delayed scales of a second step, 16-bit weights against the same
 * values in f32, ct_linear choosing it in an fp8 scope
 * for parameters only, and a small regression that trains in fp8 as well as in f32. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "autograd/autocast_cast.h"
#include "autograd/autograd.h"
#include "core/convert.h"
#include "core/frame.h"
#include "autograd/node.h"
#include "optim/optimizer.h"

static void setup(void)
{
    ct_frame_push();
    ct_autocast_reset_rules();
}

static void teardown(void)
{
    while (ct_autocast_depth() > 0) ct_autocast_end();
    ct_autocast_set_default(CT_DTYPE_F32);
    ct_autocast_clear_cache();
    ct_frame_pop();
}

TestSuite(autograd_fp8_linear, .init = setup, .fini = teardown);

static double at(const ct_tensor *t, int64_t i)
{
    return ct_scalar_load(t->dtype, (const char *)ct_tensor_data(t) + i * (int64_t)ct_dtype_size(t->dtype));
}

/* the real values an fp8 tensor stands for, (r, c) f64 row-major */
static double *dequant(const ct_tensor *q, int64_t r, int64_t c)
{
    double *d = malloc((size_t)(r * c) * sizeof *d);
    for (int64_t i = 0; i < r * c; i++) d[i] = at(q, i) / q->scale;
    return d;
}

static void expect_close(const ct_tensor *got, const double *want, int64_t n, double tol, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        double g = at(got, i);
        cr_expect(fabs(g - want[i]) <= tol * fmax(1.0, fabs(want[i])), "%s[%ld]: %.9g, want %.9g", what, (long)i, g,
                  want[i]);
    }
}

/* One forward + backward of ct_fp8_linear outside any scope (f32 output) against the
 * f64 reference with the scales the state hands out now. */
static void check_step(ct_fp8_state *st, ct_tensor *x, ct_tensor *w, ct_tensor *b, bool trans_w, ct_tensor *gy)
{
    int64_t M = x->shape[0], in = x->shape[1], out = trans_w ? w->shape[0] : w->shape[1];
    ct_fp8_use u;
    cr_assert_eq(ct_fp8_state_use(st, w, &u), CT_OK);
    float xs = u.x_scale, gs = u.g_scale;
    ct_tensor *wt = trans_w ? ct_tensor_transpose(w, 0, 1) : w; /* (in, out) */
    double *qx = dequant(ct_fp8_quantize_ref(x, CT_DTYPE_F8_E4M3, xs, NULL), M, in);
    double *qw = dequant(ct_fp8_quantize_ref(wt, CT_DTYPE_F8_E4M3, u.wq->scale, NULL), in, out);
    double *qg = dequant(ct_fp8_quantize_ref(gy, CT_DTYPE_F8_E5M2, gs, NULL), M, out);
    double *y = calloc((size_t)(M * out), sizeof *y), *dx = calloc((size_t)(M * in), sizeof *dx);
    double *dw = calloc((size_t)(in * out), sizeof *dw), *db = calloc((size_t)out, sizeof *db);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < out; j++) {
            y[i * out + j] = at(b, j);
            for (int64_t k = 0; k < in; k++) y[i * out + j] += qx[i * in + k] * qw[k * out + j];
            db[j] += at(gy, i * out + j);
            for (int64_t k = 0; k < in; k++) {
                dx[i * in + k] += qg[i * out + j] * qw[k * out + j];
                dw[k * out + j] += qx[i * in + k] * qg[i * out + j];
            }
        }
    ct_tensor_zero_grad(x);
    ct_tensor_zero_grad(w);
    ct_tensor_zero_grad(b);
    ct_tensor *got = ct_fp8_linear(st, x, w, b, trans_w);
    cr_assert_not_null(got, "%s", ct_last_error());
    cr_expect_eq(got->dtype, CT_DTYPE_F32);
    expect_close(got, y, M * out, 1e-5, "y");
    cr_assert_eq(ct_backward_with(got, gy, NULL), CT_OK, "%s", ct_last_error());
    expect_close(x->grad, dx, M * in, 1e-5, "dx");
    expect_close(b->grad, db, out, 1e-5, "db");
    /* dw in w's own layout */
    double *dwl = dw;
    if (trans_w) {
        dwl = malloc((size_t)(in * out) * sizeof *dwl);
        for (int64_t k = 0; k < in; k++)
            for (int64_t j = 0; j < out; j++) dwl[j * in + k] = dw[k * out + j];
    }
    expect_close(w->grad, dwl, in * out, 1e-5, "dw");
    if (dwl != dw) free(dwl);
    free(qx), free(qw), free(qg), free(y), free(dx), free(dw), free(db);
}

static ct_tensor *leaf(ct_tensor *t)
{
    ct_tensor_set_requires_grad(t, true);
    return t;
}

Test(autograd_fp8_linear, forward_and_backward_match_the_quantised_reference)
{
    for (int t = 0; t < 2; t++) {
        ct_fp8_state *st = ct_fp8_state_new(NULL);
        ct_tensor *x = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(9, 20), 0, 2));
        ct_tensor *w = leaf(t ? ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(7, 20), 0, 0.5)
                              : ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(20, 7), 0, 0.5));
        ct_tensor *b = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(7), 0, 1));
        ct_tensor *gy = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(9, 7), 0, 1e-3);
        check_step(st, x, w, b, t == 1, gy); /* scales 1 */
        float amax[3];
        ct_fp8_state_amax_get(st, amax);
        cr_expect_gt(amax[0], 1.0f);
        cr_expect_gt(amax[2], 0.0f);
        ct_fp8_state_step(st);
        ct_autocast_weights_changed();
        cr_expect_eq(ct_fp8_state_meta(st, 0, 0)->scale, (float)(448.0 / amax[0]));
        cr_expect_eq(ct_fp8_state_meta(st, 0, 2)->scale, (float)(57344.0 / amax[2]));
        check_step(st, x, w, b, t == 1, gy); /* the delayed scales of step 2 */
        ct_fp8_state_free(st);
    }
}

Test(autograd_fp8_linear, ct_linear_goes_fp8_for_parameters_in_an_fp8_scope)
{
    ct_fp8_state *st = ct_fp8_state_new(NULL);
    ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(2, 3, 8), 0, 1);
    ct_tensor *w = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(8, 5), 0, 1));
    ct_tensor *plain = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(8, 5), 0, 1); /* not a parameter */
    ct_tensor *y = NULL, *z = NULL, *v = NULL;
    cr_assert_eq(ct_autocast_begin_fp8(st), CT_OK);
    y = ct_linear(x, w, NULL);
    z = ct_linear(x, plain, NULL);
    ct_autocast_end();
    CT_AUTOCAST(CT_DTYPE_BF16) v = ct_linear(x, w, NULL); /* a plain bf16 scope: no fp8 */
    cr_assert(y && z && v, "%s", ct_last_error());
    cr_expect_str_eq(ct_node_op(y->grad_fn), "fp8_linear");
    cr_expect_eq(y->dtype, CT_DTYPE_BF16);
    cr_expect_eq(y->ndim, 3);
    cr_expect_eq(y->shape[2], 5);
    cr_expect_null(z->grad_fn);
    cr_expect_eq(z->dtype, CT_DTYPE_BF16);
    cr_expect_str_neq(ct_node_op(v->grad_fn), "fp8_linear");
    cr_expect_eq(ct_fp8_state_weights(st), 1);
    /* under the low rule the fp8 scope computes linears in bf16 */
    cr_assert_eq(ct_autocast_set_rule(CT_AC_LINEAR, CT_AC_LOW), CT_OK);
    cr_assert_eq(ct_autocast_begin_fp8(st), CT_OK);
    ct_tensor *l = ct_linear(x, w, NULL);
    ct_autocast_end();
    cr_assert_not_null(l);
    cr_expect_str_neq(ct_node_op(l->grad_fn), "fp8_linear");
    ct_fp8_state_free(st);
}

/* 16-bit weights (sharded mixed precision keeps the model's parameters in bf16 or
 * f16): the same values in f32 give the same y and dx, and dw, db are the f32 ones
 * rounded to the weight's dtype. */
Test(autograd_fp8_linear, sixteen_bit_weights_match_their_f32_values)
{
    const ct_dtype dts[] = {CT_DTYPE_BF16, CT_DTYPE_F16};
    for (int t = 0; t < 4; t++) {
        const ct_dtype dt = dts[t / 2];
        const bool trans_w = t % 2;
        ct_fp8_state *s16 = ct_fp8_state_new(NULL), *s32 = ct_fp8_state_new(NULL);
        ct_tensor *x0 = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(9, 20), 0, 2);
        ct_tensor *w16 = leaf(ct_tensor_cast(trans_w ? ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(7, 20), 0, 0.5)
                                                     : ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(20, 7), 0, 0.5),
                                             dt));
        ct_tensor *b16 = leaf(ct_tensor_cast(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(7), 0, 1), dt));
        ct_tensor *w32 = leaf(ct_tensor_cast(w16, CT_DTYPE_F32)), *b32 = leaf(ct_tensor_cast(b16, CT_DTYPE_F32));
        ct_tensor *x16 = leaf(ct_tensor_clone(x0)), *x32 = leaf(ct_tensor_clone(x0));
        ct_tensor *gy = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(9, 7), 0, 1e-3);
        ct_tensor *y16 = ct_fp8_linear(s16, x16, w16, b16, trans_w);
        ct_tensor *y32 = ct_fp8_linear(s32, x32, w32, b32, trans_w);
        cr_assert(y16 && y32, "%s", ct_last_error());
        cr_assert_eq(ct_backward_with(y16, gy, NULL), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_backward_with(y32, gy, NULL), CT_OK, "%s", ct_last_error());
        cr_expect_eq(w16->grad->dtype, dt);
        cr_expect_eq(b16->grad->dtype, dt);
        ct_tensor *dw = ct_tensor_cast(w32->grad, dt), *db = ct_tensor_cast(b32->grad, dt);
        for (int64_t i = 0; i < ct_tensor_numel(y16); i++) cr_expect_eq(at(y16, i), at(y32, i), "y[%ld]", (long)i);
        for (int64_t i = 0; i < ct_tensor_numel(x0); i++)
            cr_expect_eq(at(x16->grad, i), at(x32->grad, i), "dx[%ld]", (long)i);
        for (int64_t i = 0; i < ct_tensor_numel(dw); i++) cr_expect_eq(at(w16->grad, i), at(dw, i), "dw[%ld]", (long)i);
        for (int64_t i = 0; i < 7; i++) cr_expect_eq(at(b16->grad, i), at(db, i), "db[%ld]", (long)i);
        ct_fp8_state_free(s16);
        ct_fp8_state_free(s32);
    }
}

Test(autograd_fp8_linear, bad_operands_name_the_shapes)
{
    ct_fp8_state *st = ct_fp8_state_new(NULL);
    ct_tensor *x = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 8));
    cr_expect_null(ct_fp8_linear(st, x, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(7, 5)), NULL, false));
    cr_expect(strstr(ct_last_error(), "fp8_linear: x f32[2, 8]") && strstr(ct_last_error(), "w f32[7, 5]"), "%s",
              ct_last_error());
    cr_expect_null(ct_fp8_linear(st, x, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(8, 5)),
                                 ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4)), false));
    cr_expect(strstr(ct_last_error(), "b f32[4]") != NULL, "%s", ct_last_error());
    cr_expect_null(ct_fp8_linear(st, x, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(8, 5)), NULL, true));
    cr_expect(strstr(ct_last_error(), "(transposed)") != NULL, "%s", ct_last_error());
    cr_expect_null(ct_fp8_linear(NULL, x, x, NULL, false));
    cr_expect_eq(ct_fp8_state_weights(st), 0);
    ct_fp8_state_free(st);
}

/* y = x @ w_true + noise, fitted by a two-layer net with AdamW: the fp8 run ends
 * near the f32 run. */
static double fit(bool fp8)
{
    ct_frame_push();
    ct_set_seed(7);
    ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(64, 16), 0, 1);
    ct_tensor *wt = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(16, 4), 0, 1);
    ct_tensor *target = ct_tensor_contiguous(ct_matmul(x, wt));
    ct_tensor *w1 = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(16, 32), 0, 0.25));
    ct_tensor *w2 = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(32, 4), 0, 0.18));
    ct_tensor_retain(target);
    ct_tensor *params[] = {w1, w2};
    ct_optimizer *opt = ct_adamw_new(2, params, &(ct_adamw_config){.lr = 1e-2});
    ct_fp8_state *st = fp8 ? ct_fp8_state_new(&(ct_fp8_recipe){.amax_history_len = 16}) : NULL;
    double loss = 0;
    for (int step = 0; step < 150; step++) {
        ct_frame_push();
        if (st) ct_autocast_begin_fp8(st);
        ct_tensor *h = ct_gelu(ct_linear(x, w1, NULL));
        ct_tensor *p = ct_cast(ct_linear(h, w2, NULL), CT_DTYPE_F32);
        ct_tensor *d = ct_sub(p, target);
        ct_tensor *l = ct_mean_all(ct_mul(d, d));
        if (st) ct_autocast_end();
        cr_assert_not_null(l, "%s", ct_last_error());
        loss = at(l, 0);
        ct_optimizer_zero_grad(opt);
        cr_assert_eq(ct_backward(l), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_step(opt), CT_OK);
        if (st) ct_fp8_state_step(st);
        ct_frame_pop();
    }
    ct_optimizer_free(opt);
    ct_fp8_state_free(st);
    ct_tensor_release(target);
    ct_frame_pop();
    return loss;
}

Test(autograd_fp8_linear, a_small_regression_trains_in_fp8_as_in_f32)
{
    double f32 = fit(false), fp8 = fit(true);
    cr_expect_lt(f32, 0.5, "f32 fit: loss %g", f32);
    cr_expect_lt(fp8, 0.5, "fp8 fit: loss %g", fp8);
    cr_expect_lt(fabs(fp8 - f32), 0.25 * f32 + 0.05, "fp8 %g against f32 %g", fp8, f32);
}
