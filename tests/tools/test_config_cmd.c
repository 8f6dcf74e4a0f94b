/* Tests for `ctrain config` (tools/config_cmd.c) and what `ctrain launch --config_file`
 * gives each rank (tools/launch_args.c, tools/config_launch.c), through the `ctrain`
 * command (CTRAIN_BIN). The ranks are `sh -c` scripts that print their CTRAIN_*
 * variables; the expected lines are written out here from the files' keys
 * (docs/launch.md, "Configuration files"). The Accelerate oracle
 * (tests/tools/accelerate_config.sh) runs the real Accelerate 1.5.2 against ctrain.
 */
#include "tests/tools/config_run.h"
#include "tests/shell.h"

TestSuite(config_cmd, .init = setup_dir, .fini = remove_tmpdir);

/* Each rank prints its sharding, precision and size variables, sorted. */
#define PRINT_ENV                                                                                                  \
    "sh -c 'env | grep -E \"^(CTRAIN_(USE|ZERO|OFFLOAD|GRADIENT|MIXED|FSDP|DEEPSPEED|MEGATRON|DEBUG|CUDA_SYNC|FP8)|WORLD_SIZE|"       \
    "CUDA_VISIBLE)\" | sort'"

static void assert_rank_lines(int ranks, const char *const *lines)
{
    for (int r = 0; r < ranks; r++)
        for (int i = 0; lines[i]; i++) {
            char want[256];
            snprintf(want, sizeof want, "[rank%d] %s\n", r, lines[i]);
            assert_has(want);
        }
}

static const char ZERO2[] = "compute_environment: LOCAL_MACHINE\n"
                            "debug: false\n"
                            "deepspeed_config:\n"
                            "  gradient_accumulation_steps: 2\n"
                            "  offload_optimizer_device: cpu\n"
                            "  offload_param_device: none\n"
                            "  zero3_init_flag: false\n"
                            "  zero_stage: 2\n"
                            "distributed_type: DEEPSPEED\n"
                            "machine_rank: 0\n"
                            "main_process_port: 0\n"
                            "mixed_precision: bf16\n"
                            "num_machines: 1\n"
                            "num_processes: 2\n"
                            "use_cpu: true\n";

Test(config_cmd, launch_gives_each_rank_a_zero2_files_settings, .timeout = 60)
{
    write_file("z2.yaml", ZERO2);
    cr_assert_eq(ctrain("launch --config_file z2.yaml " PRINT_ENV), 0, "%s", out);
    static const char *const want[] = {
        "CTRAIN_GRADIENT_ACCUMULATION_STEPS=2", "CTRAIN_MIXED_PRECISION=bf16", "CTRAIN_OFFLOAD_OPTIMIZER_DEVICE=cpu",
        "CTRAIN_OFFLOAD_PARAM_DEVICE=none",     "CTRAIN_USE_CPU=1",            "CTRAIN_USE_DEEPSPEED=1",
        "CTRAIN_ZERO_STAGE=2",                  "WORLD_SIZE=2",                NULL,
    };
    assert_rank_lines(2, want);
    assert_lacks("CTRAIN_USE_FSDP");
    assert_lacks("CTRAIN_GRADIENT_CLIPPING");
    assert_lacks("using the configuration"); /* said only of the default file */
}

Test(config_cmd, launch_gives_each_rank_a_zero3_files_settings, .timeout = 60)
{
    write_file("z3.yaml", "distributed_type: DEEPSPEED\n"
                          "deepspeed_config:\n"
                          "  gradient_accumulation_steps: 1\n"
                          "  gradient_clipping: 1.0\n"
                          "  offload_optimizer_device: cpu\n"
                          "  offload_param_device: cpu\n"
                          "  zero3_init_flag: true\n"
                          "  zero3_save_16bit_model: true\n"
                          "  zero_stage: 3\n"
                          "mixed_precision: fp16\n"
                          "main_process_port: 0\n"
                          "num_processes: 2\n"
                          "use_cpu: true\n"
                          "debug: true\n");
    cr_assert_eq(ctrain("launch --config_file z3.yaml " PRINT_ENV), 0, "%s", out);
    static const char *const want[] = {
        "CTRAIN_DEBUG=1", "CTRAIN_CUDA_SYNC=1", "CTRAIN_GRADIENT_ACCUMULATION_STEPS=1", "CTRAIN_GRADIENT_CLIPPING=1",
        "CTRAIN_MIXED_PRECISION=fp16", "CTRAIN_OFFLOAD_OPTIMIZER_DEVICE=cpu", "CTRAIN_OFFLOAD_PARAM_DEVICE=cpu",
        "CTRAIN_USE_DEEPSPEED=1", "CTRAIN_ZERO_STAGE=3", "WORLD_SIZE=2", NULL,
    };
    assert_rank_lines(2, want);
}

