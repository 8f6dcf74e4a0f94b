#include "kernels/optim.h"

#include <math.h>
#include <stdio.h>

#include "kernels/cpu/optim.h"
#include "kernels/dispatch_internal.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/optim.h"
#endif

static const ct_adamw_fn adamw_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_adamw,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_adamw,
#endif
};
static const ct_sgd_fn sgd_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_sgd,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_sgd,
#endif
};

/* The state tensors ts[1..n) must match ts[0] (the parameter): shape, dtype f32/f64,
 * contiguity, device. names[i] labels ts[i] in the message. */
static ct_status optim_check_tensors(const char *op, int n, const ct_tensor *const *ts, const char *const *names)
{
    char list[1024], d[200];
    int len = 0;
    for (int i = 0; i < n && len < (int)sizeof list; i++)
        len += snprintf(list + len, sizeof list - (size_t)len, "%s%s %s", i ? ", " : "", names[i],
                        ct_tensor_describe(ts[i], d, sizeof d));
    const char *why = NULL;
    for (int i = 0; i < n && !why; i++)
        if (!ts[i]) why = "NULL tensor";
    const ct_tensor *p = ts[0];
    if (!why && p->dtype != CT_DTYPE_F32 && p->dtype != CT_DTYPE_F64) why = "parameters must be f32 or f64";
    for (int i = 1; i < n && !why; i++) {
        if (!ct_tensor_same_shape(p, ts[i])) why = "shapes differ";
        else if (ts[i]->dtype != p->dtype) why = "dtypes differ";
    }
    for (int i = 0; i < n && !why; i++)
        if (!ct_tensor_is_contiguous(ts[i])) why = "every tensor must be contiguous";
    if (why) return ct_error_set(CT_ERR_INVALID, "%s: %s: %s", op, why, list);
    return cti_kernel_same_device(op, ts, n);
}

static ct_status adamw_check(const char *op, const ct_tensor *param, const ct_tensor *grad, const ct_tensor *m,
                             const ct_tensor *v, const ct_adamw_hparams *h)
{
    const ct_tensor *ts[4] = {param, grad, m, v};
    static const char *const names[4] = {"param", "grad", "m", "v"};
    ct_status st = optim_check_tensors(op, 4, ts, names);
    if (st) return st;
    char d[200];
    ct_tensor_describe(param, d, sizeof d);
    if (!h) return ct_error_set(CT_ERR_INVALID, "%s: NULL hparams (param %s)", op, d);
    if (h->step < 1)
        return ct_error_set(CT_ERR_INVALID, "%s: step must be >= 1 (1-based, for bias correction), got %lld (param %s)",
                            op, (long long)h->step, d);
    if (!(h->lr >= 0) || !(h->eps >= 0) || !(h->weight_decay >= 0) || !(h->beta1 >= 0 && h->beta1 < 1) ||
        !(h->beta2 >= 0 && h->beta2 < 1) || isinf(h->lr) || isinf(h->eps) || isinf(h->weight_decay))
        return ct_error_set(CT_ERR_INVALID,
                            "%s: need finite lr, eps, weight_decay >= 0 and 0 <= beta1, beta2 < 1; got lr %g eps %g "
                            "weight_decay %g betas (%g, %g) (param %s)",
                            op, h->lr, h->eps, h->weight_decay, h->beta1, h->beta2, d);
    return CT_OK;
}

ct_status ct_kernel_adamw(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
                          const ct_adamw_hparams *h)
{
    ct_status st = adamw_check("adamw", param, grad, m, v, h);
    if (st) return st;
    ct_adamw_fn fn = adamw_impl[param->device.type];
    if (!fn) return cti_kernel_unavailable("adamw", param->device);
    return fn(param, grad, m, v, h);
}

ct_status ct_kernel_adamw_list(int n, ct_tensor *const *params, const ct_tensor *const *grads, ct_tensor *const *m,
                               ct_tensor *const *v, const ct_adamw_hparams *h)
{
    if (n < 0 || (n > 0 && (!params || !grads || !m || !v)))
        return ct_error_set(CT_ERR_INVALID, "adamw_list: need n >= 0 and four arrays of n tensors (n = %d)", n);
    /* all checks first, so a bad entry leaves every tensor untouched */
    for (int i = 0; i < n; i++) {
        char op[48];
        snprintf(op, sizeof op, "adamw_list[%d]", i);
        ct_status st = adamw_check(op, params[i], grads[i], m[i], v[i], h);
        if (st) return st;
        if (!adamw_impl[params[i]->device.type]) return cti_kernel_unavailable(op, params[i]->device);
    }
#ifdef CT_HAVE_CUDA
    /* a list on one GPU: one launch per group of tensors instead of one per tensor */
    bool one_gpu = n > 0;
    for (int i = 0; i < n && one_gpu; i++)
        one_gpu = params[i]->device.type == CT_DEVICE_CUDA && params[i]->device.index == params[0]->device.index;
    if (one_gpu) return cti_cuda_adamw_list(n, params, grads, m, v, h);
#endif
    for (int i = 0; i < n; i++) {
        ct_status st = adamw_impl[params[i]->device.type](params[i], grads[i], m[i], v[i], h);
        if (st) return st;
    }
    return CT_OK;
}

ct_status ct_kernel_sgd(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf, const ct_sgd_hparams *h)
{
    const char *op = "sgd";
    char d[200];
    ct_tensor_describe(param, d, sizeof d);
    if (!h) return ct_error_set(CT_ERR_INVALID, "%s: NULL hparams (param %s)", op, d);
    const bool use_buf = h->momentum != 0;
    const ct_tensor *ts[3] = {param, grad, momentum_buf};
    static const char *const names[3] = {"param", "grad", "momentum_buf"};
    ct_status st = optim_check_tensors(op, use_buf ? 3 : 2, ts, names);
    if (st) return st;
    if (!(h->lr >= 0) || !(h->momentum >= 0) || !(h->weight_decay >= 0) || isinf(h->lr) || isinf(h->momentum) ||
        isinf(h->weight_decay) || isnan(h->dampening) || isinf(h->dampening))
        return ct_error_set(CT_ERR_INVALID,
                            "%s: need finite lr, momentum, weight_decay >= 0 and a finite dampening; got lr %g momentum %g "
                            "weight_decay %g dampening %g (param %s)",
                            op, h->lr, h->momentum, h->weight_decay, h->dampening, d);
    if (h->nesterov && (h->momentum <= 0 || h->dampening != 0))
        return ct_error_set(CT_ERR_INVALID, "%s: nesterov needs momentum > 0 and dampening 0; got momentum %g dampening %g (param %s)",
                            op, h->momentum, h->dampening, d);
    ct_sgd_fn fn = sgd_impl[param->device.type];
    if (!fn) return cti_kernel_unavailable(op, param->device);
    return fn(param, grad, use_buf ? momentum_buf : NULL, h);
}
