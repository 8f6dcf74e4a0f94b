/* The rank side of `ctrain bench`'s model-parallel layouts (tools/bench.h,
 * ct_bench_layout_train): Megatron-LM tensor parallelism (tpK, tpKsp), pipelines (ppK)
 * and both (tp2pp2), all through the Accelerator with Megatron-LM's settings, as a
 * user's loop runs them; the processes left over, dp = N / (tp pp), are data-parallel
 * replicas.
 *
 * The same tokens as DDP. Under DDP each of the N ranks trains on its own B rows (its
 * stream, seeded with the seed and its rank). A layout has only dp replicas, so each
 * replica trains on the rows of the ranks of its model-parallel group: the replica of
 * world ranks r_0 .. r_{k-1} (k = tp pp) draws B rows from each of their streams, one
 * after the other, k B rows in all, and every rank of the group passes those same rows
 * to the model. The global batch is DDP's N B rows, the loss of a replica is the mean
 * over its k B rows, the gradient averaged over the dp replicas is DDP's average over
 * N ranks of their means: in f32 the losses agree up to the order of the sums.
 *
 * The mesh is pp x dp x tp, tp innermost (parallel/mesh.h). ct_accelerator_prepare
 * shards the GPT or Llama over tp in place and cuts it into stages over pp; without
 * stages DDP runs over the dp group, with them the model's loss call runs M
 * micro-batches of k B / M rows by 1F1B and the gradients of the stage's parameters are
 * averaged over the dp group before the step (one allreduce per parameter, after the
 * backward: nothing overlaps it).
 *
 * Figures, besides those of tools/bench_rank.c:
 *   sent_tp_bytes, sent_dp_bytes, sent_pp_bytes   bytes this rank sent in the last
 *       step on each axis (ct_pg_bytes_sent of the axis's group: as ring algorithms
 *       send them; pp: ct_pipeline_model_bytes_sent, the activations, their gradients,
 *       the tied embedding's sum and the norms; dp under DDP: DDP's count, 2 (dp-1)/dp
 *       of the bytes it reduces, since DDP runs its buckets on a group of its own)
 *   bubble   pipelines: the time a stage waited for a receive during the pipeline's
 *       runs over the time of those runs (the timed steps; mean over the ranks), to be
 *       compared with 1F1B's (pp - 1) / (M + pp - 1)
 *   comm_ms, exposed_ms   the data-parallel axis only: DDP's (no stages) or the
 *       blocking gradient reductions before the step (stages: both the same). The
 *       tensor-parallel collectives run inside the forward and backward and are not
 *       timed apart.
 *   params, grads, optimizer bytes   what this rank trains: its shard (tp) of its
 *       stage (pp), 4, 4 and 8 bytes per parameter. The other stages' parameters give
 *       their memory back (parallel/pipeline_model.h), which peak RSS shows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "dist/env.h"
#include "parallel/pipeline_model.h"
#include "tools/bench.h"
#include "tools/bench_gpt.h"
#include "tools/rank_figures.h"

/* The figures reduced with MAX over the ranks, and those summed (then divided by N). */
enum { M_TIME, M_MEDIAN, M_PARAMS, M_GRADS, M_OPTIMIZER, M_STEP_PEAK, M_RSS, M_TP, M_DP, M_PP, M_COMM, M_EXPOSED,
       M_COUNT };
enum { S_LOSS0, S_LOSS, S_BUBBLE, S_COUNT };

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The batch of a replica standing for k ranks: B rows from each of their streams. */
typedef struct draws {
    ct_rng *rngs;
    int k;
    int64_t B, T, vocab;
    uint32_t *raw;
} draws;

static ct_status draws_init(draws *d, uint64_t seed, const int *ranks, int k, int64_t B, int64_t T, int64_t vocab)
{
    *d = (draws){.k = k, .B = B, .T = T, .vocab = vocab};
    d->rngs = malloc((size_t)k * sizeof *d->rngs);
    d->raw = malloc((size_t)(B * (T + 1)) * sizeof *d->raw);
    if (!d->rngs || !d->raw) return ct_error_set(CT_ERR_NOMEM, "out of memory for the token streams of %d ranks", k);
    for (int i = 0; i < k; i++) bench_gpt_rank_rng(&d->rngs[i], seed, ranks[i]);
    return CT_OK;
}

