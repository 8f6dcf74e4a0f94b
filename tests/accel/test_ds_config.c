/* Tests for accel/ds_config.c: DeepSpeed's ds_config.json as ctrain reads it. The
 * expected values are DeepSpeed's documented defaults and rules (batch sizes that
 * multiply out, "auto" filled as Accelerate fills it), written out here by hand. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "accel/ds_config.h"
#include "tests/tmpdir.h"

static ct_status parse(const char *json, ct_ds_config *c) { return ct_ds_config_parse(json, strlen(json), "ds.json", c); }

#define EXPECT_BAD(json, ...)                                                                          \
    do {                                                                                               \
        ct_ds_config c_;                                                                               \
        cr_assert_neq(parse(json, &c_), CT_OK, "accepted: %s", json);                                  \
        const char *want_[] = {__VA_ARGS__};                                                           \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof *want_; i_++)                                   \
            cr_expect(strstr(ct_last_error(), want_[i_]) != NULL, "%s\n  error: %s\n  wants: %s", json, \
                      ct_last_error(), want_[i_]);                                                     \
    } while (0)

/* The zero_optimization block of Accelerate's ZeRO-3 offload example, with fp16. */
static const char *ZERO3 = "{\n"
                           "  \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"loss_scale_window\": 500,\n"
                           "           \"initial_scale_power\": 12, \"hysteresis\": 3, \"min_loss_scale\": 0.5},\n"
                           "  \"zero_optimization\": {\n"
                           "    \"stage\": 3,\n"
                           "    \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true},\n"
                           "    \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true},\n"
                           "    \"overlap_comm\": true, \"contiguous_gradients\": false,\n"
                           "    \"reduce_bucket_size\": 5e7, \"allgather_bucket_size\": 2e8,\n"
                           "    \"stage3_prefetch_bucket_size\": \"auto\",\n"
                           "    \"stage3_param_persistence_threshold\": \"auto\"\n"
                           "  },\n"
                           "  \"gradient_accumulation_steps\": 4,\n"
                           "  \"gradient_clipping\": 1.0,\n"
                           "  \"train_batch_size\": \"auto\",\n"
                           "  \"train_micro_batch_size_per_gpu\": 2\n"
                           "}\n";

Test(ds_config, every_key_is_read)
{
    ct_ds_config c;
    cr_assert_eq(parse(ZERO3, &c), CT_OK, "%s", ct_last_error());
    cr_expect(c.fp16.enabled && c.from[CT_DS_FP16] == CT_DS_GIVEN);
    cr_expect_eq(c.fp16.loss_scale, 0);
    cr_expect_eq(c.fp16.loss_scale_window, 500);
    cr_expect_eq(c.fp16.initial_scale_power, 12);
    cr_expect_eq(c.fp16.hysteresis, 3);
    cr_expect_eq(c.fp16.min_loss_scale, 0.5);
    cr_expect_eq(c.zero.stage, 3);
    cr_expect_eq(c.zero.offload_optimizer, CT_DS_OFFLOAD_CPU);
    cr_expect_eq(c.zero.offload_param, CT_DS_OFFLOAD_CPU);
    cr_expect(c.zero.overlap_comm && !c.zero.contiguous_gradients);
    cr_expect_eq(c.zero.reduce_bucket_size, 50000000);
    cr_expect_eq(c.zero.allgather_bucket_size, 200000000);
    cr_expect_eq(c.from[CT_DS_PREFETCH_BUCKET], CT_DS_AUTO);
    cr_expect_eq(c.from[CT_DS_PERSISTENCE], CT_DS_AUTO);
    cr_expect_eq(c.gradient_accumulation_steps, 4);
    cr_expect_eq(c.gradient_clipping, 1.0);
    cr_expect_eq(c.from[CT_DS_TRAIN_BATCH], CT_DS_AUTO);
    cr_expect_eq(c.train_micro_batch_size_per_gpu, 2);
    cr_expect_eq(c.n_warnings, 0, "%s", c.warnings[0]);
    cr_assert_eq(parse("{\"communication_data_type\": \"bf16\"}", &c), CT_OK, "%s", ct_last_error());
    cr_expect_str_eq(c.communication_data_type, "bf16");
}

