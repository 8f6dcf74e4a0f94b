/* Tests for `ctrain launch` (tools/launch.c, tools/launch_args.c, tools/ctrain.c),
 * run as a program: the command named by CTRAIN_BIN (`make test` sets it) is
 * started with fork/exec and its stdout, stderr, exit status and duration are
 * checked against docs/launch.md. The ranks are `sh -c` scripts that print what
 * they were given, so every expectation is written out here from the flags.
 *
 * Every test has a timeout; the launcher dies with its test (PR_SET_PDEATHSIG) and
 * the tests that leave ranks sleeping check afterwards that those are gone. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/clock.h"
#include "tests/sink.h"
#include "tests/tmpdir.h"

/* ---- running the command ----------------------------------------------------------- */

typedef struct {
    pid_t pid;
    sink out, err;
    int code;       /* exit status, or -signal if the launcher itself was killed */
    double seconds; /* from start to exit */
    struct timespec t0;
} run_t;

static const char *ctrain_bin(void)
{
    const char *b = getenv("CTRAIN_BIN");
    if (!b || !*b)
        cr_skip_test("CTRAIN_BIN is not set: run through `make test`, or set CTRAIN_BIN to build/bin/ctrain");
    return b;
}

/* Starts `ctrain args...` (args NULL-terminated, without "ctrain"). */
static void start(run_t *r, const char *const *args)
{
    const char *bin = ctrain_bin();
    const char *argv[64] = {bin};
    int n = 1;
    while (args[n - 1]) {
        cr_assert_lt(n, 63);
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    *r = (run_t){0};
    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    r->pid = sink_spawn(argv, SIGKILL, &r->out, &r->err);
}

/* Reads whatever arrives within timeout_s; returns false when both pipes are at EOF. */
static bool pump(run_t *r, double timeout_s)
{
    struct pollfd p[2] = {{.fd = r->out.fd, .events = POLLIN}, {.fd = r->err.fd, .events = POLLIN}};
    if (r->out.fd < 0 && r->err.fd < 0) return false;
    int k = poll(p, 2, (int)(timeout_s * 1000));
    if (k < 0 && errno == EINTR) return true;
    cr_assert_geq(k, 0);
    if (p[0].revents) sink_read(&r->out);
    if (p[1].revents) sink_read(&r->err);
    return true;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; hay && (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

/* Reads stdout until it holds needle `times` times. */
static void wait_for(run_t *r, const char *needle, int times, double timeout_s)
{
    double end = now_s() + timeout_s;
    while (count_of(r->out.p, needle) < times) {
        cr_assert_lt(now_s(), end, "waited %.0f s for '%s' x%d; stdout:\n%s\nstderr:\n%s", timeout_s, needle, times,
                     r->out.p ? r->out.p : "", r->err.p ? r->err.p : "");
        cr_assert(pump(r, 0.2), "the launcher closed its output before printing '%s'", needle);
    }
}

/* Reads to EOF and reaps the launcher. */
static void finish(run_t *r)
{
    double end = now_s() + 25;
    while (pump(r, 0.5)) cr_assert_lt(now_s(), end, "the launcher did not close its output within 25 s");
    int st;
    cr_assert_eq(waitpid(r->pid, &st, 0), r->pid);
    r->seconds = now_s() - ((double)r->t0.tv_sec + 1e-9 * (double)r->t0.tv_nsec);
    r->code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    if (!r->out.p) r->out.p = calloc(1, 1);
    if (!r->err.p) r->err.p = calloc(1, 1);
}

static void run(run_t *r, const char *const *args)
{
    start(r, args);
    finish(r);
}

static void run_free(run_t *r)
{
    free(r->out.p);
    free(r->err.p);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static int nlines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The variables a rank reports, one line per rank. */
#define REPORT                                                                                       \
    "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT " \
    "$CTRAIN_RESTART_COUNT\""
#define REPORT_SETTINGS                                                                          \
    "echo \"$RANK ${CTRAIN_USE_CPU-unset} ${CTRAIN_MIXED_PRECISION-unset} "                     \
    "${CTRAIN_GRADIENT_ACCUMULATION_STEPS-unset} ${OMP_NUM_THREADS-unset} ${CTRAIN_NUM_THREADS-unset} " \
    "${CT_TEST_INHERITED-unset}\""

static void clean_env(void)
{
    const char *vars[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                          "MASTER_PORT", "CTRAIN_RESTART_COUNT", "CTRAIN_USE_CPU", "OMP_NUM_THREADS",
                          "CTRAIN_NUM_THREADS", "CTRAIN_GRADIENT_ACCUMULATION_STEPS", "CTRAIN_MIXED_PRECISION",
                          "CT_TEST_INHERITED", "CTRAIN_FP8_FORMAT", "CTRAIN_FP8_AMAX_HISTORY_LEN",
                          "CTRAIN_FP8_AMAX_COMPUTE_ALGO", "CTRAIN_FP8_MARGIN", "CTRAIN_FP8_EMBEDDING_AND_HEAD",
                          "CTRAIN_USE_DEEPSPEED", "CTRAIN_USE_FSDP", "CTRAIN_ZERO_STAGE",
                          "CTRAIN_FSDP_SHARDING_STRATEGY", "CTRAIN_STORE_TOKEN"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

static void assert_has(const char *hay, const char *needle, const char *what)
{
    cr_assert(strstr(hay, needle), "%s: expected '%s' in:\n%s", what, needle, hay);
}

/* ---- each rank's environment ----------------------------------------------------------- */

Test(launch, env_two_ranks, .timeout = 30)
{
    clean_env();
    setenv("RANK", "99", 1); /* a stale value from the parent must be replaced */
    setenv("CT_TEST_INHERITED", "kept", 1);
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "sh", "-c", REPORT "; " REPORT_SETTINGS));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long t = cores / 2 > 1 ? cores / 2 : 1;
    char want[128];
    assert_has(r.out.p, "[rank0] 0 0 2 2 0 127.0.0.1 29500 0\n", "rank 0");
    assert_has(r.out.p, "[rank1] 1 1 2 2 0 127.0.0.1 29500 0\n", "rank 1");
    for (int k = 0; k < 2; k++) {
        snprintf(want, sizeof want, "[rank%d] %d unset unset unset %ld %ld kept\n", k, k, t, t);
        assert_has(r.out.p, want, "default settings");
    }
    cr_assert_eq(nlines(r.out.p), 4, "stdout:\n%s", r.out.p);
    cr_assert_str_empty(r.err.p);
    run_free(&r);
}

Test(launch, env_three_ranks_with_settings, .timeout = 30)
{
    clean_env();
    setenv("OMP_NUM_THREADS", "7", 1); /* an explicit thread count wins over it */
    run_t r;
    run(&r, ARGS("launch", "--num_processes=3", "--cpu", "--mixed_precision", "bf16",
                 "--gradient_accumulation_steps=4", "--num_cpu_threads_per_process", "2", "--main_process_port",
                 "12345", "sh", "-c", REPORT "; " REPORT_SETTINGS));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    char want[128];
    for (int k = 0; k < 3; k++) {
        snprintf(want, sizeof want, "[rank%d] %d %d 3 3 0 127.0.0.1 12345 0\n", k, k, k);
        assert_has(r.out.p, want, "placement");
        snprintf(want, sizeof want, "[rank%d] %d 1 bf16 4 2 2 unset\n", k, k);
        assert_has(r.out.p, want, "settings");
    }
    cr_assert_eq(nlines(r.out.p), 6, "stdout:\n%s", r.out.p);
    run_free(&r);
}

Test(launch, fp8_recipe_flags_reach_the_ranks, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--main_process_port", "0", "--mixed_precision", "fp8", "--fp8_format", "E4M3",
                 "--fp8_amax_history_len=16", "--fp8_amax_compute_algo", "most_recent", "--fp8_margin", "0",
                 "--fp8_embedding_and_head", "sh", "-c",
                 "echo \"$CTRAIN_MIXED_PRECISION $CTRAIN_FP8_FORMAT $CTRAIN_FP8_AMAX_HISTORY_LEN "
                 "$CTRAIN_FP8_AMAX_COMPUTE_ALGO $CTRAIN_FP8_MARGIN $CTRAIN_FP8_EMBEDDING_AND_HEAD\""));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    assert_has(r.out.p, "[rank0] fp8 e4m3 16 most_recent 0 1\n", "fp8 recipe");
    run_free(&r);
    /* flags not given: the variables stay unset */
    run(&r, ARGS("launch", "--main_process_port", "0", "--mixed_precision", "fp8", "sh", "-c",
                 "echo \"${CTRAIN_FP8_FORMAT-unset} ${CTRAIN_FP8_MARGIN-unset} ${CTRAIN_FP8_EMBEDDING_AND_HEAD-unset}\""));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    assert_has(r.out.p, "[rank0] unset unset unset\n", "fp8 defaults");
    run_free(&r);
}

Test(launch, sharding_flags_reach_the_ranks, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--main_process_port", "0", "--use_deepspeed", "--zero_stage", "3",
                 "--offload_optimizer_device", "cpu", "--offload_param_device=none", "--deepspeed_config_file",
                 "ds.json", "--gradient_clipping", "1.5", "sh", "-c",
                 "echo \"$CTRAIN_USE_DEEPSPEED $CTRAIN_ZERO_STAGE $CTRAIN_OFFLOAD_OPTIMIZER_DEVICE "
                 "$CTRAIN_OFFLOAD_PARAM_DEVICE $CTRAIN_DEEPSPEED_CONFIG_FILE $CTRAIN_GRADIENT_CLIPPING "
                 "${CTRAIN_USE_FSDP-unset}\""));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    assert_has(r.out.p, "[rank0] 1 3 cpu none ds.json 1.5 unset\n", "deepspeed flags");
    run_free(&r);
    run(&r, ARGS("launch", "--main_process_port", "0", "--use_fsdp", "--fsdp_sharding_strategy", "hybrid_shard",
                 "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--fsdp_transformer_layer_cls_to_wrap", "Block",
                 "--fsdp_min_num_params", "1000", "--fsdp_offload_params", "true", "--fsdp_backward_prefetch",
                 "BACKWARD_POST", "--fsdp_forward_prefetch", "1", "--fsdp_reshard_after_forward", "false",
                 "--fsdp_state_dict_type", "SHARDED_STATE_DICT", "--fsdp_sync_module_states", "true", "sh", "-c",
                 "echo \"$CTRAIN_USE_FSDP $CTRAIN_FSDP_SHARDING_STRATEGY $CTRAIN_FSDP_AUTO_WRAP_POLICY "
                 "$CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP $CTRAIN_FSDP_MIN_NUM_PARAMS $CTRAIN_FSDP_OFFLOAD_PARAMS "
                 "$CTRAIN_FSDP_BACKWARD_PREFETCH $CTRAIN_FSDP_FORWARD_PREFETCH $CTRAIN_FSDP_RESHARD_AFTER_FORWARD "
                 "$CTRAIN_FSDP_STATE_DICT_TYPE $CTRAIN_FSDP_SYNC_MODULE_STATES ${CTRAIN_USE_DEEPSPEED-unset}\""));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    assert_has(r.out.p,
               "[rank0] 1 hybrid_shard TRANSFORMER_BASED_WRAP Block 1000 true BACKWARD_POST 1 false "
               "SHARDED_STATE_DICT true unset\n",
               "fsdp flags");
    run_free(&r);
}

