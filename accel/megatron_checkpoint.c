/* ctrain — checkpoints of a model sharded for tensor parallelism (accel/megatron.c)
 * and cut into pipeline stages (accel/megatron_pp.c): whole tensors from the tp ranks'
 * shards and the stage that holds them, and each rank's shard of a whole tensor.
 *
 * A checkpoint holds the whole model and the whole optimizer state (docs/checkpoints.md,
 * "Tensor parallelism"), so it loads at any tp degree and in one process. Both
 * directions follow the parameter's shard record (nn/gpt.h ct_gpt_tp_shard_of,
 * nn/llama.h ct_llama_tp_shard_of): the local tensor along shard.dim is `parts`
 * blocks of len = end - start indices; block j of rank r holds indices
 * [j full + r len, j full + r len + len) of the whole dim, those at or past
 * j full + full being padding (the vocabulary's rows past vocab_size: zeros). A slice
 * with replicas k > 1 (the Llama's key/value heads when tp exceeds their count) is held
 * by k consecutive ranks: rank r's block starts at (r / k) len and the gather takes it
 * from the first of them (r % k == 0) only.
 */
#include "accel/accelerator_internal.h"
#include "accel/megatron_checkpoint_internal.h"
#include "accel/megatron_zero_internal.h"
#include "accel/model_shards_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "autograd/autograd.h"
#include "autograd/ops_shape.h"
#include "core/frame.h"
#include "core/safetensors.h"
#include "dist/work.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/tp_ops.h"
#include "precision/autocast.h"

/* The record of p, a tensor of the prepared model; false: replicated (or a buffer). */
static bool record_of(const ct_accelerator *a, const ct_tensor *p, ct_tp_shard *s, int *parts)
{
    *parts = 1;
    s->replicas = 1;
    if (!strcmp(a->model->type, "GPT")) {
        const ct_gpt_tp_shard *r = ct_gpt_tp_shard_of((const ct_gpt *)a->model, NULL, p);
        if (!r || r->shard.dim < 0) return false;
        *s = r->shard, *parts = r->parts;
        return true;
    }
    const ct_tp_shard *r = ct_llama_tp_shard_of((const ct_llama *)a->model, p);
    if (!r || r->dim < 0) return false;
    *s = *r;
    return true;
}

void cti_accel_megatron_full_shape(const ct_accelerator *a, const ct_tensor *p, int *ndim, int64_t *shape)
{
    ct_tp_shard s;
    int parts;
    *ndim = p->ndim;
    memcpy(shape, p->shape, (size_t)p->ndim * sizeof *shape);
    if (record_of(a, p, &s, &parts)) shape[s.dim] = parts * s.full;
}

ct_tensor *cti_accel_megatron_gather_like(ct_accelerator *a, const ct_tensor *p, ct_tensor *x)
{
    ct_tp_shard s;
    int parts;
    if (!x || !ct_tensor_same_shape(x, p)) {
        char d[200];
        ct_error_set(CT_ERR_INTERNAL, "gather over tp: a tensor of another shape than its parameter %s",
                     ct_tensor_describe(p, d, sizeof d));
        return NULL;
    }
    if (!record_of(a, p, &s, &parts)) return ct_tensor_clone(x);
    const int n = a->mesh->tp, k = s.replicas > 1 ? s.replicas : 1;
    const int64_t L = p->shape[s.dim], len = s.end - s.start;
    bool grad = ct_grad_set_enabled(false);
    ct_tensor *all = ct_tp_gather(a->mesh->tp_group, ct_tensor_contiguous(x), s.dim);
    ct_tensor **pieces = calloc((size_t)(n * parts), sizeof *pieces), *out = NULL;
    int np = 0;
    for (int j = 0; all && pieces && j < parts; j++)
        for (int r = 0; r < n; r += k) {
            int64_t keep = s.full - (r / k) * len; /* rank r's real indices of block j */
            keep = keep < 0 ? 0 : keep > len ? len : keep;
            if (keep > 0) pieces[np++] = ct_tensor_narrow(all, s.dim, r * L + j * len, keep);
        }
    if (all && !pieces) ct_error_set(CT_ERR_NOMEM, "out of memory");
    else if (all) out = np == 1 ? ct_tensor_clone(pieces[0]) : ct_tensor_contiguous(ct_concat(np, pieces, s.dim));
    ct_grad_set_enabled(grad);
    free(pieces);
    return out;
}

