/* ctrain — key/value cache for incremental decoding.
 *
 * One cache serves one model and one batch. For each layer l it owns
 *   k[l], v[l]: (B, H_kv, max_len, D)   in the model's dtype, on the model's device
 * of which positions [0, len) are filled. A forward pass over T new tokens at
 * positions [len, len + T) writes its keys and values with ct_kv_cache_append
 * (one call per layer), attends over the returned views of [0, len + T), and the
 * model calls ct_kv_cache_advance(c, T) once after its last layer.
 *
 * Causal masking needs no offset argument: ct_attention's mask is aligned to the
 * bottom right (query i sees keys j <= i + S - T), which is exactly "query at
 * position len + i sees positions <= len + i" when S = len + T.
 *
 * Values appended are copies; the cache never keeps a caller's tensor. The cache is
 * not differentiable: use it under ct_no_grad / ct_grad_set_enabled(false).
 */
#ifndef CT_NN_KV_CACHE_H
#define CT_NN_KV_CACHE_H

#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

typedef struct ct_kv_cache {
    int n_layer;
    int64_t batch, n_kv_head, head_dim, max_len;
    int64_t len;     /* positions filled, in every layer, after the last advance */
    ct_dtype dtype;
    ct_device device;
    ct_tensor **k, **v; /* n_layer each, owned (not in any frame) */
} ct_kv_cache;

/* A cache of max_len positions (the model's context length, or prompt + new tokens).
 * NULL with an error when a size is < 1 or memory runs out. */
CT_API ct_kv_cache *ct_kv_cache_new(int n_layer, int64_t batch, int64_t n_kv_head, int64_t max_len,
                                    int64_t head_dim, ct_dtype dtype, ct_device device);
CT_API void ct_kv_cache_free(ct_kv_cache *c); /* NULL is fine */
/* Forgets every position (len = 0); the memory stays allocated. */
CT_API void ct_kv_cache_reset(ct_kv_cache *c);

/* Copies k, v (B, H_kv, T, D) (any strides) into layer's positions [len, len + T)
 * and sets *k_all, *v_all to views (B, H_kv, len + T, D) of the filled part (new
 * references, current frame). An error names the layer and shapes when k or v does
 * not fit: wrong B, H_kv or D, or len + T > max_len ("cache full"). */
CT_API ct_status ct_kv_cache_append(ct_kv_cache *c, int layer, ct_tensor *k, ct_tensor *v, ct_tensor **k_all,
                                    ct_tensor **v_all);
/* Whether a model of n_layer layers, n_kv_head key/value heads of head_dim can run a
 * forward of (batch, T) new tokens on c: CT_ERR_INVALID naming op, the cache's and the
 * model's sizes, or "cache full" when len + T > max_len. */
CT_API ct_status ct_kv_cache_check(const ct_kv_cache *c, const char *op, int n_layer, int64_t n_kv_head,
                                   int64_t head_dim, int64_t batch, int64_t T);
/* Marks T more positions filled; call once per forward, after the last layer. */
CT_API ct_status ct_kv_cache_advance(ct_kv_cache *c, int64_t T);

#endif
