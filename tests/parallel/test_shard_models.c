/* Property test of parallel/shard*.c on models nobody wrote a test for: randomly
 * generated small models -- depth, odd widths, bias on or off, a tied weight, a learnt
 * scalar, a bias-only module, a parameter the user made and registered, layers nested
 * in containers or not, and, above all, called through their module's forward or used
 * directly by a plain C function -- trained by the Accelerator under every sharded
 * strategy (and CPU offload, and FULL with transformer wrapping) on 1 to 4 fork()ed
 * ranks against DDP on the same ranks and batches: f32 parameters after 5 AdamW steps
 * within 1e-5 relative (in norm), mixed precision's loss curve within 1%. A model
 * the engine cannot train must be refused by prepare; none here is. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "autograd/autograd.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "core/philox.h"
#include "kernels/reduce.h"
#include "nn/layers.h"
#include "precision/autocast.h"
#include "precision/fp8_state.h"
#include "tests/env_ranks.h"
#include "tests/rank_files.h"
#include "tests/tmpdir.h"

#define STEPS 5
#define ROWS 3 /* per rank per step */
#define MAX_DEPTH 3

typedef struct model_spec {
    int depth;               /* linear layers */
    int width[MAX_DEPTH + 1]; /* in, hidden..., out of the last layer */
    bool bias[MAX_DEPTH];
    bool direct;    /* a plain C function over the parameters, no module forward runs */
    bool nested;    /* each layer inside a "Block" container module */
    bool tied;      /* the first layer's weight again at the end: out = in */
    bool scalar;    /* a learnt scalar gain on the root */
    bool bias_only; /* a module holding only a bias, added to the output */
    bool user;      /* a (2, out) parameter the user made, registered on the root */
    bool only_scalar; /* the whole model is one scalar (fewer parameters than ranks) */
    const char *precision;
    int world;
} model_spec;

typedef struct run_case {
    const char *name;
    model_spec spec;
    ct_shard_strategy strategy;
    bool offload;
    ct_wrap_policy wrap;
} run_case;

/* ---- the model ---------------------------------------------------------------------- */

typedef struct net {
    ct_module base;
    model_spec spec;
    ct_linear_layer *fc[MAX_DEPTH];
    ct_module *shift; /* bias-only: its one parameter "bias" */
    ct_tensor *gain, *user;
} net;

static ct_tensor *shift_forward(ct_module *m, ct_tensor *x)
{
    if (ct_module_forward_begin(m)) return NULL;
    return ct_module_forward_end(m, ct_add(x, m->params[0].tensor));
}

static int out_width(const model_spec *s) { return s->tied ? s->width[0] : s->width[s->depth]; }

static net *net_new(const model_spec *s)
{
    net *n = ct_module_alloc(sizeof *n, "Net", NULL);
    if (!n) return NULL;
    n->spec = *s;
    ct_status st = CT_OK;
    if (s->only_scalar) {
        ct_tensor *g = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(1), 0.5);
        st = g ? ct_module_add_param(&n->base, "gain", g) : ct_last_status();
        n->gain = g;
        return st ? (ct_module_free(&n->base), NULL) : n;
    }
    for (int i = 0; i < s->depth && !st; i++) {
        n->fc[i] = ct_linear_layer_new(s->width[i], s->width[i + 1], s->bias[i], 0.4);
        char name[32];
        if (!n->fc[i]) {
            st = ct_last_status();
            break;
        }
        snprintf(name, sizeof name, "%s%d", s->nested ? "block" : "fc", i);
        if (s->nested) {
            ct_module *b = ct_module_alloc(sizeof *b, "Block", NULL);
            st = b ? ct_module_add_child(b, "fc", &n->fc[i]->base) : ct_last_status();
            if (!st) st = ct_module_add_child(&n->base, name, b);
        } else {
            st = ct_module_add_child(&n->base, name, &n->fc[i]->base);
        }
    }
    const int out = out_width(s);
    if (!st && s->bias_only) {
        n->shift = ct_module_alloc(sizeof *n->shift, "Shift", NULL);
        ct_tensor *b = n->shift ? ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(out), 0, 0.1) : NULL;
        st = b ? ct_module_add_param(n->shift, "bias", b) : ct_last_status();
        if (!st) st = ct_module_add_child(&n->base, "shift", n->shift);
    }
    if (!st && s->scalar) {
        n->gain = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(1), 1.0);
        st = n->gain ? ct_module_add_param(&n->base, "gain", n->gain) : ct_last_status();
    }
    if (!st && s->user) {
        n->user = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(2, out), 0, 0.2);
        st = n->user ? ct_module_add_param(&n->base, "user", n->user) : ct_last_status();
    }
    if (st) {
        ct_module_free(&n->base);
        return NULL;
    }
    return n;
}

