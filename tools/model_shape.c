/* GPT and Llama shapes for the command line's tools (tools/model_shape.h). */
#include "tools/model_shape.h"

int64_t ct_model_shape_gpt_params(const ct_gpt_config *c)
{
    int64_t E = c->n_embd;
    int64_t block = 2 * 2 * E                  /* ln_1, ln_2 */
                    + 3 * E * E + 3 * E        /* attn.c_attn */
                    + E * E + E                /* attn.c_proj */
                    + 4 * E * E + 4 * E        /* mlp.c_fc */
                    + 4 * E * E + E;           /* mlp.c_proj */
    return c->vocab_size * E + c->block_size * E + c->n_layer * block + 2 * E;
}

int64_t ct_model_shape_llama_layer_params(const ct_llama_config *c)
{
    const int64_t C = c->hidden_size, q = c->num_attention_heads * c->head_dim,
                  kv = c->num_key_value_heads * c->head_dim, I = c->intermediate_size;
    return C * q + 2 * C * kv + q * C /* q, k, v, o */ + 3 * C * I /* gate, up, down */ + 2 * C /* norms */;
}

int64_t ct_model_shape_llama_root_params(const ct_llama_config *c)
{
    const int64_t VC = c->vocab_size * c->hidden_size;
    return VC + c->hidden_size + (c->tie_word_embeddings ? 0 : VC);
}

int64_t ct_model_shape_params(const ct_model_shape *m)
{
    if (m->kind == CT_MODEL_LLAMA)
        return ct_model_shape_llama_root_params(&m->llama) +
               m->llama.num_hidden_layers * ct_model_shape_llama_layer_params(&m->llama);
    return ct_model_shape_gpt_params(&m->gpt);
}

int64_t ct_model_shape_vocab(const ct_model_shape *m)
{
    return m->kind == CT_MODEL_LLAMA ? m->llama.vocab_size : m->gpt.vocab_size;
}

int64_t ct_model_shape_positions(const ct_model_shape *m)
{
    return m->kind == CT_MODEL_LLAMA ? m->llama.max_position_embeddings : m->gpt.block_size;
}

const char *ct_model_shape_block_class(const ct_model_shape *m)
{
    return m->kind == CT_MODEL_LLAMA ? "LlamaDecoderLayer" : "Block";
}

const char *ct_model_shape_kind_name(const ct_model_shape *m) { return m->kind == CT_MODEL_LLAMA ? "llama" : "gpt"; }

ct_status ct_model_shape_build(const ct_model_shape *m, int64_t min_positions, ct_model_built *out)
{
    *out = (ct_model_built){0};
    if (m->kind == CT_MODEL_LLAMA) {
        ct_llama_config c = m->llama;
        c.dtype = CT_DTYPE_F32;
        if (!(out->llama = ct_llama_new(&c))) return ct_last_status();
        out->module = &out->llama->base;
        return CT_OK;
    }
    ct_gpt_config c = m->gpt;
    c.dropout = 0, c.dtype = CT_DTYPE_F32;
    if (c.block_size < min_positions) c.block_size = min_positions;
    if (!(out->gpt = ct_gpt_new(&c))) return ct_last_status();
    out->module = &out->gpt->base;
    return CT_OK;
}

ct_tensor *ct_model_built_loss(const ct_model_built *b, ct_tensor *x, ct_tensor *y)
{
    return b->llama ? ct_llama_loss(b->llama, x, y) : ct_gpt_loss(b->gpt, x, y);
}
