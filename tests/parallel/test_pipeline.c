/* Tests for parallel/pipeline.c on fork()ed ranks. The model: L layers h' = tanh(h W + b)
 * of width W, then the mean squared error against a target; cut into stages by
 * ct_pipeline_stage_layers. Each rank checks its stage against a single-process f64
 * reference written here (forward and backward by hand over the whole batch, SGD by
 * hand): every parameter gradient after a run, the mean loss on every rank, and the
 * parameters after 3 SGD steps, for GPipe and 1F1B, 2 and 4 stages, M = 1, 4, 6
 * micro-batches (f32 against f64, within 1e-5 relative). Also: the engine's count of
 * live micro-batches against the schedule formula, the bytes it holds against the
 * shapes, the process's measured peak memory of 1F1B below GPipe's, and failures on
 * one stage (a shape mismatch, a failing forward, a different micro-batch count, a
 * rank that dies) reported on every stage well within the group timeout. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/storage.h"
#include "optim/optimizer.h"
#include "parallel/pipeline.h"
#include "tests/dist/ranks.h"

#define L 6       /* layers */
#define W 16      /* width */
#define R 8       /* rows per micro-batch */
#define MAXM 6
#define STEPS 3
#define LR 0.5
#define TOL 1e-5   /* against the same model in f32 in one process */
#define TOL64 1e-4 /* against the f64 reference (f32 rounding through 6 layers and 3 steps) */

/* ---- the model's numbers, the same in every process --------------------------------------- */

static double w_init(int l, int i, int j) { return 0.6 / sqrt(W) * sin(1.0 + 31.0 * l + 7.0 * i + 3.0 * j); }
static double b_init(int l, int j) { return 0.1 * cos(2.0 + 5.0 * l + j); }
/* row r of the whole batch (micro-batch r / R) */
static double x_at(int r, int k) { return 1.2 * sin(0.3 * r + 0.7 * k + 0.1); }
static double t_at(int r, int k) { return 0.5 * cos(0.5 * r - 0.2 * k); }

/* ---- the f64 reference: the whole batch of M*R rows in one process ------------------------- */

typedef struct ref_model {
    double w[L][W][W], b[L][W];
} ref_model;

static void ref_init(ref_model *m)
{
    for (int l = 0; l < L; l++)
        for (int j = 0; j < W; j++) {
            m->b[l][j] = b_init(l, j);
            for (int i = 0; i < W; i++) m->w[l][i][j] = w_init(l, i, j);
        }
}

/* Loss of the whole batch (mean over rows and columns) and its gradients gw, gb. */
static double ref_grad(const ref_model *m, int M, ref_model *g)
{
    int N = M * R;
    double(*h)[MAXM * R][W] = calloc(L + 1, sizeof *h); /* h[l]: input of layer l */
    double(*dh)[W] = calloc((size_t)N, sizeof *dh), (*dz)[W] = calloc((size_t)N, sizeof *dz);
    cr_assert(h && dh && dz);
    for (int r = 0; r < N; r++)
        for (int k = 0; k < W; k++) h[0][r][k] = x_at(r, k);
    for (int l = 0; l < L; l++)
        for (int r = 0; r < N; r++)
            for (int j = 0; j < W; j++) {
                double z = m->b[l][j];
                for (int i = 0; i < W; i++) z += h[l][r][i] * m->w[l][i][j];
                h[l + 1][r][j] = tanh(z);
            }
    double loss = 0;
    for (int r = 0; r < N; r++)
        for (int k = 0; k < W; k++) {
            double d = h[L][r][k] - t_at(r, k);
            loss += d * d;
            dh[r][k] = 2 * d / ((double)N * W);
        }
    loss /= (double)N * W;
    memset(g, 0, sizeof *g);
    for (int l = L - 1; l >= 0; l--) {
        for (int r = 0; r < N; r++)
            for (int j = 0; j < W; j++) dz[r][j] = dh[r][j] * (1 - h[l + 1][r][j] * h[l + 1][r][j]);
        for (int r = 0; r < N; r++)
            for (int j = 0; j < W; j++) {
                g->b[l][j] += dz[r][j];
                for (int i = 0; i < W; i++) g->w[l][i][j] += h[l][r][i] * dz[r][j];
            }
        for (int r = 0; r < N; r++)
            for (int i = 0; i < W; i++) {
                double s = 0;
                for (int j = 0; j < W; j++) s += dz[r][j] * m->w[l][i][j];
                dh[r][i] = s;
            }
    }
    free(h);
    free(dh);
    free(dz);
    return loss;
}