Test(launch, env_second_machine, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "4", "--num_machines", "2", "--machine_rank", "1",
                 "--main_process_ip", "10.1.2.3", "--main_process_port=1234", "sh", "-c", REPORT));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    assert_has(r.out.p, "[rank2] 2 0 4 2 1 10.1.2.3 1234 0\n", "first local rank");
    assert_has(r.out.p, "[rank3] 3 1 4 2 1 10.1.2.3 1234 0\n", "second local rank");
    cr_assert_eq(nlines(r.out.p), 2, "stdout:\n%s", r.out.p);
    run_free(&r);
}

Test(launch, exported_omp_threads_are_kept, .timeout = 30)
{
    clean_env();
    setenv("OMP_NUM_THREADS", "5", 1);
    run_t r;
    run(&r, ARGS("launch", "sh", "-c", REPORT_SETTINGS));
    cr_assert_eq(r.code, 0);
    cr_assert_str_eq(r.out.p, "[rank0] 0 unset unset unset 5 unset unset\n");
    cr_assert_str_empty(r.err.p, "nothing is said about it");
    run_free(&r);
}

Test(launch, program_flags_and_double_dash, .timeout = 30)
{
    clean_env();
    run_t r;
    /* After PROGRAM nothing is the launcher's; `--` ends the flags explicitly; a
     * hyphenated flag name is read as the underscored one. */
    run(&r, ARGS("launch", "--num-processes=2", "--", "sh", "-c", "echo \"$1 $WORLD_SIZE\"", "sh", "--num_processes"));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    assert_has(r.out.p, "[rank0] --num_processes 2\n", "rank 0");
    assert_has(r.out.p, "[rank1] --num_processes 2\n", "rank 1");
    run_free(&r);
}

