/* Tests for nn/gpt_tp.c on fork()ed ranks: the GPT sharded over a tensor-parallel
 * group (with and without sequence parallelism) against the unsharded GPT built on
 * each rank from the same seed. The loss, the gathered logits, every rank's
 * parameter gradients (its slice of the unsharded gradient, cut here from the
 * layout, with zeros on the vocabulary padding), the clipping norm, and the
 * parameters after AdamW steps with clipping and gradient accumulation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/threads.h"
#include "dist/work.h"
#include "nn/gpt.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "precision/autocast.h"
#include "tests/nn/tp_check.h"

typedef struct gpt_tp_arg {
    ct_gpt_config cfg;
    int64_t B, T;
    bool sp;
    bool bf16;
    int steps; /* AdamW steps after the gradient check; 0: none */
} gpt_tp_arg;

static int failed(rank_ctx *c, const char *what)
{
    report(c, "rank %d: %s: %s", c->rank, what, ct_last_error());
    return 1;
}

/* deterministic tokens (B, T) in [0, V), different per salt; targets get a few -1 */
static ct_tensor *tokens(int64_t B, int64_t T, int64_t V, int salt, bool ignore_some)
{
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(B, T));
    int64_t *p = ct_tensor_data(t);
    for (int64_t i = 0; i < B * T; i++) {
        p[i] = (i * 37 + salt * 101 + (i * i) % 13) % V;
        if (ignore_some && i % 11 == 3) p[i] = -1;
    }
    return t;
}

/* What rank r of n must hold of the full parameter `name` (GPT-2's layout written out
 * here): c_attn the q, k and v columns of its heads; c_proj's rows; c_fc's columns;
 * wte's rows of the vocabulary padded to a multiple of n; the rest whole. */
static ct_tensor *expected_part(ct_tensor *full, const char *name, const ct_gpt_config *cfg, int n, int r)
{
    int64_t C = cfg->n_embd, Vp = (cfg->vocab_size + n - 1) / n * n;
    bool weight = strstr(name, ".weight") != NULL;
    if (!strcmp(name, "wte.weight")) return slice_padded(full, 0, r * Vp / n, (r + 1) * Vp / n);
    if (strstr(name, "attn.c_attn")) {
        int dim = weight ? 1 : 0;
        ct_tensor *qkv[3];
        for (int j = 0; j < 3; j++) qkv[j] = ct_tensor_narrow(full, dim, j * C + r * C / n, C / n);
        return ct_concat(3, qkv, dim);
    }
    if (strstr(name, "attn.c_proj.weight")) return ct_tensor_narrow(full, 0, r * C / n, C / n);
    if (strstr(name, "mlp.c_fc")) return ct_tensor_narrow(full, weight ? 1 : 0, r * 4 * C / n, 4 * C / n);
    if (strstr(name, "mlp.c_proj.weight")) return ct_tensor_narrow(full, 0, r * 4 * C / n, 4 * C / n);
    return full;
}