static void ref_sgd(ref_model *m, const ref_model *g)
{
    for (int l = 0; l < L; l++)
        for (int j = 0; j < W; j++) {
            m->b[l][j] -= LR * g->b[l][j];
            for (int i = 0; i < W; i++) m->w[l][i][j] -= LR * g->w[l][i][j];
        }
}

/* ---- one stage in ctrain ------------------------------------------------------------------ */

typedef struct stage_model {
    int first, count; /* layers */
    bool last;
    ct_tensor *w[L], *b[L]; /* owned; index = local layer */
    ct_tensor *targets[MAXM];
    int M;
    /* failure injection */
    int bad_shape_micro; /* stage 0 sends a narrower activation at this micro-batch (-1: never) */
    int fail_micro;      /* the forward fails at this micro-batch (-1: never) */
    int die_micro;       /* the process exits at this micro-batch (-1: never) */
} stage_model;

static ct_tensor *owned(ct_tensor *t) { return ct_tensor_retain(t); }

static void stage_init(stage_model *s)
{
    for (int k = 0; k < s->count; k++) {
        int l = s->first + k;
        float w[W * W], b[W];
        for (int i = 0; i < W; i++)
            for (int j = 0; j < W; j++) w[i * W + j] = (float)w_init(l, i, j);
        for (int j = 0; j < W; j++) b[j] = (float)b_init(l, j);
        CT_FRAME {
            if (!s->w[k]) {
                s->w[k] = owned(ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(W, W), w));
                s->b[k] = owned(ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(W), b));
                ct_tensor_set_requires_grad(s->w[k], true);
                ct_tensor_set_requires_grad(s->b[k], true);
            } else {
                memcpy(ct_tensor_data(s->w[k]), w, sizeof w);
                memcpy(ct_tensor_data(s->b[k]), b, sizeof b);
            }
        }
    }
}

static void stage_free(stage_model *s)
{
    for (int k = 0; k < L; k++) {
        ct_tensor_release(s->w[k]);
        ct_tensor_release(s->b[k]);
    }
    for (int m = 0; m < MAXM; m++) ct_tensor_release(s->targets[m]);
}

static ct_tensor *stage_forward(void *ctx, ct_tensor *x, int micro)
{
    stage_model *s = ctx;
    if (micro == s->die_micro) _exit(0);
    if (micro == s->fail_micro) {
        ct_error_set(CT_ERR_INVALID, "injected failure");
        return NULL;
    }
    ct_tensor *h = x;
    for (int k = 0; k < s->count; k++) h = ct_tanh(ct_add(ct_matmul(h, s->w[k]), s->b[k]));
    if (micro == s->bad_shape_micro) return ct_tensor_narrow(h, 1, 0, W - 1);
    if (!s->last) return h;
    ct_tensor *d = ct_sub(h, s->targets[micro]);
    return ct_mean_all(ct_mul(d, d));
}

/* Rows [first, first + n) of the batch: x (stage 0's inputs) or the targets. */
static ct_tensor *rows_of(int first, int n, bool target)
{
    float *v = malloc(sizeof(float) * (size_t)n * W);
    for (int r = 0; r < n; r++)
        for (int k = 0; k < W; k++)
            v[r * W + k] = (float)(target ? t_at(first + r, k) : x_at(first + r, k));
    ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(n, W), v);
    free(v);
    return t;
}

/* max |got - want| over max |want| for one stage's weights or gradients */
static double rel_error(const stage_model *s, const ref_model *want, bool grads)
{
    double err = 0, scale = 1e-30;
    for (int k = 0; k < s->count; k++) {
        int l = s->first + k;
        ct_tensor *tw = grads ? s->w[k]->grad : s->w[k], *tb = grads ? s->b[k]->grad : s->b[k];
        if (!tw || !tb) return INFINITY;
        const float *gw = ct_tensor_data(tw), *gb = ct_tensor_data(tb);
        for (int i = 0; i < W; i++)
            for (int j = 0; j < W; j++) {
                err = fmax(err, fabs(gw[i * W + j] - want->w[l][i][j]));
                scale = fmax(scale, fabs(want->w[l][i][j]));
            }
        for (int j = 0; j < W; j++) {
            err = fmax(err, fabs(gb[j] - want->b[l][j]));
            scale = fmax(scale, fabs(want->b[l][j]));
        }
    }
    return err / scale;
}

