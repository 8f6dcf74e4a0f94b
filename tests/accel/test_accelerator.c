/* Tests for accel/accelerator.c: the four-call loop on one process, gradient
 * accumulation, and DDP on 2 and 4 fork()ed ranks against one process with the
 * same global batch. */
#include <criterion/criterion.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "accel/accelerator.h"
#include "autograd/autograd.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "core/philox.h"
#include "nn/layers.h"
#include "tests/env_ranks.h"
#include "tests/tmpdir.h"

/* ---- a regression problem: items (x (6,), y (1,)), a two-layer MLP --------------- */

#define NX 6
#define NITEMS 96

typedef struct reg_ds {
    ct_dataset base;
    int64_t n; /* <= NITEMS */
    float x[NITEMS][NX], y[NITEMS];
} reg_ds;

static int64_t reg_len(const ct_dataset *ds) { return ((const reg_ds *)ds)->n; }

static ct_status reg_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out, int64_t row)
{
    const reg_ds *d = (const reg_ds *)ds;
    memcpy(ct_dataset_row(out[0], row), d->x[i], sizeof d->x[i]);
    memcpy(ct_dataset_row(out[1], row), &d->y[i], sizeof d->y[i]);
    return CT_OK;
}

static void reg_free(ct_dataset *ds) { free(ds); }
static const ct_dataset_vtable reg_vtable = {"regression", reg_len, reg_get, reg_free};

static ct_dataset *reg_new(void)
{
    reg_ds *d = calloc(1, sizeof *d);
    d->n = NITEMS;
    ct_rng r;
    ct_rng_init(&r, 5);
    ct_rng_uniform_f32(&r, &d->x[0][0], NITEMS * NX, -1, 1);
    for (int i = 0; i < NITEMS; i++) d->y[i] = d->x[i][0] * d->x[i][1] + sinf(2 * d->x[i][2]) - d->x[i][5];
    ct_dataset_slot slots[2] = {{CT_DTYPE_F32, 1, {NX}}, {CT_DTYPE_F32, 1, {1}}};
    if (ct_dataset_init(&d->base, &reg_vtable, 2, slots)) {
        free(d);
        return NULL;
    }
    return &d->base;
}

typedef struct mlp {
    ct_module base;
    ct_linear_layer *fc1, *fc2;
} mlp;

static mlp *mlp_new(uint64_t seed)
{
    ct_set_seed(seed);
    mlp *m = ct_module_alloc(sizeof *m, "MLP", NULL);
    m->fc1 = ct_linear_layer_new(NX, 16, true, 0.4);
    m->fc2 = ct_linear_layer_new(16, 1, true, 0.2);
    ct_module_add_child(&m->base, "fc1", &m->fc1->base);
    ct_module_add_child(&m->base, "fc2", &m->fc2->base);
    return m;
}

static ct_tensor *mlp_loss(mlp *m, ct_tensor *x, ct_tensor *y)
{
    ct_tensor *d = ct_sub(ct_linear_layer_forward(m->fc2, ct_gelu(ct_linear_layer_forward(m->fc1, x))), y);
    return ct_mean_all(ct_mul(d, d));
}

/* Everything a training run needs, made the same way on every rank. */
typedef struct run {
    ct_dataset *ds;
    mlp *m;
    ct_param_list params;
    ct_optimizer *opt;
    ct_loader *loader;
    ct_scheduler *sched;
} run;

static void run_init(run *r, int64_t batch, uint64_t model_seed)
{
    r->ds = reg_new();
    r->m = mlp_new(model_seed);
    ct_module_named_tensors(&r->m->base, false, &r->params);
    r->opt = ct_adamw_new(r->params.n, r->params.tensors, &(ct_adamw_config){.lr = 1e-2, .weight_decay = 0.1});
    r->loader = ct_loader_new(r->ds, &(ct_loader_config){.batch_size = batch, .shuffle = true, .seed = 3});
    r->sched = ct_scheduler_new(r->opt, &(ct_lr_schedule){.decay = CT_LR_LINEAR, .warmup_steps = 2,
                                                            .total_steps = 20, .min_lr = 1e-3});
    cr_assert(r->opt && r->loader && r->sched, "%s", ct_last_error());
}

