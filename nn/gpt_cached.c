/* GPT forward over new tokens with a key/value cache (see nn/gpt.h, nn/kv_cache.h).
 *
 * With P = cache->len positions already in the cache and T new tokens:
 *   x = wte[idx] + wpe[P .. P+T)                                   (B, T, C)
 *   per block i:  qkv = c_attn(ln_1(x))                            (B, T, 3C)
 *                 q, k, v = the three column blocks as (B, H, T, D)
 *                 k_all, v_all = cache layer i after appending k, v  (B, H, P+T, D)
 *                 y = softmax(q k_all^T / sqrt(D), causal) v_all     (B, H, T, D)
 *                 x = x + c_proj(y merged to (B, T, C));  x = x + mlp(ln_2(x))
 *   logits = ln_f(x) @ wte^T                                        (B, T, V)
 * ct_attention's causal mask is bottom-right aligned (query t sees keys j <= t + P),
 * which is exactly "position P + t sees positions <= P + t". The arithmetic is the
 * training forward's, so cached logits equal ct_gpt_forward's on the whole context
 * up to float rounding.
 */
#include <math.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/frame.h"
#include "nn/gpt.h"

/* column block j of qkv (B, T, 3C) as heads (B, H, T, D), a strided view when the
 * layout allows */
static ct_tensor *qkv_heads(ct_tensor *qkv, int j, int64_t H, int64_t C)
{
    int64_t B = qkv->shape[0], T = qkv->shape[1];
    ct_tensor *part = ct_reshape(ct_narrow(qkv, 2, j * C, C), CT_SHAPE(B, T, H, C / H));
    return ct_transpose(part, 1, 2);
}

/* One block over the new tokens; a failure flows through as NULL so that every
 * module's forward_end still runs (its hooks see the failure). */
static ct_tensor *block_forward_cached(ct_gpt_block *b, int layer, ct_tensor *x, ct_kv_cache *cache)
{
    if (!x || ct_module_forward_begin(&b->base)) return NULL;
    ct_gpt_attention *a = b->attn;
    ct_tensor *y = NULL;
    if (!ct_module_forward_begin(&a->base)) {
        int64_t B = x->shape[0], T = x->shape[1], C = a->n_embd, H = a->n_head;
        ct_tensor *qkv = ct_linear_layer_forward(a->c_attn, ct_layernorm_layer_forward(b->ln_1, x));
        ct_tensor *q = qkv ? qkv_heads(qkv, 0, H, C) : NULL, *k = qkv ? qkv_heads(qkv, 1, H, C) : NULL;
        ct_tensor *v = qkv ? qkv_heads(qkv, 2, H, C) : NULL, *k_all = NULL, *v_all = NULL;
        if (q && k && v && !ct_kv_cache_append(cache, layer, k, v, &k_all, &v_all))
            y = ct_attention(q, k_all, v_all, true, 1.0 / sqrt((double)(C / H)));
        y = y ? ct_reshape(ct_transpose(y, 1, 2), CT_SHAPE(B, T, C)) : NULL;
        y = ct_module_forward_end(&a->base,
                                  ct_dropout_layer_forward(a->resid_dropout, ct_linear_layer_forward(a->c_proj, y)));
    }
    x = y ? ct_add(x, y) : NULL;
    y = x ? ct_gpt_mlp_forward(b->mlp, ct_layernorm_layer_forward(b->ln_2, x)) : NULL;
    return ct_module_forward_end(&b->base, y ? ct_add(x, y) : NULL);
}

ct_tensor *ct_gpt_forward_cached(ct_gpt *m, ct_tensor *idx, ct_kv_cache *cache)
{
    if (!cache) return ct_gpt_forward(m, idx);
    if (!m || !idx) {
        ct_error_set(CT_ERR_INVALID, "gpt_forward_cached: NULL model or idx");
        return NULL;
    }
    if (m->tp) {
        ct_error_set(CT_ERR_INVALID, "gpt_forward_cached: the model is sharded for tensor parallelism; the key/value "
                     "cache needs the whole model (generate with ct_gpt_forward, or gather the weights first)");
        return NULL;
    }
    /* the cache holds copies: gradients would silently stop at it */
    if (ct_grad_is_enabled()) {
        ct_error_set(CT_ERR_INVALID, "gpt_forward_cached: the key/value cache is not differentiable; run it with grad "
                     "off (CT_NO_GRAD or ct_grad_set_enabled(false))");
        return NULL;
    }
    char d[200];
    const ct_gpt_config *c = &m->cfg;
    if (idx->ndim != 2 || idx->shape[1] < 1 || ct_dtype_is_float(idx->dtype)) {
        ct_error_set(CT_ERR_INVALID, "gpt_forward_cached: idx %s must be integer tokens (B, T) with T >= 1",
                     ct_tensor_describe(idx, d, sizeof d));
        return NULL;
    }
    int64_t B = idx->shape[0], T = idx->shape[1], P = cache->len, D = c->n_embd / c->n_head;
    if (P + T > c->block_size) {
        ct_error_set(CT_ERR_INVALID, "gpt_forward_cached: %lld cached + %lld new positions exceed block_size %lld",
                     (long long)P, (long long)T, (long long)c->block_size);
        return NULL;
    }
    if (ct_kv_cache_check(cache, "gpt_forward_cached", (int)c->n_layer, c->n_head, D, B, T)) return NULL;
    if (ct_module_forward_begin(&m->base)) return NULL;
    ct_tensor *pos = ct_tensor_to(ct_tensor_arange(CT_DTYPE_I64, (double)P, (double)(P + T), 1), idx->device);
    ct_tensor *x = pos ? ct_add(ct_embedding_layer_forward(m->wte, idx), ct_embedding_layer_forward(m->wpe, pos)) : NULL;
    x = ct_dropout_layer_forward(m->drop, x);
    for (int64_t i = 0; x && i < c->n_layer; i++) x = block_forward_cached(m->blocks[i], (int)i, x, cache);
    x = ct_layernorm_layer_forward(m->ln_f, x);
    /* tied head as in ct_gpt_forward; generation runs without fp8 */
    ct_tensor *logits = x ? ct_matmul_t(x, m->wte->weight, false, true) : NULL;
    if (logits && logits->dtype != CT_DTYPE_F32 && logits->dtype != CT_DTYPE_F64) logits = ct_cast(logits, CT_DTYPE_F32);
    if (logits && ct_kv_cache_advance(cache, T)) logits = NULL;
    if (!logits) ct_error_prefix("gpt_forward_cached: ");
    return ct_module_forward_end(&m->base, logits);
}
