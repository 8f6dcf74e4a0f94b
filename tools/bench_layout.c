/* The rank side of `ctrain bench`'s model-parallel layouts (tools/bench.h,
 * ct_bench_layout_train): tensor parallelism (tpK, tpKsp) through the Accelerator
 * with Megatron-LM's settings, pipelines (ppK) with parallel/pipeline_model.h; the
 * processes left over, dp = N / (tp pp), are data-parallel replicas.
 *
 * The same tokens as DDP. Under DDP each of the N ranks trains on its own B rows (its
 * stream, seeded with the seed and its rank). A layout has only dp replicas, so each
 * replica trains on the rows of the ranks of its model-parallel group: the replica of
 * world ranks r_0 .. r_{k-1} (k = tp or pp) draws B rows from each of their streams, one
 * after the other, k B rows in all, and every rank of the group passes those same rows
 * to the model. The global batch is DDP's N B rows, the loss of a replica is the mean
 * over its k B rows, the gradient averaged over the dp replicas is DDP's average over
 * N ranks of their means: in f32 the losses agree up to the order of the sums.
 *
 * Tensor parallelism: the mesh is dp x tp, tp innermost (the replica of dp index d is
 * world ranks d tp .. d tp + tp - 1); ct_accelerator_prepare shards the GPT or Llama
 * in place and runs DDP over the dp group. Pipelines: the mesh is dp x pp with pp
 * outermost (stage s of replica d is world rank s dp + d); ct_pipeline_*_new cuts the
 * model into stages, every step runs M micro-batches of k B / M rows by 1F1B, the tied
 * embedding's gradient is summed over the first and last stage, and the gradients of
 * this stage's parameters are averaged over the dp group (one allreduce per
 * parameter, after the backward: nothing overlaps it).
 *
 * Figures, besides those of tools/bench_rank.c:
 *   sent_tp_bytes, sent_dp_bytes, sent_pp_bytes   bytes this rank sent in the last
 *       step on each axis (ct_pg_bytes_sent of the axis's group: as ring algorithms
 *       send them; pp: ct_pipeline_model_bytes_sent, the activations, their gradients
 *       and the tied embedding's sum; dp under tp: DDP's count, 2 (dp-1)/dp of the
 *       bytes it reduces, since DDP runs its buckets on a group of its own)
 *   bubble   pipelines: the time a stage waited for a receive during the pipeline's
 *       runs over the time of those runs (the timed steps; mean over the ranks), to be
 *       compared with 1F1B's (pp - 1) / (M + pp - 1)
 *   comm_ms, exposed_ms   the data-parallel axis only: DDP's (tp) or the blocking
 *       gradient allreduce (pp, both the same). The tensor-parallel collectives run
 *       inside the forward and backward and are not timed apart.
 *   params, grads, optimizer bytes   what this rank trains: its shard (tp) or its
 *       stage (pp), 4, 4 and 8 bytes per parameter. A pipeline rank still holds the
 *       whole model (pipeline_model.h keeps it), which peak RSS shows.
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

/* ---- tensor parallelism --------------------------------------------------------- */

