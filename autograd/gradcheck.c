#include "autograd/gradcheck.h"

#include <math.h>
#include <stdlib.h>

#include "autograd/autograd.h"
#include "autograd/node.h"
#include "core/frame.h"
#include "core/philox.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

/* L = sum(fn(inputs) * w) in f64, without recording. */
static ct_status loss_at(ct_gradcheck_fn fn, ct_tensor *const *inputs, void *ctx, const ct_tensor *w, double *L)
{
    ct_status st = CT_OK;
    ct_frame_push();
    bool prev = ct_grad_set_enabled(false);
    ct_tensor *out = fn(inputs, ctx);
    ct_tensor *l = out ? ct_kernel_sum(ct_kernel_binary(CT_BINARY_MUL, out, w), NULL, 0, false) : NULL;
    if (l) *L = ct_tensor_item(l);
    else st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    ct_grad_set_enabled(prev);
    ct_frame_pop();
    return st;
}

/* Element j (row-major over the logical shape) of t as a multi-index. */
static void unravel(const ct_tensor *t, int64_t j, int64_t *idx)
{
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = j % t->shape[d];
        j /= t->shape[d];
    }
}

ct_status ct_gradcheck(ct_gradcheck_fn fn, int n, ct_tensor *const *inputs, void *ctx,
                       const ct_gradcheck_config *cfg)
{
    ct_gradcheck_config c = cfg ? *cfg : (ct_gradcheck_config){0};
    if (c.eps <= 0) c.eps = 1e-6;
    if (c.atol <= 0) c.atol = 1e-5;
    if (c.rtol <= 0) c.rtol = 1e-4;
    if (!c.seed) c.seed = 1;
    char d[200];
    for (int i = 0; i < n; i++) {
        if (!inputs[i]) return ct_error_set(CT_ERR_INVALID, "gradcheck: input %d is NULL", i);
        if (inputs[i]->dtype != CT_DTYPE_F64 || inputs[i]->device.type != CT_DEVICE_CPU)
            return ct_error_set(CT_ERR_INVALID, "gradcheck: input %d is %s; gradcheck needs f64 cpu tensors", i,
                                ct_tensor_describe(inputs[i], d, sizeof d));
    }
    ct_status st = CT_OK;
    ct_tensor *saved_grads[64] = {0};
    if (n > 64) return ct_error_set(CT_ERR_INVALID, "gradcheck: %d inputs (at most 64)", n);
    for (int i = 0; i < n; i++) {
        saved_grads[i] = inputs[i]->grad;
        inputs[i]->grad = NULL;
    }
    ct_frame_push();
    ct_tensor *out = fn(inputs, ctx);
    if (!out) {
        st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
        goto done;
    }
    ct_tensor *w = ct_tensor_empty(CT_DTYPE_F64, out->ndim, out->shape);
    if (!w) {
        st = ct_last_status();
        goto done;
    }
    ct_rng rng;
    ct_rng_init(&rng, c.seed);
    ct_rng_uniform_f64(&rng, ct_tensor_data(w), ct_tensor_numel(w), 0.5, 1.5);
    if (!out->requires_grad) {
        st = ct_error_set(CT_ERR_INVALID, "gradcheck: the output %s does not require grad",
                          ct_tensor_describe(out, d, sizeof d));
        goto done;
    }
    const char *op = out->grad_fn ? ct_node_op(out->grad_fn) : "output";
    if ((st = ct_backward_with(out, w, NULL))) goto done;
    for (int i = 0; i < n && !st; i++) {
        ct_tensor *x = inputs[i];
        if (!x->requires_grad) continue;
        int64_t numel = ct_tensor_numel(x), idx[CT_MAX_DIMS];
        for (int64_t j = 0; j < numel && !st; j++) {
            unravel(x, j, idx);
            double x0 = ct_tensor_get(x, idx), lp = 0, lm = 0;
            ct_tensor_set(x, idx, x0 + c.eps);
            st = loss_at(fn, inputs, ctx, w, &lp);
            ct_tensor_set(x, idx, x0 - c.eps);
            if (!st) st = loss_at(fn, inputs, ctx, w, &lm);
            ct_tensor_set(x, idx, x0);
            if (st) break;
            double num = (lp - lm) / (2 * c.eps);
            double ana = x->grad ? ct_tensor_get(x->grad, idx) : 0.0;
            if (!(fabs(ana - num) <= c.atol + c.rtol * fabs(num))) {
                st = ct_error_set(CT_ERR_INVALID,
                                  "gradcheck: %s: d/d input %d (%s) element %lld: backward gives %.10g, finite "
                                  "differences give %.10g",
                                  op, i, ct_tensor_describe(x, d, sizeof d), (long long)j, ana, num);
            }
        }
    }
done:
    ct_frame_pop();
    for (int i = 0; i < n; i++) {
        ct_tensor_release(inputs[i]->grad);
        inputs[i]->grad = saved_grads[i];
    }
    return st;
}
