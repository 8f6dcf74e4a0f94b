/* The GPT's cached forward against its full forward: feeding a sequence token by
 * token (or in chunks) through a key/value cache gives, at every position, the
 * logits that ct_gpt_forward computes over the whole sequence at once (a separate
 * path: the fused-qkv attention kernel over positions 0..T-1). The weights are
 * redrawn larger than GPT-2's initialisation so that attention is far from uniform
 * and a wrong position, mask or cache slot changes the logits. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/philox.h"
#include "nn/gpt.h"

static const ct_gpt_config tiny = {.vocab_size = 29, .block_size = 12, .n_layer = 2, .n_head = 2, .n_embd = 16};

/* every parameter ~ N(0, 0.3), LayerNorm weights ~ 1 + N(0, 0.3) */
static ct_gpt *random_gpt(uint64_t seed)
{
    ct_set_seed(seed);
    ct_gpt *m = ct_gpt_new(&tiny);
    cr_assert_not_null(m, "%s", ct_last_error());
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    ct_rng r;
    ct_rng_init(&r, seed + 1);
    for (int i = 0; i < l.n; i++) {
        bool ln_w = strstr(l.names[i], "ln_") && strstr(l.names[i], ".weight");
        ct_rng_normal_f32(&r, ct_tensor_data(l.tensors[i]), ct_tensor_numel(l.tensors[i]), ln_w ? 1.0f : 0.0f, 0.3f);
    }
    ct_param_list_free(&l);
    ct_module_train(&m->base, false);
    return m;
}

static const int64_t seq[2][10] = {{3, 17, 0, 28, 5, 5, 11, 2, 19, 7}, {1, 1, 25, 9, 14, 3, 22, 8, 0, 16}};

/* largest |a - b| over the rows [t0, t0 + n) of b (B, T, V) that a (B, n, V) holds */
static double max_diff(const ct_tensor *a, const ct_tensor *b, int64_t t0, double *scale)
{
    double worst = 0;
    int64_t B = a->shape[0], n = a->shape[1], V = a->shape[2], T = b->shape[1];
    const float *pa = ct_tensor_data(a), *pb = ct_tensor_data(b);
    for (int64_t i = 0; i < B; i++)
        for (int64_t t = 0; t < n; t++)
            for (int64_t v = 0; v < V; v++) {
                double x = pa[(i * n + t) * V + v], y = pb[(i * T + t0 + t) * V + v];
                worst = fmax(worst, fabs(x - y));
                *scale = fmax(*scale, fabs(y));
            }
    return worst;
}

/* chunks: the lengths fed one after another (sum = 10) */
static void check_chunks(int64_t B, const int64_t *chunks, int nchunks)
{
    ct_gpt *m = random_gpt(7);
    bool grad = ct_grad_set_enabled(false);
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, 10), seq);
        ct_tensor *full = ct_gpt_forward(m, idx);
        cr_assert_not_null(full, "%s", ct_last_error());
        ct_kv_cache *c = ct_kv_cache_new(2, B, 2, 12, 8, CT_DTYPE_F32, CT_CPU);
        double worst = 0, scale = 0;
        int64_t t0 = 0;
        for (int k = 0; k < nchunks; k++) {
            ct_tensor *part = ct_tensor_contiguous(ct_tensor_narrow(idx, 1, t0, chunks[k]));
            ct_tensor *got = ct_gpt_forward_cached(m, part, c);
            cr_assert_not_null(got, "%s", ct_last_error());
            cr_assert_eq(got->shape[1], chunks[k]);
            cr_assert_eq(c->len, t0 + chunks[k]);
            worst = fmax(worst, max_diff(got, full, t0, &scale));
            t0 += chunks[k];
        }
        /* the logits are O(1..10): attention is not uniform */
        cr_assert(scale > 1, "logits too small (%g) to tell positions apart", scale);
        cr_assert(worst <= 1e-5 * fmax(1, scale), "cached vs full logits differ by %g (scale %g)", worst, scale);
        ct_kv_cache_free(c);
    }
    ct_grad_set_enabled(grad);
    ct_module_free(&m->base);
}

