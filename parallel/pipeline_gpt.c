/* The GPT's pipeline stages: stage 0 embeds (wte + wpe, dropout), every stage runs its
 * blocks, the last applies ln_f and the tied head x @ wte^T (ct_gpt_forward_layers),
 * tensor-parallel when the model is sharded. See pipeline_model.h. */
#include <string.h>

#include "parallel/pipeline_model_internal.h"

static bool gpt_owns(const ct_pipeline_model *pm, const char *name)
{
    bool first = pm->stage == 0, last = pm->stage == pm->num_stages - 1;
    if (!strncmp(name, "wte.", 4)) return first || last; /* the embedding, and the tied head */
    if (!strncmp(name, "wpe.", 4)) return first;
    if (!strncmp(name, "ln_f.", 5)) return last;
    return cti_pipeline_model_owns_layer(pm, name, "h.");
}

static ct_tensor *gpt_stage_forward(const ct_pipeline_model *pm, ct_tensor *x)
{
    return ct_gpt_forward_layers(pm->model, x, pm->first, pm->count, pm->stage == pm->num_stages - 1);
}

static ct_tensor *gpt_loss(const ct_pipeline_model *pm, ct_tensor *logits, ct_tensor *targets)
{
    return ct_gpt_local_loss(pm->model, logits, targets);
}

static bool gpt_sharded(const ct_pipeline_model *pm, const ct_tensor *param)
{
    const ct_gpt_tp_shard *s = ct_gpt_tp_shard_of(pm->model, NULL, param);
    return s && s->shard.dim >= 0;
}

static ct_status gpt_sync_tp(const ct_pipeline_model *pm) { return ct_gpt_tp_sync_grads(pm->model); }

ct_pipeline_model *ct_pipeline_gpt_new(ct_gpt *m, ct_pg *stages, int stage, const ct_pipeline_config *cfg)
{
    if (!m) {
        ct_error_set(CT_ERR_INVALID, "pipeline_gpt: NULL model");
        return NULL;
    }
    cti_pp_model_ops ops = {
        .op = "pipeline_gpt",
        .root = &m->base,
        .num_layers = (int)m->cfg.n_layer,
        .max_seq = m->cfg.block_size,
        .tied_name = "wte.weight",
        .owns = gpt_owns,
        .forward = gpt_stage_forward,
        .loss = gpt_loss,
        .tp = ct_gpt_tp_group(m),
        .sharded = gpt_sharded,
        .sync_tp = gpt_sync_tp,
    };
    return cti_pipeline_model_new(&ops, m, stages, stage, cfg);
}
