/* Tests for nn/llama_tp.c: the Llama sharded over fork()ed tensor-parallel ranks
 * against the unsharded model run in a process of its own.
 *
 * One rank alone first runs the reference: the full model (ct_llama_new, same seed)
 * gives the logits and the loss of a batch, then trains 5 AdamW steps of 2
 * accumulated micro-batches with global-norm clipping (ct_clip_grad_norm over the
 * full parameter list); it writes the logits, the step-0 gradients, the norms and the
 * final parameters into memory shared with the test. Then every rank of the group
 * builds the same full model, shards it and runs the same steps; each rank's
 * parameters and gradients must equal the slice of the reference that the
 * Megatron layout gives it, written out here: q/k/v/gate/up by rows (heads are
 * row blocks), o/down by columns, the embedding and an untied head by rows of the
 * vocabulary padded to a multiple of tp (zeros past it), the norms whole. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/philox.h"
#include "core/threads.h"
#include "nn/llama.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "precision/autocast.h"
#include "tests/nn/tp_check.h"

#define STEPS 5
#define ACC 2

typedef struct ref_header {
    double loss0, max_norm;
    double norms[STEPS], losses[STEPS][ACC];
    int64_t n_logits, n_params;
} ref_header;

/* Tolerances. Logits, losses, norms and gradients: relative to the largest |value| of
 * the tensor. Parameters after the AdamW steps: |got - want| / max(1, |want|) per
 * element (tp_check.h's rel_err): Adam divides by sqrt(v), so a gradient element far
 * below its tensor's largest carries its rounding differences (summation order) into a
 * step of lr; relative to the tensor's largest parameter that reaches ~1e-4 on the W1
 * shape, while a wrong slice moves parameters by lr (1e-3) per step. */
typedef struct tcase {
    const char *name;
    ct_llama_config cfg;
    int64_t B, T;
    bool sp, bf16;
    double tol_fwd, tol_grad, tol_param;
    ref_header *ref; /* shared with the test process */
} tcase;

/* the largest errors a rank saw, reported with CT_DEBUG_REPORTS=1 */
static double worst_fwd, worst_grad, worst_param, worst_param_of_max;

static float *ref_logits(ref_header *h) { return (float *)(h + 1); }
static float *ref_grads(ref_header *h) { return ref_logits(h) + h->n_logits; }
static float *ref_params(ref_header *h) { return ref_grads(h) + h->n_params; }

/* parameter count of the full model, from the sizes (HF's LlamaForCausalLM) */
static int64_t param_count(const ct_llama_config *c)
{
    int64_t C = c->hidden_size, V = c->vocab_size, H = c->num_attention_heads, K = c->num_key_value_heads;
    int64_t D = C / H, I = c->intermediate_size;
    int64_t layer = 2 * C * H * D + 2 * C * K * D + 3 * C * I + 2 * C;
    return V * C * (c->tie_word_embeddings ? 1 : 2) + c->num_hidden_layers * layer + C;
}

static ref_header *ref_map(const tcase *t)
{
    int64_t nl = t->B * t->T * t->cfg.vocab_size, np = param_count(&t->cfg);
    size_t bytes = sizeof(ref_header) + (size_t)(nl + 2 * np) * sizeof(float);
    ref_header *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(h, MAP_FAILED);
    h->n_logits = nl, h->n_params = np;
    return h;
}

static void ref_unmap(const tcase *t)
{
    munmap(t->ref, sizeof(ref_header) + (size_t)(t->ref->n_logits + 2 * t->ref->n_params) * sizeof(float));
}

/* micro-batch k of step s (step -1: the forward check): x, y (B, T); a pad token
 * (when the model has one) among the inputs and one ignored target */
