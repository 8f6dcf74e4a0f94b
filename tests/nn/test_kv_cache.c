/* The key/value cache: appended values land at positions [len, len + T) of each
 * layer, the views cover [0, len + T), advance moves len, and misfits are errors
 * naming the layer and shapes. Expected values are written out by hand. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/frame.h"
#include "nn/kv_cache.h"

/* (1, 2, T, 2) with element [0, h, t, d] = base + 100 h + 10 t + d */
static ct_tensor *filled(int64_t T, double base)
{
    ct_tensor *t = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2, T, 2));
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t d = 0; d < 2; d++) ct_tensor_set(t, (int64_t[]){0, h, i, d}, base + 100 * h + 10 * i + d);
    return t;
}

static double at(const ct_tensor *t, int64_t h, int64_t i, int64_t d)
{
    return ct_tensor_get(t, (int64_t[]){0, h, i, d});
}

Test(kv_cache, append_writes_positions_and_views_cover_the_filled_part)
{
    CT_FRAME {
        ct_kv_cache *c = ct_kv_cache_new(2, 1, 2, 5, 2, CT_DTYPE_F32, CT_CPU);
        cr_assert_not_null(c, "%s", ct_last_error());
        cr_assert_eq(c->len, 0);
        ct_tensor *ka, *va;
        /* layer 0 then layer 1 see the same len until the advance */
        cr_assert_eq(ct_kv_cache_append(c, 0, filled(3, 0), filled(3, 1000), &ka, &va), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ka->shape[2], 3);
        cr_assert_eq(ct_kv_cache_append(c, 1, filled(3, 5000), filled(3, 6000), &ka, &va), CT_OK);
        cr_assert_eq(ka->shape[2], 3);
        cr_assert_eq(c->len, 0);
        cr_assert_eq(ct_kv_cache_advance(c, 3), CT_OK);
        cr_assert_eq(c->len, 3);
        /* two more tokens at positions 3, 4; a transposed (strided) source */
        ct_tensor *k2 = ct_tensor_contiguous(ct_tensor_transpose(filled(2, 7), 1, 2)); /* (1, 2, 2, 2): [0, t, h, d] */
        k2 = ct_tensor_transpose(k2, 1, 2);                                             /* back as a strided view */
        cr_assert_eq(ct_kv_cache_append(c, 0, k2, filled(2, 2000), &ka, &va), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ka->ndim, 4);
        cr_assert_eq(ka->shape[0], 1);
        cr_assert_eq(ka->shape[1], 2);
        cr_assert_eq(ka->shape[2], 5);
        cr_assert_eq(ka->shape[3], 2);
        /* positions 0..2 from the first append, 3..4 from the second */
        cr_assert_eq(at(ka, 0, 0, 0), 0);
        cr_assert_eq(at(ka, 1, 2, 1), 100 + 20 + 1);
        cr_assert_eq(at(ka, 0, 3, 0), 7);
        cr_assert_eq(at(ka, 1, 4, 1), 7 + 100 + 10 + 1);
        cr_assert_eq(at(va, 0, 1, 1), 1000 + 10 + 1);
        cr_assert_eq(at(va, 1, 3, 0), 2000 + 100);
        cr_assert_eq(at(va, 1, 4, 1), 2000 + 100 + 10 + 1);
        /* layer 1 kept its own values */
        cr_assert_eq(ct_kv_cache_append(c, 1, filled(1, 9000), filled(1, 9500), &ka, &va), CT_OK);
        cr_assert_eq(ka->shape[2], 4);
        cr_assert_eq(at(ka, 1, 2, 0), 5000 + 100 + 20);
        cr_assert_eq(at(ka, 1, 3, 1), 9000 + 100 + 1);
        cr_assert_eq(at(va, 0, 0, 0), 6000);
        /* the cache copies: changing the source afterwards changes nothing */
        ct_tensor *src = filled(1, 300);
        cr_assert_eq(ct_kv_cache_append(c, 0, src, src, &ka, &va), CT_OK);
        ct_tensor_fill_(src, -1);
        cr_assert_eq(at(ka, 0, 3, 0), 300);
        ct_kv_cache_reset(c);
        cr_assert_eq(c->len, 0);
        ct_kv_cache_free(c);
    }
}

