/* Moving a module's tensors to another device in place (PyTorch's module.to(device)).
 *
 * Parameters keep their identity -- the optimizer, hooks and the caller hold the
 * ct_tensor pointers -- so what moves is the storage under them: each distinct
 * storage gets one new storage on the target device with the same bytes, and
 * every tensor that viewed the old one views the new one at the same offset and
 * strides. Tied weights (two parameters over one storage, as the GPT's wte and
 * lm_head) stay tied, views stay views. Gradients move with their parameters. */
#include "nn/module.h"

#include <stdlib.h>

#include "core/frame.h"

typedef struct move {
    ct_storage *from, *to;
} move;

/* The new storage for s (made and filled on first sight). */
static ct_storage *moved_storage(move **moves, int *n, int *cap, ct_storage *s, ct_device dev, const char *name)
{
    for (int i = 0; i < *n; i++)
        if ((*moves)[i].from == s) return (*moves)[i].to;
    if (s->residency.materialize) {
        ct_error_set(CT_ERR_UNSUPPORTED,
                     "module_to: '%s' is sharded by a training strategy; move the model before "
                     "ct_accelerator_prepare wraps it", name);
        return NULL;
    }
    ct_storage *to = ct_storage_new(dev, s->nbytes);
    if (!to) return NULL;
    ct_status st = CT_OK;
    if (s->nbytes) {
        ct_frame_push();
        int64_t nb = (int64_t)s->nbytes;
        ct_tensor *src = ct_tensor_from_storage(s, CT_DTYPE_U8, 1, &nb, NULL, 0);
        ct_tensor *dst = ct_tensor_from_storage(to, CT_DTYPE_U8, 1, &nb, NULL, 0);
        st = src && dst ? ct_tensor_copy_(dst, src) : ct_last_status();
        ct_frame_pop();
    }
    if (st == CT_OK && *n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        move *m = realloc(*moves, (size_t)nc * sizeof *m);
        if (!m) st = ct_error_set(CT_ERR_NOMEM, "module_to: out of host memory");
        else *moves = m, *cap = nc;
    }
    if (st != CT_OK) {
        ct_storage_release(to);
        return NULL;
    }
    (*moves)[(*n)++] = (move){s, to};
    return to;
}

static void repoint(ct_tensor *t, ct_storage *to)
{
    ct_storage_retain(to);
    ct_storage_release(t->storage);
    t->storage = to;
    t->device = to->device;
}

ct_status ct_module_to(ct_module *m, ct_device dev)
{
    if (!m) return ct_error_set(CT_ERR_INVALID, "module_to: module is NULL");
    ct_param_list l = {0};
    if (ct_module_named_tensors(m, true, &l)) return ct_last_status();
    move *moves = NULL;
    int n = 0, cap = 0;
    ct_status st = CT_OK;
    /* first every new storage (nothing is repointed if one fails) ... */
    for (int i = 0; i < l.n && st == CT_OK; i++) {
        ct_tensor *ts[2] = {l.tensors[i], l.tensors[i]->grad};
        for (int k = 0; k < 2 && st == CT_OK; k++)
            if (ts[k] && ts[k]->storage && !ct_device_equal(ts[k]->device, dev) &&
                !moved_storage(&moves, &n, &cap, ts[k]->storage, dev, l.names[i]))
                st = ct_error_prefix("module_to: moving '%s'%s: ", l.names[i], k ? " (its gradient)" : "");
    }
    /* ... then every tensor onto them */
    for (int i = 0; i < l.n && st == CT_OK; i++) {
        ct_tensor *ts[2] = {l.tensors[i], l.tensors[i]->grad};
        for (int k = 0; k < 2; k++)
            for (int j = 0; ts[k] && j < n; j++)
                if (ts[k]->storage == moves[j].from) {
                    repoint(ts[k], moves[j].to);
                    break;
                }
    }
    for (int j = 0; j < n; j++) ct_storage_release(moves[j].to);
    free(moves);
    ct_param_list_free(&l);
    return st;
}
