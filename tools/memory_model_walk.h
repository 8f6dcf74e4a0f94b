/* What the model walks of tools/memory_model.c (GPT) and tools/memory_model_llama.c
 * share: the tally of what a forward allocates under autocast, and its ops.
 * Internal to tools/memory_model*.c. */
#ifndef CT_TOOLS_MEMORY_MODEL_WALK_H
#define CT_TOOLS_MEMORY_MODEL_WALK_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"

typedef struct cti_memory_walk {
    int64_t act;   /* forward outputs: held by the step's frame */
    int64_t wcopy; /* autocast's cached low-precision weight copies (cleared after the step) */
    bool autocast, fp8; /* fp8: linears through ct_fp8_linear, the rest in A = bf16 */
    ct_dtype P, A, wide;
    int64_t N, C;
} cti_memory_walk;

static inline int64_t cti_dsize(ct_dtype d) { return (int64_t)ct_dtype_size(d); }

/* A model's units under the sharding engine and what its head's backward sizes come
 * from: numel = root + layers * block. */
typedef struct cti_memory_layout {
    int64_t numel, root, block, layers; /* the root unit, one decoder block (a unit each) */
    int64_t V, E;                       /* vocabulary, the head's width */
    bool tied;                          /* the head is the token table: its gradient is the
                                         * embedding's too */
} cti_memory_layout;

struct ct_memory_setup;
/* Llama (tools/memory_model_llama.c): checks s's Llama shape and sequence, fills *out;
 * CT_ERR_INVALID naming what is wrong. */
ct_status cti_memory_llama_layout(const struct ct_memory_setup *s, cti_memory_layout *out);
/* nn/llama.c's forward and ct_cross_entropy: what each op allocates. */
void cti_memory_llama_forward(cti_memory_walk *w, const struct ct_memory_setup *s);

/* the dtype an activation of dtype x has after autocast's cast to `to` (a new tensor
 * of numel elements unless it is already in it) */
ct_dtype cti_memory_cast_act(cti_memory_walk *w, ct_dtype x, ct_dtype to, int64_t numel);
/* a parameter of numel elements as an A operand: autocast's weight cache */
void cti_memory_cast_weight(cti_memory_walk *w, int64_t numel);
/* linear (N, in) -> (N, out), with a bias (nn/layers.h) or without (Llama's) */
ct_dtype cti_memory_linear(cti_memory_walk *w, ct_dtype x, int64_t in, int64_t out, bool bias);
/* residual add of two (N, C): rule widest, the narrower input cast first */
ct_dtype cti_memory_add(cti_memory_walk *w, ct_dtype a, ct_dtype b);
/* the head x (N, C) @ table^T (V, C) through ct_matmul_t (a tied head), then the f32
 * logits and ct_cross_entropy */
void cti_memory_tied_head_loss(cti_memory_walk *w, ct_dtype x, int64_t V);
/* the logits (N, V) of dtype lg cast to f32 when they are not, and ct_cross_entropy */
void cti_memory_loss(cti_memory_walk *w, ct_dtype lg, int64_t V);

#endif