/* x (ROWS, in) -> (ROWS, out) */
static ct_tensor *net_forward(net *n, ct_tensor *x)
{
    const model_spec *s = &n->spec;
    if (s->only_scalar) return ct_mul(x, n->gain);
    ct_tensor *h = x;
    for (int i = 0; i < s->depth; i++) {
        ct_linear_layer *fc = n->fc[i];
        h = s->direct ? ct_linear(h, fc->weight, fc->bias) : ct_linear_layer_forward(fc, h);
        if (i + 1 < s->depth || s->tied) h = ct_tanh(h);
    }
    /* tied: the first weight (in, h1) again, transposed: (ROWS, h1) -> (ROWS, in) */
    if (s->tied) h = ct_matmul_t(h, n->fc[0]->weight, false, true);
    if (s->bias_only) h = s->direct ? ct_add(h, n->shift->params[0].tensor) : shift_forward(n->shift, h);
    if (s->scalar) h = ct_mul(h, n->gain);
    if (s->user) h = ct_add(h, ct_sum(n->user, (const int[]){0}, 1, false));
    return h;
}

/* The rows of rank r at step k: one global batch of world * ROWS rows per step. */
static void batch(const model_spec *s, int k, int r, ct_tensor **x, ct_tensor **y)
{
    const int in = s->only_scalar ? 3 : s->width[0], out = s->only_scalar ? 3 : out_width(s);
    ct_rng g;
    ct_rng_init(&g, 500 + (uint64_t)k);
    float *u = malloc((size_t)s->world * ROWS * (in + out) * sizeof *u);
    ct_rng_uniform_f32(&g, u, s->world * ROWS * (in + out), -1, 1);
    const float *mine = u + (size_t)r * ROWS * (in + out);
    *x = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(ROWS, in), mine);
    *y = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(ROWS, out), mine + ROWS * in);
    free(u);
}

static int train_rank(int rank, int world, const char *dir, void *ctx)
{
    const run_case *c = ctx;
    int rc = 0;
    double loss[STEPS] = {0};
    int skipped[STEPS] = {0}; /* fp16: steps the loss scaler skipped */
    CT_FRAME {
        ct_set_seed(11 + (uint64_t)rank); /* different weights per rank: prepare broadcasts rank 0's */
        net *n = net_new(&c->spec);
        ct_param_list pl = {0};
        ct_status st = n ? ct_module_named_tensors(&n->base, false, &pl) : ct_last_status();
        ct_optimizer *opt = st ? NULL : ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 1e-2, .weight_decay = 0.05});
        static const char *const block[] = {"Block"};
        ct_accelerator_config ac = {
            .mixed_precision = c->spec.precision ? c->spec.precision : "no",
            /* fp16: 16-bit gradients (sharded) overflow at a scale that f32 ones (DDP) do
             * not, so the scaler would skip other steps; start where neither overflows */
            .loss_scaler = {.init_scale = 256},
            .shard = {.strategy = c->strategy,
                      .wrap = {.policy = c->wrap, .classes = block, .nclasses = 1, .min_num_params = 8},
                      .shard_group_size = world >= 2 ? world / 2 : 1,
                      .offload_optimizer = c->offload}};
        ct_accelerator *acc = st || !opt ? NULL : ct_accelerator_new(&ac);
        if (!st) st = acc ? ct_accelerator_prepare(acc, &n->base, opt, NULL, NULL) : ct_last_status();
        for (int k = 0; k < STEPS && !st; k++) CT_FRAME {
                ct_tensor *x, *y;
                batch(&c->spec, k, rank, &x, &y);
                ct_tensor *d = ct_sub(net_forward(n, x), y);
                ct_tensor *l = ct_mean_all(ct_mul(d, d));
                st = l ? ct_accelerator_backward(acc, l) : ct_last_status();
                ct_tensor *mean = st ? NULL : ct_accelerator_reduce(acc, ct_detach(l), true);
                if (mean) loss[k] = ct_tensor_item(mean);
                if (!st) st = ct_optimizer_step(opt);
                if (!st && ct_accelerator_step_overflowed(acc)) skipped[k] = 1;
                ct_optimizer_zero_grad(opt);
            }
        if (st) {
            fprintf(stderr, "rank %d (%s): %s\n", rank, c->name, ct_last_error());
            rc = 1;
        }
        /* fp8: every linear went through the fp8 GEMM (its weight has a scaling slot),
         * whatever dtype the strategy keeps its parameters in */
        const int fp8_weights = c->spec.only_scalar ? 0 : c->spec.depth;
        if (!rc && c->spec.precision && !strcmp(c->spec.precision, "fp8") && ct_autocast_fp8_state() &&
            ct_fp8_state_weights(ct_autocast_fp8_state()) != fp8_weights) {
            fprintf(stderr, "rank %d (%s): %d weights went through fp8, expected %d\n", rank, c->name,
                    ct_fp8_state_weights(ct_autocast_fp8_state()), fp8_weights);
            rc = 1;
        }
        ct_accelerator_free(acc); /* gathers the parameters back into the model */
        if (!rc && rank == 0) {
            int64_t total = ct_module_num_params(&n->base), at = 0;
            float *p = malloc((size_t)total * sizeof *p);
            for (int i = 0; i < pl.n; i++) {
                memcpy(p + at, ct_tensor_data(pl.tensors[i]), ct_tensor_nbytes(pl.tensors[i]));
                at += ct_tensor_numel(pl.tensors[i]);
            }
            write_file(dir, c->name, "params", p, (size_t)total * sizeof *p);
            write_file(dir, c->name, "loss", loss, sizeof loss);
            write_file(dir, c->name, "skipped", skipped, sizeof skipped);
            free(p);
        }
        ct_optimizer_free(opt);
        ct_param_list_free(&pl);
        if (n) ct_module_free(&n->base);
    }
    return rc;
}

