/* ctrain benchmarks — what the GPT training benchmarks share (bench/gpt_cpu/gpt_cpu.c,
 * bench/gpt_gpu/gpt_gpu.c, bench/ddp/gpt_ddp.c): the FLOP count, and (from
 * tools/bench_gpt.h, shared with `ctrain bench`) the optimizer, the random batches and
 * the peak memory. */
#ifndef CT_BENCH_GPT_STEP_H
#define CT_BENCH_GPT_STEP_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "ctrain.h"
#include "tools/bench_gpt.h"

/* Peak resident memory of this process in MiB. */
static inline double peak_rss_mib(void)
{
    return bench_gpt_peak_rss_bytes() / (1024.0 * 1024.0);
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

/* AdamW as in GPT-2 training (tools/bench_gpt.h: lr 1e-4, betas 0.9/0.95, weight decay
 * 0.1 on the 2-D tensors). */
static inline ct_optimizer *make_optimizer(const ct_param_list *l)
{
    return bench_gpt_adamw(l);
}

/* One (B, T+1) window of random tokens below vocab -> x = [:, :T], y = [:, 1:]. */
static inline void draw_batch(ct_rng *rng, int64_t B, int64_t T, int64_t vocab, uint32_t *raw, int64_t *x,
                              int64_t *y)
{
    bench_gpt_draw_batch(rng, B, T, vocab, raw, x, y);
}

#endif
