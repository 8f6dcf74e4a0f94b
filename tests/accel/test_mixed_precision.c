/* Tests for the Accelerator's mixed_precision (accel/accelerator.c with
 * precision/): the setting from the config and the environment, autocast in force
 * for the whole process from new to free with no scope in the loop, a small GPT
 * trained in bf16 ending close to the same training in f32, and fp16 whose first
 * steps overflow: skipped, the scaler backing off, the scheduler not advancing,
 * then training recovers; fp16 with DeepSpeed's gradient_clipping clipping the
 * gradients unscaled once. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "autograd/autocast_cast.h"
#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/philox.h"
#include "nn/gpt.h"
#include "precision/autocast.h"

static void clean_env(void)
{
    const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                          "CTRAIN_GRADIENT_ACCUMULATION_STEPS", "CTRAIN_MIXED_PRECISION", "CTRAIN_FP8_FORMAT",
                          "CTRAIN_FP8_AMAX_HISTORY_LEN", "CTRAIN_FP8_AMAX_COMPUTE_ALGO", "CTRAIN_FP8_MARGIN",
                          "CTRAIN_FP8_EMBEDDING_AND_HEAD"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

TestSuite(accel_mixed_precision, .init = clean_env);

Test(accel_mixed_precision, the_setting_and_its_errors)
{
    ct_accelerator *a = ct_accelerator_new(&(ct_accelerator_config){.mixed_precision = "bf16"});
    cr_assert_not_null(a, "%s", ct_last_error());
    cr_expect_str_eq(ct_accelerator_mixed_precision(a), "bf16");
    cr_expect(ct_autocast_enabled(), "the whole process autocasts");
    cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_BF16);
    cr_expect_eq(ct_accelerator_loss_scale(a), 1.0);
    ct_accelerator_free(a);
    cr_expect_not(ct_autocast_enabled(), "free turns it off");

    setenv("CTRAIN_MIXED_PRECISION", "fp16", 1); /* what `ctrain launch --mixed_precision fp16` sets */
    a = ct_accelerator_new(NULL);
    cr_assert_not_null(a, "%s", ct_last_error());
    cr_expect_str_eq(ct_accelerator_mixed_precision(a), "fp16");
    cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_F16);
    cr_expect_eq(ct_accelerator_loss_scale(a), 65536.0);
    ct_accelerator_free(a);

    /* fp8: bf16 autocast with an fp8 state; the recipe from the launcher's variables */
    setenv("CTRAIN_MIXED_PRECISION", "fp8", 1);
    setenv("CTRAIN_FP8_FORMAT", "e4m3", 1);
    setenv("CTRAIN_FP8_AMAX_HISTORY_LEN", "16", 1);
    setenv("CTRAIN_FP8_AMAX_COMPUTE_ALGO", "most_recent", 1);
    setenv("CTRAIN_FP8_MARGIN", "2", 1);
    setenv("CTRAIN_FP8_EMBEDDING_AND_HEAD", "1", 1);
    a = ct_accelerator_new(NULL);
    cr_assert_not_null(a, "%s", ct_last_error());
    cr_expect_str_eq(ct_accelerator_mixed_precision(a), "fp8");
    cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_BF16);
    ct_fp8_state *st = ct_autocast_fp8_state();
    cr_assert_not_null(st);
    const ct_fp8_recipe *r = ct_fp8_state_recipe(st);
    cr_expect_eq(r->format, CT_FP8_E4M3);
    cr_expect_eq(r->amax_history_len, 16);
    cr_expect_eq(r->amax_compute_algo, CT_FP8_AMAX_MOST_RECENT);
    cr_expect_eq(r->margin, 2);
    cr_expect(r->fp8_embedding_and_head);
    ct_accelerator_free(a);
    cr_expect_null(ct_autocast_fp8_state(), "free turns fp8 off");
    /* the config's own fields win over the variables */
    a = ct_accelerator_new(&(ct_accelerator_config){.fp8 = {.amax_history_len = 4}});
    cr_assert_not_null(a, "%s", ct_last_error());
    cr_expect_eq(ct_fp8_state_recipe(ct_autocast_fp8_state())->amax_history_len, 4);
    ct_accelerator_free(a);
    struct {
        const char *var, *value, *want;
    } bad[] = {
        {"CTRAIN_FP8_FORMAT", "e5m2", "CTRAIN_FP8_FORMAT='e5m2' is not hybrid or e4m3"},
        {"CTRAIN_FP8_AMAX_COMPUTE_ALGO", "mean", "CTRAIN_FP8_AMAX_COMPUTE_ALGO='mean' is not max or most_recent"},
        {"CTRAIN_FP8_AMAX_HISTORY_LEN", "0", "CTRAIN_FP8_AMAX_HISTORY_LEN"},
        {"CTRAIN_FP8_MARGIN", "99", "margin 99 is outside 0 .. 64"},
        {"CTRAIN_FP8_EMBEDDING_AND_HEAD", "2", "CTRAIN_FP8_EMBEDDING_AND_HEAD='2' is not 0 or 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char keep[64];
        snprintf(keep, sizeof keep, "%s", getenv(bad[i].var));
        setenv(bad[i].var, bad[i].value, 1);
        cr_expect_null(ct_accelerator_new(NULL));
        cr_expect(strstr(ct_last_error(), bad[i].want) && strstr(ct_last_error(), "mixed_precision = 'fp8'"), "%s",
                  ct_last_error());
        setenv(bad[i].var, keep, 1);
    }
    const char *fp8_vars[] = {"CTRAIN_FP8_FORMAT", "CTRAIN_FP8_AMAX_HISTORY_LEN", "CTRAIN_FP8_AMAX_COMPUTE_ALGO",
                              "CTRAIN_FP8_MARGIN", "CTRAIN_FP8_EMBEDDING_AND_HEAD"};
    for (size_t i = 0; i < sizeof fp8_vars / sizeof *fp8_vars; i++) unsetenv(fp8_vars[i]);
    setenv("CTRAIN_MIXED_PRECISION", "half", 1);
    cr_expect_null(ct_accelerator_new(NULL));
    cr_expect(strstr(ct_last_error(), "'half' (CTRAIN_MIXED_PRECISION); allowed: no, fp16, bf16, fp8") != NULL, "%s",
              ct_last_error());
    unsetenv("CTRAIN_MIXED_PRECISION");
    cr_expect_null(ct_accelerator_new(&(ct_accelerator_config){.mixed_precision = "fp16",
                                                               .loss_scaler = {.growth_factor = 0.5}}));
    cr_expect(strstr(ct_last_error(), "growth_factor = 0.5") != NULL, "%s", ct_last_error());
    cr_expect_not(ct_autocast_enabled());
}