static ct_status train_tp(const ct_bench_opts *o, const ct_model_shape *shape, double *m, double *s, ct_pg **pg_out,
                          bench_gpt *g, draws *d)
{
    const ct_bench_strategy *st_ = o->strategies[0];
    const int tp = st_->tp;
    ct_megatron_lm_plugin mlm = {.tp_degree = tp, .sequence_parallelism = st_->sp};
    ct_accelerator_config cfg = {.mixed_precision = o->precisions[0], .megatron_lm_plugin = &mlm};
    ct_accelerator *acc = ct_accelerator_new(&cfg);
    if (!acc) return ct_error_prefix("ct_accelerator_new (tp_degree %d): ", tp);
    ct_set_num_threads(o->threads);
    const int64_t B = o->batch_size, T = o->seq_len;
    if (shape->kind == CT_MODEL_LLAMA ? bench_llama_init(g, acc, &shape->llama, B * tp, T, (uint64_t)o->seed)
                                      : bench_gpt_init(g, acc, &shape->gpt, B * tp, T, (uint64_t)o->seed))
        return ct_last_status();
    const ct_mesh *mesh = ct_accelerator_mesh(acc);
    if (!mesh)
        return ct_error_set(CT_ERR_INTERNAL, "rank %d: tp_degree %d was asked for, but prepare made no mesh", g->rank,
                            tp);
    int ranks[64];
    for (int i = 0; i < tp; i++) ranks[i] = ct_mesh_rank_at(mesh, mesh->dp_rank, i, 0);
    if (draws_init(d, (uint64_t)o->seed, ranks, tp, B, T, g->vocab)) return ct_error_prefix("rank %d: ", g->rank);
    ct_ddp *ddp = ct_accelerator_ddp(acc);
    ct_ddp_stats at_warmup = {0};
    double *times = malloc((size_t)o->steps * sizeof *times);
    if (!times) return ct_error_set(CT_ERR_NOMEM, "rank %d: out of memory for %d step times", g->rank, o->steps);
    ct_status st = CT_OK;
    for (int step = 0; !st && step < o->warmup_steps + o->steps; step++) {
        if (step == o->warmup_steps && ddp) at_warmup = ct_ddp_stats_get(ddp);
        draws_next(d, g->xb, g->yb);
        double before[3], after[3], loss = NAN, dt = 0;
        axis_bytes(mesh->tp_group, NULL, NULL, before);
        ct_storage_peak_reset();
        if ((st = bench_gpt_step_drawn(g, step, 0.0, &loss, &dt))) break;
        axis_bytes(mesh->tp_group, NULL, NULL, after);
        if (step == 0) s[S_LOSS0] = loss;
        s[S_LOSS] = loss;
        if (step < o->warmup_steps) continue;
        times[step - o->warmup_steps] = dt;
        m[M_TIME] += dt;
        m[M_STEP_PEAK] = fmax(m[M_STEP_PEAK], (double)ct_storage_peak_bytes());
        m[M_TP] = after[0] - before[0];
    }
    if (!st) {
        qsort(times, (size_t)o->steps, sizeof *times, cmp_double);
        m[M_MEDIAN] = o->steps % 2 ? times[o->steps / 2] : 0.5 * (times[o->steps / 2 - 1] + times[o->steps / 2]);
    }
    free(times);
    if (st) return st;
    const double local = (double)ct_module_num_params(bench_gpt_module(g)); /* this rank's shard */
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
    }
    *pg_out = ct_accelerator_pg(acc);
    return CT_OK;
}

/* ---- pipelines ------------------------------------------------------------------ */

typedef struct pp_run {
    ct_pg *world;
    ct_mesh *mesh;
    ct_gpt *gpt;
    ct_llama *llama;
    ct_pipeline_model *pm;
    ct_optimizer *opt;
    int64_t *x, *y;
} pp_run;

static void pp_run_free(pp_run *r)
{
    ct_pipeline_model_free(r->pm);
    ct_optimizer_free(r->opt);
    ct_module_free(r->gpt ? &r->gpt->base : r->llama ? &r->llama->base : NULL);
    ct_mesh_free(r->mesh);
    ct_pg_free(r->world);
    free(r->x), free(r->y);
    *r = (pp_run){0};
}

/* Averages this stage's gradients over the dp group (one allreduce each). */
static ct_status dp_average(ct_pg *dp, const ct_param_list *p)
{
    const int n = ct_pg_size(dp);
    if (n <= 1) return CT_OK;
    for (int i = 0; i < p->n; i++) {
        ct_tensor *gr = p->tensors[i]->grad;
        if (!gr) continue;
        if (ct_work_run(ct_pg_allreduce(dp, gr, CT_REDUCE_MEAN)))
            return ct_error_prefix("averaging the gradient of %s over %d replicas: ", p->names[i], n);
    }
    return CT_OK;
}