/* ---- output ------------------------------------------------------------------------- */

Test(launch, lines_are_prefixed_whole_and_complete, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "3", "sh", "-c",
                 "i=0; while [ $i -lt 2000 ]; do echo \"$RANK:$i:abcdefghijklmnopqrstuvwxyz\"; "
                 "[ $((i % 10)) = 0 ] && echo \"$RANK:$i:err\" >&2; i=$((i+1)); done"));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    int next[3] = {0}, next_err[3] = {0};
    for (int e = 0; e < 2; e++) {
        char *s = e ? r.err.p : r.out.p;
        int *nx = e ? next_err : next;
        for (char *line = s, *nl; *line; line = nl + 1) {
            nl = strchr(line, '\n');
            cr_assert_not_null(nl, "the output ends with an unterminated line: '%s'", line);
            *nl = 0;
            int pr, rank, seq, used = 0;
            char tail[64];
            cr_assert_eq(sscanf(line, "[rank%d] %d:%d:%63s%n", &pr, &rank, &seq, tail, &used), 4,
                         "malformed line '%s'", line);
            cr_assert_eq((size_t)used, strlen(line), "malformed line '%s'", line);
            cr_assert(pr >= 0 && pr < 3 && pr == rank, "prefix of '%s' names another rank", line);
            cr_assert_str_eq(tail, e ? "err" : "abcdefghijklmnopqrstuvwxyz", "line '%s' was cut or mixed", line);
            cr_assert_eq(seq, nx[rank], "rank %d: line %d follows %d (lost or reordered)", rank, seq, nx[rank] - 1);
            nx[rank] += e ? 10 : 1;
        }
    }
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(next[k], 2000, "rank %d: %d of 2000 stdout lines", k, next[k]);
        cr_assert_eq(next_err[k], 2000, "rank %d: stderr lines up to %d", k, next_err[k]);
    }
    run_free(&r);
}