Test(kv_cache, misfits_and_a_full_cache_are_errors)
{
    CT_FRAME {
        cr_assert_null(ct_kv_cache_new(0, 1, 1, 1, 1, CT_DTYPE_F32, CT_CPU));
        cr_assert(strstr(ct_last_error(), "n_layer 0"), "%s", ct_last_error());
        cr_assert_null(ct_kv_cache_new(1, 1, 1, 0, 1, CT_DTYPE_F32, CT_CPU));
        ct_kv_cache *c = ct_kv_cache_new(2, 1, 2, 4, 2, CT_DTYPE_F32, CT_CPU);
        cr_assert_not_null(c);
        ct_tensor *ka = NULL, *va = NULL;
        /* wrong head_dim */
        ct_tensor *bad = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2, 1, 3));
        cr_assert_neq(ct_kv_cache_append(c, 1, bad, bad, &ka, &va), CT_OK);
        cr_assert(strstr(ct_last_error(), "layer 1") && strstr(ct_last_error(), "(1, 2, T, 2)"), "%s", ct_last_error());
        /* k and v of different lengths */
        cr_assert_neq(ct_kv_cache_append(c, 0, filled(2, 0), filled(1, 0), &ka, &va), CT_OK);
        /* no such layer */
        cr_assert_neq(ct_kv_cache_append(c, 2, filled(1, 0), filled(1, 0), &ka, &va), CT_OK);
        cr_assert(strstr(ct_last_error(), "layer 2 outside [0, 2)"), "%s", ct_last_error());
        /* 3 + 2 > 4 */
        cr_assert_eq(ct_kv_cache_append(c, 0, filled(3, 0), filled(3, 0), &ka, &va), CT_OK);
        cr_assert_eq(ct_kv_cache_advance(c, 3), CT_OK);
        cr_assert_neq(ct_kv_cache_append(c, 0, filled(2, 0), filled(2, 0), &ka, &va), CT_OK);
        cr_assert(strstr(ct_last_error(), "cache full: 3 positions filled + 2 new > max_len 4"), "%s", ct_last_error());
        cr_assert_neq(ct_kv_cache_advance(c, 2), CT_OK);
        cr_assert_eq(c->len, 3);
        /* the models' check before a forward: sizes, then room */
        cr_assert_eq(ct_kv_cache_check(c, "fwd", 2, 2, 2, 1, 1), CT_OK, "%s", ct_last_error());
        cr_assert_neq(ct_kv_cache_check(c, "fwd", 2, 2, 2, 1, 2), CT_OK);
        cr_assert(strstr(ct_last_error(), "fwd: cache full: 3 positions filled + 2 new > max_len 4"), "%s",
                  ct_last_error());
        cr_assert_neq(ct_kv_cache_check(c, "fwd", 3, 2, 2, 1, 1), CT_OK);
        cr_assert(strstr(ct_last_error(), "fwd: cache of 2 layers, batch 1, 2 kv heads of 2 does not fit the model "
                                          "(3 layers, 2 kv heads of 2) and batch 1"),
                  "%s", ct_last_error());
        cr_assert_neq(ct_kv_cache_check(c, "fwd", 2, 2, 2, 2, 1), CT_OK);
        cr_assert_neq(ct_kv_cache_check(c, "fwd", 2, 1, 2, 1, 1), CT_OK);
        cr_assert_neq(ct_kv_cache_check(c, "fwd", 2, 2, 4, 1, 1), CT_OK);
        /* exactly full is fine */
        cr_assert_eq(ct_kv_cache_append(c, 0, filled(1, 0), filled(1, 0), &ka, &va), CT_OK);
        cr_assert_eq(ka->shape[2], 4);
        ct_kv_cache_free(c);
        ct_kv_cache_free(NULL);
    }
}
