/* Tests for optim/schedule.c: the schedules against values worked out by hand (max_lr 1,
 * min_lr 0.1, warmup 10, total 110 so that decay ratios are round numbers), and the
 * scheduler driving an optimizer. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/tensor.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "tests/optim/util.h"

static const ct_lr_schedule cosine = {.decay = CT_LR_COSINE, .max_lr = 1, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};

static void expect(const ct_lr_schedule *s, int64_t step, double want)
{
    const double got = ct_lr_schedule_at(s, step);
    cr_assert_float_eq(got, want, 1e-15, "decay %d step %ld: lr %.17g, want %.17g", (int)s->decay, (long)step, got, want);
}

Test(lr_schedule, cosine_by_hand)
{
    expect(&cosine, 0, 0.1);  /* warmup start: 1 * (0 + 1) / 10 */
    expect(&cosine, 4, 0.5);
    expect(&cosine, 9, 1.0);  /* warmup end */
    expect(&cosine, 10, 1.0); /* ratio 0 */
    /* ratio 0.25: 0.1 + 0.5 * (1 + cos(pi/4)) * 0.9 = 0.1 + 0.45 * 1.7071067811865475 */
    expect(&cosine, 35, 0.86819805153394639);
    expect(&cosine, 60, 0.55); /* ratio 0.5: halfway between max and min */
    /* ratio 0.75: 0.1 + 0.45 * (1 - 0.70710678118654757) */
    expect(&cosine, 85, 0.23180194846605361);
    expect(&cosine, 110, 0.1); /* end */
    expect(&cosine, 111, 0.1); /* beyond */
    expect(&cosine, 1000000, 0.1);
}

Test(lr_schedule, linear_by_hand)
{
    ct_lr_schedule s = cosine;
    s.decay = CT_LR_LINEAR;
    expect(&s, 0, 0.1);
    expect(&s, 9, 1.0);
    expect(&s, 10, 1.0);
    expect(&s, 30, 0.82); /* ratio 0.2: 1 - 0.2 * 0.9 */
    expect(&s, 60, 0.55);
    expect(&s, 110, 0.1);
    expect(&s, 500, 0.1);
}

Test(lr_schedule, constant_and_no_warmup)
{
    const ct_lr_schedule c = {.max_lr = 3e-4};
    expect(&c, 0, 3e-4);
    expect(&c, 123456, 3e-4);
    const ct_lr_schedule cw = {.max_lr = 2, .warmup_steps = 4, .total_steps = 2};
    expect(&cw, 0, 0.5);
    expect(&cw, 3, 2);
    expect(&cw, 4, 2);
    expect(&cw, 100, 2); /* constant: no floor after total_steps */
    ct_lr_schedule s = cosine;
    s.warmup_steps = 0, s.total_steps = 100;
    expect(&s, 0, 1.0); /* no warmup: starts at the peak */
    expect(&s, 50, 0.55);
    expect(&s, 100, 0.1);
}

Test(lr_schedule, bad_schedules)
{
    ct_lr_schedule s = cosine;
    s.total_steps = 10;
    cr_assert(isnan(ct_lr_schedule_at(&s, 0)));
    ERROR_HAS("total_steps > warmup_steps");
    s = cosine;
    cr_assert(isnan(ct_lr_schedule_at(&s, -1)));
    ERROR_HAS("step must be >= 0");
    s.max_lr = NAN;
    cr_assert_neq(ct_lr_schedule_check(&s), CT_OK);
    ERROR_HAS("max_lr");
    s = cosine;
    s.warmup_steps = -3;
    cr_assert(isnan(ct_lr_schedule_at(&s, 0)));
    ERROR_HAS("-3");
    s = cosine;
    s.decay = (ct_lr_decay)7;
    cr_assert_neq(ct_lr_schedule_check(&s), CT_OK);
    ERROR_HAS("decay 7");
    cr_assert(isnan(ct_lr_schedule_at(NULL, 0)));
}

/* The scheduler sets lr(0) at once and lr(k) after k steps; groups keep their scale;
 * a scheduler restored at a saved position continues with the same values. */
Test(lr_schedule, scheduler_drives_optimizer)
{
    CT_FRAME {
        ct_tensor *p[2] = {ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2)), ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2))};
        ct_optimizer *o = ct_adamw_new(1, p, &(ct_adamw_config){.lr = 1});
        ct_optimizer_add_group(o, 1, p + 1, &(ct_param_group_config){.lr_scale = 0.1, .no_weight_decay = true});
        ct_lr_schedule s = cosine;
        s.max_lr = 0; /* take the optimizer's lr, 1 */
        ct_scheduler *sch = ct_scheduler_new(o, &s);
        cr_assert_not_null(sch, "%s", ct_last_error());
        cr_assert_eq(ct_scheduler_schedule(sch)->max_lr, 1);
        cr_assert_float_eq(ct_optimizer_lr(o), 0.1, 1e-15);
        double seen[120];
        for (int k = 0; k < 120; k++) {
            seen[k] = ct_optimizer_lr(o);
            cr_assert_float_eq(seen[k], ct_lr_schedule_at(&cosine, k), 1e-15, "step %d", k);
            cr_assert_float_eq(ct_optimizer_group_lr(o, 1), 0.1 * seen[k], 1e-15);
            cr_assert_eq(ct_scheduler_position(sch), k);
            cr_assert_eq(ct_scheduler_lr(sch), seen[k]);
            cr_assert_eq(ct_scheduler_step(sch), CT_OK);
        }
        cr_assert_float_eq(seen[60], 0.55, 1e-15);
        /* resume at 35 in a fresh scheduler: the same values, bit for bit */
        const int64_t saved = 35;
        ct_scheduler *r = ct_scheduler_new(o, &cosine);
        cr_assert_eq(ct_scheduler_set_position(r, saved), CT_OK);
        for (int k = (int)saved; k < 120; k++) {
            cr_assert_eq(ct_optimizer_lr(o), seen[k], "step %d", k);
            ct_scheduler_step(r);
        }
        cr_assert_neq(ct_scheduler_set_position(r, -1), CT_OK);
        ERROR_HAS("position");
        cr_assert_null(ct_scheduler_new(NULL, &cosine));
        ct_lr_schedule bad = cosine;
        bad.total_steps = 5;
        cr_assert_null(ct_scheduler_new(o, &bad));
        ERROR_HAS("scheduler_new");
        ct_scheduler_free(sch), ct_scheduler_free(r), ct_scheduler_free(NULL);
        ct_optimizer_free(o);
    }
}
