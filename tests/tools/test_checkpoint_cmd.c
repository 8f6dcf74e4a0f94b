/* Tests for `ctrain checkpoint DIR` (tools/checkpoint_cmd.c), run as a program
 * (CTRAIN_BIN) on checkpoints the GPT example writes (CTRAIN_EXAMPLES; make test sets
 * both): the summary matches the run that saved it and every file is listed, a flipped byte in a file fails
 * with that file named (and restoring the byte makes it pass again), a missing
 * directory and bad usage fail. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/tmpdir.h"
#include "tests/shell.h"

static const char *bin_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set (make test sets it)", var);
    return v;
}

static char out[1 << 16];

/* Runs cmd (sh -c) under a time limit; its stdout and stderr into out; its exit status. */
static int run(const char *cmd)
{
    char full[4096];
    snprintf(full, sizeof full, "timeout 100 %s 2>&1", cmd);
    return shell_capture(full, out, sizeof out);
}

static int run_checkpoint(const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s checkpoint %s", bin_or_skip("CTRAIN_BIN"), args);
    return run(cmd);
}

static void assert_has(const char *needle)
{
    cr_assert(strstr(out, needle), "expected '%s' in:\n%s", needle, out);
}

/* tmpdir/text.txt and a GPT example run that saves after step 2 into tmpdir/p; prefix
 * starts the program (gpt_train alone or under ctrain launch). */
static void train_and_save(const char *prefix)
{
    write_small_text(200);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s --data %s --out_dir %s/run --project_dir %s/p --n_layer 1 --n_head 2 --n_embd 32 --block_size 32 "
             "--batch_size 4 --steps 2 --warmup 1 --seq_warmup 0 --eval_every 2 --eval_batches 1 --sample_tokens 0 "
             "--save_every 2",
             prefix, path_of("text.txt"), tmpdir, tmpdir);
    cr_assert_eq(run(cmd), 0, "%s\n%s", cmd, out);
}

/* XORs one byte of path, at offset from the end (1 = the last byte). */
static void flip_byte(const char *path, long from_end)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fseek(f, -from_end, SEEK_END), 0);
    int c = fgetc(f);
    cr_assert_neq(c, EOF);
    cr_assert_eq(fseek(f, -from_end, SEEK_END), 0);
    fputc(c ^ 0x5a, f);
    cr_assert_eq(fclose(f), 0);
}

Test(checkpoint_cmd, describes_and_verifies_one_process, .timeout = 120)
{
    const char *ex = bin_or_skip("CTRAIN_EXAMPLES");
    bin_or_skip("CTRAIN_BIN");
    make_tmpdir_with("/tmp/ct_ckptcmd_");
    char prefix[1024], dir[600], args[1300];
    snprintf(prefix, sizeof prefix, "%s/gpt_train --threads 1", ex);
    train_and_save(prefix);
    snprintf(dir, sizeof dir, "%s/p/checkpoints/checkpoint_0", tmpdir);

    cr_assert_eq(run_checkpoint(dir), 0, "%s", out);
    assert_has("OK: every checksum verifies (step 2, ");
    /* the manifest's summary */
    assert_has("step 2");
    assert_has("world size 1");
    assert_has("NO_SHARD");
    assert_has("adamw");
    /* one line per file */
    assert_has("model.safetensors");
    assert_has("optimizer-rank00000-of-00001.safetensors");
    assert_has("custom_gpt_train_progress.safetensors");

    /* the last byte of the model file is tensor data: only the checksum can see it */
    char model[700];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    flip_byte(model, 1);
    int rc = run_checkpoint(dir);
    cr_assert_eq(rc, 1, "a flipped byte must fail with status 1 (got %d):\n%s", rc, out);
    cr_assert(strstr(out, "ctrain checkpoint: ") && strstr(strstr(out, "ctrain checkpoint: "), "model.safetensors"),
              "the error must name model.safetensors:\n%s", out);
    cr_assert_null(strstr(out, "OK: every checksum verifies"), "%s", out);
    /* the same byte put back: the failure was that byte's */
    flip_byte(model, 1);
    cr_assert_eq(run_checkpoint(dir), 0, "%s", out);

    /* a directory that is not there */
    snprintf(args, sizeof args, "%s/p/checkpoints/checkpoint_7", tmpdir);
    rc = run_checkpoint(args);
    cr_assert_eq(rc, 1, "a missing directory must fail with status 1 (got %d):\n%s", rc, out);
    assert_has("checkpoint_7");
    remove_tmpdir();
}

Test(checkpoint_cmd, describes_a_sharded_checkpoint, .timeout = 120)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    make_tmpdir_with("/tmp/ct_ckptcmd_");
    char prefix[1024], dir[600];
    snprintf(prefix, sizeof prefix,
             "%s launch --num_processes 2 --num_cpu_threads_per_process 1 --main_process_port 0 --use_deepspeed "
             "--zero_stage 2 %s/gpt_train",
             ctrain, ex);
    train_and_save(prefix);
    snprintf(dir, sizeof dir, "%s/p/checkpoints/checkpoint_0", tmpdir);
    cr_assert_eq(run_checkpoint(dir), 0, "%s", out);
    assert_has("OK: every checksum verifies (step 2, ");
    assert_has("world size 2");
    assert_has("GRAD_OP");
    assert_has("optimizer-rank00000-of-00002.safetensors");
    assert_has("optimizer-rank00001-of-00002.safetensors");

    /* rank 1's optimizer part damaged: the message names that file */
    char part[700];
    snprintf(part, sizeof part, "%s/optimizer-rank00001-of-00002.safetensors", dir);
    flip_byte(part, 1);
    cr_assert_eq(run_checkpoint(dir), 1, "%s", out);
    cr_assert(strstr(strstr(out, "ctrain checkpoint: ") ? strstr(out, "ctrain checkpoint: ") : out,
                     "optimizer-rank00001-of-00002.safetensors"),
              "the error must name optimizer-rank00001-of-00002.safetensors:\n%s", out);
    remove_tmpdir();
}

Test(checkpoint_cmd, usage, .timeout = 20)
{
    cr_assert_eq(run_checkpoint(""), 2, "%s", out);
    assert_has("DIR is missing");
    cr_assert_eq(run_checkpoint("a b"), 2, "%s", out);
    cr_assert_eq(run_checkpoint("--verify a"), 2, "%s", out);
    assert_has("unknown flag '--verify'");
    cr_assert_eq(run_checkpoint("--help"), 0, "%s", out);
    assert_has("usage: ctrain checkpoint");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --help", bin_or_skip("CTRAIN_BIN"));
    cr_assert_eq(run(cmd), 0, "%s", out);
    assert_has("  checkpoint ");
}