Test(ds_config, absent_keys_take_deepspeeds_defaults)
{
    ct_ds_config c;
    cr_assert_eq(parse("{}", &c), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.zero.stage, 0);
    cr_expect_eq(c.zero.offload_optimizer, CT_DS_OFFLOAD_NONE);
    cr_expect_eq(c.zero.reduce_bucket_size, 500000000);
    cr_expect_eq(c.zero.allgather_bucket_size, 500000000);
    cr_expect_eq(c.zero.stage3_prefetch_bucket_size, 50000000);
    cr_expect_eq(c.zero.stage3_param_persistence_threshold, 100000);
    cr_expect(!c.zero.overlap_comm && c.zero.contiguous_gradients);
    cr_expect(!c.fp16.enabled && !c.bf16_enabled);
    cr_expect_eq(c.fp16.initial_scale_power, 16); /* 2^16 = 65536 */
    cr_expect_eq(c.fp16.loss_scale_window, 1000);
    cr_expect_eq(c.fp16.hysteresis, 2);
    cr_expect_eq(c.fp16.min_loss_scale, 1);
    for (int f = 0; f < CT_DS_FIELD_COUNT; f++) cr_expect_eq(c.from[f], CT_DS_ABSENT);
    cr_assert_eq(parse("{\"bfloat16\": {\"enabled\": true}}", &c), CT_OK, "%s", ct_last_error());
    cr_expect(c.bf16_enabled, "bfloat16 is DeepSpeed's other name for the section");
}

Test(ds_config, unknown_keys_warn_by_name)
{
    ct_ds_config c;
    const char *json = "{\"steps_per_print\": 10, \"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 1e9,"
                       " \"offload_optimizer\": {\"device\": \"none\", \"buffer_count\": 4}},"
                       " \"fp16\": {\"auto_cast\": false}, \"optimizer\": {\"type\": \"AdamW\"}}";
    cr_assert_eq(parse(json, &c), CT_OK, "%s", ct_last_error());
    cr_assert_eq(c.n_warnings, 5);
    cr_expect_str_eq(c.warnings[0], "ds_config 'ds.json': unknown key 'steps_per_print' (ignored)");
    cr_expect_str_eq(c.warnings[1], "ds_config 'ds.json': unknown key 'zero_optimization.sub_group_size' (ignored)");
    cr_expect_str_eq(c.warnings[2],
                     "ds_config 'ds.json': unknown key 'zero_optimization.offload_optimizer.buffer_count' (ignored)");
    cr_expect_str_eq(c.warnings[3], "ds_config 'ds.json': unknown key 'fp16.auto_cast' (ignored)");
    cr_expect_str_eq(c.warnings[4], "ds_config 'ds.json': 'optimizer' is not used: ctrain steps the optimizer given "
                                    "to ct_accelerator_prepare");
    cr_expect_eq(c.zero.stage, 2);
}

