/* ctrain — the GPT sharded for tensor (and sequence) parallelism (see nn/gpt.h).
 *
 * Sharding replaces the parameters of the column- and row-parallel linears and of wte
 * by new tensors holding this rank's slice, registered under the same names (the
 * modules keep their types; the blocks' forwards branch on their tp group). The
 * records of what each parameter holds live here, one per parameter.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "dist/work.h"
#include "nn/gpt_tp_internal.h"
#include "nn/tp_internal.h"
#include "nn/tp_ops.h"
#include "optim/clip.h"
#include "precision/autocast.h"

struct ct_gpt_tp {
    ct_pg *g; /* borrowed */
    int n, r;
    bool sp;
    /* the dropout layers' stream: the same on every rank without sequence parallelism
     * (the dropouts act on replicated activations), one per rank with it (they act on
     * the rank's chunk of the sequence) */
    ct_rng rng;
    int64_t vocab_padded, v_start, v_end; /* wte's rows on this rank: [v_start, v_end) of Vp */
    int count;
    char **names;         /* owned */
    ct_tensor **params;   /* borrowed from the model */
    ct_gpt_tp_shard *shards;
};

void cti_gpt_tp_free(ct_gpt_tp *t)
{
    if (!t) return;
    for (int i = 0; i < t->count; i++) free(t->names[i]);
    free(t->names);
    free(t->params);
    free(t->shards);
    free(t);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* What the parameter called name holds on rank r of n (C = n_embd, Vp the padded
 * vocabulary). */
static ct_gpt_tp_shard shard_for(const char *name, const ct_gpt_config *c, int n, int r, int64_t Vp)
{
    int64_t C = c->n_embd;
    ct_gpt_tp_shard s = {.shard = {.dim = -1}, .parts = 1};
    if (!strcmp(name, "wte.weight"))
        s.shard = (ct_tp_shard){.dim = 0, .start = r * (Vp / n), .end = (r + 1) * (Vp / n), .full = c->vocab_size};
    else if (ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_attn.bias"))
        s = (ct_gpt_tp_shard){.shard = {.dim = ends_with(name, "weight") ? 1 : 0, .start = r * (C / n),
                                        .end = (r + 1) * (C / n), .full = C},
                              .parts = 3};
    else if (ends_with(name, ".attn.c_proj.weight"))
        s.shard = (ct_tp_shard){.dim = 0, .start = r * (C / n), .end = (r + 1) * (C / n), .full = C};
    else if (ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_fc.bias"))
        s.shard = (ct_tp_shard){.dim = ends_with(name, "weight") ? 1 : 0, .start = r * (4 * C / n),
                                .end = (r + 1) * (4 * C / n), .full = 4 * C};
    else if (ends_with(name, ".mlp.c_proj.weight"))
        s.shard = (ct_tp_shard){.dim = 0, .start = r * (4 * C / n), .end = (r + 1) * (4 * C / n), .full = 4 * C};
    else
        s.partial_grad = true; /* wpe, layernorms, row-parallel biases: used on the sequence chunk */
    return s;
}

/* This rank's part of full (a new contiguous tensor, current frame): in each of the
 * record's parts, indices [start, end) of dim, zeros past full (padding). */
static ct_tensor *take_shard(const ct_tensor *full, const ct_gpt_tp_shard *s)
{
    const ct_tp_shard *d = &s->shard;
    if (s->parts == 1) return cti_tp_take_slice(full, d->dim, d->start, d->end);
    int64_t shape[CT_MAX_DIMS], len = d->end - d->start;
    for (int i = 0; i < full->ndim; i++) shape[i] = full->shape[i];
    shape[d->dim] = s->parts * len;
    ct_tensor *out = ct_tensor_zeros(full->dtype, full->ndim, shape);
    for (int j = 0; out && j < s->parts; j++) {
        ct_tensor *src = ct_tensor_narrow((ct_tensor *)full, d->dim, j * d->full + d->start, len);
        ct_tensor *dst = ct_tensor_narrow(out, d->dim, j * len, len);
        if (!src || !dst || ct_tensor_copy_(dst, src)) return NULL;
    }
    return out;
}

/* Replaces the parameter old by fresh (one reference taken) wherever m's tree
 * registers it; true when found. */
static bool replace_param(ct_module *m, const ct_tensor *old, ct_tensor *fresh)
{
    bool found = false;
    for (int i = 0; i < m->nparams; i++) {
        if (m->params[i].tensor != old) continue;
        ct_tensor_release(m->params[i].tensor);
        m->params[i].tensor = ct_tensor_retain(fresh);
        found = true;
    }
    for (int i = 0; i < m->nchildren; i++) found |= replace_param(m->children[i].module, old, fresh);
    return found;
}

/* The typed fields follow the registered parameters. */
static void refresh_linear(ct_linear_layer *l, int64_t in, int64_t out)
{
    l->weight = ct_module_find(&l->base, "weight");
    l->bias = ct_module_find(&l->base, "bias");
    l->in = in, l->out = out;
}

ct_status ct_gpt_tensor_parallel(ct_gpt *m, ct_pg *tp, bool sequence_parallel)
{
    const char *op = "gpt_tensor_parallel";
    if (!m || !tp) return ct_error_set(CT_ERR_INVALID, "%s: NULL model or tensor-parallel group", op);
    int n = ct_pg_size(tp), r = ct_pg_rank(tp);
    const ct_gpt_config *c = &m->cfg;
    if (m->tp)
        return ct_error_set(CT_ERR_INVALID, "%s: the model is already sharded over tp %d", op, ct_pg_size(m->tp->g));
    if (c->n_head % n || (4 * c->n_embd) % n)
        return ct_error_set(CT_ERR_INVALID,
                            "%s: tp %d must divide n_head %lld (attention is split by heads) and 4 * n_embd %lld (the "
                            "MLP's width)", op, n, (long long)c->n_head, (long long)(4 * c->n_embd));
    char dev[32];
    if (m->wte->weight->device.type != CT_DEVICE_CPU)
        return ct_error_set(CT_ERR_INVALID, "%s: the parameters are on %s; tensor parallelism runs on the CPU", op,
                            ct_device_str(m->wte->weight->device, dev, sizeof dev));
    int64_t Vp = ct_tp_vocab_padded(c->vocab_size, n, 1);
    if (Vp < 0) return ct_error_prefix("%s: ", op);
    /* the dropout stream's seed: drawn on rank 0 from the process generator, broadcast */
    uint64_t seed = 0;
    if (c->dropout > 0) {
        uint32_t w[2] = {0, 0};
        if (r == 0) ct_rng_u32(ct_rng_default(), w, 2);
        int64_t v = (int64_t)((uint64_t)w[1] << 32 | w[0]);
        ct_status bst = CT_OK;
        CT_FRAME {
            ct_tensor *b = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), &v);
            bst = b ? ct_work_run(ct_pg_broadcast(tp, b, 0)) : ct_last_status();
            if (!bst) v = ((const int64_t *)ct_tensor_data(b))[0];
        }
        if (bst) return ct_error_prefix("%s: broadcasting the dropout seed: ", op);
        seed = (uint64_t)v;
    }

    ct_param_list list = {0};
    if (ct_module_named_tensors(&m->base, false, &list)) return ct_error_prefix("%s: ", op);
    ct_gpt_tp *t = calloc(1, sizeof *t);
    if (t) {
        t->names = calloc((size_t)list.n + 1, sizeof *t->names);
        t->params = calloc((size_t)list.n + 1, sizeof *t->params);
        t->shards = calloc((size_t)list.n + 1, sizeof *t->shards);
    }
    ct_tensor **fresh = calloc((size_t)list.n + 1, sizeof *fresh);
    bool allocated = t && t->names && t->params && t->shards && fresh;
    ct_status st = allocated ? CT_OK : ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
    /* every slice first, so that a failure leaves the model as it was */
    ct_frame_push();
    bool prev = ct_grad_set_enabled(false);
    for (int i = 0; !st && i < list.n; i++) {
        ct_gpt_tp_shard s = shard_for(list.names[i], c, n, r, Vp);
        t->shards[i] = s;
        t->params[i] = list.tensors[i];
        if (!(t->names[i] = strdup(list.names[i]))) st = ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
        t->count = i + 1;
        if (st || s.shard.dim < 0) continue;
        if (!(fresh[i] = take_shard(list.tensors[i], &s)))
            st = ct_error_prefix("%s: slicing %s: ", op, list.names[i]);
        else
            ct_tensor_retain(fresh[i]);
    }
    ct_grad_set_enabled(prev);
    ct_frame_pop();
    for (int i = 0; !st && i < list.n; i++) {
        if (!fresh[i]) continue;
        ct_tensor_set_requires_grad(fresh[i], true);
        replace_param(&m->base, list.tensors[i], fresh[i]);
        t->params[i] = fresh[i];
    }
    for (int i = 0; i < list.n; i++) ct_tensor_release(fresh[i]); /* the modules hold them now */
    free(fresh);
    ct_param_list_free(&list);
    if (st) {
        cti_gpt_tp_free(t);
        return st;
    }
    t->g = tp, t->n = n, t->r = r, t->sp = sequence_parallel;
    /* under SP each rank's stream is its own (the golden-ratio step keeps the seeds apart) */
    ct_rng_init(&t->rng, sequence_parallel ? seed + 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1) : seed);
    m->drop->rng = &t->rng;
    t->vocab_padded = Vp, t->v_start = r * (Vp / n), t->v_end = (r + 1) * (Vp / n);
    m->tp = t;
    int64_t C = c->n_embd;
    m->wte->weight = ct_module_find(&m->wte->base, "weight");
    m->wte->num = Vp / n;
    for (int64_t i = 0; i < c->n_layer; i++) {
        ct_gpt_block *b = m->blocks[i];
        refresh_linear(b->attn->c_attn, C, 3 * C / n);
        refresh_linear(b->attn->c_proj, C / n, C);
        refresh_linear(b->mlp->c_fc, C, 4 * C / n);
        refresh_linear(b->mlp->c_proj, 4 * C / n, C);
        b->attn->tp = b->mlp->tp = tp;
        b->attn->resid_dropout->rng = b->mlp->dropout->rng = &t->rng;
        b->attn->sequence_parallel = b->mlp->sequence_parallel = sequence_parallel;
    }
    return CT_OK;
}

