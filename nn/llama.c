/* Llama-family decoder (nn/llama.h): the module tree, the rotary tables and the forward. */
#include "nn/llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "autograd/ops_fp8.h"
#include "nn/llama_internal.h"
#include "nn/tp_ops.h"

/* ---- configuration ------------------------------------------------------------- */

ct_status ct_llama_config_resolve(const ct_llama_config *cfg, ct_llama_config *out)
{
    ct_llama_config c = cfg ? *cfg : (ct_llama_config){0};
    if (!c.vocab_size) c.vocab_size = 32000;
    if (!c.hidden_size) c.hidden_size = 4096;
    if (!c.intermediate_size) c.intermediate_size = 11008;
    if (!c.num_hidden_layers) c.num_hidden_layers = 32;
    if (!c.num_attention_heads) c.num_attention_heads = 32;
    if (!c.num_key_value_heads) c.num_key_value_heads = c.num_attention_heads;
    if (!c.head_dim && c.num_attention_heads > 0) {
        if (c.hidden_size % c.num_attention_heads)
            return ct_error_set(CT_ERR_INVALID, "llama config: num_attention_heads %lld must divide hidden_size %lld "
                                "(or give head_dim)", (long long)c.num_attention_heads, (long long)c.hidden_size);
        c.head_dim = c.hidden_size / c.num_attention_heads;
    }
    if (!c.max_position_embeddings) c.max_position_embeddings = 2048;
    if (c.rms_norm_eps == 0) c.rms_norm_eps = 1e-6;
    if (c.rope_theta == 0) c.rope_theta = 10000;
    if (c.initializer_range == 0) c.initializer_range = 0.02;
    if (!c.token_ids_set) c.bos_token_id = c.eos_token_id = c.pad_token_id = -1;
    c.token_ids_set = true;
#define BAD(...) return ct_error_set(CT_ERR_INVALID, "llama config: " __VA_ARGS__)
    if (c.vocab_size < 1 || c.hidden_size < 1 || c.intermediate_size < 1 || c.num_hidden_layers < 1 ||
        c.num_attention_heads < 1 || c.num_key_value_heads < 1 || c.head_dim < 1 || c.max_position_embeddings < 1)
        BAD("sizes must be positive: vocab_size %lld hidden_size %lld intermediate_size %lld num_hidden_layers %lld "
            "num_attention_heads %lld num_key_value_heads %lld head_dim %lld max_position_embeddings %lld",
            (long long)c.vocab_size, (long long)c.hidden_size, (long long)c.intermediate_size,
            (long long)c.num_hidden_layers, (long long)c.num_attention_heads, (long long)c.num_key_value_heads,
            (long long)c.head_dim, (long long)c.max_position_embeddings);
    /* far above any real model, and low enough that no product of two sizes overflows */
    const int64_t cap = (int64_t)1 << 31;
    bool big = c.num_attention_heads > cap || c.head_dim > cap;
    const int64_t sizes[] = {c.vocab_size, c.hidden_size, c.intermediate_size,
                             big ? 0 : c.num_attention_heads * c.head_dim, c.max_position_embeddings};
    for (int i = 0; i < 5; i++)
        if (big || sizes[i] > cap)
            BAD("sizes above 2^31 are not supported: vocab_size %lld hidden_size %lld intermediate_size %lld "
                "heads x head_dim %lld x %lld max_position_embeddings %lld", (long long)c.vocab_size,
                (long long)c.hidden_size, (long long)c.intermediate_size, (long long)c.num_attention_heads,
                (long long)c.head_dim, (long long)c.max_position_embeddings);
    if (c.num_hidden_layers > 100000) BAD("num_hidden_layers %lld is not plausible", (long long)c.num_hidden_layers);
    if (c.num_attention_heads % c.num_key_value_heads)
        BAD("num_key_value_heads %lld must divide num_attention_heads %lld (each key/value head serves a group of "
            "query heads)", (long long)c.num_key_value_heads, (long long)c.num_attention_heads);
    if (c.head_dim % 2) BAD("head_dim %lld must be even (rotary embeddings rotate pairs)", (long long)c.head_dim);
    if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0) || !(c.initializer_range > 0))
        BAD("rms_norm_eps %g, rope_theta %g and initializer_range %g must be positive", c.rms_norm_eps, c.rope_theta,
            c.initializer_range);
    if (c.attention_bias || c.mlp_bias)
        return ct_error_set(CT_ERR_UNSUPPORTED, "llama config: attention_bias %s, mlp_bias %s: only bias-free "
                            "projections are supported (both false)", c.attention_bias ? "true" : "false",
                            c.mlp_bias ? "true" : "false");
    const ct_rope_scaling *r = &c.rope_scaling;
    if (r->type != CT_ROPE_DEFAULT && r->type != CT_ROPE_LINEAR && r->type != CT_ROPE_DYNAMIC &&
        r->type != CT_ROPE_LLAMA3)
        BAD("rope_scaling type %d is not one of default, linear, dynamic, llama3", (int)r->type);
    if (r->type != CT_ROPE_DEFAULT && !(r->factor > 0))
        BAD("rope_scaling factor %g must be positive", r->factor);
    if (r->type == CT_ROPE_LLAMA3 &&
        (!(r->low_freq_factor > 0) || !(r->high_freq_factor > r->low_freq_factor) ||
         r->original_max_position_embeddings < 1))
        BAD("llama3 rope_scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g) and "
            "original_max_position_embeddings (%lld) >= 1", r->low_freq_factor, r->high_freq_factor,
            (long long)r->original_max_position_embeddings);
    const int64_t ids[3] = {c.bos_token_id, c.eos_token_id, c.pad_token_id};
    for (int i = 0; i < 3; i++)
        if (ids[i] < -1) BAD("token id %lld must be -1 (none) or >= 0", (long long)ids[i]);
    if (!ct_dtype_is_float(c.dtype)) BAD("parameter dtype %s is not a floating type", ct_dtype_name(c.dtype));