/* ---- the generator and the comparison --------------------------------------------- */

static model_spec random_spec(uint64_t seed)
{
    ct_rng g;
    ct_rng_init(&g, 9000 + seed);
    float u[24];
    ct_rng_uniform_f32(&g, u, 24, 0, 1);
    model_spec s = {0};
    s.world = 1 + (int)(seed % 4);
    s.depth = 1 + (int)(u[0] * MAX_DEPTH);
    for (int i = 0; i <= s.depth; i++) s.width[i] = 1 + (int)(u[1 + i] * 9); /* 1..9: odd sizes */
    s.tied = u[10] < 0.3f;
    if (s.tied) s.width[s.depth] = s.width[1]; /* the first weight maps it back to the input */
    for (int i = 0; i < s.depth; i++) s.bias[i] = u[5 + i] < 0.6f;
    s.direct = u[8] < 0.5f;
    s.nested = u[9] < 0.5f;
    s.scalar = u[11] < 0.4f;
    s.bias_only = u[12] < 0.4f;
    s.user = u[13] < 0.3f;
    s.only_scalar = u[14] < 0.08f;
    static const char *const precisions[] = {NULL, NULL, "bf16", "fp16", "fp8"};
    s.precision = precisions[(int)(u[15] * 5) % 5];
    return s;
}

static const char *describe_spec(const model_spec *s, char *buf, int cap)
{
    if (s->only_scalar) {
        snprintf(buf, (size_t)cap, "one scalar, %d ranks, %s", s->world, s->precision ? s->precision : "f32");
        return buf;
    }
    int n = snprintf(buf, (size_t)cap, "widths");
    for (int i = 0; i <= s->depth; i++) n += snprintf(buf + n, (size_t)(cap - n), " %d", s->width[i]);
    snprintf(buf + n, (size_t)(cap - n), ", bias %d%d%d, %s%s%s%s%s%s, %d ranks, %s", s->bias[0], s->bias[1],
             s->bias[2], s->direct ? "direct" : "modules", s->nested ? " nested" : "", s->tied ? " tied" : "",
             s->scalar ? " scalar" : "", s->bias_only ? " bias-only" : "", s->user ? " user-param" : "", s->world,
             s->precision ? s->precision : "f32");
    return buf;
}