ct_rng *ct_gpt_tp_dropout_rng(ct_gpt *m) { return m && m->tp ? &m->tp->rng : NULL; }

ct_pg *ct_gpt_tp_group(const ct_gpt *m) { return m && m->tp ? m->tp->g : NULL; }

const ct_gpt_tp_shard *ct_gpt_tp_shard_of(const ct_gpt *m, const char *name, const ct_tensor *param)
{
    if (!m || !m->tp || (!name && !param)) return NULL;
    for (int i = 0; i < m->tp->count; i++)
        if (name ? !strcmp(m->tp->names[i], name) : m->tp->params[i] == param) return &m->tp->shards[i];
    return NULL;
}

ct_status ct_gpt_tp_sync_grads(ct_gpt *m)
{
    if (!m) return ct_error_set(CT_ERR_INVALID, "gpt_tp_sync_grads: NULL model");
    if (!m->tp || !m->tp->sp) return CT_OK;
    for (int i = 0; i < m->tp->count; i++) {
        ct_tensor *grad = m->tp->params[i]->grad;
        if (!m->tp->shards[i].partial_grad || !grad) continue;
        if (ct_work_run(ct_pg_allreduce(m->tp->g, grad, CT_REDUCE_SUM)))
            return ct_error_prefix("gpt_tp_sync_grads: %s: ", m->tp->names[i]);
    }
    return CT_OK;
}

