/* Tests for precision/loss_scaler.c: the scale's growth and backoff against a
 * sequence worked out by hand, hysteresis, the bounds, unscaling (values, inf/NaN
 * detection, once per step), bad settings, and an f16 training loop whose first
 * steps overflow: they are skipped, the scale backs off, and training then recovers. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "core/philox.h"
#include "kernels/matmul.h"
#include "optim/optimizer.h"
#include "precision/autocast.h"
#include "precision/loss_scaler.h"

static void frame_in(void) { ct_frame_push(); }
static void frame_out(void)
{
    while (ct_autocast_depth() > 0) ct_autocast_end();
    ct_autocast_set_default(CT_DTYPE_F32);
    ct_frame_pop();
}
TestSuite(precision_loss_scaler, .init = frame_in, .fini = frame_out);

Test(precision_loss_scaler, defaults)
{
    ct_loss_scaler s;
    cr_assert_eq(ct_loss_scaler_init(&s, NULL), CT_OK);
    cr_expect_eq(ct_loss_scaler_scale(&s), 65536.0);
    for (int i = 0; i < 1999; i++) cr_expect_not(ct_loss_scaler_update(&s, false));
    cr_expect_eq(s.scale, 65536.0);
    ct_loss_scaler_update(&s, false); /* the 2000th clean step */
    cr_expect_eq(s.scale, 131072.0);
    cr_expect(ct_loss_scaler_update(&s, true));
    cr_expect(ct_loss_scaler_step_was_skipped(&s));
    cr_expect_eq(s.scale, 65536.0);
}

Test(precision_loss_scaler, growth_and_backoff_by_hand)
{
    ct_loss_scaler s;
    cr_assert_eq(ct_loss_scaler_init(&s, &(ct_loss_scaler_config){.init_scale = 8, .growth_interval = 3}), CT_OK);
    /* step:         1  2  3   4     5  6  7     8  9  10 */
    bool inf[] = {0, 0, 0, 1, 0, 0, 1, 0, 0, 0};
    double want[] = {8, 8, 16, 8, 8, 8, 4, 4, 4, 8};
    for (int i = 0; i < 10; i++) {
        bool skip = ct_loss_scaler_update(&s, inf[i]);
        cr_expect_eq(skip, inf[i], "step %d", i + 1);
        cr_expect_eq(s.scale, want[i], "step %d: scale %g, want %g", i + 1, s.scale, want[i]);
    }
    cr_expect_eq(s.steps, 10);
    cr_expect_eq(s.skipped, 2);
}

Test(precision_loss_scaler, hysteresis_and_bounds)
{
    ct_loss_scaler s;
    cr_assert_eq(ct_loss_scaler_init(&s, &(ct_loss_scaler_config){.init_scale = 4, .hysteresis = 2, .min_scale = 1,
                                                                  .max_scale = 8, .growth_interval = 1}),
                 CT_OK);
    ct_loss_scaler_update(&s, true);
    cr_expect_eq(s.scale, 4.0); /* one overflow: held */
    ct_loss_scaler_update(&s, false);
    cr_expect_eq(s.scale, 8.0); /* a clean step resets the count (and grows: interval 1) */
    ct_loss_scaler_update(&s, false);
    cr_expect_eq(s.scale, 8.0); /* max_scale */
    ct_loss_scaler_update(&s, true);
    ct_loss_scaler_update(&s, true);
    cr_expect_eq(s.scale, 4.0); /* the second overflow in a row backs off */
    for (int i = 0; i < 10; i++) ct_loss_scaler_update(&s, true);
    cr_expect_eq(s.scale, 1.0); /* min_scale */
}

Test(precision_loss_scaler, unscale_divides_and_finds_non_finite_values)
{
    ct_loss_scaler s;
    cr_assert_eq(ct_loss_scaler_init(&s, &(ct_loss_scaler_config){.init_scale = 1024}), CT_OK);
    ct_tensor *a = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(3, 70000), 2048.0), *b = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(5), -512.0);
    bool inf = true;
    cr_assert_eq(ct_loss_scaler_unscale(&s, 3, (ct_tensor *[]){a, NULL, b}, &inf), CT_OK);
    cr_expect_not(inf);
    for (int i = 0; i < 210000; i++) cr_assert_eq(((float *)ct_tensor_data(a))[i], 2.0f);
    for (int i = 0; i < 5; i++) cr_expect_eq(((float *)ct_tensor_data(b))[i], -0.5f);
    /* once per step */
    cr_expect_eq(ct_loss_scaler_unscale(&s, 1, &a, &inf), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "unscaled already") != NULL, "%s", ct_last_error());
    ct_loss_scaler_update(&s, false);
    ((float *)ct_tensor_data(a))[123456] = INFINITY;
    cr_assert_eq(ct_loss_scaler_unscale(&s, 1, &a, &inf), CT_OK);
    cr_expect(inf);
    ct_loss_scaler_update(&s, true);
    ((float *)ct_tensor_data(b))[2] = NAN;
    cr_assert_eq(ct_loss_scaler_unscale(&s, 1, &b, &inf), CT_OK);
    cr_expect(inf);
    ct_loss_scaler_update(&s, true);
    ct_tensor *h = ct_tensor_zeros(CT_DTYPE_F16, CT_SHAPE(4));
    cr_expect_eq(ct_loss_scaler_unscale(&s, 1, &h, &inf), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "want f32, contiguous") != NULL, "%s", ct_last_error());
}

