/* ctrain — the differentiable communication ops of tensor (and sequence) parallelism.
 *
 * Megatron-LM's conjugate operators, on the ranks of one tensor-parallel group g
 * (n ranks, this one r). Each op is an autograd op: its forward runs one collective
 * on g and, when an input requires grad, records a node whose backward runs the
 * conjugate collective on g. So every rank of g must run the same ops in the same
 * order, forward and backward, as for any collective (dist/pg.h).
 *
 *   op                               forward                    backward
 *   ct_tp_copy_to (Megatron's f)     identity                   allreduce-sum
 *   ct_tp_reduce_from (g)            allreduce-sum              identity
 *   ct_tp_split                      keep chunk r along dim     all-gather along dim
 *   ct_tp_gather                     all-gather along dim       keep chunk r along dim
 *   ct_tp_scatter_to_sequence        = ct_tp_split              all-gather along dim
 *   ct_tp_gather_from_sequence       all-gather along dim       reduce-scatter (sum) along dim
 *   ct_tp_reduce_scatter_to_sequence reduce-scatter along dim   all-gather along dim
 *
 * Why the pairs. A column-parallel linear gives every rank the same input X and its
 * own slice of the weight, so dL/dX is the sum of the ranks' partial gradients: f
 * (identity, then allreduce of the gradient). A row-parallel linear leaves each rank
 * a partial sum of Y: g sums it, and Y's gradient is already the same on every rank.
 * Sequence parallelism keeps the activations between the blocks split along the
 * sequence; the all-gather before a column-parallel linear has a reduce-scatter as
 * its backward (the ranks' partial input gradients are summed and split), and the
 * reduce-scatter after a row-parallel linear replaces g's allreduce.
 *
 * Chunks along dim: the chunk of rank r is indices [r * S / n, (r + 1) * S / n) of
 * that dim (S its size, which must be a multiple of n); all-gather along dim
 * concatenates the ranks' tensors in rank order (every rank's input must have the
 * same shape). dim may be negative (counted from the end). Megatron keeps the
 * sequence dim first ((T, B, C): dim 0); ctrain's blocks use (B, T, C): dim 1.
 *
 * Tensors: CPU, float (f32, f64, bf16, f16; bf16 and f16 are summed in f32 by the
 * group), any strides (a contiguous copy is made where the group needs one).
 * Results are new tensors (new references owned by the current frame) with the
 * input's dtype. g is borrowed and must outlive the graph (the backward uses it).
 * Errors name the op, the operand's shape and dtype and the rank in g; NULL input
 * gives NULL and keeps the earlier message.
 */
#ifndef CT_PARALLEL_TP_OPS_H
#define CT_PARALLEL_TP_OPS_H

#include "core/api.h"
#include "core/tensor.h"
#include "dist/pg.h"

/* identity forward, allreduce-sum of the gradient backward */
CT_API ct_tensor *ct_tp_copy_to(ct_pg *g, ct_tensor *x);
/* allreduce-sum forward, identity backward */
CT_API ct_tensor *ct_tp_reduce_from(ct_pg *g, ct_tensor *x);
/* x (..., S, ...) -> this rank's chunk (..., S / n, ...) along dim; backward all-gathers */
CT_API ct_tensor *ct_tp_split(ct_pg *g, ct_tensor *x, int dim);
/* x (..., s, ...) -> (..., n * s, ...): the ranks' x concatenated along dim; backward keeps
 * this rank's chunk of the gradient (every rank's gradient of the whole is the same) */
CT_API ct_tensor *ct_tp_gather(ct_pg *g, ct_tensor *x, int dim);
/* The sequence-parallel names: scatter is ct_tp_split (the gradient is all-gathered). */
CT_API ct_tensor *ct_tp_scatter_to_sequence(ct_pg *g, ct_tensor *x, int dim);
/* x (..., s, ...) -> (..., n * s, ...) all-gathered; backward reduce-scatters (sums) the
 * gradient along dim: the ranks' gradients of the whole are partial sums */
CT_API ct_tensor *ct_tp_gather_from_sequence(ct_pg *g, ct_tensor *x, int dim);
/* x (..., S, ...) -> (..., S / n, ...): the sum over ranks of x, chunk r; backward
 * all-gathers the gradient */
CT_API ct_tensor *ct_tp_reduce_scatter_to_sequence(ct_pg *g, ct_tensor *x, int dim);

#endif
