/* GPT training throughput on the CPU, fp32: one ctrain training step timed end to end,
 * or (--sgemm) the OpenBLAS sgemm ceiling on the same model's GEMM shapes.
 *
 *   gpt_cpu --config w1|124m --threads N [--steps S] [--warmup W] [--seed X] [--sgemm]
 *
 * Configs (HF GPT-2 architecture, nn/gpt.h; dropout 0):
 *   w1    vocab 256,   block 256,  4 layers,  4 heads, width 256, batch 8, seq 256
 *   124m  vocab 50257, block 1024, 12 layers, 12 heads, width 768, batch 1, seq 256
 * and one Llama (HF LlamaForCausalLM architecture, nn/llama.h: RMSNorm eps 1e-6, RoPE
 * theta 10000, SwiGLU MLP, no biases, untied lm_head, HF initialisation):
 *   llama-w1  vocab 2048, 4 layers, 4 heads (head_dim 64), 2 key/value heads, hidden
 *             256, intermediate 688, batch 8, seq 256
 *
 * One step = forward + mean cross-entropy + backward + clip_grad_norm(1.0) + AdamW step
 * (lr 1e-4, betas 0.9/0.95, weight decay 0.1 on the 2-D weights -- wte, wpe and the
 * linear weights -- none on biases and LayerNorm weights) + zero_grad, on a fresh batch of
 * uniformly random tokens each step (Philox, seeded; targets are the inputs shifted by
 * one, as with real text). Batches are drawn before the clock starts. Each step runs in
 * its own CT_FRAME, which frees its temporaries. After W warm-up steps (default w1: 3,
 * 124m: 2) S steps are timed one by one (default w1: 20, 124m: 6); the reported step
 * time is their median.
 *
 * Model FLOPs per step (the usual 6N approximation, PaLM appendix B / nanoGPT's
 * estimate_mfu, with the attention term for a causal mask):
 *     flops = tokens * (6 * N + 6 * n_layer * seq * n_embd)
 *     N     = every parameter except the position embedding wpe (the tied lm head is
 *             wte, counted once); biases and LayerNorm weights are in N (under 0.1%)
 *     6N          forward (2 FLOPs per weight per token) + backward (4)
 *     6*L*T*C     the attention products q k^T and p v: 2 * 2*T*C per token forward at
 *                 full size, times 3 for forward + backward = 12*L*T*C, halved because the
 *                 causal mask leaves half of the T x T scores (nanoGPT counts 12*L*T*C,
 *                 the full square; this benchmark counts only the work a causal kernel
 *                 must do)
 *   Llama: N = every parameter except embed_tokens (a lookup; the untied lm_head is
 *   counted), the attention term the same 6*L*T*C (C = heads * head_dim = hidden).
 *     gflops = flops / median step time. Softmax, LayerNorm, GELU, cross-entropy and the
 *     optimizer are not counted: their time is in the step, their FLOPs are not.
 *
 * --sgemm: cblas_sgemm (OpenBLAS, openblas_set_num_threads(N)) on every GEMM of a
 * training step that goes through sgemm: per layer the forward products of c_attn
 * (C -> 3C), attn.c_proj (C -> C), mlp.c_fc (C -> 4C) and mlp.c_proj (4C -> C) and, for
 * each, the two backward products (dX = dY W^T and dW = X^T dY) with the transposes
 * ctrain uses (weights stored [in, out]), plus the tied lm head's three products
 * (logits = X wte^T, dX = dY wte, dwte = dY^T X). Each distinct shape is timed
 * (W warm-up calls, then S calls, default 3 and 10), and the ceiling is
 *     sum over shapes of count * 2*M*N*K  /  sum over shapes of count * median time
 * i.e. the rate at which those GEMMs of one step would run back to back. The attention
 * products (ctrain's fused attention kernel) are not sgemm calls and are left out.
 * (GPT configs only.) The JSON line then gives gflops = the ceiling, step_ms and tokens_per_s = what a step
 * of `flops` above would take at that rate, and loss0 null.
 *
 * Output: one JSON line on stdout
 *   {"impl":"ctrain"|"sgemm","config":..,"threads":..,"tokens_per_s":..,"step_ms":..,
 *    "gflops":..,"peak_rss_mb":..,"loss0":..,"steps":..,"warmup":..,"params":..}
 * peak_rss_mb = getrusage(RUSAGE_SELF).ru_maxrss in MiB (the whole process: model,
 * gradients, AdamW state, activations, allocator caches). Errors (bad arguments, any
 * ctrain failure) print a message on stderr and exit with status 2.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench/gpt_cpu/gpt_step.h"
#include "bench/timing.h"
#include "ctrain.h"

#define PROG "gpt_cpu"
#include "bench/args.h" /* after PROG: its messages name the program */