static void batch(const tcase *t, int s, int k, ct_tensor **x, ct_tensor **y)
{
    int64_t B = t->B, T = t->T, V = t->cfg.vocab_size;
    float u[4096];
    ct_rng g;
    ct_rng_init(&g, 1000 + (uint64_t)(10 * (s + 1) + k));
    ct_rng_uniform_f32(&g, u, B * (T + 1), 0, (float)V);
    int64_t ids[4096];
    for (int64_t i = 0; i < B * (T + 1); i++) ids[i] = (int64_t)u[i] % V;
    if (t->cfg.token_ids_set && t->cfg.pad_token_id >= 0) ids[1] = ids[T + 3] = t->cfg.pad_token_id;
    ct_tensor *all = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T + 1), ids);
    *x = ct_tensor_contiguous(ct_tensor_narrow(all, 1, 0, T));
    *y = ct_tensor_contiguous(ct_tensor_narrow(all, 1, 1, T));
    ((int64_t *)ct_tensor_data(*y))[T + 2] = -1; /* ignore_index */
}

static int failed(rank_ctx *c, const char *what)
{
    report(c, "rank %d: %s: %s", c->rank, what, ct_last_error());
    return 1;
}

/* max |got - want| / max |want| (0/0 = 0); INFINITY when the shapes differ */
static double max_rel(const ct_tensor *got, const ct_tensor *want)
{
    if (!got || !want || !ct_tensor_same_shape(got, want)) return INFINITY;
    ct_tensor *a = ct_tensor_contiguous(ct_tensor_cast(got, CT_DTYPE_F64));
    ct_tensor *b = ct_tensor_contiguous(ct_tensor_cast(want, CT_DTYPE_F64));
    const double *p = ct_tensor_data(a), *q = ct_tensor_data(b);
    double d = 0, w = 0;
    for (int64_t i = 0, n = ct_tensor_numel(a); i < n; i++) {
        double e = fabs(p[i] - q[i]);
        if (!(e <= d)) d = e;
        w = fmax(w, fabs(q[i]));
    }
    return d == 0 ? 0 : d / w;
}

static int expect_rel(rank_ctx *c, const char *what, const char *name, const ct_tensor *got, const ct_tensor *want,
                      double tol, double *worst)
{
    double e = max_rel(got, want);
    if (worst && e > *worst) *worst = e;
    if (e <= tol) return 0;
    char a[160], b[160];
    report(c, "rank %d: %s %s: got %s, want %s: relative error %g > %g", c->rank, what, name,
           got ? ct_tensor_describe(got, a, sizeof a) : "NULL", want ? ct_tensor_describe(want, b, sizeof b) : "NULL",
           e, tol);
    return 1;
}

static int expect_num(rank_ctx *c, const char *what, double got, double want, double tol, double *worst)
{
    double e = fabs(got - want) / fmax(fabs(want), 1e-30);
    if (worst && e > *worst) *worst = e;
    if (e <= tol) return 0;
    report(c, "rank %d: %s: got %.9g, want %.9g: relative error %g > %g", c->rank, what, got, want, e, tol);
    return 1;
}

static bool has(const char *name, const char *part) { return strstr(name, part) != NULL; }

/* The Megatron layout, written out: which part of the full tensor named `name` rank
 * r of n holds (dim -1: all of it). With fewer key/value heads K than ranks, rank r
 * keeps the head its query heads [r H/n, (r+1) H/n) use: (r H/n) / (H/K). */
static ct_tp_shard layout(const char *name, const int64_t *shape, const ct_llama_config *cfg, int r, int n)
{
    int64_t V = cfg->vocab_size, H = cfg->num_attention_heads, K = cfg->num_key_value_heads;
    if ((has(name, "k_proj") || has(name, "v_proj")) && n > K) {
        int64_t D = shape[0] / K, head = (r * H / n) / (H / K);
        return (ct_tp_shard){0, head * D, (head + 1) * D, shape[0], n / (int)K};
    }
    if (has(name, "q_proj") || has(name, "k_proj") || has(name, "v_proj") || has(name, "gate_proj") ||
        has(name, "up_proj"))
        return (ct_tp_shard){0, r * shape[0] / n, (r + 1) * shape[0] / n, shape[0], 0};
    if (has(name, "o_proj") || has(name, "down_proj"))
        return (ct_tp_shard){1, r * shape[1] / n, (r + 1) * shape[1] / n, shape[1], 0};
    if (has(name, "embed_tokens") || has(name, "lm_head")) {
        int64_t rows = (V + n - 1) / n;
        return (ct_tp_shard){0, r * rows, (r + 1) * rows, V, 0};
    }
    return (ct_tp_shard){-1, 0, shape[0], shape[0], 0};
}

