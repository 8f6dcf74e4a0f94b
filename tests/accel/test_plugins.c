/* Tests for accel/plugins.c: DeepSpeed and FSDP settings (plugins, a ds_config.json,
 * the launcher's variables) into the sharding engine's configuration, and every bad
 * value's error. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "accel/plugins.h"
#include "tests/env_vars.h"
#include "tests/tmpdir.h"

static const char *const launcher_vars[] = {
    "CTRAIN_USE_DEEPSPEED", "CTRAIN_ZERO_STAGE", "CTRAIN_OFFLOAD_OPTIMIZER_DEVICE", "CTRAIN_OFFLOAD_PARAM_DEVICE",
    "CTRAIN_DEEPSPEED_CONFIG_FILE", "CTRAIN_GRADIENT_CLIPPING", "CTRAIN_GRADIENT_ACCUMULATION_STEPS",
    "CTRAIN_USE_FSDP", "CTRAIN_FSDP_SHARDING_STRATEGY", "CTRAIN_FSDP_AUTO_WRAP_POLICY",
    "CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP", "CTRAIN_FSDP_MIN_NUM_PARAMS", "CTRAIN_FSDP_OFFLOAD_PARAMS",
    "CTRAIN_FSDP_BACKWARD_PREFETCH", "CTRAIN_FSDP_FORWARD_PREFETCH", "CTRAIN_FSDP_RESHARD_AFTER_FORWARD",
    "CTRAIN_FSDP_STATE_DICT_TYPE", "CTRAIN_FSDP_SYNC_MODULE_STATES", "CTRAIN_MIXED_PRECISION", "RANK", "WORLD_SIZE"};

static void clear_vars(void) { env_vars_clear(launcher_vars, sizeof launcher_vars / sizeof *launcher_vars); }

Test(plugins, nothing_set_is_replicated)
{
    clear_vars();
    ct_sharding_settings s;
    cr_assert_eq(ct_sharding_settings_resolve(NULL, NULL, true, &s), CT_OK, "%s", ct_last_error());
    cr_assert_eq(s.shard.strategy, CT_SHARD_NO_SHARD);
    cr_assert_null(s.source);
}

Test(plugins, fsdp_plugin_fields)
{
    clear_vars();
    ct_sharding_settings s;
    ct_fsdp_plugin p = {.sharding_strategy = "shard_grad_op",
                        .auto_wrap_policy = "TRANSFORMER_BASED_WRAP",
                        .transformer_cls_names_to_wrap = "Block, MLP",
                        .cpu_offload = true,
                        .backward_prefetch = "BACKWARD_POST",
                        .forward_prefetch = true,
                        .reshard_after_forward = CT_FLAG_OFF,
                        .state_dict_type = "SHARDED_STATE_DICT",
                        .sync_module_states = CT_FLAG_OFF};
    cr_assert_eq(ct_sharding_settings_resolve(NULL, &p, true, &s), CT_OK, "%s", ct_last_error());
    cr_assert_eq(s.shard.strategy, CT_SHARD_GRAD_OP);
    cr_assert_eq(s.shard.wrap.policy, CT_WRAP_TRANSFORMER);
    cr_assert_eq(s.shard.wrap.nclasses, 2);
    cr_assert_str_eq(s.shard.wrap.classes[0], "Block");
    cr_assert_str_eq(s.shard.wrap.classes[1], "MLP");
    cr_assert(s.shard.offload_optimizer && s.shard.forward_prefetch && s.shard.no_reshard_after_forward &&
              s.shard.no_broadcast && s.sharded_state_dict);
    cr_assert_eq(s.shard.backward_prefetch, CT_PREFETCH_BACKWARD_POST);
    cr_assert_eq(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.reduce_dtype = "BF16"}, true, &s), CT_OK);
    cr_assert_eq(s.shard.reduce_dtype, CT_DTYPE_BF16);
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.reduce_dtype = "int8"}, true, &s),
                 "reduce_dtype 'int8'; allowed: fp32, bf16, fp16");
    cr_assert_eq(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.param_dtype = "fp16"}, true, &s), CT_OK);
    cr_assert_eq(s.shard.param_dtype, CT_DTYPE_F16);
    cr_assert_eq(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.param_dtype = "fp32"}, true, &s), CT_OK);
    cr_assert_eq(s.shard.param_dtype, CT_DTYPE_F32, "fp32 given: kept f32 whatever the mixed precision");
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.param_dtype = "fp8"}, true, &s),
                 "param_dtype 'fp8'; allowed: fp32, bf16, fp16");
    /* defaults: FULL_SHARD, no_wrap, BACKWARD_PRE, reshard, sync; accelerate's numbers */
    cr_assert_eq(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){0}, true, &s), CT_OK);
    cr_assert(s.shard.strategy == CT_SHARD_FULL && s.shard.wrap.policy == CT_WRAP_NONE &&
              s.shard.backward_prefetch == CT_PREFETCH_BACKWARD_PRE && !s.shard.no_reshard_after_forward &&
              !s.shard.no_broadcast && !s.sharded_state_dict);
    const char *nums[] = {"1", "2", "3", "4"};
    ct_shard_strategy want[] = {CT_SHARD_FULL, CT_SHARD_GRAD_OP, CT_SHARD_NO_SHARD, CT_SHARD_HYBRID};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.sharding_strategy = nums[i]}, true, &s),
                     CT_OK);
        cr_assert_eq(s.shard.strategy, want[i], "sharding_strategy %s", nums[i]);
    }
    cr_assert_eq(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.auto_wrap_policy = "size_based_wrap"}, true, &s),
                 CT_OK);
    cr_assert_eq(s.shard.wrap.min_num_params, 100000000, "FSDP's default threshold");
}

