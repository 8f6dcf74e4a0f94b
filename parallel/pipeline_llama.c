/* The Llama's pipeline stages: stage 0 embeds (embed_tokens), every stage runs its
 * decoder layers, the last applies model.norm and the head (lm_head, or embed_tokens
 * when tie_word_embeddings). See pipeline_model.h. */
#include <string.h>

#include "parallel/pipeline_model_internal.h"

#define EMBED "model.embed_tokens.weight"

static bool llama_owns(const ct_pipeline_model *pm, const char *name)
{
    bool first = pm->stage == 0, last = pm->stage == pm->num_stages - 1;
    if (!strcmp(name, EMBED)) return first || (last && pm->ops.tied_name);
    if (!strncmp(name, "model.norm.", 11) || !strncmp(name, "lm_head.", 8)) return last;
    return cti_pipeline_model_owns_layer(pm, name, "model.layers.");
}

static ct_tensor *llama_stage_forward(const ct_pipeline_model *pm, ct_tensor *x)
{
    return ct_llama_forward_layers(pm->model, x, pm->first, pm->count, pm->stage == pm->num_stages - 1);
}

static ct_tensor *llama_loss(const ct_pipeline_model *pm, ct_tensor *logits, ct_tensor *targets)
{
    return ct_llama_local_loss(pm->model, logits, targets);
}

static bool llama_sharded(const ct_pipeline_model *pm, const ct_tensor *param)
{
    const ct_tp_shard *s = ct_llama_tp_shard_of(pm->model, param);
    return s && s->dim >= 0;
}

static ct_status llama_sync_tp(const ct_pipeline_model *pm) { return ct_llama_tp_sync_grads(pm->model); }

ct_pipeline_model *ct_pipeline_llama_new(ct_llama *m, ct_pg *stages, int stage, const ct_pipeline_config *cfg)
{
    if (!m) {
        ct_error_set(CT_ERR_INVALID, "pipeline_llama: NULL model");
        return NULL;
    }
    cti_pp_model_ops ops = {
        .op = "pipeline_llama",
        .root = &m->base,
        .num_layers = (int)m->cfg.num_hidden_layers,
        .tied_name = m->cfg.tie_word_embeddings ? EMBED : NULL,
        .owns = llama_owns,
        .forward = llama_stage_forward,
        .loss = llama_loss,
        .tp = ct_llama_tp_group(m),
        .sharded = llama_sharded,
        .sync_tp = llama_sync_tp,
    };
    return cti_pipeline_model_new(&ops, m, stages, stage, cfg);
}
