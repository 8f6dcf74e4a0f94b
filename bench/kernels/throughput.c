/* Kernel throughput next to the machine's memory bandwidth.
 *
 *   triad        a[i] = b[i] + s*c[i] over three 64 MiB f32 arrays; GB/s counts 3 arrays
 *                (the write-allocate read of a is not counted, as in STREAM)
 *   softmax      rows x 1024 f32, along the last dim; bytes = read x + write y
 *   layernorm    forward, rows x 1024 f32; bytes = x + y + w + b + mean + rstd
 *   attention    B=4 H=4 T=256 D=64 f32, causal and not. Bytes: q, k, v, out, lse
 *                (backward: dout, q, k, v, out, lse read, dq, dk, dv written).
 *                FLOPs: forward 4*B*H*T*T*D (the two products), half for causal;
 *                backward 2.5x the forward (five products instead of two).
 *   adamw        fused AdamW step over 16M f32 parameters; bytes = 4 reads + 3 writes
 *
 * Each cell is the median of repeated runs (at least 5, about 0.25 s in all) after one
 * warm-up, with 1 and 2 threads, printed as a markdown table. Outputs are allocated
 * inside the timed call, as a training step would. Runs in well under two minutes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/timing.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/softmax.h"

typedef struct bench_ctx {
    /* shared inputs */
    float *ta, *tb, *tc;
    int64_t triad_n;
    ct_tensor *sm_x, *ln_x, *ln_w, *ln_b;
    ct_tensor *q, *k, *v, *dout, *out[2], *lse[2];
    ct_tensor *p, *g, *m, *vv;
    int64_t adam_step;
    bool failed;
} bench_ctx;

typedef void (*bench_fn)(bench_ctx *c, int variant);

/* Median seconds of fn over repetitions, after one warm-up call. */
static double bench_median(bench_fn fn, bench_ctx *c, int variant, int max_reps)
{
    double t0 = now();
    CT_FRAME { fn(c, variant); }
    double first = now() - t0;
    int reps = first > 0 ? (int)(0.25 / first) : max_reps;
    if (reps < 5) reps = 5;
    if (reps > max_reps) reps = max_reps;
    double *ts = malloc((size_t)reps * sizeof *ts);
    for (int r = 0; r < reps; r++) {
        CT_FRAME {
            double s = now();
            fn(c, variant);
            ts[r] = now() - s;
        }
    }
    double med = median(ts, reps);
    free(ts);
    return med;
}

static void check(bench_ctx *c, bool ok, const char *what)
{
    if (!ok && !c->failed) {
        fprintf(stderr, "throughput: %s failed: %s\n", what, ct_last_error());
        c->failed = true;
    }
}

static void run_triad(bench_ctx *c, int variant)
{
    (void)variant;
    float *a = c->ta;
    const float *b = c->tb, *d = c->tc;
    const float s = 3.0f;
    const int64_t n = c->triad_n;
#pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * d[i];
}

static void run_softmax(bench_ctx *c, int variant)
{
    (void)variant;
    check(c, ct_kernel_softmax(c->sm_x, -1) != NULL, "softmax");
}

static void run_layernorm(bench_ctx *c, int variant)
{
    (void)variant;
    ct_tensor *y, *mean, *rstd;
    check(c, ct_kernel_layernorm(c->ln_x, c->ln_w, c->ln_b, 1e-5, &y, &mean, &rstd) == CT_OK, "layernorm");
}

static void run_attn_fwd(bench_ctx *c, int causal)
{
    ct_tensor *lse;
    check(c, ct_kernel_attention(c->q, c->k, c->v, causal, 0, &lse) != NULL, "attention");
}

static void run_attn_fwd_ref(bench_ctx *c, int causal)
{
    ct_tensor *out = ct_tensor_empty_like(c->out[causal]), *lse = ct_tensor_empty_like(c->lse[causal]);
    check(c, cti_cpu_attention_ref(c->q, c->k, c->v, causal, 0, out, lse) == CT_OK, "attention_ref");
}

static void run_attn_bwd(bench_ctx *c, int causal)
{
    ct_tensor *dq, *dk, *dv;
    check(c,
          ct_kernel_attention_backward(c->dout, c->q, c->k, c->v, c->out[causal], c->lse[causal], causal, 0, &dq, &dk,
                                       &dv) == CT_OK,
          "attention_backward");
}

static void run_adamw(bench_ctx *c, int variant)
{
    (void)variant;
    ct_adamw_hparams h = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1,
                          .step = ++c->adam_step, .decoupled = true};
    check(c, ct_kernel_adamw(c->p, c->g, c->m, c->vv, &h) == CT_OK, "adamw");
}

typedef struct bench_row {
    const char *name, *shape;
    bench_fn fn;
    int variant;
    double bytes, flops;
    bool one_thread_only;
    int max_reps;
} bench_row;

