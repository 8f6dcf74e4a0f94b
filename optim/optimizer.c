/* ctrain — the optimizer handle: parameter groups, the step loop, zero_grad, lr. The
 * per-parameter updates are in optim/sgd.c and optim/adam.c, save/load in optim/state.c. */
#include "optim/optimizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "optim/optimizer_internal.h"
#include "precision/autocast.h"

static const char *const kind_names[] = {[CT_OPTIM_SGD] = "sgd", [CT_OPTIM_ADAM] = "adam", [CT_OPTIM_ADAMW] = "adamw"};

const char *cti_optim_param_label(const ct_tensor *p, int i, char *buf, int cap)
{
    char d[200];
    ct_tensor_describe(p, d, sizeof d);
    if (p && p->name) snprintf(buf, (size_t)cap, "parameter %d '%s' (%s)", i, p->name, d);
    else snprintf(buf, (size_t)cap, "parameter %d (%s)", i, d);
    return buf;
}

ct_status cti_optim_check_nonneg(const char *op, const char *name, double v)
{
    if (!(v >= 0) || isinf(v)) return ct_error_set(CT_ERR_INVALID, "%s: %s must be finite and >= 0, got %g", op, name, v);
    return CT_OK;
}

ct_status cti_optim_check_hyper(const char *op, ct_optim_kind kind, const ct_optim_hyper *h)
{
    if (kind == CT_OPTIM_SGD) {
        if (cti_optim_check_nonneg(op, "momentum", h->momentum)) return CT_ERR_INVALID;
        if (!isfinite(h->dampening))
            return ct_error_set(CT_ERR_INVALID, "%s: dampening must be finite, got %g", op, h->dampening);
        if (h->nesterov && (h->momentum <= 0 || h->dampening != 0))
            return ct_error_set(CT_ERR_INVALID, "%s: nesterov needs momentum > 0 and dampening 0, got momentum %g dampening %g",
                                op, h->momentum, h->dampening);
        return CT_OK;
    }
    if (!(h->beta1 >= 0 && h->beta1 < 1) || !(h->beta2 >= 0 && h->beta2 < 1))
        return ct_error_set(CT_ERR_INVALID, "%s: betas must lie in [0, 1), got (%g, %g)", op, h->beta1, h->beta2);
    return cti_optim_check_nonneg(op, "eps", h->eps);
}

ct_optimizer *cti_optim_alloc(const char *op, ct_optim_kind kind, double lr, double weight_decay,
                              const ct_optim_hyper *hyper)
{
    if (cti_optim_check_nonneg(op, "lr", lr) || cti_optim_check_nonneg(op, "weight_decay", weight_decay) ||
        cti_optim_check_hyper(op, kind, hyper))
        return NULL;
    ct_optimizer *o = calloc(1, sizeof *o);
    if (!o) {
        ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
        return NULL;
    }
    o->kind = kind;
    o->lr = lr;
    o->weight_decay = weight_decay;
    o->hyper = *hyper;
    return o;
}


ct_tensor *cti_optim_zeros_like(const ct_tensor *p)
{
    ct_frame_push();
    ct_tensor *t = ct_tensor_zeros_like(p);
    if (t) ct_tensor_retain(t);
    ct_frame_pop();
    return t;
}

/* What the kernels accept and the optimizer updates in place. */
static ct_status check_param(const ct_optimizer *o, const ct_tensor *p, int i, ct_tensor *const *others, int nothers)
{
    char lab[320];
    if (!p) return ct_error_set(CT_ERR_INVALID, "parameter %d is NULL", i);
    cti_optim_param_label(p, i, lab, sizeof lab);
    if (p->dtype != CT_DTYPE_F32 && p->dtype != CT_DTYPE_F64)
        return ct_error_set(CT_ERR_INVALID, "%s: parameters must be f32 or f64", lab);
    if (p->device.type != CT_DEVICE_CPU) return ct_error_set(CT_ERR_UNSUPPORTED, "%s: parameters must be on the cpu", lab);
    if (!ct_tensor_is_contiguous(p))
        return ct_error_set(CT_ERR_INVALID, "%s: parameters must be contiguous (it is updated in place)", lab);
    for (int j = 0; j < o->nparams; j++)
        if (o->params[j] == p) return ct_error_set(CT_ERR_INVALID, "%s is already parameter %d of this optimizer", lab, j);
    for (int j = 0; j < nothers; j++)
        if (others[j] == p) return ct_error_set(CT_ERR_INVALID, "%s appears twice in the list (also at %d)", lab, o->nparams + j);
    return CT_OK;
}

