/* ctrain — Llama-family decoders with Hugging Face LlamaForCausalLM parameter names.
 *
 *   idx (B, T) -> x = embed_tokens[idx]                                   (B, T, C)
 *   for each layer i:
 *     h = input_layernorm(x)            RMSNorm: h = x * rsqrt(mean(x^2) + eps) * w
 *     q = h Wq^T (B, T, H, D), k = h Wk^T, v = h Wv^T (B, T, Hkv, D)   (no biases)
 *     q, k = rope(q), rope(k) at positions p = start .. start + T - 1:
 *            rope(x) = x * cos + rotate_half(x) * sin,
 *            rotate_half(x) = concat(-x[D/2:], x[:D/2]),
 *            cos/sin[p, j] = cos/sin(p * inv_freq[j mod D/2]),  inv_freq[j] = theta^(-2j/D)
 *            (then rescaled by the rope_scaling type; see ct_llama_rope_inv_freq)
 *     each kv head serves H / Hkv consecutive query heads (grouped-query attention):
 *     a = causal softmax(q k^T / sqrt(D)) v -> (B, T, H * D);  x = x + a Wo^T
 *     x = x + down_proj(silu(gate_proj(g)) * up_proj(g)),  g = post_attention_layernorm(x)
 *   logits = norm(x) @ lm_head^T  (or @ embed_tokens^T when tie_word_embeddings)  (B, T, V)
 *
 * Weights are stored as torch's nn.Linear holds them, (out, in), under HF's names:
 * model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
 * model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
 * model.layers.{i}.post_attention_layernorm.weight,
 * model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight
 * (absent when tied). The rotary tables are computed per forward and are neither
 * parameters nor buffers.
 *
 * Initialisation as HF's LlamaPreTrainedModel: every Linear and the embedding
 * normal(0, initializer_range), RMSNorm weights 1. The embedding is torch's
 * nn.Embedding(padding_idx = pad_token_id): that row starts at zero and, in training,
 * gets no gradient.
 */
#ifndef CT_NN_LLAMA_H
#define CT_NN_LLAMA_H

#include <stdbool.h>

#include "core/api.h"
#include "dist/pg.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/lm.h"
#include "nn/tp_layers.h"

/* rope_scaling "rope_type" (or the older "type") of HF's ROPE_INIT_FUNCTIONS. */
typedef enum ct_rope_type {
    CT_ROPE_DEFAULT = 0, /* no scaling (HF: rope_scaling null or "default") */
    CT_ROPE_LINEAR,      /* inv_freq / factor */
    CT_ROPE_DYNAMIC,     /* NTK: for a sequence of L > max_position_embeddings positions,
                          * theta' = theta * (factor * L / max_pos - (factor - 1))^(D / (D - 2)) */
    CT_ROPE_LLAMA3,      /* Llama 3.1: low frequencies / factor, high ones kept, a smooth ramp between */
} ct_rope_type;

typedef struct ct_rope_scaling {
    ct_rope_type type;
    double factor;          /* linear, dynamic, llama3; >= 1 */
    double low_freq_factor, high_freq_factor; /* llama3; low < high */
    int64_t original_max_position_embeddings; /* llama3 */
} ct_rope_scaling;

/* Zero means HF LlamaConfig's default, except where said. */
typedef struct ct_llama_config {
    int64_t vocab_size;              /* default 32000 */
    int64_t hidden_size;             /* default 4096 */
    int64_t intermediate_size;       /* default 11008 */
    int64_t num_hidden_layers;       /* default 32 */
    int64_t num_attention_heads;     /* default 32 */
    int64_t num_key_value_heads;     /* default num_attention_heads; divides it */
    int64_t head_dim;                /* default hidden_size / num_attention_heads; even */
    int64_t max_position_embeddings; /* default 2048 */
    double rms_norm_eps;             /* default 1e-6 */
    double rope_theta;               /* default 10000 */
    ct_rope_scaling rope_scaling;    /* default none */
    bool tie_word_embeddings;        /* false (HF's default): a separate lm_head.weight */
    bool attention_bias, mlp_bias;   /* must be false: Llama has no biases */
    double initializer_range;        /* default 0.02 */
    /* Special tokens, -1 = none. Read only when token_ids_set; a zero-initialised
     * config has none (0 is a real id in some vocabularies). */
    bool token_ids_set;
    int64_t bos_token_id, eos_token_id, pad_token_id;
    ct_dtype dtype; /* of the parameters; default (0) f32 */
} ct_llama_config;

