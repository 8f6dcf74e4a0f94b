/* ctrain — tensor-parallel layers (Megatron-LM): column- and row-parallel linears, the
 * vocabulary-parallel embedding and the vocabulary-parallel cross-entropy.
 *
 * Every layer is built from the FULL (unsharded) tensors and a tensor-parallel group
 * g (n ranks, this one r: parallel/mesh.h's tp_group): it keeps a contiguous copy of
 * its slice, so tests and model loaders take a full Hugging Face weight and let the
 * layer cut its part. Every rank must pass the same full tensors. The layers are
 * modules (nn/module.h); their parameters keep the full layer's names ("weight",
 * "bias") and each records which slice of the full tensor it holds (ct_tp_shard), so
 * a checkpoint can put the slices back together. g is borrowed and must outlive the
 * layer and every graph built with it.
 *
 * MLP block (Megatron's f ... g):
 *     X -> column-parallel (f: copy_to, then X W1[:, r-th slice]) -> GELU (local)
 *       -> row-parallel (Z_r W2[r-th slice, :], then g: reduce_from, then + b2) -> Y
 * Each rank holds 1/n of W1's columns and of W2's rows; the forward runs one
 * allreduce (g) and the backward one (f).
 *
 * Sequence parallelism (sequence_parallel set): the input of a column-parallel linear
 * is split along sequence_dim and all-gathered before the matmul (its backward a
 * reduce-scatter), and a row-parallel linear's output is reduce-scattered along
 * sequence_dim instead of allreduced; the norms and dropouts between them then run
 * on 1/n of the sequence. Then the gradients of the parameters used on the sequence
 * chunks (a row-parallel bias, the norms' weights) are partial sums over the tp group:
 * allreduce them over g before the optimizer step (Megatron does the same).
 *
 * Vocabulary padding: the vocabulary V is padded to Vp = ct_tp_vocab_padded(V, n,
 * multiple), the next multiple of n * multiple, so rank r holds rows (embedding) or
 * logit columns (LM head) [r * Vp / n, (r + 1) * Vp / n). The padding rows are
 * zeros, never selected (ids must lie in [0, V)) and the cross-entropy leaves the
 * padding columns out of its softmax, so the results equal the unpadded layers'.
 * A checkpoint drops them (ct_tp_shard.full = V).
 */
#ifndef CT_PARALLEL_TP_LAYERS_H
#define CT_PARALLEL_TP_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "dist/pg.h"
#include "nn/module.h"

/* Which part of a full tensor a parameter holds: indices [start, end) of dim
 * (dim = -1: the whole tensor, replicated on every rank). Indices at or past full
 * (the size of that dim in the unpadded tensor) are padding. replicas > 1: the same
 * slice is held by `replicas` consecutive ranks (rank r holds slice r / replicas;
 * the Llama's key/value heads when tp exceeds their count); 0 or 1: each rank its own. */
typedef struct ct_tp_shard {
    int dim;
    int64_t start, end;
    int64_t full;
    int replicas;
} ct_tp_shard;

/* Zero means default for every field. */
typedef struct ct_tp_linear_config {
    /* weight stored (out, in) as torch's nn.Linear (the Llama's linears); default
     * (in, out) as ct_linear and Hugging Face's GPT-2 Conv1D */
    bool weight_out_in;
    /* column: all-gather the output along its last dim (every rank gets the whole
     * output; backward keeps this rank's columns); default: each rank keeps its slice */
    bool gather_output;
    /* column: pad out up to a multiple of n with zero columns (an LM head over a
     * vocabulary: use ct_tp_vocab_padded's size); default: n must divide out */
    bool pad_output;
    /* row: x is already split along its last dim (the output of a column-parallel
     * linear); default: the layer splits the whole x itself */
    bool input_is_parallel;
    /* see "Sequence parallelism" above; sequence_dim may be negative */
    bool sequence_parallel;
    int sequence_dim;
} ct_tp_linear_config;

/* y = x W + b with W's output columns split: rank r computes y[..., r-th slice]. */
typedef struct ct_column_linear {
    ct_module base;
    ct_pg *group;           /* borrowed */
    int64_t in, out;        /* the full layer's sizes (out unpadded) */
    int64_t out_local;      /* columns on this rank (padded out / n) */
    ct_tensor *weight;      /* (in, out_local), or (out_local, in) with weight_out_in */
    ct_tensor *bias;        /* (out_local) or NULL */
    ct_tp_shard weight_shard, bias_shard;
    ct_tp_linear_config cfg;
} ct_column_linear;

/* y = x W + b with W's input rows split: rank r computes x[..., r-th slice] W[r-th
 * slice, :], the partial sums are reduced over g, then the (replicated) bias added. */