/* ---- training ---------------------------------------------------------------------------- */

static const ct_gpt_config tiny = {.vocab_size = 32, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};

typedef struct run {
    ct_gpt *m;
    ct_optimizer *opt;
    ct_scheduler *sched;
    ct_param_list params;
} run;

static void run_init(run *r)
{
    ct_set_seed(21);
    r->m = ct_gpt_new(&tiny);
    cr_assert_not_null(r->m);
    r->params = (ct_param_list){0};
    cr_assert_eq(ct_module_named_tensors(&r->m->base, false, &r->params), CT_OK);
    r->opt = ct_adamw_new(r->params.n, r->params.tensors, &(ct_adamw_config){.lr = 3e-3});
    r->sched = ct_scheduler_new(r->opt, &(ct_lr_schedule){.decay = CT_LR_CONSTANT});
    cr_assert(r->opt && r->sched, "%s", ct_last_error());
}

static void run_free(run *r)
{
    ct_scheduler_free(r->sched);
    ct_optimizer_free(r->opt);
    ct_param_list_free(&r->params);
    ct_module_free(&r->m->base);
}

/* A fixed batch: tokens (i * 5 + 3) mod 32, each target the next token. */
static void batch(ct_tensor **x, ct_tensor **y)
{
    *x = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(4, 16));
    *y = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(4, 16));
    for (int i = 0; i < 64; i++) {
        ((int64_t *)ct_tensor_data(*x))[i] = (i * 5 + 3) % 32;
        ((int64_t *)ct_tensor_data(*y))[i] = ((i + 1) * 5 + 3) % 32;
    }
}