typedef struct ct_llama_linear { /* HF's nn.Linear without bias: y = x W^T */
    ct_module base;
    int64_t in, out;
    ct_tensor *weight; /* (out, in) */
} ct_llama_linear;

typedef struct ct_llama_attention {
    ct_module base;
    int64_t n_head, n_kv_head, head_dim;
    ct_llama_linear *q_proj, *k_proj, *v_proj, *o_proj;
} ct_llama_attention;

typedef struct ct_llama_mlp {
    ct_module base;
    ct_llama_linear *gate_proj, *up_proj, *down_proj;
} ct_llama_mlp;

typedef struct ct_llama_tp ct_llama_tp;

typedef struct ct_llama_layer { /* module type "LlamaDecoderLayer" (the FSDP wrap unit) */
    ct_module base;
    ct_rmsnorm_layer *input_layernorm, *post_attention_layernorm;
    ct_llama_attention *self_attn;
    ct_llama_mlp *mlp;
    const ct_llama_tp *tp; /* the model's, borrowed; NULL unless sharded */
} ct_llama_layer;

typedef struct ct_llama {
    ct_module base; /* "LlamaForCausalLM": children model (and lm_head when untied) */
    ct_llama_config cfg; /* defaults filled in */
    ct_module *model;    /* "LlamaModel": embed_tokens, layers, norm */
    ct_embedding_layer *embed_tokens;
    ct_module *layers; /* children "0" .. "L-1" */
    ct_llama_layer **blocks;
    ct_rmsnorm_layer *norm;
    ct_llama_linear *lm_head; /* NULL when tied */
    ct_llama_tp *tp;          /* owned; NULL unless ct_llama_tensor_parallel sharded the model */
} ct_llama;

/* A model with fresh HF initialisation from the process generator (ct_set_seed first
 * for reproducible weights). cfg NULL = Llama-2 7B's sizes. NULL + error naming the
 * field on a bad config. Free with ct_module_free(&m->base) (or through its ct_lm). */
CT_API ct_llama *ct_llama_new(const ct_llama_config *cfg);
/* cfg with every zero default filled in, checked (the checks of ct_llama_new). */
CT_API ct_status ct_llama_config_resolve(const ct_llama_config *cfg, ct_llama_config *out);

/* idx (B, T) integer tokens -> logits (B, T, V) f32 (f64 for an f64 model) (new
 * reference, current frame). Differentiable. Positions past max_position_embeddings
 * are computed as transformers computes them (no limit; "dynamic" rope scaling is for
 * them). */
CT_API ct_tensor *ct_llama_forward(ct_llama *m, ct_tensor *idx);
/* A run of layers, for a model cut into pipeline stages: x is the tokens (B, T) when
 * first == 0 (embedded first) or the hidden states (B, T, C) entering layer first;
 * layers [first, first + count) run at positions 0 .. T-1; with head, the final norm
 * and the lm head follow and the result is the logits (B, T, V) f32, else the hidden
 * states (B, T, C). The whole range with head is ct_llama_forward (new reference,
 * current frame; differentiable). Sharded for tensor parallelism: the hidden states are
 * this rank's sequence chunk (B, T/tp, C) under sequence parallelism, and the head
 * gives this rank's vocabulary columns (B, T, Vp/tp) (ct_llama_local_loss takes them). */
CT_API ct_tensor *ct_llama_forward_layers(ct_llama *m, ct_tensor *x, int first, int count, bool head);
/* The mean cross-entropy (ignore_index -1) of the logits ct_llama_forward_layers' head
 * gives against targets (B, T): vocabulary-parallel on a sharded model. */
