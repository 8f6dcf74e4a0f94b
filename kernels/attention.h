/* ctrain — scaled-dot-product attention kernels (forward and backward).
 *
 * Shapes: q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv) -> out (B,H,T,Dv).
 *   scores = q k^T * scale        (scale <= 0 means 1/sqrt(D))
 *   causal: query i sees keys j <= i + (S - T)  (the usual lower triangle when T == S;
 *           a query row that sees no key gets out = 0 and lse = -inf)
 *   out = softmax(scores) v,   lse (B,H,T) = logsumexp of each score row.
 *
 * The CPU kernel is blockwise (flash-attention style): it never holds a T x S
 * matrix, only 64 x 64 tiles, so memory stays O(T*D) per thread. q, k, v may be
 * any strided views (the GPT hands q, k, v as transposed (B,T,H,D) views).
 *
 * dtypes: f32, f64, bf16 and f16 (bf16/f16 computed in f32, rounded on output).
 * q, k, v (and dout, out in backward) share one dtype. lse is f32, except for
 * f64 inputs where it is f64 so f64 gradchecks are not limited by a rounded lse.
 * Results are deterministic and do not depend on the thread count.
 */
#ifndef CT_KERNELS_ATTENTION_H
#define CT_KERNELS_ATTENTION_H

#include <stdbool.h>

#include "core/api.h"
#include "core/tensor.h"

/* Device function types for the dispatch tables. out (B,H,T,Dv) and lse (B,H,T)
 * are made by the caller, any strides (lse may be NULL: not written); every
 * argument has been checked. */
typedef ct_status (*ct_attention_fn)(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                     bool causal, double scale, ct_tensor *out, ct_tensor *lse);
/* dq, dk, dv: same shapes and dtype as q, k, v, any strides; overwritten. */
typedef ct_status (*ct_attention_backward_fn)(const ct_tensor *dout, const ct_tensor *q,
                                              const ct_tensor *k, const ct_tensor *v,
                                              const ct_tensor *out, const ct_tensor *lse,
                                              bool causal, double scale, ct_tensor *dq,
                                              ct_tensor *dk, ct_tensor *dv);

/* q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv) -> out (B,H,T,Dv), new reference owned by
 * the current frame. When lse is non-NULL, *lse receives the (B,H,T) logsumexp rows
 * (new reference, owned by the current frame) that the backward needs.
 * NULL on error (message names the op and the operands). */
CT_API ct_tensor *ct_kernel_attention(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                      bool causal, double scale, ct_tensor **lse);

/* The same into caller-made tensors of any strides (views into larger buffers, e.g.
 * the heads of a (B,T,H,D) output): out (B,H,T,Dv) of q's dtype, lse (B,H,T) f32 (f64
 * for f64 inputs) or NULL. Non-zero status with a message naming the misfit on error. */
CT_API ct_status ct_kernel_attention_into(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                          bool causal, double scale, ct_tensor *out, ct_tensor *lse);

/* dq, dk, dv (new references owned by the current frame, same shapes and dtype as
 * q, k, v) from dout (B,H,T,Dv), recomputing the probabilities blockwise from
 * q, k and the forward's lse:
 *   P = exp(q k^T * scale - lse);  dV = P^T dO;  dP = dO V^T;
 *   dS = P * (dP - rowsum(dO * O));  dQ = dS K * scale;  dK = dS^T Q * scale.
 * On error returns non-zero, sets nothing. */
CT_API ct_status ct_kernel_attention_backward(const ct_tensor *dout, const ct_tensor *q,
                                              const ct_tensor *k, const ct_tensor *v,
                                              const ct_tensor *out, const ct_tensor *lse, bool causal,
                                              double scale, ct_tensor **dq, ct_tensor **dk,
                                              ct_tensor **dv);

/* The same into caller-made dq, dk, dv (shapes and dtype of q, k, v; any strides, e.g.
 * the three column blocks of one (B,T,3C) gradient); every element is overwritten. */
CT_API ct_status ct_kernel_attention_backward_into(const ct_tensor *dout, const ct_tensor *q,
                                                   const ct_tensor *k, const ct_tensor *v,
                                                   const ct_tensor *out, const ct_tensor *lse,
                                                   bool causal, double scale, ct_tensor *dq,
                                                   ct_tensor *dk, ct_tensor *dv);

#endif
