/* ctrain — GPT (GPT-2 architecture) with HuggingFace GPT-2 parameter names.
 *
 *   idx (B, T) -> x = wte[idx] + wpe[0..T)                     (B, T, C)
 *   for each block h.i:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
 *   attn: qkv = c_attn(x) (B, T, 3C) -> q, k, v (B, H, T, C/H) -> causal
 *         softmax(q k^T / sqrt(C/H)) v -> (B, T, C) -> c_proj
 *   mlp:  c_proj(gelu_tanh(c_fc(x)))       c_fc: C -> 4C, c_proj: 4C -> C
 *   logits = ln_f(x) @ wte^T                                  (B, T, V)
 *
 * The lm head is tied to wte (no separate parameter). Names match HF's
 * GPT2Model: wte.weight, wpe.weight, h.{i}.ln_1.{weight,bias},
 * h.{i}.attn.c_attn.{weight,bias} (stored [in, out] like HF's Conv1D),
 * h.{i}.attn.c_proj.*, h.{i}.ln_2.*, h.{i}.mlp.c_fc.*, h.{i}.mlp.c_proj.*,
 * ln_f.{weight,bias} -- so an HF GPT-2 model.safetensors loads with
 * ct_module_load and what ctrain saves loads in HF.
 *
 * Initialisation as GPT-2: normal(0, 0.02) for weights and embeddings, the
 * residual projections (attn.c_proj, mlp.c_proj) normal(0, 0.02/sqrt(2 n_layer)),
 * biases 0, LayerNorm weights 1.
 */
#ifndef CT_NN_GPT_H
#define CT_NN_GPT_H

#include "core/api.h"
#include "core/philox.h"
#include "dist/pg.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/lm.h"
#include "nn/tp_layers.h"

typedef struct ct_gpt_config {
    int64_t vocab_size; /* default 50257 */
    int64_t block_size; /* default 1024: longest sequence */
    int64_t n_layer;    /* default 12 */
    int64_t n_head;     /* default 12 */
    int64_t n_embd;     /* default 768; divisible by n_head */
    double dropout;     /* default 0 */
    double ln_eps;      /* default 1e-5 */
    ct_dtype dtype;     /* of the parameters; default (0) f32 */
    /* Special tokens written to config.json, -1 = none (written as null). Read only when
     * token_ids_set; a zero-initialised config has none (GPT-2's own are both 50256). */
    bool token_ids_set;
    int64_t bos_token_id, eos_token_id;
} ct_gpt_config;

typedef struct ct_gpt_attention {
    ct_module base;
    int64_t n_head, n_embd;
    ct_linear_layer *c_attn, *c_proj;
    ct_dropout_layer *resid_dropout;
    /* set by ct_gpt_tensor_parallel (NULL: not sharded; borrowed): c_attn holds
     * n_head / tp heads, c_proj the matching rows */
    ct_pg *tp;
    bool sequence_parallel;
} ct_gpt_attention;

typedef struct ct_gpt_mlp {
    ct_module base;
    ct_linear_layer *c_fc, *c_proj;
    ct_dropout_layer *dropout;
    ct_pg *tp; /* as ct_gpt_attention's */
    bool sequence_parallel;
} ct_gpt_mlp;

typedef struct ct_gpt_block {
    ct_module base;
    ct_layernorm_layer *ln_1, *ln_2;
    ct_gpt_attention *attn;
    ct_gpt_mlp *mlp;
} ct_gpt_block;

typedef struct ct_gpt {
    ct_module base;
    ct_gpt_config cfg;
    ct_embedding_layer *wte, *wpe;
    ct_dropout_layer *drop;
    ct_module *h; /* children "0" .. "n_layer-1", each a ct_gpt_block */
    ct_gpt_block **blocks;
    ct_layernorm_layer *ln_f;
    struct ct_gpt_tp *tp; /* NULL unless ct_gpt_tensor_parallel sharded the model */
} ct_gpt;

/* A GPT with fresh GPT-2 initialisation from the process generator
 * (ct_set_seed first for reproducible weights). cfg NULL = GPT-2 124M. */
