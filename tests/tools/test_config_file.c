/* Tests for the launch configuration file (tools/config_file.c, config_write.c,
 * config_launch.c) through the `ctrain` command (CTRAIN_BIN): what `ctrain config
 * default` and `ctrain config update` write is compared with YAML written out here
 * by hand in Accelerate's layout (yaml.safe_dump: keys sorted, 'no' quoted), and
 * every error names the file, the line, the key and what is allowed there. */
#include <cjson/cJSON.h>
#include <sys/stat.h>

#include "tests/tools/config_run.h"

TestSuite(config_file, .init = setup_dir, .fini = remove_tmpdir);

/* What `accelerate config default` writes on a machine without a GPU (its JSON, as YAML). */
static const char DEFAULT_CPU[] = "compute_environment: LOCAL_MACHINE\n"
                                  "debug: false\n"
                                  "distributed_type: 'NO'\n"
                                  "downcast_bf16: false\n"
                                  "enable_cpu_affinity: false\n"
                                  "machine_rank: 0\n"
                                  "main_training_function: main\n"
                                  "mixed_precision: 'no'\n"
                                  "num_machines: 1\n"
                                  "num_processes: 1\n"
                                  "rdzv_backend: static\n"
                                  "same_network: false\n"
                                  "tpu_use_cluster: false\n"
                                  "tpu_use_sudo: false\n"
                                  "use_cpu: true\n";

static void skip_with_gpu(const char *text)
{
    if (strstr(text, "use_cpu: false")) cr_skip_test("a GPU is visible: the CPU machine's defaults are not written here");
}

Test(config_file, default_writes_accelerates_layout, .timeout = 30)
{
    cr_assert_eq(ctrain("config default"), 0, "%s", out);
    char want[512];
    snprintf(want, sizeof want, "ctrain configuration saved at %s/default.yaml\n", tmpdir);
    cr_assert_str_eq(out, want);
    skip_with_gpu(read_text("default.yaml"));
    cr_assert_str_eq(read_text("default.yaml"), DEFAULT_CPU);

    /* its folder is created; --mixed_precision changes that one line */
    cr_assert_eq(ctrain("config default --config_file sub/dir/c.yaml --mixed_precision bf16"), 0, "%s", out);
    char bf16[sizeof DEFAULT_CPU];
    snprintf(bf16, sizeof bf16, "%s", DEFAULT_CPU);
    char *mp = strstr(bf16, "mixed_precision: 'no'\n");
    memcpy(mp, "mixed_precision: bf16\n", 22); /* the same length as the 'no' line */
    cr_assert_str_eq(read_text("sub/dir/c.yaml"), bf16);
    cr_assert_neq(ctrain("config default --config_file x.yaml --mixed_precision fp32"), 0);
    assert_has("--mixed_precision 'fp32': expected no, fp16, bf16 or fp8");
}

Test(config_file, default_leaves_an_existing_file_alone, .timeout = 30)
{
    write_file("default.yaml", "# mine\ndistributed_type: MULTI_CPU\nnum_processes: 4\n");
    /* as `accelerate config default`: says so and succeeds */
    cr_assert_eq(ctrain("config default --mixed_precision fp16"), 0, "%s", out);
    assert_has("Configuration already exists at ");
    assert_has("will not override");
    cr_assert_str_eq(read_text("default.yaml"), "# mine\ndistributed_type: MULTI_CPU\nnum_processes: 4\n");
}