/* indices [s.start, s.end) of full along s.dim, zeros past its end */
static ct_tensor *take(ct_tensor *full, ct_tp_shard s)
{
    if (s.dim < 0) return full;
    int64_t have = full->shape[s.dim] - s.start, want = s.end - s.start;
    have = have < 0 ? 0 : have > want ? want : have;
    ct_tensor *parts[2];
    int np = 0;
    if (have > 0) parts[np++] = ct_narrow(full, s.dim, s.start, have);
    if (have < want) {
        int64_t shape[2] = {full->shape[0], full->shape[1]};
        shape[s.dim] = want - have;
        parts[np++] = ct_tensor_zeros(full->dtype, 2, shape);
    }
    return np == 1 ? parts[0] : ct_concat(np, parts, s.dim);
}

/* One training step's loss: mean over micro-batches, each backward scaled by 1/ACC */
static ct_tensor *micro_loss(const tcase *t, ct_llama *m, int s, int k)
{
    ct_tensor *x, *y, *l = NULL;
    batch(t, s, k, &x, &y);
    if (t->bf16) {
        CT_AUTOCAST(CT_DTYPE_BF16) l = ct_llama_loss(m, x, y);
    } else {
        l = ct_llama_loss(m, x, y);
    }
    return l;
}

static ct_optimizer *adamw(ct_llama *m)
{
    ct_param_list pl;
    if (ct_module_named_tensors(&m->base, false, &pl)) return NULL;
    ct_optimizer *o = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 1e-3, .weight_decay = 0.1, .eps = 1e-6});
    ct_param_list_free(&pl);
    return o;
}

/* ---- the reference: the unsharded model in one process ----------------------------- */

static int reference_rank(rank_ctx *c)
{
    tcase *t = c->arg;
    ref_header *h = t->ref;
    int rc = 0;
    ct_set_num_threads(1); /* the cores are shared with other tests; the results do not depend on it */
    CT_FRAME {
        ct_set_seed(7);
        ct_llama *m = ct_llama_new(&t->cfg);
        ct_optimizer *opt = m ? adamw(m) : NULL;
        ct_param_list pl = {0};
        if (!opt || ct_module_named_tensors(&m->base, false, &pl)) rc = failed(c, "reference model");
        if (!rc && ct_module_num_params(&m->base) != h->n_params) {
            report(c, "reference: %lld parameters, counted %lld", (long long)ct_module_num_params(&m->base),
                   (long long)h->n_params);
            rc = 1;
        }
        if (!rc) {
            ct_tensor *x, *y, *logits = NULL, *loss = NULL;
            batch(t, -1, 0, &x, &y);
            CT_NO_GRAD {
                if (t->bf16) {
                    CT_AUTOCAST(CT_DTYPE_BF16) logits = ct_llama_forward(m, x);
                } else {
                    logits = ct_llama_forward(m, x);
                }
                loss = ct_cross_entropy(logits, y, -1);
            }
            if (!loss) rc = failed(c, "reference forward");
            else {
                h->loss0 = ct_tensor_item(loss);
                memcpy(ref_logits(h), ct_tensor_data(ct_tensor_contiguous(logits)), (size_t)h->n_logits * 4);
            }
        }
        for (int s = 0; s < STEPS && !rc; s++) {
            for (int k = 0; k < ACC && !rc; k++) CT_FRAME {
                    ct_tensor *l = micro_loss(t, m, s, k);
                    if (!l || ct_backward(ct_mul_scalar(l, 1.0 / ACC))) rc = failed(c, "reference backward");
                    else h->losses[s][k] = ct_tensor_item(l);
                }
            if (rc) break;
            double norm = ct_grad_norm(pl.n, pl.tensors, 2.0);
            if (s == 0) { /* clipping bites at step 0 and wherever a later step is as steep */
                h->max_norm = 0.8 * norm;
                int64_t at = 0;
                for (int i = 0; i < pl.n; i++) {
                    memcpy(ref_grads(h) + at, ct_tensor_data(pl.tensors[i]->grad), ct_tensor_nbytes(pl.tensors[i]));
                    at += ct_tensor_numel(pl.tensors[i]);
                }
            }
            h->norms[s] = ct_clip_grad_norm(pl.n, pl.tensors, h->max_norm, 2.0);
            if (ct_optimizer_step(opt)) rc = failed(c, "reference step");
            ct_optimizer_zero_grad(opt);
        }
        int64_t at = 0;
        for (int i = 0; i < pl.n && !rc; i++) {
            memcpy(ref_params(h) + at, ct_tensor_data(pl.tensors[i]), ct_tensor_nbytes(pl.tensors[i]));
            at += ct_tensor_numel(pl.tensors[i]);
        }
        ct_param_list_free(&pl);
        ct_optimizer_free(opt);
        ct_module_free(m ? &m->base : NULL);
    }
    return rc;
}