/* x, y: (k B, T) */
static void draws_next(draws *d, int64_t *x, int64_t *y)
{
    for (int i = 0; i < d->k; i++)
        bench_gpt_draw_batch(&d->rngs[i], d->B, d->T, d->vocab, d->raw, x + i * d->B * d->T, y + i * d->B * d->T);
}

static void draws_free(draws *d)
{
    free(d->rngs), free(d->raw);
}

/* The bytes the three axis groups have sent so far. */
static void axis_bytes(ct_pg *tp, ct_pg *dp, ct_pg *pp, double *v)
{
    v[0] = ct_pg_bytes_sent(tp), v[1] = ct_pg_bytes_sent(dp), v[2] = ct_pg_bytes_sent(pp);
}

/* ---- one layout through the Accelerator -------------------------------------------- */

static ct_status train_mlm(const ct_bench_opts *o, const ct_model_shape *shape, double *m, double *s, ct_pg **pg_out,
                           bench_gpt *g, draws *d)
{
    const ct_bench_strategy *st_ = o->strategies[0];
    const int tp = st_->tp > 1 ? st_->tp : 1, pp = st_->pp > 1 ? st_->pp : 1, k = tp * pp;
    ct_megatron_lm_plugin mlm = {.tp_degree = tp, .pp_degree = pp, .num_micro_batches = o->num_micro_batches,
                                 .sequence_parallelism = st_->sp};
    ct_accelerator_config cfg = {.mixed_precision = o->precisions[0], .megatron_lm_plugin = &mlm};
    ct_accelerator *acc = ct_accelerator_new(&cfg);
    if (!acc) return ct_error_prefix("ct_accelerator_new (tp_degree %d, pp_degree %d): ", tp, pp);
    ct_set_num_threads(o->threads);
    const int64_t B = o->batch_size, T = o->seq_len;
    if (shape->kind == CT_MODEL_LLAMA ? bench_llama_init(g, acc, &shape->llama, B * k, T, (uint64_t)o->seed)
                                      : bench_gpt_init(g, acc, &shape->gpt, B * k, T, (uint64_t)o->seed))
        return ct_last_status();
    const ct_mesh *mesh = ct_accelerator_mesh(acc);
    if (!mesh)
        return ct_error_set(CT_ERR_INTERNAL, "rank %d: tp_degree %d x pp_degree %d was asked for, but prepare made no "
                            "mesh", g->rank, tp, pp);
    /* the replica's rows: B from the stream of each rank of its model-parallel group */
    int ranks[64], nr = 0;
    for (int j = 0; j < pp; j++)
        for (int i = 0; i < tp; i++) ranks[nr++] = ct_mesh_rank_at(mesh, mesh->dp_rank, i, j);
    if (draws_init(d, (uint64_t)o->seed, ranks, k, B, T, g->vocab)) return ct_error_prefix("rank %d: ", g->rank);
    ct_ddp *ddp = ct_accelerator_ddp(acc);
    ct_pipeline_model *pm = ct_accelerator_pipeline(acc);
    ct_pipeline *engine = ct_pipeline_model_engine(pm);
    ct_ddp_stats at_warmup = {0};
    double reduce0 = 0, wait0 = 0, run0 = 0;
    double *times = malloc((size_t)o->steps * sizeof *times);
    if (!times) return ct_error_set(CT_ERR_NOMEM, "rank %d: out of memory for %d step times", g->rank, o->steps);
    ct_status st = CT_OK;
    for (int step = 0; !st && step < o->warmup_steps + o->steps; step++) {
        if (step == o->warmup_steps) {
            if (ddp) at_warmup = ct_ddp_stats_get(ddp);
            reduce0 = ct_accelerator_pipeline_reduce_seconds(acc);
            wait0 = ct_pipeline_stats_get(engine).wait_s, run0 = ct_pipeline_stats_get(engine).run_s;
        }
        draws_next(d, g->xb, g->yb);
        double before[3], after[3], loss = NAN, dt = 0;
        axis_bytes(mesh->tp_group, mesh->dp_group, NULL, before);
        before[2] = ct_pipeline_model_bytes_sent(pm);
        ct_storage_peak_reset();
        if ((st = bench_gpt_step_drawn(g, step, 0.0, &loss, &dt))) break;
        axis_bytes(mesh->tp_group, mesh->dp_group, NULL, after);
        after[2] = ct_pipeline_model_bytes_sent(pm);
        if (step == 0) s[S_LOSS0] = loss;
        s[S_LOSS] = loss;
        if (step < o->warmup_steps) continue;
        times[step - o->warmup_steps] = dt;
        m[M_TIME] += dt;
        m[M_STEP_PEAK] = fmax(m[M_STEP_PEAK], (double)ct_storage_peak_bytes());
        m[M_TP] = after[0] - before[0];
        m[M_DP] = after[1] - before[1]; /* the pipeline's average over dp (DDP's: below) */
        /* the engine's activations and gradients, the tied embedding's sum, the norms */
        m[M_PP] = after[2] - before[2];
    }
    if (!st) {
        qsort(times, (size_t)o->steps, sizeof *times, cmp_double);
        m[M_MEDIAN] = o->steps % 2 ? times[o->steps / 2] : 0.5 * (times[o->steps / 2 - 1] + times[o->steps / 2]);
    }
    free(times);
    if (st) return st;
    /* what this rank trains: its shard (tp) of its stage's parameters (pp) */
    double local = 0;
    const ct_param_list *mine = pm ? ct_pipeline_model_params(pm) : NULL;
    if (mine)
        for (int i = 0; i < mine->n; i++) local += (double)ct_tensor_numel(mine->tensors[i]);
    else local = (double)ct_module_num_params(bench_gpt_module(g));
    m[M_PARAMS] = m[M_GRADS] = 4.0 * local;
    m[M_OPTIMIZER] = 8.0 * local;
    if (ddp) {
        /* DDP runs its buckets on a group of its own (the last one on the dp group): its
         * count, as bench_rank.c takes it, 2 (dp-1)/dp of the bytes it reduces per step */
        ct_ddp_stats ds = ct_ddp_stats_get(ddp);
        const double dp = mesh->dp;
        m[M_DP] = 2.0 * (dp - 1) / dp * (double)ds.bytes;
        m[M_COMM] = (ds.total_comm_s - at_warmup.total_comm_s) / o->steps;
        m[M_EXPOSED] = (ds.total_exposed_s - at_warmup.total_exposed_s) / o->steps;
    } else if (pm) {
        /* blocking, before the step: nothing overlaps it */
        m[M_COMM] = m[M_EXPOSED] = (ct_accelerator_pipeline_reduce_seconds(acc) - reduce0) / o->steps;
        const ct_pipeline_stats ps = ct_pipeline_stats_get(engine);
        s[S_BUBBLE] = ps.run_s > run0 ? (ps.wait_s - wait0) / (ps.run_s - run0) : NAN;
    }
    *pg_out = ct_accelerator_pg(acc);
    return CT_OK;
}

