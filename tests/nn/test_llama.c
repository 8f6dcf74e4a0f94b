/* Llama decoder (nn/llama.c): the forward against a plain-loop f64 reference written
 * here (RMSNorm, rotary embedding in its pairwise form, causal grouped-query
 * attention, SwiGLU), with every rope_scaling type's frequencies computed here from
 * transformers' formulas; gradients against finite differences; the cached forward
 * against the full one; parameter names; nn/lm.h's view. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "core/philox.h"
#include "nn/kv_cache.h"
#include "nn/llama.h"
#include "precision/autocast.h"

/* untied, grouped-query (6 query heads over 2 kv heads of 4), odd sizes */
static const ct_llama_config gqa = {.vocab_size = 37, .hidden_size = 18, .intermediate_size = 29,
                                    .num_hidden_layers = 2, .num_attention_heads = 6, .num_key_value_heads = 2,
                                    .head_dim = 4,
                                    .max_position_embeddings = 64, .rms_norm_eps = 1e-5, .rope_theta = 50};

/* tied, head_dim given so that heads * head_dim (4 * 6) != hidden_size (20) */
static const ct_llama_config tied = {.vocab_size = 23, .hidden_size = 20, .intermediate_size = 13,
                                     .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 4,
                                     .head_dim = 6, .max_position_embeddings = 32, .rope_theta = 10,
                                     .tie_word_embeddings = true};

/* every parameter normal(0, 0.5): the norms' weights too, so that they count */
static ct_llama *random_model(const ct_llama_config *c, ct_dtype dt, uint64_t seed)
{
    ct_llama_config k = *c;
    k.dtype = dt;
    ct_set_seed(seed);
    ct_llama *m = ct_llama_new(&k);
    cr_assert_not_null(m, "%s", ct_last_error());
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    for (int i = 0; i < l.n; i++) cr_assert_eq(ct_init_normal_(l.tensors[i], 0.5), CT_OK);
    ct_param_list_free(&l);
    return m;
}

/* ---- the reference ------------------------------------------------------------------- */

/* the parameter as doubles (a malloc'ed copy) */
static double *param(const ct_llama *m, const char *fmt, int layer)
{
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    ct_tensor *t = ct_module_find(&m->base, name);
    cr_assert_not_null(t, "no parameter %s", name);
    int64_t n = ct_tensor_numel(t);
    double *d = malloc((size_t)n * sizeof *d);
    CT_FRAME {
        ct_tensor *c = ct_tensor_cast(ct_tensor_contiguous(t), CT_DTYPE_F64);
        memcpy(d, ct_tensor_data(c), (size_t)n * sizeof *d);
    }
    return d;
}

/* y (n, out) = x (n, in) W^T, W (out, in) */
static void matvec(const double *x, const double *w, double *y, int64_t n, int64_t in, int64_t out)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = 0;
            for (int64_t i = 0; i < in; i++) s += x[r * in + i] * w[o * in + i];
            y[r * out + o] = s;
        }
}

static void rmsnorm(const double *x, const double *w, double *y, int64_t n, int64_t C, double eps)
{
    for (int64_t r = 0; r < n; r++) {
        double ss = 0;
        for (int64_t i = 0; i < C; i++) ss += x[r * C + i] * x[r * C + i];
        double rs = 1 / sqrt(ss / (double)C + eps);
        for (int64_t i = 0; i < C; i++) y[r * C + i] = x[r * C + i] * rs * w[i];
    }
}

/* transformers' ROPE_INIT_FUNCTIONS, written out again for the D/2 frequencies */
static void ref_inv_freq(const ct_llama_config *c, int64_t seq_len, double *f)
{
    int64_t D = c->head_dim;
    double base = c->rope_theta, factor = c->rope_scaling.factor;
    if (c->rope_scaling.type == CT_ROPE_DYNAMIC && seq_len > c->max_position_embeddings)
        base = base * pow(factor * seq_len / c->max_position_embeddings - (factor - 1), D / (D - 2.0));
    for (int64_t i = 0; i < D / 2; i++) {
        double inv = 1.0 / pow(base, (2.0 * i) / D);
        switch (c->rope_scaling.type) {
        case CT_ROPE_LINEAR: inv = inv / factor; break;
        case CT_ROPE_LLAMA3: {
            double old = c->rope_scaling.original_max_position_embeddings;
            double lo = c->rope_scaling.low_freq_factor, hi = c->rope_scaling.high_freq_factor;
            double wavelen = 2 * M_PI / inv;
            double scaled = wavelen > old / lo ? inv / factor : inv;
            double smooth = (old / wavelen - lo) / (hi - lo);
            bool medium = !(wavelen < old / hi) && !(wavelen > old / lo);
            inv = medium ? (1 - smooth) * scaled / factor + smooth * scaled : scaled;
            break;
        }
        default: break;
        }
        f[i] = inv;
    }
}