typedef struct ct_row_linear {
    ct_module base;
    ct_pg *group;       /* borrowed */
    int64_t in, out;    /* the full layer's sizes */
    int64_t in_local;   /* in / n */
    ct_tensor *weight;  /* (in_local, out), or (out, in_local) with weight_out_in */
    ct_tensor *bias;    /* (out), the same on every rank, or NULL */
    ct_tp_shard weight_shard, bias_shard; /* bias_shard.dim = -1 */
    ct_tp_linear_config cfg;
} ct_row_linear;

/* The column-parallel linear over g from the full weight ((in, out), or (out, in)
 * with weight_out_in) and bias ((out) or NULL): this rank keeps a copy of its
 * columns; cfg may be NULL. A new module owned by the caller (ct_module_free); NULL
 * with the error set (n not dividing out names both numbers). */
CT_API ct_column_linear *ct_column_linear_new(ct_pg *g, const ct_tensor *weight, const ct_tensor *bias,
                                              const ct_tp_linear_config *cfg);
/* x (..., in) -> (..., out_local), or (..., out) with gather_output (new reference,
 * current frame). With sequence_parallel x is this rank's chunk of the sequence. */
CT_API ct_tensor *ct_column_linear_forward(ct_column_linear *m, ct_tensor *x);

/* The row-parallel linear over g from the full weight and bias; n must divide in. */
CT_API ct_row_linear *ct_row_linear_new(ct_pg *g, const ct_tensor *weight, const ct_tensor *bias,
                                        const ct_tp_linear_config *cfg);
/* x (..., in_local) with input_is_parallel, else (..., in) -> (..., out), the same on
 * every rank (with sequence_parallel: this rank's chunk of the sequence). */
CT_API ct_tensor *ct_row_linear_forward(ct_row_linear *m, ct_tensor *x);

/* The padded vocabulary: the smallest multiple of n * multiple (multiple <= 0: 1) that
 * is >= vocab; -1 with the error set for vocab < 1 or n < 1. */
CT_API int64_t ct_tp_vocab_padded(int64_t vocab, int n, int64_t multiple);

typedef struct ct_vocab_embedding_config {
    int64_t pad_multiple; /* pad the vocabulary to a multiple of n * pad_multiple; default 1 */
    bool sequence_parallel; /* reduce-scatter the output along sequence_dim instead of allreduce */
    int sequence_dim;
} ct_vocab_embedding_config;

/* out = rows of the full table; rank r holds rows [start, end) of the padded table. */
typedef struct ct_vocab_embedding {
    ct_module base;
    ct_pg *group;       /* borrowed */
    int64_t num, dim;   /* the full table (num, dim), unpadded */
    int64_t num_padded; /* ct_tp_vocab_padded(num, n, pad_multiple) */
    int64_t start, end; /* this rank's rows of the padded table */
    ct_tensor *weight;  /* (end - start, dim); rows at or past num are zeros */
    ct_tp_shard weight_shard;
    ct_vocab_embedding_config cfg;
} ct_vocab_embedding;

/* The vocabulary-parallel embedding over g from the full table (num, dim); cfg may be
 * NULL. A new module owned by the caller (ct_module_free); NULL with the error set. */
CT_API ct_vocab_embedding *ct_vocab_embedding_new(ct_pg *g, const ct_tensor *weight,
                                                  const ct_vocab_embedding_config *cfg);
/* ids (...) i32 or i64 in [0, num) -> (..., dim), the same on every rank: each rank
 * looks up the ids in its range (the others give zero rows), then the rows are summed
 * over g (reduce_from; with sequence_parallel reduce-scattered along sequence_dim). */
CT_API ct_tensor *ct_vocab_embedding_forward(ct_vocab_embedding *m, ct_tensor *ids);

/* Cross-entropy over a vocabulary split across g, without gathering the logits.
 * logits (..., Vl): this rank's columns [r * Vl, (r + 1) * Vl) of the (padded)
 * vocabulary; targets (...) i32 or i64, in [0, vocab_size) or ignore_index;
 * vocab_size: the real vocabulary, columns at or past it are padding and left out.
 * Returns the 0-d f32 mean loss over the rows whose target is not ignore_index (NaN
 * when every row is ignored), the same on every rank, as ct_cross_entropy over the
 * full logits. Per row: the global max by an allreduce-max, the sum of exp(x - max)
 * and the target's logit (from the rank that owns it) by one allreduce-sum.
 * Backward, on the local columns only: dlogits = (softmax - onehot) * dloss / count. */
CT_API ct_tensor *ct_vocab_parallel_cross_entropy(ct_pg *g, ct_tensor *logits, ct_tensor *targets,
                                                  int64_t vocab_size, int64_t ignore_index);

/* The shard record of param in a tensor-parallel layer m (one of the three layer
 * types), borrowed; NULL when m is no such layer or param is not one of its
 * parameters. */
CT_API const ct_tp_shard *ct_tp_shard_of(const ct_module *m, const ct_tensor *param);

#endif
