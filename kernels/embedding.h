/* ctrain — embedding lookup (a row gather) and its backward (a scatter-add).
 *
 * weight (V, C), ids (...) i64 or i32 with every id in [0, V):
 *   out[..., c] = weight[ids[...], c]                       out (..., C)
 *   dweight[ids[...], c] += dout[..., c]                    accumulated
 * An id outside [0, V) is an error naming the op, its position, its value and V;
 * nothing is read or written.
 *
 * The backward adds into the caller's dweight, so gradients of several lookups
 * of one table (tied embeddings, repeated ids) sum. It is deterministic without
 * atomics: the ids are bucketed by value (a stable counting sort) and each
 * weight row is owned by one task, which adds its dout rows in position order.
 * For f32 that is bit for bit the naive sequential loop
 *     for n: dweight[ids[n]] += dout[n]
 * whatever the thread count.
 *
 * dtypes: the forward copies any dtype (fp8 scale and amax travel with it). The
 * backward takes dweight and dout of f32, f64, bf16 or f16; it accumulates in f32
 * (f64 for f64 dweight) and rounds each touched row of dweight once.
 */
#ifndef CT_KERNELS_EMBEDDING_H
#define CT_KERNELS_EMBEDDING_H

#include "core/api.h"
#include "core/tensor.h"

/* Device functions (kernels/cpu/embedding.h). Tensors contiguous and checked
 * except for id values, which the device function validates. */
typedef ct_status (*ct_embedding_fn)(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out);
typedef ct_status (*ct_embedding_backward_fn)(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids);

/* New reference owned by the current frame, or NULL with an error. A NULL input
 * returns NULL and keeps the earlier error. */
CT_API ct_tensor *ct_kernel_embedding(const ct_tensor *weight, const ct_tensor *ids);

/* dweight (V, C) is updated in place (it may be a strided view); dout has shape
 * (ids..., C). Returns CT_OK, or non-zero with an error and dweight untouched. */
CT_API ct_status ct_kernel_embedding_backward(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids);

#endif