Test(launch, long_and_partial_lines, .timeout = 30)
{
    clean_env();
    run_t r;
    /* A line of exactly 64 KiB stays whole; one of 150000 bytes comes in pieces of
     * 65536, 65536 and 18928 bytes; "tail", without a newline, when the pipe closes. */
    run(&r, ARGS("launch", "sh", "-c",
                 "head -c 65536 /dev/zero | tr '\\0' x; echo; head -c 150000 /dev/zero | tr '\\0' x; echo; "
                 "printf tail"));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    const size_t pieces[4] = {65536, 65536, 65536, 18928};
    const char *p = r.out.p;
    for (int i = 0; i < 4; i++) {
        cr_assert(!strncmp(p, "[rank0] ", 8), "piece %d has no prefix", i);
        p += 8;
        size_t n = strspn(p, "x");
        cr_assert_eq(n, pieces[i], "piece %d: %zu bytes, expected %zu", i, n, pieces[i]);
        p += n;
        cr_assert_eq(*p, '\n');
        p++;
    }
    cr_assert_str_eq(p, "[rank0] tail\n");
    run_free(&r);
}

Test(launch, stderr_goes_to_stderr, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "sh", "-c", "echo \"out $RANK\"; echo \"oops $RANK\" >&2"));
    cr_assert_eq(r.code, 0);
    assert_has(r.err.p, "[rank1] oops 1\n", "stderr");
    assert_has(r.err.p, "[rank0] oops 0\n", "stderr");
    cr_assert_null(strstr(r.out.p, "oops"));
    cr_assert_null(strstr(r.err.p, "out "));
    run_free(&r);
}

/* ---- failures -------------------------------------------------------------------------- */

static pid_t read_pid(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s was not written", path);
    int pid = 0;
    cr_assert_eq(fscanf(f, "%d", &pid), 1);
    fclose(f);
    return pid;
}

/* The sleeping ranks wrote their pids (after `exec sleep 60`, the sleep's). */
static void assert_gone(const char *path)
{
    pid_t pid = read_pid(path);
    cr_assert(kill(pid, 0) != 0 && errno == ESRCH, "the rank with pid %d is still alive", pid);
}

static void assert_one_launcher_line(const char *err, const char *what)
{
    cr_assert_eq(count_of(err, "ctrain launch:"), 1, "%s: expected one line from the launcher:\n%s", what, err);
}

Test(launch, failing_rank_stops_the_others, .timeout = 30)
{
    clean_env();
    make_tmpdir_with("/tmp/ct_launch_");
    setenv("D", tmpdir, 1);
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "3", "sh", "-c",
                 "if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; echo $$ > \"$D/pid$RANK\"; exec sleep 60"));
    cr_assert_eq(r.code, 3, "exit %d, stderr: %s", r.code, r.err.p);
    cr_assert_lt(r.seconds, 6.0, "took %.1f s", r.seconds);
    assert_has(r.err.p, "rank 1 (pid ", "the reason");
    assert_has(r.err.p, ") exited with status 3; stopped the other 2 ranks\n", "the reason");
    assert_one_launcher_line(r.err.p, "failure");
    assert_gone(path_of("pid0"));
    assert_gone(path_of("pid2"));
    run_free(&r);
    remove_tmpdir();
}

