/* ctrain — ct_accelerator_load_model: a full safetensors file or a sharded
 * checkpoint (accel/model_shards_internal.h), written with any number of ranks, into
 * the model under any strategy (accel/accelerator.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "accel/accelerator_internal.h"
#include "accel/megatron_checkpoint_internal.h"
#include "accel/model_shards_internal.h"
#include "core/frame.h"
#include "parallel/shard_state.h"
#include "precision/autocast.h"

/* ---- the engine's view of a checkpoint -------------------------------------------------- */

static bool source_shape(void *ctx, const char *name, int *ndim, int64_t *shape)
{
    const ct_ckpt_entry *x = cti_ckpt_find(ctx, name);
    if (!x) return false;
    *ndim = x->ndim;
    memcpy(shape, x->shape, (size_t)x->ndim * sizeof *shape);
    return true;
}

static ct_status source_read(void *ctx, const char *name, int64_t begin, int64_t end, ct_tensor *dst)
{
    const ct_ckpt_entry *x = cti_ckpt_find(ctx, name);
    if (!x) return ct_error_set(CT_ERR_INVALID, "'%s' is not in the checkpoint", name);
    return cti_ckpt_read(ctx, x, begin, end, dst);
}

/* ---- loading ----------------------------------------------------------------------------- */

/* The model's tensors and the checkpoint's are the same names with the same shapes. */
static ct_status match(const ct_ckpt *ck, const ct_param_list *l, const char *path)
{
    for (int i = 0; i < l->n; i++) {
        const ct_ckpt_entry *x = cti_ckpt_find(ck, l->names[i]);
        const ct_tensor *t = l->tensors[i];
        char a[96], b[96];
        if (!x) return ct_error_set(CT_ERR_FORMAT, "'%s' has no '%s' (%s in the model)", path, l->names[i],
                                    ct_shape_str(t->ndim, t->shape, a, sizeof a));
        if (x->ndim != t->ndim || memcmp(x->shape, t->shape, (size_t)t->ndim * sizeof *t->shape))
            return ct_error_set(CT_ERR_FORMAT, "'%s' is %s in '%s' but %s in the model", l->names[i],
                                ct_shape_str(x->ndim, x->shape, a, sizeof a), path,
                                ct_shape_str(t->ndim, t->shape, b, sizeof b));
    }
    for (int j = 0; j < ck->n; j++) {
        bool found = false;
        for (int i = 0; i < l->n && !found; i++) found = !strcmp(l->names[i], ck->e[j].name);
        if (!found)
            return ct_error_set(CT_ERR_FORMAT, "'%s' holds '%s', which the model does not have", path, ck->e[j].name);
    }
    return CT_OK;
}

/* This rank's load, before the ranks agree. */
static ct_status load_local(ct_accelerator *acc, ct_module *model, const char *path)
{
    struct stat sb;
    if (stat(path, &sb)) return ct_error_set(CT_ERR_IO, "'%s': %s", path, strerror(errno));
    ct_shard *s = ct_accelerator_shard(acc);
    /* replicated, a full file is exactly what module_load reads */
    if (!s && !S_ISDIR(sb.st_mode)) return ct_module_load(model, path, true, NULL);
    ct_ckpt ck;
    ct_param_list all = {0}, params = {0};
    ct_status st = cti_ckpt_open(path, false, &ck);
    if (!st) st = ct_module_named_tensors(model, true, &all);
    if (!st) st = ct_module_named_tensors(model, false, &params);
    if (!st) st = match(&ck, &all, path);
    /* under the engine the parameters go through it; the buffers (and, replicated,
     * everything) are read here first, and written only once all has been read */
    const int first = s ? params.n : 0;
    ct_tensor **got = st ? NULL : calloc((size_t)(all.n ? all.n : 1), sizeof *got);
    if (!st && !got) st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    ct_frame_push();
    for (int i = first; i < all.n && !st; i++)
        if (!(got[i] = cti_ckpt_read_whole(&ck, cti_ckpt_find(&ck, all.names[i])))) st = ct_last_status();
    if (!st && s) st = ct_shard_load_params(s, &(ct_shard_source){source_shape, source_read, &ck});
    for (int i = first; i < all.n && !st; i++)
        if (ct_tensor_copy_(all.tensors[i], got[i])) st = ct_error_prefix("'%s': ", all.names[i]);
    ct_frame_pop();
    free(got);
    ct_param_list_free(&all);
    ct_param_list_free(&params);
    cti_ckpt_close(&ck);
    /* tensors were written in place: autocast's low-precision copies are stale */
    ct_autocast_weights_changed();
    return st;
}

ct_status ct_accelerator_load_model(ct_accelerator *acc, ct_module *model, const char *path)
{
    if (!acc) return ct_error_set(CT_ERR_INVALID, "accelerator_load_model: accelerator is NULL");
    /* the prepared model sharded for tensor parallelism: each rank takes its shards */
    ct_status st = !model || !path       ? ct_error_set(CT_ERR_INVALID, "%s is NULL", !model ? "model" : "path")
                   : acc->mesh && model == acc->model ? cti_accel_megatron_load_model(acc, path)
                                                      : load_local(acc, model, path);
    st = cti_ckpt_agree(acc, st);
    return st ? ct_error_prefix("accelerator_load_model (rank %d, '%s'): ", ct_accelerator_process_index(acc),
                                path ? path : "(null)")
              : CT_OK;
}
