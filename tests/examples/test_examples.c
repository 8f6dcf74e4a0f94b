/* The bundled programs run as one process and, unchanged, under `ctrain launch
 * --num_processes 2`: examples/quickstart.c and examples/gpt/train.c (a tiny GPT on a
 * small text). The binaries come from CTRAIN_BIN and CTRAIN_EXAMPLES (make test sets
 * both). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/tmpdir.h"

static const char *bin_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set (make test sets it)", var);
    return v;
}

/* Runs cmd (sh -c), returns its exit status; its output (stdout + stderr) into out. */
static int run(const char *cmd, char *out, size_t cap)
{
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char out[1 << 16];

Test(examples, quickstart_alone_and_under_launch, .timeout = 60)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 50 %s/quickstart", ex);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "1 process(es), 64 batches per epoch") && strstr(out, "epoch 9: train mse"), "%s", out);
    snprintf(cmd, sizeof cmd, "timeout 50 %s launch --num_processes 2 %s/quickstart", ctrain, ex);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "[rank0] quickstart: 2 process(es), 32 batches per epoch") &&
                  strstr(out, "[rank0] epoch 9: train mse") && !strstr(out, "[rank1] epoch"),
              "%s", out);
}

Test(examples, gpt_under_launch_with_ddp, .timeout = 120)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    make_tmpdir_with("/tmp/ct_examples_");
    FILE *f = fopen(path_of("text.txt"), "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 400; i++) fprintf(f, "line %d: the quick brown fox jumps over the lazy dog.\n", i);
    fclose(f);
    char cmd[4096], args[1024];
    snprintf(args, sizeof args,
             "--data %s --out_dir %s/run --n_layer 1 --n_head 2 --n_embd 32 --block_size 32 --batch_size 4 "
             "--steps 6 --warmup 2 --seq_warmup 0 --eval_every 3 --eval_batches 2 --sample_tokens 8 --bucket_mb 0.01",
             path_of("text.txt"), tmpdir);
    snprintf(cmd, sizeof cmd, "timeout 100 %s launch --num_processes 2 %s/gpt_train %s", ctrain, ex, args);
    int rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "[rank0] GPT:") && strstr(out, "2 process(es)"), "%s", out);
    cr_assert(strstr(out, "[rank0] DDP: ") && strstr(out, "not hidden under backward"), "%s", out);
    cr_assert(strstr(out, "[rank0] trained 6 steps"), "%s", out);
    cr_assert(!strstr(out, "[rank1] trained"), "only rank 0 reports: %s", out);
    remove_tmpdir();
}