int main(void)
{
    ct_set_seed(1);
    bench_ctx c = {0};
    const int64_t B = 4, H = 4, T = 256, D = 64, rows = 4096, cols = 1024, adam_n = (int64_t)1 << 24;
    c.triad_n = ((int64_t)64 << 20) / (int64_t)sizeof(float);
    c.ta = aligned_alloc(64, (size_t)c.triad_n * sizeof(float));
    c.tb = aligned_alloc(64, (size_t)c.triad_n * sizeof(float));
    c.tc = aligned_alloc(64, (size_t)c.triad_n * sizeof(float));
    if (!c.ta || !c.tb || !c.tc) {
        fprintf(stderr, "throughput: out of memory for the triad arrays\n");
        return 1;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c.triad_n; i++) c.ta[i] = 0, c.tb[i] = 1, c.tc[i] = 2;

    c.sm_x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(rows, cols), 0, 1);
    c.ln_x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(rows, cols), 0, 1);
    c.ln_w = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(cols), 1, 0.1);
    c.ln_b = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(cols), 0, 0.1);
    /* q, k, v as the GPT makes them: transposed views of (B,T,H,D) */
    c.q = ct_tensor_transpose(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(B, T, H, D), 0, 1), 1, 2);
    c.k = ct_tensor_transpose(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(B, T, H, D), 0, 1), 1, 2);
    c.v = ct_tensor_transpose(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(B, T, H, D), 0, 1), 1, 2);
    c.dout = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(B, H, T, D), 0, 1);
    for (int causal = 0; causal < 2; causal++) c.out[causal] = ct_kernel_attention(c.q, c.k, c.v, causal, 0, &c.lse[causal]);
    c.p = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(adam_n), 0, 1);
    c.g = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(adam_n), 0, 1);
    c.m = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(adam_n));
    c.vv = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(adam_n));
    if (!c.sm_x || !c.ln_x || !c.ln_w || !c.ln_b || !c.q || !c.k || !c.v || !c.dout || !c.out[0] || !c.out[1] ||
        !c.p || !c.g || !c.m || !c.vv) {
        fprintf(stderr, "throughput: setup failed: %s\n", ct_last_error());
        return 1;
    }

    const double f4 = 4.0, bhtd = (double)(B * H * T * D) * f4, bht = (double)(B * H * T) * f4;
    const double attn_flops = 4.0 * (double)(B * H) * (double)T * (double)T * (double)D;
    const double mat = (double)(rows * cols) * f4;
    const bench_row table[] = {
        {"triad a = b + s*c", "3 x 64 MiB", run_triad, 0, 3.0 * (double)c.triad_n * f4, 0, false, 30},
        {"softmax", "4096 x 1024", run_softmax, 0, 2 * mat, 0, false, 50},
        {"layernorm fwd", "4096 x 1024", run_layernorm, 0, 2 * mat + 2 * cols * f4 + 2 * rows * f4, 0, false, 50},
        {"attention fwd", "4x4x256x64", run_attn_fwd, 0, 4 * bhtd + bht, attn_flops, false, 50},
        {"attention fwd causal", "4x4x256x64", run_attn_fwd, 1, 4 * bhtd + bht, attn_flops / 2, false, 50},
        {"attention bwd", "4x4x256x64", run_attn_bwd, 0, 8 * bhtd + bht, 2.5 * attn_flops, false, 50},
        {"attention bwd causal", "4x4x256x64", run_attn_bwd, 1, 8 * bhtd + bht, 2.5 * attn_flops / 2, false, 50},
        {"attention fwd causal (ref, f64 loops)", "4x4x256x64", run_attn_fwd_ref, 1, 4 * bhtd + bht, attn_flops / 2,
         true, 5},
        {"adamw step (fused)", "16M f32", run_adamw, 0, 7.0 * (double)adam_n * f4, 0, false, 30},
    };
    const int nrows = (int)(sizeof table / sizeof table[0]);

    printf("## ctrain kernel throughput (%ld online cores; median of repetitions)\n\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("| kernel | shape | threads | median ms | GB/s | GFLOP/s |\n");
    printf("|---|---|---:|---:|---:|---:|\n");
    for (int r = 0; r < nrows; r++) {
        for (int nt = 1; nt <= 2; nt++) {
            if (nt > 1 && table[r].one_thread_only) continue;
            ct_set_num_threads(nt);
            double t = bench_median(table[r].fn, &c, table[r].variant, table[r].max_reps);
            if (c.failed) return 1;
            char gf[32] = "-";
            if (table[r].flops > 0) snprintf(gf, sizeof gf, "%.1f", table[r].flops / t * 1e-9);
            printf("| %s | %s | %d | %.3f | %.1f | %s |\n", table[r].name, table[r].shape, nt, t * 1e3,
                   table[r].bytes / t * 1e-9, gf);
            fflush(stdout);
        }
    }
    ct_set_num_threads(0);
    printf("\nattention workspace per thread (T=S=1024, D=64, f32): %zu bytes; a T x S f32 matrix: %d bytes\n",
           cti_cpu_attention_workspace_bytes(1024, 1024, 64, 64, 4), 1024 * 1024 * 4);
    ct_frame_reset_root();
    free(c.ta), free(c.tb), free(c.tc);
    return 0;
}
