#include "nn/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/ops.h"
#include "core/frame.h"
#include "nn/generate.h"
#include "nn/gpt_tp_internal.h"
#include "nn/tp_ops.h"
#include "precision/autocast.h"


/* Adds child (NULL on a failed constructor) and returns it; false on failure. */
static bool adopt(ct_module *parent, const char *name, void *child)
{
    return child && ct_module_add_child(parent, name, (ct_module *)child) == CT_OK;
}

static ct_gpt_attention *attention_new(const ct_gpt_config *c, double proj_std)
{
    ct_gpt_attention *m = ct_module_alloc(sizeof *m, "CausalSelfAttention", NULL);
    if (!m) return NULL;
    m->n_head = c->n_head;
    m->n_embd = c->n_embd;
    bool ok = adopt(&m->base, "c_attn", m->c_attn = ct_linear_layer_new(c->n_embd, 3 * c->n_embd, true, 0.02)) &&
              adopt(&m->base, "c_proj", m->c_proj = ct_linear_layer_new(c->n_embd, c->n_embd, true, proj_std)) &&
              adopt(&m->base, "resid_dropout", m->resid_dropout = ct_dropout_layer_new(c->dropout));
    if (!ok) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

static ct_gpt_mlp *mlp_new(const ct_gpt_config *c, double proj_std)
{
    ct_gpt_mlp *m = ct_module_alloc(sizeof *m, "MLP", NULL);
    if (!m) return NULL;
    bool ok = adopt(&m->base, "c_fc", m->c_fc = ct_linear_layer_new(c->n_embd, 4 * c->n_embd, true, 0.02)) &&
              adopt(&m->base, "c_proj", m->c_proj = ct_linear_layer_new(4 * c->n_embd, c->n_embd, true, proj_std)) &&
              adopt(&m->base, "dropout", m->dropout = ct_dropout_layer_new(c->dropout));
    if (!ok) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

static ct_gpt_block *block_new(const ct_gpt_config *c, double proj_std)
{
    ct_gpt_block *m = ct_module_alloc(sizeof *m, "Block", NULL);
    if (!m) return NULL;
    bool ok = adopt(&m->base, "ln_1", m->ln_1 = ct_layernorm_layer_new(c->n_embd, c->ln_eps, true)) &&
              adopt(&m->base, "attn", m->attn = attention_new(c, proj_std)) &&
              adopt(&m->base, "ln_2", m->ln_2 = ct_layernorm_layer_new(c->n_embd, c->ln_eps, true)) &&
              adopt(&m->base, "mlp", m->mlp = mlp_new(c, proj_std));
    if (!ok) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

static void gpt_destroy(ct_module *m)
{
    free(((ct_gpt *)m)->blocks);
    cti_gpt_tp_free(((ct_gpt *)m)->tp);
}

/* The input of a column-parallel linear of a sharded block: all-gathered along T under
 * sequence parallelism (backward: reduce-scatter), else Megatron's f (backward:
 * allreduce of the partial input gradients). */
static ct_tensor *tp_enter(ct_pg *tp, bool sp, ct_tensor *x)
{
    return sp ? ct_tp_gather_from_sequence(tp, x, 1) : ct_tp_copy_to(tp, x);
}

/* A row-parallel linear of a sharded block: x (B, T, in/n) @ weight (in/n, C) is this
 * rank's partial sum; summed over tp (reduce-scattered along T under sequence
 * parallelism), then the replicated bias added. */
static ct_tensor *tp_row_forward(ct_linear_layer *l, ct_pg *tp, bool sp, ct_tensor *x)
{
    if (!x || ct_module_forward_begin(&l->base)) return NULL;
    ct_tensor *y = ct_linear(x, l->weight, NULL);
    y = sp ? ct_tp_reduce_scatter_to_sequence(tp, y, 1) : ct_tp_reduce_from(tp, y);
    /* under autocast y is 16-bit: the bias joins in y's dtype, as ct_linear's would */
    if (y && l->bias) y = ct_add(y, y->dtype != l->bias->dtype ? ct_cast(l->bias, y->dtype) : l->bias);
    return ct_module_forward_end(&l->base, y);
}

ct_gpt *ct_gpt_new(const ct_gpt_config *cfg)
{
    ct_gpt_config c = cfg ? *cfg : (ct_gpt_config){0};
    if (!c.vocab_size) c.vocab_size = 50257;
    if (!c.block_size) c.block_size = 1024;
    if (!c.n_layer) c.n_layer = 12;
    if (!c.n_head) c.n_head = 12;
    if (!c.n_embd) c.n_embd = 768;
    if (c.ln_eps <= 0) c.ln_eps = 1e-5;
    if (!c.token_ids_set) c.bos_token_id = c.eos_token_id = -1;
    c.token_ids_set = true;
    if (c.bos_token_id < -1 || c.eos_token_id < -1) {
        ct_error_set(CT_ERR_INVALID, "gpt_new: bos_token_id %lld and eos_token_id %lld must be -1 (none) or >= 0",
                     (long long)c.bos_token_id, (long long)c.eos_token_id);
        return NULL;
    }
    if (c.vocab_size < 0 || c.block_size < 0 || c.n_layer < 0 || c.n_head < 0 || c.n_embd < 0 ||
        c.n_embd % c.n_head != 0 || !(c.dropout >= 0 && c.dropout < 1)) {
        ct_error_set(CT_ERR_INVALID,
                     "gpt_new: bad config vocab_size %lld block_size %lld n_layer %lld n_head %lld n_embd %lld "
                     "dropout %g (sizes positive, n_embd divisible by n_head, dropout in [0, 1))",
                     (long long)c.vocab_size, (long long)c.block_size, (long long)c.n_layer, (long long)c.n_head,
                     (long long)c.n_embd, c.dropout);
        return NULL;
    }
    if (!ct_dtype_is_float(c.dtype)) {
        ct_error_set(CT_ERR_INVALID, "gpt_new: parameter dtype %s is not a floating type", ct_dtype_name(c.dtype));
        return NULL;
    }
    ct_gpt *m = ct_module_alloc(sizeof *m, "GPT", gpt_destroy);
    if (!m) return NULL;
    ct_dtype prev_dtype = ct_nn_set_param_dtype(c.dtype);
    m->cfg = c;
    m->blocks = calloc((size_t)c.n_layer, sizeof *m->blocks);
    double proj_std = 0.02 / sqrt(2.0 * (double)c.n_layer);
    bool ok = m->blocks && adopt(&m->base, "wte", m->wte = ct_embedding_layer_new(c.vocab_size, c.n_embd, 0.02)) &&
              adopt(&m->base, "wpe", m->wpe = ct_embedding_layer_new(c.block_size, c.n_embd, 0.02)) &&
              adopt(&m->base, "drop", m->drop = ct_dropout_layer_new(c.dropout));
    if (ok) {
        m->h = ct_module_alloc(sizeof(ct_module), "ModuleList", NULL);
        ok = adopt(&m->base, "h", m->h);
    }
    for (int64_t i = 0; ok && i < c.n_layer; i++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)i);
        ok = adopt(m->h, name, m->blocks[i] = block_new(&c, proj_std));
    }
    ok = ok && adopt(&m->base, "ln_f", m->ln_f = ct_layernorm_layer_new(c.n_embd, c.ln_eps, true));
    ct_nn_set_param_dtype(prev_dtype);
    if (!ok) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

/* x (B, T, C) -> (B, T, C) */
ct_tensor *ct_gpt_attention_forward(ct_gpt_attention *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    if (m->tp) {
        /* this rank's heads: (B, T, 3C/n) -> (B, T, C/n) -> row-parallel c_proj */
        ct_tensor *qkv = ct_linear_layer_forward(m->c_attn, tp_enter(m->tp, m->sequence_parallel, x));
        ct_tensor *y = ct_attention_qkv(qkv, m->n_head / ct_pg_size(m->tp), true, 0.0);
        y = tp_row_forward(m->c_proj, m->tp, m->sequence_parallel, y);
        return ct_module_forward_end(&m->base, ct_dropout_layer_forward(m->resid_dropout, y));
    }
    /* (B, T, 3C) -> causal attention over n_head heads, read and written in place -> (B, T, C) */
    ct_tensor *y = ct_attention_qkv(ct_linear_layer_forward(m->c_attn, x), m->n_head, true, 0.0);
    return ct_module_forward_end(&m->base,
                                 ct_dropout_layer_forward(m->resid_dropout, ct_linear_layer_forward(m->c_proj, y)));
}

ct_tensor *ct_gpt_mlp_forward(ct_gpt_mlp *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    if (m->tp) {
        /* column-parallel c_fc (B, T, 4C/n), GELU on the slice, row-parallel c_proj */
        ct_tensor *h = ct_gelu(ct_linear_layer_forward(m->c_fc, tp_enter(m->tp, m->sequence_parallel, x)));
        h = tp_row_forward(m->c_proj, m->tp, m->sequence_parallel, h);
        return ct_module_forward_end(&m->base, ct_dropout_layer_forward(m->dropout, h));
    }
    ct_tensor *h = ct_gelu(ct_linear_layer_forward(m->c_fc, x));
    return ct_module_forward_end(&m->base, ct_dropout_layer_forward(m->dropout, ct_linear_layer_forward(m->c_proj, h)));
}

ct_tensor *ct_gpt_block_forward(ct_gpt_block *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    x = ct_add(x, ct_gpt_attention_forward(m->attn, ct_layernorm_layer_forward(m->ln_1, x)));
    return ct_module_forward_end(&m->base, ct_add(x, ct_gpt_mlp_forward(m->mlp, ct_layernorm_layer_forward(m->ln_2, x))));
}

/* The embedding of an unsharded model: tokens (B, T) -> wte[idx] + wpe[0 .. T), then
 * the embedding dropout (B, T, C). */
static ct_tensor *embed(ct_gpt *m, ct_tensor *idx)
{
    ct_tensor *pos = ct_tensor_to(ct_tensor_arange(CT_DTYPE_I64, 0, (double)idx->shape[1], 1), idx->device);
    ct_tensor *x = ct_add(ct_embedding_layer_forward(m->wte, idx), ct_embedding_layer_forward(m->wpe, pos));
    return ct_dropout_layer_forward(m->drop, x);
}

/* ln_f and the tied lm head of an unsharded model: x (B, T, C) -> ln_f(x) @ wte^T (C, V)
 * as f32 logits; in bf16 under fp8 unless the recipe puts the embedding's matrix into
 * fp8 too. */
static ct_tensor *head_logits(ct_gpt *m, ct_tensor *x)
{
    x = ct_layernorm_layer_forward(m->ln_f, x);
    if (!x) return NULL;
    ct_fp8_state *fp8 = ct_autocast_enabled() ? ct_autocast_fp8_state() : NULL;
    ct_tensor *logits = fp8 && ct_fp8_state_recipe(fp8)->fp8_embedding_and_head && m->wte->weight->requires_grad
                            ? ct_fp8_linear(fp8, x, m->wte->weight, NULL, true)
                            : ct_matmul_t(x, m->wte->weight, false, true);
    /* under autocast the head computes in 16 bits; the model's output is f32 */
    if (logits && logits->dtype != CT_DTYPE_F32 && ct_dtype_is_float(logits->dtype) && logits->dtype != CT_DTYPE_F64)
        logits = ct_cast(logits, CT_DTYPE_F32);
    return logits;
}

ct_tensor *ct_gpt_forward(ct_gpt *m, ct_tensor *idx)
{
    if (!m || !idx) return NULL;
    if (m->tp) return cti_gpt_tp_forward(m, idx);
    char d[200];
    if (idx->ndim != 2 || idx->shape[1] > m->cfg.block_size || idx->shape[1] < 1 || ct_dtype_is_float(idx->dtype)) {
        ct_error_set(CT_ERR_INVALID, "gpt_forward: idx %s must be integer tokens (B, T) with 1 <= T <= block_size %lld",
                     ct_tensor_describe(idx, d, sizeof d), (long long)m->cfg.block_size);
        return NULL;
    }
    if (ct_module_forward_begin(&m->base)) return NULL;
    ct_tensor *x = embed(m, idx);
    for (int64_t i = 0; i < m->cfg.n_layer; i++) x = ct_gpt_block_forward(m->blocks[i], x);
    ct_tensor *logits = head_logits(m, x);
    if (!logits) ct_error_prefix("gpt_forward: ");
    return ct_module_forward_end(&m->base, logits);
}

ct_tensor *ct_gpt_forward_layers(ct_gpt *m, ct_tensor *x, int first, int count, bool head)
{
    if (!m || !x) return NULL;
    int64_t L = m->cfg.n_layer;
    bool tokens = !ct_dtype_is_float(x->dtype);
    char d[200];
    if (first < 0 || count < 0 || first + count > L || x->ndim != (tokens ? 2 : 3) || (tokens && first != 0)) {
        ct_error_set(CT_ERR_INVALID,
                     "gpt_forward_layers: layers [%d, %d) of %lld with input %s (tokens (B, T) before layer 0, else "
                     "hidden states (B, T, C))",
                     first, first + count, (long long)L, ct_tensor_describe(x, d, sizeof d));
        return NULL;
    }
    if (tokens && m->tp) {
        x = cti_gpt_tp_embed(m, x);
    } else if (tokens) {
        if (x->shape[1] > m->cfg.block_size) {
            ct_error_set(CT_ERR_INVALID, "gpt_forward_layers: %lld tokens exceed block_size %lld",
                         (long long)x->shape[1], (long long)m->cfg.block_size);
            return NULL;
        }
        x = embed(m, x);
    }
    for (int i = first; i < first + count; i++) x = ct_gpt_block_forward(m->blocks[i], x);
    if (head && x && m->tp) {
        x = cti_gpt_tp_head(m, x);
    } else if (head && x) {
        x = head_logits(m, x);
    }
    if (!x) ct_error_prefix("gpt_forward_layers: ");
    return x;
}

ct_tensor *ct_gpt_local_loss(ct_gpt *m, ct_tensor *logits, ct_tensor *targets)
{
    if (!m || !logits || !targets) return NULL;
    ct_tensor *loss = m->tp ? cti_gpt_tp_local_loss(m, logits, targets) : ct_cross_entropy(logits, targets, -1);
    if (!loss) ct_error_prefix("gpt_local_loss: ");
    return loss;
}

ct_tensor *ct_gpt_loss(ct_gpt *m, ct_tensor *idx, ct_tensor *targets)
{
    if (m && m->base.loss_runner.fn) return m->base.loss_runner.fn(&m->base, idx, targets, m->base.loss_runner.data);
    if (m && m->tp) return cti_gpt_tp_loss(m, idx, targets);
    return ct_cross_entropy(ct_gpt_forward(m, idx), targets, -1);
}

/* index of a sample from softmax(logits / temperature) restricted to the top k (ties
 * with the k-th kept): nn/generate.c's sampler; temperature 0 means 1 here. -1 with an
 * error on NaN logits. */
static int64_t sample_row(const float *logits, int64_t V, const ct_generate_config *c, ct_rng *rng, double *probs)
{
    ct_sample_config s = {.temperature = c->temperature > 0 ? c->temperature : 1.0, .top_k = c->top_k, .top_p = 1.0};
    return ct_sample_logits(logits, V, &s, rng, probs);
}

ct_status ct_gpt_generate(ct_gpt *m, const int64_t *prompt, int64_t n, const ct_generate_config *cfg, ct_rng *rng,
                          int64_t *out)
{
    if (!m || !cfg || !out || (n > 0 && !prompt))
        return ct_error_set(CT_ERR_INVALID, "gpt_generate: NULL model, config, prompt or output");
    if (n < 1 || cfg->max_new_tokens < 0 || cfg->temperature < 0)
        return ct_error_set(CT_ERR_INVALID, "gpt_generate: prompt length %lld must be >= 1, max_new_tokens %lld >= 0, "
                            "temperature %g >= 0", (long long)n, (long long)cfg->max_new_tokens, cfg->temperature);
    int64_t V = m->cfg.vocab_size;
    for (int64_t i = 0; i < n; i++) {
        if (prompt[i] < 0 || prompt[i] >= V)
            return ct_error_set(CT_ERR_INVALID, "gpt_generate: prompt token %lld at position %lld is outside the "
                                "vocabulary of %lld", (long long)prompt[i], (long long)i, (long long)V);
        out[i] = prompt[i];
    }
    double *probs = malloc((size_t)V * sizeof *probs);
    if (!probs) return ct_error_set(CT_ERR_NOMEM, "gpt_generate: out of memory");
    if (!rng) rng = ct_rng_default();
    bool was_training = m->base.training;
    ct_module_train(&m->base, false);
    bool prev = ct_grad_set_enabled(false);
    ct_status st = CT_OK;
    const ct_tensor *w0 = ct_module_find(&m->base, "wte.weight");
    const ct_device dev = w0 ? w0->device : CT_CPU;
    for (int64_t k = 0; k < cfg->max_new_tokens && !st; k++) {
        int64_t len = n + k, start = len > m->cfg.block_size ? len - m->cfg.block_size : 0;
        ct_frame_push();
        /* the context goes where the model is; the last row of logits comes back */
        ct_tensor *idx = ct_tensor_to(ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, len - start), out + start), dev);
        ct_tensor *logits = ct_gpt_forward(m, idx);
        ct_tensor *last = logits ? ct_tensor_contiguous(ct_tensor_select(ct_tensor_select(logits, 0, 0), 0, -1))
                                 : NULL;
        if (last && last->dtype != CT_DTYPE_F32) last = ct_tensor_cast(last, CT_DTYPE_F32);
        if (last) last = ct_tensor_to(last, CT_CPU);
        if (!last) st = ct_last_status();
        else if ((out[len] = sample_row(ct_tensor_data(last), V, cfg, rng, probs)) < 0) st = ct_last_status();
        ct_frame_pop();
    }
    ct_grad_set_enabled(prev);
    ct_module_train(&m->base, was_training);
    free(probs);
    return st;
}