Test(config_cmd, a_ds_config_json_named_in_the_file_sets_the_engine_alone, .timeout = 60)
{
    write_file("dsf.yaml", "distributed_type: DEEPSPEED\n"
                           "deepspeed_config:\n"
                           "  deepspeed_config_file: ds_config.json\n"
                           "  zero3_init_flag: false\n"
                           "num_processes: 1\n"
                           "use_cpu: true\n");
    cr_assert_eq(ctrain("launch --config_file dsf.yaml " PRINT_ENV), 0, "%s", out);
    static const char *const want[] = {"CTRAIN_DEEPSPEED_CONFIG_FILE=ds_config.json", "CTRAIN_USE_DEEPSPEED=1",
                                       "WORLD_SIZE=1", NULL};
    assert_rank_lines(1, want);
    assert_lacks("ZERO_STAGE");
    assert_lacks("OFFLOAD");
    assert_lacks("CTRAIN_MIXED_PRECISION"); /* not in the file: the ds_config.json's fp16/bf16 blocks decide */
}

Test(config_cmd, fp8_config_becomes_the_fp8_flags, .timeout = 60)
{
    /* Accelerate's questionnaire spellings amax_history_length and amax_compute_algorithm */
    write_file("fp8.yaml", "distributed_type: 'NO'\n"
                           "mixed_precision: fp8\n"
                           "fp8_config:\n"
                           "  backend: TE\n"
                           "  fp8_format: E4M3\n"
                           "  amax_history_length: 16\n"
                           "  amax_compute_algorithm: most_recent\n"
                           "  margin: 2\n"
                           "  interval: 1\n");
    cr_assert_eq(ctrain("launch --config_file fp8.yaml " PRINT_ENV), 0, "%s", out);
    static const char *const want[] = {"CTRAIN_FP8_AMAX_COMPUTE_ALGO=most_recent", "CTRAIN_FP8_AMAX_HISTORY_LEN=16",
                                       "CTRAIN_FP8_FORMAT=e4m3", "CTRAIN_FP8_MARGIN=2",
                                       "CTRAIN_MIXED_PRECISION=fp8", NULL};
    assert_rank_lines(1, want);
    /* the flag beats the file */
    cr_assert_eq(ctrain("launch --config_file fp8.yaml --fp8_margin 0 " PRINT_ENV), 0, "%s", out);
    assert_has("[rank0] CTRAIN_FP8_MARGIN=0\n");
}

static const char FULL_SHARD[] = "compute_environment: LOCAL_MACHINE\n"
                                 "distributed_type: FSDP\n"
                                 "fsdp_config:\n"
                                 "  fsdp_activation_checkpointing: false\n"
                                 "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                                 "  fsdp_backward_prefetch: BACKWARD_PRE\n"
                                 "  fsdp_cpu_ram_efficient_loading: true\n"
                                 "  fsdp_forward_prefetch: true\n"
                                 "  fsdp_offload_params: false\n"
                                 "  fsdp_reshard_after_forward: false\n"
                                 "  fsdp_sharding_strategy: FULL_SHARD\n"
                                 "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                                 "  fsdp_sync_module_states: true\n"
                                 "  fsdp_transformer_layer_cls_to_wrap: Block\n"
                                 "  fsdp_use_orig_params: true\n"
                                 "main_process_port: 0\n"
                                 "mixed_precision: 'no'\n"
                                 "num_processes: 2\n"
                                 "use_cpu: true\n";