/* The same model in ctrain, f32, in one process over the whole batch: the baseline the
 * pipeline must reproduce to f32 rounding (the f64 reference bounds both). */
typedef struct whole_model {
    stage_model m;
    ct_optimizer *opt;
} whole_model;

static void whole_init(whole_model *w, int M)
{
    if (!w->m.count) {
        w->m = (stage_model){.first = 0, .count = L, .last = true, .bad_shape_micro = -1, .fail_micro = -1,
                             .die_micro = -1};
    }
    stage_init(&w->m);
    CT_FRAME {
        ct_tensor_release(w->m.targets[0]);
        w->m.targets[0] = owned(rows_of(0, M * R, true));
    }
    ct_tensor *params[2 * L];
    for (int i = 0; i < L; i++) {
        params[2 * i] = w->m.w[i];
        params[2 * i + 1] = w->m.b[i];
    }
    ct_optimizer_free(w->opt);
    w->opt = ct_sgd_new(2 * L, params, &(ct_sgd_config){.lr = LR});
}

/* The whole model's weights or gradients as numbers to compare with. */
static void whole_values(const whole_model *w, bool grads, ref_model *out)
{
    for (int l = 0; l < L; l++) {
        const float *tw = ct_tensor_data(grads ? w->m.w[l]->grad : w->m.w[l]);
        const float *tb = ct_tensor_data(grads ? w->m.b[l]->grad : w->m.b[l]);
        for (int j = 0; j < W; j++) {
            out->b[l][j] = tb[j];
            for (int i = 0; i < W; i++) out->w[l][i][j] = tw[i * W + j];
        }
    }
}

/* Loss of the whole batch; gradients in w's parameters. */
static double whole_grad(whole_model *w, int M)
{
    double loss = NAN;
    ct_optimizer_zero_grad(w->opt);
    CT_FRAME {
        ct_tensor *l = stage_forward(&w->m, rows_of(0, M * R, false), 0);
        if (l && !ct_backward(l)) loss = ct_tensor_item(l);
    }
    return loss;
}

/* ---- equivalence with one process ---------------------------------------------------------- */

/* Runs every schedule and M on this rank's stage; reports its peak memory growth per
 * (schedule, M) in the message as "peak K M BYTES" lines for the test to compare. */
