/* ctrain — CUDA embedding kernels (see kernels/embedding.h for the math).
 *
 * Contract (checked by kernels/embedding.c): tensors contiguous and on one GPU;
 * weight (V, C) of any dtype with out (n, C) of the same dtype; dweight (V, C) and
 * dout (n, C) of f32, f64, bf16 or f16; ids (n) i64 or i32. Id values are validated
 * on the device before anything is written: one outside [0, V) returns
 * CT_ERR_INVALID with the CPU's message (op, position, value, V). That check copies
 * three numbers to the host (one synchronisation per call), because the API reports
 * a bad id as the call's own error. The forward overwrites out; the backward adds
 * into dweight, deterministically. The _ref versions are plain: one thread per
 * output row (forward), one thread per dweight element scanning every id in
 * position order with a double sum (backward). */
#ifndef CT_KERNELS_CUDA_EMBEDDING_H
#define CT_KERNELS_CUDA_EMBEDDING_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/tensor.h"

ct_status cti_cuda_embedding(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out);
ct_status cti_cuda_embedding_ref(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out);
ct_status cti_cuda_embedding_backward(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids);
ct_status cti_cuda_embedding_backward_ref(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids);

#ifdef __cplusplus
}
#endif

#endif
