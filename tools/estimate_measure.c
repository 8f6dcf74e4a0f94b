/* `ctrain estimate-memory MODEL --measure`: trains the model as one rank of the job the
 * launcher started (or alone) and prints what was measured beside the estimate
 * (tools/estimate_memory.h).
 *
 * Measured, per rank, the largest over the ranks:
 *   params, grads, optimizer  sharded: the engine's accounting (ct_shard_stats.memory;
 *                  optimizer = the moments + the master slices and their gradients);
 *                  DDP: the parameters' bytes, their .grad after backward, AdamW's state
 *   step_peak      ctrain's live storage at its highest during a step after the first
 *                  (ct_storage_peak_bytes, reset as each step starts)
 *   step_peak_reserved  the same with the allocator's cache (what ctrain holds)
 *   base_rss       the resident set before the model is built (code, libraries,
 *                  the comm thread): the runtime's own footprint
 *   peak_rss       ru_maxrss at the end
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "ctrain.h"
#include "tools/estimate_memory.h"
#include "tools/rank_figures.h"

#define PROG "ctrain estimate-memory --measure"

/* resident bytes now (/proc/self/statm's second field), or 0 */
static double rss_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, res = 0;
    int n = f ? fscanf(f, "%lld %lld", &size, &res) : 0;
    if (f) fclose(f);
    return n == 2 ? (double)res * (double)sysconf(_SC_PAGESIZE) : 0;
}

static double rss_peak(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : (double)ru.ru_maxrss * 1024.0;
}

static int64_t state_bytes(const ct_optimizer *opt, int n)
{
    int64_t b = 0;
    static const char *const keys[] = {"exp_avg", "exp_avg_sq"};
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            const ct_tensor *t = ct_optimizer_state(opt, i, keys[k]);
            if (t) b += ct_tensor_nbytes(t);
        }
    return b;
}

enum { M_PARAMS, M_GRADS, M_OPT, M_PEAK, M_RESERVED, M_SETUP, M_BASE, M_RSS, M_COUNT };
static const char *const M_NAMES[M_COUNT] = {"params_bytes", "grads_bytes", "optimizer_bytes", "step_peak_bytes",
                                             "step_peak_reserved_bytes", "setup_peak_reserved_bytes",
                                             "base_rss_bytes", "peak_rss_bytes"};

/* one step: forward, backward, (DDP: the gradients' bytes), AdamW, zero_grad */
static ct_status train_step(ct_accelerator *acc, const ct_model_built *model, ct_optimizer *opt,
                            const ct_param_list *pl, const int64_t *xb, const int64_t *yb, int64_t B, int64_t T,
                            int64_t *grad_bytes)
{
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T), xb);
        ct_tensor *y = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T), yb);
        CT_ACCUMULATE(acc) {
            ct_tensor *l = x && y ? ct_model_built_loss(model, x, y) : NULL;
            st = !l ? ct_last_status() : ct_accelerator_backward(acc, l);
            if (!st && grad_bytes) {
                *grad_bytes = 0;
                for (int i = 0; i < pl->n; i++)
                    if (pl->tensors[i]->grad) *grad_bytes += ct_tensor_nbytes(pl->tensors[i]->grad);
            }
            if (!st) st = ct_optimizer_step(opt);
            ct_optimizer_zero_grad(opt);
        }
    }
    return st;
}