/* ---- the figures ------------------------------------------------------------------ */

ct_status ct_bench_layout_train(const ct_bench_opts *o, double *fig, const char **transport)
{
    const ct_bench_strategy *s = o->strategies[0];
    const ct_model_shape shape = ct_model_spec_shape(o->model);
    ct_dist_env env;
    if (ct_dist_env_detect(&env)) return ct_last_status();
    const int world = env.world_size > 0 ? env.world_size : 1, k = (s->tp > 1 ? s->tp : 1) * (s->pp > 1 ? s->pp : 1);
    const int dp_min = s->dp_min > 0 ? s->dp_min : 1;
    if (k > 64 || world % k || world / k < dp_min)
        return ct_error_set(CT_ERR_INVALID,
                            "%s needs a multiple of %d processes, at least %d (tp x pp = %d, x dp >= %d), and there "
                            "are %d (choose --num_processes to fit)",
                            s->name, k, k * dp_min, k, dp_min, world);
    if (s->pp > 1 && ((int64_t)o->batch_size * k) % o->num_micro_batches)
        return ct_error_set(CT_ERR_INVALID,
                            "%s: --num_micro_batches %d does not divide the %d rows a replica trains on (batch_size "
                            "%d x tp x pp %d)",
                            s->name, o->num_micro_batches, o->batch_size * k, o->batch_size, k);
    double m[M_COUNT] = {0}, sums[S_COUNT] = {NAN, NAN, 0};
    bench_gpt g = {0};
    draws d = {0};
    ct_pg *pg = NULL;
    ct_status st = train_mlm(o, &shape, m, sums, &pg, &g, &d);
    if (!st) {
        m[M_RSS] = bench_gpt_peak_rss_bytes();
        if (ct_rank_figures_reduce(pg, m, M_COUNT, CT_REDUCE_MAX) ||
            ct_rank_figures_reduce(pg, sums, S_COUNT, CT_REDUCE_SUM))
            st = ct_error_prefix("rank %s: reducing the figures over the ranks: ",
                                 getenv("RANK") ? getenv("RANK") : "0");
    }
    if (!st) {
        ct_model_shape full = shape;
        if (full.kind != CT_MODEL_LLAMA && full.gpt.block_size < o->seq_len) full.gpt.block_size = o->seq_len;
        const int n = world;
        for (int f = 0; f < CT_BENCH_NFIGURES; f++) fig[f] = 0;
        fig[CT_BENCH_TOKENS_PER_S] = (double)n * o->batch_size * o->seq_len * o->steps / m[M_TIME];
        fig[CT_BENCH_STEP_MS] = 1e3 * m[M_MEDIAN];
        fig[CT_BENCH_PARAMS_BYTES] = m[M_PARAMS];
        fig[CT_BENCH_GRADS_BYTES] = m[M_GRADS];
        fig[CT_BENCH_OPTIMIZER_BYTES] = m[M_OPTIMIZER];
        fig[CT_BENCH_ACTIVATIONS_BYTES] = m[M_STEP_PEAK] - m[M_PARAMS] - m[M_GRADS] - m[M_OPTIMIZER];
        fig[CT_BENCH_STEP_PEAK_BYTES] = m[M_STEP_PEAK];
        fig[CT_BENCH_GATHERED_PEAK_BYTES] = m[M_PARAMS];
        fig[CT_BENCH_PEAK_RSS_BYTES] = m[M_RSS];
        fig[CT_BENCH_SENT_BYTES] = m[M_TP] + m[M_DP] + m[M_PP];
        fig[CT_BENCH_COMM_MS] = 1e3 * m[M_COMM];
        fig[CT_BENCH_EXPOSED_MS] = 1e3 * m[M_EXPOSED];
        fig[CT_BENCH_LOSS0] = sums[S_LOSS0] / n;
        fig[CT_BENCH_LOSS] = sums[S_LOSS] / n;
        fig[CT_BENCH_PARAMS] = (double)ct_model_shape_params(&full);
        fig[CT_BENCH_GROUP] = k;
        fig[CT_BENCH_TP] = s->tp > 1 ? s->tp : 1;
        fig[CT_BENCH_PP] = s->pp > 1 ? s->pp : 1;
        fig[CT_BENCH_DP] = world / k;
        fig[CT_BENCH_MICRO_BATCHES] = s->pp > 1 ? o->num_micro_batches : 1;
        fig[CT_BENCH_SENT_TP_BYTES] = m[M_TP];
        fig[CT_BENCH_SENT_DP_BYTES] = m[M_DP];
        fig[CT_BENCH_SENT_PP_BYTES] = m[M_PP];
        fig[CT_BENCH_BUBBLE] = s->pp > 1 ? sums[S_BUBBLE] / n : 0;
        *transport = pg && ct_pg_size(pg) > 1 ? ct_pg_transport(pg) : "none";
    }
    draws_free(&d);
    bench_gpt_free(&g);
    return st;
}