static bool grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) return true;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *a = realloc(*arr, (size_t)c * elem);
    if (!a) return false;
    *arr = a;
    *cap = c;
    return true;
}

static ct_status add_group(const char *op, ct_optimizer *o, int n, ct_tensor *const *params,
                           const ct_param_group_config *g)
{
    if (!o) return ct_error_set(CT_ERR_INVALID, "%s: optimizer is NULL", op);
    if (n < 0 || (n > 0 && !params))
        return ct_error_set(CT_ERR_INVALID, "%s: need n >= 0 and an array of n parameters (n = %d, params %s)", op, n,
                            params ? "given" : "NULL");
    const ct_param_group_config dflt = {0};
    if (!g) g = &dflt;
    if (cti_optim_check_nonneg(op, "lr_scale", g->lr_scale) || cti_optim_check_nonneg(op, "weight_decay", g->weight_decay))
        return CT_ERR_INVALID;
    if (g->no_weight_decay && g->weight_decay != 0)
        return ct_error_set(CT_ERR_INVALID, "%s: no_weight_decay with weight_decay %g: ask for one or the other", op,
                            g->weight_decay);
    if (o->nparams > INT32_MAX - n) return ct_error_set(CT_ERR_INVALID, "%s: too many parameters", op);
    for (int i = 0; i < n; i++)
        if (check_param(o, params[i], o->nparams + i, params, i)) return ct_error_prefix("%s: ", op);
    const int total = o->nparams + n;
    int cap = o->cap_params;
    if (!grow((void **)&o->params, &cap, total, sizeof *o->params) ||
        !grow((void **)&o->state, &o->cap_params, total, sizeof *o->state) ||
        !grow((void **)&o->groups, &o->cap_groups, o->ngroups + 1, sizeof *o->groups)) {
        /* the params array may be larger already: harmless, cap_params tracks the smaller */
        return ct_error_set(CT_ERR_NOMEM, "%s: out of memory for %d parameters", op, total);
    }
    for (int i = 0; i < n; i++) {
        o->params[o->nparams + i] = ct_tensor_retain(params[i]);
        o->state[o->nparams + i] = (ct_param_state){0};
    }
    o->groups[o->ngroups++] = (ct_param_group){
        .first = o->nparams,
        .n = n,
        .lr_scale = g->lr_scale != 0 ? g->lr_scale : 1,
        .weight_decay = g->no_weight_decay ? 0 : g->weight_decay != 0 ? g->weight_decay : o->weight_decay,
    };
    o->nparams = total;
    return CT_OK;
}

ct_status ct_optimizer_add_group(ct_optimizer *o, int n, ct_tensor *const *params, const ct_param_group_config *g)
{
    return add_group("optimizer_add_group", o, n, params, g);
}

ct_optimizer *cti_optim_finish_new(ct_optimizer *o, int n, ct_tensor *const *params)
{
    if (!o) return NULL;
    char op[32];
    snprintf(op, sizeof op, "%s_new", kind_names[o->kind]);
    if (add_group(op, o, n, params, NULL)) {
        ct_optimizer_free(o);
        return NULL;
    }
    return o;
}

/* A gradient the update can use: same shape, dtype and device as its parameter. */
static ct_status check_grad(const ct_tensor *p, int i)
{
    const ct_tensor *g = p->grad;
    const char *why = NULL;
    if (!ct_tensor_same_shape(p, g)) why = "its gradient's shape differs";
    else if (g->dtype != p->dtype) why = "its gradient's dtype differs";
    else if (!ct_device_equal(g->device, p->device)) why = "its gradient is on another device";
    if (!why) return CT_OK;
    char lab[320], gd[200];
    return ct_error_set(CT_ERR_INVALID, "optimizer_step: %s: %s: grad %s", cti_optim_param_label(p, i, lab, sizeof lab),
                        why, ct_tensor_describe(g, gd, sizeof gd));
}