static void run_free(run *r)
{
    ct_scheduler_free(r->sched);
    ct_loader_free(r->loader);
    ct_optimizer_free(r->opt);
    ct_param_list_free(&r->params);
    ct_module_free(&r->m->base);
    ct_dataset_free(r->ds);
}

/* steps optimizer steps of the four-call loop (micro-steps inside CT_ACCUMULATE). */
static ct_status train(ct_accelerator *acc, run *r, int steps)
{
    ct_status st = CT_OK;
    while (!st && ct_optimizer_step_count(r->opt) < steps) {
        ct_tensor *x, *y;
        ct_loader_result res = ct_loader_next(r->loader, &x, &y);
        if (res == CT_LOADER_ERROR) return ct_last_status();
        if (res == CT_LOADER_END) continue;
        CT_FRAME {
            CT_ACCUMULATE(acc) {
                ct_tensor *loss = mlp_loss(r->m, x, y);
                st = loss ? ct_accelerator_backward(acc, loss) : ct_last_status();
                if (!st) st = ct_optimizer_step(r->opt);
                if (!st) st = ct_scheduler_step(r->sched);
                ct_optimizer_zero_grad(r->opt);
            }
        }
    }
    return st;
}

/* steps steps of the plain loop, no Accelerator (the reference), crossing epochs. */
static void plain_steps(run *r, int steps)
{
    for (int s = 0; s < steps; s++) CT_FRAME {
        ct_tensor *x, *y;
        ct_loader_result res = ct_loader_next(r->loader, &x, &y);
        if (res == CT_LOADER_END) res = ct_loader_next(r->loader, &x, &y); /* the next epoch */
        cr_assert_eq(res, CT_LOADER_BATCH);
        cr_assert_eq(ct_backward(mlp_loss(r->m, x, y)), CT_OK);
        cr_assert_eq(ct_optimizer_step(r->opt), CT_OK);
        cr_assert_eq(ct_scheduler_step(r->sched), CT_OK);
        ct_optimizer_zero_grad(r->opt);
    }
}

static double max_rel_diff(const ct_param_list *a, const float *b)
{
    double num = 0, den = 0;
    for (int i = 0, off = 0; i < a->n; i++) {
        const float *p = ct_tensor_data(a->tensors[i]);
        for (int64_t k = 0; k < ct_tensor_numel(a->tensors[i]); k++, off++) {
            num = fmax(num, fabs((double)p[k] - b[off]));
            den = fmax(den, fabs((double)b[off]));
        }
    }
    return num / den;
}

static int64_t params_numel(const ct_param_list *l)
{
    int64_t n = 0;
    for (int i = 0; i < l->n; i++) n += ct_tensor_numel(l->tensors[i]);
    return n;
}

static float *params_copy(const ct_param_list *l)
{
    float *out = malloc((size_t)params_numel(l) * sizeof *out), *o = out;
    for (int i = 0; i < l->n; i++) {
        memcpy(o, ct_tensor_data(l->tensors[i]), ct_tensor_nbytes(l->tensors[i]));
        o += ct_tensor_numel(l->tensors[i]);
    }
    return out;
}

/* ---- one process ------------------------------------------------------------------ */

