/* Per-rank training memory of a GPT or a Llama under ctrain's strategies
 * (tools/memory_model.h): the state, the transients and the resident set, shared by
 * both; the GPT's forward walk (the Llama's is tools/memory_model_llama.c).
 *
 * Notation: Psi parameters, S ranks, N = B*T tokens, C width, H heads, V vocab, L
 * layers, P the parameters' dtype (f32, or the 16-bit param_dtype of the sharded
 * strategies under bf16/fp16/fp8: bf16 for fp8), A the autocast dtype of matmuls (f32
 * without mixed precision, bf16 under fp8 but for the fp8 linears), |d| the size of d.
 *
 * State kept between steps, as ct_shard_stats_get counts it (units padded to a
 * multiple of S; rank 0's slices, the largest):
 *   DDP     params 4Psi, grads 4Psi, moments 8Psi (grads are freed by zero_grad and
 *           come back each backward: they are in the step's peak, as here)
 *   ZeRO-1  params |P|·padded, grads |P|·padded (the persistent flat gradient
 *           buffers) + |P|·padded/S (the reduced slice; not kept under offload)
 *   ZeRO-2  params |P|·padded, grads |P|·padded/S (none under offload)
 *   ZeRO-3  params |P|·padded/S, grads |P|·padded/S (none under offload)
 *   sharded moments 8 bytes per parameter element of the slices; an f32 master
 *           slice (4·padded/S) under 16-bit P or offload, and its f32 gradient
 *           (another 4·padded/S) under offload
 * The forward's tensors live until the step's frame ends (after the optimizer step),
 * so every candidate peak holds the state and every forward output (gpt_forward()
 * below: what each op of nn/gpt.c allocates under autocast; the Llama's in
 * tools/memory_model_llama.c); the transients decide which of three moments is the
 * peak (ct_memory_estimate_compute).
 */
#include "tools/memory_model.h"
#include "tools/memory_model_walk.h"

#include <stdio.h>
#include <string.h>

const char *ct_memory_strategy_label(ct_memory_strategy st, bool offload, char *buf, int cap)
{
    static const char *const names[] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
    snprintf(buf, (size_t)cap, "%s%s", (unsigned)st <= CT_MEMORY_ZERO3 ? names[st] : "?", offload ? "+offload" : "");
    return buf;
}

typedef cti_memory_walk walk;

static int64_t dsize(ct_dtype d) { return cti_dsize(d); }

/* parameters of one Block, and of the root unit (wte, wpe, ln_f) */
static int64_t block_numel(int64_t E) { return 12 * E * E + 13 * E; }
static int64_t root_numel(const ct_gpt_config *g) { return (g->vocab_size + g->block_size) * g->n_embd + 2 * g->n_embd; }

ct_dtype cti_memory_cast_act(walk *w, ct_dtype x, ct_dtype to, int64_t numel)
{
    if (!w->autocast || x == to) return x;
    w->act += numel * dsize(to);
    return to;
}

void cti_memory_cast_weight(walk *w, int64_t numel)
{
    if (w->autocast && w->P != w->A) w->wcopy += numel * dsize(w->A);
}

/* layernorm on (N, C): rule f32; out f32 (N, C), mean and rstd f32 (N); w, b cast to
 * f32 (not cached: the rule is not "low") */
static ct_dtype layernorm(walk *w, ct_dtype x)
{
    x = cti_memory_cast_act(w, x, CT_DTYPE_F32, w->N * w->C);
    if (w->autocast && w->P != CT_DTYPE_F32) w->act += 2 * w->C * 4;
    w->act += w->N * w->C * 4 + 2 * w->N * 4;
    return CT_DTYPE_F32;
}

/* linear (N, in) -> (N, out): x and w, b in A; out (N, out) in A. Under fp8
 * (autograd/ops_fp8.c): x quantised to fp8 (N, in) bytes, the weight's fp8 copy for
 * this step (in x out bytes, dropped by the fp8 state's step), both widened for the
 * CPU's GEMM (precision/fp8.c: copies in the step's frame), the product in f32, a
 * 16-bit bias widened to f32, and the output cast to A. */
ct_dtype cti_memory_linear(walk *w, ct_dtype x, int64_t in, int64_t out, bool bias)
{
    if (w->fp8) {
        w->act += w->N * in + w->N * out * 4 + w->N * out * dsize(w->A) +
                  (bias && w->P != CT_DTYPE_F32 ? out * 4 : 0) + (w->N * in + in * out) * dsize(w->wide);
        w->wcopy += in * out;
        return w->A;
    }
    x = cti_memory_cast_act(w, x, w->A, w->N * in);
    cti_memory_cast_weight(w, in * out + (bias ? out : 0));
    w->act += w->N * out * dsize(w->autocast ? w->A : x);
    return w->autocast ? w->A : x;
}