/* ---- the sharded ranks ------------------------------------------------------------- */

/* Every local parameter (and with grads, its gradient) against its slice of the
 * reference's full tensors at floats (in the full model's parameter order). */
static int check_slices(rank_ctx *c, const tcase *t, ct_llama *m, const ct_param_list *full, const float *ref,
                        bool grads, double tol, const char *what)
{
    int rc = 0;
    ct_param_list pl;
    if (ct_module_named_tensors(&m->base, false, &pl)) return failed(c, "parameter list");
    int64_t at = 0;
    for (int i = 0; i < full->n && i < pl.n; i++) {
        ct_tensor *want_full = ct_tensor_from_data(CT_DTYPE_F32, full->tensors[i]->ndim, full->tensors[i]->shape,
                                                   ref + at);
        at += ct_tensor_numel(full->tensors[i]);
        ct_tp_shard s = layout(full->names[i], full->tensors[i]->shape, &t->cfg, c->rank, c->world);
        ct_tensor *want = take(want_full, s);
        if (grads) {
            rc |= expect_rel(c, what, pl.names[i], pl.tensors[i]->grad, want, tol, &worst_grad);
            continue;
        }
        double e = rel_err(pl.tensors[i], want), e_max = max_rel(pl.tensors[i], want);
        worst_param = fmax(worst_param, e), worst_param_of_max = fmax(worst_param_of_max, e_max);
        if (!(e <= tol)) {
            report(c, "rank %d: %s %s: |got - want| / max(1, |want|) %g > %g (%g of the largest |want|)", c->rank,
                   what, pl.names[i], e, tol, e_max);
            rc = 1;
        }
    }
    ct_param_list_free(&pl);
    return rc;
}

/* names unchanged, in order; each record as the layout; values the full ones' slices */
static int check_layout(rank_ctx *c, const tcase *t, ct_llama *m, const ct_param_list *full)
{
    int rc = 0;
    ct_param_list pl;
    if (ct_module_named_tensors(&m->base, false, &pl)) return failed(c, "parameter list");
    if (pl.n != full->n) {
        report(c, "rank %d: %d parameters after sharding, %d before", c->rank, pl.n, full->n);
        rc = 1;
    }
    for (int i = 0; i < full->n && i < pl.n; i++) {
        ct_tp_shard want = layout(full->names[i], full->tensors[i]->shape, &t->cfg, c->rank, c->world);
        const ct_tp_shard *got = ct_llama_tp_shard_of(m, pl.tensors[i]);
        if (strcmp(pl.names[i], full->names[i]) || !got || got->dim != want.dim || got->start != want.start ||
            got->end != want.end || got->full != want.full || (got->replicas > 1) != (want.replicas > 1) ||
            (want.replicas > 1 && got->replicas != want.replicas)) {
            report(c, "rank %d: parameter %d: %s, record dim %d [%lld, %lld) of %lld x%d; want %s, dim %d [%lld, "
                   "%lld) of %lld x%d", c->rank, i, pl.names[i], got ? got->dim : -9, got ? (long long)got->start : -1,
                   got ? (long long)got->end : -1, got ? (long long)got->full : -1, got ? got->replicas : -1,
                   full->names[i], want.dim, (long long)want.start, (long long)want.end, (long long)want.full,
                   want.replicas);
            rc = 1;
        }
        rc |= expect_rel(c, "initial value", pl.names[i], pl.tensors[i], take(full->tensors[i], want), 0, NULL);
    }
    ct_param_list_free(&pl);
    return rc;
}