/* rotates pairs (j, j + D/2) of each head of x (T rows of nh heads of D) by p * f[j] */
static void rope(double *x, int64_t T, int64_t nh, int64_t D, const double *f)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t j = 0; j < D / 2; j++) {
                double *a = &x[(t * nh + h) * D + j], *b = a + D / 2;
                double c = cos(t * f[j]), s = sin(t * f[j]), x1 = *a, x2 = *b;
                *a = x1 * c - x2 * s;
                *b = x2 * c + x1 * s;
            }
}

/* logits (B, T, V) of the model's weights for ids (B, T) */
static double *ref_forward(const ct_llama *m, const int64_t *ids, int64_t B, int64_t T)
{
    const ct_llama_config *c = &m->cfg;
    int64_t C = c->hidden_size, H = c->num_attention_heads, Hk = c->num_key_value_heads, D = c->head_dim;
    int64_t I = c->intermediate_size, V = c->vocab_size, N = B * T;
    double *x = calloc((size_t)(N * C), sizeof *x), *h = calloc((size_t)(N * C), sizeof *h);
    double *q = calloc((size_t)(N * H * D), sizeof *q), *k = calloc((size_t)(N * Hk * D), sizeof *k);
    double *v = calloc((size_t)(N * Hk * D), sizeof *v), *att = calloc((size_t)(N * H * D), sizeof *att);
    double *g = calloc((size_t)(N * I), sizeof *g), *u = calloc((size_t)(N * I), sizeof *u);
    double *tmp = calloc((size_t)(N * C), sizeof *tmp), *f = calloc((size_t)D, sizeof *f);
    double *p = calloc((size_t)T, sizeof *p);
    double *logits = calloc((size_t)(N * V), sizeof *logits);
    ref_inv_freq(c, T, f);
    double *emb = param(m, "model.embed_tokens.weight", 0);
    for (int64_t r = 0; r < N; r++) memcpy(&x[r * C], &emb[ids[r] * C], (size_t)C * sizeof *x);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        double *wn = param(m, "model.layers.%d.input_layernorm.weight", l);
        double *wq = param(m, "model.layers.%d.self_attn.q_proj.weight", l);
        double *wk = param(m, "model.layers.%d.self_attn.k_proj.weight", l);
        double *wv = param(m, "model.layers.%d.self_attn.v_proj.weight", l);
        double *wo = param(m, "model.layers.%d.self_attn.o_proj.weight", l);
        double *wp = param(m, "model.layers.%d.post_attention_layernorm.weight", l);
        double *wg = param(m, "model.layers.%d.mlp.gate_proj.weight", l);
        double *wu = param(m, "model.layers.%d.mlp.up_proj.weight", l);
        double *wd = param(m, "model.layers.%d.mlp.down_proj.weight", l);
        rmsnorm(x, wn, h, N, C, c->rms_norm_eps);
        matvec(h, wq, q, N, C, H * D);
        matvec(h, wk, k, N, C, Hk * D);
        matvec(h, wv, v, N, C, Hk * D);
        for (int64_t b = 0; b < B; b++) {
            rope(q + b * T * H * D, T, H, D, f);
            rope(k + b * T * Hk * D, T, Hk, D, f);
            for (int64_t hh = 0; hh < H; hh++) {
                int64_t kh = hh / (H / Hk); /* the kv head of this query head */
                for (int64_t t = 0; t < T; t++) {
                    const double *qv = &q[((b * T + t) * H + hh) * D];
                    double mx = -INFINITY, sum = 0;
                    for (int64_t s = 0; s <= t; s++) {
                        const double *kv = &k[((b * T + s) * Hk + kh) * D];
                        double d = 0;
                        for (int64_t j = 0; j < D; j++) d += qv[j] * kv[j];
                        p[s] = d / sqrt((double)D);
                        mx = fmax(mx, p[s]);
                    }
                    for (int64_t s = 0; s <= t; s++) sum += p[s] = exp(p[s] - mx);
                    double *o = &att[((b * T + t) * H + hh) * D];
                    for (int64_t j = 0; j < D; j++) {
                        o[j] = 0;
                        for (int64_t s = 0; s <= t; s++) o[j] += p[s] / sum * v[((b * T + s) * Hk + kh) * D + j];
                    }
                }
            }
        }
        matvec(att, wo, tmp, N, H * D, C);
        for (int64_t i = 0; i < N * C; i++) x[i] += tmp[i];
        rmsnorm(x, wp, h, N, C, c->rms_norm_eps);
        matvec(h, wg, g, N, C, I);
        matvec(h, wu, u, N, C, I);
        for (int64_t i = 0; i < N * I; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        matvec(g, wd, tmp, N, I, C);
        for (int64_t i = 0; i < N * C; i++) x[i] += tmp[i];
        free(wn), free(wq), free(wk), free(wv), free(wo), free(wp), free(wg), free(wu), free(wd);
    }
    double *wn = param(m, "model.norm.weight", 0);
    rmsnorm(x, wn, h, N, C, c->rms_norm_eps);
    double *head = c->tie_word_embeddings ? emb : param(m, "lm_head.weight", 0);
    matvec(h, head, logits, N, C, V);
    if (head != emb) free(head);
    free(emb), free(wn), free(x), free(h), free(q), free(k), free(v), free(att), free(g), free(u), free(tmp);
    free(f), free(p);
    return logits;
}