/* The parameters of m (sharded: which = 1, replicated: which = 0, all: -1) that have
 * a gradient, into out (room for every parameter); returns how many. */
static int with_grads(const ct_gpt_tp *t, int which, ct_tensor **out)
{
    int k = 0;
    for (int i = 0; i < t->count; i++)
        if (t->params[i]->grad && (which < 0 || (t->shards[i].shard.dim >= 0) == (which == 1)))
            out[k++] = t->params[i];
    return k;
}

double ct_gpt_tp_grad_norm(ct_gpt *m)
{
    if (!m) {
        ct_error_set(CT_ERR_INVALID, "gpt_tp_grad_norm: NULL model");
        return NAN;
    }
    ct_param_list list = {0};
    if (!m->tp) {
        if (ct_module_named_tensors(&m->base, false, &list)) return NAN;
        double norm = ct_grad_norm(list.n, list.tensors, 2.0);
        ct_param_list_free(&list);
        return norm;
    }
    ct_tensor **ps = calloc((size_t)m->tp->count + 1, sizeof *ps);
    if (!ps) {
        ct_error_set(CT_ERR_NOMEM, "gpt_tp_grad_norm: out of memory");
        return NAN;
    }
    /* sum over tp of the shards' squares, plus the replicated squares once */
    double sharded = ct_grad_norm_sq(with_grads(m->tp, 1, ps), ps);
    double replicated = ct_grad_norm_sq(with_grads(m->tp, 0, ps), ps);
    free(ps);
    double total = NAN;
    CT_FRAME {
        ct_tensor *s = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1), &sharded);
        if (s && !ct_work_run(ct_pg_allreduce(m->tp->g, s, CT_REDUCE_SUM)))
            total = sqrt(((const double *)ct_tensor_data(s))[0] + replicated);
        else
            ct_error_prefix("gpt_tp_grad_norm: ");
    }
    return total;
}