static int tp_rank(rank_ctx *c)
{
    tcase *t = c->arg;
    ref_header *h = t->ref;
    ct_set_num_threads(1); /* n ranks share the cores */
    ct_pg *g = rank_pg(c, 60, NULL);
    if (!g) return 1;
    int rc = 0;
    CT_FRAME {
        ct_set_seed(7);
        ct_llama *m = ct_llama_new(&t->cfg);
        ct_param_list full = {0}; /* the full model's names, and copies of its initial tensors (this frame's) */
        if (!m || ct_module_named_tensors(&m->base, false, &full)) rc = failed(c, "model");
        for (int i = 0; i < full.n; i++) full.tensors[i] = ct_tensor_clone(full.tensors[i]);
        if (!rc && ct_llama_tensor_parallel(m, g, t->sp)) rc = failed(c, "llama_tensor_parallel");
        if (!rc) rc |= check_layout(c, t, m, &full);
        ct_optimizer *opt = rc ? NULL : adamw(m);
        if (!rc && !opt) rc = failed(c, "adamw");
        if (!rc) CT_FRAME {
                ct_tensor *x, *y, *logits = NULL, *loss = NULL;
                batch(t, -1, 0, &x, &y);
                CT_NO_GRAD {
                    if (t->bf16) {
                        CT_AUTOCAST(CT_DTYPE_BF16) logits = ct_llama_forward(m, x), loss = ct_llama_loss(m, x, y);
                    } else {
                        logits = ct_llama_forward(m, x), loss = ct_llama_loss(m, x, y);
                    }
                }
                if (!logits || !loss) rc = failed(c, "forward");
                ct_tensor *want = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(t->B, t->T, t->cfg.vocab_size),
                                                      ref_logits(h));
                rc |= expect_rel(c, "forward", "logits", logits, want, t->tol_fwd, &worst_fwd);
                if (loss) rc |= expect_num(c, "forward loss", ct_tensor_item(loss), h->loss0, t->tol_fwd, &worst_fwd);
            }
        for (int s = 0; s < STEPS && !rc; s++) {
            for (int k = 0; k < ACC && !rc; k++) CT_FRAME {
                    ct_tensor *l = micro_loss(t, m, s, k);
                    if (!l || ct_backward(ct_mul_scalar(l, 1.0 / ACC))) rc = failed(c, "backward");
                    else
                        rc |= expect_num(c, "micro-batch loss", ct_tensor_item(l), h->losses[s][k], t->tol_fwd,
                                         &worst_fwd);
                }
            if (!rc && ct_llama_tp_sync_grads(m)) rc = failed(c, "sync_grads");
            if (rc) break;
            if (s == 0) rc |= check_slices(c, t, m, &full, ref_grads(h), true, t->tol_grad, "step-0 gradient");
            double norm = ct_llama_tp_clip_grad_norm(m, h->max_norm, 2.0);
            rc |= expect_num(c, "gradient norm", norm, h->norms[s], t->tol_grad, &worst_grad);
            if (ct_optimizer_step(opt)) rc = failed(c, "step");
            ct_optimizer_zero_grad(opt);
        }
        if (!rc) rc |= check_slices(c, t, m, &full, ref_params(h), false, t->tol_param, "parameter after 5 steps");
        report(c, "rank %d: largest errors: forward %.3g, gradients %.3g, parameters %.3g (%.3g of the largest)",
               c->rank, worst_fwd, worst_grad, worst_param, worst_param_of_max);
        ct_param_list_free(&full);
        ct_optimizer_free(opt);
        ct_module_free(m ? &m->base : NULL);
    }
    ct_pg_free(g);
    return rc;
}

/* the reference once, then each variant on n ranks */
static void run_case(tcase *t, int n, const bool *sp_variants, int nvariants)
{
    t->ref = ref_map(t);
    rank_result res[MAX_RANKS];
    run_ranks(1, reference_rank, t, res, 120);
    expect_all_ok(res, 1);
    for (int v = 0; v < nvariants && res[0].rc == 0; v++) {
        t->sp = sp_variants[v];
        run_ranks(n, tp_rank, t, res, 120);
        cr_log_info("%s on %d ranks, sequence parallel %s: %.2f s", t->name, n, t->sp ? "on" : "off", res[0].seconds);
        expect_all_ok(res, n);
    }
    ref_unmap(t);
}