static int64_t *random_ids(int64_t n, int64_t V, uint64_t seed)
{
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    ct_rng r;
    ct_rng_init(&r, seed);
    for (int64_t i = 0; i < n; i++) {
        double u;
        ct_rng_uniform_f64(&r, &u, 1, 0, (double)V);
        ids[i] = (int64_t)u % V;
    }
    return ids;
}

/* max |model - reference| over the logits of B x T random tokens */
static double forward_error(const ct_llama_config *c, ct_dtype dt, int64_t B, int64_t T, uint64_t seed)
{
    ct_llama *m = random_model(c, dt, seed);
    int64_t *ids = random_ids(B * T, m->cfg.vocab_size, seed + 1);
    double *want = ref_forward(m, ids, B, T), err = 0;
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T), ids);
        ct_tensor *y = ct_llama_forward(m, idx);
        cr_assert_not_null(y, "%s", ct_last_error());
        cr_assert(y->ndim == 3 && y->shape[0] == B && y->shape[1] == T && y->shape[2] == m->cfg.vocab_size);
        y = ct_tensor_cast(ct_tensor_contiguous(y), CT_DTYPE_F64);
        const double *got = ct_tensor_data(y);
        for (int64_t i = 0; i < B * T * m->cfg.vocab_size; i++) err = fmax(err, fabs(got[i] - want[i]));
    }
    free(want);
    free(ids);
    ct_module_free(&m->base);
    return err;
}

Test(llama, forward_matches_f64_reference_gqa_and_tied)
{
    double e1 = forward_error(&gqa, CT_DTYPE_F64, 2, 7, 1);
    cr_assert_lt(e1, 1e-10, "GQA f64: max error %g", e1);
    double e2 = forward_error(&tied, CT_DTYPE_F64, 3, 5, 2);
    cr_assert_lt(e2, 1e-10, "tied f64: max error %g", e2);
    /* f32: the rotary angles are rounded to f32 as transformers rounds them */
    double e3 = forward_error(&gqa, CT_DTYPE_F32, 2, 9, 3);
    cr_assert_lt(e3, 2e-4, "GQA f32: max error %g", e3);
}