typedef struct bench_config {
    const char *name;
    int64_t vocab, block, n_layer, n_head, n_embd, batch, seq;
    int warmup, steps;
    bool llama;               /* nn/llama.h's model instead of nn/gpt.h's */
    int64_t n_kv_head, inter; /* llama: key/value heads, MLP width */
} bench_config;

static const bench_config configs[] = {
    {"w1", 256, 256, 4, 4, 256, 8, 256, 3, 20, false, 0, 0},
    {"124m", 50257, 1024, 12, 12, 768, 1, 256, 2, 6, false, 0, 0},
    {"llama-w1", 2048, 2048, 4, 4, 256, 8, 256, 3, 20, true, 2, 688},
};

typedef struct options {
    const bench_config *cfg;
    int threads, steps, warmup;
    uint64_t seed;
    bool sgemm;
    ct_dtype precision; /* f32, or the autocast dtype (bf16, f16; bf16 under fp8) */
    bool fp8;           /* linears in fp8 (ct_autocast_begin_fp8), the rest bf16 */
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --config w1|124m|llama-w1 --threads N [--steps S] [--warmup W] [--seed X] [--sgemm]\n"
            "               [--precision f32|bf16|f16|fp8]\n"
            "  --config C    w1 (vocab 256, 4x256, batch 8 x 256), 124m (GPT-2 124M, batch 1 x 256) or\n"
            "                llama-w1 (Llama, vocab 2048, 4x256, 2 kv heads, MLP 688, batch 8 x 256)\n"
            "  --threads N   threads for ctrain (ct_set_num_threads) or OpenBLAS (--sgemm), N >= 1\n"
            "  --steps S     timed steps (default w1 20, 124m 6; --sgemm: calls per shape, default 10)\n"
            "  --warmup W    untimed steps first (default w1 3, 124m 2; --sgemm: 3)\n"
            "  --seed X      seeds the weights and the random tokens (default 1337)\n"
            "  --sgemm       measure the cblas_sgemm ceiling on the config's GEMM shapes instead\n"
            "  --precision P f32 (default), or bf16/f16: the forward under CT_AUTOCAST(P); fp8: under\n"
            "                an fp8 scope (linears in fp8 with delayed scaling, the rest bf16)\n"
            "Prints one JSON line.\n");
}

/* 0 ok, 1 --help, -1 error (message printed) */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.cfg = NULL, .threads = 0, .steps = -1, .warmup = -1, .seed = 1337, .precision = CT_DTYPE_F32};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--sgemm")) {
            o->sgemm = true;
        } else if (!strcmp(a, "--config")) {
            if (!v) {
                fprintf(stderr, PROG ": --config needs a value: w1, 124m or llama-w1\n");
                return -1;
            }
            o->cfg = NULL;
            for (size_t k = 0; k < sizeof configs / sizeof *configs; k++)
                if (!strcmp(v, configs[k].name)) o->cfg = &configs[k];
            if (!o->cfg) {
                fprintf(stderr, PROG ": --config %s: unknown config (expected w1, 124m or llama-w1)\n", v);
                return -1;
            }
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(a, v, 1, 1024, &x)) return -1;
            o->threads = (int)x;
            i++;
        } else if (!strcmp(a, "--steps")) {
            if (!parse_int(a, v, 1, 1000000, &x)) return -1;
            o->steps = (int)x;
            i++;
        } else if (!strcmp(a, "--warmup")) {
            if (!parse_int(a, v, 0, 1000000, &x)) return -1;
            o->warmup = (int)x;
            i++;
        } else if (!strcmp(a, "--precision")) {
            if (!v || (strcmp(v, "f32") && strcmp(v, "bf16") && strcmp(v, "f16") && strcmp(v, "fp8"))) {
                fprintf(stderr, PROG ": --precision needs f32, bf16, f16 or fp8\n");
                return -1;
            }
            o->fp8 = !strcmp(v, "fp8");
            o->precision = !strcmp(v, "bf16") || o->fp8 ? CT_DTYPE_BF16 : !strcmp(v, "f16") ? CT_DTYPE_F16 : CT_DTYPE_F32;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_int(a, v, 0, (long long)(~0ULL >> 1), &x)) return -1;
            o->seed = (uint64_t)x;
            i++;
        } else {
            fprintf(stderr, PROG ": unknown argument '%s' (see --help)\n", a);
            return -1;
        }
    }
    if (!o->cfg) {
        fprintf(stderr, PROG ": --config w1|124m|llama-w1 is required (see --help)\n");
        return -1;
    }
    if (o->cfg->llama && (o->sgemm || o->fp8)) {
        fprintf(stderr, PROG ": --config %s: %s is for the GPT configs only\n", o->cfg->name,
                o->sgemm ? "--sgemm" : "--precision fp8");
        return -1;
    }
    if (!o->threads) {
        fprintf(stderr, PROG ": --threads N is required (see --help)\n");
        return -1;
    }
    if (o->warmup < 0) o->warmup = o->sgemm ? 3 : o->cfg->warmup;
    if (o->steps < 0) o->steps = o->sgemm ? 10 : o->cfg->steps;
    return 0;
}

