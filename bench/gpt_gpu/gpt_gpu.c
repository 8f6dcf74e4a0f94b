/* GPT-2 training throughput on one GPU, and each kernel's achieved rate against the
 * device's peak: the ctrain side of bench/gpt_gpu/run.sh (PyTorch's side is
 * bench/gpt_cpu/torch_gpt.py --device cuda).
 *
 *   gpt_gpu [--batch 16] [--seq 1024] [--steps 10] [--warmup 3] [--precision bf16|f32]
 *   gpt_gpu --kernels
 *
 * Training: GPT-2 124M (12 layers, 12 heads, width 768, vocab 50257, block 1024) on
 * cuda:0 (ct_module_to), the forward and loss under autocast, clip_grad_norm(1.0),
 * AdamW (gpt_step.h), on fresh random tokens each step. A step is timed from the
 * forward to the end of zero_grad with the device synchronised at both ends; the
 * median of the timed steps is reported with tokens/s and MFU = achieved FLOP/s
 * (gpt_step_flops) / the device's dense 16-bit tensor-core peak.
 *
 * --kernels: each op family on the shapes of that model, timed with CUDA events over
 * 20 runs after 3 warm-ups: matmuls in TFLOP/s, memory-bound kernels in GB/s (bytes
 * read + written once), each beside the device's peak (tensor-core FLOP/s from the
 * compute capability and SM clock; bandwidth from the memory clock and bus width).
 *
 * Output: JSON lines on stdout. Exit 2 on any failure (message on stderr), 3 when no
 * GPU can be used (the reason on stderr). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpt_cpu/gpt_step.h"
#include "bench/timing.h"
#include "ctrain.h"

#define PROG "gpt_gpu"
#include "bench/args.h"

typedef struct options {
    int64_t batch, seq;
    int steps, warmup;
    ct_dtype precision;
    bool kernels;
} options;

static const int64_t VOCAB = 50257, BLOCK = 1024, LAYERS = 12, HEADS = 12, WIDTH = 768;

/* Dense 16-bit tensor-core FLOP/s per SM per clock, by architecture: A100 (8.0)
 * 1024 FMA x 2, H100/H200 (9.0) 2048 x 2, B200 (10.0) 4096 x 2; 0 when unknown. */
static double tensor_peak(const ct_cuda_device_props *p)
{
    double per_sm_clk = p->major == 8 && p->minor == 0 ? 2048 : p->major == 9 ? 4096 : p->major == 10 ? 8192 : 0;
    return per_sm_clk * p->multiprocessors * p->clock_khz * 1e3;
}

/* DRAM bytes/s: two transfers per memory clock (DDR) across the bus. */
static double bandwidth_peak(const ct_cuda_device_props *p)
{
    return 2.0 * p->memory_clock_khz * 1e3 * p->memory_bus_width / 8.0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--batch B] [--seq T] [--steps S] [--warmup W] [--precision bf16|f32] | --kernels\n");
}