Test(config_cmd, launch_gives_each_rank_an_fsdp_full_shard_files_settings, .timeout = 60)
{
    write_file("fsdp.yaml", FULL_SHARD);
    cr_assert_eq(ctrain("launch --config_file fsdp.yaml " PRINT_ENV), 0, "%s", out);
    static const char *const want[] = {
        "CTRAIN_FSDP_AUTO_WRAP_POLICY=TRANSFORMER_BASED_WRAP",
        "CTRAIN_FSDP_BACKWARD_PREFETCH=BACKWARD_PRE",
        "CTRAIN_FSDP_FORWARD_PREFETCH=true",
        "CTRAIN_FSDP_OFFLOAD_PARAMS=false",
        "CTRAIN_FSDP_RESHARD_AFTER_FORWARD=false",
        "CTRAIN_FSDP_SHARDING_STRATEGY=FULL_SHARD",
        "CTRAIN_FSDP_STATE_DICT_TYPE=SHARDED_STATE_DICT",
        "CTRAIN_FSDP_SYNC_MODULE_STATES=true",
        "CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP=Block",
        "CTRAIN_MIXED_PRECISION=no",
        "CTRAIN_USE_FSDP=1",
        "WORLD_SIZE=2",
        NULL,
    };
    assert_rank_lines(2, want);
    assert_lacks("CTRAIN_USE_DEEPSPEED");
}

Test(config_cmd, flags_on_the_command_line_override_the_file, .timeout = 60)
{
    write_file("z2.yaml", ZERO2);
    cr_assert_eq(ctrain("launch --config_file z2.yaml --num_processes 1 --zero_stage 1 --mixed_precision=fp16 "
                        "--gradient_accumulation_steps 8 " PRINT_ENV),
                 0, "%s", out);
    static const char *const want[] = {"CTRAIN_GRADIENT_ACCUMULATION_STEPS=8", "CTRAIN_MIXED_PRECISION=fp16",
                                       "CTRAIN_USE_DEEPSPEED=1", "CTRAIN_ZERO_STAGE=1", "WORLD_SIZE=1", NULL};
    assert_rank_lines(1, want);
    assert_lacks("[rank1]");
    /* a strategy on the command line replaces the file's */
    cr_assert_eq(ctrain("launch --config_file z2.yaml --num_processes 1 --use_fsdp --fsdp_sharding_strategy "
                        "SHARD_GRAD_OP " PRINT_ENV),
                 0, "%s", out);
    static const char *const fsdp[] = {"CTRAIN_FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP", "CTRAIN_USE_FSDP=1",
                                       "CTRAIN_MIXED_PRECISION=bf16", NULL};
    assert_rank_lines(1, fsdp);
    assert_lacks("DEEPSPEED");
    assert_lacks("ZERO_STAGE");
    /* gpu_ids sets CUDA_VISIBLE_DEVICES; the command line's is checked against the file's process count */
    write_file("gpu.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\nmain_process_port: 0\ngpu_ids: 1,3\n");
    cr_assert_eq(ctrain("launch --config_file gpu.yaml " PRINT_ENV), 0, "%s", out);
    static const char *const gpu[] = {"CUDA_VISIBLE_DEVICES=1,3", "WORLD_SIZE=2", NULL};
    assert_rank_lines(2, gpu);
    cr_assert_eq(ctrain("launch --config_file gpu.yaml --gpu_ids 2 true"), 2, "%s", out);
    assert_has("--gpu_ids '2' names 1 GPU(s) for 2 local processes");
    cr_assert_eq(ctrain("launch --gpu_ids 0,x true"), 2, "%s", out);
    assert_has("--gpu_ids '0,x': expected all, or GPU indices separated by commas");
}

Test(config_cmd, the_default_file_is_read_when_it_exists, .timeout = 60)
{
    /* none yet: launch says nothing of it */
    cr_assert_eq(ctrain("launch " PRINT_ENV), 0, "%s", out);
    assert_lacks("using the configuration");
    assert_lacks("CTRAIN_USE_DEEPSPEED");
    write_file("default.yaml", ZERO2);
    cr_assert_eq(ctrain("launch " PRINT_ENV), 0, "%s", out);
    char line[512];
    snprintf(line, sizeof line, "ctrain launch: using the configuration in %s/default.yaml\n", tmpdir);
    assert_has(line);
    static const char *const want[] = {"CTRAIN_USE_DEEPSPEED=1", "CTRAIN_ZERO_STAGE=2", "WORLD_SIZE=2", NULL};
    assert_rank_lines(2, want);
    /* --config_file wins over the default file */
    write_file("fsdp.yaml", FULL_SHARD);
    cr_assert_eq(ctrain("launch --config_file fsdp.yaml --num_processes 1 " PRINT_ENV), 0, "%s", out);
    assert_lacks("using the configuration");
    assert_has("[rank0] CTRAIN_USE_FSDP=1\n");
    assert_lacks("DEEPSPEED");
    /* a bad default file stops launch too */
    write_file("default.yaml", "distributed_type: 'NO'\nnum_process: 1\n");
    cr_assert_eq(ctrain("launch true"), 2, "%s", out);
    assert_has("default.yaml:2: unknown key 'num_process' at the top level");
}