/* The shard record of `name` against the layout above. */
static int check_record(rank_ctx *c, const ct_gpt *m, const char *name, const ct_tensor *param, int n, int r)
{
    const ct_gpt_tp_shard *s = ct_gpt_tp_shard_of(m, name, NULL);
    const ct_gpt_config *cfg = &m->cfg;
    int64_t C = cfg->n_embd, Vp = (cfg->vocab_size + n - 1) / n * n;
    ct_gpt_tp_shard want = {.shard = {.dim = -1}, .parts = 1, .partial_grad = true};
    bool weight = strstr(name, ".weight") != NULL;
    if (!strcmp(name, "wte.weight"))
        want = (ct_gpt_tp_shard){{0, r * Vp / n, (r + 1) * Vp / n, cfg->vocab_size, 0}, 1, false};
    else if (strstr(name, "attn.c_attn"))
        want = (ct_gpt_tp_shard){{weight ? 1 : 0, r * C / n, (r + 1) * C / n, C, 0}, 3, false};
    else if (strstr(name, "attn.c_proj.weight"))
        want = (ct_gpt_tp_shard){{0, r * C / n, (r + 1) * C / n, C, 0}, 1, false};
    else if (strstr(name, "mlp.c_fc"))
        want = (ct_gpt_tp_shard){{weight ? 1 : 0, r * 4 * C / n, (r + 1) * 4 * C / n, 4 * C, 0}, 1, false};
    else if (strstr(name, "mlp.c_proj.weight"))
        want = (ct_gpt_tp_shard){{0, r * 4 * C / n, (r + 1) * 4 * C / n, 4 * C, 0}, 1, false};
    bool ok = s && s == ct_gpt_tp_shard_of(m, NULL, param) && s->shard.dim == want.shard.dim &&
              s->parts == want.parts && s->partial_grad == want.partial_grad &&
              (want.shard.dim < 0 || (s->shard.start == want.shard.start && s->shard.end == want.shard.end &&
                                      s->shard.full == want.shard.full));
    if (ok) return 0;
    report(c, "rank %d: %s: shard record %s; want dim %d [%lld, %lld) of %lld x %d", c->rank, name,
           s ? "differs" : "missing", want.shard.dim, (long long)want.shard.start, (long long)want.shard.end,
           (long long)want.shard.full, want.parts);
    return 1;
}

/* max |got - want| / max |want| over the tensor: for bf16, whose rounding is relative
 * to the tensor's scale */
static double scaled_err(const ct_tensor *got, const ct_tensor *want)
{
    if (!got || !want || !ct_tensor_same_shape(got, want)) return INFINITY;
    ct_tensor *a = ct_tensor_contiguous(ct_tensor_cast(got, CT_DTYPE_F64));
    ct_tensor *b = ct_tensor_contiguous(ct_tensor_cast(want, CT_DTYPE_F64));
    const double *p = ct_tensor_data(a), *q = ct_tensor_data(b);
    double e = 0, s = 0;
    for (int64_t i = 0, n = ct_tensor_numel(a); i < n; i++) {
        if (!(fabs(p[i] - q[i]) <= e)) e = fabs(p[i] - q[i]);
        s = fmax(s, fabs(q[i]));
    }
    return e / fmax(s, 1e-30);
}

/* every parameter (or its gradient) of the sharded model against its part of the
 * unsharded one's */
static int compare_params(rank_ctx *c, ct_gpt *tpm, ct_gpt *ref, int n, int r, bool grads, double tol, bool scaled,
                          const char *when)
{
    ct_param_list l = {0};
    if (ct_module_named_tensors(&ref->base, false, &l)) return failed(c, "named_tensors");
    int rc = 0;
    for (int i = 0; i < l.n && !rc; i++) {
        ct_tensor *mine = ct_module_find(&tpm->base, l.names[i]);
        ct_tensor *full = grads ? l.tensors[i]->grad : l.tensors[i];
        if (!mine || !full) {
            report(c, "rank %d: %s: %s missing", c->rank, when, l.names[i]);
            rc = 1;
            break;
        }
        ct_tensor *got = grads ? mine->grad : mine;
        ct_tensor *want = expected_part(full, l.names[i], &ref->cfg, n, r);
        char what[160];
        snprintf(what, sizeof what, "%s: %s%s", when, l.names[i], grads ? " grad" : "");
        if (scaled) {
            double e = scaled_err(got, want);
            if (!(e <= tol)) {
                report(c, "rank %d: %s: scaled error %g > %g", c->rank, what, e, tol);
                rc = 1;
            }
        } else {
            rc |= expect_close(c, what, got, want, tol);
        }
        if (!grads) rc |= check_record(c, tpm, l.names[i], mine, n, r);
    }
    ct_param_list_free(&l);
    return rc;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(1.0, fabs(b)); }

/* the loss of one micro-batch, under bf16 autocast when asked */
static ct_tensor *loss_of(ct_gpt *m, ct_tensor *x, ct_tensor *y, bool bf16)
{
    ct_tensor *loss = NULL;
    if (bf16) {
        CT_AUTOCAST(CT_DTYPE_BF16) loss = ct_gpt_loss(m, x, y);
    } else {
        loss = ct_gpt_loss(m, x, y);
    }
    return loss;
}