Test(launch, rank_killed_by_signal, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "sh", "-c",
                 "if [ $RANK = 1 ]; then sleep 0.2; kill -9 $$; fi; exec sleep 60"));
    cr_assert_eq(r.code, 128 + 9, "exit %d, stderr: %s", r.code, r.err.p);
    cr_assert_lt(r.seconds, 6.0);
    assert_has(r.err.p, "rank 1 (pid ", "the reason");
    assert_has(r.err.p, ") was killed by signal 9 (Killed); stopped the other rank\n", "the reason");
    assert_one_launcher_line(r.err.p, "failure");
    run_free(&r);
}

Test(launch, rank_ignoring_sigterm_gets_sigkill, .timeout = 30)
{
    clean_env();
    make_tmpdir_with("/tmp/ct_launch_");
    setenv("D", tmpdir, 1);
    run_t r;
    /* An ignored SIGTERM stays ignored across exec, so only SIGKILL stops rank 0. */
    run(&r, ARGS("launch", "--num_processes", "2", "sh", "-c",
                 "if [ $RANK = 1 ]; then sleep 0.3; exit 5; fi; trap '' TERM; echo $$ > \"$D/pid0\"; exec sleep 60"));
    cr_assert_eq(r.code, 5, "exit %d, stderr: %s", r.code, r.err.p);
    cr_assert(r.seconds > 2.5 && r.seconds < 6.0, "took %.1f s, expected SIGKILL after 3 s", r.seconds);
    assert_gone(path_of("pid0"));
    run_free(&r);
    remove_tmpdir();
}

/* ---- signals to the launcher ---------------------------------------------------------- */

Test(launch, sigterm_reaches_the_ranks, .timeout = 30)
{
    clean_env();
    run_t r;
    start(&r, ARGS("launch", "--num_processes", "2", "sh", "-c",
                   "trap 'echo \"rank $RANK got TERM\"; exit 0' TERM; echo \"ready $RANK\"; "
                   "while :; do sleep 0.1; done"));
    wait_for(&r, "] ready ", 2, 15);
    double t = now_s();
    cr_assert_eq(kill(r.pid, SIGTERM), 0);
    finish(&r);
    cr_assert_eq(r.code, 128 + SIGTERM, "exit %d, stderr: %s", r.code, r.err.p);
    cr_assert_lt(now_s() - t, 4.0, "the ranks exit at once on their trap");
    assert_has(r.out.p, "[rank0] rank 0 got TERM\n", "rank 0's trap");
    assert_has(r.out.p, "[rank1] rank 1 got TERM\n", "rank 1's trap");
    run_free(&r);
}

Test(launch, sigint_stops_the_ranks, .timeout = 30)
{
    clean_env();
    make_tmpdir_with("/tmp/ct_launch_");
    setenv("D", tmpdir, 1);
    run_t r;
    start(&r, ARGS("launch", "--num_processes", "2", "sh", "-c",
                   "echo $$ > \"$D/pid$RANK\"; echo \"ready $RANK\"; exec sleep 60"));
    wait_for(&r, "] ready ", 2, 15);
    cr_assert_eq(kill(r.pid, SIGINT), 0);
    finish(&r);
    cr_assert_eq(r.code, 128 + SIGINT, "exit %d, stderr: %s", r.code, r.err.p);
    cr_assert_lt(r.seconds, 8.0);
    assert_gone(path_of("pid0"));
    assert_gone(path_of("pid1"));
    run_free(&r);
    remove_tmpdir();
}

/* ---- restarts ---------------------------------------------------------------------------- */

Test(launch, restart_after_first_failure, .timeout = 30)
{
    clean_env();
    make_tmpdir_with("/tmp/ct_launch_");
    setenv("D", tmpdir, 1);
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "--max_restarts", "1", "--monitor_interval", "0.05", "sh", "-c",
                 "if [ $RANK = 1 ] && [ ! -e \"$D/failed\" ]; then touch \"$D/failed\"; exit 4; fi; "
                 "echo \"attempt $CTRAIN_RESTART_COUNT\""));
    cr_assert_eq(r.code, 0, "exit %d, stderr: %s", r.code, r.err.p);
    assert_has(r.out.p, "[rank0] attempt 1\n", "rank 0 restarted");
    assert_has(r.out.p, "[rank1] attempt 1\n", "rank 1 restarted");
    cr_assert_null(strstr(r.out.p, "[rank1] attempt 0"));
    assert_has(r.err.p, ") exited with status 4;", "the restart line");
    assert_has(r.err.p, "restarting the 2 local ranks (restart 1 of 1)\n", "the restart line");
    assert_one_launcher_line(r.err.p, "restart");
    unlink(path_of("failed"));
    run_free(&r);
    remove_tmpdir();
}