static void count_params(const bench_config *c, double *n_matmul, double *n_total)
{
    if (!c->llama) {
        gpt_count_params(c->vocab, c->block, c->n_layer, c->n_embd, n_matmul, n_total);
        return;
    }
    double C = (double)c->n_embd, V = (double)c->vocab, F = (double)c->inter;
    double kv = C / (double)c->n_head * (double)c->n_kv_head; /* n_kv_head * head_dim */
    double per_layer = 2 * C                                   /* the two RMSNorms */
                       + 2 * C * C + 2 * C * kv               /* q, o; k, v */
                       + 3 * C * F;                           /* gate, up, down */
    *n_matmul = (double)c->n_layer * per_layer + C + V * C;   /* layers, norm, lm_head */
    *n_total = *n_matmul + V * C;                              /* + embed_tokens */
}

static double step_flops(const bench_config *c)
{
    if (!c->llama) return gpt_step_flops(c->vocab, c->block, c->n_layer, c->n_embd, c->batch, c->seq);
    double n_matmul, n_total;
    count_params(c, &n_matmul, &n_total);
    return (double)(c->batch * c->seq) *
           (6 * n_matmul + 6 * (double)c->n_layer * (double)c->seq * (double)c->n_embd);
}

static void print_json(const char *impl, const options *o, double step_s, double gflops, double loss0, double params)
{
    const bench_config *c = o->cfg;
    double tokens = (double)(c->batch * c->seq);
    printf("{\"impl\":\"%s\",\"config\":\"%s\",\"threads\":%d,\"precision\":\"%s\",\"tokens_per_s\":%.2f,"
           "\"step_ms\":%.3f,\"gflops\":%.3f,\"peak_rss_mb\":%.1f,",
           impl, c->name, o->threads, o->fp8 ? "fp8" : ct_dtype_name(o->precision), tokens / step_s, 1e3 * step_s, gflops,
           peak_rss_mib());
    if (isfinite(loss0)) printf("\"loss0\":%.6f,", loss0);
    else printf("\"loss0\":null,");
    printf("\"steps\":%d,\"warmup\":%d,\"params\":%.0f}\n", o->steps, o->warmup, params);
    fflush(stdout);
}

/* ---- --sgemm: the GEMM ceiling ------------------------------------------------------ */

typedef struct gemm_shape {
    bool ta, tb; /* C(M,N) = op(A)(M,K) op(B)(K,N) */
    int64_t m, n, k;
    int count; /* calls per training step */
} gemm_shape;

/* The forward product Y(M,N) = X(M,K) W(K,N) of a Conv1D-layout linear and its two
 * backward products, n_layer times per step. */
static int add_linear(gemm_shape *s, int n, int64_t tok, int64_t in, int64_t out, int count)
{
    s[n++] = (gemm_shape){false, false, tok, out, in, count}; /* Y = X W        */
    s[n++] = (gemm_shape){false, true, tok, in, out, count};  /* dX = dY W^T    */
    s[n++] = (gemm_shape){true, false, in, out, tok, count};  /* dW = X^T dY    */
    return n;
}