double ct_gpt_tp_clip_grad_norm(ct_gpt *m, double max_norm)
{
    double total = ct_gpt_tp_grad_norm(m);
    if (isnan(total) && ct_last_status()) return NAN;
    ct_param_list list = {0};
    if (ct_module_named_tensors(&m->base, false, &list)) return NAN;
    int k = 0;
    for (int i = 0; i < list.n; i++)
        if (list.tensors[i]->grad) list.tensors[k++] = list.tensors[i];
    ct_status st = ct_grad_scale(k, list.tensors, ct_clip_coef(total, max_norm));
    ct_param_list_free(&list);
    return st ? NAN : total;
}

/* ---- the forward ------------------------------------------------------------------ */

/* wte's rows for ids (B, T) in [0, V): each rank looks up the ids in its rows (zeros
 * elsewhere), the rows are summed over tp (reduce-scattered along T under sequence
 * parallelism). */
static ct_tensor *embed_tokens(ct_gpt *m, ct_tensor *idx)
{
    const ct_gpt_tp *t = m->tp;
    ct_tensor *ids = ct_tensor_contiguous(ct_tensor_cast(idx, CT_DTYPE_I64));
    int64_t B = idx->shape[0], T = idx->shape[1];
    ct_tensor *local = ct_tensor_empty(CT_DTYPE_I64, 2, idx->shape);
    ct_tensor *mask = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(B, T, 1));
    if (!ids || !local || !mask) return NULL;
    const int64_t *p = ct_tensor_data(ids);
    int64_t *q = ct_tensor_data(local);
    float *k = ct_tensor_data(mask);
    for (int64_t i = 0; i < B * T; i++) {
        if (p[i] < 0 || p[i] >= m->cfg.vocab_size) {
            ct_error_set(CT_ERR_INVALID, "token id %lld at flat index %lld is outside the vocabulary of "
                         "%lld", (long long)p[i], (long long)i, (long long)m->cfg.vocab_size);
            return NULL;
        }
        bool mine = p[i] >= t->v_start && p[i] < t->v_end;
        q[i] = mine ? p[i] - t->v_start : 0;
        k[i] = mine ? 1.0f : 0.0f;
    }
    ct_tensor *w = m->wte->weight;
    if (w->dtype != CT_DTYPE_F32) mask = ct_tensor_cast(mask, w->dtype);
    ct_tensor *y = ct_mul(ct_embedding_layer_forward(m->wte, local), mask);
    return t->sp ? ct_tp_reduce_scatter_to_sequence(t->g, y, 1) : ct_tp_reduce_from(t->g, y);
}

/* Checks tokens idx for a sharded forward; the caller prefixes errors. */
static ct_status check_tokens(const ct_gpt *m, const ct_tensor *idx)
{
    const ct_gpt_tp *t = m->tp;
    char d[200];
    if (idx->ndim != 2 || idx->shape[1] > m->cfg.block_size || idx->shape[1] < 1 || ct_dtype_is_float(idx->dtype))
        return ct_error_set(CT_ERR_INVALID, "idx %s must be integer tokens (B, T) with 1 <= T <= block_size %lld",
                            ct_tensor_describe(idx, d, sizeof d), (long long)m->cfg.block_size);
    int64_t T = idx->shape[1];
    if (t->sp && T % t->n)
        return ct_error_set(CT_ERR_INVALID, "sequence parallelism needs the sequence length T %lld divisible by tp %d",
                            (long long)T, t->n);
    if (idx->device.type != CT_DEVICE_CPU)
        return ct_error_set(CT_ERR_INVALID, "idx on %s; a tensor-parallel GPT runs on the CPU",
                            ct_device_str(idx->device, d, sizeof d));
    return CT_OK;
}