#undef BAD
    *out = c;
    return CT_OK;
}

/* ---- rotary embedding ---------------------------------------------------------- */

void ct_llama_rope_inv_freq(const ct_llama_config *c, int64_t seq_len, double *out)
{
    const int64_t D = c->head_dim, half = D / 2;
    const ct_rope_scaling *r = &c->rope_scaling;
    double base = c->rope_theta;
    if (r->type == CT_ROPE_DYNAMIC && seq_len > c->max_position_embeddings)
        base *= pow(r->factor * (double)seq_len / (double)c->max_position_embeddings - (r->factor - 1),
                    (double)D / (double)(D - 2));
    for (int64_t j = 0; j < half; j++) {
        double f = 1.0 / pow(base, (double)(2 * j) / (double)D);
        if (r->type == CT_ROPE_LINEAR) f /= r->factor;
        if (r->type == CT_ROPE_LLAMA3) {
            /* wavelengths longer than the old context / low_freq_factor are divided by factor,
             * shorter than old / high_freq_factor kept, those between interpolated */
            double old = (double)r->original_max_position_embeddings;
            double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
            double wl = 2 * M_PI / f;
            if (wl > low_wl) {
                f /= r->factor;
            } else if (wl >= high_wl) {
                double s = (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                f = (1 - s) * f / r->factor + s * f;
            }
        }
        out[j] = f;
    }
}

/* cos and sin (T, 1, D) for positions start .. start + T - 1, in dt on dev. Angles
 * p * inv_freq are rounded to f32 as HF computes them unless the model is f64. */
static ct_status rope_tables(const ct_llama_config *c, int64_t start, int64_t T, ct_dtype dt, ct_device dev,
                             ct_tensor **cos_out, ct_tensor **sin_out)
{
    const int64_t D = c->head_dim, half = D / 2;
    double *inv = malloc((size_t)half * sizeof *inv);
    ct_tensor *tc = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(T, 1, D));
    ct_tensor *ts = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(T, 1, D));
    if (!inv || !tc || !ts) {
        free(inv);
        return ct_error_set(CT_ERR_NOMEM, "llama_forward: out of memory for rotary tables (%lld x %lld)",
                            (long long)T, (long long)D);
    }
    ct_llama_rope_inv_freq(c, start + T, inv);
    double *pc = ct_tensor_data(tc), *ps = ct_tensor_data(ts);
    bool f64 = dt == CT_DTYPE_F64;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < half; j++) {
            double p = (double)(start + t);
            double a = f64 ? p * inv[j] : (double)((float)inv[j] * (float)p);
            pc[t * D + j] = pc[t * D + j + half] = cos(a);
            ps[t * D + j] = ps[t * D + j + half] = sin(a);
        }
    free(inv);
    *cos_out = ct_tensor_to(ct_tensor_cast(tc, dt), dev);
    *sin_out = ct_tensor_to(ct_tensor_cast(ts, dt), dev);
    return *cos_out && *sin_out ? CT_OK : ct_last_status();
}