Test(launch, restarts_run_out, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "--max_restarts", "1", "sh", "-c",
                 "echo \"attempt $CTRAIN_RESTART_COUNT\"; if [ $RANK = 1 ]; then exit 4; fi; exec sleep 60"));
    cr_assert_eq(r.code, 4, "exit %d, stderr: %s", r.code, r.err.p);
    cr_assert_lt(r.seconds, 6.0);
    assert_has(r.out.p, "[rank0] attempt 0\n", "first attempt");
    assert_has(r.out.p, "[rank0] attempt 1\n", "second attempt");
    cr_assert_null(strstr(r.out.p, "attempt 2"));
    cr_assert_eq(count_of(r.err.p, "restarting"), 1, "stderr:\n%s", r.err.p);
    cr_assert_eq(count_of(r.err.p, "ctrain launch:"), 2, "stderr:\n%s", r.err.p);
    run_free(&r);
}

/* ---- the port ------------------------------------------------------------------------------ */

Test(launch, port_zero_picks_a_usable_port, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "--main_process_port", "0", "sh", "-c",
                 "echo \"port $MASTER_PORT\""));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    int p0 = -1, p1 = -1;
    const char *a = strstr(r.out.p, "[rank0] port "), *b = strstr(r.out.p, "[rank1] port ");
    cr_assert(a && b, "stdout:\n%s", r.out.p);
    cr_assert_eq(sscanf(a, "[rank0] port %d", &p0), 1);
    cr_assert_eq(sscanf(b, "[rank1] port %d", &p1), 1);
    cr_assert_eq(p0, p1, "the ranks were given different ports");
    cr_assert(p0 > 0 && p0 <= 65535, "port %d", p0);
    /* usable: rank 0's store could listen on it */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p0),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind to port %d: %s", p0, strerror(errno));
    cr_assert_eq(listen(fd, 1), 0);
    close(fd);
    run_free(&r);
}

/* One token per job (docs/launch.md, "Security model of the store"): the same for every
 * rank, 32 hex digits, another for the next launch; an exported one is passed on. */
Test(launch, store_token_per_job, .timeout = 30)
{
    clean_env();
    char tok[2][2][64] = {{"", ""}, {"", ""}};
    for (int j = 0; j < 2; j++) {
        run_t r;
        run(&r, ARGS("launch", "--num_processes", "2", "sh", "-c", "echo \"token $CTRAIN_STORE_TOKEN\""));
        cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
        for (int k = 0; k < 2; k++) {
            char want[32];
            snprintf(want, sizeof want, "[rank%d] token ", k);
            const char *at = strstr(r.out.p, want);
            cr_assert(at && sscanf(at + strlen(want), "%63s", tok[j][k]) == 1, "stdout:\n%s", r.out.p);
            cr_assert_eq(strlen(tok[j][k]), 32, "token '%s'", tok[j][k]);
            cr_assert_eq(strspn(tok[j][k], "0123456789abcdef"), 32, "token '%s'", tok[j][k]);
        }
        cr_assert_str_eq(tok[j][0], tok[j][1], "the ranks of one job share the token");
        run_free(&r);
    }
    cr_assert_str_neq(tok[0][0], tok[1][0], "two launches drew the same token");
    setenv("CTRAIN_STORE_TOKEN", "exported-token", 1);
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "sh", "-c", "echo \"token $CTRAIN_STORE_TOKEN\""));
    unsetenv("CTRAIN_STORE_TOKEN");
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    assert_has(r.out.p, "[rank0] token exported-token\n", "rank 0");
    assert_has(r.out.p, "[rank1] token exported-token\n", "rank 1");
    run_free(&r);
}

/* ---- usage errors ---------------------------------------------------------------------------- */

