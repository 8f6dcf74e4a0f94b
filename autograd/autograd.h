/* ctrain — reverse-mode automatic differentiation (define-by-run).
 *
 * Every differentiable op (autograd/ops.h) runs its kernel and, when grad mode
 * is on and an input requires grad, records a graph node on its output:
 * the backward function, the tensors it saved, and one edge per input (the
 * input's own node, or the input itself when it is a leaf that requires grad).
 *
 * ct_backward(loss) walks the nodes in reverse topological order (among nodes
 * that are ready, the most recently created first), sums the gradients arriving
 * at each node, and accumulates (+=) into the .grad of every leaf that requires
 * grad, so gradients add up across backward calls (gradient accumulation;
 * ct_tensor_zero_grad clears). Each node frees its saved tensors as soon as it
 * has run, unless retain_graph is asked for; a second backward through a freed
 * graph is an error naming the op.
 *
 * Grad-ready hooks: ct_tensor_on_grad_ready(leaf, fn, data) runs fn once per
 * backward, as soon as that leaf's gradient for this backward is final, i.e.
 * after the last edge into the leaf has delivered (a parameter used twice, like
 * a tied embedding, fires once, after both uses). The distributed engine starts
 * reductions from these hooks while backward continues.
 *
 * Higher-order gradients are not supported: backward functions run with grad
 * mode off. In-place changes to a tensor that a node saved are not detected;
 * the ops in autograd/ops.h never modify their inputs.
 */
#ifndef CT_AUTOGRAD_AUTOGRAD_H
#define CT_AUTOGRAD_AUTOGRAD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

/* ---- grad mode ------------------------------------------------------------- */

/* Thread-local; on by default. Returns the previous setting. */
CT_API bool ct_grad_set_enabled(bool enabled);
CT_API bool ct_grad_is_enabled(void);

/* CT_NO_GRAD { ... } runs the block with grad mode off and restores it after.
 * As with CT_FRAME, do not return or break out of the block. */
#define CT_NO_GRAD_CONCAT_(a, b) a##b
#define CT_NO_GRAD_CONCAT(a, b) CT_NO_GRAD_CONCAT_(a, b)
#define CT_NO_GRAD                                                                           \
    for (int CT_NO_GRAD_CONCAT(ct_ng_prev_, __LINE__) = ct_grad_set_enabled(false) ? 2 : 1,   \
             CT_NO_GRAD_CONCAT(ct_ng_once_, __LINE__) = 1;                                    \
         CT_NO_GRAD_CONCAT(ct_ng_once_, __LINE__);                                           \
         CT_NO_GRAD_CONCAT(ct_ng_once_, __LINE__) = 0,                                       \
             ct_grad_set_enabled(CT_NO_GRAD_CONCAT(ct_ng_prev_, __LINE__) == 2))

/* ---- leaves ------------------------------------------------------------------ */

/* Marks a leaf (a tensor no op produced) as requiring grad; only float dtypes.
 * Fails on a tensor that has a grad_fn (it is not a leaf). */
CT_API ct_status ct_tensor_set_requires_grad(ct_tensor *t, bool requires_grad);
/* True when no op produced t (it has no grad_fn). */
CT_API bool ct_tensor_is_leaf(const ct_tensor *t);
/* Releases t->grad (the next backward starts from zero), as PyTorch's
 * zero_grad(set_to_none=True). */
CT_API void ct_tensor_zero_grad(ct_tensor *t);
/* Makes grad t's .grad (a reference is taken; the old .grad is released): backward
 * then adds into it in place, so a gradient can live in a buffer of the caller's
 * choosing (a view of a flat bucket, say). grad must have t's shape, dtype and device
 * and must not require grad itself; t must be a leaf that requires grad. */
CT_API ct_status ct_tensor_set_grad(ct_tensor *t, ct_tensor *grad);
/* The same data without history: a new view that does not require grad.
 * New reference owned by the current frame. */
CT_API ct_tensor *ct_detach(ct_tensor *t);

/* ---- backward ------------------------------------------------------------------ */

typedef struct ct_backward_config {
    bool retain_graph; /* keep saved tensors so backward can run again */
} ct_backward_config;

/* Backward from a one-element tensor (upstream gradient 1). */
CT_API ct_status ct_backward(ct_tensor *loss);
/* Backward from any tensor with an explicit upstream gradient of its shape and
 * dtype (grad may be NULL only for a one-element root). cfg may be NULL. */
CT_API ct_status ct_backward_with(ct_tensor *root, const ct_tensor *grad, const ct_backward_config *cfg);

/* ---- grad-ready hooks ------------------------------------------------------------ */

/* fn(leaf, data) runs once per backward when leaf's gradient is final
 * (leaf->grad holds the accumulated value). Hooks run in the order they were
 * added. A hook returning non-zero aborts the backward with that status. */
typedef ct_status (*ct_grad_ready_fn)(ct_tensor *leaf, void *data);
/* Registers fn(leaf, data) to run when leaf's gradient for the current backward is final. */
CT_API ct_status ct_tensor_on_grad_ready(ct_tensor *leaf, ct_grad_ready_fn fn, void *data);
/* Removes every grad-ready hook registered on leaf. */
CT_API void ct_tensor_clear_grad_hooks(ct_tensor *leaf);
/* The id of the backward running on the calling thread (a hook's own), 0 outside
 * one; every backward gets a new one. A hook that counts the leaves of a group
 * (the sharding engine's units) starts its count afresh on a new id, whatever
 * forward ran before. */
CT_API uint64_t ct_backward_pass(void);

#endif