static int run_sgemm(const options *o)
{
    const bench_config *c = o->cfg;
    int64_t tok = c->batch * c->seq, C = c->n_embd, V = c->vocab;
    int L = (int)c->n_layer;
    gemm_shape s[16];
    int ns = 0;
    ns = add_linear(s, ns, tok, C, 3 * C, L);
    ns = add_linear(s, ns, tok, C, C, L);
    ns = add_linear(s, ns, tok, C, 4 * C, L);
    ns = add_linear(s, ns, tok, 4 * C, C, L);
    /* tied head, wte (V, C): logits = X wte^T, dX = dlogits wte, dwte = dlogits^T X */
    s[ns++] = (gemm_shape){false, true, tok, V, C, 1};
    s[ns++] = (gemm_shape){false, false, tok, C, V, 1};
    s[ns++] = (gemm_shape){true, false, V, C, tok, 1};

    size_t maxa = 0, maxb = 0, maxc = 0;
    for (int i = 0; i < ns; i++) {
        size_t a = (size_t)(s[i].m * s[i].k), b = (size_t)(s[i].k * s[i].n), cc = (size_t)(s[i].m * s[i].n);
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = cc > maxc ? cc : maxc;
    }
    float *A = malloc(maxa * sizeof *A), *B = malloc(maxb * sizeof *B), *Cm = malloc(maxc * sizeof *Cm);
    double *times = malloc((size_t)o->steps * sizeof *times);
    if (!A || !B || !Cm || !times) {
        fprintf(stderr, PROG ": out of memory for the sgemm buffers (%zu + %zu + %zu floats)\n", maxa, maxb, maxc);
        free(A), free(B), free(Cm), free(times);
        return 2;
    }
    ct_rng rng;
    ct_rng_init(&rng, o->seed);
    ct_rng_uniform_f32(&rng, A, (int64_t)maxa, -1, 1);
    ct_rng_uniform_f32(&rng, B, (int64_t)maxb, -1, 1);
    memset(Cm, 0, maxc * sizeof *Cm);
    openblas_set_num_threads(o->threads);

    double flops = 0, secs = 0;
    for (int i = 0; i < ns; i++) {
        const gemm_shape *g = &s[i];
        int M = (int)g->m, N = (int)g->n, K = (int)g->k;
        int lda = g->ta ? M : K, ldb = g->tb ? K : N;
        for (int r = 0; r < o->warmup + o->steps; r++) {
            double t0 = now();
            cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, M, N,
                        K, 1.0f, A, lda, B, ldb, 0.0f, Cm, N);
            double dt = now() - t0;
            if (r >= o->warmup) times[r - o->warmup] = dt;
        }
        double t = median(times, o->steps);
        double f = 2.0 * (double)M * (double)N * (double)K;
        fprintf(stderr, PROG ": sgemm %c%c M=%d N=%d K=%d x%d per step: %.3f ms, %.1f GFLOP/s\n", g->ta ? 'T' : 'N',
                g->tb ? 'T' : 'N', M, N, K, g->count, 1e3 * t, 1e-9 * f / t);
        flops += g->count * f;
        secs += g->count * t;
    }
    double ceiling = flops / secs, step_s = step_flops(c) / ceiling;
    double n_matmul, n_total;
    count_params(c, &n_matmul, &n_total);
    print_json("sgemm", o, step_s, 1e-9 * ceiling, NAN, n_total);
    free(A), free(B), free(Cm), free(times);
    return 0;
}

/* ---- ctrain training step ---------------------------------------------------------- */

