/* Key/value cache for incremental decoding (see nn/kv_cache.h). */
#include <stdlib.h>

#include "core/error.h"
#include "core/frame.h"
#include "nn/kv_cache.h"

ct_kv_cache *ct_kv_cache_new(int n_layer, int64_t batch, int64_t n_kv_head, int64_t max_len, int64_t head_dim,
                             ct_dtype dtype, ct_device device)
{
    if (n_layer < 1 || batch < 1 || n_kv_head < 1 || max_len < 1 || head_dim < 1) {
        ct_error_set(CT_ERR_INVALID, "kv_cache_new: n_layer %d, batch %lld, n_kv_head %lld, max_len %lld and head_dim %lld "
                     "must all be >= 1", n_layer, (long long)batch, (long long)n_kv_head, (long long)max_len,
                     (long long)head_dim);
        return NULL;
    }
    ct_kv_cache *c = calloc(1, sizeof *c);
    if (c) c->k = calloc((size_t)n_layer, sizeof *c->k), c->v = calloc((size_t)n_layer, sizeof *c->v);
    if (!c || !c->k || !c->v) {
        ct_kv_cache_free(c);
        ct_error_set(CT_ERR_NOMEM, "kv_cache_new: out of memory for %d layers", n_layer);
        return NULL;
    }
    c->n_layer = n_layer, c->batch = batch, c->n_kv_head = n_kv_head, c->head_dim = head_dim, c->max_len = max_len;
    c->dtype = dtype, c->device = device;
    ct_frame_push();
    for (int l = 0; l < n_layer; l++) {
        ct_tensor *k = ct_tensor_zeros_on(device, dtype, CT_SHAPE(batch, n_kv_head, max_len, head_dim));
        ct_tensor *v = k ? ct_tensor_zeros_on(device, dtype, CT_SHAPE(batch, n_kv_head, max_len, head_dim)) : NULL;
        if (!v) break;
        c->k[l] = ct_tensor_retain(k), c->v[l] = ct_tensor_retain(v);
    }
    ct_frame_pop();
    if (!c->v[n_layer - 1]) {
        ct_error_prefix("kv_cache_new: %d layers of (%lld, %lld, %lld, %lld): ", n_layer, (long long)batch,
                        (long long)n_kv_head, (long long)max_len, (long long)head_dim);
        ct_kv_cache_free(c);
        return NULL;
    }
    return c;
}

void ct_kv_cache_free(ct_kv_cache *c)
{
    if (!c) return;
    for (int l = 0; l < c->n_layer && c->k && c->v; l++) ct_tensor_release(c->k[l]), ct_tensor_release(c->v[l]);
    free(c->k);
    free(c->v);
    free(c);
}

void ct_kv_cache_reset(ct_kv_cache *c)
{
    if (c) c->len = 0;
}

static bool fits(const ct_kv_cache *c, const ct_tensor *t)
{
    return t->ndim == 4 && t->shape[0] == c->batch && t->shape[1] == c->n_kv_head && t->shape[3] == c->head_dim;
}

ct_status ct_kv_cache_append(ct_kv_cache *c, int layer, ct_tensor *k, ct_tensor *v, ct_tensor **k_all, ct_tensor **v_all)
{
    if (!c || !k || !v || !k_all || !v_all) return ct_error_set(CT_ERR_INVALID, "kv_cache_append: NULL argument");
    if (layer < 0 || layer >= c->n_layer)
        return ct_error_set(CT_ERR_INVALID, "kv_cache_append: layer %d outside [0, %d)", layer, c->n_layer);
    if (!fits(c, k) || !fits(c, v) || k->shape[2] != v->shape[2]) {
        char ks[96], vs[96];
        ct_shape_str(k->ndim, k->shape, ks, sizeof ks), ct_shape_str(v->ndim, v->shape, vs, sizeof vs);
        return ct_error_set(CT_ERR_INVALID, "kv_cache_append: layer %d: k %s and v %s must both be (%lld, %lld, T, %lld)",
                            layer, ks, vs, (long long)c->batch, (long long)c->n_kv_head, (long long)c->head_dim);
    }
    int64_t T = k->shape[2];
    if (c->len + T > c->max_len)
        return ct_error_set(CT_ERR_INVALID, "kv_cache_append: layer %d: cache full: %lld positions filled + %lld new > "
                            "max_len %lld", layer, (long long)c->len, (long long)T, (long long)c->max_len);
    ct_status st = ct_tensor_copy_(ct_tensor_narrow(c->k[layer], 2, c->len, T), k);
    if (!st) st = ct_tensor_copy_(ct_tensor_narrow(c->v[layer], 2, c->len, T), v);
    if (st) return ct_error_prefix("kv_cache_append: layer %d: ", layer), st;
    *k_all = ct_tensor_narrow(c->k[layer], 2, 0, c->len + T);
    *v_all = ct_tensor_narrow(c->v[layer], 2, 0, c->len + T);
    return (*k_all && *v_all) ? CT_OK : ct_last_status();
}

ct_status ct_kv_cache_check(const ct_kv_cache *c, const char *op, int n_layer, int64_t n_kv_head,
                            int64_t head_dim, int64_t batch, int64_t T)
{
    if (!c) return ct_error_set(CT_ERR_INVALID, "%s: the cache is NULL", op);
    if (c->n_layer != n_layer || c->n_kv_head != n_kv_head || c->head_dim != head_dim || c->batch != batch)
        return ct_error_set(CT_ERR_INVALID, "%s: cache of %d layers, batch %lld, %lld kv heads of %lld does not fit "
                            "the model (%d layers, %lld kv heads of %lld) and batch %lld", op, c->n_layer,
                            (long long)c->batch, (long long)c->n_kv_head, (long long)c->head_dim, n_layer,
                            (long long)n_kv_head, (long long)head_dim, (long long)batch);
    if (T < 0 || c->len + T > c->max_len)
        return ct_error_set(CT_ERR_INVALID, "%s: cache full: %lld positions filled + %lld new > max_len %lld", op,
                            (long long)c->len, (long long)T, (long long)c->max_len);
    return CT_OK;
}

ct_status ct_kv_cache_advance(ct_kv_cache *c, int64_t T)
{
    if (!c) return ct_error_set(CT_ERR_INVALID, "kv_cache_advance: NULL cache");
    if (T < 0 || c->len + T > c->max_len)
        return ct_error_set(CT_ERR_INVALID, "kv_cache_advance: %lld positions filled + %lld > max_len %lld",
                            (long long)c->len, (long long)T, (long long)c->max_len);
    c->len += T;
    return CT_OK;
}
