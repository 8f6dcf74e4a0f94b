/* ctrain — Megatron-LM tensor parallelism through the Accelerator (accel/accelerator.h).
 *
 * The mesh is world = dp x tp (pp 1), tp innermost (parallel/mesh.h): the tp ranks of
 * one data-parallel index are neighbours. Per optimizer step, in this order:
 *   backward            the tp collectives run inside the model's forward and backward;
 *                       DDP allreduces (averages) the gradients over the dp group, or
 *                       the sharding engine (ZeRO, FSDP, the distributed optimizer)
 *                       reduce-scatters them over it (accel/megatron_zero.c);
 *   tp sync             sequence parallelism leaves the replicated parameters' gradients
 *                       as partial sums over the sequence chunks: summed over tp
 *                       (ct_*_tp_sync_grads). Both reductions are linear, so their
 *                       order does not matter;
 *   clip                the norm of the whole model: the sharded parameters' sum of
 *                       |g|^p summed over tp, the replicated ones counted once; after
 *                       DDP every dp index holds the same gradients, so no sum over dp.
 */
#include "accel/accelerator_internal.h"
#include "accel/megatron_checkpoint_internal.h"
#include "accel/megatron_zero_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autocast_cast.h"
#include "core/frame.h"
#include "core/philox.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "precision/autocast.h"

static const char SUPPORTED[] = "GPT (nn/gpt.h) and LlamaForCausalLM (nn/llama.h)";

ct_status cti_accel_megatron_settings(ct_accelerator *a)
{
    const ct_megatron_lm_plugin *p = a->cfg.megatron_lm_plugin;
    ct_megatron_lm_plugin from_env;
    const char *source = "megatron_lm_plugin";
    if (!p) {
        bool on = false;
        if (ct_megatron_lm_plugin_from_env(&on, &from_env)) return ct_error_prefix("accelerator: ");
        if (!on) return CT_OK;
        p = &from_env;
        source = "ctrain launch --use_megatron_lm";
    }
    int world = a->env.world_size > 0 ? a->env.world_size : 1;
    if (ct_megatron_lm_plugin_resolve(p, world, &a->mlm)) return ct_error_prefix("accelerator (%s): ", source);
    a->megatron = true;
    /* ZeRO, FSDP and the distributed optimizer shard over the data-parallel axis
     * (accel/megatron_zero.c) */
    if (cti_accel_megatron_zero_settings(a, source)) return ct_last_status();
    if (a->mlm.gradient_clipping > 0) a->auto_clip = a->mlm.gradient_clipping;
    return CT_OK;
}

typedef enum { MODEL_GPT, MODEL_LLAMA } model_kind;

static ct_status model_kind_of(const ct_module *m, model_kind *out)
{
    if (m->type && !strcmp(m->type, "GPT")) *out = MODEL_GPT;
    else if (m->type && !strcmp(m->type, "LlamaForCausalLM")) *out = MODEL_LLAMA;
    else
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "Megatron-LM tensor or pipeline parallelism of a model of type '%s' is not supported; supported: %s",
                            m->type ? m->type : "(none)", SUPPORTED);
    return CT_OK;
}

/* The optimizer's parameters as indices into the model's list, before sharding
 * replaces the tensors (names stay). */
static ct_status optimizer_names(const ct_param_list *l, const ct_optimizer *opt, int *idx)
{
    for (int i = 0; i < ct_optimizer_param_count(opt); i++) {
        const ct_tensor *p = ct_optimizer_param(opt, i);
        idx[i] = -1;
        for (int k = 0; k < l->n && idx[i] < 0; k++)
            if (l->tensors[k] == p) idx[i] = k;
        if (idx[i] < 0) {
            char d[200];
            return ct_error_set(CT_ERR_INVALID,
                                "optimizer parameter %d (%s) is not a parameter of the prepared model: tensor "
                                "parallelism replaces the model's parameters by their shards and cannot follow it",
                                i, ct_tensor_describe(p, d, sizeof d));
        }
    }
    return CT_OK;
}

/* fp8 slots are keyed by the weight tensor: a forward before prepare (autocast is on
 * from ct_accelerator_new) made slots for the full weights, which sharding replaced.
 * The shards start a fresh state of the same recipe instead of beside dead slots,
 * which would hold the full weights and put a checkpoint's slots out of the order
 * another layout makes them in. */
static ct_status fp8_renew(ct_accelerator *a)
{
    ct_fp8_state *fresh = ct_fp8_state_new(ct_fp8_state_recipe(a->fp8));
    if (!fresh) return ct_last_status();
    ct_autocast_set_default_fp8(fresh);
    ct_autocast_clear_cache();
    ct_fp8_state_free(a->fp8);
    a->fp8 = fresh;
    return CT_OK;
}

