/* ctrain — Megatron-LM pipeline parallelism through the Accelerator (pp_degree > 1).
 *
 * The mesh is world = pp x dp x tp (parallel/mesh.h). prepare shards the model over tp
 * (accel/megatron.c, when tp_degree > 1), then cuts it into stages over the pp axis
 * (parallel/pipeline_model.h): each rank keeps its stage's parameters, the others'
 * memory is released. The training loop does not change. As in Accelerate's
 * Megatron-LM integration, where the model's forward runs the train step and
 * accelerator.backward does nothing, the work moves into the loss:
 *
 *   loss = ct_gpt_loss(model, x, y)      the loss runner installed on the model runs the
 *                                        1F1B schedule over num_micro_batches
 *                                        micro-batches of the batch: forward and backward
 *                                        of this stage; the batch's mean loss comes back
 *                                        on every rank, as a value (no graph);
 *   ct_accelerator_backward(acc, loss)   backward already ran: checks that loss is the
 *                                        runner's;
 *   ct_optimizer_step(opt)               once per accumulation window, before the step:
 *                                        the stage's gradients averaged over dp, the
 *                                        tied embedding summed over the first and the
 *                                        last stage, sequence parallelism's partial
 *                                        sums over tp; clipping by the global norm.
 *
 * ZeRO-1/2/3, FSDP's strategies (hybrid too) or Megatron's distributed optimizer over
 * dp (accel/megatron_zero.c): the sharding engine holds the stage's parameters only
 * (the others are released), with its synchronisation off while the micro-batches run,
 * so they accumulate full gradients (as under FSDP's no_sync; ZeRO-3 still gathers
 * each unit's parameters for its forward and backward and frees them after). At the
 * step the tied and tp sums run on the full gradients, then the engine reduce-scatters
 * them (mean) over dp, each rank steps its slice and the engine all-gathers the updated
 * parameters (ZeRO-3: at the next forward). DeepSpeed's pipeline engine refuses ZeRO
 * stages 2 and 3; here they work, at the cost of full gradients until the step.
 *
 * The last stage seeds backward with (loss scale / k) / M per micro-batch, k the
 * accumulation steps and the loss scale fp16's (else 1): what ct_accelerator_backward
 * applies to an ordinary loss. Under no_grad or in eval mode the runner runs a
 * forward-only pass (evaluation) and nothing else.
 */
#include "accel/accelerator_internal.h"

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "dist/work.h"
#include "nn/gpt.h"
#include "nn/llama.h"

/* The micro-batches of a batch of B rows: num_micro_batches; an evaluation batch it
 * does not divide (a short last batch) runs whole. */
static int micro_batches(const ct_accelerator *a, const ct_tensor *idx, bool eval)
{
    int M = a->mlm.num_micro_batches > 0 ? a->mlm.num_micro_batches : 1;
    if (eval && idx && idx->ndim >= 1 && idx->shape[0] % M) return 1;
    return M;
}

static ct_tensor *pp_loss(ct_module *m, ct_tensor *idx, ct_tensor *targets, void *data)
{
    ct_accelerator *a = data;
    const ct_mesh *me = a->mesh;
    double loss = 0.0;
    bool eval = !ct_grad_is_enabled() || !m->training;
    ct_status st;
    if (eval) {
        st = ct_pipeline_model_eval(a->pp, idx, targets, micro_batches(a, idx, true), &loss);
    } else {
        /* what ct_accelerator_backward multiplies an ordinary loss by */
        double factor = (a->scaling ? ct_loss_scaler_scale(&a->scaler) : 1.0) / a->K;
        /* the engine over dp: the micro-batches accumulate full gradients, reduced at the step */
        if (a->shard) ct_shard_set_sync(a->shard, false);
        st = ct_pipeline_set_grad_scale(ct_pipeline_model_engine(a->pp), factor);
        if (!st) st = ct_pipeline_model_step(a->pp, idx, targets, micro_batches(a, idx, false), &loss);
    }
    if (st) {
        ct_error_prefix("%s (pipeline stage %d of %d, tp rank %d, dp rank %d): ", m->type, me->pp_rank, me->pp,
                        me->tp_rank, me->dp_rank);
        return NULL;
    }
    ct_tensor *out = ct_tensor_scalar(CT_DTYPE_F32, loss);
    a->pp_loss = eval ? NULL : out;
    return out;
}

ct_status cti_accel_megatron_pp_prepare(ct_accelerator *a, ct_module *model)
{
    const ct_mesh *me = a->mesh;
    ct_pipeline_config pc = {.schedule = CT_PIPELINE_1F1B};
    a->pp = !strcmp(model->type, "GPT") ? ct_pipeline_gpt_new((ct_gpt *)model, me->pp_group, me->pp_rank, &pc)
                                        : ct_pipeline_llama_new((ct_llama *)model, me->pp_group, me->pp_rank, &pc);
    if (!a->pp) return ct_last_status();
    /* clipping, unscaling and the safety net look at the stage's parameters only */
    const ct_param_list *mine = ct_pipeline_model_params(a->pp);
    ct_param_list_free(&a->params);
    a->params.tensors = malloc(sizeof *a->params.tensors * (size_t)(mine->n ? mine->n : 1));
    a->params.names = calloc((size_t)(mine->n ? mine->n : 1), sizeof *a->params.names);
    if (!a->params.tensors || !a->params.names) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < mine->n; i++) {
        if (!(a->params.names[i] = strdup(mine->names[i]))) return ct_error_set(CT_ERR_NOMEM, "out of memory");
        a->params.tensors[i] = mine->tensors[i];
        a->params.n = i + 1;
    }
    /* the ranks of each stage, a group per stage made by every rank in stage order (a
     * subgroup is collective over its parent): fp8's amaxes are the stage's weights' */
    const int per_stage = me->dp * me->tp;
    int *ranks = malloc(sizeof *ranks * (size_t)per_stage);
    if (!ranks) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    for (int s = 0; s < me->pp; s++) {
        for (int i = 0; i < per_stage; i++) ranks[i] = s * per_stage + i; /* pp outermost (parallel/mesh.h) */
        ct_pg *g = ct_pg_new_subgroup(a->pg, ranks, per_stage);
        if (s == me->pp_rank) a->pp_stage = g;
        else ct_pg_free(g);
        if (!g && s == me->pp_rank) {
            free(ranks);
            return ct_error_prefix("the group of pipeline stage %d: ", s);
        }
    }
    free(ranks);
    /* who holds what, for checkpoints */
    ct_status st = ct_module_named_tensors(model, true, &a->pp_all);
    if (!st && !(a->pp_owner = malloc(sizeof *a->pp_owner * (size_t)(a->pp_all.n ? a->pp_all.n : 1))))
        st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < a->pp_all.n; i++) a->pp_owner[i] = ct_pipeline_model_stage_of(a->pp, a->pp_all.names[i]);
    if (st) return st;
    ct_module_set_loss_runner(model, &(ct_module_loss_runner){.fn = pp_loss, .data = a});
    return CT_OK;
}