static ct_status train_pp(const ct_bench_opts *o, const ct_model_shape *shape, int world_size, double *m, double *s,
                          pp_run *r, draws *d)
{
    const int pp = o->strategies[0]->pp, M = o->num_micro_batches;
    const int64_t B = o->batch_size, T = o->seq_len;
    if (!(r->world = ct_pg_new(NULL))) return ct_error_prefix("ct_pg_new: ");
    ct_set_num_threads(o->threads);
    const int rank = ct_pg_rank(r->world);
    if (!(r->mesh = ct_mesh_new(r->world, &(ct_mesh_config){.pp = pp})))
        return ct_error_prefix("rank %d: pp %d over %d processes: ", rank, pp, world_size);
    const ct_mesh *mesh = r->mesh;
    ct_set_seed((uint64_t)o->seed); /* the same weights as bench_gpt_init builds */
    int64_t vocab;
    if (shape->kind == CT_MODEL_LLAMA) {
        ct_llama_config c = shape->llama;
        c.dtype = CT_DTYPE_F32;
        vocab = c.vocab_size;
        if (!(r->llama = ct_llama_new(&c))) return ct_error_prefix("rank %d: ct_llama_new: ", rank);
        r->pm = ct_pipeline_llama_new(r->llama, mesh->pp_group, mesh->pp_rank, NULL);
    } else {
        ct_gpt_config c = shape->gpt;
        c.block_size = c.block_size > T ? c.block_size : T, c.dropout = 0.0, c.ln_eps = 1e-5;
        vocab = c.vocab_size;
        if (!(r->gpt = ct_gpt_new(&c))) return ct_error_prefix("rank %d: ct_gpt_new: ", rank);
        r->pm = ct_pipeline_gpt_new(r->gpt, mesh->pp_group, mesh->pp_rank, NULL);
    }
    if (!r->pm) return ct_error_prefix("rank %d: stage %d of %d: ", rank, mesh->pp_rank, pp);
    const ct_param_list *params = ct_pipeline_model_params(r->pm);
    if (!(r->opt = bench_gpt_adamw(params))) return ct_error_prefix("rank %d: ", rank);
    int ranks[64];
    for (int i = 0; i < pp; i++) ranks[i] = ct_mesh_rank_at(mesh, mesh->dp_rank, 0, i);
    if (draws_init(d, (uint64_t)o->seed, ranks, pp, B, T, vocab)) return ct_error_prefix("rank %d: ", rank);
    const int64_t rows = B * pp, shape2[2] = {rows, T};
    r->x = malloc((size_t)(rows * T) * sizeof *r->x);
    r->y = malloc((size_t)(rows * T) * sizeof *r->y);
    double *times = malloc((size_t)o->steps * sizeof *times);
    if (!r->x || !r->y || !times) {
        free(times);
        return ct_error_set(CT_ERR_NOMEM, "rank %d: out of memory for the batch and the step times", rank);
    }
    ct_pipeline *engine = ct_pipeline_model_engine(r->pm);
    double pipe_s = 0, wait0 = 0;
    ct_status st = CT_OK;
    for (int step = 0; !st && step < o->warmup_steps + o->steps; step++) {
        draws_next(d, r->x, r->y);
        double before[3], after[3], loss = NAN;
        axis_bytes(NULL, mesh->dp_group, mesh->pp_group, before);
        const double pp_sent0 = ct_pipeline_model_bytes_sent(r->pm);
        if (step == o->warmup_steps) wait0 = ct_pipeline_stats_get(engine).wait_s;
        ct_storage_peak_reset();
        const char *failed = NULL;
        double t0 = bench_gpt_now(), t1 = t0, t2 = t0;
        CT_FRAME {
            ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, 2, shape2, r->x);
            ct_tensor *y = ct_tensor_from_data(CT_DTYPE_I64, 2, shape2, r->y);
            ct_optimizer_zero_grad(r->opt);
            if (!x || !y) failed = "token tensors";
            else if (ct_pipeline_model_step(r->pm, x, y, M, &loss)) failed = "ct_pipeline_model_step";
            t1 = bench_gpt_now();
            if (!failed && ct_pipeline_model_sync_tied_grads(r->pm)) failed = "ct_pipeline_model_sync_tied_grads";
            t2 = bench_gpt_now();
            if (!failed && dp_average(mesh->dp_group, params)) failed = "the data-parallel average";
            if (!failed && step >= o->warmup_steps) m[M_COMM] += (bench_gpt_now() - t2) / o->steps;
            if (!failed && ct_optimizer_step(r->opt)) failed = "ct_optimizer_step";
        }
        const double dt = bench_gpt_now() - t0;
        if (failed) st = ct_error_prefix("rank %d: step %d: %s failed: ", rank, step, failed);
        else if (!isfinite(loss))
            st = ct_error_set(CT_ERR_INVALID, "rank %d: step %d: loss is %g (not finite)", rank, step, loss);
        if (st) break;
        axis_bytes(NULL, mesh->dp_group, mesh->pp_group, after);
        if (step == 0) s[S_LOSS0] = loss;
        s[S_LOSS] = loss;
        if (step < o->warmup_steps) continue;
        times[step - o->warmup_steps] = dt;
        m[M_TIME] += dt;
        pipe_s += t1 - t0;
        m[M_STEP_PEAK] = fmax(m[M_STEP_PEAK], (double)ct_storage_peak_bytes());
        m[M_DP] = after[1] - before[1];
        /* the engine's activations and gradients, the tied embedding's allreduce */
        m[M_PP] = ct_pipeline_model_bytes_sent(r->pm) - pp_sent0 + (after[2] - before[2]);
    }
    if (!st) {
        qsort(times, (size_t)o->steps, sizeof *times, cmp_double);
        m[M_MEDIAN] = o->steps % 2 ? times[o->steps / 2] : 0.5 * (times[o->steps / 2 - 1] + times[o->steps / 2]);
        s[S_BUBBLE] = pipe_s > 0 ? (ct_pipeline_stats_get(engine).wait_s - wait0) / pipe_s : NAN;
        m[M_EXPOSED] = m[M_COMM]; /* blocking: nothing overlaps it */
        double local = 0;
        for (int i = 0; i < params->n; i++) local += (double)ct_tensor_numel(params->tensors[i]);
        m[M_PARAMS] = m[M_GRADS] = 4.0 * local;
        m[M_OPTIMIZER] = 8.0 * local;
    }
    free(times);
    return st;
}

