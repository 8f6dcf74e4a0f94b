/* ctrain — the Llama sharded for tensor (and sequence) parallelism (nn/llama.h): the
 * conversion of a full model, the vocabulary-parallel embedding lookup and the
 * collectives between the blocks that nn/llama.c's forward calls, the gradient sync
 * and the global gradient norm over the shards. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "dist/work.h"
#include "nn/llama_internal.h"
#include "nn/tp_internal.h"
#include "nn/tp_ops.h"
#include "optim/clip.h"

void cti_llama_tp_free(ct_llama_tp *tp)
{
    if (!tp) return;
    ct_pg_free(tp->kv_group);
    free(tp->params);
    free(tp->shards);
    free(tp);
}

ct_status cti_llama_tp_check(const ct_llama_tp *tp, const char *op, int64_t T, bool cached)
{
    if (cached)
        return ct_error_set(CT_ERR_UNSUPPORTED, "%s: the model is sharded over tp %d; cached (generation) forwards "
                            "need the full model", op, tp->n);
    if (tp->sequence_parallel && T % tp->n)
        return ct_error_set(CT_ERR_INVALID, "%s: sequence parallelism over tp %d needs a sequence length that it "
                            "divides; T = %lld", op, tp->n, (long long)T);
    return CT_OK;
}

ct_tensor *cti_llama_tp_enter(const ct_llama_tp *tp, ct_tensor *x)
{
    return tp->sequence_parallel ? ct_tp_gather_from_sequence(tp->group, x, 1) : ct_tp_copy_to(tp->group, x);
}

ct_tensor *cti_llama_tp_exit(const ct_llama_tp *tp, ct_tensor *y)
{
    return tp->sequence_parallel ? ct_tp_reduce_scatter_to_sequence(tp->group, y, 1)
                                 : ct_tp_reduce_from(tp->group, y);
}

/* Rank r holds rows [lo, lo + Vl) of the padded table. With e = W_local[id - lo]:
 *   y = e * keep + detach(e) * cut,  keep = [lo <= id < lo + Vl, id != pad],
 *                                    cut  = [lo <= id < lo + Vl, id == pad]   (B, T, 1)
 * then y summed over the ranks (one owns each id). cut is the padding row of
 * nn.Embedding(padding_idx): its value, without a gradient (as the unsharded embed). */
ct_tensor *cti_llama_tp_embed(ct_llama *m, ct_tensor *idx)
{
    ct_embedding_layer *emb = m->embed_tokens;
    if (ct_module_forward_begin(&emb->base)) return NULL;
    const ct_llama_tp *tp = m->tp;
    ct_tensor *w = emb->weight, *y = NULL;
    int64_t V = m->cfg.vocab_size, pad = m->cfg.pad_token_id, lo = tp->vocab_start, hi = lo + w->shape[0];
    int64_t B = idx->shape[0], T = idx->shape[1];
    bool cut_pad = pad >= 0 && pad < V && ct_grad_is_enabled() && w->requires_grad, any_cut = false;
    ct_tensor *ids = ct_tensor_contiguous(ct_tensor_cast(ct_tensor_to(idx, CT_CPU), CT_DTYPE_I64));
    ct_tensor *local = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(B, T));
    ct_tensor *keep = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(B, T, 1));
    ct_tensor *cut = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(B, T, 1));
    if (!ids || !local || !keep || !cut) return ct_module_forward_end(&emb->base, NULL);
    const int64_t *p = ct_tensor_data(ids);
    int64_t *q = ct_tensor_data(local);
    float *k = ct_tensor_data(keep), *c = ct_tensor_data(cut);
    for (int64_t i = 0; i < B * T; i++) {
        if (p[i] < 0 || p[i] >= V) {
            ct_error_set(CT_ERR_INVALID, "embedding (rank %d of tp %d): token id %lld at flat index %lld is outside "
                         "the vocabulary [0, %lld)", tp->r, tp->n, (long long)p[i], (long long)i, (long long)V);
            return ct_module_forward_end(&emb->base, NULL);
        }
        bool mine = p[i] >= lo && p[i] < hi;
        q[i] = mine ? p[i] - lo : 0;
        if (mine && cut_pad && p[i] == pad)
            c[i] = 1.0f, any_cut = true;
        else if (mine)
            k[i] = 1.0f;
    }
    ct_tensor *e = ct_embedding(w, local);
    if (e) {
        y = ct_mul(e, ct_tensor_cast(keep, e->dtype));
        if (any_cut) y = ct_add(y, ct_mul(ct_detach(e), ct_tensor_cast(cut, e->dtype)));
        y = y ? cti_llama_tp_exit(tp, y) : NULL;
    }
    return ct_module_forward_end(&emb->base, y);
}

