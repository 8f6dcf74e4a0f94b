/* Tests for parallel/ddp.c on fork()ed ranks: every gradient is checked against the mean
 * over ranks computed in each rank from the inputs of all of them. The model is
 * y = x W + b followed by sum(y * c), so dW = x^T c and db = column sums of c:
 * exact in f32 for the small integers used here. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops_math.h"
#include "parallel/ddp.h"
#include "nn/layers.h"
#include "tests/dist/ranks.h"

#define NIN 5
#define NOUT 3
#define ROWS 4

typedef struct two_layers {
    ct_module base;
    ct_linear_layer *a, *b;
} two_layers;

static two_layers *model_new(bool extra)
{
    two_layers *m = ct_module_alloc(sizeof *m, "Two", NULL);
    m->a = ct_linear_layer_new(NIN, NOUT, true, 0.5);
    m->b = ct_linear_layer_new(NOUT, NOUT, !extra, 0.5); /* extra: a different parameter list */
    ct_module_add_child(&m->base, "a", &m->a->base);
    ct_module_add_child(&m->base, "b", &m->b->base);
    return m;
}

/* rank r's input x (ROWS, NIN) and weights c (ROWS, NOUT): small integers */
static float xin(int r, int i, int k) { return (float)((r + 1) * (i + 2 * k) % 7 - 3); }
static float cw(int r, int i, int j) { return (float)((r + 3 * i + j) % 5 - 2); }

static ct_tensor *input_of(int r)
{
    float v[ROWS * NIN];
    for (int i = 0; i < ROWS; i++)
        for (int k = 0; k < NIN; k++) v[i * NIN + k] = xin(r, i, k);
    return ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(ROWS, NIN), v);
}

static ct_tensor *weights_of(int r)
{
    float v[ROWS * NOUT];
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < NOUT; j++) v[i * NOUT + j] = cw(r, i, j);
    return ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(ROWS, NOUT), v);
}

/* sum(a(x) * c); with use_b also b's output enters (b's params get gradients) */
static ct_tensor *loss_of(two_layers *m, int r, bool use_b)
{
    ct_tensor *y = ct_linear_layer_forward(m->a, input_of(r));
    if (use_b) y = ct_add(y, ct_mul_scalar(ct_linear_layer_forward(m->b, y), 0.0));
    return ct_sum_all(ct_mul(y, weights_of(r)));
}

/* max |a.weight.grad - mean over ranks of x_r^T c_r| (times passes) and the same for the bias */
static double grad_error(two_layers *m, int world, double passes)
{
    const float *gw = ct_tensor_data(m->a->weight->grad), *gb = ct_tensor_data(m->a->bias->grad);
    double err = 0;
    for (int k = 0; k < NIN; k++)
        for (int j = 0; j < NOUT; j++) {
            double want = 0;
            for (int r = 0; r < world; r++)
                for (int i = 0; i < ROWS; i++) want += (double)xin(r, i, k) * cw(r, i, j);
            err = fmax(err, fabs(gw[k * NOUT + j] - passes * want / world));
        }
    for (int j = 0; j < NOUT; j++) {
        double want = 0;
        for (int r = 0; r < world; r++)
            for (int i = 0; i < ROWS; i++) want += cw(r, i, j);
        err = fmax(err, fabs(gb[j] - passes * want / world));
    }
    return err;
}

typedef struct ddp_arg {
    ct_dtype compress;
    int mode; /* 0 plain, 1 no_sync micro-step first, 2 two synchronised backwards, 3 rank 1 skips b,
               * 4 one bucket for the whole model */
} ddp_arg;

