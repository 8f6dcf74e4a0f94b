/* ctrain — fused optimizer updates: AdamW / Adam and SGD (momentum, nesterov).
 *
 * One pass over each element updates the parameter and its state in place, with the
 * math of PyTorch's torch.optim.AdamW / Adam / SGD (foreach=False):
 *
 *   Adam(W), step t >= 1 (g negated first when maximize):
 *     AdamW (decoupled):  p = p * (1 - lr*wd)          Adam:  g = g + wd*p
 *     m = b1*m + (1-b1)*g;   v = b2*v + (1-b2)*g^2
 *     p = p - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 *       (evaluated as PyTorch does: p -= (lr/(1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps))
 *
 *   SGD:
 *     g = g + wd*p
 *     momentum != 0:  buf = g on the first step, else buf = momentum*buf + (1-dampening)*g
 *                     g = nesterov ? g + momentum*buf : buf
 *     p = p - lr*g
 *
 * The flat-buffer kernels (kernels/cpu/optim.h) are what the sharding engine calls on
 * its shards; the tensor-level ones below check their arguments and dispatch.
 */
#ifndef CT_KERNELS_OPTIM_H
#define CT_KERNELS_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

typedef struct ct_adamw_hparams {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;   /* 1-based, for bias correction */
    bool decoupled; /* true: AdamW (p -= lr*wd*p), false: Adam (g += wd*p) */
    bool maximize;
} ct_adamw_hparams;

typedef struct ct_sgd_hparams {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
    bool first_step; /* momentum buffer initialised to g on the first step, as PyTorch */
} ct_sgd_hparams;

/* Device functions for the dispatch tables: arguments already checked (same shape,
 * dtype f32 or f64, contiguous, one device). */
typedef ct_status (*ct_adamw_fn)(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
                                 const ct_adamw_hparams *h);
typedef ct_status (*ct_sgd_fn)(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf,
                               const ct_sgd_hparams *h);

/* One AdamW/Adam step on param, m, v in place. param, grad, m, v: contiguous f32 (or all
 * f64) tensors of one shape on one device; h->step >= 1, 0 <= betas < 1, lr, eps,
 * weight_decay >= 0. Non-zero status and a message naming the op and tensors otherwise. */
CT_API ct_status ct_kernel_adamw(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
                                 const ct_adamw_hparams *h);
/* The same over n (param, grad, m, v) quadruples; checks all of them before touching any. */
CT_API ct_status ct_kernel_adamw_list(int n, ct_tensor *const *params, const ct_tensor *const *grads,
                                      ct_tensor *const *m, ct_tensor *const *v, const ct_adamw_hparams *h);
/* One SGD step on param (and momentum_buf, required when h->momentum != 0, ignored
 * otherwise) in place. Same layout rules as ct_kernel_adamw; nesterov needs momentum > 0
 * and dampening == 0, as in PyTorch. */
CT_API ct_status ct_kernel_sgd(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf,
                               const ct_sgd_hparams *h);

#endif