/* x (B, T, n, D) -> x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] */
static ct_tensor *rope_apply(ct_tensor *x, ct_tensor *cos, ct_tensor *sin)
{
    if (!x) return NULL;
    int64_t half = x->shape[3] / 2;
    if (cos->dtype != x->dtype) cos = ct_tensor_cast(cos, x->dtype), sin = ct_tensor_cast(sin, x->dtype);
    ct_tensor *rot = ct_concat(2, (ct_tensor *[]){ct_neg(ct_narrow(x, 3, half, half)), ct_narrow(x, 3, 0, half)}, 3);
    return ct_add(ct_mul(x, cos), ct_mul(rot, sin));
}

/* ---- modules ------------------------------------------------------------------- */

static bool adopt(ct_module *parent, const char *name, void *child)
{
    return child && ct_module_add_child(parent, name, (ct_module *)child) == CT_OK;
}

static ct_llama_linear *linear_new(int64_t in, int64_t out, ct_dtype dt, double std)
{
    ct_llama_linear *m = ct_module_alloc(sizeof *m, "Linear", NULL);
    if (!m) return NULL;
    m->in = in, m->out = out;
    CT_FRAME {
        ct_tensor *w = ct_tensor_zeros(dt, CT_SHAPE(out, in));
        if (w && !ct_init_normal_(w, std) && !ct_module_add_param(&m->base, "weight", w)) m->weight = w;
    }
    if (!m->weight) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

/* x (..., in) -> x W^T (..., out), W (out, in); in fp8 by ct_linear's rule unless
 * fp8_ok is false */
static ct_tensor *linear_forward_as(ct_llama_linear *m, ct_tensor *x, bool fp8_ok)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    ct_tensor *w = m->weight, *y;
    ct_fp8_state *fp8 = fp8_ok ? ct_fp8_linear_state(x, w) : NULL;
    if (fp8) {
        y = ct_fp8_linear(fp8, x, w, NULL, true);
    } else {
        int64_t shape[CT_MAX_DIMS];
        for (int d = 0; d < x->ndim - 1; d++) shape[d] = x->shape[d];
        shape[x->ndim - 1] = m->out;
        ct_tensor *x2 = ct_reshape(x, CT_SHAPE(-1, m->in));
        y = ct_reshape(ct_matmul_t(x2, w, false, true), x->ndim, shape);
    }
    return ct_module_forward_end(&m->base, y);
}

static ct_tensor *linear_forward(ct_llama_linear *m, ct_tensor *x) { return linear_forward_as(m, x, true); }