ct_dtype cti_memory_add(walk *w, ct_dtype a, ct_dtype b)
{
    ct_dtype wide = dsize(a) >= dsize(b) ? a : b;
    if (a != b && w->autocast) w->act += w->N * w->C * dsize(wide);
    w->act += w->N * w->C * dsize(wide);
    return wide;
}

void cti_memory_loss(walk *w, ct_dtype lg, int64_t V)
{
    if (lg != CT_DTYPE_F32) w->act += w->N * V * 4;
    w->act += w->N * 4 + 4; /* cross_entropy: lse, loss */
}

void cti_memory_tied_head_loss(walk *w, ct_dtype x, int64_t V)
{
    /* x @ table^T in A, then f32 logits */
    x = cti_memory_cast_act(w, x, w->A, w->N * w->C);
    cti_memory_cast_weight(w, V * w->C);
    ct_dtype lg = w->autocast ? w->A : x;
    w->act += w->N * V * dsize(lg);
    cti_memory_loss(w, lg, V);
}

/* nn/gpt.c's forward and ct_cross_entropy: what each op allocates. */
static void gpt_forward(walk *w, const ct_memory_setup *s)
{
    const ct_gpt_config *g = &s->model.gpt;
    const int64_t N = w->N, C = w->C, T = s->seq, V = g->vocab_size, H = g->n_head;
    w->act += 2 * N * 8 + T * 8;                        /* tokens x, y (i64) and the positions */
    w->act += N * C * dsize(w->P) + T * C * dsize(w->P); /* wte(idx), wpe(pos) */
    ct_dtype x = cti_memory_add(w, w->P, w->P);          /* the broadcast add is (N, C) */
    for (int64_t l = 0; l < g->n_layer; l++) {
        ct_dtype h = layernorm(w, x);
        h = cti_memory_linear(w, h, C, 3 * C, true);
        w->act += N * C * dsize(h) + H * N * 4;          /* attention_qkv: out, lse (f32) */
        h = cti_memory_linear(w, h, C, C, true);
        x = cti_memory_add(w, x, h);
        h = layernorm(w, x);
        h = cti_memory_linear(w, h, C, 4 * C, true);
        w->act += N * 4 * C * dsize(h);                  /* gelu */
        h = cti_memory_linear(w, h, 4 * C, C, true);
        x = cti_memory_add(w, x, h);
    }
    cti_memory_tied_head_loss(w, layernorm(w, x), V);
}

/* GPT's units: the root (wte, wpe, ln_f) and one per Block */
static ct_status gpt_layout(const ct_memory_setup *s, cti_memory_layout *out)
{
    const ct_gpt_config *g = &s->model.gpt;
    if (g->vocab_size < 1 || g->block_size < 1 || g->n_layer < 1 || g->n_head < 1 || g->n_embd < 1 ||
        g->n_embd % g->n_head)
        return ct_error_set(CT_ERR_INVALID, "memory estimate: model vocab %lld, block %lld, layers %lld, heads %lld, "
                            "width %lld: sizes must be >= 1 and the width a multiple of the heads",
                            (long long)g->vocab_size, (long long)g->block_size, (long long)g->n_layer,
                            (long long)g->n_head, (long long)g->n_embd);
    if (s->seq > g->block_size)
        return ct_error_set(CT_ERR_INVALID, "memory estimate: seq %lld: must be <= the block size %lld",
                            (long long)s->seq, (long long)g->block_size);
    *out = (cti_memory_layout){.root = root_numel(g), .block = block_numel(g->n_embd), .layers = g->n_layer,
                               .V = g->vocab_size, .E = g->n_embd, .tied = true};
    out->numel = out->root + out->layers * out->block;
    return CT_OK;
}

