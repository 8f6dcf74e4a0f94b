/* ctrain — graph nodes: the interface for writing a differentiable op.
 *
 * A differentiable op (see autograd/ops_*.c) computes its output with the
 * kernels and then, when ct_autograd_needed() says so, records a node:
 *
 *     ct_tensor *y = ct_kernel_unary(CT_UNARY_TANH, x);
 *     if (y && ct_autograd_needed(1, &x)) {
 *         ct_node *n = ct_node_new("tanh", tanh_backward, 1, &x);
 *         if (!n || ct_node_save(n, y, true) || ct_node_attach(n, y)) return NULL;
 *     }
 *     return y;
 *
 * and its backward function receives the gradient of the output and returns one
 * gradient per input (new references in the current frame, NULL when an input
 * needs none), with the input's shape and dtype:
 *
 *     static ct_status tanh_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx) {
 *         gx[0] = ct_kernel_unary_backward(CT_UNARY_TANH, gy, NULL, ct_node_saved(n, 0));
 *         return gx[0] ? CT_OK : ct_last_status();
 *     }
 *
 * Every node has exactly one output. Ops with several results either return
 * saved side results through the node (layernorm's mean and rstd) or are built
 * from single-output ops (split = several slices).
 */
#ifndef CT_AUTOGRAD_NODE_H
#define CT_AUTOGRAD_NODE_H

#include <stdint.h>

#include "core/api.h"
#include "autograd/autograd.h"

#define CT_NODE_MAX_INPUTS 8
#define CT_NODE_MAX_SAVED 8
#define CT_NODE_CTX_BYTES 128

typedef struct ct_node ct_node;

/* gy: gradient of the node's output (never NULL). gx[i]: set to the gradient
 * for input i, or left NULL when ct_node_input_needs_grad(n, i) is false. */
typedef ct_status (*ct_backward_fn)(ct_node *n, ct_tensor *gy, ct_tensor **gx);

/* True when grad mode is on and one of the inputs requires grad. */
CT_API bool ct_autograd_needed(int n, const ct_tensor *const *inputs);

/* A new node for op with edges to the inputs (NULL entries allowed: no edge).
 * The node is owned by the output it is attached to. */
CT_API ct_node *ct_node_new(const char *op, ct_backward_fn backward, int ninputs, ct_tensor *const *inputs);
/* Saves t for backward (retained by the node). is_output: t is the node's own
 * output; it is saved as a detached alias so the graph holds no cycle. Returns
 * the save index order: saved tensors are read back with ct_node_saved(n, i). */
CT_API ct_status ct_node_save(ct_node *n, ct_tensor *t, bool is_output);
CT_API ct_tensor *ct_node_saved(const ct_node *n, int i);
/* Op-specific parameters (dims, eps, flags), up to CT_NODE_CTX_BYTES. */
CT_API void *ct_node_ctx(ct_node *n);
/* The op name the node was created with ("matmul", ...); borrowed. */
CT_API const char *ct_node_op(const ct_node *n);
/* Number of inputs the node records edges for. */
CT_API int ct_node_ninputs(const ct_node *n);
/* True when input i of the node needs a gradient. */
CT_API bool ct_node_input_needs_grad(const ct_node *n, int i);
/* Shape and dtype of input i as it was when recorded (for sum-to-shape etc.). */
CT_API const ct_tensor *ct_node_input_meta(const ct_node *n, int i);
/* Makes n the grad_fn of out and marks out as requiring grad. On failure the
 * node is released. */
CT_API ct_status ct_node_attach(ct_node *n, ct_tensor *out);
/* Frees a node that was never attached (an op failing half way). */
CT_API void ct_node_discard(ct_node *n);

#endif