static const bool both[] = {false, true};

/* The Llama W1 shape on a short sequence */
static const ct_llama_config w1 = {.vocab_size = 2048, .hidden_size = 256, .intermediate_size = 688,
                                   .num_hidden_layers = 4, .num_attention_heads = 4, .num_key_value_heads = 2,
                                   .max_position_embeddings = 64};
/* odd sizes: a vocabulary of 97 (padded), a pad token */
static const ct_llama_config odd = {.vocab_size = 97, .hidden_size = 48, .intermediate_size = 80,
                                    .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                                    .max_position_embeddings = 16, .token_ids_set = true, .bos_token_id = -1,
                                    .eos_token_id = -1, .pad_token_id = 3};

Test(llama_tp, w1_shape_on_2_ranks_trains_as_one_process, .timeout = 240)
{
    tcase t = {.name = "W1", .cfg = w1, .B = 4, .T = 32, .tol_fwd = 1e-5, .tol_grad = 1e-5, .tol_param = 1e-5};
    run_case(&t, 2, both, 2);
}

Test(llama_tp, odd_sizes_untied_and_tied_on_2_ranks, .timeout = 120)
{
    tcase t = {.name = "odd untied", .cfg = odd, .B = 2, .T = 8, .tol_fwd = 1e-5, .tol_grad = 1e-5,
               .tol_param = 1e-5};
    run_case(&t, 2, both, 2);
    t.name = "odd tied", t.cfg.tie_word_embeddings = true;
    run_case(&t, 2, both, 2);
}

/* 6 key/value heads over 4 ranks: neither divides the other, refused */
static int gqa_refused_rank(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 30, NULL);
    if (!g) return 1;
    int rc = 0;
    CT_FRAME {
        ct_llama_config bad = odd;
        bad.num_attention_heads = 12, bad.num_key_value_heads = 6; /* head_dim 4 */
        ct_llama *m = ct_llama_new(&bad);
        if (!m) rc = failed(c, "model");
        else
            rc = expect_error(c, "6 kv heads over 4", ct_llama_tensor_parallel(m, g, false) != CT_OK,
                              "tp 4 must divide num_attention_heads 12, and tp and num_key_value_heads 6 must divide "
                              "one another");
        ct_module_free(m ? &m->base : NULL);
    }
    ct_pg_free(g);
    return rc;
}

/* 4 key/value heads on 4 ranks; 97 is padded to 100 */
Test(llama_tp, odd_sizes_on_4_ranks, .timeout = 120)
{
    rank_result res[MAX_RANKS];
    run_ranks(4, gqa_refused_rank, NULL, res, 30);
    expect_all_ok(res, 4);
    tcase t = {.name = "odd on 4", .cfg = odd, .B = 2, .T = 8, .tol_fwd = 1e-5, .tol_grad = 1e-5,
               .tol_param = 1e-5};
    t.cfg.num_key_value_heads = 4;
    run_case(&t, 4, both, 2);
}

/* Fewer key/value heads than ranks: each rank keeps the head its query heads use,
 * replicated over tp / K ranks, whose gradient ct_llama_tp_sync_grads sums over them.
 * 2 heads over 4 ranks (untied and tied), 1 head over 2 ranks. */
Test(llama_tp, replicated_kv_heads_train_as_one_process, .timeout = 240)
{
    tcase t = {.name = "2 kv heads on 4", .cfg = odd, .B = 2, .T = 8, .tol_fwd = 1e-6, .tol_grad = 3e-6,
               .tol_param = 1e-5};
    run_case(&t, 4, both, 2);
    t.name = "2 kv heads on 4, tied", t.cfg.tie_word_embeddings = true;
    run_case(&t, 4, both, 1);
    t.name = "1 kv head on 2", t.cfg = odd, t.cfg.num_key_value_heads = 1;
    run_case(&t, 2, both, 2);
}

