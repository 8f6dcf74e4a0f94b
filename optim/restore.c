/* ctrain — an optimizer's state as values, out and back in (ct_optimizer_restore):
 * what a training-state checkpoint saves and restores, whatever file layout it uses.
 * Restoring checks everything and copies every tensor before it replaces anything. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "optim/optimizer.h"
#include "optim/optimizer_internal.h"

ct_optimizer_hparams ct_optimizer_hparams_get(const ct_optimizer *o)
{
    if (!o) return (ct_optimizer_hparams){0};
    const ct_optim_hyper *h = &o->hyper;
    if (o->kind == CT_OPTIM_SGD)
        return (ct_optimizer_hparams){.momentum = h->momentum, .dampening = h->dampening, .nesterov = h->nesterov};
    return (ct_optimizer_hparams){.beta1 = h->beta1, .beta2 = h->beta2, .eps = h->eps};
}

int cti_optim_state_keys(ct_optim_kind kind, double momentum, const char *keys[2])
{
    if (kind != CT_OPTIM_SGD) {
        keys[0] = "exp_avg", keys[1] = "exp_avg_sq";
        return 2;
    }
    keys[0] = "momentum_buffer";
    return momentum != 0 ? 1 : 0;
}

int ct_optimizer_state_keys(const ct_optimizer *o, const char *keys[2])
{
    return o ? cti_optim_state_keys(o->kind, o->hyper.momentum, keys) : 0;
}

/* The values of r, checked against o. */
static ct_status check_values(const ct_optimizer *o, const ct_optimizer_restore_spec *r, ct_optim_hyper *h)
{
    const char *op = "optimizer_restore";
    if (r->step < 0) return ct_error_set(CT_ERR_INVALID, "%s: step %" PRId64 " < 0", op, r->step);
    if (cti_optim_check_nonneg(op, "lr", r->lr)) return CT_ERR_INVALID;
    *h = o->hyper;
    if (o->kind == CT_OPTIM_SGD) {
        h->momentum = r->hparams.momentum, h->dampening = r->hparams.dampening, h->nesterov = r->hparams.nesterov;
        if ((h->momentum != 0) != (o->hyper.momentum != 0))
            return ct_error_set(CT_ERR_INVALID,
                                "%s: momentum %g, this SGD has momentum %g: one keeps momentum buffers, the other not",
                                op, h->momentum, o->hyper.momentum);
    } else {
        h->beta1 = r->hparams.beta1, h->beta2 = r->hparams.beta2, h->eps = r->hparams.eps;
    }
    if (cti_optim_check_hyper(op, o->kind, h)) return CT_ERR_INVALID;
    if (o->ngroups && (!r->lr_scale || !r->weight_decay))
        return ct_error_set(CT_ERR_INVALID, "%s: lr_scale or weight_decay is NULL (%d groups)", op, o->ngroups);
    for (int g = 0; g < o->ngroups; g++)
        if (cti_optim_check_nonneg(op, "a group's lr_scale", r->lr_scale[g]) ||
            cti_optim_check_nonneg(op, "a group's weight_decay", r->weight_decay[g]))
            return CT_ERR_INVALID;
    if (o->nparams && !r->param_step) return ct_error_set(CT_ERR_INVALID, "%s: param_step is NULL", op);
    return CT_OK;
}

/* Parameter i's state tensors: present where it has steps, shaped and typed as it. */
static ct_status check_tensor(const ct_optimizer *o, int i, const char *key, const ct_tensor *t)
{
    const ct_tensor *p = o->params[i];
    char lab[320], a[200], b[200];
    if (!t)
        return ct_error_set(CT_ERR_INVALID, "optimizer_restore: %s has steps but no '%s'",
                            cti_optim_param_label(p, i, lab, sizeof lab), key);
    if (t->dtype != p->dtype || t->ndim != p->ndim || memcmp(t->shape, p->shape, (size_t)p->ndim * sizeof *p->shape))
        return ct_error_set(CT_ERR_INVALID, "optimizer_restore: '%s' of %s is %s%s, expected %s%s", key,
                            cti_optim_param_label(p, i, lab, sizeof lab), ct_dtype_name(t->dtype),
                            ct_shape_str(t->ndim, t->shape, a, sizeof a), ct_dtype_name(p->dtype),
                            ct_shape_str(p->ndim, p->shape, b, sizeof b));
    return CT_OK;
}

ct_status ct_optimizer_restore(ct_optimizer *o, const ct_optimizer_restore_spec *r)
{
    if (!o || !r) return ct_error_set(CT_ERR_INVALID, "optimizer_restore: %s is NULL", o ? "spec" : "optimizer");
    ct_optim_hyper h;
    ct_status st = check_values(o, r, &h);
    const char *keys[2];
    const int nkeys = ct_optimizer_state_keys(o, keys);
    for (int i = 0; i < o->nparams && !st; i++) {
        if (r->param_step[i] < 0)
            return ct_error_set(CT_ERR_INVALID, "optimizer_restore: parameter %d: step %" PRId64 " < 0", i,
                                r->param_step[i]);
        for (int k = 0; k < nkeys && !st && r->param_step[i] > 0; k++)
            st = check_tensor(o, i, keys[k], r->state[k] ? r->state[k][i] : NULL);
    }
    if (st) return st;
    /* owned copies first: the new state shares nothing with the caller's tensors */
    ct_param_state *fresh = calloc((size_t)o->nparams + 1, sizeof *fresh);
    if (!fresh) return ct_error_set(CT_ERR_NOMEM, "optimizer_restore: out of memory");
    ct_frame_push();
    for (int i = 0; i < o->nparams && !st; i++) {
        fresh[i].step = r->param_step[i];
        for (int k = 0; k < nkeys && !st && fresh[i].step > 0; k++) {
            ct_tensor *t = r->state[k][i];
            ct_tensor *c = r->adopt && ct_tensor_is_contiguous(t) ? t : ct_tensor_clone(t);
            ct_tensor **slot = k == 0 ? (nkeys == 2 ? &fresh[i].exp_avg : &fresh[i].momentum_buffer) : &fresh[i].exp_avg_sq;
            if (!c) st = ct_error_prefix("optimizer_restore: ");
            else *slot = ct_tensor_retain(c);
        }
    }
    ct_frame_pop();
    /* commit (or, on failure, drop the copies): swap the new state in, the old out */
    for (int i = 0; i < o->nparams; i++) {
        if (!st) {
            ct_param_state t = o->state[i];
            o->state[i] = fresh[i];
            fresh[i] = t;
        }
        ct_tensor_release(fresh[i].exp_avg);
        ct_tensor_release(fresh[i].exp_avg_sq);
        ct_tensor_release(fresh[i].momentum_buffer);
    }
    free(fresh);
    if (st) return st;
    for (int g = 0; g < o->ngroups; g++) {
        o->groups[g].lr_scale = r->lr_scale[g];
        o->groups[g].weight_decay = r->weight_decay[g];
    }
    o->step = r->step;
    o->lr = r->lr;
    o->hyper = h;
    return CT_OK;
}