/* cti_accel_megatron_slice_like, cast to dtype instead of p's */
static ct_tensor *slice_as(const ct_accelerator *a, const ct_tensor *p, ct_tensor *whole, ct_dtype dtype)
{
    ct_tp_shard s;
    int parts;
    if (!record_of(a, p, &s, &parts)) return ct_tensor_contiguous(ct_tensor_cast(whole, dtype));
    const int64_t len = s.end - s.start;
    ct_tensor *pieces[8] = {0};
    int np = 0;
    bool grad = ct_grad_set_enabled(false);
    for (int j = 0; j < parts && j < 4; j++) {
        int64_t real = s.full - s.start;
        real = real < 0 ? 0 : real > len ? len : real;
        if (real > 0) pieces[np++] = ct_tensor_narrow(whole, s.dim, j * s.full + s.start, real);
        if (real < len) { /* padding: zeros */
            int64_t shape[CT_MAX_DIMS];
            memcpy(shape, whole->shape, (size_t)whole->ndim * sizeof *shape);
            shape[s.dim] = len - real;
            pieces[np++] = ct_tensor_zeros(whole->dtype, whole->ndim, shape);
        }
    }
    ct_tensor *out = np == 1 ? ct_tensor_clone(pieces[0]) : ct_concat(np, pieces, s.dim);
    ct_grad_set_enabled(grad);
    return out ? ct_tensor_contiguous(ct_tensor_cast(out, dtype)) : NULL;
}

ct_tensor *cti_accel_megatron_slice_like(const ct_accelerator *a, const ct_tensor *p, ct_tensor *whole)
{
    return slice_as(a, p, whole, p->dtype);
}

/* t (contiguous, the same shape on every stage) from stage `owner` of the pipeline. */
static ct_status from_stage(ct_accelerator *a, int owner, ct_tensor *t)
{
    return ct_work_run(ct_pg_broadcast(a->mesh->pp_group, t, owner));
}

ct_status cti_accel_megatron_gather_any(ct_accelerator *a, const ct_tensor *p, ct_tensor *x, ct_tensor **out)
{
    *out = NULL;
    const int owner = cti_accel_megatron_pp_owner(a, p);
    if (owner < 0) { /* every stage holds it */
        if (x && !(*out = cti_accel_megatron_gather_like(a, p, x))) return ct_last_status();
        return CT_OK;
    }
    const bool mine = owner == a->mesh->pp_rank;
    ct_tensor *w = NULL;
    if (mine && x && !(w = cti_accel_megatron_gather_like(a, p, x))) return ct_last_status();
    /* the header first: present, dtype, ndim, shape (the other stages know none of it) */
    int64_t h[3 + CT_MAX_DIMS] = {0};
    if (w) {
        h[0] = 1, h[1] = w->dtype, h[2] = w->ndim;
        memcpy(h + 3, w->shape, (size_t)w->ndim * sizeof *h);
    }
    ct_tensor *ht = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(3 + CT_MAX_DIMS), h);
    ct_status st = ht ? from_stage(a, owner, ht) : ct_last_status();
    if (st) return st;
    memcpy(h, ct_tensor_data(ht), sizeof h);
    if (!h[0]) return CT_OK; /* the owner has none (a moment before the first step) */
    if (h[1] < 0 || h[1] >= CT_DTYPE_COUNT || h[2] < 0 || h[2] > CT_MAX_DIMS)
        return ct_error_set(CT_ERR_PEER, "pipeline stage %d sent a tensor header with dtype %lld and %lld dimensions",
                            owner, (long long)h[1], (long long)h[2]);
    if (!mine) w = ct_tensor_empty((ct_dtype)h[1], (int)h[2], h + 3);
    if (!w || (st = from_stage(a, owner, w))) return st ? st : ct_last_status();
    *out = w;
    return CT_OK;
}

ct_status cti_accel_megatron_share_i64(ct_accelerator *a, const ct_tensor *p, int64_t *v)
{
    const int owner = cti_accel_megatron_pp_owner(a, p);
    if (owner < 0) return CT_OK;
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), v);
        st = t ? from_stage(a, owner, t) : ct_last_status();
        if (!st) *v = *(const int64_t *)ct_tensor_data(t);
    }
    return st;
}

