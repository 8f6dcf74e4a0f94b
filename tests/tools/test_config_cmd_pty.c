/* Tests for `ctrain config` (tools/config_cmd.c with tools/config_ask.c and
 * tools/config_file.c) end to end: the command named by CTRAIN_BIN runs on a
 * pseudo-terminal, the test answers its questions as a person would, and the file
 * it writes is read back with ct_cluster_config_read and compared with the values
 * the answers stand for, written out here by hand. Without a terminal the command
 * must refuse with a message saying why. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/pty_session.h"
#include "tests/tmpdir.h"
#include "tools/config_file.h"

static const char *ctrain_bin(void)
{
    const char *b = getenv("CTRAIN_BIN");
    if (!b || !*b)
        cr_skip_test("CTRAIN_BIN is not set: run through `make test`, or set CTRAIN_BIN to build/bin/ctrain");
    return b;
}

static void exec_config(const char *slave, void *arg)
{
    pty_child_attach(slave);
    const char *bin = getenv("CTRAIN_BIN");
    char *const argv[] = {(char *)bin, "config", "--config_file", arg, NULL};
    execv(bin, argv);
    _exit(125);
}

/* `ctrain config --config_file path` on a terminal, answered by steps; returns its
 * exit code. */
static int run_config(const char *path, const pty_step *steps, size_t n)
{
    ctrain_bin();
    static char arg[512]; /* the child's copy */
    snprintf(arg, sizeof arg, "%s", path);
    pty_start(exec_config, arg);
    pty_play(steps, n);
    int status = pty_wait_exit();
    cr_assert(WIFEXITED(status), "ctrain config was killed (status %#x); the terminal showed:\n%s", status, S.buf);
    return WEXITSTATUS(status);
}

static void setup(void) { make_tmpdir_with("/tmp/ct_cfgcmd_"); }
static void teardown(void)
{
    pty_stop();
    remove_tmpdir();
}

TestSuite(config_cmd_pty, .init = setup, .fini = teardown);