Test(llama, forward_matches_reference_under_rope_scaling)
{
    ct_llama_config c = gqa;
    c.head_dim = 8, c.num_attention_heads = 4, c.num_key_value_heads = 1, c.hidden_size = 20;
    c.rope_theta = 10000;
    c.rope_scaling = (ct_rope_scaling){.type = CT_ROPE_LINEAR, .factor = 2.5};
    double e = forward_error(&c, CT_DTYPE_F64, 1, 9, 4);
    cr_assert_lt(e, 1e-10, "linear: max error %g", e);
    /* dynamic: 9 positions over a trained context of 4 changes the base */
    c.rope_scaling = (ct_rope_scaling){.type = CT_ROPE_DYNAMIC, .factor = 3};
    c.max_position_embeddings = 4;
    e = forward_error(&c, CT_DTYPE_F64, 1, 9, 5);
    cr_assert_lt(e, 1e-10, "dynamic: max error %g", e);
    /* llama3: wavelengths 2 pi * 10^(j) = 6.3 (kept, < 64/8), 63 (smoothed), 628 and 6283
     * (divided, > 64/1) */
    c.max_position_embeddings = 128;
    c.rope_scaling = (ct_rope_scaling){.type = CT_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1,
                                       .high_freq_factor = 8, .original_max_position_embeddings = 64};
    e = forward_error(&c, CT_DTYPE_F64, 2, 6, 6);
    cr_assert_lt(e, 1e-10, "llama3: max error %g", e);
    /* and the frequencies themselves, one band each */
    ct_llama_config r;
    cr_assert_eq(ct_llama_config_resolve(&c, &r), CT_OK, "%s", ct_last_error());
    double f[4], want[4];
    ct_llama_rope_inv_freq(&r, 6, f);
    ref_inv_freq(&r, 6, want);
    cr_assert_float_eq(f[0], 1.0, 1e-15, "high frequency kept");
    cr_assert_float_eq(f[2], 0.01 / 8, 1e-15, "low frequency divided by factor");
    double s = (64 / (2 * M_PI / 0.1) - 1) / 7.0; /* the ramp at wavelength 62.8 */
    cr_assert_float_eq(f[1], (1 - s) * 0.1 / 8 + s * 0.1, 1e-15, "medium frequency smoothed");
    for (int i = 0; i < 4; i++) cr_assert_float_eq(f[i], want[i], 1e-15);
}

/* ---- names ------------------------------------------------------------------------- */

Test(llama, parameter_names_are_huggingface_names)
{
    ct_llama *m = ct_llama_new(&gqa);
    cr_assert_not_null(m, "%s", ct_last_error());
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, true, &l), CT_OK);
    static const char *const per_layer[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                            "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                            "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                            "mlp.down_proj.weight",    "input_layernorm.weight",
                                            "post_attention_layernorm.weight"};
    cr_assert_eq(l.n, 2 * 9 + 3, "embed, 9 per layer, norm, lm_head; no rotary buffers");
    int64_t C = 18, shapes[9][2] = {{24, C}, {8, C}, {8, C}, {C, 24}, {29, C}, {29, C}, {C, 29}, {C, 0}, {C, 0}};
    for (int layer = 0; layer < 2; layer++)
        for (int k = 0; k < 9; k++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.%s", layer, per_layer[k]);
            ct_tensor *t = ct_module_find(&m->base, name);
            cr_assert_not_null(t, "%s", name);
            cr_assert_eq(t->shape[0], shapes[k][0], "%s", name);
            if (shapes[k][1]) cr_assert(t->ndim == 2 && t->shape[1] == shapes[k][1], "%s (out, in)", name);
        }
    cr_assert_not_null(ct_module_find(&m->base, "model.embed_tokens.weight"));
    cr_assert_not_null(ct_module_find(&m->base, "model.norm.weight"));
    ct_tensor *head = ct_module_find(&m->base, "lm_head.weight");
    cr_assert(head && head->shape[0] == 37 && head->shape[1] == 18);
    /* HF init: norms 1, the rest normal(0, 0.02) */
    ct_tensor *nw = ct_module_find(&m->base, "model.norm.weight");
    for (int i = 0; i < 18; i++) cr_assert_eq(((float *)ct_tensor_data(nw))[i], 1.0f);
    ct_tensor *wq = ct_module_find(&m->base, "model.layers.0.self_attn.q_proj.weight");
    double ss = 0;
    for (int i = 0; i < 24 * 18; i++) ss += pow(((float *)ct_tensor_data(wq))[i], 2);
    cr_assert(sqrt(ss / 432) > 0.015 && sqrt(ss / 432) < 0.025, "std %g", sqrt(ss / 432));
    ct_param_list_free(&l);
    ct_module_free(&m->base);

    m = ct_llama_new(&tied);
    cr_assert_null(ct_module_find(&m->base, "lm_head.weight"), "tied: no lm_head");
    cr_assert_null(m->lm_head);
    ct_module_free(&m->base);
}

