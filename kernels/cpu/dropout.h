/* ctrain — CPU dropout kernels (see kernels/dropout.h for the math and the mask rule).
 *
 * Contract (checked by kernels/dropout.c): tensors contiguous and on the CPU, of
 * one shape; x, y, dy, dx f32, f64, bf16 or f16 (y like x, dx like dy); mask u8
 * (u8 or bool in the backward); 0 <= p <= 1; rng non-NULL. Outputs are
 * overwritten. The _ref versions are plain loops in double that draw the same
 * words and apply the rule literally; the tests compare the fast ones against them.
 */
#ifndef CT_KERNELS_CPU_DROPOUT_H
#define CT_KERNELS_CPU_DROPOUT_H

#include "core/philox.h"
#include "core/tensor.h"

ct_status cti_cpu_dropout(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask);
ct_status cti_cpu_dropout_ref(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask);
ct_status cti_cpu_dropout_backward(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx);
ct_status cti_cpu_dropout_backward_ref(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx);

#endif