/* ---- the conversion ---------------------------------------------------------------- */

/* One parameter to shard: the module that registers it, the typed field pointing to
 * it, the new tensor (NULL: replicated, kept) and its record. */
typedef struct shard_item {
    ct_module *owner;
    ct_tensor **field;
    ct_tensor *slice;
    ct_tp_shard shard;
} shard_item;

typedef struct plan {
    shard_item *items;
    int n, cap;
} plan;

/* Plans indices [start, end) of *field's dim (dim -1: the whole tensor, replicated) */
static ct_status plan_add(plan *p, ct_module *owner, ct_tensor **field, int dim, int64_t start, int64_t end)
{
    CT_ASSERT(p->n < p->cap);
    ct_tensor *w = *field, *slice = NULL;
    int64_t full = dim >= 0 ? w->shape[dim] : w->shape[0];
    if (dim >= 0) {
        slice = cti_tp_take_slice(w, dim, start, end);
        if (!slice || ct_tensor_set_requires_grad(slice, w->requires_grad) ||
            (w->name && ct_tensor_set_name(slice, w->name)))
            return ct_last_status() ? ct_last_status() : CT_ERR_NOMEM;
    } else {
        start = 0, end = full;
    }
    p->items[p->n++] = (shard_item){owner, field, slice, {.dim = dim, .start = start, .end = end, .full = full}};
    return CT_OK;
}

/* A key/value projection's rows [start, end), the same on `replicas` consecutive ranks */
static ct_status plan_add_kv(plan *p, ct_module *owner, ct_tensor **field, int64_t start, int64_t end, int replicas)
{
    ct_status st = plan_add(p, owner, field, 0, start, end);
    if (!st && replicas > 1) p->items[p->n - 1].shard.replicas = replicas;
    return st;
}

/* The registered entry of *field in its owner now holds the slice. */
static void plan_apply(const shard_item *it)
{
    if (!it->slice) return;
    for (int i = 0; i < it->owner->nparams; i++)
        if (it->owner->params[i].tensor == *it->field) {
            ct_tensor_release(it->owner->params[i].tensor);
            it->owner->params[i].tensor = ct_tensor_retain(it->slice);
        }
    *it->field = it->slice;
}