Test(llama, bad_configs_are_refused_with_the_field)
{
    ct_llama_config c = gqa;
    c.num_key_value_heads = 4;
    cr_assert_null(ct_llama_new(&c));
    cr_assert(strstr(ct_last_error(), "num_key_value_heads 4 must divide num_attention_heads 6"), "%s", ct_last_error());
    c = gqa, c.hidden_size = 20, c.head_dim = 0; /* 20 / 6 heads, no head_dim */
    cr_assert_null(ct_llama_new(&c));
    cr_assert(strstr(ct_last_error(), "must divide hidden_size 20"), "%s", ct_last_error());
    c = gqa, c.attention_bias = true;
    cr_assert_null(ct_llama_new(&c));
    cr_assert(strstr(ct_last_error(), "attention_bias"), "%s", ct_last_error());
    c = gqa, c.head_dim = 5;
    cr_assert_null(ct_llama_new(&c));
    cr_assert(strstr(ct_last_error(), "head_dim 5 must be even"), "%s", ct_last_error());
    c = gqa, c.rope_scaling = (ct_rope_scaling){.type = CT_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 4,
                                                .high_freq_factor = 1, .original_max_position_embeddings = 8};
    cr_assert_null(ct_llama_new(&c));
    cr_assert(strstr(ct_last_error(), "low_freq_factor"), "%s", ct_last_error());
}

/* ---- gradients ---------------------------------------------------------------------- */

typedef struct grad_ctx {
    ct_llama *m;
    ct_tensor *idx;
} grad_ctx;

static ct_tensor *model_logits(ct_tensor *const *inputs, void *ctx)
{
    (void)inputs; /* the model's own parameters, perturbed in place */
    grad_ctx *g = ctx;
    return ct_llama_forward(g->m, g->idx);
}

static void gradcheck_model(const ct_llama_config *c, uint64_t seed)
{
    ct_llama *m = random_model(c, CT_DTYPE_F64, seed);
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    int64_t ids[2 * 4] = {1, 5, 2, 7, 3, 3, 0, 6};
    CT_FRAME {
        grad_ctx g = {m, ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 4), ids)};
        ct_status st = ct_gradcheck(model_logits, l.n, l.tensors, &g,
                                    &(ct_gradcheck_config){.eps = 1e-6, .atol = 1e-6, .rtol = 1e-5});
        cr_assert_eq(st, CT_OK, "%s", ct_last_error());
    }
    ct_param_list_free(&l);
    ct_module_free(&m->base);
}

Test(llama, gradients_match_finite_differences, .timeout = 120)
{
    /* GQA (2 query heads per kv head), untied; then tied with head_dim != hidden / heads */
    gradcheck_model(&(ct_llama_config){.vocab_size = 9, .hidden_size = 8, .intermediate_size = 6,
                                       .num_hidden_layers = 1, .num_attention_heads = 4, .num_key_value_heads = 2,
                                       .max_position_embeddings = 8, .rope_theta = 7},
                    7);
    gradcheck_model(&(ct_llama_config){.vocab_size = 8, .hidden_size = 6, .intermediate_size = 5,
                                       .num_hidden_layers = 2, .num_attention_heads = 2, .head_dim = 4,
                                       .max_position_embeddings = 8, .tie_word_embeddings = true},
                    8);
}

/* ---- cache -------------------------------------------------------------------------- */