CT_API ct_gpt *ct_gpt_new(const ct_gpt_config *cfg);
/* idx (B, T) integer tokens, T <= block_size -> logits (B, T, V). */
CT_API ct_tensor *ct_gpt_forward(ct_gpt *m, ct_tensor *idx);
/* idx (B, T) -> logits (B, T, V) for tokens at positions cache->len .. cache->len + T - 1
 * (cache->len + T <= block_size): each block appends its keys and values to the cache
 * (B, n_head, ., n_embd / n_head) and attends over all cached positions; the cache is
 * advanced by T. cache NULL = ct_gpt_forward. The cache is not differentiable: with a
 * cache, grad mode must be off (an error otherwise). New reference, current frame. */
CT_API ct_tensor *ct_gpt_forward_cached(ct_gpt *m, ct_tensor *idx, ct_kv_cache *cache);
/* m as a causal LM (nn/lm.h); owns: ct_lm_free frees m too. NULL on out of memory. */
CT_API ct_lm *ct_gpt_as_lm(ct_gpt *m, bool owns);
/* Mean cross-entropy of the logits against targets (B, T) (ignore_index -1). With a
 * loss runner on the model (nn/module.h: the Accelerator's pipeline parallelism), what
 * the runner returns. */
CT_API ct_tensor *ct_gpt_loss(ct_gpt *m, ct_tensor *idx, ct_tensor *targets);
/* A run of blocks, for a model cut into pipeline stages: x is the tokens (B, T) when
 * first == 0 (embedded: wte + wpe, then the embedding dropout) or the hidden states
 * entering block first; blocks [first, first + count) run; with head, ln_f and the tied
 * head follow and the result is the logits (B, T, V) f32, else the hidden states
 * (B, T, C). Sharded for tensor parallelism: the hidden states are this rank's
 * sequence chunk (B, T/tp, C) under sequence parallelism, and the head gives this
 * rank's vocabulary columns (B, T, Vp/tp) (ct_gpt_local_loss takes them). New
 * reference, current frame; differentiable. */
CT_API ct_tensor *ct_gpt_forward_layers(ct_gpt *m, ct_tensor *x, int first, int count, bool head);
/* The mean cross-entropy (ignore_index -1) of the logits ct_gpt_forward_layers' head
 * gives against targets (B, T): vocabulary-parallel on a sharded model. */
CT_API ct_tensor *ct_gpt_local_loss(ct_gpt *m, ct_tensor *logits, ct_tensor *targets);

/* Loads a GPT-2 checkpoint as HF writes it (path: a model.safetensors, or a model
 * directory, single-file or sharded, see nn/hf_weights.h): GPT2Model's names as they are or under
 * GPT2LMHeadModel's "transformer." prefix; the causal-mask buffers h.{i}.attn.bias and
 * h.{i}.attn.masked_bias of older files are skipped (ctrain computes the mask); an
 * lm_head.weight must equal wte.weight (the head is tied), else nothing is loaded and
 * the error says so. strict and report as ct_module_load. */
CT_API ct_status ct_gpt_load(ct_gpt *m, const char *path, bool strict, ct_load_report *report);
/* Writes dir/model.safetensors (metadata format = pt; sharded with an index above 5 GB,
 * as HF) and dir/config.json (GPT2Config: gelu_new, tied embeddings, this model's sizes,
 * bos/eos_token_id as in the config, null when none or outside the vocabulary), so
 * that transformers.GPT2LMHeadModel.from_pretrained(dir) loads the model. dir must exist. */
CT_API ct_status ct_gpt_save_hf(const ct_gpt *m, const char *dir);
/* The same with weight shards of at most max_shard_bytes (<= 0: 5 GB). */
CT_API ct_status ct_gpt_save_hf_sharded(const ct_gpt *m, const char *dir, int64_t max_shard_bytes);
/* A GPT from a Hugging Face GPT-2 directory: config.json (GPT2Config: vocab_size,
 * n_positions, n_embd, n_layer, n_head, layer_norm_epsilon, activation_function
 * gelu_new, bos/eos_token_id) and its weights, loaded strictly with ct_gpt_load.
 * NULL + an error naming the file and key. */
CT_API ct_gpt *ct_gpt_from_pretrained(const char *dir);
/* Parses GPT2Config's text (label names it in messages) into *out. */
CT_API ct_status ct_gpt_config_from_json(const char *json, const char *label, ct_gpt_config *out);

/* Causal self-attention of one block: x (B, T, C) -> (B, T, C), differentiable (new reference,
 * current frame). */