static ct_status check_layout(const ct_llama *m, int n, const char *op)
{
    const ct_llama_config *c = &m->cfg;
    if (c->num_attention_heads % n || (c->num_key_value_heads % n && n % c->num_key_value_heads))
        return ct_error_set(CT_ERR_INVALID, "%s: tp %d must divide num_attention_heads %lld, and tp and "
                            "num_key_value_heads %lld must divide one another (each rank keeps whole key/value heads "
                            "and the query heads they serve, or one key/value head replicated over tp / "
                            "num_key_value_heads ranks)",
                            op, n, (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    if (c->intermediate_size % n)
        return ct_error_set(CT_ERR_INVALID, "%s: tp %d must divide intermediate_size %lld (the MLP's columns)", op, n,
                            (long long)c->intermediate_size);
    ct_param_list l;
    if (ct_module_named_tensors(&m->base, false, &l)) return ct_last_status();
    ct_status st = CT_OK;
    for (int i = 0; i < l.n && !st; i++)
        if (l.tensors[i]->device.type != CT_DEVICE_CPU)
            st = ct_error_set(CT_ERR_UNSUPPORTED, "%s: parameter %s is not on the CPU; the tensor-parallel "
                              "collectives work on CPU tensors", op, l.names[i]);
    ct_param_list_free(&l);
    return st;
}

ct_status ct_llama_tensor_parallel(ct_llama *m, ct_pg *tp, bool sequence_parallel)
{
    const char *op = "llama_tensor_parallel";
    if (!m || !tp) return ct_error_set(CT_ERR_INVALID, "%s: NULL %s", op, m ? "tensor-parallel group" : "model");
    int n = ct_pg_size(tp), r = ct_pg_rank(tp);
    if (m->tp)
        return ct_error_set(CT_ERR_INVALID, "%s: the model is already sharded over tp %d; shard a full model", op,
                            m->tp->n);
    if (check_layout(m, n, op)) return ct_last_status();
    const ct_llama_config *c = &m->cfg;
    int64_t L = c->num_hidden_layers, D = c->head_dim, K = c->num_key_value_heads;
    /* n > K: rank r's query heads [r H/n, (r+1) H/n) all use key/value head r / (n/K)
     * (query head h uses h / (H/K), and H/K = (n/K) (H/n)); that head is kept by the
     * n/K ranks that use it */
    int rep = K % n ? n / (int)K : 1;
    int64_t Hl = c->num_attention_heads / n, Kl = rep > 1 ? 1 : K / n, Il = c->intermediate_size / n;
    int64_t Vp = ct_tp_vocab_padded(c->vocab_size, n, 1), Vl = Vp / n;
    ct_pg *kv_group = NULL;
    if (rep > 1) { /* collective over tp: every rank makes every group, one per key/value head */
        int *ranks = malloc((size_t)rep * sizeof *ranks);
        if (!ranks) return ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
        for (int64_t j = 0; j < K; j++) {
            for (int i = 0; i < rep; i++) ranks[i] = (int)j * rep + i;
            ct_pg *g = ct_pg_new_subgroup(tp, ranks, rep);
            if (!g && ct_last_status()) {
                free(ranks), ct_pg_free(kv_group);
                return ct_error_prefix("%s (rank %d of %d): the group of key/value head %lld: ", op, r, n,
                                       (long long)j);
            }
            if (g) kv_group = g;
        }
        free(ranks);
    }

    ct_llama_tp *st = calloc(1, sizeof *st);
    plan p = {.cap = (int)(9 * L + 3)};
    p.items = calloc((size_t)p.cap, sizeof *p.items);
    if (!st || !p.items) {
        free(st), free(p.items), ct_pg_free(kv_group);
        return ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
    }
    *st = (ct_llama_tp){.group = tp, .n = n, .r = r, .sequence_parallel = sequence_parallel, .vocab_padded = Vp,
                        .vocab_start = r * Vl, .kv_replicas = rep, .kv_group = kv_group};
    ct_status rc = CT_OK;
    ct_frame_push(); /* the slices live here until the modules hold them */
    /* registration order, so that the records follow ct_module_named_tensors */
    rc = plan_add(&p, &m->embed_tokens->base, &m->embed_tokens->weight, 0, r * Vl, (r + 1) * Vl);
    for (int64_t i = 0; i < L && !rc; i++) {
        ct_llama_layer *b = m->blocks[i];
        ct_llama_attention *a = b->self_attn;
        ct_llama_mlp *f = b->mlp;
        int64_t q0 = r * Hl * D, q1 = q0 + Hl * D, k0 = (r / rep) * Kl * D, k1 = k0 + Kl * D;
        int64_t i0 = r * Il, i1 = i0 + Il;
        if ((rc = plan_add(&p, &a->q_proj->base, &a->q_proj->weight, 0, q0, q1)) ||
            (rc = plan_add_kv(&p, &a->k_proj->base, &a->k_proj->weight, k0, k1, rep)) ||
            (rc = plan_add_kv(&p, &a->v_proj->base, &a->v_proj->weight, k0, k1, rep)) ||
            (rc = plan_add(&p, &a->o_proj->base, &a->o_proj->weight, 1, q0, q1)) ||
            (rc = plan_add(&p, &f->gate_proj->base, &f->gate_proj->weight, 0, i0, i1)) ||
            (rc = plan_add(&p, &f->up_proj->base, &f->up_proj->weight, 0, i0, i1)) ||
            (rc = plan_add(&p, &f->down_proj->base, &f->down_proj->weight, 1, i0, i1)) ||
            (rc = plan_add(&p, &b->input_layernorm->base, &b->input_layernorm->weight, -1, 0, 0)) ||
            (rc = plan_add(&p, &b->post_attention_layernorm->base, &b->post_attention_layernorm->weight, -1, 0, 0)))
            break;
    }
    if (!rc) rc = plan_add(&p, &m->norm->base, &m->norm->weight, -1, 0, 0);
    if (!rc && m->lm_head) rc = plan_add(&p, &m->lm_head->base, &m->lm_head->weight, 0, r * Vl, (r + 1) * Vl);
    st->params = calloc((size_t)p.n, sizeof *st->params);
    st->shards = calloc((size_t)p.n, sizeof *st->shards);
    if (!rc && (!st->params || !st->shards)) rc = ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
    if (!rc) { /* nothing fails from here: the model changes all at once */
        for (int i = 0; i < p.n; i++) {
            plan_apply(&p.items[i]);
            st->params[i] = *p.items[i].field;
            st->shards[i] = p.items[i].shard;
        }
        st->nshards = p.n;
        for (int64_t i = 0; i < L; i++) {
            ct_llama_layer *b = m->blocks[i];
            ct_llama_attention *a = b->self_attn;
            a->n_head = Hl, a->n_kv_head = Kl;
            a->q_proj->out = a->o_proj->in = Hl * D;
            a->k_proj->out = a->v_proj->out = Kl * D;
            b->mlp->gate_proj->out = b->mlp->up_proj->out = b->mlp->down_proj->in = Il;
            b->tp = st;
        }
        m->embed_tokens->num = Vl;
        if (m->lm_head) m->lm_head->out = Vl;
        m->tp = st;
    }
    ct_frame_pop();
    free(p.items);
    if (rc) {
        cti_llama_tp_free(st);
        return ct_error_prefix("%s (rank %d of %d): ", op, r, n);
    }
    return CT_OK;
}

const ct_tp_shard *ct_llama_tp_shard_of(const ct_llama *m, const ct_tensor *param)
{
    if (!m || !m->tp || !param) return NULL;
    for (int i = 0; i < m->tp->nshards; i++)
        if (m->tp->params[i] == param) return &m->tp->shards[i];
    return NULL;
}

/* ---- gradients ----------------------------------------------------------------------- */

ct_status ct_llama_tp_sync_grads(ct_llama *m)
{
    const char *op = "llama_tp_sync_grads";
    if (!m) return ct_error_set(CT_ERR_INVALID, "%s: NULL model", op);
    const ct_llama_tp *tp = m->tp;
    if (!tp || (!tp->sequence_parallel && tp->kv_replicas <= 1)) return CT_OK;
    /* every collective is issued before the first wait, so they overlap */
    ct_work **w = calloc((size_t)tp->nshards, sizeof *w);
    if (!w) return ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
    ct_status st = CT_OK;
    int nw = 0;
    for (int i = 0; i < tp->nshards && !st; i++) {
        /* a norm's gradient under SP: this rank's tokens only; a replicated key/value
         * head's: only the query heads of this rank */
        ct_tensor *g = tp->params[i]->grad;
        bool norm = tp->shards[i].dim < 0 && tp->sequence_parallel, kv = tp->shards[i].replicas > 1;
        if (!g || (!norm && !kv)) continue;
        if (!ct_tensor_is_contiguous(g))
            st = ct_error_set(CT_ERR_INTERNAL, "%s: the gradient of parameter %d is not contiguous", op, i);
        else if (!(w[nw++] = ct_pg_allreduce(kv ? tp->kv_group : tp->group, g, CT_REDUCE_SUM)))
            st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    }
    st = ct_work_run_all(w, nw, st);
    free(w);
    if (st) ct_error_prefix("%s (rank %d of tp %d): ", op, tp->r, tp->n);
    return st;
}

/* The parameters whose record says sharded (dim >= 0) or replicated (sharded false).
 * A key/value slice held by several ranks counts on the first of them only, so that
 * the sum over tp takes each head once. */
static int pick(const ct_llama_tp *tp, bool sharded, ct_tensor **out)
{
    int k = 0;
    for (int i = 0; i < tp->nshards; i++) {
        const ct_tp_shard *s = &tp->shards[i];
        if ((s->dim >= 0) != sharded || (s->replicas > 1 && tp->r % s->replicas)) continue;
        out[k++] = (ct_tensor *)tp->params[i];
    }
    return k;
}

/* sum |g|^p over the sharded parameters summed over the group, plus the replicated
 * ones' once; max |g| for INFINITY (the group's max). Every rank reaches the
 * allreduce, also after a local error (its NaN then spreads to every rank). */
static double tp_partial(const ct_llama_tp *tp, double norm_type, bool *failed)
{
    ct_tensor **list = calloc((size_t)tp->nshards, sizeof *list);
    bool inf = isinf(norm_type);
    double sharded = NAN, replicated = NAN, total = NAN;
    ct_error_clear(); /* a NaN with an error is bad input; a NaN without is a NaN gradient */
    if (list) {
        sharded = ct_grad_norm_partial(pick(tp, true, list), list, norm_type);
        if (!ct_last_status()) replicated = ct_grad_norm_partial(pick(tp, false, list), list, norm_type);
    } else {
        ct_error_set(CT_ERR_NOMEM, "llama_tp_grad_norm: out of memory");
    }
    free(list);
    *failed = ct_last_status() != CT_OK;
    ct_frame_push();
    ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1), &sharded);
    if (t && !ct_work_run(ct_pg_allreduce(tp->group, t, inf ? CT_REDUCE_MAX : CT_REDUCE_SUM))) {
        double s = *(const double *)ct_tensor_data(t);
        total = isnan(s) || isnan(replicated) ? NAN : inf ? fmax(s, replicated) : s + replicated;
    } else {
        *failed = true;
    }
    ct_frame_pop();
    return total;
}