ct_status cti_accel_megatron_pp_backward(ct_accelerator *a, const ct_tensor *loss)
{
    if (a->pp_loss && loss == a->pp_loss) {
        a->pp_loss = NULL;
        return CT_OK;
    }
    return ct_error_set(CT_ERR_INVALID,
                        "accelerator_backward (pipeline stage %d of %d): under pipeline parallelism the model's loss "
                        "function (ct_gpt_loss / ct_llama_loss) runs the forward and the backward of every "
                        "micro-batch itself; pass the loss it returned to ct_accelerator_backward as it is, once (a "
                        "loss computed from it, or another loss, has no backward to run here)",
                        a->mesh->pp_rank, a->mesh->pp);
}

/* The stage's gradients averaged over dp: every allreduce is issued before the first
 * wait, so they overlap. */
static ct_status average_over_dp(ct_accelerator *a)
{
    if (a->mesh->dp == 1) return CT_OK;
    const ct_param_list *l = &a->params;
    ct_work **w = calloc((size_t)(l->n ? l->n : 1), sizeof *w);
    if (!w) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    ct_status st = CT_OK;
    int nw = 0;
    for (int i = 0; i < l->n && !st; i++) {
        ct_tensor *g = l->tensors[i]->grad;
        if (!g) continue;
        if (!ct_tensor_is_contiguous(g))
            st = ct_error_set(CT_ERR_INTERNAL, "the gradient of '%s' is not contiguous", l->names[i]);
        else if (!(w[nw++] = ct_pg_allreduce(a->mesh->dp_group, g, CT_REDUCE_MEAN)))
            st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    }
    st = ct_work_run_all(w, nw, st);
    free(w);
    return st ? ct_error_prefix("averaging the stage's gradients over dp %d: ", a->mesh->dp) : CT_OK;
}

static double now_s(void) { return (double)uv_hrtime() * 1e-9; }

ct_status cti_accel_megatron_pp_reduce(ct_accelerator *a)
{
    if (!a->pp || a->pp_reduced) return CT_OK;
    const double t0 = now_s();
    ct_status st = CT_OK;
    if (a->shard) {
        /* the engine (accel/megatron_zero.c): the tied and tp sums on the full gradients, then
         * the engine's reduce-scatter (mean) over dp into each rank's slices */
        st = ct_pipeline_model_sync_grads(a->pp);
        ct_shard_set_sync(a->shard, true);
        if (!st) st = ct_shard_finish(a->shard);
    } else {
        st = average_over_dp(a);
        if (!st) st = ct_pipeline_model_sync_grads(a->pp);
    }
    a->pp_reduce_s += now_s() - t0;
    if (st)
        return ct_error_prefix("accelerator (pipeline stage %d of %d, tp rank %d, dp rank %d): ", a->mesh->pp_rank,
                               a->mesh->pp, a->mesh->tp_rank, a->mesh->dp_rank);
    a->pp_reduced = true;
    return CT_OK;
}

int cti_accel_megatron_pp_owner(const ct_accelerator *a, const ct_tensor *p)
{
    for (int i = 0; a->pp && i < a->pp_all.n; i++)
        if (a->pp_all.tensors[i] == p) return a->pp_owner[i];
    return -1;
}

bool cti_accel_megatron_pp_holds(const ct_accelerator *a, const ct_tensor *p)
{
    if (!a->pp) return true;
    const ct_param_list *mine = ct_pipeline_model_params(a->pp);
    for (int i = 0; i < mine->n; i++)
        if (mine->tensors[i] == p) return true;
    return cti_accel_megatron_pp_owner(a, p) < 0; /* a buffer: every stage has it */
}

ct_pg *cti_accel_fp8_group(const ct_accelerator *a) { return a->pp_stage ? a->pp_stage : a->pg; }

void cti_accel_megatron_pp_free(ct_accelerator *a)
{
    ct_pg_free(a->pp_stage);
    a->pp_stage = NULL;
    if (a->pp && a->model) ct_module_set_loss_runner(a->model, NULL);
    ct_pipeline_model_free(a->pp);
    a->pp = NULL;
    ct_param_list_free(&a->pp_all);
    free(a->pp_owner);
    a->pp_owner = NULL;
}

ct_pipeline_model *ct_accelerator_pipeline(const ct_accelerator *acc) { return acc ? acc->pp : NULL; }

double ct_accelerator_pipeline_reduce_seconds(const ct_accelerator *acc) { return acc ? acc->pp_reduce_s : 0.0; }