static ct_optimizer *adamw_of(ct_gpt *m)
{
    ct_param_list l = {0};
    if (ct_module_named_tensors(&m->base, false, &l)) return NULL;
    ct_optimizer *o = ct_adamw_new(l.n, l.tensors, &(ct_adamw_config){.lr = 1e-3, .weight_decay = 0.1});
    ct_param_list_free(&l);
    return o;
}

static int gpt_tp_rank(rank_ctx *c)
{
    const gpt_tp_arg *a = c->arg;
    ct_pg *g = rank_pg(c, 60, NULL);
    if (!g) return 1;
    ct_set_num_threads(1); /* the ranks share the machine's cores */
    int n = ct_pg_size(g), r = ct_pg_rank(g), rc = 0;
    int64_t V = a->cfg.vocab_size;
    /* bf16 runs both sides in bf16: the sharded one rounds its partial sums */
    double tol = a->bf16 ? 3e-2 : 1e-5;
    ct_gpt *ref = NULL, *tpm = NULL;
    ct_optimizer *oref = NULL, *otp = NULL;
    CT_FRAME {
        ct_set_seed(1234);
        ref = ct_gpt_new(&a->cfg);
        ct_set_seed(1234);
        tpm = ct_gpt_new(&a->cfg);
        if (!ref || !tpm || ct_gpt_tensor_parallel(tpm, g, a->sp)) {
            rc = failed(c, "gpt_new / gpt_tensor_parallel");
            break;
        }
        /* dropout: the unsharded model draws its masks from a copy of the sharded one's
         * stream, as one process with that generator would */
        ct_rng ref_rng = {0};
        if (a->cfg.dropout > 0) {
            ref_rng = *ct_gpt_tp_dropout_rng(tpm);
            ref->drop->rng = &ref_rng;
            for (int64_t i = 0; i < a->cfg.n_layer; i++)
                ref->blocks[i]->attn->resid_dropout->rng = ref->blocks[i]->mlp->dropout->rng = &ref_rng;
        }
        /* parameters and records right after sharding */
        rc |= compare_params(c, tpm, ref, n, r, false, 0, false, "sharded");

        /* loss and gradients of one batch */
        ct_tensor *x = tokens(a->B, a->T, V, 1, false), *y = tokens(a->B, a->T, V, 2, true);
        ct_tensor *lt = loss_of(tpm, x, y, a->bf16), *lr = loss_of(ref, x, y, a->bf16);
        if (!lt || !lr || ct_backward(lt) || ct_backward(lr) || ct_gpt_tp_sync_grads(tpm)) {
            rc = failed(c, "loss / backward");
            break;
        }
        double e = rel(ct_tensor_item(lt), ct_tensor_item(lr));
        if (!(e <= tol)) {
            report(c, "rank %d: loss %.9g, unsharded %.9g (relative %g > %g)", c->rank, ct_tensor_item(lt),
                   ct_tensor_item(lr), e, tol);
            rc = 1;
        }
        rc |= compare_params(c, tpm, ref, n, r, true, a->bf16 ? 6e-2 : 1e-5, a->bf16, "one batch");
        ct_param_list l = {0};
        ct_module_named_tensors(&ref->base, false, &l);
        double nref = ct_grad_norm(l.n, l.tensors, 2.0);
        ct_param_list_free(&l);
        double ntp = ct_gpt_tp_grad_norm(tpm);
        if (!(rel(ntp, nref) <= (a->bf16 ? 3e-2 : 1e-5))) {
            report(c, "rank %d: grad norm %.9g, unsharded %.9g", c->rank, ntp, nref);
            rc = 1;
        }

        /* the gathered logits, without grad */
        if (!a->bf16) {
            CT_NO_GRAD
            {
                rc |= expect_close(c, "logits", ct_gpt_forward(tpm, x), ct_gpt_forward(ref, x), 1e-5);
            }
        }
        if (rc || !a->steps) break;

        /* AdamW steps, 2 micro-batches each, clipped by the global norm */
        ct_module_zero_grad(&ref->base);
        ct_module_zero_grad(&tpm->base);
        oref = adamw_of(ref), otp = adamw_of(tpm);
        if (!oref || !otp) {
            rc = failed(c, "adamw_new");
            break;
        }
        for (int s = 0; s < a->steps && !rc; s++) {
            CT_FRAME {
                for (int k = 0; k < 2 && !rc; k++) {
                    ct_tensor *xs = tokens(a->B, a->T, V, 10 + 2 * s + k, false);
                    ct_tensor *ys = tokens(a->B, a->T, V, 50 + 2 * s + k, true);
                    ct_tensor *l1 = loss_of(tpm, xs, ys, a->bf16), *l2 = loss_of(ref, xs, ys, a->bf16);
                    if (!l1 || !l2 || ct_backward(ct_mul_scalar(l1, 0.5)) || ct_backward(ct_mul_scalar(l2, 0.5))) {
                        rc = failed(c, "micro-batch");
                        break;
                    }
                    /* bf16: the losses along the way track the unsharded run's */
                    if (!(rel(ct_tensor_item(l1), ct_tensor_item(l2)) <= tol)) {
                        report(c, "rank %d: step %d micro-batch %d: loss %.9g, unsharded %.9g", c->rank, s, k,
                               ct_tensor_item(l1), ct_tensor_item(l2));
                        rc = 1;
                    }
                }
                if (rc) break;
                if (ct_gpt_tp_sync_grads(tpm)) {
                    rc = failed(c, "sync_grads");
                    break;
                }
                ct_param_list pl = {0};
                ct_module_named_tensors(&ref->base, false, &pl);
                /* a small max_norm: every step clips */
                double n1 = ct_gpt_tp_clip_grad_norm(tpm, 0.05), n2 = ct_clip_grad_norm(pl.n, pl.tensors, 0.05, 2.0);
                ct_param_list_free(&pl);
                if (!(rel(n1, n2) <= (a->bf16 ? 3e-2 : 1e-5)) || !(n2 > 0.05)) {
                    report(c, "rank %d: step %d: clip norm %.9g, unsharded %.9g (must exceed 0.05)", c->rank, s, n1,
                           n2);
                    rc = 1;
                }
                if (ct_optimizer_step(otp) || ct_optimizer_step(oref)) rc = failed(c, "step");
                ct_optimizer_zero_grad(otp);
                ct_optimizer_zero_grad(oref);
            }
        }
        /* f32: the parameters too (bf16 rounding flips the sign of Adam's tiny updates) */
        if (!rc && !a->bf16) rc |= compare_params(c, tpm, ref, n, r, false, 1e-5, false, "after the steps");
        /* the whole model back on every rank: the unsharded parameters */
        if (!rc && !a->bf16) {
            ct_gpt *whole = ct_gpt_tp_gather_model(tpm);
            if (!whole) {
                rc = failed(c, "gather_model");
                break;
            }
            ct_param_list lw = {0}, lr2 = {0};
            ct_module_named_tensors(&whole->base, false, &lw);
            ct_module_named_tensors(&ref->base, false, &lr2);
            for (int i = 0; i < lw.n && i < lr2.n; i++) {
                char what[160];
                snprintf(what, sizeof what, "gathered %s", lw.names[i]);
                rc |= expect_close(c, what, lw.tensors[i], lr2.tensors[i], 1e-5);
            }
            if (lw.n != lr2.n) {
                report(c, "rank %d: gathered %d parameters, want %d", c->rank, lw.n, lr2.n);
                rc = 1;
            }
            ct_param_list_free(&lw);
            ct_param_list_free(&lr2);
            ct_module_free(&whole->base);
        }
    }
    ct_optimizer_free(oref);
    ct_optimizer_free(otp);
    ct_module_free(ref ? &ref->base : NULL);
    ct_module_free(tpm ? &tpm->base : NULL);
    ct_pg_free(g);
    return rc;
}