ct_status cti_accel_megatron_model_tensors(ct_accelerator *a, ct_param_list *out)
{
    ct_status st = ct_module_named_tensors(a->model, true, out);
    for (int i = 0; i < out->n && !st; i++) {
        ct_tensor *t = out->tensors[i], *w = NULL;
        /* a tensor of another stage: its memory is released here, the owner sends it */
        bool held = cti_accel_megatron_pp_holds(a, t);
        if (cti_accel_megatron_gather_any(a, t, held ? t : NULL, &w) || !w)
            st = ct_error_prefix("gathering '%s' (tp %d, pp %d): ", out->names[i], a->mesh->tp, a->mesh->pp);
        else out->tensors[i] = w;
    }
    /* A broadcast's root may finish before the others have received: the stages end
     * together (an all-reduce, which no rank leaves before all have entered), so that
     * none frees the group while its last tensor is still on the way. */
    if (!st && a->pp) CT_FRAME {
            ct_tensor *j = ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(1));
            st = j ? ct_work_run(ct_pg_allreduce(a->mesh->pp_group, j, CT_REDUCE_SUM)) : ct_last_status();
        }
    return st;
}

ct_status cti_accel_megatron_load_model(ct_accelerator *a, const char *path)
{
    ct_ckpt ck;
    ct_param_list all = {0};
    ct_status st = cti_ckpt_open(path, false, &ck);
    if (st) return st;
    st = ct_module_named_tensors(a->model, true, &all);
    /* every tensor present with the whole model's shape, nothing else in the file */
    for (int i = 0; i < all.n && !st; i++) {
        const ct_ckpt_entry *x = cti_ckpt_find(&ck, all.names[i]);
        int nd;
        int64_t shape[CT_MAX_DIMS];
        char sa[96], sb[96];
        cti_accel_megatron_full_shape(a, all.tensors[i], &nd, shape);
        if (!x)
            st = ct_error_set(CT_ERR_FORMAT, "'%s' has no '%s' (%s in the whole model)", path, all.names[i],
                              ct_shape_str(nd, shape, sa, sizeof sa));
        else if (x->ndim != nd || memcmp(x->shape, shape, (size_t)nd * sizeof *shape))
            st = ct_error_set(CT_ERR_FORMAT, "'%s' is %s in '%s' but %s in the whole model (tp %d)", all.names[i],
                              ct_shape_str(x->ndim, x->shape, sa, sizeof sa), path, ct_shape_str(nd, shape, sb, sizeof sb),
                              a->mesh->tp);
    }
    for (int j = 0; j < ck.n && !st; j++) {
        bool found = false;
        for (int i = 0; i < all.n && !found; i++) found = !strcmp(all.names[i], ck.e[j].name);
        if (!found) st = ct_error_set(CT_ERR_FORMAT, "'%s' holds '%s', which the model does not have", path, ck.e[j].name);
    }
    /* read and slice everything, then write */
    ct_tensor **got = st ? NULL : calloc((size_t)all.n + 1, sizeof *got);
    if (!st && !got) st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    ct_frame_push();
    for (int i = 0; i < all.n && !st; i++) {
        if (!cti_accel_megatron_pp_holds(a, all.tensors[i])) continue; /* another pipeline stage's */
        ct_tensor *w = cti_ckpt_read_whole(&ck, cti_ckpt_find(&ck, all.names[i]));
        /* the engine's parameters may be 16-bit beside f32 masters: it takes the file's dtype */
        if (!w || !(got[i] = slice_as(a, all.tensors[i], w, a->shard ? w->dtype : all.tensors[i]->dtype)))
            st = ct_error_prefix("'%s': ", all.names[i]);
    }
    if (!st && a->shard) st = cti_accel_megatron_zero_load(a, &all, got); /* tp x ZeRO: through the engine */
    for (int i = 0; i < all.n && !st && !a->shard; i++)
        if (got[i] && ct_tensor_copy_(all.tensors[i], got[i])) st = ct_error_prefix("'%s': ", all.names[i]);
    ct_frame_pop();
    free(got);
    ct_param_list_free(&all);
    cti_ckpt_close(&ck);
    ct_autocast_weights_changed();
    return st;
}

/* ---- the GPT's dropout generators ------------------------------------------------ */

static ct_rng *dropout_rng(const ct_accelerator *a)
{
    return a->model && !strcmp(a->model->type, "GPT") ? ct_gpt_tp_dropout_rng((ct_gpt *)a->model) : NULL;
}