ct_status cti_accel_megatron_prepare(ct_accelerator *a, ct_module *model, ct_optimizer *opt)
{
    if (!model)
        return ct_error_set(CT_ERR_INVALID, "Megatron-LM tensor parallelism shards a model: prepare the model (%s) "
                                            "with the optimizer", SUPPORTED);
    model_kind kind = MODEL_GPT;
    ct_status st = model_kind_of(model, &kind);
    if (st) return st;
    /* every check before the first collective: a rank that refuses never leaves the
     * others waiting (and every rank sees the same settings and model, so all refuse) */
    int world = ct_pg_size(a->pg);
    ct_mesh_config mc = {.tp = a->mlm.tp_degree, .pp = a->mlm.pp_degree};
    if ((st = ct_mesh_layout(world, &mc, &mc))) return st;
    if (kind == MODEL_GPT) {
        const ct_gpt *g = (const ct_gpt *)model;
        st = ct_mesh_check_model(&mc, g->cfg.n_head, 0, g->cfg.n_layer);
        if (!st && (4 * g->cfg.n_embd) % mc.tp)
            st = ct_error_set(CT_ERR_INVALID, "mesh: tp %d does not divide the MLP width 4 x n_embd = %lld", mc.tp,
                              (long long)(4 * g->cfg.n_embd));
    } else {
        const ct_llama *l = (const ct_llama *)model;
        st = ct_mesh_check_model(&mc, l->cfg.num_attention_heads, l->cfg.num_key_value_heads,
                                 l->cfg.num_hidden_layers);
        if (!st && l->cfg.intermediate_size % mc.tp)
            st = ct_error_set(CT_ERR_INVALID, "mesh: tp %d does not divide intermediate_size %lld", mc.tp,
                              (long long)l->cfg.intermediate_size);
    }
    if (st) return ct_error_prefix("%s: ", model->type);

    ct_param_list before = {0};
    int nopt = opt ? ct_optimizer_param_count(opt) : 0;
    int *idx = calloc((size_t)(nopt ? nopt : 1), sizeof *idx);
    ct_tensor **repl = calloc((size_t)(nopt ? nopt : 1), sizeof *repl);
    if (!idx || !repl) st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    if (!st) st = ct_module_named_tensors(model, false, &before);
    if (!st && opt) st = optimizer_names(&before, opt, idx);
    if (!st && !(a->mesh = ct_mesh_new(a->pg, &mc))) st = ct_last_status();
    if (!st && mc.tp > 1)
        st = kind == MODEL_GPT ? ct_gpt_tensor_parallel((ct_gpt *)model, a->mesh->tp_group, a->mlm.sequence_parallelism)
                               : ct_llama_tensor_parallel((ct_llama *)model, a->mesh->tp_group,
                                                          a->mlm.sequence_parallelism);
    if (!st) st = ct_module_named_tensors(model, false, &a->params);
    if (!st && a->fp8 && ct_fp8_state_weights(a->fp8) > 0) st = fp8_renew(a);
    /* the optimizer steps the shards: the same names, new tensors (its state is still
     * empty before the first step, so nothing is lost) */
    for (int i = 0; i < nopt && !st; i++) {
        const char *name = before.names[idx[i]];
        for (int k = 0; k < a->params.n && !repl[i]; k++)
            if (!strcmp(a->params.names[k], name)) repl[i] = a->params.tensors[k];
        if (!repl[i]) st = ct_error_set(CT_ERR_INTERNAL, "parameter '%s' is gone after sharding", name);
    }
    if (!st && opt) st = ct_optimizer_replace_params(opt, nopt, repl);
    /* pipeline: the stage's gradients are averaged over dp once per step (megatron_pp.c);
     * else the sharding engine (megatron_zero.c) or DDP over dp, reducing while backward runs */
    if (!st && mc.pp > 1) {
        st = cti_accel_megatron_pp_prepare(a, model);
        /* ZeRO-1 over the stage's dp ranks (accel/megatron_zero.c), reducing at the step */
        if (!st && a->mesh->dp > 1 && a->cfg.shard.strategy != CT_SHARD_NO_SHARD)
            st = cti_accel_megatron_zero_prepare(a, model);
    } else if (!st && a->mesh->dp > 1) {
        if (a->cfg.shard.strategy != CT_SHARD_NO_SHARD) st = cti_accel_megatron_zero_prepare(a, model);
        else if (!(a->ddp = ct_ddp_new(a->mesh->dp_group, model, &a->cfg.ddp))) st = ct_last_status();
    }
    ct_param_list_free(&before);
    free(idx);
    free(repl);
    return st ? ct_error_prefix("Megatron-LM (tp %d x pp %d x dp %d): ", mc.tp, mc.pp, mc.dp) : CT_OK;
}