Test(plugins, deepspeed_plugin_fields)
{
    clear_vars();
    ct_sharding_settings s;
    ct_shard_strategy want[] = {CT_SHARD_NO_SHARD, CT_SHARD_OPTIMIZER, CT_SHARD_GRAD_OP, CT_SHARD_FULL};
    for (int z = 0; z < 4; z++) {
        cr_assert_eq(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.zero_stage = z}, NULL, true, &s), CT_OK);
        cr_assert_eq(s.shard.strategy, want[z], "stage %d", z);
        cr_assert_eq(s.shard.wrap.policy, CT_WRAP_NONE);
    }
    ct_deepspeed_plugin p = {.zero_stage = 3, .offload_param_device = "CPU", .gradient_accumulation_steps = 4,
                             .gradient_clipping = 1.0};
    cr_assert_eq(ct_sharding_settings_resolve(&p, NULL, true, &s), CT_OK, "%s", ct_last_error());
    cr_assert(s.shard.offload_optimizer && s.gradient_accumulation_steps == 4 && s.gradient_clipping == 1.0);
}

Test(plugins, bad_values_name_the_setting_the_value_and_what_is_allowed)
{
    clear_vars();
    ct_sharding_settings s;
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.sharding_strategy = "ZERO3"}, true, &s),
                 "fsdp_plugin: sharding_strategy 'ZERO3'; allowed: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD");
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.auto_wrap_policy = "LAYER"}, true, &s),
                 "auto_wrap_policy 'LAYER'; allowed: NO_WRAP, TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP");
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.auto_wrap_policy = "TRANSFORMER_BASED_WRAP"},
                                              true, &s),
                 "needs transformer_cls_names_to_wrap");
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.backward_prefetch = "EARLY"}, true, &s),
                 "backward_prefetch 'EARLY'; allowed: BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH");
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.state_dict_type = "LOCAL"}, true, &s),
                 "state_dict_type 'LOCAL'; allowed: FULL_STATE_DICT, SHARDED_STATE_DICT");
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.min_num_params = -5}, true, &s),
                 "min_num_params -5");
    expect_error_naming(ct_sharding_settings_resolve(NULL, &(ct_fsdp_plugin){.sharding_strategy = "NO_SHARD",
                                                                      .cpu_offload = true},
                                              true, &s),
                 "cpu_offload needs a sharded strategy");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.zero_stage = 5}, NULL, true, &s),
                 "deepspeed_plugin: zero_stage 5; allowed: 0, 1, 2, 3");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.zero_stage = 2, .offload_param_device = "cpu"},
                                              NULL, true, &s),
                 "offload_param_device cpu needs ZeRO stage 3 (stage is 2)");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.offload_optimizer_device = "nvme"}, NULL, true,
                                              &s),
                 "offload_optimizer_device: offload device 'nvme'; allowed: none, cpu");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.offload_optimizer_device = "cpu"}, NULL, true,
                                              &s),
                 "needs ZeRO stage 1, 2 or 3");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.gradient_clipping = -1}, NULL, true, &s),
                 "gradient_clipping -1");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){0}, &(ct_fsdp_plugin){0}, true, &s),
                 "both a deepspeed_plugin and an fsdp_plugin");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.config_file = "/nonexistent/ds.json"}, NULL,
                                              true, &s),
                 "/nonexistent/ds.json");
}