Test(config_cmd, megatron_lm_config_becomes_the_megatron_flags, .timeout = 60)
{
    /* Accelerate's own keys, as `accelerate config` writes them */
    write_file("mlm.yaml", "distributed_type: MEGATRON_LM\nnum_processes: 4\nmain_process_port: 0\nuse_cpu: true\n"
                           "megatron_lm_config:\n"
                           "  megatron_lm_gradient_clipping: 0.5\n"
                           "  megatron_lm_num_micro_batches: 1\n"
                           "  megatron_lm_pp_degree: 1\n"
                           "  megatron_lm_recompute_activations: false\n"
                           "  megatron_lm_sequence_parallelism: true\n"
                           "  megatron_lm_tp_degree: 2\n"
                           "  megatron_lm_use_distributed_optimizer: false\n");
    cr_assert_eq(ctrain("launch --config_file mlm.yaml " PRINT_ENV), 0, "%s", out);
    static const char *const want[] = {
        "CTRAIN_USE_MEGATRON_LM=1",          "CTRAIN_MEGATRON_TP_DEGREE=2",
        "CTRAIN_MEGATRON_PP_DEGREE=1",       "CTRAIN_MEGATRON_NUM_MICRO_BATCHES=1",
        "CTRAIN_MEGATRON_SEQUENCE_PARALLELISM=true", "CTRAIN_MEGATRON_USE_DISTRIBUTED_OPTIMIZER=false",
        "CTRAIN_MEGATRON_GRADIENT_CLIPPING=0.5", "WORLD_SIZE=4", NULL,
    };
    assert_rank_lines(4, want);
    assert_lacks("DEEPSPEED");
    assert_lacks("CTRAIN_USE_FSDP");
    /* config show prints the flags and rank 0's variables launch gives */
    cr_assert_eq(ctrain("config show mlm.yaml"), 0, "%s", out);
    assert_has("strategy:     Megatron-LM: tensor parallel 2 x pipeline 1");
    assert_has("--use_megatron_lm --megatron_lm_tp_degree 2 --megatron_lm_pp_degree 1");
    assert_has("--megatron_lm_gradient_clipping 0.5");
    assert_has("  CTRAIN_MEGATRON_TP_DEGREE=2\n");
    /* the command line's flags win over the file's */
    cr_assert_eq(ctrain("launch --config_file mlm.yaml --megatron_lm_tp_degree 4 " PRINT_ENV), 0, "%s", out);
    assert_has("[rank3] CTRAIN_MEGATRON_TP_DEGREE=4\n");
    /* Accelerate's empty strategy mappings shard nothing; a deepspeed_config with keys
     * shards the data-parallel axis of the tensor-parallel model */
    write_file("mlm_empty.yaml", "distributed_type: MEGATRON_LM\nnum_processes: 4\nmain_process_port: 0\nuse_cpu: true\n"
                                 "deepspeed_config: {}\nfsdp_config: {}\n"
                                 "megatron_lm_config:\n  megatron_lm_tp_degree: 2\n");
    cr_assert_eq(ctrain("launch --config_file mlm_empty.yaml " PRINT_ENV), 0, "%s", out);
    assert_has("[rank3] CTRAIN_USE_MEGATRON_LM=1\n");
    assert_lacks("DEEPSPEED");
    assert_lacks("CTRAIN_USE_FSDP");
    write_file("mlm_zero.yaml", "distributed_type: MEGATRON_LM\nnum_processes: 4\nmain_process_port: 0\nuse_cpu: true\n"
                                "deepspeed_config:\n  zero_stage: 3\n"
                                "megatron_lm_config:\n  megatron_lm_tp_degree: 2\n");
    cr_assert_eq(ctrain("launch --config_file mlm_zero.yaml " PRINT_ENV), 0, "%s", out);
    static const char *const zero[] = {"CTRAIN_USE_MEGATRON_LM=1", "CTRAIN_MEGATRON_TP_DEGREE=2",
                                       "CTRAIN_USE_DEEPSPEED=1", "CTRAIN_ZERO_STAGE=3", NULL};
    assert_rank_lines(4, zero);
    cr_assert_eq(ctrain("config show mlm_zero.yaml"), 0, "%s", out);
    assert_has("data parallel over the rest (sharded by deepspeed_config)");
}

