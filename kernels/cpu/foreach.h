/* ctrain — CPU kernels of kernels/foreach.h (contracts there; checked by
 * kernels/foreach.c). The _ref versions are plain loops: one element at a time in
 * double, for the tests. */
#ifndef CT_KERNELS_CPU_FOREACH_H
#define CT_KERNELS_CPU_FOREACH_H

#include <stdbool.h>

#include "core/tensor.h"

ct_status cti_cpu_scale_(ct_tensor *x, double coef);
ct_status cti_cpu_clamp_abs_(ct_tensor *x, double v);
ct_status cti_cpu_norm_partial(const ct_tensor *x, int kind, double p, double *out);
ct_status cti_cpu_norm_partial_ref(const ct_tensor *x, int kind, double p, double *out);
ct_status cti_cpu_unscale_(int n, ct_tensor *const *grads, float inv, bool *found_inf);

#endif
