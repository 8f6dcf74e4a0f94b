/* ctrain — how autograd's ops apply the autocast policy to their arguments
 * (autograd/autocast_cast.h is the public side: the weight-copy cache). */
#ifndef CT_AUTOGRAD_AUTOCAST_CAST_INTERNAL_H
#define CT_AUTOGRAD_AUTOCAST_CAST_INTERNAL_H

#include "autograd/autocast_cast.h"

/* x as op computes it here: x itself (outside a scope, or already right), a
 * differentiable cast, or for a parameter (a leaf that requires grad) under a "low"
 * rule the cached low-precision copy, made once per weight generation, whose
 * gradient comes back to the parameter in its own dtype. NULL stays NULL. */
ct_tensor *cti_autocast_arg(ct_autocast_op op, ct_tensor *x);
/* Two inputs of different float dtypes under a WIDEST rule: both cast to the wider
 * one (bf16 with f16: f32). No-op otherwise. */
void cti_autocast_pair(ct_autocast_op op, ct_tensor **a, ct_tensor **b);

#endif