static void cached_equals_full(const ct_llama_config *c, int64_t first_chunk)
{
    const int64_t B = 2, T = 8;
    ct_llama *m = random_model(c, CT_DTYPE_F32, 21);
    int64_t *ids = random_ids(B * T, m->cfg.vocab_size, 22);
    bool prev = ct_grad_set_enabled(false);
    ct_kv_cache *cache = ct_kv_cache_new((int)m->cfg.num_hidden_layers, B, m->cfg.num_key_value_heads, T,
                                         m->cfg.head_dim, CT_DTYPE_F32, CT_CPU);
    cr_assert_not_null(cache, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T), ids);
        ct_tensor *full = ct_tensor_contiguous(ct_llama_forward(m, idx));
        cr_assert_not_null(full, "%s", ct_last_error());
        const float *want = ct_tensor_data(full);
        int64_t V = m->cfg.vocab_size, t = 0;
        while (t < T) {
            int64_t n = t == 0 ? first_chunk : 1;
            ct_tensor *step = ct_tensor_contiguous(ct_llama_forward_cached(m, ct_tensor_narrow(idx, 1, t, n), cache));
            cr_assert_not_null(step, "%s", ct_last_error());
            cr_assert_eq(cache->len, t + n);
            const float *got = ct_tensor_data(step);
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < n; i++)
                    for (int64_t v = 0; v < V; v++) {
                        float w = want[(b * T + t + i) * V + v], g = got[(b * n + i) * V + v];
                        cr_assert(fabsf(w - g) <= 1e-5f * (1 + fabsf(w)), "b %lld position %lld vocab %lld: "
                                  "cached %g, full %g", (long long)b, (long long)(t + i), (long long)v, g, w);
                    }
            t += n;
        }
        /* a full cache refuses more, naming it */
        cr_assert_null(ct_llama_forward_cached(m, ct_tensor_narrow(idx, 1, 0, 1), cache));
        cr_assert(strstr(ct_last_error(), "cache full"), "%s", ct_last_error());
    }
    ct_kv_cache_free(cache);
    ct_grad_set_enabled(prev);
    free(ids);
    ct_module_free(&m->base);
}

Test(llama, cached_forward_equals_full_forward)
{
    cached_equals_full(&gqa, 1);  /* token by token */
    cached_equals_full(&gqa, 3);  /* a prompt, then tokens */
    cached_equals_full(&tied, 1);
    ct_llama_config c = gqa;
    c.rope_scaling = (ct_rope_scaling){.type = CT_ROPE_LLAMA3, .factor = 4, .low_freq_factor = 1,
                                       .high_freq_factor = 4, .original_max_position_embeddings = 16};
    cached_equals_full(&c, 2);
}

Test(llama, cache_that_does_not_fit_is_refused)
{
    ct_llama *m = ct_llama_new(&gqa);
    ct_kv_cache *cache = ct_kv_cache_new(2, 1, 3, 8, 4, CT_DTYPE_F32, CT_CPU); /* 3 kv heads, model has 2 */
    CT_FRAME {
        ct_tensor *idx = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(1, 2));
        cr_assert_null(ct_llama_forward_cached(m, idx, cache));
        cr_assert(strstr(ct_last_error(), "does not fit"), "%s", ct_last_error());
        cr_assert_null(ct_llama_forward(m, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2))));
        cr_assert(strstr(ct_last_error(), "integer tokens"), "%s", ct_last_error());
    }
    ct_kv_cache_free(cache);
    ct_module_free(&m->base);
}

/* ---- training and the lm interface ------------------------------------------------- */

Test(llama, loss_backward_reaches_every_parameter)
{
    ct_llama *m = random_model(&gqa, CT_DTYPE_F32, 31);
    int64_t *ids = random_ids(2 * 6, gqa.vocab_size, 32);
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 6), ids);
        ct_tensor *loss = ct_llama_loss(m, idx, idx);
        cr_assert_not_null(loss, "%s", ct_last_error());
        cr_assert(isfinite(ct_tensor_item(loss)));
        cr_assert_eq(ct_backward(loss), CT_OK, "%s", ct_last_error());
    }
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    for (int i = 0; i < l.n; i++) cr_assert_not_null(l.tensors[i]->grad, "%s has no gradient", l.names[i]);
    ct_param_list_free(&l);
    free(ids);
    ct_module_free(&m->base);
}

Test(llama, as_lm_fills_the_interface)
{
    ct_llama_config c = gqa;
    c.token_ids_set = true, c.bos_token_id = 1, c.eos_token_id = 2, c.pad_token_id = -1;
    ct_llama *m = ct_llama_new(&c);
    ct_lm *lm = ct_llama_as_lm(m, true);
    cr_assert_not_null(lm, "%s", ct_last_error());
    cr_assert_str_eq(lm->ops->model_type, "llama");
    cr_assert_eq(lm->module, &m->base);
    cr_assert_eq(lm->vocab_size, 37);
    cr_assert_eq(lm->max_positions, 64);
    cr_assert_eq(lm->n_layer, 2);
    cr_assert_eq(lm->n_kv_head, 2);
    cr_assert_eq(lm->head_dim, 4);
    cr_assert(lm->bos_token_id == 1 && lm->eos_token_id == 2 && lm->pad_token_id == -1);
    CT_FRAME {
        ct_tensor *y = lm->ops->forward(lm, ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(1, 3)), NULL);
        cr_assert(y && y->shape[2] == 37, "%s", ct_last_error());
    }
    /* zero-initialised: no special tokens */
    ct_llama *z = ct_llama_new(&gqa);
    cr_assert(z->cfg.bos_token_id == -1 && z->cfg.eos_token_id == -1 && z->cfg.pad_token_id == -1);
    ct_module_free(&z->base);
    lm->ops->free_model(lm->model);
    free(lm);
}