static int ddp_rank(rank_ctx *c)
{
    const ddp_arg *a = c->arg;
    int rc = 0;
    ct_pg *g = rank_pg(c, 20, NULL);
    if (!g) return 1;
    CT_FRAME {
        ct_set_seed(50 + (uint64_t)c->rank); /* different initial weights: DDP broadcasts rank 0's */
        two_layers *m = model_new(false);
        double cap = a->mode == 4 ? 1000 : 1e-5;
        ct_ddp *d = ct_ddp_new(g, &m->base, &(ct_ddp_config){.compress = a->compress, .first_bucket_cap_mb = cap,
                                                              .bucket_cap_mb = cap});
        if (!d) {
            report(c, "rank %d: %s", c->rank, ct_last_error());
            rc = 1;
        } else {
            double passes = 1;
            if (a->mode == 1) { /* a local micro-step, then a synchronised one */
                ct_ddp_set_sync(d, false);
                ct_backward(loss_of(m, c->rank, true));
                ct_ddp_set_sync(d, true);
                passes = 2;
            }
            if (a->mode == 2) { /* backward twice before the step: the reductions restart */
                ct_backward(loss_of(m, c->rank, true));
                passes = 2;
            }
            bool use_b = !(a->mode == 3 && c->rank == 1);
            ct_status st = ct_backward(loss_of(m, c->rank, use_b));
            if (!st) st = ct_ddp_finish(d);
            if (st) {
                report(c, "rank %d: %s", c->rank, ct_last_error());
                rc = 1;
            } else {
                double tol = a->compress == CT_DTYPE_BF16 ? 0.25 : 1e-5; /* bf16: 8 bits for values up to ~40 */
                double e = grad_error(m, c->world, passes);
                if (!(e <= tol)) {
                    report(c, "rank %d: gradient off by %g (tolerance %g)", c->rank, e, tol);
                    rc = 1;
                }
                /* b took part on rank 0 only in mode 3: its gradient (0 from the * 0 branch) is
                 * still reduced, and exists on every rank */
                if (!m->b->weight->grad) {
                    report(c, "rank %d: b.weight has no gradient after finish", c->rank);
                    rc = 1;
                }
                ct_ddp_stats s = ct_ddp_stats_get(d);
                if (s.steps != 1 || s.buckets < (a->mode == 4 ? 1 : 3) || s.comm_s < 0 || s.exposed_s < 0 ||
                    s.exposed_s > s.comm_s + 1e-9) {
                    report(c, "rank %d: stats steps %lld buckets %d comm %g exposed %g", c->rank, (long long)s.steps,
                           s.buckets, s.comm_s, s.exposed_s);
                    rc = 1;
                }
                /* one bucket fills as backward ends: nothing can hide its reduction, so
                 * all of it is exposed, whether the comm thread or this thread (the
                 * direct shared-memory allreduce, inside the submit) reduced it */
                if (a->mode == 4 && !(s.buckets == 1 && s.comm_s > 0 && s.exposed_s >= 0.9 * s.comm_s)) {
                    report(c, "rank %d: one bucket: buckets %d, comm %g s, exposed %g s (expected all of it)",
                           c->rank, s.buckets, s.comm_s, s.exposed_s);
                    rc = 1;
                }
            }
        }
        ct_ddp_free(d);
        ct_module_free(&m->base);
    }
    ct_pg_free(g);
    return rc;
}

static void run_case(int world, ct_dtype compress, int mode)
{
    rank_result res[MAX_RANKS];
    ddp_arg a = {compress, mode};
    run_ranks(world, ddp_rank, &a, res, 30);
    expect_all_ok(res, world);
}

Test(parallel_ddp, gradients_are_the_mean_over_ranks, .timeout = 60)
{
    run_case(2, 0, 0);
    run_case(3, 0, 0);
}

Test(parallel_ddp, bf16_compression_is_close, .timeout = 30) { run_case(2, CT_DTYPE_BF16, 0); }
Test(parallel_ddp, no_sync_micro_steps_accumulate_locally, .timeout = 30) { run_case(2, 0, 1); }
Test(parallel_ddp, a_second_backward_before_finish_restarts_the_round, .timeout = 30) { run_case(2, 0, 2); }
Test(parallel_ddp, a_parameter_one_rank_did_not_use, .timeout = 30) { run_case(2, 0, 3); }
Test(parallel_ddp, one_bucket_is_all_exposed, .timeout = 30) { run_case(2, 0, 4); }

/* Rank 1 wraps a model without b's bias: every rank fails, naming the mismatch. */
static int mismatch_rank(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, NULL);
    if (!g) return 1;
    int rc = 0;
    CT_FRAME {
        two_layers *m = model_new(c->rank == 1);
        ct_ddp *d = ct_ddp_new(g, &m->base, NULL);
        if (d || !strstr(ct_last_error(), "different models")) {
            report(c, "rank %d: expected a 'different models' error, got %s", c->rank, d ? "a handle" : ct_last_error());
            rc = 1;
        }
        ct_ddp_free(d);
        ct_module_free(&m->base);
    }
    ct_pg_free(g);
    return rc;
}

Test(parallel_ddp, different_models_fail_on_every_rank, .timeout = 30)
{
    rank_result res[MAX_RANKS];
    run_ranks(2, mismatch_rank, NULL, res, 20);
    expect_all_ok(res, 2);
}

Test(parallel_ddp, bad_config)
{
    CT_FRAME {
        ct_pg *g = ct_pg_new(&(ct_pg_config){.world_size = 1});
        two_layers *m = model_new(false);
        cr_assert_null(ct_ddp_new(g, &m->base, &(ct_ddp_config){.compress = CT_DTYPE_I32}));
        cr_assert(strstr(ct_last_error(), "compress = i32"), "%s", ct_last_error());
        cr_assert_null(ct_ddp_new(g, &m->base, &(ct_ddp_config){.bucket_cap_mb = -1}));
        cr_assert(strstr(ct_last_error(), "bucket_cap_mb = -1"), "%s", ct_last_error());
        cr_assert_null(ct_ddp_new(NULL, &m->base, NULL));
        /* one rank: DDP works and changes nothing */
        ct_ddp *d = ct_ddp_new(g, &m->base, NULL);
        cr_assert_not_null(d, "%s", ct_last_error());
        cr_assert_eq(ct_backward(loss_of(m, 0, true)), CT_OK);
        cr_assert_eq(ct_ddp_finish(d), CT_OK);
        cr_assert_leq(grad_error(m, 1, 1), 1e-5);
        ct_ddp_free(d);
        ct_module_free(&m->base);
        ct_pg_free(g);
    }
}