CT_API ct_tensor *ct_llama_local_loss(ct_llama *m, ct_tensor *logits, ct_tensor *targets);
/* Mean cross-entropy of the logits against targets (B, T) (ignore_index -1). With a
 * loss runner on the model (nn/module.h: the Accelerator's pipeline parallelism), what
 * the runner returns. */
CT_API ct_tensor *ct_llama_loss(ct_llama *m, ct_tensor *idx, ct_tensor *targets);
/* The tokens at positions cache->len .. cache->len + T - 1 (cache NULL: 0 .. T-1, as
 * ct_llama_forward); their keys and values are appended to the cache, which advances
 * by T. Use without grad. The cache must have num_hidden_layers layers,
 * num_key_value_heads heads of head_dim. */
CT_API ct_tensor *ct_llama_forward_cached(ct_llama *m, ct_tensor *idx, ct_kv_cache *cache);

/* inv_freq (D/2 values, written to out) of the rotary embedding for a forward whose
 * last position is seq_len - 1, as HF's ROPE_INIT_FUNCTIONS compute it (only
 * "dynamic" depends on seq_len). */
CT_API void ct_llama_rope_inv_freq(const ct_llama_config *cfg, int64_t seq_len, double *out);

/* The model behind nn/lm.h's interface; owns = ct_lm_free frees the model too. */
CT_API ct_lm *ct_llama_as_lm(ct_llama *m, bool owns);

/* Loads dir/config.json (model_type "llama") and the weights of dir (model.safetensors
 * or the shards of model.safetensors.index.json). NULL + an error naming the file and
 * key when anything does not fit. */
CT_API ct_llama *ct_llama_from_pretrained(const char *dir);
/* Writes dir/config.json (LlamaConfig) and the weights (sharded above 5 GB, as HF);
 * dir is created if missing. */
CT_API ct_status ct_llama_save_pretrained(const ct_llama *m, const char *dir);
/* The same with shards of at most max_shard_bytes (<= 0: 5 GB). */
CT_API ct_status ct_llama_save_pretrained_sharded(const ct_llama *m, const char *dir, int64_t max_shard_bytes);
/* config.json's text for cfg (malloc'ed; the caller frees it), or NULL + error. */
CT_API char *ct_llama_config_to_json(const ct_llama_config *cfg);
/* Parses config.json's text (label names it in messages) into *out (defaults resolved). */
CT_API ct_status ct_llama_config_from_json(const char *json, const char *label, ct_llama_config *out);