int ct_memory_measure_run(const ct_memory_measure *m)
{
    const ct_memory_setup *s = &m->setup;
    const char *const block[] = {ct_model_shape_block_class(&s->model)};
    static const ct_shard_strategy strat[] = {CT_SHARD_NO_SHARD, CT_SHARD_OPTIMIZER, CT_SHARD_GRAD_OP, CT_SHARD_FULL};
    double v[M_COUNT] = {0};
    v[M_BASE] = rss_now();
    ct_accelerator_config cfg = {
        .mixed_precision = s->precision == CT_DTYPE_BF16  ? "bf16"
                           : s->precision == CT_DTYPE_F16 ? "fp16"
                           : s->precision == CT_DTYPE_F8_E4M3 ? "fp8"
                                                              : "no",
        .shard = {.strategy = strat[s->strategy],
                  .wrap = {.policy = CT_WRAP_TRANSFORMER, .classes = block, .nclasses = 1},
                  .offload_optimizer = s->offload},
    };
    ct_accelerator *acc = ct_accelerator_new(&cfg);
    if (!acc) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        return 1;
    }
    const int rank = ct_accelerator_process_index(acc), world = ct_accelerator_num_processes(acc);
    const int64_t B = s->batch, T = s->seq, V = ct_model_shape_vocab(&s->model);
    int status = 1;
    ct_model_built model = {0};
    ct_optimizer *opt = NULL;
    ct_param_list pl = {0};
    bool have_pl = false;
    int64_t *xb = malloc((size_t)(2 * B * T) * sizeof *xb), *yb = xb ? xb + B * T : NULL;
    const char *what = "out of memory for the tokens";
    if (!xb) goto fail;
    ct_set_seed(1337);
    what = s->model.kind == CT_MODEL_LLAMA ? "ct_llama_new" : "ct_gpt_new";
    if (ct_model_shape_build(&s->model, T, &model)) goto fail;
    what = "ct_module_named_tensors";
    if (ct_module_named_tensors(model.module, false, &pl)) goto fail;
    have_pl = true;
    what = "AdamW";
    if (!(opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 1e-4, .weight_decay = 0.1}))) goto fail;
    ct_storage_peak_reset();
    what = "ct_accelerator_prepare";
    if (ct_accelerator_prepare(acc, model.module, opt, NULL, NULL)) goto fail;
    v[M_SETUP] = (double)ct_storage_peak_reserved_bytes();
    ct_rng rng;
    ct_rng_init(&rng, 1337 + (uint64_t)rank);
    uint32_t *raw = (uint32_t *)malloc((size_t)(B * (T + 1)) * sizeof *raw);
    what = "out of memory for the tokens";
    if (!raw) goto fail;
    ct_shard *shard = ct_accelerator_shard(acc);
    what = "a training step";
    for (int step = 0; step < m->steps; step++) {
        ct_rng_u32(&rng, raw, B * (T + 1));
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) {
                xb[b * T + t] = raw[b * (T + 1) + t] % (uint32_t)V;
                yb[b * T + t] = raw[b * (T + 1) + t + 1] % (uint32_t)V;
            }
        int64_t gb = 0;
        ct_storage_peak_reset();
        if (train_step(acc, &model, opt, &pl, xb, yb, B, T, shard ? NULL : &gb)) {
            free(raw);
            goto fail;
        }
        /* the engine resets the peak counters itself after each step: read its copy */
        ct_shard_stats ss = shard ? ct_shard_stats_get(shard) : (ct_shard_stats){0};
        double peak = shard ? (double)ss.memory.step_peak : (double)ct_storage_peak_bytes();
        double res = shard ? (double)ss.memory.step_peak_reserved : (double)ct_storage_peak_reserved_bytes();
        if (step > 0 || m->steps == 1) v[M_PEAK] = fmax(v[M_PEAK], peak), v[M_RESERVED] = fmax(v[M_RESERVED], res);
        if (shard) {
            v[M_PARAMS] = (double)ss.memory.params;
            v[M_GRADS] = (double)ss.memory.grads;
            v[M_OPT] = (double)(ss.memory.optimizer + ss.memory.master);
        } else {
            v[M_PARAMS] = 0;
            for (int i = 0; i < pl.n; i++) v[M_PARAMS] += (double)ct_tensor_nbytes(pl.tensors[i]);
            v[M_GRADS] = (double)gb;
            v[M_OPT] = (double)state_bytes(opt, pl.n);
        }
    }
    free(raw);
    v[M_RSS] = rss_peak();
    what = "reducing the figures over the ranks";
    if (ct_rank_figures_reduce(ct_accelerator_pg(acc), v, M_COUNT, CT_REDUCE_MAX)) goto fail;
    if (rank == 0) {
        ct_memory_setup es = *s;
        es.world = world;
        ct_memory_estimate e;
        if (ct_memory_estimate_compute(&es, &e)) {
            fprintf(stderr, PROG ": %s\n", ct_last_error());
            goto out;
        }
        char label[32];
        ct_memory_strategy_label(s->strategy, s->offload, label, sizeof label);
        const char *prec = cfg.mixed_precision;
        printf("MEASURED model=%s strategy=%s mixed_precision=%s num_processes=%d batch_size=%lld seq_len=%lld "
               "steps=%d",
               m->model_name, label, prec, world, (long long)B, (long long)T, m->steps);
        for (int k = 0; k < M_COUNT; k++) printf(" %s=%.0f", M_NAMES[k], v[k]);
        printf("\n");
        const double est[] = {(double)e.params, (double)e.grads, (double)e.optimizer, (double)e.total,
                              (double)e.rss};
        const double got[] = {v[M_PARAMS], v[M_GRADS], v[M_OPT], v[M_PEAK], v[M_RSS]};
        const char *const rows[] = {"parameters", "gradients", "optimizer", "step peak (live)", "peak RSS"};
        printf("%-18s %14s %14s %8s\n", "", "estimated MiB", "measured MiB", "ratio");
        for (int k = 0; k < 5; k++)
            printf("%-18s %14.2f %14.2f %8.3f\n", rows[k], est[k] / 1048576.0, got[k] / 1048576.0,
                   got[k] > 0 ? est[k] / got[k] : NAN);
        fflush(stdout);
    }
    status = 0;
    goto out;
fail:
    fprintf(stderr, PROG " (rank %d of %d): %s failed: %s\n", rank, world, what, ct_last_error());
out:
    ct_accelerator_free(acc); /* first: it gives the model its parameters back */
    if (have_pl) ct_param_list_free(&pl);
    ct_optimizer_free(opt);
    ct_module_free(model.module);
    free(xb);
    ct_frame_reset_root();
    return status;
}