Test(launch, bad_flags_are_usage_errors, .timeout = 30)
{
    clean_env();
    static const struct {
        const char *args[12];
        const char *msg;
    } cases[] = {
        {{"launch", "--bogus", "1", "true"}, "unknown flag '--bogus'"},
        {{"launch", "-n", "2", "true"}, "unknown flag '-n'"},
        {{"launch", "--num_processes", "abc", "true"}, "--num_processes 'abc'"},
        {{"launch", "--num_processes=0", "true"}, "--num_processes '0'"},
        {{"launch", "--num_processes"}, "--num_processes needs a value"},
        {{"launch", "--num_processes", "3", "--num_machines", "2", "true"}, "--num_processes 3 is not a multiple of --num_machines 2"},
        {{"launch", "--num_processes", "2", "--num_machines", "2", "--machine_rank", "2", "true"}, "--machine_rank 2"},
        {{"launch", "--num_processes", "2", "--num_machines", "2", "--main_process_port", "0", "true"}, "--main_process_port 0"},
        {{"launch", "--main_process_port", "65536", "true"}, "--main_process_port '65536'"},
        {{"launch", "--mixed_precision", "fp32", "true"}, "--mixed_precision 'fp32'"},
        {{"launch", "--fp8_format", "E5M2", "true"}, "--fp8_format 'E5M2': expected HYBRID or E4M3"},
        {{"launch", "--fp8_amax_compute_algo", "mean", "true"}, "--fp8_amax_compute_algo 'mean': expected max or most_recent"},
        {{"launch", "--fp8_amax_history_len", "0", "true"}, "--fp8_amax_history_len '0'"},
        {{"launch", "--fp8_margin", "65", "true"}, "--fp8_margin '65'"},
        {{"launch", "--fp8_embedding_and_head=1", "true"}, "--fp8_embedding_and_head takes no value"},
        {{"launch", "--tee", "4", "--log_dir", "x", "true"}, "--tee '4'"},
        {{"launch", "--tee", "1", "true"}, "--tee 1 needs --log_dir"},
        {{"launch", "--monitor_interval", "0", "true"}, "--monitor_interval '0'"},
        {{"launch", "--max_restarts", "-1", "true"}, "--max_restarts '-1'"},
        {{"launch", "--cpu=yes", "true"}, "--cpu takes no value"},
        {{"launch", "--zero_stage", "2", "true"}, "--zero_stage needs --use_deepspeed"},
        {{"launch", "--fsdp_sharding_strategy", "FULL_SHARD", "true"}, "--fsdp_sharding_strategy needs --use_fsdp"},
        {{"launch", "--use_deepspeed", "--use_fsdp", "true"}, "--use_deepspeed and --use_fsdp were both given"},
        {{"launch", "--use_deepspeed", "--zero_stage", "4", "true"}, "--zero_stage '4': expected a whole number from 0 to 3"},
        {{"launch", "--use_deepspeed", "--offload_optimizer_device", "nvme", "true"},
         "--offload_optimizer_device: offload device 'nvme'; allowed: none, cpu"},
        {{"launch", "--use_deepspeed", "--gradient_clipping", "-1", "true"}, "--gradient_clipping: '-1': expected a number >= 0"},
        {{"launch", "--use_fsdp", "--fsdp_sharding_strategy", "FULL", "true"},
         "sharding_strategy 'FULL'; allowed: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD"},
        {{"launch", "--use_fsdp", "--fsdp_auto_wrap_policy", "BLOCK", "true"}, "auto_wrap_policy 'BLOCK'"},
        {{"launch", "--use_fsdp", "--fsdp_offload_params", "maybe", "true"}, "--fsdp_offload_params: boolean 'maybe'"},
        {{"launch", "--use_fsdp", "--fsdp_backward_prefetch", "PRE", "true"}, "backward_prefetch 'PRE'"},
        {{"launch", "--use_fsdp", "--fsdp_state_dict_type", "LOCAL_STATE_DICT", "true"}, "state_dict_type 'LOCAL_STATE_DICT'"},
        {{"launch", "--use_fsdp", "--fsdp_min_num_params", "0", "true"}, "--fsdp_min_num_params '0'"},
        {{"launch", "--use_fsdp=1", "true"}, "--use_fsdp takes no value"},
        {{"launch", "--num_processes", "2"}, "no PROGRAM given"},
        {{"launch"}, "no PROGRAM given"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_t r;
        run(&r, cases[i].args);
        cr_assert_eq(r.code, 2, "case %zu (%s): exit %d, stderr: %s", i, cases[i].msg, r.code, r.err.p);
        cr_assert(!strncmp(r.err.p, "ctrain launch: ", 15), "case %zu: stderr '%s'", i, r.err.p);
        assert_has(r.err.p, cases[i].msg, "usage error");
        cr_assert_eq(nlines(r.err.p), 1, "case %zu: one line, got:\n%s", i, r.err.p);
        cr_assert_str_empty(r.out.p);
        run_free(&r);
    }
}

Test(launch, missing_or_unrunnable_program, .timeout = 30)
{
    clean_env();
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "/nonexistent/ct_prog"));
    cr_assert_eq(r.code, 127, "exit %d, stderr: %s", r.code, r.err.p);
    assert_has(r.err.p, "cannot run '/nonexistent/ct_prog'", "not found");
    cr_assert_eq(nlines(r.err.p), 1, "stderr:\n%s", r.err.p);
    run_free(&r);

    run(&r, ARGS("launch", "ct_no_such_program_on_path"));
    cr_assert_eq(r.code, 127);
    assert_has(r.err.p, "'ct_no_such_program_on_path'", "not on PATH");
    assert_has(r.err.p, "no such file or directory", "not on PATH");
    run_free(&r);

    make_tmpdir_with("/tmp/ct_launch_");
    FILE *f = fopen(path_of("not_exec"), "w");
    cr_assert_not_null(f);
    fputs("#!/bin/sh\necho never\n", f);
    fclose(f);
    cr_assert_eq(chmod(path_of("not_exec"), 0644), 0);
    run(&r, ARGS("launch", path_of("not_exec")));
    cr_assert_eq(r.code, 126, "exit %d, stderr: %s", r.code, r.err.p);
    assert_has(r.err.p, "permission denied", "not executable");
    cr_assert_str_empty(r.out.p);
    run_free(&r);
    remove_tmpdir();

    run(&r, ARGS("bogus-command"));
    cr_assert_eq(r.code, 2);
    assert_has(r.err.p, "unknown command 'bogus-command'", "ctrain");
    run_free(&r);
}

