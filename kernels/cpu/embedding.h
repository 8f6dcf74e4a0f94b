/* ctrain — CPU embedding kernels (see kernels/embedding.h for the math).
 *
 * Contract (checked by kernels/embedding.c): tensors contiguous and on the CPU;
 * weight (V, C) of any dtype with out (n, C) of the same dtype; dweight (V, C)
 * and dout (n, C) of f32, f64, bf16 or f16; ids (n) i64 or i32. Id values are
 * validated here: one outside [0, V) returns CT_ERR_INVALID with a message
 * naming the op, the position, the value and V, before anything is written.
 * The forward overwrites out; the backward adds into dweight. The _ref versions
 * are plain loops (the backward sums in double) that the tests compare against.
 */
#ifndef CT_KERNELS_CPU_EMBEDDING_H
#define CT_KERNELS_CPU_EMBEDDING_H

#include "core/tensor.h"

ct_status cti_cpu_embedding(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out);
ct_status cti_cpu_embedding_ref(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out);
ct_status cti_cpu_embedding_backward(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids);
ct_status cti_cpu_embedding_backward_ref(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids);

#endif