static int run_ctrain(const options *o)
{
    const bench_config *c = o->cfg;
    int64_t B = c->batch, T = c->seq, shape[2] = {B, T};
    int total = o->warmup + o->steps, status = 2;
    ct_set_num_threads(o->threads);
    ct_set_seed(o->seed);
    ct_rng rng;
    ct_rng_init(&rng, o->seed ^ 0x70c3e5ULL);

    ct_gpt *model = NULL;
    ct_llama *llama = NULL;
    ct_module *mod = NULL;
    ct_optimizer *opt = NULL;
    ct_fp8_state *fp8 = NULL;
    ct_param_list params = {0};
    bool have_params = false;
    uint32_t *raw = malloc((size_t)(B * (T + 1)) * sizeof *raw);
    int64_t *xb = malloc((size_t)(B * T) * sizeof *xb), *yb = malloc((size_t)(B * T) * sizeof *yb);
    double *times = malloc((size_t)o->steps * sizeof *times);
    if (!raw || !xb || !yb || !times) {
        fprintf(stderr, PROG ": out of memory for the token buffers\n");
        goto out;
    }
    if (c->llama) {
        llama = ct_llama_new(&(ct_llama_config){.vocab_size = c->vocab, .hidden_size = c->n_embd,
                                                .intermediate_size = c->inter, .num_hidden_layers = c->n_layer,
                                                .num_attention_heads = c->n_head, .num_key_value_heads = c->n_kv_head,
                                                .max_position_embeddings = c->block});
        mod = llama ? &llama->base : NULL;
    } else {
        model = ct_gpt_new(&(ct_gpt_config){.vocab_size = c->vocab, .block_size = c->block, .n_layer = c->n_layer,
                                            .n_head = c->n_head, .n_embd = c->n_embd, .dropout = 0.0, .ln_eps = 1e-5});
        mod = model ? &model->base : NULL;
    }
    if (!mod) {
        fprintf(stderr, PROG ": %s (config %s): %s\n", c->llama ? "ct_llama_new" : "ct_gpt_new", c->name,
                ct_last_error());
        goto out;
    }
    if (ct_module_named_tensors(mod, false, &params)) {
        fprintf(stderr, PROG ": ct_module_named_tensors: %s\n", ct_last_error());
        goto out;
    }
    have_params = true;
    opt = make_optimizer(&params);
    if (!opt) {
        fprintf(stderr, PROG ": AdamW: %s\n", ct_last_error());
        goto out;
    }
    if (o->fp8 && !(fp8 = ct_fp8_state_new(NULL))) {
        fprintf(stderr, PROG ": fp8 state: %s\n", ct_last_error());
        goto out;
    }
    double loss0 = NAN;
    for (int step = 0; step < total; step++) {
        draw_batch(&rng, c->batch, c->seq, c->vocab, raw, xb, yb);
        const char *failed = NULL;
        double loss_v = NAN, t0 = now();
        CT_FRAME {
            ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, 2, shape, xb);
            ct_tensor *y = ct_tensor_from_data(CT_DTYPE_I64, 2, shape, yb);
            ct_tensor *loss = NULL;
            if (x && y && fp8) {
                if (!ct_autocast_begin_fp8(fp8)) {
                    loss = ct_gpt_loss(model, x, y);
                    ct_autocast_end();
                }
            } else if (x && y && o->precision != CT_DTYPE_F32) {
                CT_AUTOCAST(o->precision) loss = llama ? ct_llama_loss(llama, x, y) : ct_gpt_loss(model, x, y);
            } else if (x && y) {
                loss = llama ? ct_llama_loss(llama, x, y) : ct_gpt_loss(model, x, y);
            }
            if (!loss) {
                failed = x && y ? "forward/loss" : "token tensors";
            } else if (ct_backward(loss)) {
                failed = "ct_backward";
            } else {
                loss_v = ct_tensor_item(loss);
                ct_error_clear(); /* NaN + no error = NaN gradients, caught by the loss check */
                double norm = ct_clip_grad_norm(params.n, params.tensors, 1.0, 2.0);
                if (isnan(norm) && ct_last_status() != CT_OK) failed = "ct_clip_grad_norm";
                else if (ct_optimizer_step(opt)) failed = "ct_optimizer_step";
                if (fp8) ct_fp8_state_step(fp8); /* the next step's scales */
                ct_optimizer_zero_grad(opt);
            }
        }
        double dt = now() - t0;
        if (failed) {
            fprintf(stderr, PROG ": step %d: %s failed: %s\n", step, failed, ct_last_error());
            goto out;
        }
        if (!isfinite(loss_v)) {
            fprintf(stderr, PROG ": step %d: loss is %g (not finite)\n", step, loss_v);
            goto out;
        }
        if (step == 0) loss0 = loss_v;
        if (step >= o->warmup) times[step - o->warmup] = dt;
    }
    double step_s = median(times, o->steps);
    print_json("ctrain", o, step_s, 1e-9 * step_flops(c) / step_s, loss0, (double)ct_module_num_params(mod));
    status = 0;
out:
    if (have_params) ct_param_list_free(&params);
    ct_optimizer_free(opt);
    ct_fp8_state_free(fp8);
    ct_module_free(mod);
    ct_frame_reset_root();
    free(raw), free(xb), free(yb), free(times);
    return status;
}

int main(int argc, char **argv)
{
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    return o.sgemm ? run_sgemm(&o) : run_ctrain(&o);
}
