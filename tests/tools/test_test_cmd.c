/* Tests for `ctrain test` (tools/test_cmd.c, tools/test_rank*.c), run as a program:
 * the command named by CTRAIN_BIN (`make test` sets it) with launch flags, its
 * stdout, stderr and exit status checked against docs/launch.md ("ctrain test").
 *
 * The expectations are written out here from the documentation, not taken from a
 * run: 54 checks = rendezvous + 8 collectives (allreduce sum/avg/max/min,
 * reduce_scatter sum/avg, allgather, broadcast) x 6 dtypes + barrier + 4 training
 * steps; the injected collective fault is at element 5 of the f32 sum of 1027
 * elements, whose value by the inputs' formula (tools/test_rank_collectives.c) is
 * worked out below. The passing runs cover one process, DDP, ZeRO-2 and ZeRO-3,
 * FSDP, bf16, fp16 with clipping and a DeepSpeed config of "auto" values. The fault
 * injections (CTRAIN_TEST_INJECT) show that each kind of failure is caught, named
 * and turned into a non-zero exit, and that a dead or stuck rank ends the run
 * within seconds instead of hanging.
 *
 * Every test has a timeout and a deadline of its own for the command; the command
 * dies with its test (PR_SET_PDEATHSIG), and the launcher stops its ranks when it
 * gets SIGTERM. Every run uses --main_process_port 0 so that tests running side by
 * side never meet on a port. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/clock.h"
#include "tests/shell.h"
#include "tests/sink.h"
#include "tests/tmpdir.h"

/* ---- running the command ----------------------------------------------------------------- */

typedef struct {
    char *out, *err;
    int code; /* exit status, 128 + signal when killed */
    double seconds;
} result;

/* Runs `ctrain test args...` (NULL-terminated) and reads its output until it exits
 * or deadline_s passes (then SIGTERM, which the launcher passes on to the ranks, and
 * the test fails). */
