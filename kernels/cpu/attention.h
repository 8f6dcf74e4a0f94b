/* ctrain — CPU attention kernels (see kernels/attention.h for the math).
 *
 * cti_cpu_attention / cti_cpu_attention_backward: blockwise, 64 queries x 64 keys
 * per tile, OpenMP over (batch*head, query block) in the forward and over
 * (batch*head) or (batch*head, block) in the backward; no T x S buffer.
 * bf16 inputs on a CPU with AVX512-BF16 take the bf16 dot-product kernels
 * (kernels/cpu/attention_bf16.c): the same tiles, with P and dS rounded to bf16
 * before their products; elsewhere bf16 and f16 rows are widened to f32 as packed.
 * cti_cpu_attention_ref / cti_cpu_attention_backward_ref: full score matrix per
 * head in double, plain loops; for tests only. The ref backward recomputes the
 * softmax itself and ignores out and lse, so it does not trust the forward.
 */
#ifndef CT_KERNELS_CPU_ATTENTION_H
#define CT_KERNELS_CPU_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attention.h"

/* Query and key rows per tile. */
#define CT_ATTN_BLOCK_Q 64
#define CT_ATTN_BLOCK_K 64

ct_status cti_cpu_attention(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                            double scale, ct_tensor *out, ct_tensor *lse);
ct_status cti_cpu_attention_ref(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                bool causal, double scale, ct_tensor *out, ct_tensor *lse);
ct_status cti_cpu_attention_backward(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                     const ct_tensor *v, const ct_tensor *out,
                                     const ct_tensor *lse, bool causal, double scale,
                                     ct_tensor *dq, ct_tensor *dk, ct_tensor *dv);
ct_status cti_cpu_attention_backward_ref(const ct_tensor *dout, const ct_tensor *q,
                                         const ct_tensor *k, const ct_tensor *v,
                                         const ct_tensor *out, const ct_tensor *lse, bool causal,
                                         double scale, ct_tensor *dq, ct_tensor *dk,
                                         ct_tensor *dv);

/* Whether bf16 attention takes the dot-product kernels: the build and the CPU have
 * AVX512-BF16, and neither CTRAIN_BF16_ATTENTION=widen nor the setter below turned
 * them off. Off, bf16 widens to f32 as on other CPUs (tests check that path here
 * too). The setter overrides the variable for the whole process. */
bool cti_cpu_attention_bf16_dot(void);
void cti_cpu_attention_set_bf16_dot(bool on);
/* What is wrong with CTRAIN_BF16_ATTENTION (a value other than dot or widen, or dot
 * without AVX512-BF16), or NULL. While it is wrong, bf16 attention fails with it. */
const char *cti_cpu_attention_bf16_env_error(void);

/* Bytes of scratch one thread of cti_cpu_attention / cti_cpu_attention_backward
 * allocates for one head with T queries, S keys, head dims D and Dv, computing in
 * elements of elem_size bytes (4 for f32/bf16/f16, 8 for f64): the larger of the
 * forward and backward needs. It grows like (T + S) * (D + Dv), never like T * S. */
size_t cti_cpu_attention_workspace_bytes(int64_t T, int64_t S, int64_t D, int64_t Dv,
                                         size_t elem_size);

#endif
