/* ctrain — the prepared model's full state from any strategy: get_state_dict,
 * save_model (sharded checkpoints: accel/model_shards.c), unwrap_model
 * (accel/accelerator.h). */
#include "accel/accelerator.h"

#include <stdlib.h>
#include <string.h>

#include "accel/accelerator_internal.h"
#include "accel/model_shards_internal.h"
#include "core/frame.h"

/* The full parameters in the model on every rank (a collective under a sharded
 * strategy); release undoes it. */
static ct_status gather(ct_accelerator *acc, ct_module **model, const char *op)
{
    if (!acc || !*model) return ct_error_set(CT_ERR_INVALID, "%s: %s is NULL", op, !acc ? "accelerator" : "model");
    /* tensor parallelism: the whole model, gathered into a copy the Accelerator owns */
    if (acc->mesh) {
        ct_module *full = cti_accel_megatron_full_model(acc);
        if (!full) return ct_error_prefix("%s: ", op);
        *model = full;
        return CT_OK;
    }
    ct_shard *s = ct_accelerator_shard(acc);
    if (s && ct_shard_gather_full(s)) return ct_error_prefix("%s: ", op);
    return CT_OK;
}

ct_status ct_accelerator_get_state_dict(ct_accelerator *acc, ct_module *model, ct_state_dict *out)
{
    if (out) *out = (ct_state_dict){0};
    if (!out) return ct_error_set(CT_ERR_INVALID, "accelerator_get_state_dict: out is NULL");
    ct_status st = gather(acc, &model, "accelerator_get_state_dict");
    if (st) return st;
    ct_param_list l = {0};
    st = ct_module_named_tensors(model, true, &l);
    if (!st) {
        out->names = calloc((size_t)(l.n ? l.n : 1), sizeof *out->names);
        out->tensors = calloc((size_t)(l.n ? l.n : 1), sizeof *out->tensors);
        if (!out->names || !out->tensors) st = ct_error_set(CT_ERR_NOMEM, "accelerator_get_state_dict: out of memory");
    }
    for (int i = 0; i < l.n && !st; i++) CT_FRAME {
            ct_tensor *c = ct_tensor_clone(l.tensors[i]);
            out->names[i] = strdup(l.names[i]);
            if (!c || !out->names[i]) st = ct_last_status() ? ct_last_status() : CT_ERR_NOMEM;
            else out->tensors[i] = ct_tensor_retain(c);
            out->n = i + 1;
        }
    ct_param_list_free(&l);
    ct_shard_release_full(ct_accelerator_shard(acc));
    if (st) {
        ct_state_dict_free(out);
        return ct_error_prefix("accelerator_get_state_dict (rank %d): ", ct_accelerator_process_index(acc));
    }
    return CT_OK;
}

void ct_state_dict_free(ct_state_dict *sd)
{
    if (!sd) return;
    for (int i = 0; i < sd->n; i++) {
        free(sd->names ? sd->names[i] : NULL);
        ct_tensor_release(sd->tensors ? sd->tensors[i] : NULL);
    }
    free(sd->names);
    free(sd->tensors);
    *sd = (ct_state_dict){0};
}

ct_status ct_accelerator_save_model(ct_accelerator *acc, ct_module *model, const char *path)
{
    if (!path) return ct_error_set(CT_ERR_INVALID, "accelerator_save_model: path is NULL");
    /* SHARDED_STATE_DICT: each rank writes its own slices, nothing is gathered */
    if (ct_accelerator_shard(acc) && ct_accelerator_sharded_state_dict(acc))
        return cti_model_shards_save(acc, model, path);
    ct_status st = gather(acc, &model, "accelerator_save_model");
    if (st) return st;
    if (ct_accelerator_is_main_process(acc)) st = ct_module_save(model, path, 0, NULL, NULL);
    ct_shard_release_full(ct_accelerator_shard(acc));
    /* the others return when the file is there (or rank 0 failed: then everyone fails
     * with its message), as the sharded save agrees */
    st = cti_ckpt_agree(acc, st);
    return st ? ct_error_prefix("accelerator_save_model (rank %d): ", ct_accelerator_process_index(acc)) : CT_OK;
}

ct_module *ct_accelerator_unwrap_model(ct_accelerator *acc, ct_module *model)
{
    if (!acc || !model) {
        ct_error_set(CT_ERR_INVALID, "accelerator_unwrap_model: %s is NULL", !acc ? "accelerator" : "model");
        return NULL;
    }
    if (acc->mesh) { /* a whole copy: the sharded model stays the Accelerator's */
        ct_module *full = cti_accel_megatron_full_model(acc);
        if (!full) ct_error_prefix("accelerator_unwrap_model: ");
        return full;
    }
    ct_shard *s = ct_accelerator_shard(acc);
    if (s && ct_shard_detach(s)) {
        ct_error_prefix("accelerator_unwrap_model: ");
        return NULL;
    }
    return model;
}