ct_tensor *cti_gpt_tp_embed(ct_gpt *m, ct_tensor *idx)
{
    const ct_gpt_tp *t = m->tp;
    if (check_tokens(m, idx)) return NULL;
    int64_t T = idx->shape[1];
    /* positions of this rank's chunk of the sequence under SP, else all of them */
    int64_t p0 = t->sp ? t->r * (T / t->n) : 0, p1 = t->sp ? p0 + T / t->n : T;
    ct_tensor *pos = ct_tensor_arange(CT_DTYPE_I64, (double)p0, (double)p1, 1);
    ct_tensor *x = ct_add(embed_tokens(m, idx), ct_embedding_layer_forward(m->wpe, pos));
    return ct_dropout_layer_forward(m->drop, x);
}

ct_tensor *cti_gpt_tp_head(ct_gpt *m, ct_tensor *x)
{
    const ct_gpt_tp *t = m->tp;
    x = ct_layernorm_layer_forward(m->ln_f, x);
    /* tied head on this rank's rows of wte: (B, T, C) @ wte_r^T -> (B, T, Vp/n); its
     * input is the whole sequence, replicated (f; under SP all-gathered) */
    x = x ? (t->sp ? ct_tp_gather_from_sequence(t->g, x, 1) : ct_tp_copy_to(t->g, x)) : NULL;
    /* in bf16 under fp8 unless the recipe puts the embedding's matrix into fp8 too, as
     * the unsharded head; the slot holds this rank's rows, and the amaxes all-reduced
     * (MAX) over the ranks are the whole table's (its padding rows are zeros) */
    ct_fp8_state *fp8 = ct_autocast_enabled() ? ct_autocast_fp8_state() : NULL;
    ct_tensor *logits = fp8 && ct_fp8_state_recipe(fp8)->fp8_embedding_and_head && m->wte->weight->requires_grad
                            ? ct_fp8_linear(fp8, x, m->wte->weight, NULL, true)
                            : ct_matmul_t(x, m->wte->weight, false, true);
    if (logits && logits->dtype != CT_DTYPE_F32 && logits->dtype != CT_DTYPE_F64)
        logits = ct_cast(logits, CT_DTYPE_F32);
    return logits;
}

ct_tensor *cti_gpt_tp_local_loss(ct_gpt *m, ct_tensor *logits, ct_tensor *targets)
{
    return ct_vocab_parallel_cross_entropy(m->tp->g, logits, targets, m->cfg.vocab_size, -1);
}

/* idx (B, T) -> this rank's logits (B, T, Vp/n) in f32 (at least); the caller prefixes
 * errors with its name and the rank */
static ct_tensor *local_logits(ct_gpt *m, ct_tensor *idx)
{
    ct_tensor *x = cti_gpt_tp_embed(m, idx);
    for (int64_t i = 0; i < m->cfg.n_layer; i++) x = ct_gpt_block_forward(m->blocks[i], x);
    return x ? cti_gpt_tp_head(m, x) : NULL;
}

ct_tensor *cti_gpt_tp_forward(ct_gpt *m, ct_tensor *idx)
{
    if (ct_module_forward_begin(&m->base)) return NULL;
    ct_tensor *logits = local_logits(m, idx);
    /* (B, T, Vp) gathered over the vocabulary, the padding columns dropped */
    if (logits) logits = ct_tp_gather(m->tp->g, logits, -1);
    if (logits && m->tp->vocab_padded != m->cfg.vocab_size) logits = ct_narrow(logits, 2, 0, m->cfg.vocab_size);
    if (!logits) ct_error_prefix("gpt_forward (tp rank %d of %d): ", m->tp->r, m->tp->n);
    return ct_module_forward_end(&m->base, logits);
}

