/* ctrain — what nn/gpt.c calls of nn/gpt_tp.c (the GPT's tensor parallelism). */
#ifndef CT_NN_GPT_TP_INTERNAL_H
#define CT_NN_GPT_TP_INTERNAL_H

#include "nn/gpt.h"

/* ct_gpt_forward of a sharded model: the full logits (B, T, V), gathered. */
ct_tensor *cti_gpt_tp_forward(ct_gpt *m, ct_tensor *idx);
/* ct_gpt_loss of a sharded model: the vocabulary-parallel cross-entropy. */
ct_tensor *cti_gpt_tp_loss(ct_gpt *m, ct_tensor *idx, ct_tensor *targets);
/* Frees the shard records; NULL is fine. */
void cti_gpt_tp_free(ct_gpt_tp *t);

#endif
