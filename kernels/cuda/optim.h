/* ctrain — CUDA fused optimizer updates (kernels/cuda/optim.cu); the math is in
 * kernels/optim.h. Plain C, so kernels/optim.c can include it.
 *
 * The fast kernels compute what kernels/cpu/optim.c computes, bit for bit: the same
 * step scalars worked out on the host in double and rounded to the parameter's
 * dtype, then the same operations in the same order, each rounded once (no fused
 * multiply-adds, IEEE division and square root). The _ref kernels do every
 * operation in double, as the CPU's _ref functions do.
 *
 * Arguments as the dispatch tables pass them: contiguous f32 (or all f64) tensors of
 * one shape on one GPU.
 */
#ifndef CT_KERNELS_CUDA_OPTIM_H
#define CT_KERNELS_CUDA_OPTIM_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/optim.h"

ct_status cti_cuda_adamw(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
                         const ct_adamw_hparams *h);
ct_status cti_cuda_adamw_ref(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
                             const ct_adamw_hparams *h);
/* n quadruples on one GPU (checked by the caller), updated by one launch per group
 * of up to 24 tensors of a dtype: their pointers and sizes travel as kernel
 * arguments, so no table is copied to the device. */
ct_status cti_cuda_adamw_list(int n, ct_tensor *const *params, const ct_tensor *const *grads, ct_tensor *const *m,
                              ct_tensor *const *v, const ct_adamw_hparams *h);

/* momentum_buf: NULL when h->momentum == 0. */
ct_status cti_cuda_sgd(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf, const ct_sgd_hparams *h);
ct_status cti_cuda_sgd_ref(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf,
                           const ct_sgd_hparams *h);

#ifdef __cplusplus
}
#endif

#endif
