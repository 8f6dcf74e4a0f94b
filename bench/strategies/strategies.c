/* GPT training under each sharding strategy: throughput, per-rank memory by what it
 * holds, and bytes on the wire, one strategy per run.
 *
 *   ctrain launch --num_processes N --main_process_port 0 strategies \
 *       [--config w1|wide] [--seq T] [--batch B] [--steps S] [--warmup W]
 *       [--strategy NO_SHARD|OPTIMIZER|GRAD_OP|FULL|HYBRID] [--wrap transformer|size|none]
 *       [--precision f32|bf16] [--hybrid_group G] [--threads K] [--seed X]
 *
 * Models (dropout 0, block size = T):
 *   w1    vocab 256, 4 layers, 4 heads, width 256 (about 3.2M parameters)
 *   wide  vocab 256, 12 layers, 12 heads, width 768 (about 85M parameters)
 * AdamW as in gpt_step.h (lr 1e-4, betas 0.9/0.95, weight decay 0.1 on the 2-D tensors)
 * through the Accelerator: ct_accelerator_new with shard.strategy = --strategy (NO_SHARD:
 * DDP with its default buckets), prepare, then per step
 *     CT_FRAME { CT_ACCUMULATE(acc) { loss; ct_accelerator_backward; ct_optimizer_step;
 *                                     ct_optimizer_zero_grad } }
 * Every rank draws its own random (B, T) batches (Philox, seeded with the seed and the
 * rank, the same whatever the strategy) before its clock starts, so every strategy
 * trains on the same tokens from the same weights: in f32 their losses agree.
 *
 * Measured over the S timed steps that follow W untimed ones:
 *   tokens_per_s   N * B * T * S / the slowest rank's total time of the S steps
 *   step_ms        the slowest rank's median step
 *   comm_ms, exposed_ms   collectives in flight per step (union of intervals) and the
 *                  part the training thread waited for; means over the timed steps
 *                  (ct_shard_stats_get after each step; ct_ddp_stats_get's totals for DDP)
 *   sent_bytes     bytes this rank sent in the last step, counted as ring algorithms
 *                  send them (ct_shard_stats.bytes_sent; DDP: 2 (N-1)/N of the bytes it
 *                  all-reduces per step)
 *   params_bytes, grads_bytes, optimizer_bytes   storage kept between steps: the
 *                  engine's accounting (ct_shard_stats.memory; optimizer = the moments
 *                  and the f32 master slices, which bf16's 16-bit parameters have); for
 *                  DDP 4, 4 and 8 bytes per parameter (its gradient buckets, another 4,
 *                  are not in these)
 *   step_peak_bytes  ctrain's live storage at its highest during a timed step
 *                  (ct_storage_peak_bytes, reset as each step starts; the largest step)
 *   activations_bytes  step_peak - params - grads - optimizer: activations and
 *                  everything else transient (gathered parameters under FULL/HYBRID,
 *                  gradient buckets and temporaries, the optimizer's scratch)
 *   gathered_peak_bytes  the most full (gathered) parameters alive at once
 *   peak_rss_bytes ru_maxrss of the process
 * Every per-rank figure is the largest over the ranks (an all-reduce with MAX); loss0
 * and loss are the first and last step's losses averaged over the ranks.
 *
 * Output: rank 0 prints one line on stdout, space-separated key=value pairs after the
 * word RESULT (keys as above, plus config, ranks, precision, strategy, wrap, group,
 * units, seq, batch, steps, warmup, threads, transport, params). Errors print a message
 * naming the rank on stderr and exit with status 2.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "ctrain.h"

#define PROG "strategies"
#include "bench/args.h" /* after PROG: its messages name the program */
#include "bench/gpt_accel.h"

typedef struct model_config {
    const char *name;
    int64_t vocab, n_layer, n_head, n_embd;
} model_config;

static const model_config configs[] = {
    {"w1", 256, 4, 4, 256},
    {"wide", 256, 12, 12, 768},
};

static const char *const wrap_names[] = {[CT_WRAP_NONE] = "none", [CT_WRAP_TRANSFORMER] = "transformer",
                                         [CT_WRAP_SIZE] = "size"};
/* size_based_wrap's threshold (FSDP's default, 1e8, would leave these models one unit):
 * bottom up, every linear of a Block but w1's attention projection becomes a unit */
#define WRAP_MIN_PARAMS 100000