/* multi-CPU, 4 processes of 3 threads, bf16, 2 accumulation steps */
static const pty_step MULTI_CPU[] = {
    {"In which compute environment are you running?", ""},
    {"Which type of machine are you using?", "1"},
    {"How many different machines will you use", ""},
    {"Should distributed operations be checked", ""},
    {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
    {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", ""},
    {"How many processes should be used for distributed training? [2]: ", "4"},
    {"How many CPU threads should each process use?", "3"},
    {"Do you wish to use mixed precision?", "bf16"},
    {"How many gradient accumulation steps do you want to use? [1]: ", "2"},
};

Test(config_cmd_pty, answers_become_the_file, .timeout = 60)
{
    const char *path = path_of("sub/x.yaml"); /* its folder is created */
    int code = run_config(path, MULTI_CPU, sizeof MULTI_CPU / sizeof *MULTI_CPU);
    cr_assert_eq(code, 0, "exit %d; the terminal showed:\n%s", code, S.buf);
    char saved[600];
    snprintf(saved, sizeof saved, "ctrain configuration saved at %s", path);
    cr_expect_eq(pty_count(saved), 1, "the terminal showed:\n%s", S.buf);

    ct_cluster_config c;
    ct_cluster_config_defaults(&c);
    cr_assert_eq(ct_cluster_config_read(path, &c, NULL), CT_OK, "%s", ct_last_error());
    cr_expect_str_eq(c.compute_environment, "LOCAL_MACHINE");
    cr_expect_eq(c.distributed_type, CT_DIST_MULTI_CPU);
    cr_expect_eq(c.use_cpu, true);
    cr_expect_eq(c.num_machines, 1);
    cr_expect_eq(c.machine_rank, 0);
    cr_expect_eq(c.num_processes, 4);
    cr_expect_eq(c.num_cpu_threads_per_process, 3);
    cr_expect_str_eq(c.mixed_precision, "bf16");
    cr_expect_eq(c.gradient_accumulation_steps, 2);
    cr_expect_eq(c.debug, false);
}

Test(config_cmd_pty, rerun_offers_the_file_and_keeps_it, .timeout = 60)
{
    const char *path = path_of("x.yaml");
    cr_assert_eq(run_config(path, MULTI_CPU, sizeof MULTI_CPU / sizeof *MULTI_CPU), 0, "%s", S.buf);
    /* Enter everywhere: the brackets hold the file's values, and the file stays */
    static const pty_step again[] = {
        {"In which compute environment are you running?", ""},
        {"Number or name [1: multi-CPU]: ", ""},
        {"How many different machines will you use", ""},
        {"Should distributed operations be checked", ""},
        {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
        {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", ""},
        {"How many processes should be used for distributed training? [4]: ", ""},
        {"How many CPU threads should each process use? [3]: ", ""},
        {"Number or name [2: bf16]: ", ""},
        {"How many gradient accumulation steps do you want to use? [2]: ", ""},
    };
    cr_assert_eq(run_config(path, again, sizeof again / sizeof *again), 0, "%s", S.buf);
    ct_cluster_config c;
    ct_cluster_config_defaults(&c);
    cr_assert_eq(ct_cluster_config_read(path, &c, NULL), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.distributed_type, CT_DIST_MULTI_CPU);
    cr_expect_eq(c.num_processes, 4);
    cr_expect_eq(c.num_cpu_threads_per_process, 3);
    cr_expect_str_eq(c.mixed_precision, "bf16");
    cr_expect_eq(c.gradient_accumulation_steps, 2);
}

Test(config_cmd_pty, deepspeed_zero3_file, .timeout = 60)
{
    const char *path = path_of("ds.yaml");
    static const pty_step steps[] = {
        {"In which compute environment are you running?", ""},
        {"Which type of machine are you using?", "multi-CPU"},
        {"How many different machines will you use", ""},
        {"Should distributed operations be checked", ""},
        {"Do you want to use DeepSpeed? [yes/NO]: ", "yes"},
        {"Do you want to specify a json file to a DeepSpeed config? [yes/NO]: ", "no"},
        {"What should be your DeepSpeed's ZeRO optimization stage?", "3"},
        {"Where to offload optimizer states?", "cpu"},
        {"Where to offload parameters?", "cpu"},
        {"How many gradient accumulation steps you're passing in your script? [1]: ", "4"},
        {"Do you want to use gradient clipping? [yes/NO]: ", "yes"},
        {"What is the gradient clipping value? [1]: ", "0.25"},
        {"Do you want to enable `deepspeed.zero.Init`", "no"},
        {"How many processes should be used for distributed training? [2]: ", ""},
        {"How many CPU threads should each process use?", "1"},
        {"Do you wish to use mixed precision?", "no"},
    };
    int code = run_config(path, steps, sizeof steps / sizeof *steps);
    cr_assert_eq(code, 0, "exit %d; the terminal showed:\n%s", code, S.buf);
    ct_cluster_config c;
    ct_cluster_config_defaults(&c);
    cr_assert_eq(ct_cluster_config_read(path, &c, NULL), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.distributed_type, CT_DIST_DEEPSPEED);
    cr_expect_eq(c.num_processes, 2);
    cr_expect_eq(c.use_cpu, true);
    cr_expect_eq(c.deepspeed.zero_stage, 3);
    cr_expect_str_eq(c.deepspeed.offload_optimizer_device, "cpu");
    cr_expect_str_eq(c.deepspeed.offload_param_device, "cpu");
    cr_expect_eq(c.deepspeed.gradient_accumulation_steps, 4);
    cr_expect_eq(c.deepspeed.gradient_clipping, 0.25);
    cr_expect_eq(c.deepspeed.zero3_init_flag, false);
    cr_expect_str_eq(c.mixed_precision, "no");
}

Test(config_cmd_pty, fsdp_file, .timeout = 60)
{
    const char *path = path_of("fsdp.yaml");
    static const pty_step steps[] = {
        {"In which compute environment are you running?", ""},
        {"Which type of machine are you using?", "1"},
        {"How many different machines will you use", ""},
        {"Should distributed operations be checked", ""},
        {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
        {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", "y"},
        {"What should be your sharding strategy?", "FULL_SHARD"},
        {"Do you want to offload parameters and gradients to CPU? [yes/NO]: ", ""},
        {"What should be your auto wrap policy?", "TRANSFORMER_BASED_WRAP"},
        {"[Block]: ", ""},
        {"What should be your FSDP's backward prefetch policy?", ""},
        {"What should be your FSDP's state dict type?", "SHARDED_STATE_DICT"},
        {"Do you want to enable FSDP's forward prefetch policy? [yes/NO]: ", ""},
        {"Do you want to enable FSDP's `use_orig_params` feature? [YES/no]: ", ""},
        {"Do you want to enable CPU RAM efficient model loading? [YES/no]: ", ""},
        {"How many processes should be used for distributed training? [2]: ", "2"},
        {"How many CPU threads should each process use?", "1"},
        {"Do you wish to use mixed precision?", ""},
        {"How many gradient accumulation steps do you want to use? [1]: ", ""},
    };
    int code = run_config(path, steps, sizeof steps / sizeof *steps);
    cr_assert_eq(code, 0, "exit %d; the terminal showed:\n%s", code, S.buf);
    ct_cluster_config c;
    ct_cluster_config_defaults(&c);
    cr_assert_eq(ct_cluster_config_read(path, &c, NULL), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.distributed_type, CT_DIST_FSDP);
    cr_expect_eq(c.num_processes, 2);
    cr_expect_str_eq(c.fsdp.sharding_strategy, "FULL_SHARD");
    cr_expect_str_eq(c.fsdp.auto_wrap_policy, "TRANSFORMER_BASED_WRAP");
    cr_expect_str_eq(c.fsdp.transformer_layer_cls_to_wrap, "Block");
    cr_expect_str_eq(c.fsdp.backward_prefetch, "BACKWARD_PRE");
    cr_expect_str_eq(c.fsdp.state_dict_type, "SHARDED_STATE_DICT");
    cr_expect_eq(c.fsdp.offload_params, false);
    cr_expect_eq(c.fsdp.sync_module_states, true);
}

Test(config_cmd_pty, answers_ending_early_write_nothing, .timeout = 60)
{
    const char *path = path_of("x.yaml");
    static const pty_step steps[] = {
        {"In which compute environment are you running?", ""},
        {"Which type of machine are you using?", "1"},
        {"How many different machines will you use", NULL},
    };
    int code = run_config(path, steps, sizeof steps / sizeof *steps);
    cr_expect_eq(code, 1, "exit %d; the terminal showed:\n%s", code, S.buf);
    cr_expect_eq(pty_count("the answers ended before the question about the number of machines"), 1,
                 "the terminal showed:\n%s", S.buf);
    struct stat st;
    cr_expect_neq(stat(path, &st), 0, "%s was written", path);
}

Test(config_cmd_pty, without_a_terminal_it_refuses, .timeout = 30)
{
    const char *bin = ctrain_bin();
    const char *path = path_of("x.yaml");
    char errpath[300];
    snprintf(errpath, sizeof errpath, "%s", path_of("stderr"));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int in = open("/dev/null", O_RDONLY), err = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (in < 0 || err < 0 || dup2(in, 0) < 0 || dup2(err, 2) < 0 || dup2(err, 1) < 0) _exit(124);
        execl(bin, bin, "config", "--config_file", path, (char *)NULL);
        _exit(125);
    }
    /* /dev/null answers at once: a command that asked anyway would end on its own */
    int status = 0;
    double end = pty_now() + PTY_STEP_SECONDS;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (pty_now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("ctrain config without a terminal did not end");
        }
        usleep(10000);
    }
    cr_assert(WIFEXITED(status));
    cr_expect_eq(WEXITSTATUS(status), 1);
    char msg[2048] = {0};
    FILE *f = fopen(errpath, "r");
    cr_assert_not_null(f);
    size_t n = fread(msg, 1, sizeof msg - 1, f);
    fclose(f);
    msg[n] = 0;
    cr_expect_not_null(strstr(msg, "ctrain config: the questionnaire needs a terminal"), "stderr: %s", msg);
    cr_expect_null(strstr(msg, "In which compute environment"), "it asked anyway: %s", msg);
    struct stat st;
    cr_expect_neq(stat(path, &st), 0, "%s was written", path);
}

Test(config_cmd_pty, deepspeed_json_file_leaves_the_precision_to_it, .timeout = 60)
{
    const char *json = path_of("ds_config.json");
    FILE *f = fopen(json, "w");
    cr_assert_not_null(f);
    fputs("{\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2}}\n", f);
    fclose(f);
    static char json_path[300];
    snprintf(json_path, sizeof json_path, "%s", json);
    const char *path = path_of("dsjson.yaml");
    const pty_step steps[] = {
        {"In which compute environment are you running?", ""},
        {"Which type of machine are you using?", "0"},
        {"Do you want to run your training on CPU only", "yes"}, /* asked only where a GPU exists */
        {"Do you want to use DeepSpeed? [yes/NO]: ", "yes"},
        {"Do you want to specify a json file to a DeepSpeed config? [yes/NO]: ", "yes"},
        {"Please enter the path to the json DeepSpeed config file: ", json_path},
        {"Do you want to enable `deepspeed.zero.Init`", ""},
        {"How many processes should be used for distributed training? [1]: ", "2"},
        {"How many CPU threads should each process use?", "1"},
    };
    /* without a GPU the CPU question is not asked: drop it from the script */
    ct_cluster_config probe;
    ct_cluster_config_defaults(&probe);
    pty_step script[9];
    size_t n = 0;
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
        if (i != 2 || !probe.use_cpu) script[n++] = steps[i];
    int code = run_config(path, script, n);
    cr_assert_eq(code, 0, "exit %d; the terminal showed:\n%s", code, S.buf);
    cr_expect_eq(pty_count("Do you wish to use mixed precision?"), 0);
    ct_cluster_config c;
    ct_cluster_config_defaults(&c);
    cr_assert_eq(ct_cluster_config_read(path, &c, NULL), CT_OK, "%s", ct_last_error());
    cr_expect_eq(c.distributed_type, CT_DIST_DEEPSPEED);
    cr_expect_str_eq(c.deepspeed.deepspeed_config_file, json_path);
    cr_expect_eq(c.num_processes, 2);
    cr_expect_eq(c.use_cpu, true);
    /* the file has no mixed_precision key: the json's bf16 block decides */
    char yaml[4096] = {0};
    FILE *y = fopen(path, "r");
    cr_assert_not_null(y);
    size_t k = fread(yaml, 1, sizeof yaml - 1, y);
    fclose(y);
    yaml[k] = 0;
    cr_expect_null(strstr(yaml, "mixed_precision"), "the file:\n%s", yaml);
}
