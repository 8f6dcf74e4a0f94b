/* ctrain — checkpoints of a model sharded for tensor parallelism (accel/megatron.c):
 * whole tensors from the tp ranks' shards, and each rank's shard of a whole tensor.
 *
 * A checkpoint holds the whole model and the whole optimizer state (docs/checkpoints.md,
 * "Tensor parallelism"), so it loads at any tp degree and in one process. Both
 * directions follow the parameter's shard record (nn/gpt.h ct_gpt_tp_shard_of,
 * nn/llama.h ct_llama_tp_shard_of): the local tensor along shard.dim is `parts`
 * blocks of len = end - start indices; block j of rank r holds indices
 * [j full + r len, j full + r len + len) of the whole dim, those at or past
 * j full + full being padding (the vocabulary's rows past vocab_size: zeros).
 */
#include "accel/accelerator_internal.h"
#include "accel/megatron_checkpoint_internal.h"
#include "accel/megatron_zero_internal.h"
#include "accel/model_shards_internal.h"

#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops_shape.h"
#include "core/frame.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/tp_ops.h"
#include "precision/autocast.h"

/* The record of p, a tensor of the prepared model; false: replicated (or a buffer). */
static bool record_of(const ct_accelerator *a, const ct_tensor *p, ct_tp_shard *s, int *parts)
{
    *parts = 1;
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
    const int n = a->mesh->tp;
    const int64_t L = p->shape[s.dim], len = s.end - s.start;
    bool grad = ct_grad_set_enabled(false);
    ct_tensor *all = ct_tp_gather(a->mesh->tp_group, ct_tensor_contiguous(x), s.dim);
    ct_tensor **pieces = calloc((size_t)(n * parts), sizeof *pieces), *out = NULL;
    int np = 0;
    for (int j = 0; all && pieces && j < parts; j++)
        for (int r = 0; r < n; r++) {
            int64_t keep = s.full - r * len; /* rank r's real indices of block j */
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

ct_status cti_accel_megatron_model_tensors(ct_accelerator *a, ct_param_list *out)
{
    ct_status st = ct_module_named_tensors(a->model, true, out);
    for (int i = 0; i < out->n && !st; i++) {
        ct_tensor *w = cti_accel_megatron_gather_like(a, out->tensors[i], out->tensors[i]);
        if (!w) st = ct_error_prefix("gathering '%s' over tp %d: ", out->names[i], a->mesh->tp);
        else out->tensors[i] = w;
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
        ct_tensor *w = cti_ckpt_read_whole(&ck, cti_ckpt_find(&ck, all.names[i]));
        /* the engine's parameters may be 16-bit beside f32 masters: it takes the file's dtype */
        if (!w || !(got[i] = slice_as(a, all.tensors[i], w, a->shard ? w->dtype : all.tensors[i]->dtype)))
            st = ct_error_prefix("'%s': ", all.names[i]);
    }
    if (!st && a->shard) st = cti_accel_megatron_zero_load(a, &all, got); /* tp x ZeRO: through the engine */
    for (int i = 0; i < all.n && !st && !a->shard; i++)
        if (ct_tensor_copy_(all.tensors[i], got[i])) st = ct_error_prefix("'%s': ", all.names[i]);
    ct_frame_pop();
    free(got);
    ct_param_list_free(&all);
    cti_ckpt_close(&ck);
    ct_autocast_weights_changed();
    return st;
}