Test(ds_config, bad_values_name_key_value_and_what_is_allowed)
{
    EXPECT_BAD("{\"zero_optimization\": {\"stage\": 4}}", "ds_config 'ds.json'", "zero_optimization.stage = 4",
               "expected a whole number from 0 to 3");
    EXPECT_BAD("{\"zero_optimization\": {\"stage\": 1.5}}", "zero_optimization.stage = 1.5");
    EXPECT_BAD("{\"communication_data_type\": \"int8\"}", "communication_data_type = \"int8\"",
               "expected \"fp32\", \"fp16\" or \"bf16\"");
    EXPECT_BAD("{\"zero_optimization\": {\"stage\": \"auto\"}}", "zero_optimization.stage = \"auto\"",
               "from 0 to 3");
    EXPECT_BAD("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}, \"stage\": 3}}",
               "zero_optimization.offload_optimizer.device = \"nvme\"", "\"none\" or \"cpu\"", "NVMe");
    EXPECT_BAD("{\"zero_optimization\": {\"offload_param\": {\"device\": \"gpu\"}}}",
               "zero_optimization.offload_param.device = \"gpu\"", "expected \"none\" or \"cpu\"");
    EXPECT_BAD("{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}",
               "offload_param.device = \"cpu\" needs zero_optimization.stage 3 (it is 2)");
    EXPECT_BAD("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}",
               "offload_optimizer.device = \"cpu\" needs zero_optimization.stage 1, 2 or 3 (it is 0)");
    EXPECT_BAD("{\"zero_optimization\": {\"reduce_bucket_size\": -1}}", "zero_optimization.reduce_bucket_size = -1",
               "a whole number >= 1 or \"auto\"");
    EXPECT_BAD("{\"zero_optimization\": {\"overlap_comm\": 1}}", "zero_optimization.overlap_comm = 1",
               "expected true or false");
    EXPECT_BAD("{\"zero_optimization\": [3]}", "zero_optimization = [3]", "expected an object");
    EXPECT_BAD("{\"fp16\": {\"enabled\": \"yes\"}}", "fp16.enabled = \"yes\"", "true, false or \"auto\"");
    EXPECT_BAD("{\"fp16\": {\"initial_scale_power\": 70}}", "fp16.initial_scale_power = 70", "from 0 to 63");
    EXPECT_BAD("{\"fp16\": {\"hysteresis\": 0}}", "fp16.hysteresis = 0", "a whole number from 1 to 2147483647");
    EXPECT_BAD("{\"fp16\": {\"min_loss_scale\": 0}}", "fp16.min_loss_scale = 0", "a number > 0");
    EXPECT_BAD("{\"fp16\": {\"loss_scale\": -2}}", "fp16.loss_scale = -2", "a number >= 0");
    EXPECT_BAD("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", "both true");
    EXPECT_BAD("{\"bf16\": {}, \"bfloat16\": {}}", "the same section");
    EXPECT_BAD("{\"gradient_clipping\": -1}", "gradient_clipping = -1", "a number >= 0 or \"auto\"");
    EXPECT_BAD("{\"train_batch_size\": 0}", "train_batch_size = 0", ">= 1 or \"auto\"");
    EXPECT_BAD("{\"train_micro_batch_size_per_gpu\": 1e300}", "train_micro_batch_size_per_gpu = 1e+300");
    EXPECT_BAD("{\"gradient_accumulation_steps\": null}", "gradient_accumulation_steps = null");
    EXPECT_BAD("{\"zero_optimization\": {\"stage\": 1}, \"zero_optimization\": {\"stage\": 2}}",
               "zero_optimization is given twice");
    EXPECT_BAD("[1, 2]", "the top level = [1,2]", "expected an object");
}

Test(ds_config, broken_json_says_where)
{
    EXPECT_BAD("{\n  \"fp16\": {\"enabled\": true,}\n}", "ds_config 'ds.json': not valid JSON (line 2");
    EXPECT_BAD("{\"fp16\": {}} {\"bf16\": {}}", "text after the JSON object (line 1, column 14)");
    EXPECT_BAD("", "not valid JSON");
    ct_ds_config c;
    cr_assert_neq(ct_ds_config_parse("{\"zero_optimization\": {\"stage\": 2}, \"x\": [", 42, "a.json", &c), CT_OK);
    cr_expect_eq(c.zero.stage, 0, "a failed parse leaves the defaults");
}

static ct_ds_defaults defaults(int world, int64_t micro)
{
    return (ct_ds_defaults){.world_size = world, .micro_batch = micro, .grad_accum = 0, .grad_clip = -1};
}

