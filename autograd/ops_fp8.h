/* ctrain — the fp8 linear: a product with a weight, both operands quantised.
 *
 * Under an fp8 autocast scope (precision/autocast.h) ct_linear comes here for its
 * parameters; a model calls it directly for other products with a weight (the GPT
 * head with recipe.fp8_embedding_and_head). With w' = w (trans_w false: w is
 * (in, out)) or w^T (trans_w true: w is (out, in)), M the rows of x:
 *
 *   forward   qx = Q_f(x, s_x), qw = Q_f(w, s_w)            (Q: quantise, fp8.h)
 *             y  = (qx @ qw') / (s_x s_w) + b                summed in f32, output in
 *                                                            the scope's dtype (bf16)
 *   backward  qg = Q_b(dy, s_g)
 *             dx = (qg @ qw'^T) / (s_g s_w)                  in x's dtype
 *             dw = (qx^T @ qg) / (s_x s_g)  (trans_w: its transpose)   f32, then w's dtype
 *             db = sum over rows of dy                       f32, then b's dtype
 *
 * Q_f is the recipe's forward format (E4M3), Q_b its backward one (E5M2 under
 * HYBRID). The scales are the delayed ones of the weight's slot in st; the amaxes
 * seen here (x, w once per weight generation, dy) go back to it for the next step.
 * Saved for backward: qx (one byte per element) and qw (shared with the state).
 */
#ifndef CT_AUTOGRAD_OPS_FP8_H
#define CT_AUTOGRAD_OPS_FP8_H

#include <stdbool.h>

#include "core/api.h"
#include "core/tensor.h"
#include "precision/fp8_state.h"

/* x (..., in) f32/bf16/f16; w a 2-D f32/bf16/f16 parameter (16-bit under sharded
 * mixed precision); b (out) f32/bf16/f16 or NULL. New
 * reference in the current frame; NULL with the error set (naming the shapes). */
CT_API ct_tensor *ct_fp8_linear(ct_fp8_state *st, ct_tensor *x, ct_tensor *w, ct_tensor *b, bool trans_w);

/* The state a linear product of x with the weight w runs under in fp8, or NULL when it
 * runs in x's dtype: inside an fp8 autocast scope whose rule for linears is fp8, for a
 * parameter (a leaf that requires grad; f32, or 16-bit under sharded mixed precision)
 * and an f32/bf16/f16 x. ct_linear and the models' own linears ask this one question. */
CT_API ct_fp8_state *ct_fp8_linear_state(const ct_tensor *x, const ct_tensor *w);

#endif