static result run_test_cmd(const char *const *args, double deadline_s)
{
    const char *bin = getenv("CTRAIN_BIN");
    if (!bin || !*bin) cr_skip_test("CTRAIN_BIN is not set: run through `make test`, or set CTRAIN_BIN");
    const char *argv[32] = {bin, "test"};
    int n = 2;
    for (; args[n - 2]; n++) {
        cr_assert_lt(n, 31);
        argv[n] = args[n - 2];
    }
    argv[n] = NULL;
    double t0 = now_s();
    /* SIGTERM, not SIGKILL: the launcher passes it on to the ranks */
    sink s[2] = {{.fd = -1}, {.fd = -1}};
    pid_t pid = sink_spawn(argv, SIGTERM, &s[0], &s[1]);
    bool killed = false;
    while (s[0].fd >= 0 || s[1].fd >= 0) {
        struct pollfd p[2] = {{.fd = s[0].fd, .events = POLLIN}, {.fd = s[1].fd, .events = POLLIN}};
        int k = poll(p, 2, 200);
        cr_assert(k >= 0 || errno == EINTR);
        for (int i = 0; i < 2; i++)
            if (k > 0 && p[i].revents) sink_read(&s[i]);
        if (!killed && now_s() - t0 > deadline_s) {
            kill(pid, SIGTERM);
            killed = true;
        }
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    result r = {.out = s[0].p ? s[0].p : calloc(1, 1),
                .err = s[1].p ? s[1].p : calloc(1, 1),
                .code = shell_status(st),
                .seconds = now_s() - t0};
    cr_assert(!killed, "ctrain test ran past its %.0f s deadline; stdout:\n%s\nstderr:\n%s", deadline_s, r.out, r.err);
    return r;
}

static void result_free(result *r)
{
    free(r->out);
    free(r->err);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

static void assert_has(const result *r, const char *where, const char *needle)
{
    const char *hay = !strcmp(where, "stdout") ? r->out : r->err;
    cr_assert(strstr(hay, needle), "expected on %s: '%s'\nstdout:\n%s\nstderr:\n%s", where, needle, r->out, r->err);
}

static void clean_env(void)
{
    const char *vars[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                          "MASTER_PORT", "CTRAIN_TEST_INJECT", "CTRAIN_TIMEOUT", "CTRAIN_MIXED_PRECISION",
                          "CTRAIN_USE_DEEPSPEED", "CTRAIN_USE_FSDP", "CTRAIN_ZERO_STAGE",
                          "CTRAIN_GRADIENT_ACCUMULATION_STEPS", "CTRAIN_GRADIENT_CLIPPING", "CTRAIN_TRANSPORT",
                          "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

/* 1 rendezvous + 8 collectives x 6 dtypes + 1 barrier + 4 training steps */
#define N_CHECKS (1 + 8 * 6 + 1 + 4)

/* A passing run: every check PASS on rank 0's lines, none FAIL, the verdict names
 * the setting, exit 0. */
static void assert_all_pass(const result *r, const char *verdict)
{
    cr_assert_eq(r->code, 0, "exit status %d\nstdout:\n%s\nstderr:\n%s", r->code, r->out, r->err);
    cr_assert_eq(count_of(r->out, "[rank0] PASS "), N_CHECKS, "expected %d PASS lines:\n%s", N_CHECKS, r->out);
    cr_assert_eq(count_of(r->out, "FAIL"), 0, "%s", r->out);
    char line[256];
    snprintf(line, sizeof line, "\nctrain test: all %d checks passed %s\n", N_CHECKS, verdict);
    assert_has(r, "stdout", line);
    /* rank 0 speaks for everyone: no other rank prints a verdict line */
    cr_assert_eq(count_of(r->out, "[rank1] PASS"), 0, "%s", r->out);
}

/* ---- passing runs -------------------------------------------------------------------------- */

Test(test_cmd, one_process, .timeout = 60)
{
    clean_env();
    result r = run_test_cmd(ARGS("--main_process_port", "0"), 50);
    assert_all_pass(&r, "on 1 process (no parallelism, mixed precision no)");
    assert_has(&r, "stdout", "[rank0] PASS rendezvous: 1 process, rank 0 of 1 here, transport none\n");
    /* the three sizes: 1, 1027 and an odd count of more than 1.5 MiB (one transport chunk
     * and one shared-memory slot): 1.5 MiB / 4 bytes + 1 */
    assert_has(&r, "stdout", "[rank0] PASS allreduce(sum) f32: sizes 1, 1027, 393217:");
    assert_has(&r, "stdout", "[rank0] PASS reduce_scatter(avg) bf16: sizes 1, 1027, 786433:");
    assert_has(&r, "stdout", "[rank0] PASS broadcast(root 0) i64: sizes 1, 1027, 196609:");
    result_free(&r);
}

Test(test_cmd, ddp_two_processes, .timeout = 60)
{
    clean_env();
    result r = run_test_cmd(ARGS("--num_processes", "2", "--main_process_port", "0"), 50);
    assert_all_pass(&r, "on 2 processes (DDP, mixed precision no)");
    assert_has(&r, "stdout", "[rank0] PASS rendezvous: 2 processes, rank 0 of 2 here, transport shm\n");
    assert_has(&r, "stdout", "[rank0] PASS broadcast(root 1) f16:");
    assert_has(&r, "stdout", "[rank0] PASS barrier: rank 0 waited ");
    for (int s = 1; s <= 4; s++) {
        char step[64];
        snprintf(step, sizeof step, "[rank0] PASS training step %d: loss ", s);
        assert_has(&r, "stdout", step);
    }
    assert_has(&r, "stdout", "<= 1e-05)");
    result_free(&r);
}

Test(test_cmd, zero3_two_processes, .timeout = 60)
{
    clean_env();
    result r = run_test_cmd(
        ARGS("--num_processes", "2", "--use_deepspeed", "--zero_stage", "3", "--main_process_port", "0"), 50);
    assert_all_pass(&r, "on 2 processes (DeepSpeed ZeRO-3, mixed precision no)");
    result_free(&r);
}

/* A configuration written for a GPT wraps its Block: the check's tiny model has no
 * Block, and its two layers stand for it instead of failing the training check. */
Test(test_cmd, fsdp_two_processes, .timeout = 60)
{
    clean_env();
    result r = run_test_cmd(ARGS("--num_processes", "2", "--use_fsdp", "--fsdp_auto_wrap_policy",
                                 "TRANSFORMER_BASED_WRAP", "--fsdp_transformer_layer_cls_to_wrap", "Block",
                                 "--main_process_port", "0"),
                            50);
    assert_all_pass(&r, "on 2 processes (FSDP FULL_SHARD, mixed precision no)");
    result_free(&r);
}

Test(test_cmd, bf16_two_processes, .timeout = 60)
{
    clean_env();
    result r = run_test_cmd(ARGS("--num_processes", "2", "--mixed_precision", "bf16", "--main_process_port", "0"), 50);
    assert_all_pass(&r, "on 2 processes (DDP, mixed precision bf16)");
    /* bf16's documented tolerance, not f32's */
    cr_assert_eq(count_of(r.out, "<= 2e-02)"), 4, "%s", r.out);
    result_free(&r);
}

/* fp16 with DeepSpeed's clipping: the loss scale and the clip on unscaled gradients (the
 * one process mirrors both; the clip must see the gradients unscaled once) */
Test(test_cmd, fp16_zero2_clipped_two_processes, .timeout = 60)
{
    clean_env();
    result r = run_test_cmd(ARGS("--num_processes", "2", "--use_deepspeed", "--zero_stage", "2", "--gradient_clipping",
                                 "0.05", "--mixed_precision", "fp16", "--main_process_port", "0"),
                            50);
    assert_all_pass(&r, "on 2 processes (DeepSpeed ZeRO-2, mixed precision fp16)");
    cr_assert_eq(count_of(r.out, "<= 2e-03)"), 4, "%s", r.out);
    result_free(&r);
}

/* A DeepSpeed config as users write them, with "auto" sizes (filled from the test's
 * loader) and its own bf16 and clipping settings. */
Test(test_cmd, deepspeed_config_file_with_auto_values, .timeout = 60)
{
    clean_env();
    make_tmpdir_with("/tmp/ct_test_cmd_");
    FILE *f = fopen(path_of("ds.json"), "w");
    cr_assert_not_null(f);
    fputs("{\"zero_optimization\": {\"stage\": 2}, \"bf16\": {\"enabled\": true}, \"gradient_clipping\": 0.5,\n"
          " \"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": \"auto\"}\n",
          f);
    fclose(f);
    result r = run_test_cmd(ARGS("--num_processes", "2", "--use_deepspeed", "--deepspeed_config_file",
                                 path_of("ds.json"), "--main_process_port", "0"),
                            50);
    remove_tmpdir();
    assert_all_pass(&r, "on 2 processes (DeepSpeed ZeRO-2, mixed precision bf16)");
    result_free(&r);
}

/* The launch configuration: a file given with --config_file, and the default file
 * ($CTRAIN_CONFIG_FILE) when none is given; a flag overrides the file. */
static void write_config(const char *name, const char *text)
{
    FILE *f = fopen(path_of(name), "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(test_cmd, config_file_sets_the_run, .timeout = 60)
{
    clean_env();
    make_tmpdir_with("/tmp/ct_test_cmd_");
    write_config("z3.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                            "deepspeed_config:\n  zero_stage: 3\nmixed_precision: bf16\nnum_processes: 2\n"
                            "use_cpu: true\nmain_process_port: 0\n");
    result r = run_test_cmd(ARGS("--config_file", path_of("z3.yaml")), 50);
    assert_all_pass(&r, "on 2 processes (DeepSpeed ZeRO-3, mixed precision bf16)");
    result_free(&r);
    /* the command line wins over the file */
    r = run_test_cmd(ARGS("--config_file", path_of("z3.yaml"), "--mixed_precision", "no"), 50);
    remove_tmpdir();
    assert_all_pass(&r, "on 2 processes (DeepSpeed ZeRO-3, mixed precision no)");
    result_free(&r);
}

Test(test_cmd, default_config_file_is_used, .timeout = 60)
{
    clean_env();
    make_tmpdir_with("/tmp/ct_test_cmd_");
    write_config("default.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\n"
                                 "fsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\nnum_processes: 2\n"
                                 "use_cpu: true\nmain_process_port: 0\n");
    cr_assert_eq(setenv("CTRAIN_CONFIG_FILE", path_of("default.yaml"), 1), 0);
    result r = run_test_cmd(ARGS(NULL), 50);
    remove_tmpdir();
    assert_all_pass(&r, "on 2 processes (FSDP SHARD_GRAD_OP, mixed precision no)");
    assert_has(&r, "stderr", "using the configuration in");
    result_free(&r);
}

/* ---- failures are caught and named ------------------------------------------------------- */

Test(test_cmd, injected_collective_fault_fails_that_check, .timeout = 60)
{
    clean_env();
    setenv("CTRAIN_TEST_INJECT", "collective", 1);
    result r = run_test_cmd(ARGS("--num_processes", "2", "--main_process_port", "0"), 50);
    cr_assert_eq(r.code, 1, "exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    /* element 5: m = (37*5 mod 29) - 14 = -3, s = (5 mod 3) - 1 = 1, f(r) = (m + s r) / 4:
     * the sum over ranks 0 and 1 is (-3 - 2) / 4 = -1.25; rank 1 reads it plus one */
    assert_has(&r, "stdout",
               "[rank0] FAIL allreduce(sum) f32: rank 1: size 1027: 1 of 1027 elements wrong, first element 5: "
               "expected -1.25, got -0.25\n");
    /* that check only: the other 53 pass */
    cr_assert_eq(count_of(r.out, "FAIL"), 1, "%s", r.out);
    cr_assert_eq(count_of(r.out, "[rank0] PASS "), N_CHECKS - 1, "%s", r.out);
    assert_has(&r, "stderr", "ctrain test: FAILED: 1 of 54 checks failed on 2 processes (DDP, mixed precision no): "
                             "allreduce(sum) f32\n");
    result_free(&r);
}

Test(test_cmd, injected_loss_fault_fails_that_step, .timeout = 60)
{
    clean_env();
    setenv("CTRAIN_TEST_INJECT", "loss", 1);
    result r = run_test_cmd(ARGS("--num_processes", "2", "--main_process_port", "0"), 50);
    cr_assert_eq(r.code, 1, "exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    /* rank 1's loss of step 3 x 1.5 moves the mean by a quarter of that loss: far
     * beyond 1e-5 */
    assert_has(&r, "stdout", "[rank0] FAIL training step 3: rank 0: loss ");
    assert_has(&r, "stdout", " > 1e-05\n");
    cr_assert_eq(count_of(r.out, "FAIL"), 1, "%s", r.out);
    assert_has(&r, "stdout", "[rank0] PASS training step 4:");
    assert_has(&r, "stderr", "1 of 54 checks failed on 2 processes (DDP, mixed precision no): training step 3\n");
    result_free(&r);
}

Test(test_cmd, injected_death_stops_the_run, .timeout = 60)
{
    clean_env();
    setenv("CTRAIN_TEST_INJECT", "die", 1);
    result r = run_test_cmd(ARGS("--num_processes", "2", "--main_process_port", "0"), 50);
    /* The launcher reports the first failure it reaps: normally rank 1's SIGKILL (status
     * 128 + 9), but on a busy machine rank 0 may have seen the closed connection,
     * failed its check and exited 1 by the time the launcher reaps both. Either way
     * the death is named. */
    cr_assert(r.code == 137 || r.code == 1, "exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    assert_has(&r, "stderr", "ctrain test: FAILED: ");
    if (r.code == 137) {
        assert_has(&r, "stderr", "rank 1 (pid ");
        assert_has(&r, "stderr", "was killed by signal 9");
        assert_has(&r, "stderr", "a rank was killed by signal 9");
    } else {
        assert_has(&r, "stdout", "[rank0] FAIL allreduce(sum) f32: rank 0: size 1027: ");
        assert_has(&r, "stdout", "rank 1 closed its connection");
    }
    /* within seconds: the peer's death is seen at once, not after CTRAIN_TIMEOUT (60 s) */
    cr_assert_lt(r.seconds, 30, "took %.1f s", r.seconds);
    result_free(&r);
}

Test(test_cmd, stuck_rank_times_out, .timeout = 60)
{
    clean_env();
    setenv("CTRAIN_TEST_INJECT", "hang", 1);
    setenv("CTRAIN_TIMEOUT", "2", 1);
    result r = run_test_cmd(ARGS("--num_processes", "2", "--main_process_port", "0"), 50);
    cr_assert_neq(r.code, 0, "stdout:\n%s\nstderr:\n%s", r.out, r.err);
    /* rank 0 waits in the first f32 sum for rank 1, which never comes: the collective
     * fails with a timeout after CTRAIN_TIMEOUT seconds, and that check is named */
    assert_has(&r, "stdout", "[rank0] FAIL allreduce(sum) f32: rank 0: size 1027: ");
    assert_has(&r, "stderr", "ctrain test: FAILED: ");
    assert_has(&r, "stderr", "allreduce(sum) f32");
    cr_assert_lt(r.seconds, 30, "took %.1f s", r.seconds);
    result_free(&r);
}

/* ---- usage ---------------------------------------------------------------------------------- */

Test(test_cmd, bad_flag_is_launchs_usage_error, .timeout = 30)
{
    clean_env();
    result r = run_test_cmd(ARGS("--num_processes", "2", "--bogus"), 20);
    cr_assert_eq(r.code, 2, "exit status %d\nstderr:\n%s", r.code, r.err);
    assert_has(&r, "stderr", "unknown flag '--bogus' (ctrain launch --help lists the flags)");
    cr_assert_eq(count_of(r.out, "[rank"), 0, "no rank may start: %s", r.out);
    result_free(&r);

    r = run_test_cmd(ARGS("--num_processes", "two"), 20);
    cr_assert_eq(r.code, 2);
    assert_has(&r, "stderr", "--num_processes 'two': expected a whole number");
    result_free(&r);

    /* a PROGRAM would replace the test's own */
    r = run_test_cmd(ARGS("--num_processes", "2", "./train"), 20);
    cr_assert_eq(r.code, 2);
    assert_has(&r, "stderr", "ctrain test: unexpected argument './train'");
    cr_assert_eq(count_of(r.out, "[rank"), 0, "%s", r.out);
    result_free(&r);

    setenv("CTRAIN_TEST_INJECT", "sometimes", 1);
    r = run_test_cmd(ARGS("--main_process_port", "0"), 20);
    cr_assert_eq(r.code, 2);
    assert_has(&r, "stderr", "CTRAIN_TEST_INJECT='sometimes'");
    result_free(&r);
}

Test(test_cmd, help, .timeout = 30)
{
    clean_env();
    result r = run_test_cmd(ARGS("--help"), 20);
    cr_assert_eq(r.code, 0);
    assert_has(&r, "stdout", "usage: ctrain test [--config_file FILE] [ctrain launch flags...]\n");
    assert_has(&r, "stdout", "Every `ctrain launch` flag is accepted");
    cr_assert_eq(count_of(r.out, "[rank"), 0, "help runs nothing: %s", r.out);
    result_free(&r);
}
