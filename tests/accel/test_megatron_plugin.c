/* Tests for accel/megatron_plugin.c: the Megatron-LM plugin's values and the
 * launcher's variables, checked before anything is built (the training runs are in
 * test_megatron.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "tests/env_vars.h"

/* ---- the plugin's settings ------------------------------------------------------- */

static const char *const VARS[] = {"CTRAIN_USE_MEGATRON_LM", "CTRAIN_MEGATRON_TP_DEGREE", "CTRAIN_MEGATRON_PP_DEGREE",
                                   "CTRAIN_MEGATRON_NUM_MICRO_BATCHES", "CTRAIN_MEGATRON_SEQUENCE_PARALLELISM",
                                   "CTRAIN_MEGATRON_USE_DISTRIBUTED_OPTIMIZER", "CTRAIN_MEGATRON_GRADIENT_CLIPPING"};

static void clear_vars(void) { env_vars_clear(VARS, sizeof VARS / sizeof *VARS); }

Test(megatron, the_launchers_variables_are_read_and_checked)
{
    clear_vars();
    bool on = true;
    ct_megatron_lm_plugin p;
    cr_assert_eq(ct_megatron_lm_plugin_from_env(&on, &p), CT_OK, "%s", ct_last_error());
    cr_assert(!on);
    setenv("CTRAIN_USE_MEGATRON_LM", "1", 1);
    setenv("CTRAIN_MEGATRON_TP_DEGREE", "4", 1);
    setenv("CTRAIN_MEGATRON_SEQUENCE_PARALLELISM", "true", 1);
    setenv("CTRAIN_MEGATRON_GRADIENT_CLIPPING", "0.25", 1);
    cr_assert_eq(ct_megatron_lm_plugin_from_env(&on, &p), CT_OK, "%s", ct_last_error());
    cr_assert(on);
    cr_assert_eq(p.tp_degree, 4);
    cr_assert_eq(p.pp_degree, 1);
    cr_assert_eq(p.num_micro_batches, 1);
    cr_assert(p.sequence_parallelism && !p.use_distributed_optimizer);
    cr_assert_eq(p.gradient_clipping, 0.25);
    setenv("CTRAIN_MEGATRON_TP_DEGREE", "two", 1);
    expect_error_naming(ct_megatron_lm_plugin_from_env(&on, &p), "CTRAIN_MEGATRON_TP_DEGREE='two' is not an integer >= 1");
    setenv("CTRAIN_MEGATRON_TP_DEGREE", "2", 1);
    setenv("CTRAIN_MEGATRON_SEQUENCE_PARALLELISM", "maybe", 1);
    expect_error_naming(ct_megatron_lm_plugin_from_env(&on, &p),
               "CTRAIN_MEGATRON_SEQUENCE_PARALLELISM='maybe'; allowed: true, false");
    setenv("CTRAIN_MEGATRON_SEQUENCE_PARALLELISM", "0", 1);
    setenv("CTRAIN_MEGATRON_GRADIENT_CLIPPING", "-1", 1);
    expect_error_naming(ct_megatron_lm_plugin_from_env(&on, &p),
               "CTRAIN_MEGATRON_GRADIENT_CLIPPING='-1'; expected a number >= 0");
    /* the Accelerator refuses a bad variable, naming it */
    setenv("CTRAIN_MEGATRON_GRADIENT_CLIPPING", "1", 1);
    setenv("CTRAIN_MEGATRON_PP_DEGREE", "0", 1);
    cr_assert_null(ct_accelerator_new(NULL));
    cr_assert(strstr(ct_last_error(), "CTRAIN_MEGATRON_PP_DEGREE='0'"), "%s", ct_last_error());
    clear_vars();
}

Test(megatron, plugin_values_are_checked)
{
    ct_megatron_lm_plugin r;
    cr_assert_eq(ct_megatron_lm_plugin_resolve(&(ct_megatron_lm_plugin){0}, 5, &r), CT_OK, "%s", ct_last_error());
    cr_assert(r.tp_degree == 1 && r.pp_degree == 1 && r.num_micro_batches == 1);
    expect_error_naming(ct_megatron_lm_plugin_resolve(&(ct_megatron_lm_plugin){.tp_degree = -2}, 4, &r),
               "tp_degree = -2; expected >= 1");
    expect_error_naming(ct_megatron_lm_plugin_resolve(&(ct_megatron_lm_plugin){.tp_degree = 2, .pp_degree = 2}, 6, &r),
               "world size 6 is not divisible by tp_degree 2 x pp_degree 2 = 4");
    expect_error_naming(ct_megatron_lm_plugin_resolve(&(ct_megatron_lm_plugin){.sequence_parallelism = true}, 2, &r),
               "sequence_parallelism needs tp_degree > 1");
    expect_error_naming(ct_megatron_lm_plugin_resolve(&(ct_megatron_lm_plugin){.gradient_clipping = NAN}, 2, &r),
               "gradient_clipping = nan");
    /* one process, tp 1: nothing to shard, the plain loop runs */
    clear_vars();
    ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.megatron_lm_plugin = &(ct_megatron_lm_plugin){0}});
    cr_assert_not_null(acc, "%s", ct_last_error());
    ct_accelerator_free(acc);
    /* with a sharding plugin too: the engine over the data-parallel axis */
    acc = ct_accelerator_new(&(ct_accelerator_config){.megatron_lm_plugin = &(ct_megatron_lm_plugin){.tp_degree = 1},
                                                      .fsdp_plugin = &(ct_fsdp_plugin){0}});
    cr_assert_not_null(acc, "%s", ct_last_error());
    ct_accelerator_free(acc);
}