ct_status ct_optimizer_step(ct_optimizer *o)
{
    if (!o) return ct_error_set(CT_ERR_INVALID, "optimizer_step: optimizer is NULL");
    o->last_skipped = false;
    if (o->hooks.before_step) {
        bool skip = false;
        ct_status hs = o->hooks.before_step(o, o->hooks.data, &skip);
        if (hs) return hs;
        if (skip) {
            o->last_skipped = true;
            return CT_OK;
        }
    }
    for (int i = 0; i < o->nparams; i++)
        if (o->params[i]->grad && check_grad(o->params[i], i)) return CT_ERR_INVALID;
    for (int k = 0; k < o->ngroups; k++)
        if (!isfinite(o->lr * o->groups[k].lr_scale))
            return ct_error_set(CT_ERR_INVALID, "optimizer_step: group %d's lr (%g * lr_scale %g) is not finite", k, o->lr,
                                o->groups[k].lr_scale);

    /* Everything that can fail (state allocation, contiguous copies of strided
     * gradients) happens before the first parameter changes. */
    ct_status st = CT_OK;
    const ct_tensor **grads = calloc((size_t)(o->nparams ? o->nparams : 1), sizeof *grads);
    if (!grads) return ct_error_set(CT_ERR_NOMEM, "optimizer_step: out of memory");
    ct_frame_push();
    for (int i = 0; i < o->nparams && !st; i++) {
        if (!o->params[i]->grad) continue;
        st = o->kind == CT_OPTIM_SGD ? cti_optim_sgd_init_state(o, i) : cti_optim_adam_init_state(o, i);
        if (!st && !(grads[i] = ct_tensor_contiguous(o->params[i]->grad))) st = ct_last_status();
    }
    for (int k = 0; k < o->ngroups && !st; k++) {
        const ct_param_group *g = &o->groups[k];
        for (int i = g->first; i < g->first + g->n && !st; i++) {
            if (!grads[i]) continue;
            st = o->kind == CT_OPTIM_SGD ? cti_optim_sgd_update(o, i, g, grads[i]) : cti_optim_adam_update(o, i, g, grads[i]);
        }
    }
    ct_frame_pop();
    free(grads);
    if (st) return ct_error_prefix("optimizer_step: ");
    o->step++;
    ct_autocast_weights_changed(); /* low-precision copies of the old weights are stale */
    return o->hooks.after_step ? o->hooks.after_step(o, o->hooks.data) : CT_OK;
}

ct_status ct_optimizer_replace_params(ct_optimizer *o, int n, ct_tensor *const *params)
{
    if (!o || (n && !params)) return ct_error_set(CT_ERR_INVALID, "optimizer_replace_params: NULL argument");
    if (n != o->nparams)
        return ct_error_set(CT_ERR_INVALID, "optimizer_replace_params: %d parameters given for an optimizer of %d", n,
                            o->nparams);
    for (int i = 0; i < n; i++) {
        const ct_param_state *s = &o->state[i];
        if (s->exp_avg || s->exp_avg_sq || s->momentum_buffer || s->step)
            return ct_error_set(CT_ERR_INVALID,
                                "optimizer_replace_params: parameter %d has been stepped already; replace parameters "
                                "before the first step", i);
        ct_status st = check_param(&(ct_optimizer){.nparams = 0}, params[i], i, params, i);
        if (st) return ct_error_prefix("optimizer_replace_params: ");
    }
    for (int i = 0; i < n; i++) {
        ct_tensor_retain(params[i]);
        ct_tensor_release(o->params[i]);
        o->params[i] = params[i];
    }
    return CT_OK;
}

void ct_optimizer_set_hooks(ct_optimizer *o, const ct_optimizer_hooks *h)
{
    if (o) o->hooks = h ? *h : (ct_optimizer_hooks){0};
}

bool ct_optimizer_step_was_skipped(const ct_optimizer *o) { return o && o->last_skipped; }

void ct_optimizer_zero_grad(ct_optimizer *o)
{
    if (!o) return;
    if (o->hooks.skip_zero_grad && o->hooks.skip_zero_grad(o, o->hooks.data)) return;
    for (int i = 0; i < o->nparams; i++) {
        ct_tensor_release(o->params[i]->grad);
        o->params[i]->grad = NULL;
    }
}