CT_API ct_tensor *ct_gpt_attention_forward(ct_gpt_attention *m, ct_tensor *x);
/* The block's MLP, c_proj(gelu(c_fc(x))): x (B, T, C) -> (B, T, C) (new reference, current
 * frame). */
CT_API ct_tensor *ct_gpt_mlp_forward(ct_gpt_mlp *m, ct_tensor *x);
/* One pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)) (new reference,
 * current frame). */
CT_API ct_tensor *ct_gpt_block_forward(ct_gpt_block *m, ct_tensor *x);

/* ---- tensor (and sequence) parallelism, Megatron-LM style (nn/gpt_tp.c) ----------
 *
 * ct_gpt_tensor_parallel(m, tp, sp) turns a full model into this rank's shard of it, in
 * place; every rank of tp must call it on the same full weights (e.g. built after the
 * same ct_set_seed, or loaded from the same checkpoint). With n ranks, this one r:
 *
 *   h.i.attn.c_attn   split by heads: rank r keeps the q, k and v columns of heads
 *                     [r H/n, (r+1) H/n), weight (C, 3C/n) = [q_r | k_r | v_r]
 *   h.i.attn.c_proj   row-parallel: weight rows [r C/n, (r+1) C/n); bias replicated
 *   h.i.mlp.c_fc      column-parallel: weight columns [r 4C/n, (r+1) 4C/n) and bias
 *   h.i.mlp.c_proj    row-parallel: weight rows [r 4C/n, (r+1) 4C/n); bias replicated
 *   wte               vocabulary-parallel: rows [r Vp/n, (r+1) Vp/n) of the table
 *                     padded with zero rows to Vp, the next multiple of n; the tied
 *                     head uses the same rows, so the local logits are (B, T, Vp/n)
 *   wpe, ln_1, ln_2, ln_f, the row-parallel biases: replicated
 *
 * The parameters keep their names (h.0.attn.c_attn.weight, ...); ct_gpt_tp_shard_of
 * says which part of the full tensor each holds, so a checkpoint writer can gather a
 * full state dict. Per block the forward runs one allreduce after attn.c_proj and one
 * after mlp.c_proj (their backward: one before c_attn and one before c_fc).
 *
 * Sequence parallelism (sp): the activations between the blocks are (B, T/n, C), this
 * rank's chunk of the sequence (T divisible by n); the layernorms and residual adds run
 * on the chunk; the input of c_attn, c_fc and the head is all-gathered along T (its
 * backward a reduce-scatter), the outputs of the row-parallel linears and of the
 * embedding are reduce-scattered along T instead of allreduced.
 *
 * ct_gpt_forward on a sharded model returns the full logits (B, T, V), gathered over
 * the vocabulary (for evaluation and generation); ct_gpt_loss uses
 * ct_vocab_parallel_cross_entropy on the local logits and never gathers them.
 * ct_gpt_forward_cached refuses a sharded model.
 *
 * Dropout: every dropout of the GPT acts on activations that are replicated over tp
 * (without sequence parallelism) or on the rank's chunk of the sequence (with it). So
 * sharding gives the model's dropout layers one generator of their own
 * (ct_gpt_tp_dropout_rng), seeded from the process generator of tp rank 0 (broadcast):
 * the same stream on every rank without sequence parallelism (the same masks, as one
 * process would draw), a different stream per rank with it. The Accelerator's
 * checkpoints save and restore it (docs/checkpoints.md, "Generators").
 *
 * Not supported: tensors off the CPU (the tp collectives run on the CPU). bf16 and
 * fp8 autocast work; under fp8 the amaxes of each weight's shards must be all-reduced
 * (MAX) over tp before every ct_fp8_state_step, as the Accelerator does, so that every
 * rank quantises with the whole weight's scales (docs/precision.md).
 *
 * A training step:  loss = ct_gpt_loss(...); ct_backward(loss);   (x accumulation)
 *                   ct_gpt_tp_sync_grads(m);            (SP: sums the partial grads)
 *                   ct_gpt_tp_clip_grad_norm(m, max);   (instead of ct_clip_grad_norm)
 *                   ct_optimizer_step(opt);
 * ct_gpt_tp_sync_grads is a no-op without sequence parallelism: a training loop (and the
 * Accelerator, once it drives tensor parallelism) calls it unconditionally there.
 */
typedef struct ct_gpt_tp ct_gpt_tp;