/* The head: x (B, T, C) -> x W^T with W lm_head's weight or, tied, embed_tokens'
 * (under tp this rank's rows: its Vp/n logit columns). Under fp8 it stays bf16 unless
 * the recipe's fp8_embedding_and_head puts it into fp8, as the GPT's head. */
static ct_tensor *head_forward(ct_llama *m, ct_tensor *x)
{
    ct_tensor *w = m->lm_head ? m->lm_head->weight : m->embed_tokens->weight;
    ct_fp8_state *fp8 = ct_fp8_linear_state(x, w);
    bool in_fp8 = fp8 && ct_fp8_state_recipe(fp8)->fp8_embedding_and_head;
    if (m->lm_head) return linear_forward_as(m->lm_head, x, in_fp8);
    return in_fp8 ? ct_fp8_linear(fp8, x, w, NULL, true) : ct_matmul_t(x, w, false, true);
}

/* The last layer's hidden states -> model.norm, then the head: logits (B, T, V) f32
 * (f64 for an f64 model); sharded, this rank's columns (B, T, Vp/n) of the whole
 * sequence (the norm runs on the sequence chunk under sequence parallelism). */
static ct_tensor *logits_of(ct_llama *m, ct_tensor *x)
{
    x = ct_rmsnorm_layer_forward(m->norm, x);
    if (m->tp && x) x = cti_llama_tp_enter(m->tp, x); /* the head is column-parallel over the vocabulary */
    x = x ? head_forward(m, x) : NULL;
    /* under autocast the head computes in 16 bits; the model's output is f32 */
    if (x && x->dtype != CT_DTYPE_F32 && x->dtype != CT_DTYPE_F64) x = ct_cast(x, CT_DTYPE_F32);
    return x;
}

