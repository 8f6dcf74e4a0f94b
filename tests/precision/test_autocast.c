/* Tests for the autocast scope and policy table (precision/autocast.c): defaults,
 * overrides, nesting, errors, and the dtype each rule gives. The ops' behaviour
 * under autocast is tested in tests/autograd/test_autocast.c. */
#include <criterion/criterion.h>
#include <string.h>

#include "precision/autocast.h"

static void reset(void)
{
    ct_autocast_reset_rules();
    while (ct_autocast_depth() > 0) ct_autocast_end();
    ct_autocast_set_default(CT_DTYPE_F32);
}

TestSuite(precision_autocast, .init = reset, .fini = reset);

Test(precision_autocast, the_default_table)
{
    char buf[2048];
    ct_autocast_policy_str(buf, sizeof buf);
    const char *want[] = {"matmul: low\n", "linear: fp8\n", "attention: low\n", "softmax: f32\n",
                          "log_softmax: f32\n", "layernorm: f32\n", "rmsnorm: f32\n", "cross_entropy: f32\n",
                          "reductions (sum, mean, var): f32\n", "(add, sub, mul, div, pow, maximum, minimum): widest\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_expect(strstr(buf, want[i]) != NULL, "want '%s' in:\n%s", want[i], buf);
}

Test(precision_autocast, dtypes_inside_and_outside_a_scope)
{
    cr_expect_not(ct_autocast_enabled());
    cr_expect_eq(ct_autocast_compute_dtype(CT_AC_LINEAR, CT_DTYPE_F32), CT_DTYPE_F32); /* no scope: as is */
    cr_expect_eq(ct_autocast_compute_dtype(CT_AC_SOFTMAX, CT_DTYPE_BF16), CT_DTYPE_BF16);
    int ran = 0;
    CT_AUTOCAST(CT_DTYPE_BF16) {
        ran++;
        cr_expect(ct_autocast_enabled());
        cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_BF16);
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_LINEAR, CT_DTYPE_F32), CT_DTYPE_BF16);
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_MATMUL, CT_DTYPE_F16), CT_DTYPE_BF16);
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_SOFTMAX, CT_DTYPE_BF16), CT_DTYPE_F32);
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_LAYERNORM, CT_DTYPE_F32), CT_DTYPE_F32);
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_BINARY, CT_DTYPE_BF16), CT_DTYPE_BF16);
        /* f64 (gradcheck) and integers are never touched */
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_LINEAR, CT_DTYPE_F64), CT_DTYPE_F64);
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_REDUCTION, CT_DTYPE_I64), CT_DTYPE_I64);
        CT_AUTOCAST(CT_DTYPE_F16) { /* the innermost scope wins */
            cr_expect_eq(ct_autocast_compute_dtype(CT_AC_LINEAR, CT_DTYPE_F32), CT_DTYPE_F16);
        }
        cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_BF16);
    }
    cr_expect_eq(ran, 1);
    cr_expect_not(ct_autocast_enabled());
    cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_F32);
}

Test(precision_autocast, rules_can_be_changed_per_op)
{
    cr_assert_eq(ct_autocast_set_rule(CT_AC_LINEAR, CT_AC_F32), CT_OK);
    cr_expect_eq(ct_autocast_rule_of(CT_AC_LINEAR), CT_AC_F32);
    cr_assert_eq(ct_autocast_set_rule(CT_AC_SOFTMAX, CT_AC_LOW), CT_OK);
    CT_AUTOCAST(CT_DTYPE_BF16) {
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_LINEAR, CT_DTYPE_F32), CT_DTYPE_F32);
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_SOFTMAX, CT_DTYPE_F32), CT_DTYPE_BF16);
        cr_expect_eq(ct_autocast_compute_dtype(CT_AC_MATMUL, CT_DTYPE_F32), CT_DTYPE_BF16); /* untouched */
    }
    char buf[2048];
    cr_expect(strstr(ct_autocast_policy_str(buf, sizeof buf), "linear: f32\n") != NULL, "%s", buf);
    ct_autocast_reset_rules();
    cr_expect_eq(ct_autocast_rule_of(CT_AC_LINEAR), CT_AC_FP8);
    cr_expect_eq(ct_autocast_rule_of(CT_AC_SOFTMAX), CT_AC_F32);
}

