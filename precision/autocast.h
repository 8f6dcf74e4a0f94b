/* ctrain — autocast: which dtype each kind of op computes in under mixed precision.
 *
 *     CT_AUTOCAST(CT_DTYPE_BF16) {
 *         ct_tensor *loss = ct_gpt_loss(model, x, y);   matmuls in bf16, the rest in f32
 *         ct_backward(loss);                            gradients reach the f32 parameters in f32
 *     }
 *
 * Inside an autocast scope (per thread; scopes nest, the innermost wins) the
 * differentiable ops of autograd/ consult one policy table, printed by
 * ct_autocast_policy_str and changed per op with ct_autocast_set_rule:
 *
 *   op               default rule   what it means
 *   linear           fp8            in an fp8 scope (ct_autocast_begin_fp8), x and the
 *                                   weight are quantised with their delayed scales
 *                                   (precision/fp8_state.h) and the product sums in
 *                                   f32, its output in bf16; elsewhere as "low"
 *   matmul,          low            inputs cast to the scope's dtype (bf16 or f16); the
 *   attention                       product computes there (f32 accumulation) and its
 *                                   output stays in it
 *   softmax,         f32            16-bit inputs cast to f32 first; output f32
 *   log_softmax,
 *   layernorm,
 *   rmsnorm,
 *   cross_entropy,
 *   reductions (sum, mean, var)
 *   elementwise      widest         two inputs of different float dtypes meet in the
 *   (binary)                        wider one (bf16 + f32 -> f32), as torch promotes
 *
 * Every other op runs in its input's dtype. Parameters stay f32: a weight used by a
 * "low" op is cast through a cache (autograd/autocast_cast.c), once per optimizer step
 * rather than once per use, and its gradient comes back in f32; the optimizer and its
 * state never see 16 bits. Outside any scope nothing changes.
 */
#ifndef CT_PRECISION_AUTOCAST_H
#define CT_PRECISION_AUTOCAST_H

#include <stdbool.h>

#include "core/api.h"
#include "core/dtype.h"
#include "core/error.h"
#include "precision/fp8_state.h"

typedef enum ct_autocast_op {
    CT_AC_MATMUL = 0,
    CT_AC_LINEAR,
    CT_AC_ATTENTION,
    CT_AC_SOFTMAX,
    CT_AC_LOG_SOFTMAX,
    CT_AC_LAYERNORM,
    CT_AC_RMSNORM,
    CT_AC_CROSS_ENTROPY,
    CT_AC_REDUCTION, /* sum, mean, var */
    CT_AC_BINARY,    /* add, sub, mul, div, pow, maximum, minimum */
    CT_AC_OP_COUNT
} ct_autocast_op;

typedef enum ct_autocast_rule {
    CT_AC_AS_IS = 0, /* the input's dtype */
    CT_AC_LOW,       /* the scope's dtype */
    CT_AC_F32,       /* f32 */
    CT_AC_WIDEST,    /* the widest float dtype among the inputs */
    CT_AC_FP8,       /* products with a weight in fp8 inside an fp8 scope; "low" elsewhere */
} ct_autocast_rule;

/* Enters a scope computing "low" ops in dt (bf16 or f16; f32: autocast off inside
 * the scope, as torch.autocast(enabled=False)); CT_ERR_INVALID for another dtype,
 * CT_ERR_UNSUPPORTED beyond 16 nested scopes. Every begin needs an end. */
CT_API ct_status ct_autocast_begin(ct_dtype dt);
/* Enters an fp8 scope: "fp8" ops quantise through st's metas, every other "low"
 * op computes in bf16 (the embedding and the head therefore stay in bf16 unless
 * the model follows recipe.fp8_embedding_and_head). st must outlive the scope.
 * A plain scope nested inside turns fp8 off within it. */
CT_API ct_status ct_autocast_begin_fp8(ct_fp8_state *st);
/* Leaves the innermost scope (a no-op outside any). */
CT_API void ct_autocast_end(void);
/* The process's level below every scope: bf16 or f16 makes every thread autocast
 * outside its own scopes; f32 (the start) turns that off. The Accelerator sets it
 * from mixed_precision, so that a training loop needs no scope of its own. */
CT_API ct_status ct_autocast_set_default(ct_dtype dt);
/* The process default as an fp8 scope over st (the default dtype becomes bf16);
 * NULL turns fp8 off, leaving the default dtype. ct_autocast_set_default(f32)
 * turns both off. */
CT_API void ct_autocast_set_default_fp8(ct_fp8_state *st);
/* The fp8 state in force here (innermost scope, else the default), or NULL. */
CT_API ct_fp8_state *ct_autocast_fp8_state(void);
/* Whether autocast is on here (the innermost scope, else the default), and its
 * dtype (f32 when off); the scopes this thread has open. */
CT_API bool ct_autocast_enabled(void);
CT_API ct_dtype ct_autocast_dtype(void);
/* Number of autocast scopes open on this thread. */
CT_API int ct_autocast_depth(void);

/* The scope as a block: CT_AUTOCAST(CT_DTYPE_BF16) { ... } (do not leave it with
 * return or goto: the end would be skipped). A failed begin skips the block. */
#define CT_AUTOCAST_CONCAT2(a, b) a##b
#define CT_AUTOCAST_CONCAT(a, b) CT_AUTOCAST_CONCAT2(a, b)
#define CT_AUTOCAST(dt)                                                                          \
    for (int CT_AUTOCAST_CONCAT(ct_ac_once_, __LINE__) = ct_autocast_begin(dt) == CT_OK;        \
         CT_AUTOCAST_CONCAT(ct_ac_once_, __LINE__);                                             \
         CT_AUTOCAST_CONCAT(ct_ac_once_, __LINE__) = 0, ct_autocast_end())

/* The policy (process-wide; every thread sees a change at its next op). */
CT_API ct_autocast_rule ct_autocast_rule_of(ct_autocast_op op);
/* CT_ERR_INVALID for an op or rule out of range. */
CT_API ct_status ct_autocast_set_rule(ct_autocast_op op, ct_autocast_rule rule);
/* Puts back every default rule. */
CT_API void ct_autocast_reset_rules(void);
/* "matmul", "linear", ...; "low", "f32", "widest", "as_is". Static strings. */
CT_API const char *ct_autocast_op_name(ct_autocast_op op);
CT_API const char *ct_autocast_rule_name(ct_autocast_rule rule);
/* The table, one "op: rule" line per op, into buf (cap bytes); returns buf. */
CT_API const char *ct_autocast_policy_str(char *buf, int cap);

/* The dtype op computes in for an input of dtype in, here and now: in itself
 * outside a scope or for a non-float in; else by the op's rule (WIDEST: in, the
 * caller compares the inputs). */
CT_API ct_dtype ct_autocast_compute_dtype(ct_autocast_op op, ct_dtype in);

/* The weight-cast generation: bumped when parameters change, so cached low-precision
 * copies of weights are made again. The optimizer step, loading a module's tensors and
 * DDP's broadcast call it; code that writes parameters in place otherwise must too. */
CT_API void ct_autocast_weights_changed(void);

#endif
