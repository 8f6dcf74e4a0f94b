/* ctrain — gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_.
 *
 * Each function takes a list of parameters and works on their `grad` fields (f32 or
 * f64 CPU tensors, any layout); parameters whose grad is NULL are skipped. Norms
 * accumulate in double in a fixed order (blocks of elements, then tensors in list
 * order), so the result does not depend on the thread count.
 *
 * Sharded gradients. The norm over all shards is the norm of the concatenation, so a
 * rank computes its partial with ct_grad_norm_partial (ct_grad_norm_sq for the
 * 2-norm), the ranks all-reduce it (sum, or max for INFINITY), and each applies
 *     total = ct_grad_norm_from_partial(reduced, norm_type)
 *     ct_grad_scale(n_local, local_params, ct_clip_coef(total, max_norm))
 * which is what ct_clip_grad_norm does on one list.
 */
#ifndef CT_OPTIM_CLIP_H
#define CT_OPTIM_CLIP_H

#include "core/api.h"
#include "core/error.h"
#include "core/tensor.h"

/* Scales every grad by min(1, max_norm / (total + 1e-6)) (PyTorch's rule: at or below
 * max_norm the gradients are left alone) where total is the norm_type-norm of all the
 * gradients together: norm_type > 0 finite, or INFINITY (largest |g|). Returns total,
 * measured before clipping. A non-finite total (a NaN or inf gradient) is returned
 * and nothing is scaled (PyTorch with error_if_nonfinite=False would multiply by NaN).
 * NAN + error on bad input (n < 0, NULL list or parameter, a grad that is not f32 or
 * f64 on the CPU, max_norm < 0 or NaN, a bad norm_type); a NaN from NaN gradients sets
 * no error, so test the inputs' validity once, not every step's result. */
CT_API double ct_clip_grad_norm(int n, ct_tensor *const *params, double max_norm, double norm_type);

/* The norm_type-norm of all the grads together, without clipping. NAN + error as above. */
CT_API double ct_grad_norm(int n, ct_tensor *const *params, double norm_type);

/* Clamps every grad element into [-clip_value, clip_value] (clip_value >= 0); NaNs stay. */
CT_API ct_status ct_clip_grad_value(int n, ct_tensor *const *params, double clip_value);

/* Sum of g^2 over every grad: the 2-norm's partial for one shard. NAN + error. */
CT_API double ct_grad_norm_sq(int n, ct_tensor *const *params);
/* The norm_type partial: sum |g|^p, or max |g| for INFINITY. Partials of disjoint lists
 * combine by + (max for INFINITY). NAN + error. */
CT_API double ct_grad_norm_partial(int n, ct_tensor *const *params, double norm_type);
/* partial^(1/p) (the partial itself for INFINITY). */
CT_API double ct_grad_norm_from_partial(double partial, double norm_type);
/* min(1, max_norm / (total_norm + 1e-6)); 1 when total_norm is not finite. */
CT_API double ct_clip_coef(double total_norm, double max_norm);
/* g *= coef for every grad (computed in the grad's dtype, as PyTorch's mul_). coef 1
 * leaves the bits alone. */
CT_API ct_status ct_grad_scale(int n, ct_tensor *const *params, double coef);

#endif