Test(gpt_cached, token_by_token_equals_the_full_forward)
{
    int64_t ones[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    check_chunks(1, ones, 10);
}

Test(gpt_cached, chunked_prefill_and_batch_of_two)
{
    check_chunks(1, (int64_t[]){4, 1, 3, 2}, 4);
    check_chunks(2, (int64_t[]){10}, 1);
    check_chunks(2, (int64_t[]){6, 1, 1, 2}, 4);
}

/* the test above can fail: positions one off give other logits */
Test(gpt_cached, a_cache_that_skipped_a_position_gives_other_logits)
{
    ct_gpt *m = random_gpt(7);
    bool grad = ct_grad_set_enabled(false);
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, 10), seq);
        ct_tensor *full = ct_gpt_forward(m, idx);
        ct_kv_cache *c = ct_kv_cache_new(2, 1, 2, 12, 8, CT_DTYPE_F32, CT_CPU);
        cr_assert_not_null(ct_gpt_forward_cached(m, ct_tensor_narrow(idx, 1, 0, 4), c));
        c->len = 5; /* a stale slot at position 4 */
        double scale = 0;
        ct_tensor *got = ct_gpt_forward_cached(m, ct_tensor_contiguous(ct_tensor_narrow(idx, 1, 4, 1)), c);
        cr_assert_not_null(got, "%s", ct_last_error());
        cr_assert(max_diff(got, full, 4, &scale) > 1e-3);
        ct_kv_cache_free(c);
    }
    ct_grad_set_enabled(grad);
    ct_module_free(&m->base);
}

Test(gpt_cached, errors_name_the_misfit)
{
    ct_gpt *m = random_gpt(3);
    bool grad = ct_grad_set_enabled(false);
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, 10), seq);
        ct_kv_cache *c = ct_kv_cache_new(2, 1, 2, 12, 8, CT_DTYPE_F32, CT_CPU);
        cr_assert_not_null(ct_gpt_forward_cached(m, idx, c));
        /* 10 + 3 > block_size 12 */
        cr_assert_null(ct_gpt_forward_cached(m, ct_tensor_narrow(idx, 1, 0, 3), c));
        cr_assert(strstr(ct_last_error(), "10 cached + 3 new positions exceed block_size 12"), "%s", ct_last_error());
        cr_assert_eq(c->len, 10);
        ct_kv_cache_free(c);
        /* a cache of another shape */
        c = ct_kv_cache_new(2, 1, 4, 12, 4, CT_DTYPE_F32, CT_CPU);
        cr_assert_null(ct_gpt_forward_cached(m, idx, c));
        cr_assert(strstr(ct_last_error(), "does not fit"), "%s", ct_last_error());
        ct_kv_cache_free(c);
        /* float tokens */
        c = ct_kv_cache_new(2, 1, 2, 12, 8, CT_DTYPE_F32, CT_CPU);
        cr_assert_null(ct_gpt_forward_cached(m, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2)), c));
        cr_assert(strstr(ct_last_error(), "integer tokens"), "%s", ct_last_error());
        /* with grad on: refused, nothing appended */
        ct_grad_set_enabled(true);
        cr_assert_null(ct_gpt_forward_cached(m, idx, c));
        cr_assert(strstr(ct_last_error(), "not differentiable"), "%s", ct_last_error());
        ct_grad_set_enabled(false);
        cr_assert_eq(c->len, 0);
        ct_kv_cache_free(c);
        /* no cache: the plain forward */
        ct_tensor *a = ct_gpt_forward_cached(m, idx, NULL), *b = ct_gpt_forward(m, idx);
        cr_assert_not_null(a);
        cr_assert_eq(memcmp(ct_tensor_data(a), ct_tensor_data(b), ct_tensor_nbytes(a)), 0);
    }
    ct_grad_set_enabled(grad);
    ct_module_free(&m->base);
}
