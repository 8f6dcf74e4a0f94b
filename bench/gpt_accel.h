/* ctrain benchmarks — a GPT trained through the Accelerator, what the distributed
 * benchmarks share (bench/ddp/gpt_ddp.c, bench/strategies/strategies.c): the model
 * (seeded, so every rank starts from the same weights), gpt_step.h's AdamW, prepare, the
 * token buffers, and one step timed from the forward to the end of zero_grad. PROG must
 * be defined first (messages name the program). */
#ifndef CT_BENCH_GPT_ACCEL_H
#define CT_BENCH_GPT_ACCEL_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/gpt_cpu/gpt_step.h"
#include "bench/timing.h"
#include "ctrain.h"

typedef struct accel_gpt {
    ct_accelerator *acc; /* owned: freed first by accel_gpt_free */
    ct_gpt *model;
    ct_optimizer *opt;
    ct_param_list params;
    bool have_params;
    int64_t B, T, vocab;
    uint32_t *raw;
    int64_t *xb, *yb;
    ct_rng rng;
    int rank;
} accel_gpt;

/* Takes acc; builds the model of cfg (block size T, or cfg's when larger: a position
 * table kept whole, as GPT-2's 1024), the optimizer and this rank's token
 * stream (rank 0's is gpt_cpu.c's for the same seed), and prepares them. 0, or 2 after
 * printing what failed. accel_gpt_free in either case. */
static inline int accel_gpt_init(accel_gpt *g, ct_accelerator *acc, const ct_gpt_config *cfg, int64_t B, int64_t T,
                                 uint64_t seed)
{
    *g = (accel_gpt){.acc = acc, .B = B, .T = T, .vocab = cfg->vocab_size, .rank = ct_accelerator_process_index(acc)};
    ct_set_seed(seed); /* the same weights on every rank; prepare broadcasts rank 0's anyway */
    ct_rng_init(&g->rng, (seed ^ 0x70c3e5ULL) + 0x9e3779b97f4a7c15ULL * (uint64_t)g->rank);
    g->raw = malloc((size_t)(B * (T + 1)) * sizeof *g->raw);
    g->xb = malloc((size_t)(B * T) * sizeof *g->xb);
    g->yb = malloc((size_t)(B * T) * sizeof *g->yb);
    if (!g->raw || !g->xb || !g->yb) {
        fprintf(stderr, PROG " (rank %d): out of memory for the token buffers\n", g->rank);
        return 2;
    }
    ct_gpt_config c = *cfg;
    c.block_size = cfg->block_size > T ? cfg->block_size : T, c.dropout = 0.0, c.ln_eps = 1e-5;
    if (!(g->model = ct_gpt_new(&c))) {
        fprintf(stderr, PROG " (rank %d): ct_gpt_new: %s\n", g->rank, ct_last_error());
        return 2;
    }
    if (ct_module_named_tensors(&g->model->base, false, &g->params)) {
        fprintf(stderr, PROG " (rank %d): ct_module_named_tensors: %s\n", g->rank, ct_last_error());
        return 2;
    }
    g->have_params = true;
    g->opt = make_optimizer(&g->params);
    if (!g->opt || ct_accelerator_prepare(acc, &g->model->base, g->opt, NULL, NULL)) {
        fprintf(stderr, PROG " (rank %d): %s: %s\n", g->rank, g->opt ? "ct_accelerator_prepare" : "AdamW",
                ct_last_error());
        return 2;
    }
    return 0;
}

/* Draws the next batch, then times forward + loss, ct_accelerator_backward,
 * ct_accelerator_clip_grad_norm(clip, 2) when clip > 0, the step and zero_grad: *loss
 * is this rank's, *dt the seconds. 0, or 2 after printing what failed (a non-finite
 * loss included). */
static inline int accel_gpt_step(accel_gpt *g, int step, double clip, double *loss, double *dt)
{
    const int64_t shape[2] = {g->B, g->T};
    draw_batch(&g->rng, g->B, g->T, g->vocab, g->raw, g->xb, g->yb);
    const char *failed = NULL;
    double loss_v = NAN, t0 = now();
    CT_FRAME {
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, 2, shape, g->xb);
        ct_tensor *y = ct_tensor_from_data(CT_DTYPE_I64, 2, shape, g->yb);
        CT_ACCUMULATE(g->acc) {
            ct_tensor *l = x && y ? ct_gpt_loss(g->model, x, y) : NULL;
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
    *dt = now() - t0;
    if (failed) {
        fprintf(stderr, PROG " (rank %d): step %d: %s failed: %s\n", g->rank, step, failed, ct_last_error());
        return 2;
    }
    if (!isfinite(loss_v)) {
        fprintf(stderr, PROG " (rank %d): step %d: loss is %g (not finite)\n", g->rank, step, loss_v);
        return 2;
    }
    *loss = loss_v;
    return 0;
}

static inline void accel_gpt_free(accel_gpt *g)
{
    ct_accelerator_free(g->acc); /* first: it unhooks the optimizer and gives the model its parameters back */
    if (g->have_params) ct_param_list_free(&g->params);
    ct_optimizer_free(g->opt);
    ct_module_free(g->model ? &g->model->base : NULL);
    free(g->raw), free(g->xb), free(g->yb);
    *g = (accel_gpt){0};
}

#endif