Test(config_file, a_json_name_gets_json, .timeout = 30)
{
    cr_assert_eq(ctrain("config default --config_file c.json --mixed_precision fp16"), 0, "%s", out);
    cJSON *j = cJSON_Parse(read_text("c.json"));
    cr_assert_not_null(j, "not JSON:\n%s", read_text("c.json"));
    cr_assert_str_eq(cJSON_GetObjectItem(j, "compute_environment")->valuestring, "LOCAL_MACHINE");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "distributed_type")->valuestring, "NO");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "mixed_precision")->valuestring, "fp16");
    cr_assert_eq(cJSON_GetObjectItem(j, "num_processes")->valuedouble, 1);
    cr_assert(cJSON_IsBool(cJSON_GetObjectItem(j, "debug")) && !cJSON_IsTrue(cJSON_GetObjectItem(j, "debug")));
    cr_assert_eq(cJSON_GetArraySize(j), 15);
    cJSON_Delete(j);
    /* and it reads back (YAML includes JSON) */
    cr_assert_eq(ctrain("config show c.json"), 0, "%s", out);
    assert_has("\nmixed_precision: fp16\n");
}

/* An FSDP file of an older Accelerate: fp16: true, a numeric strategy, the old
 * prefetch key, dynamo_backend, and keys the current writer writes missing. */
static const char OLD_FSDP[] = "compute_environment: LOCAL_MACHINE\n"
                               "distributed_type: FSDP\n"
                               "dynamo_backend: INDUCTOR\n"
                               "fp16: true\n"
                               "fsdp_config:\n"
                               "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                               "  fsdp_backward_prefetch_policy: BACKWARD_POST\n"
                               "  fsdp_offload_params: true\n"
                               "  fsdp_sharding_strategy: 2\n"
                               "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                               "  fsdp_transformer_layer_cls_to_wrap: Block\n"
                               "machine_rank: 0\n"
                               "main_process_port: 29600\n"
                               "main_training_function: main\n"
                               "num_machines: 1\n"
                               "num_processes: 2\n"
                               "use_cpu: false\n";

static const char NEW_FSDP[] = "compute_environment: LOCAL_MACHINE\n"
                               "debug: false\n"
                               "distributed_type: FSDP\n"
                               "downcast_bf16: false\n"
                               "enable_cpu_affinity: false\n"
                               "fsdp_config:\n"
                               "  fsdp_activation_checkpointing: false\n"
                               "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                               "  fsdp_backward_prefetch: BACKWARD_POST\n"
                               "  fsdp_cpu_ram_efficient_loading: true\n"
                               "  fsdp_forward_prefetch: false\n"
                               "  fsdp_offload_params: true\n"
                               "  fsdp_sharding_strategy: SHARD_GRAD_OP\n"
                               "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                               "  fsdp_sync_module_states: true\n"
                               "  fsdp_transformer_layer_cls_to_wrap: Block\n"
                               "  fsdp_use_orig_params: true\n"
                               "machine_rank: 0\n"
                               "main_process_port: 29600\n"
                               "main_training_function: main\n"
                               "mixed_precision: fp16\n"
                               "num_machines: 1\n"
                               "num_processes: 2\n"
                               "rdzv_backend: static\n"
                               "same_network: false\n"
                               "tpu_use_cluster: false\n"
                               "tpu_use_sudo: false\n"
                               "use_cpu: false\n";

Test(config_file, update_rewrites_an_old_file_keeping_its_values, .timeout = 30)
{
    write_file("old.yaml", OLD_FSDP);
    cr_assert_eq(ctrain("config show old.yaml"), 0, "%s", out);
    assert_has("old.yaml (an older form: `ctrain config update` rewrites it)");
    cr_assert_eq(ctrain("config update --config_file old.yaml"), 0, "%s", out);
    assert_has("updated the configuration at old.yaml to the current form");
    assert_has("not kept (Accelerate's keys that ctrain does not use): dynamo_backend");
    cr_assert_str_eq(read_text("old.yaml"), NEW_FSDP);
    /* the current form is left alone */
    cr_assert_eq(ctrain("config update --config_file old.yaml"), 0, "%s", out);
    assert_has("old.yaml is already in the current form");
    cr_assert_str_eq(read_text("old.yaml"), NEW_FSDP);
    /* the default path when --config_file is not given */
    write_file("default.yaml", OLD_FSDP);
    cr_assert_eq(ctrain("config update"), 0, "%s", out);
    cr_assert_str_eq(read_text("default.yaml"), NEW_FSDP);
}