static void run_gpt(int world, gpt_tp_arg a)
{
    rank_result res[MAX_RANKS];
    run_ranks(world, gpt_tp_rank, &a, res, 100);
    expect_all_ok(res, world);
}

/* the W1 shape on a short sequence */
static const ct_gpt_config W1 = {.vocab_size = 256, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 256};
/* a vocabulary that no tp size divides */
static const ct_gpt_config ODD = {.vocab_size = 97, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 48};

Test(gpt_tp, w1_on_2_ranks_trains_as_one_process, .timeout = 120)
{
    run_gpt(2, (gpt_tp_arg){.cfg = W1, .B = 4, .T = 32, .steps = 5});
}
Test(gpt_tp, w1_on_2_ranks_sequence_parallel_trains_as_one_process, .timeout = 120)
{
    run_gpt(2, (gpt_tp_arg){.cfg = W1, .B = 4, .T = 32, .sp = true, .steps = 5});
}
Test(gpt_tp, odd_vocab_on_2_ranks, .timeout = 60)
{
    run_gpt(2, (gpt_tp_arg){.cfg = ODD, .B = 2, .T = 12, .steps = 3});
}
Test(gpt_tp, odd_vocab_on_4_ranks_sequence_parallel, .timeout = 60)
{
    run_gpt(4, (gpt_tp_arg){.cfg = ODD, .B = 2, .T = 12, .sp = true, .steps = 3});
}
Test(gpt_tp, odd_vocab_on_4_ranks, .timeout = 60)
{
    run_gpt(4, (gpt_tp_arg){.cfg = ODD, .B = 2, .T = 12, .steps = 2});
}
/* dropout without sequence parallelism: every rank draws the masks one process draws */
Test(gpt_tp, dropout_on_2_ranks_trains_as_one_process, .timeout = 60)
{
    ct_gpt_config cfg = ODD;
    cfg.dropout = 0.2;
    run_gpt(2, (gpt_tp_arg){.cfg = cfg, .B = 2, .T = 12, .steps = 3});
}