static void check_models(uint64_t first, uint64_t count)
{
    make_tmpdir_with("/tmp/ct_shard_models_");
    static const struct {
        const char *name;
        ct_shard_strategy strategy;
        bool offload;
        ct_wrap_policy wrap;
    } variants[] = {
        {"OPTIMIZER", CT_SHARD_OPTIMIZER, false, CT_WRAP_NONE},
        {"GRAD_OP", CT_SHARD_GRAD_OP, false, CT_WRAP_SIZE},
        {"FULL", CT_SHARD_FULL, false, CT_WRAP_NONE},
        {"FULL_wrapped", CT_SHARD_FULL, false, CT_WRAP_TRANSFORMER},
        {"HYBRID", CT_SHARD_HYBRID, false, CT_WRAP_TRANSFORMER},
        {"FULL_offload", CT_SHARD_FULL, true, CT_WRAP_SIZE},
    };
    int failures = 0;
    for (uint64_t seed = first; seed < first + count; seed++) {
        model_spec s = random_spec(seed);
        char desc[256];
        describe_spec(&s, desc, sizeof desc);
        if (getenv("CT_DEBUG_REPORTS")) fprintf(stderr, "model %llu: %s\n", (unsigned long long)seed, desc);
        run_case ref = {.name = "ddp", .spec = s, .strategy = CT_SHARD_NO_SHARD};
        run_env_ranks(s.world, train_rank, tmpdir, &ref, 60);
        /* Mixed precision: the sharded strategies compute with 16-bit parameters beside
         * f32 masters (FSDP's param_dtype, DeepSpeed's bf16/fp16 modes), DDP with f32
         * parameters cast per op, so their losses differ by rounding. They may differ
         * from DDP's by 1%, or by twice what low precision itself moves DDP's loss away
         * from f32 where that is more (on these tiny models one rounded bias is a
         * visible part of the loss). A run that trains nothing is far outside either. */
        double tol = 1e-5;
        if (s.precision) {
            run_case f32 = {.name = "ddp_f32", .spec = s, .strategy = CT_SHARD_NO_SHARD};
            f32.spec.precision = NULL;
            run_env_ranks(s.world, train_rank, tmpdir, &f32, 60);
            tol = fmax(0.01, 2 * curve_diff("ddp", "ddp_f32", "loss"));
        }
        for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
            run_case c = {.name = variants[v].name, .spec = s, .strategy = variants[v].strategy,
                          .offload = variants[v].offload, .wrap = variants[v].wrap};
            /* a model without containers has nothing to wrap by class (prepare says so) */
            if (c.wrap == CT_WRAP_TRANSFORMER && (!s.nested || s.only_scalar)) c.wrap = CT_WRAP_SIZE;
            run_env_ranks(s.world, train_rank, tmpdir, &c, 60);
            /* every mismatch is listed before the test fails */
            const double d = s.precision ? curve_diff(c.name, "ddp", "loss") : rel_diff(c.name, "ddp", NULL);
            if (d > tol || isnan(d)) {
                fprintf(stderr, "model %llu (%s), %s: %s differ%s from DDP's by %g relative (allowed: %g)\n",
                        (unsigned long long)seed, desc, c.name, s.precision ? "the loss curve" : "the parameters",
                        s.precision ? "s" : "", d, tol);
                failures++;
                if (getenv("CT_DEBUG_REPORTS")) {
                    size_t na;
                    double *a = read_file(c.name, "loss", &na), *b = read_file("ddp", "loss", &na);
                    int *sa = read_file(c.name, "skipped", &na), *sb = read_file("ddp", "skipped", &na);
                    for (int i = 0; i < STEPS; i++)
                        fprintf(stderr, "  step %d: %.7g%s (DDP %.7g%s)\n", i, a[i], sa[i] ? " skipped" : "", b[i],
                                sb[i] ? " skipped" : "");
                    free(a), free(b), free(sa), free(sb);
                }
            }
        }
    }
    remove_tmpdir();
    cr_assert_eq(failures, 0, "%d model/strategy pairs differ from DDP (listed above)", failures);
}

/* ---- the safety net ---------------------------------------------------------------- */

static ct_tensor *clone_result;
static char clone_error[1024]; /* errors are per thread: the reader's, copied out */

static void *clone_from_thread(void *arg)
{
    CT_FRAME {
        clone_result = ct_tensor_clone(arg);
        snprintf(clone_error, sizeof clone_error, "%s", ct_last_error());
    }
    return NULL;
}

/* Under FULL the parameters have no memory between uses. Read on the training thread
 * (every rank alike) they are gathered, with the values every rank holds; read from
 * another thread, which may not start a collective, the read is an error naming the
 * parameter, its unit and the strategy -- never a NULL dereference. */
