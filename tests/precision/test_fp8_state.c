/* Tests for precision/fp8_state.c: slots in first-use order, the quantised weight made
 * once per weight generation with its meta's scale, the amax buffer (get changes
 * nothing, set takes all-reduced values, the backward cell is folded in) and the new
 * scales after a step, worked out by hand. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "precision/autocast.h"
#include "precision/fp8_state.h"

static void frame_in(void) { ct_frame_push(); }
static void frame_out(void) { ct_frame_pop(); }
TestSuite(precision_fp8_state, .init = frame_in, .fini = frame_out);

static ct_tensor *filled(int64_t r, int64_t c, float amax)
{
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(r, c));
    float *p = ct_tensor_data(t);
    for (int64_t i = 0; i < r * c; i++) p[i] = amax * (float)((i % 7) - 3) / 3.0f; /* |max| = amax */
    return t;
}

Test(precision_fp8_state, slots_in_first_use_order_and_one_quantised_copy_per_generation)
{
    ct_fp8_state *s = ct_fp8_state_new(NULL);
    cr_assert_not_null(s, "%s", ct_last_error());
    ct_tensor *w1 = filled(4, 6, 2.0f), *w2 = filled(3, 5, 10.0f);
    ct_fp8_use u1, u2, again;
    cr_assert_eq(ct_fp8_state_use(s, w2, &u2), CT_OK, "%s", ct_last_error());
    cr_assert_eq(ct_fp8_state_use(s, w1, &u1), CT_OK);
    cr_expect_eq(u2.slot, 0);
    cr_expect_eq(u1.slot, 1);
    cr_expect_eq(ct_fp8_state_weights(s), 2);
    cr_expect_eq(u1.x_dtype, CT_DTYPE_F8_E4M3);
    cr_expect_eq(u1.g_dtype, CT_DTYPE_F8_E5M2); /* HYBRID */
    cr_expect_eq(u1.x_scale, 1.0f);
    cr_expect_eq(u1.g_scale, 1.0f);
    /* the copy is the reference quantisation with the weight meta's scale (1 at first) */
    ct_tensor *ref = ct_fp8_quantize_ref(w1, CT_DTYPE_F8_E4M3, 1.0f, NULL);
    cr_expect_eq(u1.wq->dtype, CT_DTYPE_F8_E4M3);
    cr_expect_eq(memcmp(ct_tensor_data(u1.wq), ct_tensor_data(ref), 24), 0);
    cr_assert_eq(ct_fp8_state_use(s, w1, &again), CT_OK);
    cr_expect_eq(again.wq, u1.wq, "the same generation reuses the copy");
    ct_autocast_weights_changed();
    cr_assert_eq(ct_fp8_state_use(s, w1, &again), CT_OK);
    cr_expect_neq(again.wq, u1.wq, "a new generation quantises again");
    cr_expect_eq(again.slot, 1);
    ct_fp8_state_free(s);
}

Test(precision_fp8_state, amaxes_travel_and_scales_follow_the_hand_computation)
{
    ct_fp8_state *s = ct_fp8_state_new(&(ct_fp8_recipe){.amax_history_len = 2, .margin = 1});
    cr_assert_not_null(s);
    ct_tensor *w = filled(4, 6, 3.5f);
    ct_fp8_use u;
    cr_assert_eq(ct_fp8_state_use(s, w, &u), CT_OK);
    ct_fp8_state_observe_input(s, u.slot, 7.0f);
    ct_fp8_state_observe_input(s, u.slot, 5.0f);
    ct_fp8_amax_cell_raise(u.g_amax, 0.25f);
    ct_fp8_amax_cell_raise(u.g_amax, 0.125f);
    cr_assert_eq(ct_fp8_state_amax_count(s), 3);
    float buf[3], again[3];
    ct_fp8_state_amax_get(s, buf);
    cr_expect_eq(buf[0], 7.0f);
    cr_expect_eq(buf[1], 3.5f);
    cr_expect_eq(buf[2], 0.25f);
    ct_fp8_state_amax_get(s, again);
    cr_expect_eq(memcmp(buf, again, sizeof buf), 0, "get changes nothing");
    /* what another rank saw, after an all-reduce with MAX */
    buf[0] = 14.0f;
    buf[2] = 0.5f;
    ct_fp8_state_amax_set(s, buf);
    ct_fp8_state_step(s);
    /* scale = fmax / amax / 2^margin */
    cr_expect_eq(ct_fp8_state_meta(s, 0, 0)->scale, (float)(448.0 / 14.0 / 2.0));
    cr_expect_eq(ct_fp8_state_meta(s, 0, 1)->scale, (float)(448.0 / 3.5 / 2.0));
    cr_expect_eq(ct_fp8_state_meta(s, 0, 2)->scale, (float)(57344.0 / 0.5 / 2.0));
    /* without amax_set, step folds the backward cell in; history 2 keeps the max */
    cr_assert_eq(ct_fp8_state_use(s, w, &u), CT_OK); /* observes w again: a new copy after the step */
    cr_expect_eq(u.x_scale, 16.0f);
    cr_expect_eq(u.g_scale, 57344.0f);
    ct_fp8_amax_cell_raise(u.g_amax, 0.0625f);
    ct_fp8_state_step(s);
    cr_expect_eq(ct_fp8_state_meta(s, 0, 2)->scale, 57344.0f, "max over the history (0.5, 0.0625)");
    ct_fp8_state_step(s); /* the history is now (0.0625, 0): the max moved */
    cr_expect_eq(ct_fp8_state_meta(s, 0, 2)->scale, (float)(57344.0 / 0.0625 / 2.0));
    cr_expect_null(ct_fp8_state_meta(s, 1, 0));
    ct_fp8_state_free(s);
}

Test(precision_fp8_state, a_nan_amax_keeps_the_scale_and_bad_weights_are_refused)
{
    ct_fp8_state *s = ct_fp8_state_new(NULL);
    ct_tensor *w = filled(2, 2, 1.0f);
    ct_fp8_use u;
    cr_assert_eq(ct_fp8_state_use(s, w, &u), CT_OK);
    ct_fp8_state_step(s);
    float before = ct_fp8_state_meta(s, 0, 2)->scale;
    ct_fp8_amax_cell_raise(u.g_amax, NAN);
    ct_fp8_amax_cell_raise(u.g_amax, 2.0f); /* NaN sticks */
    float buf[3];
    ct_fp8_state_amax_get(s, buf);
    cr_expect(isnan(buf[2]));
    ct_fp8_state_step(s);
    cr_expect_eq(ct_fp8_state_meta(s, 0, 2)->scale, before);
    cr_expect_eq(ct_fp8_state_use(s, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4)), &u), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "f32[4]") && strstr(ct_last_error(), "want a 2-D f32, bf16 or f16 tensor"),
              "%s", ct_last_error());
    /* 16-bit weights (sharded mixed precision) are taken, an f64 or integer one is not */
    cr_expect_eq(ct_fp8_state_use(s, ct_tensor_zeros(CT_DTYPE_BF16, CT_SHAPE(2, 2)), &u), CT_OK, "%s", ct_last_error());
    cr_expect_eq(ct_fp8_state_use(s, ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2, 2)), &u), CT_ERR_INVALID);
    cr_expect_eq(ct_fp8_state_use(s, ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(2, 2)), &u), CT_ERR_INVALID);
    cr_expect_null(ct_fp8_state_new(&(ct_fp8_recipe){.margin = -1}));
    cr_expect(strstr(ct_last_error(), "margin -1") != NULL, "%s", ct_last_error());
    ct_fp8_state_free(s);
    ct_fp8_state_free(NULL);
}
