/* ctrain — CUDA kernels of kernels/foreach.h (contracts there; checked by
 * kernels/foreach.c). The _ref version is one thread summing every element in order. */
#ifndef CT_KERNELS_CUDA_FOREACH_H
#define CT_KERNELS_CUDA_FOREACH_H

#include <stdbool.h>

#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

ct_status cti_cuda_scale_(ct_tensor *x, double coef);
ct_status cti_cuda_clamp_abs_(ct_tensor *x, double v);
ct_status cti_cuda_norm_partial(const ct_tensor *x, int kind, double p, double *out);
ct_status cti_cuda_norm_partial_ref(const ct_tensor *x, int kind, double p, double *out);
ct_status cti_cuda_unscale_(int n, ct_tensor *const *grads, float inv, bool *found_inf);

#ifdef __cplusplus
}
#endif

#endif
