/* ctrain — what nn/llama.c's forward and nn/llama_tp.c share about a sharded Llama. */
#ifndef CT_NN_LLAMA_INTERNAL_H
#define CT_NN_LLAMA_INTERNAL_H

#include "nn/llama.h"

/* The tensor-parallel state of a sharded model (ct_llama_tensor_parallel). */
struct ct_llama_tp {
    ct_pg *group; /* borrowed */
    int n, r;     /* group size and this rank */
    bool sequence_parallel;
    int64_t vocab_padded;     /* Vp: the embedding's and the head's rows over all ranks */
    int64_t vocab_start;      /* this rank's first row: r * Vp / n (Vp / n rows) */
    /* n > num_key_value_heads: each key/value head on kv_replicas consecutive ranks,
     * which kv_group joins (owned; NULL when kv_replicas is 1) */
    int kv_replicas;
    ct_pg *kv_group;
    int nshards;              /* one record per parameter */
    const ct_tensor **params; /* borrowed from the module tree */
    ct_tp_shard *shards;
};

/* Frees the state (NULL is fine). */
void cti_llama_tp_free(ct_llama_tp *tp);
/* embed_tokens[idx] over the vocabulary-parallel table: (B, T, C), or (B, T/n, C) with
 * sequence parallelism, the same on every rank (new reference, current frame). */
ct_tensor *cti_llama_tp_embed(ct_llama *m, ct_tensor *idx);
/* The input of a column-parallel linear: x itself with f's backward (copy_to), or the
 * sequence all-gathered (B, T/n, C) -> (B, T, C). */
ct_tensor *cti_llama_tp_enter(const ct_llama_tp *tp, ct_tensor *x);
/* The output of a row-parallel linear: the partial sums reduced over the group
 * (reduce_from), or reduce-scattered along the sequence (B, T, C) -> (B, T/n, C). */
ct_tensor *cti_llama_tp_exit(const ct_llama_tp *tp, ct_tensor *y);
/* An error naming op when the sharded model cannot run a forward over T tokens. */
ct_status cti_llama_tp_check(const ct_llama_tp *tp, const char *op, int64_t T, bool cached);

#endif