ct_tensor *cti_gpt_tp_loss(ct_gpt *m, ct_tensor *idx, ct_tensor *targets)
{
    if (!idx || !targets) return NULL;
    if (ct_module_forward_begin(&m->base)) return NULL;
    ct_tensor *logits = local_logits(m, idx);
    ct_tensor *loss = logits ? cti_gpt_tp_local_loss(m, logits, targets) : NULL;
    if (!loss) ct_error_prefix("gpt_loss (tp rank %d of %d): ", m->tp->r, m->tp->n);
    /* the loss is the module's output here: hooks see it */
    return ct_module_forward_end(&m->base, loss);
}

/* ---- back to full tensors ------------------------------------------------------- */

ct_tensor *ct_gpt_tp_gather(ct_gpt *m, const char *name)
{
    const char *op = "gpt_tp_gather";
    const ct_gpt_tp_shard *s = ct_gpt_tp_shard_of(m, name, NULL);
    ct_tensor *p = s ? ct_module_find(&m->base, name) : NULL;
    if (!p) {
        ct_error_set(CT_ERR_INVALID, "%s: %s is not a parameter of a tensor-parallel GPT", op, name ? name : "(null)");
        return NULL;
    }
    if (s->shard.dim < 0) return ct_tensor_clone(p);
    const ct_gpt_tp *t = m->tp;
    int d = s->shard.dim, nd = p->ndim;
    int64_t len = s->shard.end - s->shard.start, L = p->shape[d];
    /* dim d first, so that the ranks' blocks are contiguous: (L, rest) -> (n L, rest) */
    int perm[CT_MAX_DIMS], k = 0;
    perm[k++] = d;
    for (int i = 0; i < nd; i++)
        if (i != d) perm[k++] = i;
    ct_tensor *local = ct_tensor_contiguous(ct_tensor_permute(p, perm));
    int64_t shape[CT_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = local ? local->shape[i] : 0;
    shape[0] = t->n * L;
    ct_tensor *all = local ? ct_tensor_empty(p->dtype, nd, shape) : NULL;
    if (!all || ct_work_run(ct_pg_allgather(t->g, all, local))) {
        ct_error_prefix("%s: %s: ", op, name);
        return NULL;
    }
    /* part j of the full dim: the ranks' j-th blocks in rank order, the padding dropped */
    ct_tensor *full = NULL, **rows = calloc((size_t)t->n * s->parts, sizeof *rows);
    if (!rows) {
        ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
        return NULL;
    }
    int np = 0;
    for (int j = 0; j < s->parts; j++)
        for (int r = 0; r < t->n; r++) {
            int64_t start = r * len, keep = s->shard.full - start; /* rank r's rows of part j that are real */
            keep = keep < 0 ? 0 : keep > len ? len : keep;
            if (keep > 0) rows[np++] = ct_tensor_narrow(all, 0, r * L + j * len, keep);
        }
    bool prev = ct_grad_set_enabled(false);
    full = np == 1 ? ct_tensor_clone(rows[0]) : ct_concat(np, rows, 0);
    ct_grad_set_enabled(prev);
    free(rows);
    /* back to the parameter's order of dims */
    int inv[CT_MAX_DIMS];
    for (int i = 0; i < nd; i++) inv[perm[i]] = i;
    full = full ? ct_tensor_contiguous(ct_tensor_permute(full, inv)) : NULL;
    if (!full) ct_error_prefix("%s: %s: ", op, name);
    return full;
}

ct_gpt *ct_gpt_tp_gather_model(ct_gpt *m)
{
    const char *op = "gpt_tp_gather_model";
    if (!m || !m->tp) {
        ct_error_set(CT_ERR_INVALID, "%s: the model is not sharded for tensor parallelism", op);
        return NULL;
    }
    /* the new model's own initialisation must not move the process generator */
    ct_rng saved = *ct_rng_default();
    ct_gpt *full = ct_gpt_new(&m->cfg);
    *ct_rng_default() = saved;
    if (!full) return NULL;
    ct_param_list l = {0};
    ct_status st = ct_module_named_tensors(&full->base, false, &l);
    for (int i = 0; !st && i < l.n; i++) {
        ct_frame_push();
        ct_tensor *g = ct_gpt_tp_gather(m, l.names[i]);
        if (!g || ct_tensor_copy_(l.tensors[i], g)) st = ct_error_prefix("%s: ", op);
        ct_frame_pop();
    }
    ct_param_list_free(&l);
    if (st) {
        ct_module_free(&full->base);
        return NULL;
    }
    ct_module_train(&full->base, m->base.training);
    return full;
}
