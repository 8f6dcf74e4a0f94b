/* ctrain — CUDA attention (see kernels/attention.h for the math and shapes).
 *
 * cti_cuda_attention / cti_cuda_attention_backward: flash-attention style tiled
 * kernels (kernels/cuda/attention_fwd.cu, attention_bwd.cu; the bf16/f16 forward on
 * tensor cores in attention_fwd_tc.cu, with P rounded to the dtype before P V, as
 * the CPU's bf16 dot-product kernels do): no T x S tensor in
 * memory, the forward saves the row logsumexp, the backward recomputes the
 * probabilities from it and runs without atomics (dK, dV in one pass over key
 * tiles, dQ in another over query tiles), so results are deterministic.
 * cti_cuda_attention_ref / cti_cuda_attention_backward_ref: one thread per row,
 * plain loops in double (kernels/cuda/attention_ref.cu); for tests. Like the CPU
 * reference, the reference backward ignores out and lse and recomputes the softmax.
 *
 * dtypes: f32, f64, bf16, f16 (bf16/f16 computed in f32, rounded once on output);
 * q, k, v, out, dout, dq, dk, dv of any strides; lse f32, or f64 (f64 inputs).
 * Arguments are checked by the entry points in kernels/attention.c.
 */
#ifndef CT_KERNELS_CUDA_ATTENTION_H
#define CT_KERNELS_CUDA_ATTENTION_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/tensor.h"

ct_status cti_cuda_attention(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                             double scale, ct_tensor *out, ct_tensor *lse);
ct_status cti_cuda_attention_ref(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                 double scale, ct_tensor *out, ct_tensor *lse);
ct_status cti_cuda_attention_backward(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                      const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                      bool causal, double scale, ct_tensor *dq, ct_tensor *dk, ct_tensor *dv);
ct_status cti_cuda_attention_backward_ref(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                          const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                          bool causal, double scale, ct_tensor *dq, ct_tensor *dk,
                                          ct_tensor *dv);

#ifdef __cplusplus
}
#endif

#endif