Test(ds_config, batch_sizes_multiply_out)
{
    ct_ds_config c;
    ct_ds_defaults d = defaults(2, 0);
    /* micro 2 x accumulation 4 x 2 ranks: train_batch_size "auto" becomes 16 */
    cr_assert_eq(parse(ZERO3, &c), CT_OK);
    cr_assert_eq(ct_ds_config_resolve(&c, "ds.json", &d), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.train_batch_size, 16);
    cr_expect_eq(c.train_micro_batch_size_per_gpu, 2);
    cr_expect_eq(c.gradient_accumulation_steps, 4);
    /* train 24 with micro 3 on 2 ranks: accumulation 4 */
    cr_assert_eq(parse("{\"train_batch_size\": 24, \"train_micro_batch_size_per_gpu\": 3}", &c), CT_OK);
    cr_assert_eq(ct_ds_config_resolve(&c, "ds.json", &d), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.gradient_accumulation_steps, 4);
    /* train 24 with accumulation 3 on 2 ranks: micro 4 */
    cr_assert_eq(parse("{\"train_batch_size\": 24, \"gradient_accumulation_steps\": 3}", &c), CT_OK);
    cr_assert_eq(ct_ds_config_resolve(&c, "ds.json", &d), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.train_micro_batch_size_per_gpu, 4);
    /* train 24 alone: accumulation 1, micro 12 */
    cr_assert_eq(parse("{\"train_batch_size\": 24}", &c), CT_OK);
    cr_assert_eq(ct_ds_config_resolve(&c, "ds.json", &d), CT_OK, "%s", ct_last_error());
    cr_expect(c.gradient_accumulation_steps == 1 && c.train_micro_batch_size_per_gpu == 12);
    /* everything "auto": the loader's batch 5 and the Accelerator's accumulation 3 */
    cr_assert_eq(parse("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\","
                       " \"gradient_accumulation_steps\": \"auto\"}",
                       &c),
                 CT_OK);
    d = defaults(2, 5);
    d.grad_accum = 3;
    cr_assert_eq(ct_ds_config_resolve(&c, "ds.json", &d), CT_OK, "%s", ct_last_error());
    cr_expect(c.train_micro_batch_size_per_gpu == 5 && c.gradient_accumulation_steps == 3 && c.train_batch_size == 30);
}

#define EXPECT_RESOLVE_BAD(json, d, ...)                                                             \
    do {                                                                                             \
        ct_ds_config c_;                                                                             \
        cr_assert_eq(parse(json, &c_), CT_OK, "%s", ct_last_error());                                \
        cr_assert_neq(ct_ds_config_resolve(&c_, "ds.json", &(d)), CT_OK, "resolved: %s", json);      \
        const char *want_[] = {__VA_ARGS__};                                                         \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof *want_; i_++)                                 \
            cr_expect(strstr(ct_last_error(), want_[i_]) != NULL, "%s\n  error: %s\n  wants: %s", json, \
                      ct_last_error(), want_[i_]);                                                   \
    } while (0)

Test(ds_config, contradictions_are_reported)
{
    ct_ds_defaults d = defaults(2, 0);
    EXPECT_RESOLVE_BAD("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4, "
                       "\"gradient_accumulation_steps\": 2}",
                       d, "ds_config 'ds.json': train_batch_size = 32 does not multiply out",
                       "train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 2 = 16");
    EXPECT_RESOLVE_BAD("{\"train_batch_size\": 25, \"train_micro_batch_size_per_gpu\": 4}", d,
                       "train_batch_size = 25 is not a multiple of train_micro_batch_size_per_gpu 4 x world size 2");
    EXPECT_RESOLVE_BAD("{\"train_batch_size\": 9}", d,
                       "train_batch_size = 9 is not a multiple of gradient_accumulation_steps 1 x world size 2");
    EXPECT_RESOLVE_BAD("{\"gradient_accumulation_steps\": 2}", d, "the micro batch size is not known");
    EXPECT_RESOLVE_BAD("{\"train_micro_batch_size_per_gpu\": \"auto\"}", d,
                       "train_micro_batch_size_per_gpu is \"auto\", but no data loader was prepared");
    ct_ds_defaults e = defaults(1, 8);
    EXPECT_RESOLVE_BAD("{\"train_micro_batch_size_per_gpu\": 4}", e,
                       "train_micro_batch_size_per_gpu = 4, but the prepared data loader's batch size is 8");
    e.grad_accum = 2;
    EXPECT_RESOLVE_BAD("{\"gradient_accumulation_steps\": 4}", e,
                       "gradient_accumulation_steps = 4, but the Accelerator was given 2");
    e.grad_accum = 0, e.grad_clip = 0.5;
    EXPECT_RESOLVE_BAD("{\"gradient_clipping\": 1.0}", e, "gradient_clipping = 1, but the Accelerator was given 0.5");
    e.grad_clip = -1, e.mixed_precision = "bf16";
    EXPECT_RESOLVE_BAD("{\"fp16\": {\"enabled\": true}}", e,
                       "fp16.enabled = true, but mixed_precision is \"bf16\"");
    EXPECT_RESOLVE_BAD("{\"bf16\": {\"enabled\": false}}", e,
                       "bf16.enabled = false, but mixed_precision is \"bf16\"");
}