ct_status cti_accel_megatron_rng_gather(ct_accelerator *a, ct_tensor *out[3])
{
    out[0] = out[1] = out[2] = NULL;
    const ct_rng *g = dropout_rng(a);
    if (!g) return CT_OK; /* every rank alike: the model is the same type everywhere */
    const int world = ct_pg_size(a->pg);
    /* the u64 seed and offset as i64 bits */
    int64_t mine[2] = {(int64_t)g->seed, (int64_t)g->offset};
    ct_tensor *in = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, 2), mine);
    ct_tensor *all = in ? ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(world, 2)) : NULL;
    if (!all || ct_work_run(ct_pg_allgather(a->pg, all, in)))
        return ct_error_prefix("gathering the tensor-parallel dropout generators: ");
    int64_t layout[4] = {a->mesh->tp, a->mesh->dp, a->mlm.sequence_parallelism, a->mesh->pp};
    out[0] = ct_tensor_contiguous(ct_tensor_select(all, 1, 0));
    out[1] = ct_tensor_contiguous(ct_tensor_select(all, 1, 1));
    out[2] = ct_tensor_clone(ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(4), layout));
    return out[0] && out[1] && out[2] ? CT_OK : ct_last_status();
}

ct_status cti_accel_megatron_rng_stage(const ct_accelerator *a, const char *dir, bool *found, ct_rng *out,
                                       const char **why)
{
    *found = false, *why = NULL;
    if (!dropout_rng(a)) return CT_OK;
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, CT_CKPT_TP_RNG);
    if (stat(path, &sb)) {
        *why = "the checkpoint has no tensor-parallel dropout generators (saved without tensor parallelism): "
               "they go on from their state at sharding";
        return CT_OK;
    }
    ct_safetensors *f = ct_safetensors_open(path);
    if (!f) return ct_last_status();
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *seed = ct_safetensors_get(f, "seed"), *off = ct_safetensors_get(f, "offset");
    ct_tensor *lay = ct_safetensors_get(f, "layout");
    seed = seed ? ct_tensor_contiguous(seed) : NULL, off = off ? ct_tensor_contiguous(off) : NULL;
    lay = lay ? ct_tensor_contiguous(lay) : NULL;
    if (!seed || !off || !lay) st = ct_error_prefix("%s: ", path);
    else if (seed->dtype != CT_DTYPE_I64 || off->dtype != CT_DTYPE_I64 || lay->dtype != CT_DTYPE_I64 ||
             seed->ndim != 1 || !ct_tensor_same_shape(seed, off) ||
             (ct_tensor_numel(lay) != 3 && ct_tensor_numel(lay) != 4))
        st = ct_error_set(CT_ERR_FORMAT, "%s: want i64 seed and offset [world] and layout [3] or [4]", path);
    if (!st) {
        /* layout: tp, dp, sequence parallelism, pp (1 when absent); rows in world order,
         * (pp_i dp + dp_i) tp + tp_i */
        const int64_t *sd = ct_tensor_data(seed), *of = ct_tensor_data(off), *l = ct_tensor_data(lay);
        const int64_t rows = seed->shape[0], tp = l[0], dp = l[1], pp = ct_tensor_numel(lay) == 4 ? l[3] : 1;
        const bool sp = l[2] != 0;
        const int64_t stage0 = (int64_t)a->mesh->pp_rank * dp * tp; /* dp index 0, tp rank 0 of this stage */
        int64_t row = -1;
        if (tp < 1 || dp < 1 || pp < 1 || tp * dp * pp != rows)
            st = ct_error_set(CT_ERR_FORMAT, "%s: %lld generators for tp %lld x dp %lld x pp %lld", path,
                              (long long)rows, (long long)tp, (long long)dp, (long long)pp);
        else if (sp != a->mlm.sequence_parallelism)
            *why = "the checkpoint's run and this one differ in sequence parallelism: the tensor-parallel dropout "
                   "generators go on from their state at sharding";
        else if (pp != a->mesh->pp)
            *why = "the checkpoint's run has another number of pipeline stages (each stage draws its own masks): "
                   "the tensor-parallel dropout generators go on from their state at sharding";
        else if (tp == a->mesh->tp && dp == a->mesh->dp)
            row = ct_pg_rank(a->pg);
        else if (tp == a->mesh->tp)
            row = stage0 + a->mesh->tp_rank; /* dp index 0's stream of this tp rank */
        else if (!sp)
            row = stage0;
        else
            *why = "sequence parallelism at another tp degree splits the sequence into other chunks: the "
                   "tensor-parallel dropout generators go on from their state at sharding";
        if (row >= 0) *out = (ct_rng){(uint64_t)sd[row], (uint64_t)of[row]}, *found = true;
    }
    ct_frame_pop();
    ct_safetensors_close(f);
    return st;
}

void cti_accel_megatron_rng_commit(ct_accelerator *a, const ct_rng *r)
{
    ct_rng *g = dropout_rng(a);
    if (g) *g = *r;
}