typedef struct options {
    const model_config *model;
    int seq, batch, steps, warmup, threads, hybrid_group;
    ct_shard_strategy strategy;
    ct_wrap_policy wrap;
    bool bf16;
    uint64_t seed;
} options;

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--config w1|wide] [--seq T] [--batch B] [--steps S] [--warmup W]\n"
               "         [--strategy NO_SHARD|OPTIMIZER|GRAD_OP|FULL|HYBRID] [--wrap transformer|size|none]\n"
               "         [--precision f32|bf16] [--hybrid_group G] [--threads K] [--seed X]\n"
               "  run under `ctrain launch --num_processes N` (or alone, as one process)\n"
               "  --config       w1 (4 layers, width 256) or wide (12 layers, width 768); vocab 256 (default w1)\n"
               "  --seq T        tokens per row, also the block size (default 64)\n"
               "  --batch B      rows per rank per step (default 4)\n"
               "  --steps S      timed steps (default 10)\n"
               "  --warmup W     untimed steps first (default 2)\n"
               "  --strategy     NO_SHARD (DDP), OPTIMIZER (ZeRO-1), GRAD_OP (ZeRO-2), FULL (ZeRO-3),\n"
               "                 HYBRID (FULL inside groups of G ranks) (default NO_SHARD)\n"
               "  --wrap         units: one per Block (transformer), per subtree of >= %d parameters\n"
               "                 (size), or one (none) (default transformer)\n"
               "  --precision    f32, or bf16 mixed precision (sharded: 16-bit parameters; default f32)\n"
               "  --hybrid_group G  HYBRID's shard group size, dividing N (default: ranks per machine)\n"
               "  --threads K    threads per rank (default 1)\n"
               "  --seed X       seeds the weights and the random tokens (default 1337)\n"
               "Rank 0 prints one line: RESULT key=value ...\n",
            WRAP_MIN_PARAMS);
}

/* 0 ok, 1 --help, -1 error (message printed) */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.model = &configs[0], .seq = 64, .batch = 4, .steps = 10, .warmup = 2, .threads = 1,
                   .strategy = CT_SHARD_NO_SHARD, .wrap = CT_WRAP_TRANSFORMER, .seed = 1337};
    bool group_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!v) {
            fprintf(stderr, PROG ": %s needs a value (see --help)\n", a);
            return -1;
        }
        if (!strcmp(a, "--config")) {
            o->model = NULL;
            for (size_t k = 0; k < sizeof configs / sizeof *configs; k++)
                if (!strcmp(v, configs[k].name)) o->model = &configs[k];
            if (!o->model) {
                fprintf(stderr, PROG ": --config %s: expected w1 or wide\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--strategy")) {
            int found = -1;
            for (int s = CT_SHARD_NO_SHARD; s <= CT_SHARD_HYBRID; s++)
                if (!strcmp(v, ct_shard_strategy_name((ct_shard_strategy)s))) found = s;
            if (found < 0) {
                fprintf(stderr, PROG ": --strategy %s: expected NO_SHARD, OPTIMIZER, GRAD_OP, FULL or HYBRID\n", v);
                return -1;
            }
            o->strategy = (ct_shard_strategy)found;
        } else if (!strcmp(a, "--wrap")) {
            int found = -1;
            for (int w = 0; w < (int)(sizeof wrap_names / sizeof *wrap_names); w++)
                if (!strcmp(v, wrap_names[w])) found = w;
            if (found < 0) {
                fprintf(stderr, PROG ": --wrap %s: expected transformer, size or none\n", v);
                return -1;
            }
            o->wrap = (ct_wrap_policy)found;
        } else if (!strcmp(a, "--precision")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) {
                fprintf(stderr, PROG ": --precision %s: expected f32 or bf16\n", v);
                return -1;
            }
            o->bf16 = !strcmp(v, "bf16");
        } else if (!strcmp(a, "--seq")) {
            if (!parse_int(a, v, 1, 4096, &x)) return -1;
            o->seq = (int)x;
        } else if (!strcmp(a, "--batch")) {
            if (!parse_int(a, v, 1, 4096, &x)) return -1;
            o->batch = (int)x;
        } else if (!strcmp(a, "--steps")) {
            if (!parse_int(a, v, 1, 1000000, &x)) return -1;
            o->steps = (int)x;
        } else if (!strcmp(a, "--warmup")) {
            if (!parse_int(a, v, 0, 1000000, &x)) return -1;
            o->warmup = (int)x;
        } else if (!strcmp(a, "--hybrid_group")) {
            if (!parse_int(a, v, 1, 1 << 20, &x)) return -1;
            o->hybrid_group = (int)x;
            group_given = true;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(a, v, 1, 1024, &x)) return -1;
            o->threads = (int)x;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_int(a, v, 0, (long long)(~0ULL >> 1), &x)) return -1;
            o->seed = (uint64_t)x;
        } else {
            fprintf(stderr, PROG ": unknown argument '%s' (see --help)\n", a);
            return -1;
        }
        i++;
    }
    if (group_given && o->strategy != CT_SHARD_HYBRID) {
        fprintf(stderr, PROG ": --hybrid_group applies to --strategy HYBRID only (strategy is %s)\n",
                ct_shard_strategy_name(o->strategy));
        return -1;
    }
    return 0;
}

