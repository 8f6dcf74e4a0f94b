/* GPU conformance of the bundled GPT example (examples/gpt/train.c): the W1 model
 * (the example's defaults) trained 10 steps on the GPU, unchanged -- prepare places
 * the model, the optimizer state and the batches -- against the same 10 steps on the
 * CPU (CTRAIN_USE_CPU=1, what `ctrain launch --cpu` sets): every step's training
 * loss within 1e-4 relative in f32 (TF32 off, the default), and bf16 and fp8 on the
 * GPU within the precision tests' bounds of the CPU's f32 losses (2% and 5%). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "ctrain.h"
#include "tests/gpu_conformance.h"
#include "tests/tmpdir.h"

#define STEPS 10

static const char *bin_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set (make test sets it)", var);
    return v;
}

/* Trains W1 for STEPS steps with env (NULL: none) into tmpdir/name; fills loss[]
 * from its loss.csv and returns the program's output in out. */
static void train(const char *env, const char *name, double *loss, char *out, size_t cap)
{
    const char *ex = bin_or_skip("CTRAIN_EXAMPLES");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "env %s timeout 600 %s/gpt_train --steps %d --eval_every 10 --eval_batches 2 --sample_tokens 0 --seq_warmup 0 "
             "--out_dir %s 2>&1",
             env ? env : "", ex, STEPS, path_of(name));
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed:\n%s", cmd, out);
    char csv[4096];
    snprintf(csv, sizeof csv, "%s/loss.csv", path_of(name));
    FILE *f = fopen(csv, "r");
    cr_assert_not_null(f, "no %s", csv);
    char line[512];
    int got = 0;
    cr_assert_not_null(fgets(line, sizeof line, f)); /* header */
    while (fgets(line, sizeof line, f) && got < STEPS) {
        long long step;
        double l;
        if (sscanf(line, "%lld,%lf", &step, &l) == 2 && step == got + 1) loss[got++] = l;
    }
    fclose(f);
    cr_assert_eq(got, STEPS, "%s: %d of %d steps in loss.csv", name, got, STEPS);
}

static char out_cpu[1 << 16], out_gpu[1 << 16];

static void compare(const char *mp, double rtol)
{
    GPU_REQUIRE();
    make_tmpdir_with("/tmp/ct_gpu_examples_");
    double cpu[STEPS], gpu[STEPS];
    train("CTRAIN_USE_CPU=1", "cpu", cpu, out_cpu, sizeof out_cpu);
    cr_assert(strstr(out_cpu, "on cpu"), "the reference ran on the CPU:\n%s", out_cpu);
    char env[64];
    snprintf(env, sizeof env, "CTRAIN_MIXED_PRECISION=%s", mp);
    train(env, "gpu", gpu, out_gpu, sizeof out_gpu);
    cr_assert(strstr(out_gpu, "on cuda:0"), "the run went to the GPU without a change to the program:\n%s", out_gpu);
    for (int s = 0; s < STEPS; s++) {
        cr_log_info("%s step %d: CPU f32 %.6f, GPU %.6f", mp, s + 1, cpu[s], gpu[s]);
        cr_expect(fabs(gpu[s] - cpu[s]) <= rtol * fabs(cpu[s]), "%s step %d: GPU %.6f, CPU f32 %.6f (rtol %g)", mp,
                  s + 1, gpu[s], cpu[s], rtol);
    }
    remove_tmpdir();
}

Test(gpu_examples, gpt_w1_f32_matches_the_cpu, .timeout = 1200) { compare("no", 1e-4); }
Test(gpu_examples, gpt_w1_bf16_tracks_f32, .timeout = 1200) { compare("bf16", 0.02); }
Test(gpu_examples, gpt_w1_fp8_tracks_f32, .timeout = 1200) { compare("fp8", 0.05); }

/* The quickstart (examples/quickstart.c), unchanged, on the GPU: its printed per-epoch
 * training losses against the CPU run's. 640 optimizer steps compound the f32
 * rounding differences of two summation orders, so the bound is 1e-3 relative. */
Test(gpu_examples, quickstart_matches_the_cpu, .timeout = 300)
{
    GPU_REQUIRE();
    const char *ex = bin_or_skip("CTRAIN_EXAMPLES");
    char cmd[2048];
    double cpu[10], gpu[10];
    for (int pass = 0; pass < 2; pass++) {
        char *out = pass ? out_gpu : out_cpu;
        snprintf(cmd, sizeof cmd, "env %s timeout 200 %s/quickstart 2>&1", pass ? "" : "CTRAIN_USE_CPU=1", ex);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        size_t n = fread(out, 1, sizeof out_cpu - 1, p);
        out[n] = 0;
        int st = pclose(p);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s:\n%s", cmd, out);
        cr_assert(strstr(out, pass ? "on cuda:0" : "on cpu"), "%s", out);
        for (int e = 0; e < 10; e++) {
            char key[32];
            snprintf(key, sizeof key, "epoch %d: train mse ", e);
            const char *at = strstr(out, key);
            cr_assert_not_null(at, "no '%s' in:\n%s", key, out);
            (pass ? gpu : cpu)[e] = atof(at + strlen(key));
        }
    }
    for (int e = 0; e < 10; e++)
        cr_expect(fabs(gpu[e] - cpu[e]) <= 1e-3 * cpu[e], "epoch %d: GPU mse %.5f, CPU %.5f", e, gpu[e], cpu[e]);
}
