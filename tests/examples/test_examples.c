/* The bundled programs run as one process and, unchanged, under `ctrain launch
 * --num_processes 2`: examples/quickstart.c and examples/gpt/train.c (a tiny GPT on a
 * small text). The binaries come from CTRAIN_BIN and CTRAIN_EXAMPLES (make test sets
 * both). */
#include <criterion/criterion.h>
#include <math.h>
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

/* Runs cmd (sh -c), returns its exit status; its output (stdout + stderr) into out. */
static int run(const char *cmd, char *out, size_t cap)
{
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    return shell_capture(full, out, cap);
}

static char out[1 << 16];

Test(examples, quickstart_alone_and_under_launch, .timeout = 60)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 50 %s/quickstart", ex);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "1 process(es) on ") && strstr(out, ", 64 batches per epoch") && strstr(out, "epoch 9: train mse"),
              "%s", out);
    snprintf(cmd, sizeof cmd, "timeout 50 %s launch --num_processes 2 --main_process_port 0 %s/quickstart", ctrain, ex);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "[rank0] quickstart: 2 process(es) on cpu, 32 batches per epoch") &&
                  strstr(out, "[rank0] epoch 9: train mse") && !strstr(out, "[rank1] epoch"),
              "%s", out);
}

Test(examples, gpt_under_launch_with_ddp, .timeout = 120)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    make_tmpdir_with("/tmp/ct_examples_");
    write_small_text(400);
    char cmd[4096], args[1024];
    snprintf(args, sizeof args,
             "--data %s --out_dir %s/run --n_layer 1 --n_head 2 --n_embd 32 --block_size 32 --batch_size 4 "
             "--steps 6 --warmup 2 --seq_warmup 0 --eval_every 3 --eval_batches 2 --sample_tokens 8 --bucket_mb 0.01",
             path_of("text.txt"), tmpdir);
    snprintf(cmd, sizeof cmd, "timeout 100 %s launch --num_processes 2 --main_process_port 0 %s/gpt_train %s", ctrain, ex, args);
    int rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "[rank0] GPT:") && strstr(out, "2 process(es)"), "%s", out);
    cr_assert(strstr(out, "[rank0] DDP: ") && strstr(out, "not hidden under backward"), "%s", out);
    cr_assert(strstr(out, "[rank0] trained 6 steps"), "%s", out);
    cr_assert(!strstr(out, "[rank1] trained"), "only rank 0 reports: %s", out);
    remove_tmpdir();
}

/* The GPT example sharded, unchanged: FSDP's flags (one unit per block) and a
 * DeepSpeed config file with "auto" values (ZeRO-2, CPU offload); each ends with the
 * whole model saved by rank 0 (unwrap_model gathered it) and a sample. */
Test(examples, gpt_under_launch_sharded, .timeout = 180)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    make_tmpdir_with("/tmp/ct_examples_");
    write_small_text(400);
    FILE *f = fopen(path_of("ds.json"), "w");
    cr_assert_not_null(f);
    fprintf(f, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}},\n"
               " \"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": \"auto\",\n"
               " \"gradient_clipping\": 1.0, \"bf16\": {\"enabled\": \"auto\"}}\n");
    fclose(f);
    static const char *const flags[] = {
        "--use_fsdp --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap Block",
        "--use_deepspeed --deepspeed_config_file %s/ds.json"};
    static const char *const want[] = {"[rank0] sharded (FULL over 2 ranks)", "[rank0] sharded (GRAD_OP over 2 ranks)"};
    for (int k = 0; k < 2; k++) {
        char fl[512], cmd[4096];
        snprintf(fl, sizeof fl, flags[k], tmpdir);
        snprintf(cmd, sizeof cmd,
                 "timeout 120 %s launch --num_processes 2 --main_process_port 0 %s %s/gpt_train --data %s "
                 "--out_dir %s/run%d --n_layer 2 --n_head 2 --n_embd 32 --block_size 32 --batch_size 4 --steps 6 "
                 "--warmup 2 --seq_warmup 0 --eval_every 3 --eval_batches 2 --sample_tokens 8",
                 ctrain, fl, ex, path_of("text.txt"), tmpdir, k);
        int rc = run(cmd, out, sizeof out);
        cr_assert_eq(rc, 0, "%s", out);
        cr_assert(strstr(out, want[k]), "expected '%s' in: %s", want[k], out);
        cr_assert(strstr(out, "[rank0] step 3: train loss") && strstr(out, "[rank0] trained 6 steps"), "%s", out);
        cr_assert(strstr(out, "[rank0] --- sample ---") && !strstr(out, "[rank1] trained"), "%s", out);
        char model[600];
        snprintf(model, sizeof model, "%s/run%d/model.safetensors", tmpdir, k);
        cr_assert_eq(access(model, R_OK), 0, "%s was not written: %s", model, out);
    }
    remove_tmpdir();
}

/* The same binary under mpirun (OMPI_COMM_WORLD_* variables, no launcher of ours) and
 * with Slurm's variables (SLURM_PROCID, SLURM_NTASKS, ...: two processes started by
 * hand as srun would): the same losses as under ctrain launch. */
