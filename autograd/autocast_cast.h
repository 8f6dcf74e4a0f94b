/* ctrain — how autograd's ops apply the autocast policy (precision/autocast.h).
 * The ops call these on their arguments; users only need ct_autocast_clear_cache. */
#ifndef CT_AUTOGRAD_AUTOCAST_CAST_H
#define CT_AUTOGRAD_AUTOCAST_CAST_H

#include "autograd/ops.h"
#include "precision/autocast.h"

/* x as op computes it here: x itself (outside a scope, or already right), a
 * differentiable cast, or for a parameter (a leaf that requires grad) under a "low"
 * rule the cached low-precision copy, made once per weight generation, whose
 * gradient comes back to the parameter in its own dtype. NULL stays NULL. */
ct_tensor *ct_autocast_arg(ct_autocast_op op, ct_tensor *x);
/* Two inputs of different float dtypes under a WIDEST rule: both cast to the wider
 * one (bf16 with f16: f32). No-op otherwise. */
void ct_autocast_pair(ct_autocast_op op, ct_tensor **a, ct_tensor **b);
/* Releases every cached weight copy (they go anyway at the next optimizer step). */
void ct_autocast_clear_cache(void);
/* How many weight copies the cache has made so far in this process. */
long ct_autocast_cache_casts(void);

#endif