static ct_llama_attention *attention_new(const ct_llama_config *c)
{
    ct_llama_attention *m = ct_module_alloc(sizeof *m, "LlamaAttention", NULL);
    if (!m) return NULL;
    m->n_head = c->num_attention_heads, m->n_kv_head = c->num_key_value_heads, m->head_dim = c->head_dim;
    int64_t C = c->hidden_size, q = m->n_head * m->head_dim, kv = m->n_kv_head * m->head_dim;
    double s = c->initializer_range;
    bool ok = adopt(&m->base, "q_proj", m->q_proj = linear_new(C, q, c->dtype, s)) &&
              adopt(&m->base, "k_proj", m->k_proj = linear_new(C, kv, c->dtype, s)) &&
              adopt(&m->base, "v_proj", m->v_proj = linear_new(C, kv, c->dtype, s)) &&
              adopt(&m->base, "o_proj", m->o_proj = linear_new(q, C, c->dtype, s));
    if (!ok) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

static ct_llama_mlp *mlp_new(const ct_llama_config *c)
{
    ct_llama_mlp *m = ct_module_alloc(sizeof *m, "LlamaMLP", NULL);
    if (!m) return NULL;
    int64_t C = c->hidden_size, I = c->intermediate_size;
    double s = c->initializer_range;
    bool ok = adopt(&m->base, "gate_proj", m->gate_proj = linear_new(C, I, c->dtype, s)) &&
              adopt(&m->base, "up_proj", m->up_proj = linear_new(C, I, c->dtype, s)) &&
              adopt(&m->base, "down_proj", m->down_proj = linear_new(I, C, c->dtype, s));
    if (!ok) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

static ct_llama_layer *layer_new(const ct_llama_config *c)
{
    ct_llama_layer *m = ct_module_alloc(sizeof *m, "LlamaDecoderLayer", NULL);
    if (!m) return NULL;
    bool ok =
        adopt(&m->base, "self_attn", m->self_attn = attention_new(c)) &&
        adopt(&m->base, "mlp", m->mlp = mlp_new(c)) &&
        adopt(&m->base, "input_layernorm", m->input_layernorm = ct_rmsnorm_layer_new(c->hidden_size, c->rms_norm_eps)) &&
        adopt(&m->base, "post_attention_layernorm",
              m->post_attention_layernorm = ct_rmsnorm_layer_new(c->hidden_size, c->rms_norm_eps));
    if (!ok) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

static void llama_destroy(ct_module *m)
{
    free(((ct_llama *)m)->blocks);
    cti_llama_tp_free(((ct_llama *)m)->tp);
}

ct_llama *ct_llama_new(const ct_llama_config *cfg)
{
    ct_llama_config c;
    if (ct_llama_config_resolve(cfg, &c)) {
        ct_error_prefix("llama_new: ");
        return NULL;
    }
    ct_llama *m = ct_module_alloc(sizeof *m, "LlamaForCausalLM", llama_destroy);
    if (!m) return NULL;
    ct_dtype prev = ct_nn_set_param_dtype(c.dtype);
    m->cfg = c;
    m->blocks = calloc((size_t)c.num_hidden_layers, sizeof *m->blocks);
    bool ok = m->blocks && adopt(&m->base, "model", m->model = ct_module_alloc(sizeof(ct_module), "LlamaModel", NULL)) &&
              adopt(m->model, "embed_tokens",
                    m->embed_tokens = ct_embedding_layer_new(c.vocab_size, c.hidden_size, c.initializer_range)) &&
              adopt(m->model, "layers", m->layers = ct_module_alloc(sizeof(ct_module), "ModuleList", NULL));
    for (int64_t i = 0; ok && i < c.num_hidden_layers; i++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)i);
        ok = adopt(m->layers, name, m->blocks[i] = layer_new(&c));
    }
    /* nn.Embedding(padding_idx = pad_token_id): the row starts at zero */
    if (ok && c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size)
        ok = !ct_tensor_fill_(ct_tensor_select(m->embed_tokens->weight, 0, c.pad_token_id), 0.0);
    ok = ok && adopt(m->model, "norm", m->norm = ct_rmsnorm_layer_new(c.hidden_size, c.rms_norm_eps));
    if (ok && !c.tie_word_embeddings)
        ok = adopt(&m->base, "lm_head",
                   m->lm_head = linear_new(c.hidden_size, c.vocab_size, c.dtype, c.initializer_range));
    ct_nn_set_param_dtype(prev);
    if (!ok) {
        ct_error_prefix("llama_new: ");
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

/* ---- forward ------------------------------------------------------------------- */

/* k (B, Hkv, S, D) -> (B, Hkv * rep, S, D), kv head h serving query heads h*rep .. h*rep+rep-1 */
static ct_tensor *repeat_kv(ct_tensor *k, int64_t rep)
{
    if (!k || rep == 1) return k;
    int64_t B = k->shape[0], H = k->shape[1], S = k->shape[2], D = k->shape[3];
    ct_tensor *e = ct_expand(ct_unsqueeze(k, 2), 5, (int64_t[]){B, H, rep, S, D});
    return ct_reshape(e, CT_SHAPE(B, H * rep, S, D));
}

/* x (B, T, C) -> o_proj(attention) (B, T, C). Sharded (tp): H and Hkv are this rank's
 * heads, x enters as the input of the column-parallel q/k/v (under sequence
 * parallelism x is (B, T/n, C) and is all-gathered) and o_proj's partial sums leave
 * through the reduction. */
static ct_tensor *attention_forward(ct_llama_attention *m, ct_tensor *x, ct_tensor *cos, ct_tensor *sin,
                                    ct_kv_cache *cache, int layer, const ct_llama_tp *tp)
{
    if (!x || ct_module_forward_begin(&m->base)) return NULL;
    if (tp && !(x = cti_llama_tp_enter(tp, x))) return ct_module_forward_end(&m->base, NULL);
    int64_t B = x->shape[0], T = x->shape[1], H = m->n_head, Hkv = m->n_kv_head, D = m->head_dim;
    ct_tensor *q = rope_apply(ct_reshape(linear_forward(m->q_proj, x), CT_SHAPE(B, T, H, D)), cos, sin);
    ct_tensor *k = rope_apply(ct_reshape(linear_forward(m->k_proj, x), CT_SHAPE(B, T, Hkv, D)), cos, sin);
    ct_tensor *v = ct_reshape(linear_forward(m->v_proj, x), CT_SHAPE(B, T, Hkv, D));
    q = ct_transpose(q, 1, 2), k = ct_transpose(k, 1, 2), v = ct_transpose(v, 1, 2); /* (B, h, T, D) */
    if (cache && k && v && ct_kv_cache_append(cache, layer, k, v, &k, &v)) k = v = NULL;
    ct_tensor *y = ct_attention(q, repeat_kv(k, H / Hkv), repeat_kv(v, H / Hkv), true, 0.0);
    y = ct_reshape(ct_transpose(y, 1, 2), CT_SHAPE(B, T, H * D));
    y = linear_forward(m->o_proj, y);
    return ct_module_forward_end(&m->base, tp ? cti_llama_tp_exit(tp, y) : y);
}

/* x (B, T, C) -> down(silu(gate(x)) * up(x)); sharded as the attention: gate/up
 * column-parallel, down row-parallel */
static ct_tensor *mlp_forward(ct_llama_mlp *m, ct_tensor *x, const ct_llama_tp *tp)
{
    if (!x || ct_module_forward_begin(&m->base)) return NULL;
    if (tp && !(x = cti_llama_tp_enter(tp, x))) return ct_module_forward_end(&m->base, NULL);
    ct_tensor *h = ct_mul(ct_silu(linear_forward(m->gate_proj, x)), linear_forward(m->up_proj, x));
    h = linear_forward(m->down_proj, h);
    return ct_module_forward_end(&m->base, tp ? cti_llama_tp_exit(tp, h) : h);
}

static ct_tensor *layer_forward(ct_llama_layer *m, ct_tensor *x, ct_tensor *cos, ct_tensor *sin,
                                ct_kv_cache *cache, int layer)
{
    if (!x || ct_module_forward_begin(&m->base)) return NULL;
    ct_tensor *a = attention_forward(m->self_attn, ct_rmsnorm_layer_forward(m->input_layernorm, x), cos, sin,
                                     cache, layer, m->tp);
    x = ct_add(x, a);
    x = ct_add(x, mlp_forward(m->mlp, ct_rmsnorm_layer_forward(m->post_attention_layernorm, x), m->tp));
    return ct_module_forward_end(&m->base, x);
}

/* embed_tokens[idx] (B, T, C). As nn.Embedding(padding_idx = pad_token_id), the padding
 * row gets no gradient: its lookups go through a detached copy,
 *   x = e * keep + detach(e) * (1 - keep),   keep = (idx != pad)   (B, T, 1),
 * the same values with the pad row's gradient cut. */
static ct_tensor *embed(ct_llama *m, ct_tensor *idx)
{
    if (m->tp) return cti_llama_tp_embed(m, idx);
    ct_tensor *w = m->embed_tokens->weight, *e = ct_embedding_layer_forward(m->embed_tokens, idx);
    int64_t pad = m->cfg.pad_token_id, B = idx->shape[0], T = idx->shape[1];
    if (!e || pad < 0 || pad >= m->cfg.vocab_size || !ct_grad_is_enabled() || !w->requires_grad) return e;
    ct_tensor *ids = ct_tensor_cast(ct_tensor_to(idx, CT_CPU), CT_DTYPE_I64);
    ct_tensor *keep = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(B, T, 1));
    if (!ids || !keep) return NULL;
    ids = ct_tensor_contiguous(ids);
    const int64_t *id = ct_tensor_data(ids);
    double *k = ct_tensor_data(keep);
    bool any = false;
    for (int64_t i = 0; i < B * T; i++) any |= !(k[i] = id[i] != pad);
    if (!any) return e;
    keep = ct_tensor_to(ct_tensor_cast(keep, e->dtype), e->device);
    ct_tensor *drop = ct_tensor_to(ct_tensor_cast(ct_rsub_scalar(1.0, keep), e->dtype), e->device);
    return ct_add(ct_mul(e, keep), ct_mul(ct_detach(e), drop));
}

/* logits (B, T, V); local (sharded models only): this rank's columns (B, T, Vp / n) */
static ct_tensor *forward(ct_llama *m, ct_tensor *idx, ct_kv_cache *cache, bool local, const char *op)
{
    if (!m || !idx) return NULL;
    char d[200];
    if (idx->ndim != 2 || idx->shape[1] < 1 || idx->shape[0] < 1 || ct_dtype_is_float(idx->dtype) ||
        idx->dtype == CT_DTYPE_BOOL) {
        ct_error_set(CT_ERR_INVALID, "%s: idx %s must be integer tokens (B, T), B, T >= 1", op,
                     ct_tensor_describe(idx, d, sizeof d));
        return NULL;
    }
    const ct_llama_config *g = &m->cfg;
    if (m->tp && cti_llama_tp_check(m->tp, op, idx->shape[1], cache != NULL)) return NULL;
    if (cache && ct_kv_cache_check(cache, op, (int)g->num_hidden_layers, g->num_key_value_heads, g->head_dim,
                                   idx->shape[0], idx->shape[1]))
        return NULL;
    if (ct_module_forward_begin(&m->base)) return NULL;
    int64_t T = idx->shape[1], start = cache ? cache->len : 0;
    ct_tensor *w = m->embed_tokens->weight, *cos = NULL, *sin = NULL, *logits = NULL;
    if (!rope_tables(&m->cfg, start, T, w->dtype, w->device, &cos, &sin)) {
        ct_tensor *x = embed(m, idx);
        for (int64_t i = 0; i < m->cfg.num_hidden_layers; i++)
            x = layer_forward(m->blocks[i], x, cos, sin, cache, (int)i);
        logits = logits_of(m, x);
        if (logits && m->tp && !local) { /* (B, T, Vp / n) -> (B, T, Vp) -> (B, T, V) */
            logits = ct_tp_gather(m->tp->group, logits, -1);
            if (logits && m->tp->vocab_padded != g->vocab_size) logits = ct_narrow(logits, 2, 0, g->vocab_size);
        }
        if (logits && cache && ct_kv_cache_advance(cache, T)) logits = NULL;
    }
    if (!logits) ct_error_prefix("%s: ", op);
    return ct_module_forward_end(&m->base, logits);
}

ct_tensor *ct_llama_forward(ct_llama *m, ct_tensor *idx) { return forward(m, idx, NULL, false, "llama_forward"); }

ct_tensor *ct_llama_forward_layers(ct_llama *m, ct_tensor *x, int first, int count, bool head)
{
    if (!m || !x) return NULL;
    int64_t L = m->cfg.num_hidden_layers;
    bool tokens = !ct_dtype_is_float(x->dtype);
    if (first < 0 || count < 0 || first + count > L || x->ndim != (tokens ? 2 : 3) || (tokens && first != 0)) {
        char d[200];
        ct_error_set(CT_ERR_INVALID,
                     "llama_forward_layers: layers [%d, %d) of %lld with input %s (tokens (B, T) before layer 0, "
                     "else hidden states (B, T, C))",
                     first, first + count, (long long)L, ct_tensor_describe(x, d, sizeof d));
        return NULL;
    }
    /* the whole sequence's length: under sequence parallelism the hidden states are
     * this rank's chunk of it */
    int64_t T = x->shape[1] * (!tokens && m->tp && m->tp->sequence_parallel ? m->tp->n : 1);
    if (m->tp && cti_llama_tp_check(m->tp, "llama_forward_layers", T, false)) return NULL;
    ct_tensor *w = m->embed_tokens->weight, *cos = NULL, *sin = NULL;
    if (rope_tables(&m->cfg, 0, T, w->dtype, w->device, &cos, &sin)) return NULL;
    if (tokens) x = embed(m, x);
    for (int i = first; i < first + count; i++) x = layer_forward(m->blocks[i], x, cos, sin, NULL, i);
    if (head && x) x = logits_of(m, x);
    if (!x) ct_error_prefix("llama_forward_layers: ");
    return x;
}

ct_tensor *ct_llama_forward_cached(ct_llama *m, ct_tensor *idx, ct_kv_cache *cache)
{
    return forward(m, idx, cache, false, "llama_forward_cached");
}

ct_tensor *ct_llama_local_loss(ct_llama *m, ct_tensor *logits, ct_tensor *targets)
{
    if (!m || !logits || !targets) return NULL;
    ct_tensor *loss = m->tp ? ct_vocab_parallel_cross_entropy(m->tp->group, logits, targets, m->cfg.vocab_size, -1)
                            : ct_cross_entropy(logits, targets, -1);
    if (!loss) ct_error_prefix("llama_local_loss: ");
    return loss;
}

ct_pg *ct_llama_tp_group(const ct_llama *m) { return m && m->tp ? m->tp->group : NULL; }

ct_tensor *ct_llama_loss(ct_llama *m, ct_tensor *idx, ct_tensor *targets)
{
    if (m && m->base.loss_runner.fn) return m->base.loss_runner.fn(&m->base, idx, targets, m->base.loss_runner.data);
    if (!m || !m->tp) return ct_cross_entropy(ct_llama_forward(m, idx), targets, -1);
    /* sharded: the loss from the local logit columns, never the full logits */
    ct_tensor *logits = forward(m, idx, NULL, true, "llama_loss");
    ct_tensor *loss = ct_vocab_parallel_cross_entropy(m->tp->group, logits, targets, m->cfg.vocab_size, -1);
    if (logits && !loss) ct_error_prefix("llama_loss: ");
    return loss;
}

/* ---- nn/lm.h ------------------------------------------------------------------- */

static ct_tensor *lm_forward(ct_lm *lm, ct_tensor *idx, ct_kv_cache *cache)
{
    return forward(lm->model, idx, cache, false, cache ? "llama_forward_cached" : "llama_forward");
}

static ct_status lm_save(ct_lm *lm, const char *dir) { return ct_llama_save_pretrained(lm->model, dir); }

static void lm_free_model(void *model)
{
    if (model) ct_module_free(&((ct_llama *)model)->base);
}

static const ct_lm_ops llama_lm_ops = {
    .model_type = "llama", .forward = lm_forward, .save_pretrained = lm_save, .free_model = lm_free_model};

ct_lm *ct_llama_as_lm(ct_llama *m, bool owns)
{
    if (!m) {
        ct_error_set(CT_ERR_INVALID, "llama_as_lm: model is NULL");
        return NULL;
    }
    ct_lm *lm = calloc(1, sizeof *lm);
    if (!lm) {
        ct_error_set(CT_ERR_NOMEM, "llama_as_lm: out of memory");
        return NULL;
    }
    const ct_llama_config *c = &m->cfg;
    *lm = (ct_lm){.ops = &llama_lm_ops,
                  .model = m,
                  .owns_model = owns,
                  .module = &m->base,
                  .vocab_size = c->vocab_size,
                  .max_positions = c->max_position_embeddings,
                  .n_layer = (int)c->num_hidden_layers,
                  .n_kv_head = c->num_key_value_heads,
                  .head_dim = c->head_dim,
                  .bos_token_id = c->bos_token_id,
                  .eos_token_id = c->eos_token_id,
                  .pad_token_id = c->pad_token_id};
    return lm;
}
