/* ctrain — gradient checking against central finite differences.
 *
 * For a function out = fn(inputs) of f64 tensors, compares the gradient that
 * backward computes for L = sum(out * w), w a fixed random tensor, with
 *     dL/dx_j ~= (L(x_j + eps) - L(x_j - eps)) / (2 eps)
 * for every element j of every input that requires grad. Passes when
 * |analytic - numeric| <= atol + rtol * |numeric| everywhere.
 */
#ifndef CT_AUTOGRAD_GRADCHECK_H
#define CT_AUTOGRAD_GRADCHECK_H

#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

/* Builds the output from the inputs with differentiable ops; called many times. */
typedef ct_tensor *(*ct_gradcheck_fn)(ct_tensor *const *inputs, void *ctx);

typedef struct ct_gradcheck_config {
    double eps;    /* default 1e-6 */
    double atol;   /* default 1e-5 */
    double rtol;   /* default 1e-4 */
    uint64_t seed; /* for w; default 1 */
} ct_gradcheck_config;

/* CT_OK when every gradient matches; otherwise an error naming the input, the
 * element, both values and (where fn's output has one) the op. Inputs must be
 * f64 CPU tensors; the ones that require grad are perturbed in place and
 * restored. Their .grad is left as it was before the call. cfg may be NULL. */
CT_API ct_status ct_gradcheck(ct_gradcheck_fn fn, int n, ct_tensor *const *inputs, void *ctx,
                              const ct_gradcheck_config *cfg);

#endif