Test(precision_loss_scaler, bad_settings_name_the_field)
{
    ct_loss_scaler s;
    struct {
        ct_loss_scaler_config c;
        const char *want;
    } bad[] = {
        {{.growth_factor = 0.5}, "growth_factor = 0.5; want > 1"},
        {{.backoff_factor = 1.5}, "backoff_factor = 1.5; want in (0, 1)"},
        {{.growth_interval = -1}, "growth_interval = -1; want >= 1"},
        {{.init_scale = 1e30}, "init_scale = 1e+30; want in"},
        {{.hysteresis = -2}, "hysteresis = -2"},
        {{.min_scale = -1}, "min_scale = -1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(ct_loss_scaler_init(&s, &bad[i].c), CT_ERR_INVALID);
        cr_expect(strstr(ct_last_error(), bad[i].want) != NULL, "%s", ct_last_error());
    }
}

/* y = x w: f16 autocast, loss = mean((y - t)^2) scaled by the scaler. The scale
 * starts at 2^40, where the f16 gradient of the linear overflows (f16's max is
 * 65504): the first steps must be skipped with the scale halving each time, the
 * weights untouched; then the steps go through and the loss falls. */
Test(precision_loss_scaler, an_f16_overflow_skips_backs_off_and_training_recovers, .timeout = 60)
{
    ct_set_seed(5);
    ct_tensor *w = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(16, 4), 0, 0.1);
    ct_tensor_set_requires_grad(w, true);
    ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(64, 16), 0, 1);
    ct_tensor *wt = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(16, 4), 0, 1);
    ct_tensor *t = ct_kernel_matmul(x, wt, false, false);
    ct_optimizer *opt = ct_sgd_new(1, &w, &(ct_sgd_config){.lr = 0.05});
    cr_assert_not_null(opt, "%s", ct_last_error());
    ct_loss_scaler s;
    cr_assert_eq(ct_loss_scaler_init(&s, &(ct_loss_scaler_config){.init_scale = ldexp(1, 40), .max_scale = ldexp(1, 40)}),
                 CT_OK);
    double first = NAN, last = NAN;
    int skipped = 0, first_clean = -1;
    for (int step = 0; step < 60; step++) {
        CT_FRAME {
            ct_tensor *loss = NULL;
            CT_AUTOCAST(CT_DTYPE_F16) {
                ct_tensor *d = ct_sub(ct_matmul(x, w), t);
                loss = ct_mean_all(ct_mul(d, d));
            }
            cr_assert_not_null(loss, "%s", ct_last_error());
            cr_assert_eq(ct_backward(ct_mul_scalar(loss, s.scale)), CT_OK, "%s", ct_last_error());
            bool inf = false;
            cr_assert_eq(ct_loss_scaler_unscale(&s, 1, &w->grad, &inf), CT_OK, "%s", ct_last_error());
            double before = ((float *)ct_tensor_data(w))[0];
            if (!ct_loss_scaler_update(&s, inf)) {
                cr_assert_eq(ct_optimizer_step(opt), CT_OK, "%s", ct_last_error());
                if (first_clean < 0) first_clean = step, first = ct_tensor_item(loss);
                last = ct_tensor_item(loss);
            } else {
                skipped++;
                cr_expect_eq(((float *)ct_tensor_data(w))[0], before, "a skipped step leaves the weights");
                cr_expect_lt(first_clean, 0, "step %d overflowed after clean steps", step);
            }
            ct_optimizer_zero_grad(opt);
        }
    }
    cr_expect_gt(skipped, 5, "the scale 2^40 must overflow f16 gradients (skipped %d)", skipped);
    cr_expect_eq(skipped, first_clean, "every step before the first clean one was skipped");
    cr_expect_eq(s.scale, ldexp(1, 40 - skipped), "the scale halved once per skipped step: %g", s.scale);
    cr_expect(last < 0.2 * first, "training recovered: loss %g -> %g", first, last);
    ct_optimizer_free(opt);
}
