/* The GPT's pipeline stages: stage 0 embeds (wte + wpe, dropout), every stage runs its
 * blocks, the last applies ln_f and the tied head x @ wte^T. See pipeline_model.h. */
#include <string.h>

#include "autograd/ops.h"
#include "parallel/pipeline_model_internal.h"

static bool gpt_owns(const ct_pipeline_model *pm, const char *name)
{
    bool first = pm->stage == 0, last = pm->stage == pm->num_stages - 1;
    if (!strncmp(name, "wte.", 4)) return first || last; /* the embedding, and the tied head */
    if (!strncmp(name, "wpe.", 4)) return first;
    if (!strncmp(name, "ln_f.", 5)) return last;
    return cti_pipeline_model_owns_layer(pm, name, "h.");
}

/* tokens (B, T) or hidden states (B, T, C) -> hidden states, or logits (B, T, V) f32 on
 * the last stage; as ct_gpt_forward computes them (without its fp8 head) */
static ct_tensor *gpt_stage_forward(const ct_pipeline_model *pm, ct_tensor *x)
{
    ct_gpt *m = pm->model;
    if (pm->stage == 0) {
        ct_tensor *pos = ct_tensor_to(ct_tensor_arange(CT_DTYPE_I64, 0, (double)x->shape[1], 1), x->device);
        x = ct_add(ct_embedding_layer_forward(m->wte, x), ct_embedding_layer_forward(m->wpe, pos));
        x = ct_dropout_layer_forward(m->drop, x);
    }
    for (int i = pm->first; i < pm->first + pm->count; i++) x = ct_gpt_block_forward(m->blocks[i], x);
    if (pm->stage == pm->num_stages - 1) {
        x = ct_matmul_t(ct_layernorm_layer_forward(m->ln_f, x), m->wte->weight, false, true);
        /* under autocast the head computes in 16 bits; the loss takes f32 logits */
        if (x && x->dtype != CT_DTYPE_F32 && x->dtype != CT_DTYPE_F64) x = ct_cast(x, CT_DTYPE_F32);
    }
    return x;
}

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
    };
    return cti_pipeline_model_new(&ops, m, stages, stage, cfg);
}