static const char *write_text(const char *name, const char *text)
{
    const char *p = path_of(name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

/* The zero_optimization communication keys steer the engine when the file gives
 * them; absent or "auto" they leave its defaults. */
Test(plugins, a_ds_config_file_sets_the_buckets_and_overlap)
{
    clear_vars();
    make_tmpdir_with("/tmp/ct_plugins_");
    const char *path = write_text("ds.json", "{\"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 250000, "
                                             "\"allgather_bucket_size\": 70000, \"stage3_prefetch_bucket_size\": 90000, "
                                             "\"stage3_param_persistence_threshold\": 1000, \"overlap_comm\": false}}");
    ct_sharding_settings s;
    cr_assert_eq(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.config_file = path}, NULL, true, &s), CT_OK,
                 "%s", ct_last_error());
    cr_assert_eq(s.shard.strategy, CT_SHARD_FULL);
    cr_assert_eq(s.shard.wrap.policy, CT_WRAP_SIZE, "reduce_bucket_size makes the units");
    cr_assert_eq(s.shard.wrap.min_num_params, 250000);
    cr_assert_eq(s.shard.allgather_bucket, 70000);
    cr_assert_eq(s.shard.prefetch_bucket, 90000);
    cr_assert_eq(s.shard.backward_prefetch, CT_PREFETCH_BACKWARD_PRE);
    cr_assert_eq(s.shard.persistence_threshold, 1000);
    cr_assert(s.shard.no_overlap_comm);
    /* prefetch bucket 0: no prefetch, as in DeepSpeed; "auto" and absent keys: the defaults */
    path = write_text("ds0.json", "{\"zero_optimization\": {\"stage\": 3, \"stage3_prefetch_bucket_size\": 0, "
                                  "\"reduce_bucket_size\": \"auto\", \"overlap_comm\": true}}");
    cr_assert_eq(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.config_file = path}, NULL, true, &s), CT_OK,
                 "%s", ct_last_error());
    cr_assert_eq(s.shard.backward_prefetch, CT_PREFETCH_NONE);
    cr_assert(!s.shard.forward_prefetch);
    cr_assert_eq(s.shard.wrap.policy, CT_WRAP_NONE);
    cr_assert_eq(s.shard.allgather_bucket, 0);
    cr_assert_eq(s.shard.persistence_threshold, 0);
    cr_assert(!s.shard.no_overlap_comm);
    remove_tmpdir();
}

Test(plugins, a_ds_config_file_sets_stage_offload_precision_and_steps)
{
    clear_vars();
    make_tmpdir_with("/tmp/ct_plugins_");
    const char *path = write_text("ds.json", "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
                                             "{\"device\": \"cpu\"}}, \"bf16\": {\"enabled\": true}, "
                                             "\"gradient_accumulation_steps\": 3, \"gradient_clipping\": 0.5, "
                                             "\"communication_data_type\": \"bf16\", "
                                             "\"train_micro_batch_size_per_gpu\": \"auto\", \"train_batch_size\": 24}");
    ct_sharding_settings s;
    cr_assert_eq(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.config_file = path}, NULL, true, &s), CT_OK,
                 "%s", ct_last_error());
    cr_assert_eq(s.shard.strategy, CT_SHARD_GRAD_OP);
    cr_assert(s.shard.offload_optimizer);
    cr_assert_str_eq(s.mixed_precision, "bf16");
    cr_assert_eq(s.gradient_accumulation_steps, 3);
    cr_assert_eq(s.gradient_clipping, 0.5);
    cr_assert_eq(s.shard.reduce_dtype, CT_DTYPE_BF16, "communication_data_type");
    cr_assert(strstr(s.source, "ds.json"), "%s", s.source);
    /* prepare's check: 24 = micro 4 x 3 x 2 ranks holds, micro 5 does not */
    cr_assert_eq(ct_sharding_settings_check_ds(&s, 2, 4, 3, 0.5, "bf16"), CT_OK, "%s", ct_last_error());
    expect_error_naming(ct_sharding_settings_check_ds(&s, 2, 5, 3, 0.5, "bf16"), "does not multiply out");
    /* "auto" without a loader to take it from */
    expect_error_naming(ct_sharding_settings_check_ds(&s, 2, 0, 3, 0.5, "bf16"), "\"auto\"");
    /* a plugin value beside the file must agree with it */
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.zero_stage = 3, .config_file = path}, NULL,
                                              true, &s),
                 "zero_stage 3 given, but ds_config");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.gradient_accumulation_steps = 2,
                                                                     .config_file = path},
                                              NULL, true, &s),
                 "gradient_accumulation_steps 2 given, but ds_config");
    /* a malformed file names itself and the problem */
    const char *bad = write_text("bad.json", "{\"zero_optimization\": {\"stage\": \"three\"}}");
    expect_error_naming(ct_sharding_settings_resolve(&(ct_deepspeed_plugin){.config_file = bad}, NULL, true, &s),
                 "bad.json");
    remove_tmpdir();
}

