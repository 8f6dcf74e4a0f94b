/* ctrain — fp8's scaling state under pipeline parallelism, for checkpoints
 * (accel/megatron_pp.c, accel/checkpoint_save.c, accel/checkpoint_load.c).
 *
 * The fp8 state makes a slot per weight at its first use, so its rows follow the
 * forward: in one process layer 0's linears, layer 1's, ..., the head last (when the
 * recipe puts it into fp8). A stage's state holds its own layers' rows in the same
 * order (its amaxes all-reduced over the stage's ranks), so the stages' rows one after
 * the other are what one process holds: that is what a checkpoint stores. Loading cuts
 * a stage's rows back out: with P rows per layer (the same for every layer) and the
 * head last, stage layers [first, first + count) are rows [first P, (first + count) P)
 * and the last stage adds the head's.
 */
#include "accel/accelerator_internal.h"
#include "accel/megatron_checkpoint_internal.h"

#include <string.h>

#include "autograd/ops.h"
#include "core/frame.h"
#include "dist/work.h"
#include "nn/gpt.h"
#include "nn/llama.h"

ct_status cti_accel_megatron_fp8_export(ct_accelerator *a, ct_tensor *out[4])
{
    ct_tensor *mine[4];
    ct_status st = ct_fp8_state_export(a->fp8, mine);
    if (st || !a->pp) {
        for (int t = 0; t < 4; t++) out[t] = st ? NULL : mine[t];
        return st;
    }
    const int pp = a->mesh->pp;
    ct_tensor **parts = calloc((size_t)(4 * pp), sizeof *parts);
    if (!parts) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    int np = 0;
    for (int s = 0; s < pp && !st; s++) {
        /* stage s's row count, then its four tensors (the trailing dims are the recipe's,
         * the same everywhere) */
        int64_t n = mine[0]->shape[0];
        ct_tensor *h = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), &n);
        st = h ? ct_work_run(ct_pg_broadcast(a->mesh->pp_group, h, s)) : ct_last_status();
        if (st) break;
        n = *(const int64_t *)ct_tensor_data(h);
        if (n == 0) continue;
        for (int t = 0; t < 4 && !st; t++) {
            int64_t shape[CT_MAX_DIMS];
            memcpy(shape, mine[t]->shape, sizeof shape);
            shape[0] = n;
            ct_tensor *x = s == a->mesh->pp_rank ? ct_tensor_contiguous(mine[t])
                                                 : ct_tensor_empty(mine[t]->dtype, mine[t]->ndim, shape);
            st = x ? ct_work_run(ct_pg_broadcast(a->mesh->pp_group, x, s)) : ct_last_status();
            parts[t * pp + np] = x;
        }
        np++;
    }
    for (int t = 0; t < 4 && !st; t++) {
        out[t] = np == 0 ? mine[t] : np == 1 ? parts[t * pp] : ct_concat(np, parts + t * pp, 0);
        if (!out[t]) st = ct_last_status();
    }
    free(parts);
    return st ? ct_error_prefix("gathering the stages' fp8 scaling state: ") : CT_OK;
}

ct_status cti_accel_megatron_fp8_rows(const ct_accelerator *a, int64_t n, int64_t *begin, int64_t *count,
                                      const char **why)
{
    *why = NULL;
    if (!a->pp) {
        *begin = 0, *count = n;
        return CT_OK;
    }
    const int64_t L = !strcmp(a->model->type, "GPT") ? ((const ct_gpt *)a->model)->cfg.n_layer
                                                     : ((const ct_llama *)a->model)->cfg.num_hidden_layers;
    const int64_t head = ct_fp8_state_recipe(a->fp8)->fp8_embedding_and_head ? 1 : 0;
    int first = 0, layers = 0;
    ct_pipeline_model_layers(a->pp, &first, &layers);
    if (n < head || (n - head) % L) {
        *why = "the checkpoint's fp8 state does not have the same rows for every layer of this model (another model "
               "or recipe): the fp8 scales start afresh";
        return CT_OK;
    }
    const int64_t per = (n - head) / L;
    *begin = first * per;
    *count = layers * per + (a->mesh->pp_rank == a->mesh->pp - 1 ? head : 0);
    return CT_OK;
}