static int parse(int argc, char **argv, options *o)
{
    *o = (options){.batch = 16, .seq = 1024, .steps = 10, .warmup = 3, .precision = CT_DTYPE_BF16};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        if (!strcmp(a, "--kernels")) o->kernels = true;
        else if (!strcmp(a, "--batch") && v) {
            if (!parse_int(a, argv[++i], 1, 4096, &n)) return -1;
            o->batch = n;
        } else if (!strcmp(a, "--seq") && v) {
            if (!parse_int(a, argv[++i], 1, BLOCK, &n)) return -1;
            o->seq = n;
        } else if (!strcmp(a, "--steps") && v) {
            if (!parse_int(a, argv[++i], 1, 100000, &n)) return -1;
            o->steps = (int)n;
        } else if (!strcmp(a, "--warmup") && v) {
            if (!parse_int(a, argv[++i], 0, 100000, &n)) return -1;
            o->warmup = (int)n;
        } else if (!strcmp(a, "--precision") && v) {
            const char *p = argv[++i];
            if (!strcmp(p, "bf16")) o->precision = CT_DTYPE_BF16;
            else if (!strcmp(p, "f32")) o->precision = CT_DTYPE_F32;
            else return usage(stderr), -1;
        } else if (!strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else {
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

/* ---- training ------------------------------------------------------------------ */

static int run_training(const options *o, const ct_cuda_device_props *props)
{
    const int64_t B = o->batch, T = o->seq, shape[2] = {B, T};
    int status = 2, total = o->warmup + o->steps;
    ct_set_seed(1337);
    ct_rng rng;
    ct_rng_init(&rng, 1337 ^ 0x70c3e5ULL);
    ct_param_list params = {0};
    ct_optimizer *opt = NULL;
    uint32_t *raw = malloc((size_t)(B * (T + 1)) * sizeof *raw);
    int64_t *xb = malloc((size_t)(B * T) * sizeof *xb), *yb = malloc((size_t)(B * T) * sizeof *yb);
    double *times = malloc((size_t)o->steps * sizeof *times);
    ct_gpt *model = ct_gpt_new(&(ct_gpt_config){.vocab_size = VOCAB, .block_size = BLOCK, .n_layer = LAYERS,
                                                .n_head = HEADS, .n_embd = WIDTH, .dropout = 0.0, .ln_eps = 1e-5});
    if (!raw || !xb || !yb || !times || !model || ct_module_to(&model->base, CT_CUDA(0)) ||
        ct_module_named_tensors(&model->base, false, &params) || !(opt = make_optimizer(&params))) {
        fprintf(stderr, PROG ": setup: %s\n", ct_last_error());
        goto out;
    }
    double loss0 = NAN;
    for (int step = 0; step < total; step++) {
        draw_batch(&rng, B, T, VOCAB, raw, xb, yb);
        const char *failed = NULL;
        double loss_v = NAN, dt = 0;
        CT_FRAME {
            ct_tensor *x = ct_tensor_to(ct_tensor_from_data(CT_DTYPE_I64, 2, shape, xb), CT_CUDA(0));
            ct_tensor *y = ct_tensor_to(ct_tensor_from_data(CT_DTYPE_I64, 2, shape, yb), CT_CUDA(0));
            if (ct_cuda_synchronize(0)) failed = "synchronize";
            double t0 = now();
            ct_tensor *loss = NULL;
            if (!failed && x && y) {
                if (o->precision != CT_DTYPE_F32) {
                    CT_AUTOCAST(o->precision) loss = ct_gpt_loss(model, x, y);
                } else {
                    loss = ct_gpt_loss(model, x, y);
                }
            }
            if (failed) {
            } else if (!loss) {
                failed = "forward/loss";
            } else if (ct_backward(loss)) {
                failed = "backward";
            } else {
                ct_error_clear();
                double norm = ct_clip_grad_norm(params.n, params.tensors, 1.0, 2.0);
                if (isnan(norm) && ct_last_status() != CT_OK) failed = "clip_grad_norm";
                else if (ct_optimizer_step(opt)) failed = "optimizer step";
                ct_optimizer_zero_grad(opt);
                if (!failed && ct_cuda_synchronize(0)) failed = "synchronize";
            }
            dt = now() - t0;
            if (!failed) loss_v = ct_tensor_item(loss);
        }
        if (failed) {
            fprintf(stderr, PROG ": step %d: %s failed: %s\n", step, failed, ct_last_error());
            goto out;
        }
        if (!isfinite(loss_v)) {
            fprintf(stderr, PROG ": step %d: loss %g is not finite\n", step, loss_v);
            goto out;
        }
        if (step == 0) loss0 = loss_v;
        if (step >= o->warmup) times[step - o->warmup] = dt;
    }
    double step_s = median(times, o->steps), flops = gpt_step_flops(VOCAB, BLOCK, LAYERS, WIDTH, B, T) / step_s;
    double peak = tensor_peak(props);
    ct_cuda_memory_stats ms;
    ct_cuda_memory_stats_get(0, &ms);
    printf("{\"impl\":\"ctrain\",\"gpu\":\"%s\",\"precision\":\"%s\",\"batch\":%lld,\"seq\":%lld,"
           "\"tokens_per_s\":%.1f,\"step_ms\":%.2f,\"tflops\":%.2f,\"mfu\":%s%.4f,\"loss0\":%.5f,"
           "\"peak_allocated_gib\":%.2f,\"peak_reserved_gib\":%.2f}\n",
           props->name, ct_dtype_name(o->precision), (long long)B, (long long)T, (double)(B * T) / step_s,
           1e3 * step_s, flops * 1e-12, peak > 0 ? "" : "null,\"mfu_unknown\":", peak > 0 ? flops / peak : 0, loss0,
           ms.peak_allocated / 1073741824.0, ms.peak_reserved / 1073741824.0);
    status = 0;
out:
    ct_param_list_free(&params);
    ct_optimizer_free(opt);
    ct_module_free(model ? &model->base : NULL);
    ct_frame_reset_root();
    free(raw), free(xb), free(yb), free(times);
    return status;
}

/* ---- kernels --------------------------------------------------------------------- */

typedef enum bound { FLOPS, BYTES } bound;

/* Times fn(ctx) with events: the median of 20 runs after 3 warm-ups, in seconds. */
static double time_op(ct_status (*fn)(void *), void *ctx)
{
    ct_cuda_event *a = ct_cuda_event_new(0, true), *b = ct_cuda_event_new(0, true);
    double t[20];
    int ok = a && b;
    for (int i = 0; ok && i < 23; i++) {
        CT_FRAME {
            ok = ct_cuda_event_record(a, NULL) == CT_OK && fn(ctx) == CT_OK && ct_cuda_event_record(b, NULL) == CT_OK &&
                 ct_cuda_event_synchronize(b) == CT_OK;
        }
        float ms = 0;
        if (ok && i >= 3) {
            ok = ct_cuda_event_elapsed(a, b, &ms) == CT_OK;
            t[i - 3] = ms * 1e-3;
        }
    }
    ct_cuda_event_free(a);
    ct_cuda_event_free(b);
    return ok ? median(t, 20) : NAN;
}

typedef struct kctx {
    ct_tensor *a, *b, *c, *d, *e;
    ct_optimizer *opt;
} kctx;

static ct_status k_matmul(void *p)
{
    kctx *k = p;
    return ct_kernel_matmul(k->a, k->b, false, true) ? CT_OK : ct_last_status();
}
static ct_status k_add(void *p)
{
    kctx *k = p;
    return ct_kernel_binary(CT_BINARY_ADD, k->a, k->b) ? CT_OK : ct_last_status();
}
static ct_status k_softmax(void *p)
{
    kctx *k = p;
    return ct_kernel_softmax(k->a, -1) ? CT_OK : ct_last_status();
}
static ct_status k_layernorm(void *p)
{
    kctx *k = p;
    return ct_layernorm(k->a, k->b, k->c, 1e-5) ? CT_OK : ct_last_status();
}
static ct_status k_cross_entropy(void *p)
{
    kctx *k = p;
    return ct_cross_entropy(k->a, k->b, -100) ? CT_OK : ct_last_status();
}
static ct_status k_attention(void *p)
{
    kctx *k = p;
    return ct_attention(k->a, k->b, k->c, true, 0.125) ? CT_OK : ct_last_status();
}
static ct_status k_adamw(void *p)
{
    kctx *k = p;
    return ct_optimizer_step(k->opt);
}

static void report(const char *name, const char *shape, double s, double work, bound kind, double peak)
{
    double rate = work / s;
    printf("{\"kernel\":\"%s\",\"shape\":\"%s\",\"ms\":%.4f,\"%s\":%.2f,\"peak\":%.2f,\"fraction\":%.3f}\n", name, shape,
           s * 1e3, kind == FLOPS ? "tflops" : "gbps", kind == FLOPS ? rate * 1e-12 : rate * 1e-9,
           kind == FLOPS ? peak * 1e-12 : peak * 1e-9, peak > 0 ? rate / peak : 0);
    fflush(stdout);
}

static ct_tensor *dev_rand(ct_dtype dt, int ndim, const int64_t *shape, double lo, double hi)
{
    ct_tensor *h = ct_tensor_rand(CT_DTYPE_F32, ndim, shape, lo, hi);
    if (h && dt != CT_DTYPE_F32) h = ct_tensor_cast(h, dt);
    return ct_tensor_to(h, CT_CUDA(0));
}

static int run_kernels(const ct_cuda_device_props *props)
{
    const double fpeak = tensor_peak(props), bpeak = bandwidth_peak(props);
    const int64_t M = 16 * 1024, C = WIDTH;
    int status = 0;
    ct_set_seed(7);
    CT_FRAME {
        kctx k = {0};
        double s;
        /* the MLP's up projection: (B*T, C) @ (4C, C)^T */
        k.a = dev_rand(CT_DTYPE_BF16, 2, (int64_t[]){M, C}, -1, 1);
        k.b = dev_rand(CT_DTYPE_BF16, 2, (int64_t[]){4 * C, C}, -1, 1);
        s = time_op(k_matmul, &k);
        if (isnan(s)) goto fail;
        report("matmul bf16", "16384x768 @ 3072x768^T", s, 2.0 * M * C * 4 * C, FLOPS, fpeak);
        /* the lm head: (B*T, C) @ (V, C)^T */
        k.b = dev_rand(CT_DTYPE_BF16, 2, (int64_t[]){VOCAB, C}, -1, 1);
        s = time_op(k_matmul, &k);
        if (isnan(s)) goto fail;
        report("matmul bf16", "16384x768 @ 50257x768^T", s, 2.0 * M * C * VOCAB, FLOPS, fpeak);
        /* elementwise f32 residual add: read 2, write 1 */
        k.a = dev_rand(CT_DTYPE_F32, 2, (int64_t[]){M, C}, -1, 1);
        k.b = dev_rand(CT_DTYPE_F32, 2, (int64_t[]){M, C}, -1, 1);
        s = time_op(k_add, &k);
        if (isnan(s)) goto fail;
        report("add f32", "16384x768", s, 3.0 * 4 * M * C, BYTES, bpeak);
        /* layernorm f32 forward: read x, write y (+ the small stats) */
        k.b = dev_rand(CT_DTYPE_F32, 1, (int64_t[]){C}, 0.5, 1.5);
        k.c = dev_rand(CT_DTYPE_F32, 1, (int64_t[]){C}, -0.1, 0.1);
        s = time_op(k_layernorm, &k);
        if (isnan(s)) goto fail;
        report("layernorm f32", "16384x768", s, 2.0 * 4 * M * C, BYTES, bpeak);
        /* softmax over the vocabulary rows of 1024 tokens */
        k.a = dev_rand(CT_DTYPE_F32, 2, (int64_t[]){1024, VOCAB}, -4, 4);
        s = time_op(k_softmax, &k);
        if (isnan(s)) goto fail;
        report("softmax f32", "1024x50257", s, 2.0 * 4 * 1024 * VOCAB, BYTES, bpeak);
        /* fused cross-entropy: read the logits once */
        int64_t *tg = malloc(1024 * sizeof *tg);
        for (int i = 0; tg && i < 1024; i++) tg[i] = (i * 7919) % VOCAB;
        k.b = tg ? ct_tensor_to(ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1024), tg), CT_CUDA(0)) : NULL;
        free(tg);
        s = time_op(k_cross_entropy, &k);
        if (isnan(s)) goto fail;
        report("cross_entropy f32", "1024x50257", s, 4.0 * 1024 * VOCAB, BYTES, bpeak);
        /* causal attention forward, bf16: 4 B H T^2 D / 2 (the causal half) */
        int64_t ash[4] = {16, HEADS, 1024, 64};
        k.a = dev_rand(CT_DTYPE_BF16, 4, ash, -1, 1);
        k.b = dev_rand(CT_DTYPE_BF16, 4, ash, -1, 1);
        k.c = dev_rand(CT_DTYPE_BF16, 4, ash, -1, 1);
        s = time_op(k_attention, &k);
        if (isnan(s)) goto fail;
        report("attention fwd bf16", "16x12x1024x64 causal", s, 4.0 * 16 * HEADS * 1024.0 * 1024 * 64 / 2, FLOPS, fpeak);
        /* AdamW over 124M f32 parameters: read p, g, m, v; write p, m, v */
        int64_t np = 124 * 1000 * 1000;
        ct_tensor *p = ct_keep(ct_tensor_zeros_like(dev_rand(CT_DTYPE_F32, 1, &np, 0, 1)));
        if (p) {
            p->requires_grad = true;
            p->grad = ct_tensor_retain(dev_rand(CT_DTYPE_F32, 1, &np, -1, 1));
            k.opt = ct_adamw_new(1, &p, &(ct_adamw_config){.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                                            .weight_decay = 0.1});
        }
        s = k.opt ? time_op(k_adamw, &k) : NAN;
        ct_optimizer_free(k.opt);
        ct_tensor_release(p);
        if (isnan(s)) goto fail;
        report("adamw f32", "124M parameters", s, 7.0 * 4 * np, BYTES, bpeak);
        if (0) {
        fail:
            fprintf(stderr, PROG ": --kernels: %s\n", ct_last_error());
            status = 2;
        }
    }
    ct_frame_reset_root();
    return status;
}

int main(int argc, char **argv)
{
    options o;
    int pr = parse(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    if (!ct_cuda_is_available()) {
        fprintf(stderr, PROG ": no GPU: %s\n", ct_cuda_unavailable_reason());
        return 3;
    }
    ct_cuda_device_props props;
    if (ct_cuda_device_props_get(0, &props)) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        return 2;
    }
    return o.kernels ? run_kernels(&props) : run_training(&o, &props);
}