Test(plugins, the_launchers_variables)
{
    clear_vars();
    ct_sharding_settings s;
    setenv("CTRAIN_USE_FSDP", "1", 1);
    setenv("CTRAIN_FSDP_SHARDING_STRATEGY", "HYBRID_SHARD", 1);
    setenv("CTRAIN_FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP", 1);
    setenv("CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP", "Block", 1);
    setenv("CTRAIN_FSDP_RESHARD_AFTER_FORWARD", "false", 1);
    setenv("CTRAIN_FSDP_BACKWARD_PREFETCH", "NO_PREFETCH", 1);
    cr_assert_eq(ct_sharding_settings_resolve(NULL, NULL, true, &s), CT_OK, "%s", ct_last_error());
    cr_assert_eq(s.shard.strategy, CT_SHARD_HYBRID);
    cr_assert_eq(s.shard.wrap.policy, CT_WRAP_TRANSFORMER);
    cr_assert_str_eq(s.shard.wrap.classes[0], "Block");
    cr_assert(s.shard.no_reshard_after_forward);
    cr_assert_eq(s.shard.backward_prefetch, CT_PREFETCH_NONE);
    setenv("CTRAIN_FSDP_OFFLOAD_PARAMS", "perhaps", 1);
    expect_error_naming(ct_sharding_settings_resolve(NULL, NULL, true, &s), "CTRAIN_FSDP_OFFLOAD_PARAMS: boolean 'perhaps'");
    clear_vars();
    setenv("CTRAIN_USE_DEEPSPEED", "1", 1);
    setenv("CTRAIN_ZERO_STAGE", "1", 1);
    cr_assert_eq(ct_sharding_settings_resolve(NULL, NULL, true, &s), CT_OK, "%s", ct_last_error());
    cr_assert_eq(s.shard.strategy, CT_SHARD_OPTIMIZER);
    setenv("CTRAIN_ZERO_STAGE", "7", 1);
    expect_error_naming(ct_sharding_settings_resolve(NULL, NULL, true, &s), "CTRAIN_ZERO_STAGE='7'");
    setenv("CTRAIN_USE_FSDP", "1", 1);
    expect_error_naming(ct_sharding_settings_resolve(NULL, NULL, true, &s), "both set");
    clear_vars();
}

Test(plugins, the_accelerator_takes_them_and_refuses_two_sources)
{
    clear_vars();
    ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){
        .shard = {.strategy = CT_SHARD_FULL}, .fsdp_plugin = &(ct_fsdp_plugin){.sharding_strategy = "FULL_SHARD"}});
    cr_assert_null(acc);
    cr_assert(strstr(ct_last_error(), "shard.strategy FULL and a fsdp_plugin were both given"), "%s", ct_last_error());
    acc = ct_accelerator_new(&(ct_accelerator_config){.fsdp_plugin = &(ct_fsdp_plugin){.sharding_strategy = "x"}});
    cr_assert_null(acc);
    cr_assert(strstr(ct_last_error(), "accelerator: fsdp_plugin: sharding_strategy 'x'"), "%s", ct_last_error());
    /* a sharded strategy needs the model */
    acc = ct_accelerator_new(&(ct_accelerator_config){.deepspeed_plugin = &(ct_deepspeed_plugin){.zero_stage = 2}});
    cr_assert_not_null(acc, "%s", ct_last_error());
    cr_assert_eq(ct_accelerator_prepare(acc, NULL, NULL, NULL, NULL), CT_ERR_INVALID);
    cr_assert(strstr(ct_last_error(), "strategy GRAD_OP shards a model"), "%s", ct_last_error());
    ct_accelerator_free(acc);
}