Test(ds_config, auto_precision_clipping_and_buckets)
{
    ct_ds_config c;
    ct_ds_defaults d = defaults(1, 4);
    d.mixed_precision = "fp16", d.grad_clip = 2.0, d.hidden_size = 768;
    cr_assert_eq(parse("{\"fp16\": {\"enabled\": \"auto\"}, \"bf16\": {\"enabled\": \"auto\"},"
                       " \"gradient_clipping\": \"auto\", \"zero_optimization\": {\"stage\": 3,"
                       " \"reduce_bucket_size\": \"auto\", \"stage3_prefetch_bucket_size\": \"auto\","
                       " \"stage3_param_persistence_threshold\": \"auto\"}}",
                       &c),
                 CT_OK, "%s", ct_last_error());
    cr_assert_eq(ct_ds_config_resolve(&c, "ds.json", &d), CT_OK, "%s", ct_last_error());
    cr_expect(c.fp16.enabled && !c.bf16_enabled);
    cr_expect_eq(c.gradient_clipping, 2.0);
    /* Accelerate's fill: hidden^2, int(0.9 hidden^2), 10 hidden */
    cr_expect_eq(c.zero.reduce_bucket_size, 589824);
    cr_expect_eq(c.zero.stage3_prefetch_bucket_size, 530841);
    cr_expect_eq(c.zero.stage3_param_persistence_threshold, 7680);
    cr_expect_eq(c.zero.allgather_bucket_size, 500000000, "not \"auto\": DeepSpeed's default stays");
    /* absent sections follow mixed_precision too; no mixed precision: both off */
    cr_assert_eq(parse("{}", &c), CT_OK);
    d.mixed_precision = "bf16";
    cr_assert_eq(ct_ds_config_resolve(&c, "ds.json", &d), CT_OK, "%s", ct_last_error());
    cr_expect(c.bf16_enabled && !c.fp16.enabled);
    cr_assert_eq(parse("{}", &c), CT_OK);
    d.mixed_precision = NULL, d.grad_clip = -1;
    cr_assert_eq(ct_ds_config_resolve(&c, "ds.json", &d), CT_OK, "%s", ct_last_error());
    cr_expect(!c.bf16_enabled && !c.fp16.enabled);
    cr_expect_eq(c.gradient_clipping, 0);
}

Test(ds_config, files)
{
    make_tmpdir_with("/tmp/ct_dscfg_");
    char path[128];
    snprintf(path, sizeof path, "%s/ds_config.json", tmpdir);
    ct_ds_config c;
    cr_assert_neq(ct_ds_config_load(path, &c), CT_OK);
    cr_expect(strstr(ct_last_error(), "ds_config: cannot open '") && strstr(ct_last_error(), "ds_config.json': No such"),
              "%s", ct_last_error());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(ZERO3, f);
    fclose(f);
    cr_assert_eq(ct_ds_config_load(path, &c), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.zero.stage, 3);
    f = fopen(path, "w");
    fputs("{\"zero_optimization\": {\"stage\": 9}}", f);
    fclose(f);
    cr_assert_neq(ct_ds_config_load(path, &c), CT_OK);
    cr_expect(strstr(ct_last_error(), path) && strstr(ct_last_error(), "zero_optimization.stage = 9"), "%s",
              ct_last_error());
    remove_tree(tmpdir);
}