static int equiv_rank(rank_ctx *c)
{
    int p = c->world, rc = 0;
    ct_pg *g = p > 1 ? rank_pg(c, 30, NULL) : NULL;
    if (p > 1 && !g) return 1;
    stage_model s = {.last = c->rank == p - 1, .bad_shape_micro = -1, .fail_micro = -1, .die_micro = -1};
    if (ct_pipeline_stage_layers(L, p, c->rank, &s.first, &s.count)) {
        report(c, "%s", ct_last_error());
        ct_pg_free(g);
        return 1;
    }
    ref_model *ref = malloc(sizeof *ref), *grad = malloc(sizeof *grad), *base = malloc(sizeof *base);
    whole_model whole = {0};
    const int Ms[] = {1, 4, 6};
    for (int kind = 0; kind < 2 && !rc; kind++) {
        ct_pipeline_kind k = kind ? CT_PIPELINE_GPIPE : CT_PIPELINE_1F1B;
        ct_pipeline *pp = ct_pipeline_new(g, c->rank, stage_forward, &s, &(ct_pipeline_config){.schedule = k});
        if (!pp) {
            report(c, "rank %d: %s", c->rank, ct_last_error());
            rc = 1;
            break;
        }
        for (int mi = 0; mi < 3 && !rc; mi++) {
            int M = Ms[mi];
            s.M = M;
            stage_init(&s);
            ref_init(ref);
            whole_init(&whole, M);
            ct_tensor *params[2 * L];
            for (int i = 0; i < s.count; i++) {
                params[2 * i] = s.w[i];
                params[2 * i + 1] = s.b[i];
            }
            ct_optimizer *opt = ct_sgd_new(2 * s.count, params, &(ct_sgd_config){.lr = LR});
            CT_FRAME {
                ct_tensor *inputs[MAXM];
                for (int m = 0; m < M; m++) {
                    inputs[m] = rows_of(m * R, R, false);
                    if (s.last) {
                        ct_tensor_release(s.targets[m]);
                        s.targets[m] = owned(rows_of(m * R, R, true));
                    }
                }
                for (int step = 0; step < STEPS && !rc; step++) {
                    double want_loss = ref_grad(ref, M, grad), base_loss = whole_grad(&whole, M), loss = NAN;
                    whole_values(&whole, true, base);
                    ct_optimizer_zero_grad(opt);
                    ct_storage_peak_reset();
                    int64_t live0 = ct_storage_live_bytes();
                    if (ct_pipeline_run(pp, M, c->rank == 0 ? inputs : NULL, &loss)) {
                        report(c, "rank %d %s M=%d step %d: %s", c->rank, ct_pipeline_kind_name(k), M, step,
                               ct_last_error());
                        rc = 1;
                        break;
                    }
                    int64_t growth = ct_storage_peak_bytes() - live0;
                    if (step == 0) report(c, "peak %d %d %lld", kind, M, (long long)growth);
                    double eg = rel_error(&s, base, true), eg64 = rel_error(&s, grad, true);
                    if (!(eg <= TOL && eg64 <= TOL64)) {
                        report(c, "rank %d %s M=%d step %d: gradients off by %g relative (f32 single process), %g "
                               "(f64)", c->rank, ct_pipeline_kind_name(k), M, step, eg, eg64);
                        rc = 1;
                    }
                    if (!(fabs(loss - base_loss) <= TOL * fabs(base_loss) &&
                          fabs(loss - want_loss) <= TOL * fabs(want_loss))) {
                        report(c, "rank %d %s M=%d step %d: loss %.9g, single process %.9g (f32) %.9g (f64)",
                               c->rank, ct_pipeline_kind_name(k), M, step, loss, base_loss, want_loss);
                        rc = 1;
                    }
                    ct_pipeline_stats st = ct_pipeline_stats_get(pp);
                    int want_live = ct_pipeline_peak_micro_batches(k, p, M, c->rank);
                    /* each live micro-batch: its input and output, and between stages the
                     * buffer of its output's gradient (the output's size) */
                    int64_t act = R * W * 4, out = s.last ? 4 : act;
                    int64_t want_bytes = want_live * (act + out + (s.last ? 0 : out));
                    if (st.peak_live != want_live || st.peak_live_bytes != want_bytes) {
                        report(c, "rank %d %s M=%d: peak live %d (formula %d), %lld bytes (want %lld)", c->rank,
                               ct_pipeline_kind_name(k), M, st.peak_live, want_live, (long long)st.peak_live_bytes,
                               (long long)want_bytes);
                        rc = 1;
                    }
                    if (ct_optimizer_step(opt) || ct_optimizer_step(whole.opt)) {
                        report(c, "rank %d: step: %s", c->rank, ct_last_error());
                        rc = 1;
                    }
                    ref_sgd(ref, grad);
                }
            }
            whole_values(&whole, false, base);
            double ep = rel_error(&s, base, false), ep64 = rel_error(&s, ref, false);
            if (!rc && !(ep <= TOL && ep64 <= TOL64)) {
                report(c, "rank %d %s M=%d: parameters after %d steps off by %g relative (f32 single process), %g "
                       "(f64)", c->rank, ct_pipeline_kind_name(k), M, STEPS, ep, ep64);
                rc = 1;
            }
            ct_optimizer_free(opt);
        }
        /* a metric of the last stage's reaches every stage */
        double metrics[2] = {s.last ? 1.5 : 99, s.last ? -2.25 : 99};
        if (!rc && (ct_pipeline_broadcast_metrics(pp, metrics, 2) || metrics[0] != 1.5 || metrics[1] != -2.25)) {
            report(c, "rank %d: metrics %g %g: %s", c->rank, metrics[0], metrics[1], ct_last_error());
            rc = 1;
        }
        ct_pipeline_stats st = ct_pipeline_stats_get(pp);
        if (!rc && (st.runs != 3 * STEPS || (p > 1 && (st.bytes_sent <= 0 || st.bytes_received <= 0)))) {
            report(c, "rank %d: stats runs %lld sent %lld received %lld", c->rank, (long long)st.runs,
                   (long long)st.bytes_sent, (long long)st.bytes_received);
            rc = 1;
        }
        ct_pipeline_free(pp);
    }
    free(ref);
    free(grad);
    free(base);
    ct_optimizer_free(whole.opt);
    stage_free(&whole.m);
    stage_free(&s);
    ct_pg_free(g);
    return rc;
}