/* dropout under sequence parallelism: each rank's stream is its own (its chunk of the
 * sequence gets its own masks), training mode draws, evaluation does not */
static int sp_dropout_rank(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, NULL);
    if (!g) return 1;
    ct_set_num_threads(1);
    int rc = 0, n = ct_pg_size(g);
    ct_gpt *m = NULL;
    CT_FRAME {
        ct_gpt_config cfg = ODD;
        cfg.dropout = 0.2;
        ct_set_seed(7);
        m = ct_gpt_new(&cfg);
        if (!m || ct_gpt_tensor_parallel(m, g, true)) {
            rc = failed(c, "shard");
            break;
        }
        ct_rng *rng = ct_gpt_tp_dropout_rng(m);
        if (!rng || m->drop->rng != rng || m->blocks[1]->mlp->dropout->rng != rng) {
            report(c, "rank %d: the dropout layers do not use the model's stream", c->rank);
            rc = 1;
            break;
        }
        int64_t mine = (int64_t)rng->seed;
        ct_tensor *all = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(n));
        if (ct_work_run(ct_pg_allgather(g, all, ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), &mine)))) {
            rc = failed(c, "allgather");
            break;
        }
        const int64_t *seeds = ct_tensor_data(all);
        for (int i = 1; i < n; i++)
            if (seeds[i] == seeds[0]) {
                report(c, "rank %d: ranks 0 and %d share the dropout seed %lld", c->rank, i, (long long)seeds[0]);
                rc = 1;
            }
        ct_tensor *x = tokens(2, 12, cfg.vocab_size, 1, false), *y = tokens(2, 12, cfg.vocab_size, 2, false);
        ct_tensor *l1 = ct_gpt_loss(m, x, y);
        uint64_t used = rng->offset;
        ct_module_train(&m->base, false);
        ct_tensor *l2 = ct_gpt_loss(m, x, y), *l3 = ct_gpt_loss(m, x, y);
        if (!l1 || !l2 || !l3 || !isfinite(ct_tensor_item(l1)) || used == 0 || rng->offset != used ||
            ct_tensor_item(l1) == ct_tensor_item(l2) || ct_tensor_item(l2) != ct_tensor_item(l3)) {
            report(c, "rank %d: training loss %g (%llu words drawn), evaluation %g and %g", c->rank,
                   l1 ? ct_tensor_item(l1) : NAN, (unsigned long long)used, l2 ? ct_tensor_item(l2) : NAN,
                   l3 ? ct_tensor_item(l3) : NAN);
            rc = 1;
        }
    }
    ct_module_free(m ? &m->base : NULL);
    ct_pg_free(g);
    return rc;
}

