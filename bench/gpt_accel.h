/* ctrain benchmarks — a GPT trained through the Accelerator, for the distributed
 * benchmarks (bench/ddp/gpt_ddp.c): tools/bench_gpt.h's model, AdamW, token stream and
 * timed step (one copy, shared with `ctrain bench`), with messages printed under the
 * program's name. PROG must be defined first. */
#ifndef CT_BENCH_GPT_ACCEL_H
#define CT_BENCH_GPT_ACCEL_H

#include <stdio.h>

#include "bench/gpt_cpu/gpt_step.h"
#include "bench/timing.h"
#include "ctrain.h"
#include "tools/bench_gpt.h"

typedef bench_gpt accel_gpt;

/* Takes acc; see bench_gpt_init. 0, or 2 after printing what failed. accel_gpt_free
 * in either case. */
static inline int accel_gpt_init(accel_gpt *g, ct_accelerator *acc, const ct_gpt_config *cfg, int64_t B, int64_t T,
                                 uint64_t seed)
{
    if (!bench_gpt_init(g, acc, cfg, B, T, seed)) return 0;
    fprintf(stderr, PROG ": %s\n", ct_last_error());
    return 2;
}

/* One timed step; see bench_gpt_step. 0, or 2 after printing what failed. */
static inline int accel_gpt_step(accel_gpt *g, int step, double clip, double *loss, double *dt)
{
    if (!bench_gpt_step(g, step, clip, loss, dt)) return 0;
    fprintf(stderr, PROG ": %s\n", ct_last_error());
    return 2;
}

static inline void accel_gpt_free(accel_gpt *g)
{
    bench_gpt_free(g);
}

#endif