/* steps of the plain Accelerator loop (no autocast scope anywhere); the last loss */
static double train(const char *mp, const ct_loss_scaler_config *sc, int steps, int *overflowed, double *first)
{
    double last = NAN;
    *overflowed = 0;
    run r;
    run_init(&r);
    ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.mixed_precision = mp,
                                                                      .loss_scaler = sc ? *sc : (ct_loss_scaler_config){0}});
    cr_assert_not_null(acc, "%s", ct_last_error());
    cr_assert_eq(ct_accelerator_prepare(acc, &r.m->base, r.opt, NULL, r.sched), CT_OK, "%s", ct_last_error());
    for (int s = 0; s < steps; s++) CT_FRAME {
        ct_tensor *x, *y;
        batch(&x, &y);
        ct_tensor *loss = ct_gpt_loss(r.m, x, y);
        cr_assert_not_null(loss, "%s", ct_last_error());
        cr_assert_eq(loss->dtype, CT_DTYPE_F32);
        cr_assert_eq(ct_accelerator_backward(acc, loss), CT_OK, "%s", ct_last_error());
        double norm = ct_accelerator_clip_grad_norm(acc, 1.0, 2.0);
        cr_assert(!isnan(norm), "%s", ct_last_error());
        int64_t pos = ct_scheduler_position(r.sched);
        cr_assert_eq(ct_optimizer_step(r.opt), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_scheduler_step(r.sched), CT_OK);
        if (ct_accelerator_step_overflowed(acc)) {
            (*overflowed)++;
            cr_expect(ct_accelerator_step_was_skipped(acc));
            cr_expect(isinf(norm), "an overflowing step's norm is inf, not %g", norm);
            cr_expect_eq(ct_scheduler_position(r.sched), pos, "the scheduler does not advance on a skipped step");
        } else {
            cr_expect_not(ct_accelerator_step_was_skipped(acc));
            cr_expect_eq(ct_scheduler_position(r.sched), pos + 1);
            if (isnan(*first)) *first = ct_tensor_item(loss);
            last = ct_tensor_item(loss);
        }
        ct_optimizer_zero_grad(r.opt);
    }
    for (int i = 0; i < r.params.n; i++) cr_expect_eq(r.params.tensors[i]->dtype, CT_DTYPE_F32);
    ct_accelerator_free(acc);
    run_free(&r);
    return last;
}

Test(accel_mixed_precision, bf16_training_ends_close_to_f32, .timeout = 60)
{
    int ov;
    double f32_first = NAN, bf16_first = NAN;
    double f32 = train("no", NULL, 40, &ov, &f32_first);
    double bf16 = train("bf16", NULL, 40, &ov, &bf16_first);
    cr_expect_eq(ov, 0);
    cr_expect(f32 < 0.5 * f32_first, "f32 learns the batch: %g -> %g", f32_first, f32);
    cr_expect(fabs(bf16 - f32) <= 0.05 * f32 + 0.01, "after 40 steps: bf16 %g, f32 %g", bf16, f32);
    cr_expect(fabs(bf16_first - f32_first) <= 0.01 * f32_first, "first loss: bf16 %g, f32 %g", bf16_first, f32_first);
}

Test(accel_mixed_precision, fp8_training_ends_close_to_f32_and_the_scales_move, .timeout = 60)
{
    int ov;
    double f32_first = NAN, fp8_first = NAN;
    double f32 = train("no", NULL, 40, &ov, &f32_first);
    double fp8 = train("fp8", NULL, 40, &ov, &fp8_first);
    cr_expect_eq(ov, 0);
    cr_expect(fabs(fp8 - f32) <= 0.1 * f32 + 0.02, "after 40 steps: fp8 %g, f32 %g", fp8, f32);
    cr_expect(fabs(fp8_first - f32_first) <= 0.02 * f32_first, "first loss: fp8 %g, f32 %g", fp8_first, f32_first);
}

