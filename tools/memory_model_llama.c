/* The Llama's part of the memory model (tools/memory_model.h): its units and what
 * each op of nn/llama.c's forward allocates (the state and the transients are
 * tools/memory_model.c's, shared with the GPT).
 *
 * Notation as there (N = B*T tokens, P the parameters' dtype, A the autocast dtype of
 * matmuls, |d| the size of d), with C = hidden_size, I = intermediate_size, H query
 * heads and Hkv key/value heads of D = head_dim, q = H*D, kv = Hkv*D, V the vocabulary.
 *
 * Units: one per LlamaDecoderLayer,
 *   C*q + 2*C*kv + q*C + 3*C*I + 2C   (q, k, v, o; gate, up, down; the two RMSNorms)
 * and the root: embed_tokens V*C, the final norm C, lm_head V*C when untied.
 *
 * Not counted: the padding row's gradient mask (nn/llama.c's embed(): two (B, T, 1)
 * masks and three (N, C) tensors, made only when a batch holds pad_token_id; the
 * built-in models have none).
 */
#include "tools/memory_model.h"
#include "tools/memory_model_walk.h"

typedef cti_memory_walk walk;

static int64_t dsize(ct_dtype d) { return cti_dsize(d); }

ct_status cti_memory_llama_layout(const ct_memory_setup *s, cti_memory_layout *out)
{
    ct_llama_config c;
    if (ct_llama_config_resolve(&s->model.llama, &c)) return ct_error_prefix("memory estimate: ");
    if (s->seq > c.max_position_embeddings)
        return ct_error_set(CT_ERR_INVALID, "memory estimate: seq %lld: must be <= max_position_embeddings %lld",
                            (long long)s->seq, (long long)c.max_position_embeddings);
    *out = (cti_memory_layout){.root = ct_model_shape_llama_root_params(&c),
                               .block = ct_model_shape_llama_layer_params(&c), .layers = c.num_hidden_layers,
                               .V = c.vocab_size, .E = c.hidden_size, .tied = c.tie_word_embeddings};
    out->numel = out->root + out->layers * out->block;
    return CT_OK;
}

/* RMSNorm on (N, C) (ct_rmsnorm): rule f32: a 16-bit x cast to f32, and the weight
 * cast to f32 when it is 16-bit (not cached: the rule is not "low"); out f32 (N, C),
 * rstd f32 (N). */
static ct_dtype rmsnorm(walk *w, ct_dtype x)
{
    x = cti_memory_cast_act(w, x, CT_DTYPE_F32, w->N * w->C);
    if (w->autocast && w->P != CT_DTYPE_F32) w->act += w->C * 4;
    w->act += w->N * w->C * 4 + w->N * 4;
    return CT_DTYPE_F32;
}

/* rope on (B, T, n, D) of dtype a, n*D = width: the tables cast to a first when they
 * are in P (two (T, D)); rotate_half: neg of the second half (N, width/2), concat
 * (N, width); x*cos, rot*sin, their sum (N, width each). */
static void rope(walk *w, ct_dtype a, int64_t T, int64_t D, int64_t width)
{
    if (a != w->P) w->act += 2 * T * D * dsize(a);
    w->act += w->N * width / 2 * dsize(a) + 4 * w->N * width * dsize(a);
}

void cti_memory_llama_forward(walk *w, const ct_memory_setup *s)
{
    ct_llama_config c;
    if (ct_llama_config_resolve(&s->model.llama, &c)) return; /* checked by the layout */
    const int64_t N = w->N, C = w->C, T = s->seq, V = c.vocab_size, I = c.intermediate_size;
    const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim, q = H * D, kv = Hkv * D;
    w->act += 2 * N * 8;                                 /* tokens x, y (i64) */
    w->act += 2 * T * D * 8 + 2 * T * D * dsize(w->P);   /* the rotary tables in f64, then in P */
    w->act += N * C * dsize(w->P);                       /* embed_tokens(idx) */
    ct_dtype x = w->P;
    for (int64_t l = 0; l < c.num_hidden_layers; l++) {
        ct_dtype h = rmsnorm(w, x);
        /* q, k, v: each linear casts h to A itself */
        ct_dtype a = cti_memory_linear(w, h, C, q, false);
        rope(w, a, T, D, q);
        a = cti_memory_linear(w, h, C, kv, false);
        rope(w, a, T, D, kv);
        a = cti_memory_linear(w, h, C, kv, false);
        /* repeat_kv: k and v expanded to H heads are copied (B, H, T, D) by the reshape,
         * unless there is one kv head: (B, 1, H, T, D) with a 0 stride is a view */
        if (H != Hkv && Hkv > 1) w->act += 2 * N * q * dsize(a);
        /* attention: out (B, H, T, D), lse f32 (B, H, T); its transpose to (B, T, H*D)
         * is copied by the reshape */
        w->act += N * q * dsize(a) + H * N * 4 + N * q * dsize(a);
        a = cti_memory_linear(w, a, q, C, false);
        x = cti_memory_add(w, x, a);
        h = rmsnorm(w, x);
        /* down(silu(gate(h)) * up(h)) */
        ct_dtype g = cti_memory_linear(w, h, C, I, false);
        w->act += N * I * dsize(g);                      /* silu */
        g = cti_memory_linear(w, h, C, I, false);
        w->act += N * I * dsize(g);                      /* the product */
        a = cti_memory_linear(w, g, I, C, false);
        x = cti_memory_add(w, x, a);
    }
    x = rmsnorm(w, x);
    if (c.tie_word_embeddings) {
        cti_memory_tied_head_loss(w, x, V);              /* x @ embed_tokens^T (ct_matmul_t) */
    } else {
        ct_dtype lg = cti_memory_linear(w, x, C, V, false); /* lm_head, an fp8 linear under fp8 */
        cti_memory_loss(w, lg, V);
    }
}