/* bf16 autocast: each side rounds its own partial products to 8 bits */
Test(llama_tp, bf16_tracks_the_bf16_single_process, .timeout = 120)
{
    tcase t = {.name = "odd bf16", .cfg = odd, .B = 2, .T = 8, .bf16 = true, .tol_fwd = 3e-2, .tol_grad = 5e-2,
               .tol_param = 5e-3};
    run_case(&t, 2, both, 2);
}

/* bad layouts and uses fail on every rank, naming the numbers, and leave the model as it was */
static int errors_rank(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 30, NULL);
    if (!g) return 1;
    int rc = 0;
    CT_FRAME {
        ct_llama_config bad = odd;
        bad.num_attention_heads = 6, bad.num_key_value_heads = 3; /* head_dim 8 */
        ct_llama *m = ct_llama_new(&bad);
        if (!m) rc = failed(c, "model 6/3 heads");
        else {
            rc |= expect_error(c, "3 kv heads over 2", ct_llama_tensor_parallel(m, g, false) != CT_OK,
                               "tp 2 must divide num_attention_heads 6, and tp and num_key_value_heads 3 must "
                               "divide one another");
            if (m->tp || m->blocks[0]->self_attn->q_proj->weight->shape[0] != 48 ||
                ct_llama_tp_shard_of(m, m->embed_tokens->weight)) {
                report(c, "rank %d: a refused conversion changed the model", c->rank);
                rc = 1;
            }
            ct_module_free(&m->base);
        }
        bad = odd, bad.intermediate_size = 81;
        m = ct_llama_new(&bad);
        if (!m) rc = failed(c, "model I 81");
        else {
            rc |= expect_error(c, "I 81 over 2", ct_llama_tensor_parallel(m, g, true) != CT_OK,
                               "tp 2 must divide intermediate_size 81");
            ct_module_free(&m->base);
        }
        rc |= expect_error(c, "NULL group", ct_llama_tensor_parallel(NULL, g, false) != CT_OK, "NULL model");

        m = ct_llama_new(&odd);
        if (!m || ct_llama_tensor_parallel(m, g, true)) {
            rc = failed(c, "odd model");
        } else {
            rc |= expect_error(c, "sharded twice", ct_llama_tensor_parallel(m, g, true) != CT_OK,
                               "already sharded over tp 2");
            int64_t v7[14] = {0}, bad_id[8] = {1, 2, 97, 4, 5, 6, 7, 8};
            ct_tensor *x7 = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 7), v7);
            rc |= expect_error(c, "T 7 over 2", !ct_llama_forward(m, x7), "tp 2 needs a sequence length that it "
                               "divides; T = 7");
            ct_tensor *xb = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 4), bad_id);
            rc |= expect_error(c, "id 97", !ct_llama_loss(m, xb, xb), "token id 97 at flat index 2");
            ct_kv_cache *kv = ct_kv_cache_new(2, 2, 2, 16, 12, CT_DTYPE_F32, CT_CPU);
            CT_NO_GRAD rc |= expect_error(c, "cached forward", !ct_llama_forward_cached(m, xb, kv), "cached");
            ct_kv_cache_free(kv);
            rc |= expect_error(c, "save", ct_llama_save_pretrained(m, "unused-dir") != CT_OK,
                               "sharded for tensor parallelism");
            /* the group still works: a good batch after the errors */
            int64_t ok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
            ct_tensor *xg = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 4), ok);
            ct_tensor *l = ct_llama_loss(m, xg, xg);
            if (!l || !isfinite(ct_tensor_item(l)) || ct_backward(l) || ct_llama_tp_sync_grads(m) ||
                !isfinite(ct_llama_tp_grad_norm(m, INFINITY)))
                rc = failed(c, "a step after the errors");
            rc |= expect_error(c, "norm_type 0", isnan(ct_llama_tp_grad_norm(m, 0)), "norm_type 0");
        }
        ct_module_free(m ? &m->base : NULL);
    }
    ct_pg_free(g);
    return rc;
}

Test(llama_tp, bad_layouts_and_uses_name_the_numbers, .timeout = 60)
{
    rank_result res[MAX_RANKS];
    run_ranks(2, errors_rank, NULL, res, 50);
    expect_all_ok(res, 2);
}