Test(config_cmd, megatron_lm_layouts_that_do_not_divide_the_world_start_nothing, .timeout = 30)
{
    write_file("mlm3.yaml", "distributed_type: MEGATRON_LM\nnum_processes: 3\nmegatron_lm_config:\n"
                            "  megatron_lm_tp_degree: 2\n  megatron_lm_pp_degree: 1\n");
    cr_assert_eq(ctrain("launch --config_file mlm3.yaml touch started"), 2, "%s", out);
    assert_has("--num_processes 3 is not divisible by --megatron_lm_tp_degree 2 x --megatron_lm_pp_degree 1 = 2");
    cr_assert_neq(access(path_of("started"), F_OK), 0);
    cr_assert_eq(ctrain("config show mlm3.yaml"), 1, "%s", out);
    assert_has("launch:       refuses it: --num_processes 3 is not divisible");
    cr_assert_eq(ctrain("launch --num_processes 8 --use_megatron_lm --megatron_lm_tp_degree 2 --megatron_lm_pp_degree 3 "
                        "touch started"), 2, "%s", out);
    assert_has("--num_processes 8 is not divisible by --megatron_lm_tp_degree 2 x --megatron_lm_pp_degree 3 = 6");
    cr_assert_neq(access(path_of("started"), F_OK), 0);
}

Test(config_cmd, megatron_lm_flags_on_the_command_line, .timeout = 60)
{
    cr_assert_eq(ctrain("launch --num_processes 2 --main_process_port 0 --cpu --use_megatron_lm "
                        "--megatron_lm_tp_degree 2 --megatron_lm_sequence_parallelism "
                        "--megatron_lm_use_distributed_optimizer=false --megatron_lm_gradient_clipping 1 " PRINT_ENV),
                 0, "%s", out);
    static const char *const want[] = {"CTRAIN_USE_MEGATRON_LM=1", "CTRAIN_MEGATRON_TP_DEGREE=2",
                                       "CTRAIN_MEGATRON_SEQUENCE_PARALLELISM=true",
                                       "CTRAIN_MEGATRON_USE_DISTRIBUTED_OPTIMIZER=false",
                                       "CTRAIN_MEGATRON_GRADIENT_CLIPPING=1", NULL};
    assert_rank_lines(2, want);
    /* a bare boolean before PROGRAM does not eat it */
    cr_assert_eq(ctrain("launch --use_megatron_lm --megatron_lm_sequence_parallelism --megatron_lm_tp_degree 1 true"),
                 2, "%s", out);
    assert_has("--megatron_lm_sequence_parallelism needs --megatron_lm_tp_degree > 1");
    cr_assert_eq(ctrain("launch --megatron_lm_tp_degree 2 true"), 2, "%s", out);
    assert_has("--megatron_lm_tp_degree needs --use_megatron_lm");
    cr_assert_eq(ctrain("launch --use_megatron_lm --megatron_lm_tp_degree 0 true"), 2, "%s", out);
    assert_has("--megatron_lm_tp_degree");
    assert_has("'0': expected a whole number from 1");
    /* tensor parallelism with ZeRO over the data-parallel axis: both settings reach the ranks */
    cr_assert_eq(ctrain("launch --num_processes 4 --main_process_port 0 --cpu --use_megatron_lm "
                        "--megatron_lm_tp_degree 2 --use_deepspeed --zero_stage 2 " PRINT_ENV),
                 0, "%s", out);
    static const char *const both[] = {"CTRAIN_USE_MEGATRON_LM=1", "CTRAIN_MEGATRON_TP_DEGREE=2",
                                       "CTRAIN_USE_DEEPSPEED=1", "CTRAIN_ZERO_STAGE=2", NULL};
    assert_rank_lines(4, both);
    cr_assert_eq(ctrain("launch --use_megatron_lm --use_fsdp --use_deepspeed true"), 2, "%s", out);
    assert_has("--use_deepspeed and --use_fsdp were both given: choose one");
    cr_assert_eq(ctrain("launch --help"), 0, "%s", out);
    assert_has("--use_megatron_lm");
    assert_has("--megatron_lm_tp_degree N");
}

