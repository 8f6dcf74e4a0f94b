/* Per-rank memory of training a GPT (nn/gpt.h) or a Llama (nn/llama.h) with AdamW under one strategy,
 * precision and world size, as ctrain lays it out: what `ctrain estimate-memory`
 * prints (docs/launch.md, "ctrain estimate-memory", has the formulas).
 *
 * Every figure is bytes per rank at the step's peak, for one micro-batch of B rows of
 * T tokens, with the Accelerator's defaults: DDP's 25 MiB buckets (1 MiB first), the
 * sharding engine with one unit per decoder block (transformer_based_wrap: GPT's
 * Block, Llama's LlamaDecoderLayer) plus the root unit (the rest: the embeddings, the
 * final norm, an untied head), reshard_after_forward, and a 16-bit param_dtype under bf16/fp16 for the
 * sharded strategies (autocast over f32 parameters for DDP).
 */
#ifndef CT_TOOLS_MEMORY_MODEL_H
#define CT_TOOLS_MEMORY_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "tools/model_shape.h"

typedef enum ct_memory_strategy {
    CT_MEMORY_DDP,   /* replicated (one rank: no DDP wrapper, no buckets) */
    CT_MEMORY_ZERO1, /* the sharding engine's OPTIMIZER */
    CT_MEMORY_ZERO2, /* GRAD_OP */
    CT_MEMORY_ZERO3  /* FULL */
} ct_memory_strategy;

typedef struct ct_memory_setup {
    ct_model_shape model;        /* the shape (dtype and dropout are ignored: f32, 0) */
    ct_memory_strategy strategy;
    bool offload;                /* CPU offload of the optimizer (sharded strategies only) */
    ct_dtype precision;          /* CT_DTYPE_F32 ("no"), CT_DTYPE_BF16, CT_DTYPE_F16, or
                                  * CT_DTYPE_F8_E4M3 for "fp8" (fp8 linears, bf16 elsewhere) */
    int world;                   /* ranks (the shard group is all of them) */
    int64_t batch, seq;          /* B rows of T tokens per rank and micro-batch */
    int64_t runtime_bytes;       /* the process's fixed footprint, for rss (see below) */
    ct_dtype fp8_widen;          /* fp8 on the CPU: the dtype its GEMM widens both fp8 operands
                                  * to (bf16 where oneDNN multiplies bf16, else f32); 0: bf16 */
} ct_memory_setup;

typedef struct ct_memory_estimate {
    int64_t numel;       /* parameters (Psi) */
    int64_t padded;      /* elements of the flat buffers (sharded; numel for DDP) */
    int units;           /* flat buffers (sharded; 0 for DDP) */
    /* kept between steps, as the engine accounts them (ct_shard_stats.memory) */
    int64_t params;      /* parameter storage (full, or this rank's slices) */
    int64_t grads;       /* gradient storage the step ends with */
    int64_t optimizer;   /* AdamW's moments plus the f32 master slices and their gradients */
    /* transient, at the step's peak */
    int64_t activations; /* what the forward keeps until the step's frame ends */
    int64_t temporaries; /* DDP buckets, gathered units, 16-bit weight copies, the logits'
                          * gradient and the backward's other workspace */
    int64_t total;       /* ctrain's live storage at the step's peak (ct_storage_peak_bytes) */
    int64_t rss;         /* the process's peak resident set: total plus the allocator's
                          * rounding and runtime_bytes */
} ct_memory_estimate;

/* Fills *out for s. CT_ERR_INVALID naming the field for a bad setup (sizes < 1,
 * GPT's n_embd not a multiple of n_head, a Llama config ct_llama_config_resolve
 * refuses, seq beyond the model's positions, offload with DDP, a precision other than
 * f32/bf16/f16/fp8). */
ct_status ct_memory_estimate_compute(const ct_memory_setup *s, ct_memory_estimate *out);

/* "DDP", "ZeRO-1", ... (with "+offload" when offload) into buf. */
const char *ct_memory_strategy_label(ct_memory_strategy st, bool offload, char *buf, int cap);

#endif
