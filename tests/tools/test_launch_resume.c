/* `ctrain launch --max_restarts` with a program that resumes (docs/launch.md,
 * "Restarts"): examples/gpt/train.c run with the same command line for every attempt
 * (--resume auto, --save_every), one rank SIGKILLed once the first checkpoint exists;
 * the launcher restarts both ranks, they resume from the latest complete checkpoint,
 * and the final model must equal, byte for byte, the one of the same job run without a
 * kill (accel/checkpoint.h promises a bitwise resume at the same world size). Also
 * what --resume auto does with no checkpoint (starts fresh, saying so) and with only
 * an incomplete one (an error, as ct_checkpoint_latest documents). The binaries come
 * from CTRAIN_BIN and CTRAIN_EXAMPLES (make test sets both). */
#include <criterion/criterion.h>
#include <sys/stat.h>

#include "tests/tmpdir.h"
#include "tests/tools/launch_jobs.h"

static const char *bin_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set (make test sets it)", var);
    return v;
}

/* A tiny GPT (a step takes a few milliseconds on one thread), dropout on so the
 * process generators matter; 300 steps leave the kill far more time than it needs. */
#define TINY_GPT                                                                                               \
    "--n_layer 2 --n_head 4 --n_embd 64 --block_size 64 --batch_size 4 --dropout 0.1 --steps 300 --warmup 5 " \
    "--seq_warmup 0 --eval_every 100 --eval_batches 2 --sample_tokens 0 --save_every 25 --resume auto"

static void launch_cmd(char *cmd, size_t cap, const char *ctrain, const char *ex, const char *sub)
{
    snprintf(cmd, cap,
             "%s launch --num_processes 2 --num_cpu_threads_per_process 1 --main_process_port 0 --max_restarts 1 "
             "%s/gpt_train --data %s --out_dir %s/%s --project_dir %s/%s " TINY_GPT,
             ctrain, ex, path_of("text.txt"), tmpdir, sub, tmpdir, sub);
}

Test(launch_resume, killed_rank_restarts_and_resumes_bitwise, .timeout = 120)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    setenv("CTRAIN_CONFIG_FILE", "/nonexistent/ctrain-test.yaml", 1);
    make_tmpdir_with("/tmp/ct_launch_resume_");
    write_small_text(400);
    char cmd[4096], log[600], dir[600], want[700];

    /* the reference: the same job, never interrupted */
    job ref;
    launch_cmd(cmd, sizeof cmd, ctrain, ex, "a");
    snprintf(log, sizeof log, "%s/a.log", tmpdir);
    job_start(&ref, cmd, log);
    int st = job_wait(&ref, 60);
    char *out_a = job_slurp(log);
    cr_assert_eq(st, 0, "%s\n%s", cmd, out_a);
    /* the first attempt of a --resume auto job: nothing to resume yet */
    snprintf(want, sizeof want, "[rank0] --resume auto: no checkpoint under %s/a/checkpoints yet; starting at step 1",
             tmpdir);
    cr_assert(strstr(out_a, want), "expected '%s' in:\n%s", want, out_a);

    /* killed: rank 0 or 1 (the launcher's first child), once a checkpoint exists */
    job cut;
    launch_cmd(cmd, sizeof cmd, ctrain, ex, "b");
    snprintf(log, sizeof log, "%s/b.log", tmpdir);
    job_start(&cut, cmd, log);
    snprintf(dir, sizeof dir, "%s/b/checkpoints", tmpdir);
    job_wait_entry(&cut, dir, "checkpoint_", 60);
    pid_t kids[8];
    int n = 0;
    proc_children_of(cut.pid, kids, &n, 8);
    cr_assert_eq(n, 2, "expected the launcher's 2 ranks, found %d", n);
    cr_assert_eq(kill(kids[0], SIGKILL), 0);
    st = job_wait(&cut, 60);
    char *out_b = job_slurp(log);
    cr_assert_eq(st, 0, "%s\n%s", cmd, out_b);
    cr_assert(strstr(out_b, "was killed by signal 9 (Killed)"), "no failure line in:\n%s", out_b);
    cr_assert(strstr(out_b, "restarting the 2 local ranks (restart 1 of 1)"), "no restart in:\n%s", out_b);
    /* the restart resumed, and before the end: otherwise nothing was tested */
    const char *r = strstr(out_b, "[rank0] resumed from ");
    cr_assert(r, "the restart did not resume:\n%s", out_b);
    long step = -1;
    const char *at = strstr(r, " at step ");
    cr_assert(at && sscanf(at, " at step %ld", &step) == 1 && step >= 25 && step < 300 && step % 25 == 0,
              "resumed at step %ld, expected a multiple of 25 below 300:\n%s", step, out_b);

    char ma[700], mb[700];
    snprintf(ma, sizeof ma, "%s/a/model.safetensors", tmpdir);
    snprintf(mb, sizeof mb, "%s/b/model.safetensors", tmpdir);
    cr_assert(job_same_file(ma, mb), "the resumed job's model differs from the uninterrupted one's (resumed at "
                                     "step %ld)", step);
    free(out_a);
    free(out_b);
    remove_tmpdir();
}

/* gpt_train alone, 2 steps: what --resume auto does with what is under checkpoints/ */
static int resume_auto(const char *ex, const char *sub, char **out)
{
    char cmd[2048], log[600];
    snprintf(cmd, sizeof cmd,
             "%s/gpt_train --threads 1 --data %s --out_dir %s/%s --n_layer 1 --n_head 2 --n_embd 32 --block_size 32 "
             "--batch_size 2 --steps 2 --warmup 1 --seq_warmup 0 --eval_every 2 --eval_batches 1 --sample_tokens 0 "
             "--resume auto",
             ex, path_of("text.txt"), tmpdir, sub);
    snprintf(log, sizeof log, "%s/%s.log", tmpdir, sub);
    job j;
    job_start(&j, cmd, log);
    int st = job_wait(&j, 30);
    *out = job_slurp(log);
    return st;
}

Test(launch_resume, resume_auto_without_and_with_an_incomplete_checkpoint, .timeout = 60)
{
    const char *ex = bin_or_skip("CTRAIN_EXAMPLES");
    make_tmpdir_with("/tmp/ct_launch_resume_");
    write_small_text(400);
    char d[700], want[800];
    char *out;

    /* an interrupted save's directory is no checkpoint: a fresh start */
    snprintf(d, sizeof d, "%s/fresh/checkpoints/checkpoint_0.tmp-1234", tmpdir);
    cr_assert_eq(system((snprintf(want, sizeof want, "mkdir -p %s", d), want)), 0);
    cr_assert_eq(resume_auto(ex, "fresh", &out), 0, "%s", out);
    snprintf(want, sizeof want, "--resume auto: no checkpoint under %s/fresh/checkpoints yet; starting at step 1",
             tmpdir);
    cr_assert(strstr(out, want), "expected '%s' in:\n%s", want, out);
    cr_assert(strstr(out, "trained 2 steps in"), "%s", out);
    free(out);

    /* checkpoint_0 without a manifest: not skipped silently, an error naming it */
    snprintf(d, sizeof d, "%s/broken/checkpoints/checkpoint_0", tmpdir);
    cr_assert_eq(system((snprintf(want, sizeof want, "mkdir -p %s", d), want)), 0);
    cr_assert_eq(resume_auto(ex, "broken", &out), 1, "%s", out);
    cr_assert(strstr(out, "cannot resume from the latest checkpoint") && strstr(out, "no complete checkpoint under"),
              "%s", out);
    cr_assert(!strstr(out, "starting at step 1"), "%s", out);
    free(out);
    remove_tmpdir();
}