double ct_llama_tp_grad_norm(ct_llama *m, double norm_type)
{
    if (!m) {
        ct_error_set(CT_ERR_INVALID, "llama_tp_grad_norm: NULL model");
        return NAN;
    }
    if (!m->tp) {
        ct_param_list l;
        if (ct_module_named_tensors(&m->base, false, &l)) return NAN;
        double v = ct_grad_norm(l.n, l.tensors, norm_type);
        ct_param_list_free(&l);
        return v;
    }
    if (!(norm_type > 0)) { /* checked here too: every rank must reach the allreduce or none */
        ct_error_set(CT_ERR_INVALID, "llama_tp_grad_norm: norm_type %g; want > 0 or INFINITY", norm_type);
        return NAN;
    }
    bool failed = false;
    double partial = tp_partial(m->tp, norm_type, &failed);
    if (failed) {
        ct_error_prefix("llama_tp_grad_norm (rank %d of tp %d): ", m->tp->r, m->tp->n);
        return NAN;
    }
    return ct_grad_norm_from_partial(partial, norm_type);
}

double ct_llama_tp_clip_grad_norm(ct_llama *m, double max_norm, double norm_type)
{
    if (!(max_norm >= 0)) {
        ct_error_set(CT_ERR_INVALID, "llama_tp_clip_grad_norm: max_norm %g; want >= 0", max_norm);
        return NAN;
    }
    double total = ct_llama_tp_grad_norm(m, norm_type);
    if (!isfinite(total)) return total;
    ct_param_list l;
    if (ct_module_named_tensors(&m->base, false, &l)) return NAN;
    ct_status st = ct_grad_scale(l.n, l.tensors, ct_clip_coef(total, max_norm));
    ct_param_list_free(&l);
    return st ? NAN : total;
}
