/* ctrain — causal language models behind one interface.
 *
 * Generation, `ctrain generate` and the examples work on any decoder-only model
 * through a ct_lm: its module tree (parameters, device, train flag), the sizes a
 * key/value cache needs, the token ids that matter to sampling, and a forward that
 * can read and extend a cache. Each model type supplies its ops (nn/gpt.h's
 * ct_gpt_as_lm, nn/llama.h's ct_llama_as_lm); ct_lm_from_pretrained picks the type
 * from a Hugging Face config.json's "model_type".
 */
#ifndef CT_NN_LM_H
#define CT_NN_LM_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"
#include "nn/kv_cache.h"
#include "nn/module.h"

typedef struct ct_lm ct_lm;

typedef struct ct_lm_ops {
    const char *model_type; /* Hugging Face's name: "gpt2", "llama" */
    /* idx (B, T) integer tokens -> logits (B, T, V) (new reference, current frame).
     * cache NULL: positions 0..T-1, as in training. Otherwise the tokens sit at
     * positions cache->len .. cache->len + T - 1; their keys and values are appended
     * and the cache advanced by T. */
    ct_tensor *(*forward)(ct_lm *lm, ct_tensor *idx, ct_kv_cache *cache);
    /* dir/config.json + weights in Hugging Face's layout; dir must exist. */
    ct_status (*save_pretrained)(ct_lm *lm, const char *dir);
    void (*free_model)(void *model); /* frees the wrapped model */
} ct_lm_ops;

struct ct_lm {
    const ct_lm_ops *ops;
    void *model;        /* ct_gpt *, ct_llama *, ... */
    bool owns_model;    /* ct_lm_free frees model too */
    ct_module *module;  /* the model's module tree (borrowed from model) */
    int64_t vocab_size; /* logits width */
    int64_t max_positions; /* longest sequence (block_size / max_position_embeddings) */
    int n_layer;
    int64_t n_kv_head, head_dim; /* of one layer's keys and values */
    int64_t bos_token_id, eos_token_id, pad_token_id; /* -1 = none */
};

/* Loads a Hugging Face model directory (config.json + model.safetensors, or the
 * shards of model.safetensors.index.json): "model_type" picks the model. NULL with
 * an error naming the directory, file and key when anything does not fit. */
CT_API ct_lm *ct_lm_from_pretrained(const char *dir);
/* Writes the model in Hugging Face's layout under dir (created if missing). */
CT_API ct_status ct_lm_save_pretrained(ct_lm *lm, const char *dir);
/* A cache for this model: batch rows of max_len positions, in the dtype and on the
 * device of the model's parameters. */
CT_API ct_kv_cache *ct_lm_cache_new(ct_lm *lm, int64_t batch, int64_t max_len);
/* Where the model's parameters live (the first one's device; the CPU for a model without
 * parameters): token ids go there before a forward. */
CT_API ct_device ct_lm_device(const ct_lm *lm);
/* idx (B, T) -> logits (B, T, V); see ct_lm_ops.forward. */
CT_API ct_tensor *ct_lm_forward(ct_lm *lm, ct_tensor *idx, ct_kv_cache *cache);
CT_API void ct_lm_free(ct_lm *lm); /* NULL is fine */

#endif