Test(precision_autocast, fp8_scopes_carry_their_state)
{
    ct_fp8_state *a = ct_fp8_state_new(NULL), *b = ct_fp8_state_new(NULL);
    cr_assert(a && b, "%s", ct_last_error());
    cr_expect_null(ct_autocast_fp8_state());
    cr_assert_eq(ct_autocast_begin_fp8(a), CT_OK);
    cr_expect_eq(ct_autocast_fp8_state(), a);
    /* the rest of the scope is bf16; fp8 outside an fp8 scope means low */
    cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_BF16);
    cr_expect_eq(ct_autocast_compute_dtype(CT_AC_LINEAR, CT_DTYPE_F32), CT_DTYPE_BF16);
    CT_AUTOCAST(CT_DTYPE_BF16) cr_expect_null(ct_autocast_fp8_state()); /* a plain scope inside: no fp8 */
    cr_assert_eq(ct_autocast_begin_fp8(b), CT_OK);
    cr_expect_eq(ct_autocast_fp8_state(), b);
    ct_autocast_end();
    cr_expect_eq(ct_autocast_fp8_state(), a);
    ct_autocast_end();
    cr_expect_null(ct_autocast_fp8_state());
    /* the process default */
    ct_autocast_set_default_fp8(a);
    cr_expect_eq(ct_autocast_fp8_state(), a);
    cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_BF16);
    CT_AUTOCAST(CT_DTYPE_F32) cr_expect_null(ct_autocast_fp8_state());
    cr_assert_eq(ct_autocast_set_default(CT_DTYPE_F32), CT_OK); /* off turns fp8 off too */
    cr_expect_null(ct_autocast_fp8_state());
    cr_expect_not(ct_autocast_enabled());
    cr_expect_eq(ct_autocast_begin_fp8(NULL), CT_ERR_INVALID);
    cr_expect_eq(ct_autocast_depth(), 0);
    ct_fp8_state_free(a);
    ct_fp8_state_free(b);
}

Test(precision_autocast, errors_name_what_is_wrong)
{
    cr_expect_eq(ct_autocast_begin(CT_DTYPE_F64), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "f64 is not an autocast dtype (bf16 or f16") != NULL, "%s", ct_last_error());
    cr_expect_eq(ct_autocast_set_default(CT_DTYPE_I32), CT_ERR_INVALID);
    cr_expect_not(ct_autocast_enabled());
    int ran = 0;
    CT_AUTOCAST(CT_DTYPE_I32) ran++; /* a failed begin skips the block */
    cr_expect_eq(ran, 0);
    cr_expect_eq(ct_autocast_set_rule(CT_AC_OP_COUNT, CT_AC_LOW), CT_ERR_INVALID);
    cr_expect_eq(ct_autocast_set_rule(CT_AC_LINEAR, (ct_autocast_rule)9), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "rule 9 for linear") != NULL, "%s", ct_last_error());
    for (int i = 0; i < 16; i++) cr_assert_eq(ct_autocast_begin(CT_DTYPE_BF16), CT_OK);
    cr_expect_eq(ct_autocast_begin(CT_DTYPE_BF16), CT_ERR_UNSUPPORTED);
    for (int i = 0; i < 16; i++) ct_autocast_end();
    cr_expect_not(ct_autocast_enabled());
    ct_autocast_end(); /* one too many: harmless */
}

Test(precision_autocast, an_f32_scope_turns_it_off_and_the_default_applies_below_scopes)
{
    CT_AUTOCAST(CT_DTYPE_BF16) {
        CT_AUTOCAST(CT_DTYPE_F32) {
            cr_expect_not(ct_autocast_enabled());
            cr_expect_eq(ct_autocast_compute_dtype(CT_AC_LINEAR, CT_DTYPE_F32), CT_DTYPE_F32);
        }
        cr_expect(ct_autocast_enabled());
    }
    cr_assert_eq(ct_autocast_set_default(CT_DTYPE_F16), CT_OK);
    cr_expect(ct_autocast_enabled());
    cr_expect_eq(ct_autocast_depth(), 0);
    cr_expect_eq(ct_autocast_compute_dtype(CT_AC_MATMUL, CT_DTYPE_F32), CT_DTYPE_F16);
    CT_AUTOCAST(CT_DTYPE_BF16) cr_expect_eq(ct_autocast_dtype(), CT_DTYPE_BF16); /* a scope still wins */
    CT_AUTOCAST(CT_DTYPE_F32) cr_expect_not(ct_autocast_enabled());
    cr_assert_eq(ct_autocast_set_default(CT_DTYPE_F32), CT_OK);
    cr_expect_not(ct_autocast_enabled());
}
