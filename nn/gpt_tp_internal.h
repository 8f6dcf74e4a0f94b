/* ctrain — what nn/gpt.c calls of nn/gpt_tp.c (the GPT's tensor parallelism). */
#ifndef CT_NN_GPT_TP_INTERNAL_H
#define CT_NN_GPT_TP_INTERNAL_H

#include "nn/gpt.h"

/* ct_gpt_forward of a sharded model: the full logits (B, T, V), gathered. */
ct_tensor *cti_gpt_tp_forward(ct_gpt *m, ct_tensor *idx);
/* ct_gpt_loss of a sharded model: the vocabulary-parallel cross-entropy. */
ct_tensor *cti_gpt_tp_loss(ct_gpt *m, ct_tensor *idx, ct_tensor *targets);
/* The pieces of a sharded forward, for ct_gpt_forward_layers (errors unprefixed):
 * tokens (B, T) -> the embedded, dropped-out hidden states (under sequence parallelism
 * this rank's chunk (B, T/n, C)); hidden states -> ln_f and the head's local logits
 * (B, T, Vp/n) f32; those logits against targets (B, T) -> the vocabulary-parallel
 * mean cross-entropy. */
ct_tensor *cti_gpt_tp_embed(ct_gpt *m, ct_tensor *idx);
ct_tensor *cti_gpt_tp_head(ct_gpt *m, ct_tensor *x);
ct_tensor *cti_gpt_tp_local_loss(ct_gpt *m, ct_tensor *logits, ct_tensor *targets);
/* Frees the shard records; NULL is fine. */
void cti_gpt_tp_free(ct_gpt_tp *t);

#endif