/* The peak growth a rank reported for (kind, M); -1 when missing. */
static long long reported_peak(const char *msg, int kind, int M)
{
    for (const char *q = msg; (q = strstr(q, "peak ")); q++) {
        int k, m;
        long long b;
        if (sscanf(q, "peak %d %d %lld", &k, &m, &b) == 3 && k == kind && m == M) return b;
    }
    return -1;
}

static void run_equivalence(int p)
{
    rank_result res[MAX_RANKS];
    run_ranks(p, equiv_rank, NULL, res, 60);
    expect_all_ok(res, p);
    /* 1F1B frees each micro-batch's activations after at most p - s forwards: where that
     * is fewer than M, its measured peak is lower than GPipe's */
    for (int s = 0; s < p; s++)
        for (int M = 4; M <= 6; M += 2) {
            long long one = reported_peak(res[s].msg, 0, M), gp = reported_peak(res[s].msg, 1, M);
            cr_expect(one > 0 && gp > 0, "stage %d M=%d: no peak reported:\n%s", s, M, res[s].msg);
            if (M > p - s)
                cr_expect_lt(one, gp, "stage %d M=%d: 1F1B peak %lld bytes, GPipe %lld", s, M, one, gp);
        }
}

Test(parallel_pipeline, two_stages_match_one_process, .timeout = 90) { run_equivalence(2); }
Test(parallel_pipeline, four_stages_match_one_process, .timeout = 90) { run_equivalence(4); }

Test(parallel_pipeline, one_stage_is_gradient_accumulation, .timeout = 30)
{
    rank_result res[1];
    run_ranks(1, equiv_rank, NULL, res, 30);
    expect_all_ok(res, 1);
}

/* ---- failures ------------------------------------------------------------------------------ */

typedef struct fail_arg {
    int what; /* 0 bad shape, 1 bad shape against the configured in_shape, 2 forward fails on
               * stage 1, 3 stage 1 runs another M, 4 rank 1 dies */
} fail_arg;

static int fail_rank(rank_ctx *c)
{
    const fail_arg *a = c->arg;
    int p = c->world, rc = 0;
    ct_pg *g = rank_pg(c, 30, NULL);
    if (!g) return 1;
    stage_model s = {.last = c->rank == p - 1, .bad_shape_micro = -1, .fail_micro = -1, .die_micro = -1};
    ct_pipeline_stage_layers(L, p, c->rank, &s.first, &s.count);
    stage_init(&s);
    int M = 4;
    if (a->what <= 1 && c->rank == 0) s.bad_shape_micro = a->what == 0 ? 2 : 0;
    if (a->what == 2 && c->rank == 1) s.fail_micro = 1;
    if (a->what == 3 && c->rank == 1) M = 3;
    if (a->what == 4 && c->rank == 1) s.die_micro = 1;
    ct_pipeline_config cfg = {0};
    if (a->what == 1 && c->rank == 1) cfg = (ct_pipeline_config){.in_ndim = 2, .in_shape = {R, W}};
    ct_pipeline *pp = ct_pipeline_new(g, c->rank, stage_forward, &s, &cfg);
    if (!pp) {
        report(c, "rank %d: %s", c->rank, ct_last_error());
        rc = 1;
    }
    CT_FRAME {
        ct_tensor *inputs[MAXM];
        for (int m = 0; m < MAXM; m++) {
            inputs[m] = rows_of(m * R, R, false);
            if (s.last) s.targets[m] = owned(rows_of(m * R, R, true));
        }
        double t0 = now_s();
        ct_status st = pp ? ct_pipeline_run(pp, M, inputs, NULL) : CT_ERR_INVALID;
        double took = now_s() - t0;
        /* each rank reports its error for the test to check */
        report(c, "status %d after %.2f s: %s", (int)st, took, st ? ct_last_error() : "ok");
        /* a second run of a broken pipeline fails at once */
        if (st && pp && (ct_pipeline_run(pp, M, inputs, NULL) == CT_OK || !strstr(ct_last_error(), "broken"))) {
            report(c, "rank %d: a second run after the failure: %s", c->rank, ct_last_error());
            rc = 1;
        }
    }
    ct_pipeline_free(pp);
    stage_free(&s);
    ct_pg_free(g);
    return rc;
}