Test(config_cmd, accelerates_unused_keys_are_accepted_and_listed, .timeout = 30)
{
    write_file("acc.yaml", "compute_environment: LOCAL_MACHINE\n"
                           "distributed_type: MULTI_CPU\n"
                           "dynamo_config:\n  dynamo_backend: INDUCTOR\n"
                           "ipex_config:\n  ipex: false\n"
                           "mpirun_config: {}\n"
                           "num_processes: 2\n"
                           "main_process_port: 0\n"
                           "tpu_env: []\n"
                           "tpu_name: pod-1\n"
                           "tpu_use_cluster: false\n"
                           "commands: null\n");
    cr_assert_eq(ctrain("config show acc.yaml"), 0, "%s", out);
    assert_has("\nignored:      dynamo_config, ipex_config, tpu_name (Accelerate's keys that ctrain does not use)\n");
    assert_has("\ndevices:      CPU\n"); /* MULTI_CPU */
    cr_assert_eq(ctrain("launch --config_file acc.yaml " PRINT_ENV), 0, "%s", out);
    assert_has("[rank1] WORLD_SIZE=2\n");
}

Test(config_cmd, help_lists_every_flag, .timeout = 30)
{
    cr_assert_eq(ctrain("config --help"), 0);
    assert_has("--config_file PATH");
    assert_has("default");
    assert_has("show");
    assert_has("update");
    cr_assert_eq(ctrain("config default --help"), 0);
    assert_has("--config_file PATH");
    assert_has("--mixed_precision no|fp16|bf16|fp8");
    cr_assert_eq(ctrain("config show -h"), 0);
    assert_has("usage: ctrain config show [FILE]");
    assert_has("--config_file PATH");
    cr_assert_eq(ctrain("config update --help"), 0);
    assert_has("--config_file PATH");
    cr_assert_eq(ctrain("launch --help"), 0);
    assert_has("--config_file PATH");
    assert_has("--gpu_ids all|IDS");
    assert_has("--debug");
    cr_assert_eq(ctrain("--help"), 0);
    assert_has("  config ");
    cr_assert_eq(ctrain("config show --bogus"), 2);
    assert_has("unknown flag '--bogus'");
    cr_assert_eq(ctrain("config default --config_file"), 2);
    assert_has("--config_file needs a value");
}

Test(config_cmd, the_questionnaire_needs_a_terminal, .timeout = 30)
{
    cr_assert_eq(ctrain("config"), 1, "%s", out);
    assert_has("the questionnaire needs a terminal");
    assert_has("ctrain config default");
}

/* The real Accelerate: its files load in ctrain, ctrain's in it (tests/tools/accelerate_config.sh). */
Test(config_cmd, accelerate_reads_ctrains_files_and_ctrain_reads_accelerates, .timeout = 420)
{
    const char *src = getenv("CTRAIN_SRC");
    if (!src || !*src) cr_skip_test("CTRAIN_SRC is not set (make test sets it)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 400 bash '%s/tests/tools/accelerate_config.sh' '%s' '%s' 2>&1", src,
             ctrain_bin(), tmpdir);
    int rc = shell_capture(cmd, out, sizeof out);
    if (rc == 77) {
        const char *why = strstr(out, "skip: ");
        cr_skip_test("%s", why ? why : "the Accelerate venv could not be made");
    }
    cr_assert_eq(rc, 0, "accelerate_config.sh exited %d:\n%s", rc, out);
    assert_has("ok: ctrain reads accelerate config default\n");
    assert_has("ok: Accelerate loads ctrain's files with the same values\n");
}
