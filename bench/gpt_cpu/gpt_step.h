/* ctrain benchmarks — what the GPT training benchmarks share (bench/gpt_cpu/gpt_cpu.c,
 * bench/gpt_gpu/gpt_gpu.c, bench/ddp/gpt_ddp.c): the optimizer, the random batches,
 * the FLOP count and the peak memory. */
#ifndef CT_BENCH_GPT_STEP_H
#define CT_BENCH_GPT_STEP_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "ctrain.h"

/* Peak resident memory of this process in MiB. */
static inline double peak_rss_mib(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru)) return NAN;
    return (double)ru.ru_maxrss / 1024.0; /* Linux: KiB */
}

/* Parameters of the GPT as nn/gpt.h builds it (no allocation): n_matmul for the FLOP
 * count (everything but wpe) and the total. */
static inline void gpt_count_params(int64_t vocab, int64_t block, int64_t n_layer, int64_t n_embd, double *n_matmul,
                                    double *n_total)
{
    double C = (double)n_embd, V = (double)vocab, L = (double)n_layer;
    double per_layer = 2 * 2 * C                /* ln_1, ln_2 */
                       + C * 3 * C + 3 * C      /* c_attn */
                       + C * C + C              /* attn.c_proj */
                       + C * 4 * C + 4 * C      /* mlp.c_fc */
                       + 4 * C * C + C;         /* mlp.c_proj */
    *n_matmul = V * C + L * per_layer + 2 * C; /* wte (tied head) + blocks + ln_f */
    *n_total = *n_matmul + (double)block * C;
}

/* FLOPs of one training step (forward + backward) of batch x seq tokens, as nanoGPT
 * and the PaLM paper count them: 6 N per token for the weights plus 6 L T C for the
 * attention scores and their use (causal masking not discounted). */
static inline double gpt_step_flops(int64_t vocab, int64_t block, int64_t n_layer, int64_t n_embd, int64_t batch,
                                    int64_t seq)
{
    double n_matmul, n_total;
    gpt_count_params(vocab, block, n_layer, n_embd, &n_matmul, &n_total);
    return (double)(batch * seq) * (6 * n_matmul + 6 * (double)n_layer * (double)seq * (double)n_embd);
}

/* AdamW as in GPT-2 training (and examples/gpt/train.c): lr 1e-4, betas 0.9/0.95,
 * weight decay 0.1 on the 2-D tensors, none on biases and LayerNorm weights. */
static inline ct_optimizer *make_optimizer(const ct_param_list *l)
{
    ct_tensor **decay = malloc((size_t)l->n * sizeof *decay), **nodecay = malloc((size_t)l->n * sizeof *nodecay);
    if (!decay || !nodecay) {
        free(decay), free(nodecay);
        ct_error_set(CT_ERR_NOMEM, "make_optimizer: out of memory for %d parameters", l->n);
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
static inline void draw_batch(ct_rng *rng, int64_t B, int64_t T, int64_t vocab, uint32_t *raw, int64_t *x,
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

#endif