Test(llama, bf16_autocast_forward_stays_near_f32)
{
    ct_llama *m = random_model(&gqa, CT_DTYPE_F32, 41);
    int64_t *ids = random_ids(2 * 5, gqa.vocab_size, 42);
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 5), ids);
        ct_tensor *ref = ct_tensor_contiguous(ct_llama_forward(m, idx));
        cr_assert_eq(ct_autocast_begin(CT_DTYPE_BF16), CT_OK, "%s", ct_last_error());
        ct_tensor *y = ct_llama_loss(m, idx, idx), *lo = ct_tensor_contiguous(ct_llama_forward(m, idx));
        ct_autocast_end();
        cr_assert(y && lo, "%s", ct_last_error());
        cr_assert_eq(lo->dtype, CT_DTYPE_F32, "the logits come back in f32");
        cr_assert_eq(ct_backward(y), CT_OK, "%s", ct_last_error());
        const float *a = ct_tensor_data(ref), *b = ct_tensor_data(lo);
        double err = 0, mag = 0;
        for (int64_t i = 0; i < ct_tensor_numel(ref); i++) err = fmax(err, fabs(a[i] - b[i])), mag = fmax(mag, fabs(a[i]));
        cr_assert(err > 0 && err < 0.05 * mag, "bf16 error %g of a largest logit %g", err, mag);
    }
    free(ids);
    ct_module_free(&m->base);
}

Test(llama, implausible_sizes_are_refused_before_allocating)
{
    ct_llama_config c = gqa;
    c.vocab_size = (int64_t)1 << 40;
    cr_assert_null(ct_llama_new(&c));
    cr_assert(strstr(ct_last_error(), "above 2^31"), "%s", ct_last_error());
    c = gqa, c.num_attention_heads = (int64_t)1 << 40, c.num_key_value_heads = 1;
    cr_assert_null(ct_llama_new(&c));
    cr_assert(strstr(ct_last_error(), "above 2^31"), "%s", ct_last_error());
}

Test(llama, padding_row_starts_at_zero_and_gets_no_gradient)
{
    /* nn.Embedding(padding_idx = pad_token_id), as LlamaModel builds it */
    ct_llama_config c = gqa;
    c.token_ids_set = true, c.bos_token_id = c.eos_token_id = -1, c.pad_token_id = 3;
    ct_llama *m = ct_llama_new(&c);
    cr_assert_not_null(m, "%s", ct_last_error());
    const float *w = ct_tensor_data(m->embed_tokens->weight);
    for (int j = 0; j < 18; j++) cr_assert_eq(w[3 * 18 + j], 0.0f, "the padding row starts at zero");
    cr_assert_neq(w[4 * 18], 0.0f);
    ct_module_free(&m->base);

    m = random_model(&c, CT_DTYPE_F64, 51); /* the pad row is not zero any more: its values count */
    int64_t ids[2 * 5] = {3, 5, 3, 1, 2, 5, 3, 3, 0, 9};
    double *want = ref_forward(m, ids, 2, 5);
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 5), ids);
        ct_tensor *y = ct_tensor_contiguous(ct_llama_forward(m, idx));
        cr_assert_not_null(y, "%s", ct_last_error());
        const double *got = ct_tensor_data(y);
        for (int i = 0; i < 2 * 5 * 37; i++) cr_assert_float_eq(got[i], want[i], 1e-10, "logit %d", i);
        cr_assert_eq(ct_backward(ct_sum_all(y)), CT_OK, "%s", ct_last_error());
        const double *g = ct_tensor_data(m->embed_tokens->weight->grad);
        double pad = 0, other = 0;
        for (int j = 0; j < 18; j++) pad += fabs(g[3 * 18 + j]), other += fabs(g[5 * 18 + j]);
        cr_assert_eq(pad, 0.0, "the padding row gets no gradient");
        cr_assert_gt(other, 0.0);
    }
    free(want);
    ct_module_free(&m->base);
}