/* v[0..n) = the max (or sum) of v over all ranks, in place; every rank calls it.
 * pg NULL or of one rank: unchanged. */
static ct_status reduce_over_ranks(ct_pg *pg, double *v, int n, ct_reduce_op op)
{
    if (ct_pg_size(pg) <= 1) return CT_OK;
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(n), v);
        ct_work *w = t ? ct_pg_allreduce(pg, t, op) : NULL;
        st = w ? ct_work_wait(w) : ct_last_status();
        ct_work_free(w);
        if (!st) memcpy(v, ct_tensor_data(t), (size_t)n * sizeof *v);
    }
    return st;
}

/* the per-rank figures reduced with MAX, in this order */
enum {
    M_TIME,      /* total seconds of the timed steps */
    M_MEDIAN,    /* median step, seconds */
    M_PARAMS,
    M_GRADS,
    M_OPTIMIZER,
    M_ACTIVATIONS,
    M_STEP_PEAK,
    M_GATHERED,
    M_RSS,
    M_SENT,
    M_GATHERS,
    M_COMM,      /* seconds per step */
    M_EXPOSED,
    M_COUNT
};

static int run(const options *o)
{
    const model_config *mc = o->model;
    const int64_t B = o->batch, T = o->seq;
    const int total = o->warmup + o->steps;
    static const char *const block[] = {"Block"};
    ct_accelerator_config cfg = {
        .mixed_precision = o->bf16 ? "bf16" : "no",
        .shard = {.strategy = o->strategy,
                  .wrap = {.policy = o->wrap,
                           .classes = o->wrap == CT_WRAP_TRANSFORMER ? block : NULL,
                           .nclasses = o->wrap == CT_WRAP_TRANSFORMER ? 1 : 0,
                           .min_num_params = o->wrap == CT_WRAP_SIZE ? WRAP_MIN_PARAMS : 0},
                  .shard_group_size = o->hybrid_group},
    };
    ct_accelerator *acc = ct_accelerator_new(&cfg);
    if (!acc) {
        fprintf(stderr, PROG ": ct_accelerator_new: %s\n", ct_last_error());
        return 2;
    }
    const int rank = ct_accelerator_process_index(acc), world = ct_accelerator_num_processes(acc);
    int status = 2;
    accel_gpt g = {.acc = acc};
    double *times = malloc((size_t)o->steps * sizeof *times);
    if (o->hybrid_group && world % o->hybrid_group) {
        fprintf(stderr, PROG " (rank %d): --hybrid_group %d does not divide the number of ranks (%d)\n", rank,
                o->hybrid_group, world);
        goto out;
    }
    ct_set_num_threads(o->threads); /* after ct_accelerator_new, which applies the launcher's count */
    if (!times || accel_gpt_init(&g, acc,
                                 &(ct_gpt_config){.vocab_size = mc->vocab, .n_layer = mc->n_layer,
                                                  .n_head = mc->n_head, .n_embd = mc->n_embd},
                                 B, T, o->seed))
        goto out;
    const int64_t numel = ct_module_num_params(&g.model->base);
    ct_shard *shard = ct_accelerator_shard(acc);
    ct_ddp *ddp = ct_accelerator_ddp(acc);
    if (o->strategy != CT_SHARD_NO_SHARD && !shard) {
        fprintf(stderr, PROG " (rank %d): strategy %s was asked for, but the Accelerator prepared no sharding engine\n",
                rank, ct_shard_strategy_name(o->strategy));
        goto out;
    }

    double m[M_COUNT] = {0}, loss[2] = {NAN, NAN}; /* loss: first step, last step */
    ct_ddp_stats ddp_at_warmup = {0};
    ct_shard_stats ss = {0};
    for (int step = 0; step < total; step++) {
        if (step == o->warmup && ddp) ddp_at_warmup = ct_ddp_stats_get(ddp);
        double loss_v, dt;
        ct_storage_peak_reset();
        if (accel_gpt_step(&g, step, 0.0, &loss_v, &dt)) goto out;
        if (step == 0) loss[0] = loss_v;
        loss[1] = loss_v;
        if (step < o->warmup) continue;
        times[step - o->warmup] = dt;
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
    m[M_MEDIAN] = median(times, o->steps);
    if (shard) {
        m[M_PARAMS] = (double)ss.memory.params;
        m[M_GRADS] = (double)ss.memory.grads;
        /* the optimizer's state in ZeRO's sense: the moments and the f32 master slices */
        m[M_OPTIMIZER] = (double)(ss.memory.optimizer + ss.memory.master);
        m[M_GATHERED] = (double)ss.memory.gathered_peak;
        m[M_SENT] = (double)ss.bytes_sent;
        m[M_GATHERS] = (double)ss.gathers;
    } else {
        /* replicated: f32 parameters and gradients, AdamW's two moments */
        m[M_PARAMS] = 4.0 * (double)numel;
        m[M_GRADS] = 4.0 * (double)numel;
        m[M_OPTIMIZER] = 8.0 * (double)numel;
        m[M_GATHERED] = 4.0 * (double)numel;
        if (ddp) {
            ct_ddp_stats ds = ct_ddp_stats_get(ddp);
            m[M_SENT] = 2.0 * (world - 1) / world * (double)ds.bytes; /* ring all-reduce */
            m[M_COMM] = (ds.total_comm_s - ddp_at_warmup.total_comm_s) / o->steps;
            m[M_EXPOSED] = (ds.total_exposed_s - ddp_at_warmup.total_exposed_s) / o->steps;
        }
    }
    m[M_ACTIVATIONS] = m[M_STEP_PEAK] - m[M_PARAMS] - m[M_GRADS] - m[M_OPTIMIZER];
    m[M_RSS] = peak_rss_mib() * 1024.0 * 1024.0;
    ct_pg *pg = ct_accelerator_pg(acc);
    if (reduce_over_ranks(pg, m, M_COUNT, CT_REDUCE_MAX) || reduce_over_ranks(pg, loss, 2, CT_REDUCE_SUM)) {
        fprintf(stderr, PROG " (rank %d): reducing the figures over the ranks: %s\n", rank, ct_last_error());
        goto out;
    }
    if (ct_pg_size(pg) > 1) loss[0] /= world, loss[1] /= world;
    if (ct_accelerator_is_main_process(acc)) {
        const bool sharded = shard != NULL;
        printf("RESULT config=%s ranks=%d precision=%s strategy=%s wrap=%s group=%d units=%d seq=%lld batch=%lld "
               "steps=%d warmup=%d threads=%d transport=%s params=%lld tokens_per_s=%.2f step_ms=%.3f "
               "params_bytes=%.0f grads_bytes=%.0f optimizer_bytes=%.0f activations_bytes=%.0f step_peak_bytes=%.0f "
               "gathered_peak_bytes=%.0f peak_rss_bytes=%.0f sent_bytes=%.0f gathers=%.0f comm_ms=%.3f "
               "exposed_ms=%.3f loss0=%.6f loss=%.6f\n",
               mc->name, world, o->bf16 ? "bf16" : "f32", ct_shard_strategy_name(o->strategy),
               sharded ? wrap_names[o->wrap] : "-", sharded ? ss.shard_world : 1, sharded ? ss.units : 0,
               (long long)T, (long long)B, o->steps, o->warmup, ct_get_num_threads(),
               pg ? ct_pg_transport(pg) : "none", (long long)numel,
               (double)world * (double)(B * T) * o->steps / m[M_TIME], 1e3 * m[M_MEDIAN], m[M_PARAMS], m[M_GRADS],
               m[M_OPTIMIZER], m[M_ACTIVATIONS], m[M_STEP_PEAK], m[M_GATHERED], m[M_RSS], m[M_SENT], m[M_GATHERS],
               1e3 * m[M_COMM], 1e3 * m[M_EXPOSED], loss[0], loss[1]);
        fflush(stdout);
    }
    status = 0;
out:
    accel_gpt_free(&g);
    ct_frame_reset_root();
    free(times);
    return status;
}

int main(int argc, char **argv)
{
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    return run(&o);
}
