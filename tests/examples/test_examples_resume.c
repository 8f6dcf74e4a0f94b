/* examples/gpt/train.c killed and resumed: a tiny GPT (with dropout, so the process
 * generators matter) trained 40 steps with a checkpoint every 20, against the same run
 * killed with SIGKILL after step 25 and restarted with --resume auto. Steps 21..40 of
 * the restarted run must print the same losses, byte for byte, as the run that never
 * stopped: the step's loss to 6 decimals, the smoothed loss and the validation loss
 * (accel/checkpoint.h promises a bitwise resume). Once as one process, once as two
 * ranks under `ctrain launch` with ZeRO-2 (each rank writes its own part). The
 * binaries come from CTRAIN_BIN and CTRAIN_EXAMPLES (make test sets both). */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
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
#include "tests/proc_tree.h"
#include "tests/tmpdir.h"
#include "tests/shell.h"

static const char *bin_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set (make test sets it)", var);
    return v;
}

/* ---- running a program, killing it and its descendants (tests/proc_tree.h) ------------ */

typedef struct {
    char *out; /* stdout and stderr together */
    size_t len;
    int status; /* exit status, or 128 + signal */
} run_result;

/* Runs `sh -c cmd` with stdout and stderr into one pipe. With kill_when (a substring),
 * SIGKILLs the program and its descendants as soon as its output holds kill_when. The
 * whole run must end within timeout_s (else it is killed and the test fails). */