ct_status ct_optimizer_set_lr(ct_optimizer *o, double lr)
{
    if (!o) return ct_error_set(CT_ERR_INVALID, "optimizer_set_lr: optimizer is NULL");
    if (cti_optim_check_nonneg("optimizer_set_lr", "lr", lr)) return CT_ERR_INVALID;
    o->lr = lr;
    return CT_OK;
}

double ct_optimizer_lr(const ct_optimizer *o) { return o ? o->lr : NAN; }
int64_t ct_optimizer_step_count(const ct_optimizer *o) { return o ? o->step : 0; }
const char *ct_optimizer_name(const ct_optimizer *o) { return o ? kind_names[o->kind] : "NULL"; }
int ct_optimizer_param_count(const ct_optimizer *o) { return o ? o->nparams : 0; }
int ct_optimizer_group_count(const ct_optimizer *o) { return o ? o->ngroups : 0; }

static bool param_index_ok(const char *op, const ct_optimizer *o, int i)
{
    if (!o) return ct_error_set(CT_ERR_INVALID, "%s: optimizer is NULL", op), false;
    if (i < 0 || i >= o->nparams)
        return ct_error_set(CT_ERR_INVALID, "%s: parameter index %d out of range [0, %d)", op, i, o->nparams), false;
    return true;
}

static bool group_index_ok(const char *op, const ct_optimizer *o, int g)
{
    if (!o) return ct_error_set(CT_ERR_INVALID, "%s: optimizer is NULL", op), false;
    if (g < 0 || g >= o->ngroups)
        return ct_error_set(CT_ERR_INVALID, "%s: group index %d out of range [0, %d)", op, g, o->ngroups), false;
    return true;
}

ct_tensor *ct_optimizer_param(const ct_optimizer *o, int i)
{
    return param_index_ok("optimizer_param", o, i) ? o->params[i] : NULL;
}

double ct_optimizer_group_lr(const ct_optimizer *o, int g)
{
    return group_index_ok("optimizer_group_lr", o, g) ? o->groups[g].lr_scale * o->lr : NAN;
}

double ct_optimizer_group_lr_scale(const ct_optimizer *o, int g)
{
    return group_index_ok("optimizer_group_lr_scale", o, g) ? o->groups[g].lr_scale : NAN;
}

double ct_optimizer_group_weight_decay(const ct_optimizer *o, int g)
{
    return group_index_ok("optimizer_group_weight_decay", o, g) ? o->groups[g].weight_decay : NAN;
}

ct_tensor *ct_optimizer_state(const ct_optimizer *o, int i, const char *key)
{
    const char *op = "optimizer_state";
    if (!param_index_ok(op, o, i)) return NULL;
    const ct_param_state *s = &o->state[i];
    const bool adam = o->kind != CT_OPTIM_SGD;
    if (key && adam && !strcmp(key, "exp_avg")) return s->exp_avg;
    if (key && adam && !strcmp(key, "exp_avg_sq")) return s->exp_avg_sq;
    if (key && !adam && o->hyper.momentum != 0 && !strcmp(key, "momentum_buffer")) return s->momentum_buffer;
    ct_error_set(CT_ERR_INVALID, "%s: %s keeps no state '%s' (it keeps %s)", op, kind_names[o->kind], key ? key : "NULL",
                 adam ? "exp_avg, exp_avg_sq" : o->hyper.momentum != 0 ? "momentum_buffer" : "none: momentum is 0");
    return NULL;
}

int64_t ct_optimizer_param_step(const ct_optimizer *o, int i)
{
    return param_index_ok("optimizer_param_step", o, i) ? o->state[i].step : -1;
}

void ct_optimizer_free(ct_optimizer *o)
{
    if (!o) return;
    for (int i = 0; i < o->nparams; i++) {
        ct_tensor_release(o->params[i]);
        ct_tensor_release(o->state[i].exp_avg);
        ct_tensor_release(o->state[i].exp_avg_sq);
        ct_tensor_release(o->state[i].momentum_buffer);
    }
    free(o->params);
    free(o->state);
    free(o->groups);
    free(o);
}