Test(gpt_tp, dropout_under_sequence_parallelism_differs_per_rank, .timeout = 30)
{
    rank_result res[MAX_RANKS];
    run_ranks(2, sp_dropout_rank, NULL, res, 20);
    expect_all_ok(res, 2);
}

/* bf16 autocast on both sides: the sharded model tracks the unsharded bf16 run */
Test(gpt_tp, bf16_on_2_ranks_tracks_one_process, .timeout = 60)
{
    run_gpt(2, (gpt_tp_arg){.cfg = ODD, .B = 2, .T = 12, .sp = true, .bf16 = true, .steps = 2});
}

/* bad sizes and uses fail on every rank with the numbers named, and nothing hangs */
static int errors_rank(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, NULL);
    if (!g) return 1;
    int rc = 0;
    ct_gpt *m = NULL;
    CT_FRAME {
        ct_gpt_config cfg = {.vocab_size = 11, .block_size = 16, .n_layer = 1, .n_head = 3, .n_embd = 12};
        m = ct_gpt_new(&cfg);
        rc |= expect_error(c, "3 heads over 2", ct_gpt_tensor_parallel(m, g, false) != CT_OK,
                           "tp 2 must divide n_head 3");
        if (m->tp || m->blocks[0]->attn->c_attn->weight->shape[1] != 36) {
            report(c, "rank %d: a failed gpt_tensor_parallel changed the model", c->rank);
            rc = 1;
        }
        ct_module_free(&m->base);
        cfg.n_head = 2;
        m = ct_gpt_new(&cfg);
        if (ct_gpt_tensor_parallel(m, g, true)) {
            rc = failed(c, "shard");
            break;
        }
        rc |= expect_error(c, "twice", ct_gpt_tensor_parallel(m, g, true) != CT_OK, "already sharded over tp 2");
        ct_tensor *x = tokens(1, 5, 11, 1, false);
        rc |= expect_error(c, "T 5 under SP", !ct_gpt_loss(m, x, x), "sequence length T 5 divisible by tp 2");
        x = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, 2), (const int64_t[]){3, 11});
        rc |= expect_error(c, "token 11 of 11", !ct_gpt_forward(m, x), "token id 11 at flat index 1");
        CT_NO_GRAD
        {
            ct_kv_cache *kv = ct_kv_cache_new(1, 1, 2, 16, 6, CT_DTYPE_F32, CT_CPU);
            rc |= expect_error(c, "cached", kv && !ct_gpt_forward_cached(m, x, kv), "sharded for tensor parallelism");
            ct_kv_cache_free(kv);
        }
        /* its tensors are slices under the full names: never written as a whole model */
        rc |= expect_error(c, "save_hf", ct_gpt_save_hf(m, "/nonexistent-dir/never") != CT_OK,
                           "sharded for tensor parallelism; save ct_gpt_tp_gather_model(m) instead");
        /* the group still works: a loss on a good batch */
        x = tokens(2, 4, 11, 3, false);
        ct_tensor *loss = ct_gpt_loss(m, x, x);
        if (!loss || !isfinite(ct_tensor_item(loss))) rc = failed(c, "loss after the errors");
    }
    ct_module_free(m ? &m->base : NULL);
    ct_pg_free(g);
    return rc;
}

Test(gpt_tp, bad_sizes_name_the_numbers, .timeout = 30)
{
    rank_result res[MAX_RANKS];
    run_ranks(2, errors_rank, NULL, res, 20);
    expect_all_ok(res, 2);
}