/* ---- the figures ------------------------------------------------------------------ */

ct_status ct_bench_layout_train(const ct_bench_opts *o, double *fig, const char **transport)
{
    const ct_bench_strategy *s = o->strategies[0];
    const ct_model_shape shape = ct_model_spec_shape(o->model);
    ct_dist_env env;
    if (ct_dist_env_detect(&env)) return ct_last_status();
    const int world = env.world_size > 0 ? env.world_size : 1, k = s->tp > 1 ? s->tp : s->pp;
    const int dp_min = s->dp_min > 0 ? s->dp_min : 1;
    if (k > 64 || world % k || world / k < dp_min)
        return ct_error_set(CT_ERR_INVALID,
                            "%s needs a multiple of %d processes, at least %d (%s %d x dp >= %d), and there are %d "
                            "(choose --num_processes to fit)",
                            s->name, k, k * dp_min, s->tp > 1 ? "tp" : "pp", k, dp_min, world);
    if (s->pp > 1 && ((int64_t)o->batch_size * s->pp) % o->num_micro_batches)
        return ct_error_set(CT_ERR_INVALID,
                            "%s: --num_micro_batches %d does not divide the %d rows a replica trains on (batch_size "
                            "%d x pp %d)",
                            s->name, o->num_micro_batches, o->batch_size * s->pp, o->batch_size, s->pp);
    double m[M_COUNT] = {0}, sums[S_COUNT] = {NAN, NAN, 0};
    bench_gpt g = {0};
    pp_run r = {0};
    draws d = {0};
    ct_pg *pg = NULL;
    ct_status st = s->tp > 1 ? train_tp(o, &shape, m, sums, &pg, &g, &d)
                             : train_pp(o, &shape, world, m, sums, &r, &d);
    if (s->pp > 1) pg = r.world;
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
    pp_run_free(&r);
    bench_gpt_free(&g);
    return st;
}
