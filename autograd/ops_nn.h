/* ctrain — differentiable neural-network ops: softmax, norms, embedding,
 * dropout, cross-entropy, attention.
 *
 * Each op runs the fused kernel of its family (kernels/softmax.h, norm.h,
 * embedding.h, dropout.h, loss.h, attention.h) and, when grad mode is on and a
 * float input requires grad, records a node whose backward calls the matching
 * *_backward kernel. Results are NEW REFERENCES OWNED BY THE CURRENT FRAME, or
 * NULL with an error naming the op ("softmax", "layernorm", ...) and the
 * operands' shapes; a NULL input returns NULL and keeps the earlier error.
 *
 * dtypes: f32, f64, bf16, f16 (bf16/f16 computed in f32 by the kernels).
 * Inputs may be strided views; gradients come back contiguous, with each
 * input's shape and dtype.
 */
#ifndef CT_AUTOGRAD_OPS_NN_H
#define CT_AUTOGRAD_OPS_NN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/philox.h"
#include "core/tensor.h"

/* y = softmax(x) along dim (negative counts from the end); y has x's shape.
 * Saves y: dx = y * (dy - sum_dim(dy * y)). */
CT_API ct_tensor *ct_softmax(ct_tensor *x, int dim);
/* y = x - logsumexp_dim(x). Saves y: dx = dy - exp(y) * sum_dim(dy). */
CT_API ct_tensor *ct_log_softmax(ct_tensor *x, int dim);

/* x (..., C), w (C) or NULL (= 1), b (C) or NULL (= 0), eps >= 0:
 *   y = (x - mean) * rstd * w + b over the last dim.
 * Saves x, w, mean, rstd. Gradients for x, w and b; b's gradient is cast to b's
 * dtype when it differs from the kernel's. */
CT_API ct_tensor *ct_layernorm(ct_tensor *x, ct_tensor *w, ct_tensor *b, double eps);
/* x (..., C), w (C) or NULL: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
 * Saves x, w, rstd. */
CT_API ct_tensor *ct_rmsnorm(ct_tensor *x, ct_tensor *w, double eps);

/* weight (V, C), ids (...) i64 or i32 in [0, V) -> out (..., C). ids get no
 * gradient; weight's gradient is a zeros (V, C) table into which every lookup
 * adds its row (repeated ids sum). Saves ids. */
CT_API ct_tensor *ct_embedding(ct_tensor *weight, ct_tensor *ids);

/* Inverted dropout with probability p in [0, 1] (see kernels/dropout.h for the
 * mask's exact draw from rng; NULL rng = the process generator). When training
 * is false or p == 0 it returns x itself (a new reference to the same tensor,
 * no node, rng untouched). Saves the u8 mask: dx = dy * mask / (1 - p). */
CT_API ct_tensor *ct_dropout(ct_tensor *x, double p, bool training, ct_rng *rng);

/* logits (..., V), targets (...) i64 or i32 -> 0-d mean loss over the rows whose
 * target is not ignore_index (NaN when every row is ignored). targets get no
 * gradient. Saves logits, targets and the row logsumexp:
 *   dlogits[r] = (softmax(logits[r]) - onehot(t_r)) * dloss / count. */
CT_API ct_tensor *ct_cross_entropy(ct_tensor *logits, ct_tensor *targets, int64_t ignore_index);

/* Scaled-dot-product attention: q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv) ->
 * out (B,H,T,Dv); scale <= 0 means 1/sqrt(D); causal: query i sees keys
 * j <= i + S - T. q, k, v may be strided views (e.g. transposed (B,T,H,D)
 * projections). Saves q, k, v, out and the (B,H,T) logsumexp; the backward
 * recomputes the probabilities blockwise (kernels/attention.h). */
CT_API ct_tensor *ct_attention(ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal, double scale);

/* The same on a fused projection, as GPT-2's c_attn produces it: qkv (B,T,3C) holds
 * q, k, v in column blocks [0,C), [C,2C), [2C,3C), each split into n_head heads of
 * D = C/n_head (head h = columns h*D..h*D+D-1 of its block) -> out (B,T,C) with the
 * heads side by side. Equals narrowing qkv, viewing each block as (B,T,H,D),
 * transposing to (B,H,T,D), ct_attention, and merging the heads back, but without
 * the copies: the kernel reads the heads in place, writes the output heads into
 * (B,T,C) and, in backward, dq, dk, dv into one (B,T,3C) gradient. Saves qkv (a
 * contiguous copy when it was strided), out and the (B,H,T) logsumexp. */
CT_API ct_tensor *ct_attention_qkv(ct_tensor *qkv, int64_t n_head, bool causal, double scale);

#endif
