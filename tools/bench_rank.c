/* The rank side of `ctrain bench` (tools/bench.h): the hidden subcommand
 *
 *     ctrain launch --num_processes N ... ctrain bench-rank --model M --strategies S
 *         --mixed_precision P --batch_size B --seq_len T --steps K --warmup_steps W ...
 *
 * (the flags of `ctrain bench`, with one strategy and one precision). Every rank trains
 * tools/bench_gpt.h's GPT or Llama through the Accelerator with shard.strategy = S (ddp: DDP with
 * its default buckets; the sharded strategies wrap one unit per Block; hybrid shards
 * inside 2 groups of N/2 ranks) and draws its own random (B, T) batches, seeded with the
 * seed and the rank, before its clock starts: every strategy trains on the same tokens
 * from the same weights, so in f32 their losses agree.
 *
 * Measured over the K timed steps that follow W untimed ones:
 *   tokens_per_s   N * B * T * K / the slowest rank's total time of the K steps
 *   step_ms        the slowest rank's median step
 *   comm_ms, exposed_ms   collectives in flight per step (union of intervals) and the
 *                  part the training thread waited for; means over the timed steps
 *   sent_bytes     bytes this rank sent in the last step, as ring algorithms send them
 *                  (DDP: 2 (N-1)/N of the bytes it all-reduces per step)
 *   params_bytes, grads_bytes, optimizer_bytes   storage kept between steps (the
 *                  engine's accounting; optimizer = the moments and the f32 master
 *                  slices; DDP: 4, 4 and 8 bytes per parameter)
 *   step_peak_bytes  ctrain's live storage at its highest during a timed step
 *   activations_bytes  step_peak - params - grads - optimizer: everything transient
 *   gathered_peak_bytes  the most full (gathered) parameters alive at once
 *   peak_rss_bytes ru_maxrss of the process
 *   params, group, units   parameters, the shard group's size, the engine's units
 * Every per-rank figure is the largest over the ranks (an all-reduce with MAX); loss0
 * and loss are the first and last step's losses averaged over the ranks.
 *
 * Rank 0 prints one line on stdout: RESULT key=value ... (ct_bench_figure_keys, then
 * transport=NAME). Errors go to stderr as "ctrain bench-rank: rank R: ..." with exit
 * status 2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "dist/env.h"
#include "tools/bench.h"
#include "tools/bench_gpt.h"
#include "tools/rank_figures.h"

#define PROG "ctrain bench-rank"

const char *const ct_bench_figure_keys[CT_BENCH_NFIGURES] = {
    "tokens_per_s", "step_ms", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
    "step_peak_bytes", "gathered_peak_bytes", "peak_rss_bytes", "sent_bytes", "gathers", "comm_ms",
    "exposed_ms", "loss0", "loss", "params", "group", "units", "tp", "pp", "dp", "micro_batches",
    "sent_tp_bytes", "sent_dp_bytes", "sent_pp_bytes", "bubble",
};

/* The figures reduced with MAX over the ranks, in this order. */
enum { M_TIME, M_MEDIAN, M_PARAMS, M_GRADS, M_OPTIMIZER, M_STEP_PEAK, M_GATHERED, M_RSS, M_SENT, M_GATHERS,
       M_COMM, M_EXPOSED, M_COUNT };

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Trains and fills fig (valid on every rank) and *transport; CT_OK or an error. */
static ct_status train(const ct_bench_opts *o, bench_gpt *g, double *fig, const char **transport)
{
    const ct_bench_strategy *s = o->strategies[0];
    if (ct_bench_strategy_is_layout(s)) return ct_bench_layout_train(o, fig, transport);
    const ct_model_shape shape = ct_model_spec_shape(o->model);
    const char *const block[] = {ct_model_shape_block_class(&shape)};
    ct_dist_env env;
    if (ct_dist_env_detect(&env)) return ct_last_status();
    const int world = env.world_size;
    if (s->shard == CT_SHARD_HYBRID && world % 2)
        return ct_error_set(CT_ERR_INVALID,
                            "hybrid shards inside 2 groups of N/2 ranks: N must be even, and it is %d (leave hybrid "
                            "out or choose an even --num_processes)",
                            world);
    ct_accelerator_config cfg = {
        .mixed_precision = o->precisions[0],
        .shard = {.strategy = s->shard,
                  .wrap = {.policy = CT_WRAP_TRANSFORMER, .classes = block, .nclasses = 1},
                  .shard_group_size = s->shard == CT_SHARD_HYBRID ? world / 2 : 0,
                  .offload_optimizer = s->offload},
    };
    ct_accelerator *acc = ct_accelerator_new(&cfg);
    if (!acc) return ct_error_prefix("ct_accelerator_new: ");
    ct_set_num_threads(o->threads); /* after ct_accelerator_new, which applies the launcher's count */
    const int64_t B = o->batch_size, T = o->seq_len;
    if (shape.kind == CT_MODEL_LLAMA ? bench_llama_init(g, acc, &shape.llama, B, T, (uint64_t)o->seed)
                                     : bench_gpt_init(g, acc, &shape.gpt, B, T, (uint64_t)o->seed))
        return ct_last_status();
    ct_shard *shard = ct_accelerator_shard(acc);
    ct_ddp *ddp = ct_accelerator_ddp(acc);
    if (s->shard != CT_SHARD_NO_SHARD && !shard)
        return ct_error_set(CT_ERR_INTERNAL, "rank %d: strategy %s was asked for, but no sharding engine was prepared",
                            g->rank, s->name);
    double *times = malloc((size_t)o->steps * sizeof *times);
    if (!times) return ct_error_set(CT_ERR_NOMEM, "rank %d: out of memory for %d step times", g->rank, o->steps);
    double m[M_COUNT] = {0}, loss[2] = {NAN, NAN}; /* loss: first step, last step */
    ct_ddp_stats ddp_at_warmup = {0};
    ct_shard_stats ss = {0};
    ct_status st = CT_OK;
    for (int step = 0; !st && step < o->warmup_steps + o->steps; step++) {
        if (step == o->warmup_steps && ddp) ddp_at_warmup = ct_ddp_stats_get(ddp);
        double loss_v = NAN, dt = 0;
        ct_storage_peak_reset();
        if ((st = bench_gpt_step(g, step, 0.0, &loss_v, &dt))) break;
        if (step == 0) loss[0] = loss_v;
        loss[1] = loss_v;
        if (step < o->warmup_steps) continue;
        times[step - o->warmup_steps] = dt;
        m[M_TIME] += dt;
        if (shard) {
            ss = ct_shard_stats_get(shard); /* of the step just done */
            m[M_COMM] += ss.comm_s / o->steps;
            m[M_EXPOSED] += ss.exposed_s / o->steps;
            m[M_STEP_PEAK] = fmax(m[M_STEP_PEAK], (double)ss.memory.step_peak);
        } else {
            m[M_STEP_PEAK] = fmax(m[M_STEP_PEAK], (double)ct_storage_peak_bytes());
        }
    }
    if (!st) m[M_MEDIAN] = median(times, o->steps);
    free(times);
    if (st) return st;
    const double numel = (double)ct_module_num_params(bench_gpt_module(g));
    if (shard) {
        m[M_PARAMS] = (double)ss.memory.params;
        m[M_GRADS] = (double)ss.memory.grads;
        m[M_OPTIMIZER] = (double)(ss.memory.optimizer + ss.memory.master); /* ZeRO's sense: moments + masters */
        m[M_GATHERED] = (double)ss.memory.gathered_peak;
        m[M_SENT] = (double)ss.bytes_sent;
        m[M_GATHERS] = (double)ss.gathers;
    } else {
        /* replicated: f32 parameters and gradients, AdamW's two moments */
        m[M_PARAMS] = m[M_GRADS] = m[M_GATHERED] = 4.0 * numel;
        m[M_OPTIMIZER] = 8.0 * numel;
        if (ddp) {
            ct_ddp_stats ds = ct_ddp_stats_get(ddp);
            m[M_SENT] = 2.0 * (world - 1) / world * (double)ds.bytes; /* ring all-reduce */
            m[M_COMM] = (ds.total_comm_s - ddp_at_warmup.total_comm_s) / o->steps;
            m[M_EXPOSED] = (ds.total_exposed_s - ddp_at_warmup.total_exposed_s) / o->steps;
        }
    }
    m[M_RSS] = bench_gpt_peak_rss_bytes();
    ct_pg *pg = ct_accelerator_pg(acc);
    if (ct_rank_figures_reduce(pg, m, M_COUNT, CT_REDUCE_MAX) || ct_rank_figures_reduce(pg, loss, 2, CT_REDUCE_SUM))
        return ct_error_prefix("rank %d: reducing the figures over the ranks: ", g->rank);
    const int n = ct_pg_size(pg) > 1 ? ct_pg_size(pg) : 1;
    fig[CT_BENCH_TOKENS_PER_S] = (double)n * (double)(B * T) * o->steps / m[M_TIME];
    fig[CT_BENCH_STEP_MS] = 1e3 * m[M_MEDIAN];
    fig[CT_BENCH_PARAMS_BYTES] = m[M_PARAMS];
    fig[CT_BENCH_GRADS_BYTES] = m[M_GRADS];
    fig[CT_BENCH_OPTIMIZER_BYTES] = m[M_OPTIMIZER];
    fig[CT_BENCH_ACTIVATIONS_BYTES] = m[M_STEP_PEAK] - m[M_PARAMS] - m[M_GRADS] - m[M_OPTIMIZER];
    fig[CT_BENCH_STEP_PEAK_BYTES] = m[M_STEP_PEAK];
    fig[CT_BENCH_GATHERED_PEAK_BYTES] = m[M_GATHERED];
    fig[CT_BENCH_PEAK_RSS_BYTES] = m[M_RSS];
    fig[CT_BENCH_SENT_BYTES] = m[M_SENT];
    fig[CT_BENCH_GATHERS] = m[M_GATHERS];
    fig[CT_BENCH_COMM_MS] = 1e3 * m[M_COMM];
    fig[CT_BENCH_EXPOSED_MS] = 1e3 * m[M_EXPOSED];
    fig[CT_BENCH_LOSS0] = loss[0] / n;
    fig[CT_BENCH_LOSS] = loss[1] / n;
    fig[CT_BENCH_PARAMS] = numel;
    fig[CT_BENCH_GROUP] = shard ? ss.shard_world : 1;
    fig[CT_BENCH_UNITS] = shard ? ss.units : 0;
    /* one axis: every rank is a data-parallel replica (or a shard of one) */
    fig[CT_BENCH_TP] = fig[CT_BENCH_PP] = fig[CT_BENCH_MICRO_BATCHES] = 1;
    fig[CT_BENCH_DP] = n;
    fig[CT_BENCH_SENT_TP_BYTES] = fig[CT_BENCH_SENT_PP_BYTES] = fig[CT_BENCH_BUBBLE] = 0;
    fig[CT_BENCH_SENT_DP_BYTES] = m[M_SENT];
    *transport = pg ? ct_pg_transport(pg) : "none";
    return CT_OK;
}

