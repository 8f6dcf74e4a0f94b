/* The shape of a model that `ctrain estimate-memory` and `ctrain bench` know: a GPT
 * (nn/gpt.h) or a Llama (nn/llama.h), with what both commands ask of either (its
 * parameter count, vocabulary, positions, the module class of its decoder blocks)
 * and, for the ones that train it, the model built and its loss.
 */
#ifndef CT_TOOLS_MODEL_SHAPE_H
#define CT_TOOLS_MODEL_SHAPE_H

#include <stdint.h>

#include "core/error.h"
#include "nn/gpt.h"
#include "nn/llama.h"

typedef enum ct_model_kind {
    CT_MODEL_GPT = 0, /* nn/gpt.h: learned positions, LayerNorm, GELU MLP, tied head */
    CT_MODEL_LLAMA    /* nn/llama.h: rotary, RMSNorm, SwiGLU MLP, grouped-query attention */
} ct_model_kind;

typedef struct ct_model_shape {
    ct_model_kind kind;
    ct_gpt_config gpt;     /* kind GPT: dropout 0, f32 */
    ct_llama_config llama; /* kind LLAMA: defaults resolved (ct_llama_config_resolve), f32 */
} ct_model_shape;

/* Parameters of a GPT of shape c: token and position tables, per block two
 * layernorms, the attention (c_attn 3E x E + bias, c_proj E x E + bias) and the MLP
 * (4E x E + bias, E x 4E + bias), the final layernorm; the head is tied to wte. */
int64_t ct_model_shape_gpt_params(const ct_gpt_config *c);

/* Parameters of one Llama decoder layer: q_proj (H*D x C), k_proj and v_proj
 * (Hkv*D x C each), o_proj (C x H*D), gate_proj and up_proj (I x C), down_proj
 * (C x I), two RMSNorm weights (C); no biases. */
int64_t ct_model_shape_llama_layer_params(const ct_llama_config *c);
/* The rest of a Llama: embed_tokens (V x C), the final norm (C) and, untied,
 * lm_head (V x C). */
int64_t ct_model_shape_llama_root_params(const ct_llama_config *c);

int64_t ct_model_shape_params(const ct_model_shape *m);
int64_t ct_model_shape_vocab(const ct_model_shape *m);
/* The longest sequence the model is configured for: GPT's block size (its position
 * table), Llama's max_position_embeddings. */
int64_t ct_model_shape_positions(const ct_model_shape *m);
/* The module class of one decoder block, the unit of transformer_based_wrap:
 * "Block" or "LlamaDecoderLayer". */
const char *ct_model_shape_block_class(const ct_model_shape *m);
/* "gpt" or "llama" */
const char *ct_model_shape_kind_name(const ct_model_shape *m);

/* A model of shape m, freshly initialised from the process generator (ct_set_seed
 * first), f32, dropout 0. A GPT's position table is made at least min_positions long
 * (a Llama has none). Free with ct_module_free(&b->module). */
typedef struct ct_model_built {
    ct_module *module; /* &gpt->base or &llama->base */
    ct_gpt *gpt;
    ct_llama *llama;
} ct_model_built;

ct_status ct_model_shape_build(const ct_model_shape *m, int64_t min_positions, ct_model_built *out);
/* Mean cross-entropy of b's logits for x (B, T) against y (B, T), as ct_gpt_loss or
 * ct_llama_loss. */
ct_tensor *ct_model_built_loss(const ct_model_built *b, ct_tensor *x, ct_tensor *y);

#endif