/* ---- tensor (and sequence) parallelism, Megatron-LM style (nn/llama_tp.c) -------
 *
 * ct_llama_tensor_parallel(m, tp, sp) shards a full model in place on every rank of
 * the group tp (n ranks, this one r; every rank holds the same full weights, e.g. the
 * same seed or the same checkpoint). Each rank keeps (H, Hkv, I = the sizes of the
 * full model, D = head_dim):
 *   q_proj      rows of query heads [r H/n, (r+1) H/n)         column-parallel
 *   k/v_proj    rows of key/value heads [r Hkv/n, (r+1) Hkv/n)  column-parallel; the
 *               query heads of a rank are exactly those its kv heads serve (GQA stays local).
 *               n > Hkv (a multiple of it): the one kv head r / (n/Hkv) that the rank's
 *               query heads use, replicated over n/Hkv consecutive ranks (record
 *               replicas = n/Hkv; ct_llama_tp_sync_grads sums its gradient over them)
 *   o_proj      the matching input columns                      row-parallel
 *   gate/up     rows [r I/n, (r+1) I/n)                          column-parallel
 *   down_proj   the matching input columns                      row-parallel
 *   embed_tokens rows [r Vp/n, (r+1) Vp/n) of the vocabulary padded with zero rows to
 *               Vp = ct_tp_vocab_padded(V, n, 1); lookups of other ranks' ids give zeros
 *               and the rows are summed over tp
 *   lm_head     the same rows (padded), giving this rank's Vp/n logit columns; a tied
 *               head multiplies by embed_tokens' local rows
 *   norms       replicated; the rotary tables are per head and unchanged
 * n must divide num_attention_heads and intermediate_size, and n and
 * num_key_value_heads one another (an error names the numbers otherwise). Parameter names stay Hugging Face's; every
 * parameter's ct_tp_shard (dim -1 for the replicated norms) is recorded, so a
 * checkpoint can gather the full tensors: ct_llama_tp_shard_of. Modules' in/out and
 * head counts become the local ones; m->cfg keeps the full model's sizes. Shard before
 * making the optimizer (the parameter tensors are replaced) and before
 * ct_accelerator_prepare; the group is borrowed and must outlive the model.
 *
 * The forward (Megatron's f and g): the input of q/k/v, of gate/up and of the head
 * goes through ct_tp_copy_to (its gradient allreduced); the outputs of o_proj and
 * down_proj, and the embedding, through ct_tp_reduce_from. With sequence_parallel the
 * activations between them are (B, T/n, C), this rank's chunk of the sequence (dim 1):
 * the RMSNorms and residual adds run on the chunk, copy_to becomes an all-gather
 * (backward: reduce-scatter) and reduce_from a reduce-scatter (backward: all-gather);
 * T must be a multiple of n. ct_llama_forward returns the full logits (B, T, V)
 * (all-gathered over the vocabulary); ct_llama_loss never gathers them: it uses
 * ct_vocab_parallel_cross_entropy on the local columns. Cached (generation) forwards
 * are refused on a sharded model, as is ct_llama_save_pretrained.
 *
 * Gradients. Without sequence parallelism every gradient is final after backward: the
 * sharded ones are this rank's slices, the replicated ones are equal on every rank.
 * With it, the norms' weight gradients are partial sums over the sequence chunks:
 * ct_llama_tp_sync_grads allreduces them over tp (what the Accelerator calls after
 * the last backward of an optimizer step, before clipping; Megatron does the same).
 * A key/value head replicated over n/Hkv ranks gets from each only the gradient of
 * that rank's query heads: ct_llama_tp_sync_grads sums it over those ranks too.
 * Global-norm clipping over the shards: the sharded parameters' sum |g|^p is summed
 * over tp (a replicated key/value head counted on its first rank), the replicated
 * ones' counted once (ct_llama_tp_grad_norm). */

/* Shards m in place over tp in Megatron's layout (docs/strategies.md,
 * "Tensor parallelism for the Llama"). Errors: NULL arguments, a model already
 * sharded, sizes tp does not divide (naming the numbers), parameters not on the CPU.
 * On error m is unchanged. */
CT_API ct_status ct_llama_tensor_parallel(ct_llama *m, ct_pg *tp, bool sequence_parallel);
/* The record of which part of the full tensor param holds (borrowed from m); NULL when
 * m is not sharded or param is none of its parameters. */
CT_API const ct_tp_shard *ct_llama_tp_shard_of(const ct_llama *m, const ct_tensor *param);
/* The tensor-parallel group of a sharded model (borrowed); NULL when not sharded. */
CT_API ct_pg *ct_llama_tp_group(const ct_llama *m);
/* Allreduces (sum) the RMSNorm weights' gradients over tp when the model is sharded
 * with sequence parallelism, and the replicated key/value heads' gradients over the
 * ranks holding each (n > num_key_value_heads); otherwise nothing to do (CT_OK).
 * Every rank of tp calls it after its last backward before the optimizer step. */
CT_API ct_status ct_llama_tp_sync_grads(ct_llama *m);
/* The norm_type-norm (> 0, or INFINITY) of all the model's gradients together, as if
 * unsharded: sum |g|^p of the sharded parameters summed over tp, of the replicated
 * ones counted once (call ct_llama_tp_sync_grads first). An unsharded model: as
 * ct_grad_norm over its parameters. Every rank of tp calls it; NAN + error. */
CT_API double ct_llama_tp_grad_norm(ct_llama *m, double norm_type);
/* Scales every gradient by ct_clip_coef(total, max_norm), total =
 * ct_llama_tp_grad_norm (returned; nothing scaled when it is not finite). */
CT_API double ct_llama_tp_clip_grad_norm(ct_llama *m, double max_norm, double norm_type);

#endif