/* Runs the failure case; each rank's report must contain its pattern and come well
 * within the 30 s group timeout. */
static void run_failure(int what, const char *want0, const char *want1)
{
    rank_result res[2];
    fail_arg a = {what};
    run_ranks(2, fail_rank, &a, res, 60);
    const char *want[2] = {want0, want1};
    for (int r = 0; r < 2; r++) {
        if (!want[r]) continue; /* the rank that died */
        cr_expect(WIFEXITED(res[r].status) && res[r].rc == 0, "rank %d: rc %d status 0x%x\n%s", r, res[r].rc,
                  res[r].status, res[r].msg);
        cr_expect(strstr(res[r].msg, want[r]), "rank %d: wanted \"%s\" in:\n%s", r, want[r], res[r].msg);
        double took = 1e9;
        const char *q = strstr(res[r].msg, "after ");
        if (q) sscanf(q, "after %lf", &took);
        cr_expect_lt(took, 10.0, "rank %d took %.2f s to fail:\n%s", r, took, res[r].msg);
        cr_expect(!strstr(res[r].msg, "status 0 "), "rank %d did not fail:\n%s", r, res[r].msg);
        if (getenv("CT_DEBUG_REPORTS")) cr_log_info("rank %d:\n%s", r, res[r].msg);
    }
}

Test(parallel_pipeline, a_mismatched_shape_from_a_peer_is_named, .timeout = 60)
{
    run_failure(0, "pipeline stage 0 of 2",
                "pipeline stage 1 of 2, micro-batch 2, recv activation from stage 0: stage 0 sent an activation of "
                "f32 [8, 15], this stage expects f32 [8, 16] (the shape of micro-batch 0)");
}

Test(parallel_pipeline, a_shape_other_than_the_configured_one_is_named, .timeout = 60)
{
    run_failure(1, "pipeline stage 0 of 2",
                "pipeline stage 1 of 2, micro-batch 0, recv activation from stage 0: stage 0 sent an activation of "
                "f32 [8, 15], this stage expects f32 [8, 16] (its configured in_shape)");
}

Test(parallel_pipeline, a_failing_forward_stops_every_stage, .timeout = 60)
{
    run_failure(2, "pipeline stage 0 of 2, micro-batch 1, recv gradient from stage 1",
                "pipeline stage 1 of 2, micro-batch 1, forward: injected failure");
}

Test(parallel_pipeline, a_different_micro_batch_count_is_named, .timeout = 60)
{
    run_failure(3, "pipeline stage 0 of 2",
                "pipeline stage 1 of 2, micro-batch 0, recv activation from stage 0: stage 0 runs 4 micro-batches, "
                "this stage 3");
}

Test(parallel_pipeline, a_rank_that_dies_is_an_error_not_a_hang, .timeout = 60)
{
    run_failure(4, "pipeline stage 0 of 2, micro-batch ", NULL);
}

Test(parallel_pipeline, bad_arguments_are_named)
{
    cr_expect_null(ct_pipeline_new(NULL, 1, stage_forward, NULL, NULL));
    cr_expect(strstr(ct_last_error(), "stage 1 given on group rank 0 of 1"), "%s", ct_last_error());
    cr_expect_null(ct_pipeline_new(NULL, 0, NULL, NULL, NULL));
    cr_expect(strstr(ct_last_error(), "no forward function"), "%s", ct_last_error());
    cr_expect_null(ct_pipeline_new(NULL, 0, stage_forward, NULL,
                                   &(ct_pipeline_config){.in_ndim = 1, .in_shape = {4}, .in_dtype = CT_DTYPE_I64}));
    cr_expect(strstr(ct_last_error(), "in_dtype i64"), "%s", ct_last_error());
    stage_model s = {.first = 0, .count = L, .last = true, .bad_shape_micro = -1, .fail_micro = -1, .die_micro = -1};
    ct_pipeline *pp = ct_pipeline_new(NULL, 0, stage_forward, &s, NULL);
    cr_assert_not_null(pp, "%s", ct_last_error());
    cr_expect_eq(ct_pipeline_run(pp, 0, NULL, NULL), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "0 micro-batches"), "%s", ct_last_error());
    cr_expect_eq(ct_pipeline_run(pp, 2, NULL, NULL), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "no inputs for the 2 micro-batches"), "%s", ct_last_error());
    ct_pipeline_free(pp);
}
