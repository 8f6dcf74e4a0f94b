/* A GPT (nn/gpt.h) or a Llama (nn/llama.h) trained through the Accelerator for
 * benchmarking: the model (seeded, so every rank starts from the same weights),
 * GPT-2's AdamW, random token batches, prepare, and one step timed from the forward to
 * the end of zero_grad. bench_gpt_init and bench_llama_init build one or the other;
 * everything after is the same code.
 *
 * Header-only: `ctrain bench`'s rank side (tools/bench_rank.c) and the bench programs
 * (bench/gpt_accel.h, bench/gpt_cpu/gpt_step.h), which are built from one source file
 * each, share this one copy. Failures return a ct_status and record a message naming
 * the rank and what failed (ct_last_error); nothing here prints.
 */
#ifndef CT_TOOLS_BENCH_GPT_H
#define CT_TOOLS_BENCH_GPT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "ctrain.h"

/* Seconds on the monotonic clock. */
static inline double bench_gpt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Peak resident memory of this process in bytes (ru_maxrss; Linux counts KiB). */
static inline double bench_gpt_peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru)) return NAN;
    return (double)ru.ru_maxrss * 1024.0;
}

/* AdamW as in GPT-2 training (and examples/gpt/train.c): lr 1e-4, betas 0.9/0.95,
 * weight decay 0.1 on the 2-D tensors, none on biases and LayerNorm weights. New
 * optimizer owned by the caller, or NULL + error. */
static inline ct_optimizer *bench_gpt_adamw(const ct_param_list *l)
{
    ct_tensor **decay = malloc((size_t)l->n * sizeof *decay), **nodecay = malloc((size_t)l->n * sizeof *nodecay);
    if (!decay || !nodecay) {
        free(decay), free(nodecay);
        ct_error_set(CT_ERR_NOMEM, "AdamW: out of memory for %d parameters", l->n);
        return NULL;
    }
    int nd = 0, nn = 0;
    for (int i = 0; i < l->n; i++) {
        if (l->tensors[i]->ndim >= 2) decay[nd++] = l->tensors[i];
        else nodecay[nn++] = l->tensors[i];
    }
    ct_adamw_config cfg = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    ct_optimizer *opt = ct_adamw_new(nd, decay, &cfg);
    if (opt && ct_optimizer_add_group(opt, nn, nodecay, &(ct_param_group_config){.no_weight_decay = true})) {
        ct_optimizer_free(opt);
        opt = NULL;
    }
    free(decay);
    free(nodecay);
    return opt;
}

/* One (B, T+1) window of random tokens below vocab -> x = [:, :T], y = [:, 1:]
 * (raw holds B * (T + 1) words). */