ct_status cti_accel_megatron_sync(ct_accelerator *a)
{
    if (!a->mesh || a->tp_synced) return CT_OK;
    ct_status st = a->shard                        ? cti_accel_megatron_zero_sync(a)
                   : !strcmp(a->model->type, "GPT") ? ct_gpt_tp_sync_grads((ct_gpt *)a->model)
                                                   : ct_llama_tp_sync_grads((ct_llama *)a->model);
    if (!st) a->tp_synced = true;
    return st ? ct_error_prefix("accelerator: tensor-parallel gradient sync: ") : CT_OK;
}

double cti_accel_megatron_clip(ct_accelerator *a, double max_norm, double norm_type)
{
    if (a->pp) {
        if (norm_type != 2.0) {
            ct_error_set(CT_ERR_UNSUPPORTED, "accelerator_clip_grad_norm: norm_type %g under pipeline parallelism; "
                                             "it supports the 2-norm", norm_type);
            return NAN;
        }
        return a->shard ? cti_accel_megatron_zero_clip(a, max_norm, norm_type)
                        : ct_pipeline_model_clip_grad_norm(a->pp, max_norm);
    }
    if (a->shard) return cti_accel_megatron_zero_clip(a, max_norm, norm_type);
    if (!strcmp(a->model->type, "GPT")) {
        if (norm_type != 2.0) {
            ct_error_set(CT_ERR_UNSUPPORTED, "accelerator_clip_grad_norm: norm_type %g under tensor parallelism of a "
                                             "GPT; it supports the 2-norm", norm_type);
            return NAN;
        }
        return ct_gpt_tp_clip_grad_norm((ct_gpt *)a->model, max_norm);
    }
    return ct_llama_tp_clip_grad_norm((ct_llama *)a->model, max_norm, norm_type);
}

/* A new unsharded model of m's type and configuration. Its own initialisation must not
 * move the process generator (dropout masks, sampling): the generator is restored. */
static ct_module *new_whole(const ct_module *m)
{
    ct_rng saved = *ct_rng_default();
    ct_module *w = NULL;
    if (!strcmp(m->type, "GPT")) {
        ct_gpt *g = ct_gpt_new(&((const ct_gpt *)m)->cfg);
        w = g ? &g->base : NULL;
    } else {
        ct_llama *l = ct_llama_new(&((const ct_llama *)m)->cfg);
        w = l ? &l->base : NULL;
    }
    *ct_rng_default() = saved;
    return w;
}

ct_module *cti_accel_megatron_full_model(ct_accelerator *a)
{
    ct_module_free(a->tp_full);
    a->tp_full = NULL;
    /* the checkpoints' gather (every tensor whole, buffers too) copied into a new model */
    ct_module *full = new_whole(a->model);
    ct_param_list whole = {0}, mine = {0};
    ct_status st = CT_OK;
    ct_frame_push();
    /* under the engine over dp: the local parameters whole (f32 masters) first */
    if (!full || (a->shard && ct_shard_gather_full(a->shard)) || cti_accel_megatron_model_tensors(a, &whole) ||
        ct_module_named_tensors(full, true, &mine))
        st = ct_last_status();
    ct_shard_release_full(a->shard);
    if (!st && whole.n != mine.n)
        st = ct_error_set(CT_ERR_INTERNAL, "%d tensors sharded, %d in the whole model", whole.n, mine.n);
    for (int i = 0; i < whole.n && !st; i++) {
        if (strcmp(whole.names[i], mine.names[i]))
            st = ct_error_set(CT_ERR_INTERNAL, "tensor %d: '%s' sharded, '%s' whole", i, whole.names[i], mine.names[i]);
        else if (ct_tensor_copy_(mine.tensors[i], whole.tensors[i]))
            st = ct_error_prefix("tensor '%s': ", whole.names[i]);
    }
    ct_frame_pop();
    ct_param_list_free(&whole);
    ct_param_list_free(&mine);
    if (st || !full) {
        ct_module_free(full);
        ct_error_prefix("gathering the whole model over tp %d: ", a->mesh->tp);
        return NULL;
    }
    ct_module_train(full, a->model->training);
    return a->tp_full = full;
}