static void clear_launch_env(void)
{
    const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                          "CTRAIN_GRADIENT_ACCUMULATION_STEPS", "CTRAIN_MIXED_PRECISION"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

Test(accelerator, one_process_is_a_plain_loop)
{
    clear_launch_env();
    CT_FRAME {
        run a, b;
        run_init(&a, 8, 11);
        run_init(&b, 8, 11);
        ct_accelerator *acc = ct_accelerator_new(NULL);
        cr_assert_not_null(acc, "%s", ct_last_error());
        cr_assert_eq(ct_accelerator_num_processes(acc), 1);
        cr_assert(ct_accelerator_is_main_process(acc) && ct_accelerator_is_local_main_process(acc));
        cr_assert_eq(ct_accelerator_prepare(acc, &a.m->base, a.opt, a.loader, a.sched), CT_OK, "%s", ct_last_error());
        cr_assert_null(ct_accelerator_ddp(acc), "one process: no DDP");
        cr_assert_eq(train(acc, &a, 6), CT_OK, "%s", ct_last_error());
        plain_steps(&b, 6); /* the same loop without the Accelerator */
        float *want = params_copy(&b.params);
        cr_assert_eq(max_rel_diff(&a.params, want), 0.0, "bit-identical to the plain loop");
        free(want);
        cr_assert_eq(ct_accelerator_prepare(acc, NULL, NULL, NULL, NULL), CT_ERR_INVALID);
        ct_accelerator_free(acc);
        run_free(&a);
        run_free(&b);
    }
}

/* The safety net: a step after which no parameter can have changed although backward
 * ran (here the loop drops the gradients before the step) is an error that says so,
 * not a run that silently trains nothing. */
Test(accelerator, a_step_that_would_change_nothing_is_an_error)
{
    clear_launch_env();
    CT_FRAME {
        run a;
        run_init(&a, 8, 11);
        ct_accelerator *acc = ct_accelerator_new(NULL);
        cr_assert_eq(ct_accelerator_prepare(acc, &a.m->base, a.opt, a.loader, NULL), CT_OK, "%s", ct_last_error());
        ct_tensor *x, *y;
        cr_assert_eq(ct_loader_next(a.loader, &x, &y), CT_LOADER_BATCH);
        cr_assert_eq(ct_accelerator_backward(acc, mlp_loss(a.m, x, y)), CT_OK, "%s", ct_last_error());
        ct_optimizer_zero_grad(a.opt);
        cr_assert_neq(ct_optimizer_step(a.opt), CT_OK);
        cr_assert(strstr(ct_last_error(), "would change no parameter"), "%s", ct_last_error());
        /* a step with its gradients goes through */
        cr_assert_eq(ct_accelerator_backward(acc, mlp_loss(a.m, x, y)), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_step(a.opt), CT_OK, "%s", ct_last_error());
        ct_accelerator_free(acc);
        run_free(&a);
    }
}

/* K micro-steps of batch b = one step of batch K*b: steps are skipped (and the
 * scheduler held) on the micro-steps, and the loss is divided by K. */
Test(accelerator, gradient_accumulation_equals_the_large_batch)
{
    clear_launch_env();
    CT_FRAME {
        run a, b;
        run_init(&a, 6, 21);
        run_init(&b, 24, 21);
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.gradient_accumulation_steps = 4});
        cr_assert_not_null(acc, "%s", ct_last_error());
        cr_assert_eq(ct_accelerator_gradient_accumulation_steps(acc), 4);
        cr_assert_eq(ct_accelerator_prepare(acc, &a.m->base, a.opt, a.loader, a.sched), CT_OK);
        int skipped = 0, synced = 0;
        for (int micro = 0; micro < 12; micro++) CT_FRAME {
            ct_tensor *x, *y;
            cr_assert_eq(ct_loader_next(a.loader, &x, &y), CT_LOADER_BATCH);
            CT_ACCUMULATE(acc) {
                cr_assert_eq(ct_accelerator_sync_gradients(acc), micro % 4 == 3, "micro-step %d", micro);
                cr_assert_eq(ct_accelerator_backward(acc, mlp_loss(a.m, x, y)), CT_OK);
                cr_assert_eq(ct_optimizer_step(a.opt), CT_OK);
                cr_assert_eq(ct_scheduler_step(a.sched), CT_OK);
                skipped += ct_accelerator_step_was_skipped(acc);
                synced += ct_accelerator_sync_gradients(acc);
                ct_optimizer_zero_grad(a.opt);
            }
        }
        cr_assert_eq(skipped, 9);
        cr_assert_eq(synced, 3);
        cr_assert_eq(ct_optimizer_step_count(a.opt), 3);
        cr_assert_eq(ct_scheduler_position(a.sched), 3, "once per optimizer step");
        plain_steps(&b, 3);
        float *want = params_copy(&b.params);
        double e = max_rel_diff(&a.params, want);
        cr_assert_leq(e, 1e-5, "accumulated vs large batch: %g", e);
        free(want);
        ct_accelerator_free(acc);
        run_free(&a);
        run_free(&b);
    }
}