static inline void bench_gpt_draw_batch(ct_rng *rng, int64_t B, int64_t T, int64_t vocab, uint32_t *raw, int64_t *x,
                                        int64_t *y)
{
    ct_rng_u32(rng, raw, B * (T + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            /* modulo bias < V / 2^32: irrelevant for timing */
            x[b * T + t] = raw[b * (T + 1) + t] % (uint32_t)vocab;
            y[b * T + t] = raw[b * (T + 1) + t + 1] % (uint32_t)vocab;
        }
}

/* The token stream of rank `rank` (what bench_gpt_begin seeds): a layout whose
 * replica stands for several ranks draws their streams one after the other. */
static inline void bench_gpt_rank_rng(ct_rng *rng, uint64_t seed, int rank)
{
    ct_rng_init(rng, (seed ^ 0x70c3e5ULL) + 0x9e3779b97f4a7c15ULL * (uint64_t)rank);
}

typedef struct bench_gpt {
    ct_accelerator *acc; /* owned: freed first by bench_gpt_free */
    ct_gpt *model;       /* the GPT, or NULL for a Llama */
    ct_llama *llama;     /* the Llama, or NULL for a GPT */
    ct_optimizer *opt;
    ct_param_list params;
    bool have_params;
    int64_t B, T, vocab;
    uint32_t *raw;
    int64_t *xb, *yb;
    ct_rng rng;
    int rank;
} bench_gpt;

/* The model being trained (NULL before init). */
static inline ct_module *bench_gpt_module(const bench_gpt *g)
{
    return g->llama ? &g->llama->base : g->model ? &g->model->base : NULL;
}

/* What both inits do before the model: takes acc, seeds the weights' generator and
 * this rank's token stream, allocates the token buffers. */
static inline ct_status bench_gpt_begin(bench_gpt *g, ct_accelerator *acc, int64_t vocab, int64_t B, int64_t T,
                                        uint64_t seed)
{
    *g = (bench_gpt){.acc = acc, .B = B, .T = T, .vocab = vocab, .rank = ct_accelerator_process_index(acc)};
    ct_set_seed(seed); /* the same weights on every rank; prepare broadcasts rank 0's anyway */
    bench_gpt_rank_rng(&g->rng, seed, g->rank);
    g->raw = malloc((size_t)(B * (T + 1)) * sizeof *g->raw);
    g->xb = malloc((size_t)(B * T) * sizeof *g->xb);
    g->yb = malloc((size_t)(B * T) * sizeof *g->yb);
    if (!g->raw || !g->xb || !g->yb)
        return ct_error_set(CT_ERR_NOMEM, "rank %d: out of memory for the token buffers (%lld x %lld)", g->rank,
                            (long long)B, (long long)T);
    return CT_OK;
}

/* What both inits do after the model: the optimizer over its parameters, prepare. */
static inline ct_status bench_gpt_prepare(bench_gpt *g)
{
    if (ct_module_named_tensors(bench_gpt_module(g), false, &g->params))
        return ct_error_prefix("rank %d: ct_module_named_tensors: ", g->rank);
    g->have_params = true;
    if (!(g->opt = bench_gpt_adamw(&g->params))) return ct_error_prefix("rank %d: ", g->rank);
    if (ct_accelerator_prepare(g->acc, bench_gpt_module(g), g->opt, NULL, NULL))
        return ct_error_prefix("rank %d: ct_accelerator_prepare: ", g->rank);
    return CT_OK;
}

/* Takes acc; builds the GPT of cfg (block size T, or cfg's when larger: a position
 * table kept whole, as GPT-2's 1024; dropout 0), the optimizer and this rank's token
 * stream (seeded with seed and the rank, so the same whatever the strategy), and
 * prepares them. CT_OK, or an error naming the rank. bench_gpt_free in either case. */
static inline ct_status bench_gpt_init(bench_gpt *g, ct_accelerator *acc, const ct_gpt_config *cfg, int64_t B,
                                       int64_t T, uint64_t seed)
{
    if (bench_gpt_begin(g, acc, cfg->vocab_size, B, T, seed)) return ct_last_status();
    ct_gpt_config c = *cfg;
    c.block_size = cfg->block_size > T ? cfg->block_size : T, c.dropout = 0.0, c.ln_eps = 1e-5;
    if (!(g->model = ct_gpt_new(&c))) return ct_error_prefix("rank %d: ct_gpt_new: ", g->rank);
    return bench_gpt_prepare(g);
}

/* The same for the Llama of cfg (f32; positions past max_position_embeddings are
 * computed as any others: T is not limited by it). */
static inline ct_status bench_llama_init(bench_gpt *g, ct_accelerator *acc, const ct_llama_config *cfg, int64_t B,
                                         int64_t T, uint64_t seed)
{
    ct_llama_config c = *cfg;
    c.dtype = CT_DTYPE_F32;
    if (bench_gpt_begin(g, acc, cfg->vocab_size, B, T, seed)) return ct_last_status();
    if (!(g->llama = ct_llama_new(&c))) return ct_error_prefix("rank %d: ct_llama_new: ", g->rank);
    return bench_gpt_prepare(g);
}

/* Draws the next batch, then times forward + loss, ct_accelerator_backward,
 * ct_accelerator_clip_grad_norm(clip, 2) when clip > 0, the step and zero_grad: *loss
 * is this rank's (NAN when the step failed), *dt the seconds. CT_OK, or an error naming the rank, the step and
 * what failed (a non-finite loss included). */
static inline ct_status bench_gpt_step_drawn(bench_gpt *g, int step, double clip, double *loss, double *dt);

static inline ct_status bench_gpt_step(bench_gpt *g, int step, double clip, double *loss, double *dt)
{
    bench_gpt_draw_batch(&g->rng, g->B, g->T, g->vocab, g->raw, g->xb, g->yb);
    return bench_gpt_step_drawn(g, step, clip, loss, dt);
}

/* bench_gpt_step on the batch already in g->xb, g->yb (a caller that draws its own). */
static inline ct_status bench_gpt_step_drawn(bench_gpt *g, int step, double clip, double *loss, double *dt)
{
    const int64_t shape[2] = {g->B, g->T};
    const char *failed = NULL;
    double loss_v = NAN, t0 = bench_gpt_now();
    CT_FRAME {
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, 2, shape, g->xb);
        ct_tensor *y = ct_tensor_from_data(CT_DTYPE_I64, 2, shape, g->yb);
        CT_ACCUMULATE(g->acc) {
            ct_tensor *l = !x || !y ? NULL : g->llama ? ct_llama_loss(g->llama, x, y) : ct_gpt_loss(g->model, x, y);
            if (!l) {
                failed = x && y ? "forward/loss" : "token tensors";
            } else if (ct_accelerator_backward(g->acc, l)) {
                failed = "ct_accelerator_backward";
            } else {
                loss_v = ct_tensor_item(l);
                if (clip > 0 && isnan(ct_accelerator_clip_grad_norm(g->acc, clip, 2.0)) && ct_last_status() != CT_OK)
                    failed = "ct_accelerator_clip_grad_norm";
                else if (ct_optimizer_step(g->opt)) failed = "ct_optimizer_step";
                ct_optimizer_zero_grad(g->opt);
            }
        }
    }
    *dt = bench_gpt_now() - t0;
    *loss = loss_v; /* NAN when the step failed */
    if (failed) return ct_error_prefix("rank %d: step %d: %s failed: ", g->rank, step, failed);
    if (!isfinite(loss_v))
        return ct_error_set(CT_ERR_INVALID, "rank %d: step %d: loss is %g (not finite)", g->rank, step, loss_v);
    return CT_OK;
}

static inline void bench_gpt_free(bench_gpt *g)
{
    ct_accelerator_free(g->acc); /* first: it unhooks the optimizer and gives the model its parameters back */
    if (g->have_params) ct_param_list_free(&g->params);
    ct_optimizer_free(g->opt);
    ct_module_free(bench_gpt_module(g));
    free(g->raw), free(g->xb), free(g->yb);
    *g = (bench_gpt){0};
}

#endif
