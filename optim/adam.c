/* ctrain — Adam (L2 weight decay added to the gradient) and AdamW (decoupled decay),
 * as torch.optim.Adam / AdamW; the update itself is ct_kernel_adamw (kernels/optim.h):
 *   AdamW: p *= 1 - lr * wd            Adam: g = grad + wd * p
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  t = the parameter's own step count
 *   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 */
#include "kernels/optim.h"
#include "optim/optimizer.h"
#include "optim/optimizer_internal.h"

static ct_optimizer *adam_new(const char *op, ct_optim_kind kind, double default_wd, int n, ct_tensor *const *params,
                              const ct_adam_config *cfg)
{
    const ct_adam_config c = cfg ? *cfg : (ct_adam_config){0};
    const ct_optim_hyper h = {
        .beta1 = c.beta1 != 0 ? c.beta1 : 0.9,
        .beta2 = c.beta2 != 0 ? c.beta2 : 0.999,
        .eps = c.eps != 0 ? c.eps : 1e-8,
    };
    ct_optimizer *o = cti_optim_alloc(op, kind, c.lr != 0 ? c.lr : 1e-3, c.weight_decay != 0 ? c.weight_decay : default_wd, &h);
    return cti_optim_finish_new(o, n, params);
}

ct_optimizer *ct_adam_new(int n, ct_tensor *const *params, const ct_adam_config *cfg)
{
    return adam_new("adam_new", CT_OPTIM_ADAM, 0, n, params, cfg);
}

ct_optimizer *ct_adamw_new(int n, ct_tensor *const *params, const ct_adamw_config *cfg)
{
    return adam_new("adamw_new", CT_OPTIM_ADAMW, 0.01, n, params, cfg);
}

ct_status cti_optim_adam_init_state(ct_optimizer *o, int i)
{
    ct_param_state *s = &o->state[i];
    if (!s->exp_avg && !(s->exp_avg = cti_optim_zeros_like(o->params[i]))) return ct_last_status();
    if (!s->exp_avg_sq && !(s->exp_avg_sq = cti_optim_zeros_like(o->params[i]))) return ct_last_status();
    return CT_OK;
}

ct_status cti_optim_adam_update(ct_optimizer *o, int i, const ct_param_group *g, const ct_tensor *grad)
{
    ct_param_state *s = &o->state[i];
    const ct_adamw_hparams h = {
        .lr = o->lr * g->lr_scale,
        .beta1 = o->hyper.beta1,
        .beta2 = o->hyper.beta2,
        .eps = o->hyper.eps,
        .weight_decay = g->weight_decay,
        .step = s->step + 1,
        .decoupled = o->kind == CT_OPTIM_ADAMW,
    };
    ct_status st = ct_kernel_adamw(o->params[i], grad, s->exp_avg, s->exp_avg_sq, &h);
    if (!st) s->step++;
    return st;
}