/* The last batch of the loader synchronises even mid-accumulation. */
Test(accelerator, end_of_loader_synchronises)
{
    clear_launch_env();
    CT_FRAME {
        run a;
        run_init(&a, 40, 3); /* 96 items: batches of 40, 40, 16 */
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.gradient_accumulation_steps = 2});
        cr_assert_eq(ct_accelerator_prepare(acc, &a.m->base, a.opt, a.loader, a.sched), CT_OK);
        bool want[3] = {false, true, true}, got[3];
        for (int i = 0; i < 3; i++) CT_FRAME {
            ct_tensor *x, *y;
            cr_assert_eq(ct_loader_next(a.loader, &x, &y), CT_LOADER_BATCH);
            CT_ACCUMULATE(acc) got[i] = ct_accelerator_sync_gradients(acc);
        }
        for (int i = 0; i < 3; i++) cr_assert_eq(got[i], want[i], "batch %d", i);
        ct_accelerator_free(acc);
        run_free(&a);
    }
}

Test(accelerator, bad_settings_name_key_and_value)
{
    clear_launch_env();
    cr_assert_null(ct_accelerator_new(&(ct_accelerator_config){.gradient_accumulation_steps = -2}));
    cr_assert(strstr(ct_last_error(), "gradient_accumulation_steps = -2"), "%s", ct_last_error());
    setenv("CTRAIN_GRADIENT_ACCUMULATION_STEPS", "two", 1);
    cr_assert_null(ct_accelerator_new(NULL));
    cr_assert(strstr(ct_last_error(), "CTRAIN_GRADIENT_ACCUMULATION_STEPS='two'"), "%s", ct_last_error());
    unsetenv("CTRAIN_GRADIENT_ACCUMULATION_STEPS");
    cr_assert_null(ct_accelerator_new(&(ct_accelerator_config){.mixed_precision = "fp12"}));
    cr_assert(strstr(ct_last_error(), "mixed_precision = 'fp12'") && strstr(ct_last_error(), "bf16"), "%s",
              ct_last_error());
    setenv("RANK", "1", 1); /* half a launch environment */
    cr_assert_null(ct_accelerator_new(NULL));
    cr_assert(strstr(ct_last_error(), "WORLD_SIZE"), "%s", ct_last_error());
    unsetenv("RANK");
}

/* ---- several ranks: fork()ed children with the launcher's variables ---------------- */

typedef struct ddp_case {
    int64_t batch; /* per rank per micro-step */
    int K;         /* accumulation steps */
    int steps;
} ddp_case;