Test(examples, quickstart_under_mpirun_and_slurm_variables, .timeout = 90)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    char cmd[4096];
    static char want[sizeof out];
    /* reference: the last line of a 2-rank run under ctrain launch */
    snprintf(cmd, sizeof cmd, "timeout 60 %s launch --num_processes 2 --main_process_port 0 %s/quickstart | tail -1 | sed 's/^\\[rank0\\] //'",
             ctrain, ex);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    memcpy(want, out, sizeof want);
    cr_assert(strstr(want, "epoch 9: train mse"), "%s", want);

    if (system("command -v mpirun > /dev/null 2>&1") == 0) {
        /* MPI ranks learn rank and size from mpirun; the store's port comes from MASTER_PORT (a free one) */
        snprintf(cmd, sizeof cmd,
                 "MASTER_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); "
                 "print(s.getsockname()[1])') timeout 60 mpirun --allow-run-as-root --oversubscribe -x MASTER_PORT "
                 "-np 2 %s/quickstart | tail -1",
                 ex);
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        cr_assert_str_eq(out, want, "mpirun: %s", out);
    } else {
        cr_log_warn("mpirun is not installed: the mpirun half of this test was skipped");
    }

    make_tmpdir_with("/tmp/ct_slurm_");
    snprintf(cmd, sizeof cmd,
             "port=$(python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])'); "
             "for r in 0 1; do SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_TASKS_PER_NODE=2 "
             "SLURM_JOB_NODELIST=localhost MASTER_PORT=$port timeout 60 %s/quickstart > %s/slurm$r.log & done; wait; "
             "tail -1 %s/slurm0.log; cat %s/slurm1.log",
             ex, tmpdir, tmpdir, tmpdir);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, want, "Slurm variables (rank 1 prints nothing): %s", out);
    remove_tmpdir();
}

/* ---- mixed precision: 300 steps of W1 ------------------------------------------------- */

/* The final validation loss the GPT example printed ("final val loss X nats/byte"). */
static double final_val(const char *text)
{
    const char *p = strstr(text, "final val loss ");
    cr_assert_not_null(p, "no final val loss in:\n%s", text);
    return atof(p + strlen("final val loss "));
}

/* The W1 GPT (the example's defaults: vocab 256, block 256, 4 layers, 4 heads, width 256,
 * batch 8) trained 300 steps on the default text with CTRAIN_MIXED_PRECISION=mp (what
 * `ctrain launch --mixed_precision mp` sets), alone or under ctrain launch with 2 ranks
 * of 4 sequences each (the same 8 per step); the final validation loss. The time
 * limits only catch a hang: a run takes about two minutes on one core. The suite runs
 * two tests at a time on two cores, so the single process gets one thread (launch gives
 * each of its 2 ranks one): two OpenMP threads sharing a core with another test's
 * threads wait on each other's barriers, and a run then took over 15 minutes. */
static double w1_val_loss(const char *mp, int ranks)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    char cmd[4096];
    const char *common = "--steps 300 --eval_every 300 --eval_batches 8 --sample_tokens 0";
    if (ranks == 1)
        snprintf(cmd, sizeof cmd, "env CTRAIN_MIXED_PRECISION=%s timeout 900 %s/gpt_train %s --threads 1 --out_dir %s/%s1",
                 mp, ex, common, tmpdir, mp);
    else
        snprintf(cmd, sizeof cmd,
                 "env CTRAIN_MIXED_PRECISION=%s timeout 900 %s launch --num_processes 2 --main_process_port 0 "
                 "%s/gpt_train %s --batch_size 4 --out_dir %s/%s2",
                 mp, ctrain, ex, common, tmpdir, mp);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    double v = final_val(out);
    cr_log_info("W1, %d rank(s), %s: final val loss %.4f", ranks, mp, v);
    return v;
}

/* bf16 ends within 2% and fp8 within 5% of the f32 validation loss, same data and seed.
 * Minutes of training: skipped under the sanitizers. */
static void w1_precisions(int ranks)
{
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("300 training steps of W1 take too long under AddressSanitizer");
#endif
    make_tmpdir_with("/tmp/ct_examples_mp_");
    double f32 = w1_val_loss("no", ranks), bf16 = w1_val_loss("bf16", ranks), fp8 = w1_val_loss("fp8", ranks);
    cr_expect(f32 < 3.0, "%d rank(s), f32: the model trained (val loss %.4f)", ranks, f32);
    cr_expect(fabs(bf16 - f32) <= 0.02 * f32, "%d rank(s): bf16 %.4f against f32 %.4f", ranks, bf16, f32);
    cr_expect(fabs(fp8 - f32) <= 0.05 * f32, "%d rank(s): fp8 %.4f against f32 %.4f", ranks, fp8, f32);
    remove_tmpdir();
}

Test(examples, gpt_w1_in_bf16_and_fp8_ends_near_f32_alone, .timeout = 2400) { w1_precisions(1); }

Test(examples, gpt_w1_in_bf16_and_fp8_ends_near_f32_under_ddp, .timeout = 2400) { w1_precisions(2); }