ct_status ct_memory_estimate_compute(const ct_memory_setup *s, ct_memory_estimate *out)
{
    if (!s || !out) return ct_error_set(CT_ERR_INVALID, "memory estimate: NULL setup or result");
    if (s->world < 1 || s->batch < 1 || s->seq < 1)
        return ct_error_set(CT_ERR_INVALID, "memory estimate: world %d, batch %lld, seq %lld: each must be >= 1",
                            s->world, (long long)s->batch, (long long)s->seq);
    cti_memory_layout m;
    ct_status st = s->model.kind == CT_MODEL_LLAMA ? cti_memory_llama_layout(s, &m) : gpt_layout(s, &m);
    if (st) return st;
    /* every figure must fit in 64 bits: a generous bound on the bytes (per token and
     * layer 64 bytes for each of the block's widths, the logits and their gradients
     * 32 per vocabulary entry, 64 per parameter) stays below 2^62 */
    const double tokens = (double)s->batch * (double)s->seq,
                 bound = tokens * (64.0 * (double)m.layers * ((double)m.block / (double)m.E + (double)m.E) +
                                   32.0 * (double)m.V + 64.0 * (double)m.E) + 64.0 * (double)m.numel;
    if (bound > 4e18)
        return ct_error_set(CT_ERR_INVALID, "memory estimate: batch %lld x seq %lld: far beyond any memory (the "
                            "figures would overflow 64 bits)", (long long)s->batch, (long long)s->seq);
    if (s->precision != CT_DTYPE_F32 && s->precision != CT_DTYPE_BF16 && s->precision != CT_DTYPE_F16 &&
        s->precision != CT_DTYPE_F8_E4M3)
        return ct_error_set(CT_ERR_INVALID, "memory estimate: precision %s; allowed: f32, bf16, f16, f8_e4m3 (fp8)",
                            ct_dtype_name(s->precision));
    if ((unsigned)s->strategy > CT_MEMORY_ZERO3 || (s->offload && s->strategy == CT_MEMORY_DDP))
        return ct_error_set(CT_ERR_INVALID, "memory estimate: strategy %d%s: allowed DDP, ZeRO-1/2/3, offload only "
                            "with ZeRO", (int)s->strategy, s->offload ? " with offload" : "");

    const bool sharded = s->strategy != CT_MEMORY_DDP, low = s->precision != CT_DTYPE_F32;
    const int64_t S = s->world, E = m.E;
    const bool fp8 = s->precision == CT_DTYPE_F8_E4M3;
    /* fp8 keeps 16-bit bf16 parameters where bf16 would (the Accelerator's param_dtype) */
    const ct_dtype L = fp8 ? CT_DTYPE_BF16 : s->precision, P = sharded && low ? L : CT_DTYPE_F32;
    ct_memory_estimate e = {.numel = m.numel};

    /* units: the root and one per decoder block, each padded to a multiple of S; rank 0 owns
     * the first padded/S elements of each, min(shard, numel) of them parameters */
    int64_t shard = 0, owned = 0, biggest = 0;
    const int64_t sizes[2] = {m.root, m.block};
    for (int k = 0; k < 2; k++) {
        const int64_t n = sizes[k], count = k ? m.layers : 1, pad = (n + S - 1) / S * S;
        e.padded += count * (sharded ? pad : n);
        shard += count * pad / S;
        owned += count * (pad / S < n ? pad / S : n);
        if (pad > biggest && k) biggest = pad;
    }
    if (sharded) e.units = 1 + (int)m.layers;

    switch (s->strategy) {
    case CT_MEMORY_DDP:
        e.params = 4 * e.numel, e.grads = 4 * e.numel, e.optimizer = 8 * e.numel;
        break;
    case CT_MEMORY_ZERO1:
        e.params = dsize(P) * e.padded;
        e.grads = dsize(P) * e.padded + (s->offload ? 0 : dsize(P) * shard);
        break;
    case CT_MEMORY_ZERO2:
        e.params = dsize(P) * e.padded;
        e.grads = s->offload ? 0 : dsize(P) * shard;
        break;
    case CT_MEMORY_ZERO3:
        e.params = dsize(P) * shard;
        e.grads = s->offload ? 0 : dsize(P) * shard;
        break;
    }
    if (sharded) e.optimizer = 8 * owned + (low || s->offload ? 4 * shard : 0) + (s->offload ? 4 * shard : 0);

    walk w = {.autocast = low, .fp8 = fp8, .P = P, .A = low ? L : CT_DTYPE_F32, .N = s->batch * s->seq, .C = E,
              .wide = s->fp8_widen ? s->fp8_widen : CT_DTYPE_BF16};
    if (s->model.kind == CT_MODEL_LLAMA) cti_memory_llama_forward(&w, s);
    else gpt_forward(&w, s);
    e.activations = w.act;

    /* Transients. The first moment, `late`, is the end of backward and the step, the
     * larger of its two phases:
     * the end of backward
     * - DDP with S > 1: its buckets, a flat f32 copy of every gradient (4Psi);
     * - ZeRO-1: the reduce-scatter's output beside the persistent buffers, |P|·padded/S;
     * - ZeRO-2/3: gradients not yet reduced: with S = 1 every unit's (the reductions
     *   retire at finish), else the two units whose packed buffers are in flight, the
     *   Block backward is working on and the root's (final only at the embedding's
     *   backward), |P| each; under offload also the reduced slices that wait for
     *   finish (|P|·padded/S);
     * - ZeRO-3 with S > 1: the root unit gathered from its forward to the end of
     *   backward, and two Blocks (the one computing and the one prefetched);
     * the optimizer step
     * - under 16-bit P without offload: the f32 gradient finish widens for each master
     *   slice (4·padded/S); ZeRO-1 also keeps its reduced slice from backward;
     * and at both the 16-bit weight copies of autocast (DDP under bf16/fp16). */
    const int64_t pz = dsize(P), root = m.root, blk = biggest;
    int64_t bwd = 0, step = 0;
    if (!sharded && S > 1) bwd += 4 * e.numel;
    if (s->strategy == CT_MEMORY_ZERO2 || s->strategy == CT_MEMORY_ZERO3) {
        const int64_t all = e.padded, some = root + 3 * blk;
        bwd += pz * (S == 1 || all < some ? all : some);
        if (s->offload && S > 1) bwd += pz * shard;
    }
    if (s->strategy == CT_MEMORY_ZERO3 && S > 1) bwd += pz * (root + 2 * blk);
    if (sharded && low && !s->offload) step += 4 * shard;
    /* with one rank the reductions finish only in finish: backward's packed
     * gradients are still there when the step widens them */
    int64_t tmp = S == 1 ? bwd + step : bwd > step ? bwd : step;
    tmp += w.wcopy + (s->strategy == CT_MEMORY_ZERO1 ? pz * shard : 0);
    const int64_t late = e.params + e.grads + e.optimizer + e.activations + tmp;
    /* The second moment: the head's backward, the first node to run: the
     * logits' gradient (N, V) in f32; under autocast its 16-bit copy for the 16-bit
     * head (the f32 one goes when the cast's backward ends); in f32 the head's dx (N, C)
     * and the head weight's gradient (V, C) with the copy the leaf keeps (ZeRO-1 adds it into its
     * flat buffer instead). DDP's gradients do not exist yet (zero_grad dropped them);
     * its buckets do, and ZeRO-3's root unit, gathered since the forward. */
    const int64_t N = w.N, V = m.V;
    int64_t ws = N * V * 4;
    if (low) ws += N * V * dsize(w.A);
    else ws += N * E * 4 + V * E * 4 * (s->strategy == CT_MEMORY_ZERO1 ? 1 : 2);
    int64_t head = e.params + e.optimizer + e.activations + w.wcopy + (sharded ? e.grads : 0) + ws;
    if (!sharded && S > 1) head += 4 * e.numel;
    if (s->strategy == CT_MEMORY_ZERO3 && S > 1) head += pz * root;
    /* The third, DDP with a tied head only: the token embedding's backward, the last
     * node, makes a dense f32 gradient (V, C) and adds it into the table's (the head's)
     * while every other gradient exists; its end of backward holds nothing else
     * transient. (Untied, that gradient is the table's first: it is in the state. The
     * sharded strategies' root gradients, the table's among them, are already in bwd
     * above: measured, no more.) */
    const int64_t emb = sharded || !m.tied ? 0 : late + V * E * 4;
    e.total = late > head ? late : head;
    if (emb > e.total) e.total = emb;
    /* what the peak holds beyond the state and the activations */
    e.temporaries = e.total - (e.params + e.grads + e.optimizer + e.activations);
    /* The resident set beyond ctrain's live storage (measured, docs/launch.md):
     * - the allocator's cache: blocks of 128 KiB and more are kept for reuse by size:
     *   the head's workspace stays there when the end of backward comes (no later
     *   tensor has its sizes but DDP's dense embedding gradient); with S > 1 the
     *   sharded strategies free the model's own f32 parameter tensors once they
     *   are flattened into the units' buffers (4Psi) and a 16-bit or ZeRO-2/3 step
     *   never asks for those sizes again (16-bit: nothing f32 of a parameter's size;
     *   ZeRO-2/3 f32: backward's gradients reuse about half of them);
     * - with S > 1, the comm thread's buffers outside ctrain's storage: the shared-memory
     *   rings to the next and previous rank (2 x 4 MiB, touched by large messages), its
     *   chunk buffers and malloc arena (12 MiB in all, measured) and,
     *   where a reduction cannot run in its input (ZeRO-1's persistent gradient buffer,
     *   16-bit gradients summed in f32), an f32 work copy of each of the two units in
     *   flight (malloc'd: the C library keeps those pages);
     * - runtime_bytes: code, libraries, thread stacks, OpenBLAS's buffers. */
    int64_t slack = 0, comm = 0;
    if (sharded && S > 1) {
        if (low) slack = 4 * e.numel;
        else if (s->strategy != CT_MEMORY_ZERO1) slack = 2 * e.numel;
    }
    if (S > 1) {
        comm = (int64_t)12 << 20;
        if (sharded && (low || s->strategy == CT_MEMORY_ZERO1)) comm += 2 * 4 * (blk > root ? blk : root);
    }
    const int64_t cached = late + ws - (!sharded && !low ? V * E * 4 : 0);
    const int64_t reserved = cached > e.total ? cached : e.total;
    e.rss = reserved + slack + comm + s->runtime_bytes;
    *out = e;
    return CT_OK;
}