/* Trains; rank 0 writes its parameters to dir/params.bin. */
static int ddp_rank(int rank, int world, const char *dir, void *ctx)
{
    const ddp_case *c = ctx;
    (void)world;
    int rc = 0;
    CT_FRAME {
        run r;
        r.ds = reg_new();
        /* a different seed per rank: prepare must broadcast rank 0's weights */
        r.m = mlp_new(100 + (uint64_t)rank);
        ct_module_named_tensors(&r.m->base, false, &r.params);
        r.opt = ct_adamw_new(r.params.n, r.params.tensors, &(ct_adamw_config){.lr = 1e-2, .weight_decay = 0.1});
        r.loader = ct_loader_new(r.ds, &(ct_loader_config){.batch_size = c->batch, .shuffle = true, .seed = 3});
        r.sched = ct_scheduler_new(r.opt, &(ct_lr_schedule){.decay = CT_LR_LINEAR, .warmup_steps = 2,
                                                               .total_steps = 20, .min_lr = 1e-3});
        ct_accelerator *acc =
            ct_accelerator_new(&(ct_accelerator_config){.gradient_accumulation_steps = c->K,
                                                        .ddp = {.first_bucket_cap_mb = 0.0001, .bucket_cap_mb = 0.0002}});
        if (!acc || ct_accelerator_prepare(acc, &r.m->base, r.opt, r.loader, r.sched) || train(acc, &r, c->steps)) {
            fprintf(stderr, "rank %d: %s\n", rank, ct_last_error());
            rc = 1;
        }
        if (!rc && rank == 0) {
            char path[512];
            snprintf(path, sizeof path, "%s/params.bin", dir);
            FILE *f = fopen(path, "wb");
            float *p = params_copy(&r.params);
            rc = !f || fwrite(p, sizeof(float), (size_t)params_numel(&r.params), f) != (size_t)params_numel(&r.params);
            if (f) fclose(f);
            free(p);
        }
        if (!rc && ct_accelerator_ddp(acc) && ct_ddp_stats_get(ct_accelerator_ddp(acc)).buckets < 2) {
            fprintf(stderr, "rank %d: expected several buckets\n", rank);
            rc = 1;
        }
        ct_accelerator_free(acc);
        run_free(&r);
    }
    return rc;
}

/* DDP over world ranks, batch b each (K micro-steps), against one process with batch
 * world * K * b: parameters after 5 AdamW steps within 1e-5 relative. */
static void ddp_matches_one_process(int world, int K)
{
    clear_launch_env();
    make_tmpdir_with("/tmp/ct_accel_");
    const char *dir = tmpdir;
    ddp_case c = {.batch = 4, .K = K, .steps = 5};
    run_env_ranks(world, ddp_rank, dir, &c, 60);
    CT_FRAME {
        run one;
        run_init(&one, c.batch * world * K, 100);
        plain_steps(&one, c.steps);
        int64_t n = params_numel(&one.params);
        float *got = malloc((size_t)n * sizeof *got);
        FILE *f = fopen(path_of("params.bin"), "rb");
        cr_assert(f && fread(got, sizeof(float), (size_t)n, f) == (size_t)n);
        fclose(f);
        /* compare the other way round: rank 0's params as the list, one process's as reference */
        float *want = params_copy(&one.params);
        for (int i = 0, off = 0; i < one.params.n; i++) {
            memcpy(ct_tensor_data(one.params.tensors[i]), got + off, ct_tensor_nbytes(one.params.tensors[i]));
            off += (int)ct_tensor_numel(one.params.tensors[i]);
        }
        double e = max_rel_diff(&one.params, want);
        cr_assert_leq(e, 1e-5, "%d ranks, K %d: max relative difference %g", world, K, e);
        free(got);
        free(want);
        run_free(&one);
    }
    remove_tmpdir();
}

Test(accelerator, ddp_2_ranks_match_one_process, .timeout = 60) { ddp_matches_one_process(2, 1); }
Test(accelerator, ddp_4_ranks_match_one_process, .timeout = 90) { ddp_matches_one_process(4, 1); }
Test(accelerator, ddp_with_accumulation_matches_one_process, .timeout = 60) { ddp_matches_one_process(2, 3); }

/* gather, gather_for_metrics, reduce, pad_across_processes, main_process_first. */
static int collectives_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)ctx;
    int bad = 0;