static int safety_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)dir, (void)ctx;
    int rc = 0;
    CT_FRAME {
        model_spec sp = {.depth = 2, .width = {3, 5, 2}, .bias = {true, false}, .direct = true, .world = world};
        net *n = net_new(&sp);
        ct_param_list pl = {0};
        ct_module_named_tensors(&n->base, false, &pl);
        ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 1e-2});
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.shard = {.strategy = CT_SHARD_FULL}});
        ct_status st = ct_accelerator_prepare(acc, &n->base, opt, NULL, NULL);
        ct_tensor *w = n->fc[0]->weight;
        if (!st && w->storage->data) {
            fprintf(stderr, "rank %d: FULL keeps the weight's memory between steps\n", rank);
            rc = 1;
        }
        pthread_t th;
        if (!st && !rc) {
            pthread_create(&th, NULL, clone_from_thread, w);
            pthread_join(th, NULL);
            const char *e = clone_error;
            if (getenv("CT_DEBUG_REPORTS")) fprintf(stderr, "rank %d, read from another thread: %s\n", rank, e);
            if (clone_result || !strstr(e, "parameter 'fc0.weight'") || !strstr(e, "FULL sharding")) {
                fprintf(stderr, "rank %d: read from another thread: %s (error '%s')\n", rank,
                        clone_result ? "succeeded" : "failed", e);
                rc = 1;
            }
        }
        /* on the training thread: gathered; rank 0's weights (prepare broadcast them) */
        ct_tensor *sum = st || rc ? NULL : ct_kernel_sum(w, NULL, 0, false);
        ct_tensor *all = sum ? ct_accelerator_gather(acc, sum) : NULL;
        if (!st && !rc && (!all || ct_tensor_get(all, (const int64_t[]){0}) != ct_tensor_get(all, (const int64_t[]){world - 1}))) {
            fprintf(stderr, "rank %d: the gathered weight differs between ranks or failed: %s\n", rank, ct_last_error());
            rc = 1;
        }
        if (st) {
            fprintf(stderr, "rank %d: %s\n", rank, ct_last_error());
            rc = 1;
        }
        ct_accelerator_free(acc);
        ct_optimizer_free(opt);
        ct_param_list_free(&pl);
        ct_module_free(&n->base);
    }
    return rc;
}

Test(parallel_shard_models, a_sharded_parameter_read_outside_a_forward, .timeout = 60)
{
    run_env_ranks(2, safety_rank, NULL, NULL, 50);
}

/* A parameter the optimizer steps but the model does not hold is refused by prepare,
 * saying what to do, under DDP (which would let it drift apart on every rank) as under
 * every sharded strategy (which cannot shard it). */
/* One strategy per launch: each run meets on a fresh port, so no rank can reach the
 * store of an earlier group that its peer has not yet closed. */
static int foreign_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)dir;
    const ct_shard_strategy strategy = *(const ct_shard_strategy *)ctx;
    int rc = 0;
    CT_FRAME {
        model_spec sp = {.depth = 1, .width = {3, 2}, .world = world};
        net *n = net_new(&sp);
        ct_tensor *mine = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4));
        ct_tensor_set_requires_grad(mine, true);
        ct_tensor *ps[2] = {n->fc[0]->weight, mine};
        ct_optimizer *opt = ct_adamw_new(2, ps, &(ct_adamw_config){.lr = 1e-2});
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.shard = {.strategy = strategy}});
        ct_status st = ct_accelerator_prepare(acc, &n->base, opt, NULL, NULL);
        if (!st || !strstr(ct_last_error(), "optimizer parameter 1") ||
            !strstr(ct_last_error(), "ct_module_add_param")) {
            fprintf(stderr, "rank %d, %s: prepare %s: '%s'\n", rank, ct_shard_strategy_name(strategy),
                    st ? "failed" : "accepted a foreign parameter", ct_last_error());
            rc = 1;
        }
        ct_accelerator_free(acc);
        ct_optimizer_free(opt);
        ct_module_free(&n->base);
    }
    return rc;
}

Test(parallel_shard_models, a_parameter_outside_the_model_is_refused, .timeout = 60)
{
    static ct_shard_strategy strategies[] = {CT_SHARD_NO_SHARD, CT_SHARD_OPTIMIZER, CT_SHARD_FULL};
    for (size_t i = 0; i < sizeof strategies / sizeof *strategies; i++)
        run_env_ranks(2, foreign_rank, NULL, &strategies[i], 50);
}

#if defined(__SANITIZE_ADDRESS__)
#define MODELS_PER_TEST 2 /* every process is several times slower under the sanitizer */
#else
#define MODELS_PER_TEST 8
#endif

/* four tests of 8 models each: 32 models, every world size 8 times */
Test(parallel_shard_models, random_models_0_match_ddp, .timeout = 300) { check_models(0, MODELS_PER_TEST); }
Test(parallel_shard_models, random_models_1_match_ddp, .timeout = 300) { check_models(100, MODELS_PER_TEST); }
Test(parallel_shard_models, random_models_2_match_ddp, .timeout = 300) { check_models(200, MODELS_PER_TEST); }
Test(parallel_shard_models, random_models_3_match_ddp, .timeout = 300) { check_models(300, MODELS_PER_TEST); }
