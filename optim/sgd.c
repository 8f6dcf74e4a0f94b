/* ctrain — SGD with momentum, dampening and nesterov (torch.optim.SGD); the update
 * itself is ct_kernel_sgd (kernels/optim.h):
 *   g = grad + wd * p
 *   momentum != 0:  buf = g on the parameter's first step, else momentum * buf + (1 - dampening) * g
 *                   g = nesterov ? g + momentum * buf : buf
 *   p -= lr * g
 */
#include "kernels/optim.h"
#include "optim/optimizer.h"
#include "optim/optimizer_internal.h"

ct_optimizer *ct_sgd_new(int n, ct_tensor *const *params, const ct_sgd_config *cfg)
{
    const ct_sgd_config c = cfg ? *cfg : (ct_sgd_config){0};
    const ct_optim_hyper h = {.momentum = c.momentum, .dampening = c.dampening, .nesterov = c.nesterov};
    ct_optimizer *o = cti_optim_alloc("sgd_new", CT_OPTIM_SGD, c.lr != 0 ? c.lr : 1e-3, c.weight_decay, &h);
    return cti_optim_finish_new(o, n, params);
}

ct_status cti_optim_sgd_init_state(ct_optimizer *o, int i)
{
    ct_param_state *s = &o->state[i];
    if (o->hyper.momentum == 0 || s->momentum_buffer) return CT_OK;
    /* its contents are never read: the first step overwrites it with the gradient */
    s->momentum_buffer = cti_optim_zeros_like(o->params[i]);
    return s->momentum_buffer ? CT_OK : ct_last_status();
}

ct_status cti_optim_sgd_update(ct_optimizer *o, int i, const ct_param_group *g, const ct_tensor *grad)
{
    ct_param_state *s = &o->state[i];
    const ct_sgd_hparams h = {
        .lr = o->lr * g->lr_scale,
        .momentum = o->hyper.momentum,
        .dampening = o->hyper.dampening,
        .weight_decay = g->weight_decay,
        .nesterov = o->hyper.nesterov,
        .first_step = s->step == 0,
    };
    ct_status st = ct_kernel_sgd(o->params[i], grad, s->momentum_buffer, &h);
    if (!st) s->step++;
    return st;
}