#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "rank %d: %s:%d: %s (%s)\n", rank, __FILE__, __LINE__, #cond, ct_last_error()); \
            bad = 1;                                                                            \
        }                                                                                       \
    } while (0)
    CT_FRAME {
        ct_accelerator *acc = ct_accelerator_new(NULL);
        CHECK(acc && ct_accelerator_process_index(acc) == rank && ct_accelerator_num_processes(acc) == world);
        /* gather: rank r contributes rows {10r, 10r + 1} */
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(2, 1), (float[]){10.0f * rank, 10.0f * rank + 1});
        ct_tensor *g = ct_accelerator_gather(acc, t);
        CHECK(g && g->shape[0] == 2 * world);
        for (int r = 0; g && r < world; r++)
            CHECK(ct_tensor_get(g, (int64_t[]){2 * r, 0}) == 10.0 * r && ct_tensor_get(g, (int64_t[]){2 * r + 1, 0}) == 10.0 * r + 1);
        /* reduce: sum and mean of (rank + 1) */
        ct_tensor *s = ct_accelerator_reduce(acc, ct_tensor_scalar(CT_DTYPE_F64, rank + 1), false);
        ct_tensor *m = ct_accelerator_reduce(acc, ct_tensor_scalar(CT_DTYPE_F64, rank + 1), true);
        CHECK(s && m && ct_tensor_item(s) == world * (world + 1) / 2.0 && fabs(ct_tensor_item(m) - (world + 1) / 2.0) < 1e-12);
        /* pad: rank r has r + 1 elements; all padded to world with -1 */
        ct_tensor *v = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(rank + 1), 7);
        ct_tensor *p = ct_accelerator_pad_across_processes(acc, v, 0, -1, false);
        ct_tensor *pf = ct_accelerator_pad_across_processes(acc, v, 0, -1, true);
        CHECK(p && pf && p->shape[0] == world && pf->shape[0] == world);
        for (int i = 0; p && pf && i < world; i++) {
            CHECK(ct_tensor_get(p, (int64_t[]){i}) == (i <= rank ? 7 : -1));
            CHECK(ct_tensor_get(pf, (int64_t[]){i}) == (i >= world - 1 - rank ? 7 : -1));
        }
        /* gather_for_metrics: 95 items over 3 ranks in batches of 4 with even batches
         * (one row of padding): the padded rows are dropped, so every item counts once */
        ct_dataset *ds = reg_new();
        ((reg_ds *)ds)->n = NITEMS - 1;
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 4});
        CHECK(ct_accelerator_prepare(acc, NULL, NULL, l, NULL) == CT_OK);
        int64_t seen = 0;
        ct_tensor *x, *y;
        while (ct_loader_next(l, &x, &y) == CT_LOADER_BATCH) CT_FRAME {
            ct_tensor *all = ct_accelerator_gather_for_metrics(acc, y);
            CHECK(all != NULL);
            if (all) seen += all->shape[0];
        }
        CHECK(seen == NITEMS - 1);
        ct_loader_free(l);
        ct_dataset_free(ds);
        /* main_process_first: rank 0 writes a file the others then read */
        char path[512];
        snprintf(path, sizeof path, "%s/first.txt", dir);
        CT_MAIN_PROCESS_FIRST(acc) {
            if (rank == 0) {
                FILE *f = fopen(path, "w");
                CHECK(f != NULL);
                if (f) fputs("ready", f), fclose(f);
            } else {
                CHECK(access(path, R_OK) == 0);
            }
        }
        CHECK(ct_accelerator_wait_for_everyone(acc) == CT_OK);
        ct_accelerator_free(acc);
    }
#undef CHECK
    return bad;
}

Test(accelerator, collectives_on_3_ranks, .timeout = 60)
{
    clear_launch_env();
    make_tmpdir_with("/tmp/ct_accel_");
    const char *dir = tmpdir;
    run_env_ranks(3, collectives_rank, dir, NULL, 60);
    remove_tmpdir();
}