static run_result run_until(const char *cmd, const char *kill_when, double timeout_s)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0, "pipe2: %s", strerror(errno));
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the test */
        dup2(p[1], 1);
        dup2(p[1], 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(125);
    }
    close(p[1]);
    run_result r = {.out = malloc(1 << 16)};
    size_t cap = 1 << 16;
    cr_assert_not_null(r.out);
    r.out[0] = '\0';
    double end = now_s() + timeout_s;
    bool killed = false;
    for (;;) {
        if (now_s() > end) {
            proc_kill_tree(pid);
            waitpid(pid, NULL, 0);
            cr_assert_fail("timed out after %.0f s: %s\noutput:\n%s", timeout_s, cmd, r.out);
        }
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        int k = poll(&pf, 1, 200);
        if (k < 0 && errno == EINTR) continue;
        cr_assert_geq(k, 0, "poll: %s", strerror(errno));
        if (!k) continue;
        if (cap - r.len < 4097) {
            r.out = realloc(r.out, cap *= 2);
            cr_assert_not_null(r.out);
        }
        ssize_t got = read(p[0], r.out + r.len, cap - r.len - 1);
        if (got < 0 && errno == EINTR) continue;
        cr_assert_geq(got, 0, "read: %s", strerror(errno));
        if (got == 0) break;
        r.len += (size_t)got;
        r.out[r.len] = '\0';
        if (kill_when && !killed && strstr(r.out, kill_when)) {
            proc_kill_tree(pid);
            killed = true;
        }
    }
    close(p[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    r.status = shell_status(st);
    return r;
}

/* ---- what a resumed run must reproduce --------------------------------------------- */

/* The lines of steps lo..hi, without the launcher's "[rank0] " and without what no run
 * reproduces: of "step N/M  loss L  smoothed S  T tok/s  elapsed E  ETA R" everything
 * before the speed; the validation lines ("step N: train loss ..., val loss ...")
 * whole. Caller frees. */
static char *step_lines(const char *out, int lo, int hi, int *count)
{
    size_t cap = strlen(out) + 1;
    char *res = calloc(1, cap), *w = res;
    cr_assert_not_null(res);
    *count = 0;
    for (const char *line = out; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *s = line;
        if (!strncmp(s, "[rank0] ", 8)) s += 8;
        int step;
        char sep;
        if (sscanf(s, "step %d%c", &step, &sep) == 2 && (sep == '/' || sep == ':') && step >= lo && step <= hi) {
            size_t keep = len - (size_t)(s - line);
            const char *speed = strstr(s, " tok/s");
            if (sep == '/') {
                cr_assert(speed && (size_t)(speed - s) < keep, "no speed in the progress line: %.*s", (int)keep, s);
                /* back over the number to the two spaces before it */
                const char *q = speed;
                while (q > s && q[-1] != ' ') q--;
                while (q > s && q[-1] == ' ') q--;
                keep = (size_t)(q - s);
                (*count)++;
            }
            memcpy(w, s, keep);
            w += keep;
            *w++ = '\n';
        }
        line = nl ? nl + 1 : NULL;
    }
    *w = '\0';
    return res;
}

/* The options of every run: a small GPT, dropout on. A step takes tens of milliseconds
 * on one thread (about 45 on a Zen 4 core): short runs, yet the 15 steps between the
 * kill's trigger and the step-40 checkpoint leave the test far more time than it needs
 * to land the signal. */
#define TINY_GPT                                                                                               \
    "--n_layer 2 --n_head 4 --n_embd 128 --block_size 128 --batch_size 8 --dropout 0.1 --steps 40 --warmup 5 " \
    "--seq_warmup 0 --eval_every 20 --eval_batches 2 --sample_tokens 0 --save_every 20"

/* prefix: what starts the program (gpt_train alone, or ctrain launch ... gpt_train);
 * extra: more options for every run. */
static void check_resume(const char *prefix, const char *extra)
{
    char cmd[4096], want_saved[512], want_resumed[512];
    const char *text = path_of("text.txt");

    /* the reference: 40 steps without a break */
    snprintf(cmd, sizeof cmd, "exec %s --data %s --out_dir %s/a --project_dir %s/a %s %s", prefix, text, tmpdir,
             tmpdir, TINY_GPT, extra);
    run_result ref = run_until(cmd, NULL, 50);
    cr_assert_eq(ref.status, 0, "%s\n%s", cmd, ref.out);
    snprintf(want_saved, sizeof want_saved, "saved checkpoint %s/a/checkpoints/checkpoint_0 (step 20)\n", tmpdir);
    cr_assert(strstr(ref.out, want_saved), "expected '%s' in:\n%s", want_saved, ref.out);

    /* the same run, killed once it printed step 25 */
    snprintf(cmd, sizeof cmd, "exec %s --data %s --out_dir %s/b --project_dir %s/b %s %s", prefix, text, tmpdir,
             tmpdir, TINY_GPT, extra);
    run_result cut = run_until(cmd, "step 25/40 ", 50);
    cr_assert_eq(cut.status, 128 + SIGKILL, "the run was to be killed at step 25:\n%s", cut.out);
    /* had it gone on to step 40 before the signal landed, there would be nothing to resume */
    int last = 0;
    for (const char *q = cut.out; (q = strstr(q, "step ")) != NULL; q += 5) {
        int st;
        if (sscanf(q, "step %d/40", &st) == 1 && st > last) last = st;
    }
    cr_assert(last >= 25 && last < 40, "the killed run got to step %d, expected 25..39:\n%s", last, cut.out);

    /* restarted: the latest checkpoint is step 20's */
    snprintf(cmd, sizeof cmd, "exec %s --data %s --out_dir %s/b --project_dir %s/b %s %s --resume auto", prefix,
             text, tmpdir, tmpdir, TINY_GPT, extra);
    run_result res = run_until(cmd, NULL, 50);
    cr_assert_eq(res.status, 0, "%s\n%s", cmd, res.out);
    snprintf(want_resumed, sizeof want_resumed, "resumed from %s/b/checkpoints/checkpoint_0 at step 20\n", tmpdir);
    cr_assert(strstr(res.out, want_resumed), "expected '%s' in:\n%s", want_resumed, res.out);
    cr_assert(!strstr(res.out, "step 20/40 "), "the resumed run ran step 20 again:\n%s", res.out);

    int n_ref, n_res;
    char *a = step_lines(ref.out, 21, 40, &n_ref), *b = step_lines(res.out, 21, 40, &n_res);
    cr_assert_eq(n_ref, 20, "the reference printed %d progress lines for steps 21..40:\n%s", n_ref, ref.out);
    cr_assert_eq(n_res, 20, "the resumed run printed %d progress lines for steps 21..40:\n%s", n_res, res.out);
    cr_assert_str_eq(b, a, "steps 21..40 differ after the resume.\nresumed:\n%s\nuninterrupted:\n%s", b, a);
    free(a);
    free(b);
    free(ref.out);
    free(cut.out);
    free(res.out);
}

Test(examples_resume, gpt_killed_and_resumed_alone, .timeout = 90)
{
    const char *ex = bin_or_skip("CTRAIN_EXAMPLES");
    bin_or_skip("CTRAIN_BIN");
    make_tmpdir_with("/tmp/ct_resume_");
    write_small_text(400);
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%s/gpt_train --threads 1", ex);
    /* --total_limit 1: the step-40 checkpoint replaces step 20's once complete */
    check_resume(prefix, "--total_limit 1");
    for (int k = 0; k < 2; k++) {
        char d[600];
        snprintf(d, sizeof d, "%s/%s/checkpoints/checkpoint_0", tmpdir, k ? "b" : "a");
        cr_assert_neq(access(d, F_OK), 0, "%s is still there under --total_limit 1", d);
        snprintf(d, sizeof d, "%s/%s/checkpoints/checkpoint_1/manifest.json", tmpdir, k ? "b" : "a");
        cr_assert_eq(access(d, R_OK), 0, "%s is missing", d);
    }
    remove_tmpdir();
}

Test(examples_resume, gpt_killed_and_resumed_under_launch_zero2, .timeout = 150)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    make_tmpdir_with("/tmp/ct_resume_");
    write_small_text(400);
    char prefix[1024];
    snprintf(prefix, sizeof prefix,
             "%s launch --num_processes 2 --num_cpu_threads_per_process 1 --main_process_port 0 --use_deepspeed "
             "--zero_stage 2 %s/gpt_train",
             ctrain, ex);
    check_resume(prefix, "");
    /* both ranks wrote their part */
    char d[600];
    for (int r = 0; r < 2; r++) {
        snprintf(d, sizeof d, "%s/b/checkpoints/checkpoint_1/optimizer-rank%05d-of-00002.safetensors", tmpdir, r);
        cr_assert_eq(access(d, R_OK), 0, "%s is missing", d);
    }
    remove_tmpdir();
}