Test(accel_mixed_precision, fp8_linears_quantise_and_every_step_updates_the_scales, .timeout = 60)
{
    run r;
    run_init(&r);
    ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.mixed_precision = "fp8"});
    cr_assert_not_null(acc, "%s", ct_last_error());
    cr_assert_eq(ct_accelerator_prepare(acc, &r.m->base, r.opt, NULL, NULL), CT_OK, "%s", ct_last_error());
    ct_fp8_state *st = ct_autocast_fp8_state();
    for (int s = 0; s < 2; s++) CT_FRAME {
        ct_tensor *x, *y;
        batch(&x, &y);
        ct_tensor *loss = ct_gpt_loss(r.m, x, y);
        cr_assert_eq(ct_accelerator_backward(acc, loss), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_step(r.opt), CT_OK, "%s", ct_last_error());
        ct_optimizer_zero_grad(r.opt);
    }
    /* 4 linears per block (c_attn, attn c_proj, c_fc, mlp c_proj); the head stays bf16 */
    cr_expect_eq(ct_fp8_state_weights(st), 4 * tiny.n_layer);
    for (int i = 0; i < ct_fp8_state_weights(st); i++) {
        /* every meta has stepped twice on amaxes it saw: scale = fmax / max(history) */
        for (int k = 0; k < 3; k++) {
            const ct_fp8_meta *m = ct_fp8_state_meta(st, i, k);
            cr_expect_eq(m->seen, 2);
            float a = ct_fp8_meta_amax(m);
            cr_expect_gt(a, 0.0f);
            cr_expect_eq(m->scale, (float)(ct_fp8_max(m->dtype) / a), "slot %d meta %d", i, k);
            cr_expect_eq(m->pending, 0.0f);
        }
        cr_expect_eq(ct_fp8_state_meta(st, i, 2)->dtype, CT_DTYPE_F8_E5M2);
    }
    ct_accelerator_free(acc);
    run_free(&r);
}

Test(accel_mixed_precision, fp16_overflows_are_skipped_then_training_recovers, .timeout = 60)
{
    int ov;
    double first = NAN;
    /* 2^40 overflows f16's gradients: the scaler must halve it about 25 times */
    ct_loss_scaler_config sc = {.init_scale = ldexp(1, 40), .max_scale = ldexp(1, 40)};
    double last = train("fp16", &sc, 80, &ov, &first);
    cr_expect_gt(ov, 10, "overflowing steps: %d", ov);
    cr_expect(last < 0.5 * first, "training recovered: %g -> %g", first, last);
}

/* DeepSpeed's gradient_clipping under fp16 clips the true gradients, unscaled once:
 * loss = sum(w * c) with c = (3, 4, 0, 0) has gradient c, of norm 5; clipped to 1 it
 * is (0.6, 0.8, 0, 0) (times 1/(1 + 1e-6 / 5), ct_clip_coef's guard), and SGD with lr 1
 * moves w by exactly that. Gradients unscaled twice would be c / 65536, below the clip,
 * and w would barely move. */
Test(accel_mixed_precision, fp16_with_deepspeed_gradient_clipping_clips_the_true_gradients, .timeout = 30)
{
    ct_module *m = ct_module_alloc(sizeof *m, "W", NULL);
    cr_assert_not_null(m);
    ct_tensor *w = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4));
    cr_assert_not_null(w);
    cr_assert_eq(ct_module_add_param(m, "w", w), CT_OK, "%s", ct_last_error());
    ct_optimizer *opt = ct_sgd_new(1, &w, &(ct_sgd_config){.lr = 1.0});
    cr_assert_not_null(opt, "%s", ct_last_error());
    ct_deepspeed_plugin ds = {.zero_stage = 0, .gradient_clipping = 1.0};
    ct_accelerator *acc =
        ct_accelerator_new(&(ct_accelerator_config){.mixed_precision = "fp16", .deepspeed_plugin = &ds});
    cr_assert_not_null(acc, "%s", ct_last_error());
    cr_assert_eq(ct_accelerator_prepare(acc, m, opt, NULL, NULL), CT_OK, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *c = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(4), (float[]){3, 4, 0, 0});
        ct_tensor *loss = ct_sum_all(ct_mul(w, c));
        cr_assert_not_null(loss, "%s", ct_last_error());
        cr_assert_eq(ct_accelerator_backward(acc, loss), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_step(opt), CT_OK, "%s", ct_last_error());
    }
    cr_assert_not(ct_accelerator_step_overflowed(acc));
    const float *v = ct_tensor_data(w);
    const double coef = 1.0 / (5.0 + 1e-6);
    const double want[4] = {-3 * coef, -4 * coef, 0, 0};
    for (int i = 0; i < 4; i++)
        cr_expect(fabs(v[i] - want[i]) < 1e-6, "w[%d] = %.9g, want %.9g (clipped once, to norm 1)", i, v[i], want[i]);
    ct_accelerator_free(acc);
    ct_optimizer_free(opt);
    ct_module_free(m);
}