/* What `accelerate config` writes for DeepSpeed ZeRO-3 (its documented form). */
static const char ACCEL_ZERO3[] = "compute_environment: LOCAL_MACHINE\n"
                                  "debug: false\n"
                                  "deepspeed_config:\n"
                                  "  gradient_accumulation_steps: 4\n"
                                  "  gradient_clipping: 0.5\n"
                                  "  offload_optimizer_device: cpu\n"
                                  "  offload_param_device: cpu\n"
                                  "  zero3_init_flag: true\n"
                                  "  zero3_save_16bit_model: true\n"
                                  "  zero_stage: 3\n"
                                  "distributed_type: DEEPSPEED\n"
                                  "downcast_bf16: 'no'\n"
                                  "enable_cpu_affinity: false\n"
                                  "machine_rank: 0\n"
                                  "main_training_function: main\n"
                                  "mixed_precision: bf16\n"
                                  "num_machines: 1\n"
                                  "num_processes: 2\n"
                                  "rdzv_backend: static\n"
                                  "same_network: true\n"
                                  "tpu_env: []\n"
                                  "tpu_use_cluster: false\n"
                                  "tpu_use_sudo: false\n"
                                  "use_cpu: false\n";

Test(config_file, show_prints_the_file_as_ctrain_writes_it, .timeout = 30)
{
    write_file("z3.yaml", ACCEL_ZERO3);
    cr_assert_eq(ctrain("config show z3.yaml"), 0, "%s", out);
    static const char want[] = "# z3.yaml\n"
                               "compute_environment: LOCAL_MACHINE\n"
                               "debug: false\n"
                               "deepspeed_config:\n"
                               "  gradient_accumulation_steps: 4\n"
                               "  gradient_clipping: 0.5\n"
                               "  offload_optimizer_device: cpu\n"
                               "  offload_param_device: cpu\n"
                               "  zero3_init_flag: true\n"
                               "  zero3_save_16bit_model: true\n"
                               "  zero_stage: 3\n"
                               "distributed_type: DEEPSPEED\n"
                               "downcast_bf16: false\n"
                               "enable_cpu_affinity: false\n"
                               "machine_rank: 0\n"
                               "main_training_function: main\n"
                               "mixed_precision: bf16\n"
                               "num_machines: 1\n"
                               "num_processes: 2\n"
                               "rdzv_backend: static\n"
                               "same_network: true\n"
                               "tpu_use_cluster: false\n"
                               "tpu_use_sudo: false\n"
                               "use_cpu: false\n"
                               "\n# what `ctrain launch` does with it\n";
    cr_assert(!strncmp(out, want, strlen(want)), "expected\n%s\ngot\n%s", want, out);
    assert_has("\nprocesses:    2 in total; 2 on this machine (machine_rank 0 of 1 machines)\n");
    assert_has("\nstrategy:     DeepSpeed ZeRO-3: parameters, gradients and optimizer state sharded; optimizer "
               "offload cpu, parameter offload cpu\n");
    assert_has("\nprecision:    bf16\n");
    assert_has("\nflags:        --num_processes 2 --num_machines 1 --machine_rank 0 --mixed_precision bf16 "
               "--use_deepspeed --zero_stage 3 --offload_optimizer_device cpu --offload_param_device cpu "
               "--gradient_accumulation_steps 4 --gradient_clipping 0.5\n");
    assert_has("\n  CTRAIN_ZERO_STAGE=3\n");
    assert_has("\n  WORLD_SIZE=2\n");
    /* Accelerate's current questionnaire output is not an old form */
    assert_lacks("older form");
    cr_assert_eq(ctrain("config update --config_file z3.yaml"), 0, "%s", out);
    assert_has("already in the current form");
}

/* ---- errors --------------------------------------------------------------------------- */

typedef struct {
    const char *text, *want;
} bad_case;