/* What part of the full tensor one parameter of a sharded model holds. */
typedef struct ct_gpt_tp_shard {
    /* shard.dim = -1: replicated. Otherwise indices [start, end) of dim, in each of
     * `parts` equal blocks of shard.full indices that make up the full dim (c_attn:
     * parts 3, the q | k | v blocks, full C; the local tensor is the blocks' slices
     * concatenated); every other sharded parameter has parts 1. Indices at or past
     * full are padding (wte's rows past the vocabulary), dropped by a gather. */
    ct_tp_shard shard;
    int parts;
    /* replicated, but under sequence parallelism each rank's gradient is a partial
     * sum over its chunk of the sequence (wpe, the layernorms, the row-parallel
     * biases): ct_gpt_tp_sync_grads allreduces it */
    bool partial_grad;
} ct_gpt_tp_shard;

/* Shards m in place over tp (borrowed: it must outlive the model and its graphs).
 * Errors, with nothing changed: n_head or 4 n_embd not divisible by tp's size, a model
 * already sharded, parameters off the CPU. With dropout > 0 it draws the dropout
 * stream's seed from rank 0's process generator. */
CT_API ct_status ct_gpt_tensor_parallel(ct_gpt *m, ct_pg *tp, bool sequence_parallel);
/* The dropout layers' generator of a sharded model (a plain value: save and restore its
 * seed and offset with a checkpoint); NULL when m is not sharded. Borrowed. */
CT_API ct_rng *ct_gpt_tp_dropout_rng(ct_gpt *m);
/* The tensor-parallel group of a sharded model (borrowed); NULL when not sharded. */
CT_API ct_pg *ct_gpt_tp_group(const ct_gpt *m);
/* The shard record of the parameter named name (dotted, as ct_module_find), or of the
 * tensor param when name is NULL; borrowed from m. NULL when m is not sharded or has
 * no such parameter. */
CT_API const ct_gpt_tp_shard *ct_gpt_tp_shard_of(const ct_gpt *m, const char *name, const ct_tensor *param);
/* The full tensor of the parameter named name, put back together from the ranks'
 * shards (all-gathered over tp, c_attn's q, k and v blocks reassembled, wte's padding
 * dropped); a copy of it for a replicated one. A collective: every rank of tp calls it
 * with the same name. New reference, current frame; NULL + error. */
CT_API ct_tensor *ct_gpt_tp_gather(ct_gpt *m, const char *name);
/* A new unsharded GPT (the caller owns it) holding the whole model, on every rank: for
 * ct_gpt_save_hf, evaluation in one process, or a check. A collective. NULL + error. */
CT_API ct_gpt *ct_gpt_tp_gather_model(ct_gpt *m);
/* Under sequence parallelism allreduces (sums) over tp the gradients whose record says
 * partial_grad; a no-op without it or on an unsharded model. Every rank must call it
 * after the backward (after the last accumulation step) and before clipping and the
 * optimizer step. */
CT_API ct_status ct_gpt_tp_sync_grads(ct_gpt *m);
/* The 2-norm of the whole (unsharded) model's gradient: the sharded parameters'
 * squared norms summed over tp, the replicated ones counted once (after
 * ct_gpt_tp_sync_grads they are the same on every rank). An unsharded model: the
 * norm of its gradients. NAN + error on failure. A collective: every rank calls it. */
CT_API double ct_gpt_tp_grad_norm(ct_gpt *m);
/* Scales every gradient by ct_clip_coef(ct_gpt_tp_grad_norm(m), max_norm), as
 * ct_clip_grad_norm does for one process; returns the norm before clipping. */
CT_API double ct_gpt_tp_clip_grad_norm(ct_gpt *m, double max_norm);

typedef struct ct_generate_config {
    int64_t max_new_tokens;
    double temperature; /* default 1; must be > 0 */
    int64_t top_k;      /* 0 = no filtering */
} ct_generate_config;

/* Appends max_new_tokens sampled tokens to prompt[0..n) (ids < vocab_size),
 * writing n + max_new_tokens ids into out. Runs in eval mode without grad;
 * the model's training flag is restored. rng NULL = the process generator. */
CT_API ct_status ct_gpt_generate(ct_gpt *m, const int64_t *prompt, int64_t n, const ct_generate_config *cfg, ct_rng *rng,
                                 int64_t *out);

#endif