int ct_bench_rank_main(int argc, char **argv)
{
    ct_bench_opts o;
    if (ct_bench_args_parse(argc, argv, &o)) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        return 2;
    }
    if (o.help) {
        fputs("usage: ctrain launch ... ctrain bench-rank [the flags of ctrain bench, one strategy and one\n"
              "       mixed precision]: one rank of a `ctrain bench` run (ctrain bench --help)\n",
              stdout);
        return 0;
    }
    if (o.nstrategies != 1 || o.nprecisions != 1) {
        fprintf(stderr, PROG ": give one strategy and one mixed precision (got %d and %d)\n", o.nstrategies,
                o.nprecisions);
        return 2;
    }
    bench_gpt g = {0};
    double fig[CT_BENCH_NFIGURES];
    const char *transport = "none";
    int status = 0;
    if (train(&o, &g, fig, &transport)) {
        const char *e = ct_last_error();
        /* the messages of bench_gpt name the rank already */
        if (!strncmp(e, "rank ", 5)) fprintf(stderr, PROG ": %s\n", e);
        else fprintf(stderr, PROG ": rank %s: %s\n", getenv("RANK") ? getenv("RANK") : "0", e);
        status = 2;
    } else if (ct_bench_strategy_is_layout(o.strategies[0]) ? !getenv("RANK") || !strcmp(getenv("RANK"), "0")
                                                             : g.rank == 0) {
        printf("RESULT");
        for (int k = 0; k < CT_BENCH_NFIGURES; k++) printf(" %s=%.17g", ct_bench_figure_keys[k], fig[k]);
        printf(" transport=%s\n", transport);
        if (fflush(stdout)) status = 2;
    }
    bench_gpt_free(&g);
    ct_frame_reset_root();
    return status;
}