static void expect_error(const char *name, const char *text, const char *want)
{
    write_file(name, text);
    int rc = ctrain("config show %s", name);
    cr_assert_eq(rc, 1, "`config show` of\n%s\nexited %d:\n%s", text, rc, out);
    cr_assert(strstr(out, want), "for\n%s\nexpected '%s' in:\n%s", text, want, out);
    /* launch refuses the same file, and starts nothing */
    rc = ctrain("launch --config_file %s touch started", name);
    cr_assert_eq(rc, 2, "launch exited %d:\n%s", rc, out);
    cr_assert(strstr(out, want), "launch: expected '%s' in:\n%s", want, out);
    struct stat st;
    cr_assert_neq(stat(path_of("started"), &st), 0, "the program ran despite the bad file");
}

Test(config_file, unknown_keys_name_the_line_and_the_keys_allowed, .timeout = 60)
{
    static const bad_case cases[] = {
        {"compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_procs: 2\n",
         "bad.yaml:3: unknown key 'num_procs' at the top level (allowed: compute_environment, distributed_type, "
         "mixed_precision, use_cpu, debug, num_processes,"},
        {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  stage3_prefetch: 1\n",
         "bad.yaml:4: unknown key 'stage3_prefetch' in deepspeed_config (allowed in deepspeed_config: zero_stage, "
         "offload_optimizer_device, offload_param_device, gradient_accumulation_steps, gradient_clipping, "
         "deepspeed_config_file, zero3_init_flag,"},
        {"distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
         "  fsdp_wrap: NO_WRAP\n",
         "bad.yaml:5: unknown key 'fsdp_wrap' in fsdp_config (allowed in fsdp_config: fsdp_sharding_strategy, "
         "fsdp_offload_params, fsdp_auto_wrap_policy,"},
        {"distributed_type: 'NO'\nmixed_precision: fp8\nfp8_config:\n  fp8_format: HYBRID\n  amax_hist: 16\n",
         "bad.yaml:5: unknown key 'amax_hist' in fp8_config (allowed in fp8_config: fp8_format, amax_history_len,"},
        {"distributed_type: MEGATRON_LM\nmegatron_lm_config:\n  megatron_lm_tp_degree: 2\n  tp_degree: 2\n",
         "bad.yaml:4: unknown key 'tp_degree' in megatron_lm_config (allowed in megatron_lm_config: "
         "megatron_lm_tp_degree,"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) expect_error("bad.yaml", cases[i].text, cases[i].want);
}

Test(config_file, bad_values_name_key_value_line_and_what_is_allowed, .timeout = 90)
{
    static const bad_case cases[] = {
        {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 5\n",
         "bad.yaml:3: deepspeed_config.zero_stage '5': expected a whole number from 0 to 3"},
        {"distributed_type: 'NO'\nmixed_precision: fp32\n",
         "bad.yaml:2: mixed_precision 'fp32': expected no, fp16, bf16 or fp8"},
        {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: nvme\n",
         "bad.yaml:4: deepspeed_config.offload_optimizer_device 'nvme': expected none or cpu (ctrain offloads to the "
         "CPU's memory, not to NVMe)"},
        {"distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 7\n",
         "bad.yaml:3: fsdp_config.fsdp_sharding_strategy '7': expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
         "HYBRID_SHARD, or 1..4"},
        {"distributed_type: FSDP\nfsdp_config:\n  fsdp_backward_prefetch: SOMETIMES\n",
         "bad.yaml:3: fsdp_config.fsdp_backward_prefetch 'SOMETIMES': expected BACKWARD_PRE, BACKWARD_POST or "
         "NO_PREFETCH"},
        {"distributed_type: 'NO'\nuse_cpu: maybe\n", "bad.yaml:2: use_cpu 'maybe': expected true or false"},
        {"distributed_type: 'NO'\nmain_process_port: 70000\n",
         "bad.yaml:2: main_process_port '70000': expected a whole number from 0 to 65535"},
        {"distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: a,b\n",
         "bad.yaml:3: gpu_ids 'a,b': expected all, or GPU indices separated by commas (0,2), each once"},
        {"distributed_type: XLA\n", "bad.yaml:1: distributed_type 'XLA': expected NO, MULTI_CPU, MULTI_GPU, "
                                    "DEEPSPEED, FSDP or MEGATRON_LM"},
        {"distributed_type: 'NO'\nnum_processes: [1, 2]\n",
         "bad.yaml:2: num_processes: expected a single value, found a list"},
        {"compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\n",
         "bad.yaml:1: compute_environment 'AMAZON_SAGEMAKER': expected LOCAL_MACHINE"},
        {"distributed_type: 'NO'\nnum_processes: 1\nnum_processes: 2\n",
         "bad.yaml:3: key 'num_processes' given twice (first on line 2)"},
        {"distributed_type: DEEPSPEED\ndeepspeed_config: [1]\n",
         "bad.yaml:2: deepspeed_config: expected a mapping of deepspeed_config keys, found a list"},
        {"num_processes: 1\nuse_cpu: true\n", "'bad.yaml' has no distributed_type"},
        {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 3\n",
         "bad.yaml:4: deepspeed_config.zero_stage is given beside deepspeed_config_file"},
        /* the combination */
        {"distributed_type: MULTI_CPU\nnum_processes: 3\nnum_machines: 2\nmain_process_ip: 10.0.0.1\n",
         "num_processes 3 is not a multiple of num_machines 2"},
        {"distributed_type: 'NO'\nnum_processes: 2\n", "distributed_type NO runs one process, but num_processes is 2"},
        {"distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n",
         "fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP needs fsdp_transformer_layer_cls_to_wrap"},
        {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  offload_param_device: cpu\n",
         "offload_param_device cpu needs zero_stage 3 (zero_stage is 2)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) expect_error("bad.yaml", cases[i].text, cases[i].want);
}

Test(config_file, a_ds_config_json_is_explained, .timeout = 30)
{
    const char *explain = "is a key of a DeepSpeed ds_config.json, and this file looks like one. A launch "
                          "configuration describes the machines and processes";
    expect_error("ds.json", "{\n  \"train_micro_batch_size_per_gpu\": \"auto\",\n  \"zero_optimization\": {\"stage\": 3}\n}\n",
                 "ds.json:2: 'train_micro_batch_size_per_gpu' is a key of a DeepSpeed ds_config.json");
    assert_has(explain);
    assert_has("--deepspeed_config_file");
    expect_error("ds2.json", "{\"fp16\": {\"enabled\": true}, \"gradient_clipping\": 1.0}\n",
                 "ds2.json:1: 'fp16' is a key of a DeepSpeed ds_config.json");
}

Test(config_file, unreadable_files, .timeout = 30)
{
    /* " use_cpu" is indented under a plain scalar: libyaml stops at its ':' (line 3, column 9) */
    expect_error("syn.yaml", "distributed_type: 'NO'\nnum_processes: 1\n use_cpu: true\n",
                 "syn.yaml:3:9: not valid YAML: mapping values are not allowed in this context");
    expect_error("empty.yaml", "", "'empty.yaml' is empty: expected a mapping of launch settings");
    expect_error("comment.yaml", "# nothing yet\n", "'comment.yaml' is empty");
    expect_error("list.yaml", "- distributed_type\n- 'NO'\n",
                 "list.yaml:1: expected a mapping of launch settings (compute_environment: ..., distributed_type: "
                 "..., ...), found a list");
    cr_assert_eq(mkdir(path_of("adir"), 0755), 0);
    cr_assert_eq(ctrain("config show adir"), 1);
    assert_has("'adir' is a directory: expected a configuration file (YAML)");
    cr_assert_eq(ctrain("launch --config_file adir true"), 2);
    assert_has("'adir' is a directory");
    cr_assert_eq(ctrain("config show missing.yaml"), 1);
    assert_has("ctrain config show: cannot read 'missing.yaml': No such file or directory");
    cr_assert_eq(ctrain("launch --config_file missing.yaml true"), 2);
    assert_has("cannot read 'missing.yaml'");
}