/* ---- --log_dir -------------------------------------------------------------------------------- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

Test(launch, log_dir_files, .timeout = 30)
{
    clean_env();
    make_tmpdir_with("/tmp/ct_launch_");
    char dir[256];
    snprintf(dir, sizeof dir, "%s/a/b", tmpdir); /* parents are created */
    const char *script = "echo \"out $RANK\"; printf last; echo \"err $RANK\" >&2";
    run_t r;
    run(&r, ARGS("launch", "--num_processes", "2", "--log_dir", dir, "sh", "-c", script));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    /* each rank's lines in its order; the ranks' lines may interleave (rank 0's line
     * can come between rank 1's two writes), and the unterminated "last" gets its
     * newline when the rank's output ends */
    for (int k = 0; k < 2; k++) {
        char first[64], second[64];
        snprintf(first, sizeof first, "[rank%d] out %d\n", k, k);
        snprintf(second, sizeof second, "[rank%d] last\n", k);
        assert_has(r.out.p, first, "still on the console");
        assert_has(r.out.p, second, "still on the console");
        cr_assert(strstr(r.out.p, first) < strstr(r.out.p, second), "rank %d's lines out of order:\n%s", k, r.out.p);
    }
    char path[512], want[64];
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/rank%d.stdout", dir, k);
        snprintf(want, sizeof want, "out %d\nlast", k);
        char *s = slurp(path);
        cr_assert_not_null(s, "%s missing", path);
        cr_assert_str_eq(s, want, "%s holds the rank's bytes, unprefixed", path);
        snprintf(path, sizeof path, "%s/rank%d.stderr", dir, k);
        snprintf(want, sizeof want, "err %d\n", k);
        s = slurp(path);
        cr_assert_not_null(s, "%s missing", path);
        cr_assert_str_eq(s, want);
    }
    run_free(&r);

    /* --tee 2: stderr only */
    snprintf(dir, sizeof dir, "%s/c", tmpdir);
    run(&r, ARGS("launch", "--tee", "2", "--log_dir", dir, "sh", "-c", script));
    cr_assert_eq(r.code, 0, "stderr: %s", r.err.p);
    snprintf(path, sizeof path, "%s/rank0.stdout", dir);
    cr_assert_null(slurp(path), "--tee 2 wrote %s", path);
    snprintf(path, sizeof path, "%s/rank0.stderr", dir);
    cr_assert_str_eq(slurp(path), "err 0\n");
    run_free(&r);

    const char *files[] = {"a/b/rank0.stdout", "a/b/rank0.stderr", "a/b/rank1.stdout", "a/b/rank1.stderr",
                           "c/rank0.stderr"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) unlink(path_of(files[i]));
    rmdir(path_of("a/b"));
    remove_tmpdir();
}

/* ---- help and version --------------------------------------------------------------------------- */

Test(launch, help_and_version, .timeout = 30)
{
    run_t r;
    run(&r, ARGS("--version"));
    cr_assert_eq(r.code, 0);
    cr_assert_str_eq(r.out.p, "ctrain 0.1.0\n");
    run_free(&r);

    run(&r, ARGS("--help"));
    cr_assert_eq(r.code, 0);
    assert_has(r.out.p, "launch", "ctrain --help");
    run_free(&r);

    run(&r, ARGS("launch", "--help"));
    cr_assert_eq(r.code, 0);
    const char *flags[] = {"--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
                           "--main_process_port", "--cpu", "--num_cpu_threads_per_process",
                           "--gradient_accumulation_steps", "--mixed_precision", "--tee", "--log_dir",
                           "--max_restarts", "--monitor_interval", "--fp8_format", "--fp8_amax_history_len",
                           "--fp8_amax_compute_algo", "--fp8_margin", "--fp8_embedding_and_head"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) assert_has(r.out.p, flags[i], "ctrain launch --help");
    cr_assert_str_empty(r.err.p);
    run_free(&r);
}
