/* Tensor-level layernorm / rmsnorm: argument checks, output allocation,
 * dispatch to the device kernels (kernels/cpu/norm.c). */
#include "kernels/norm.h"

#include <math.h>

#include "core/frame.h"
#include "core/threads.h"
#include "kernels/cpu/norm.h"
#include "kernels/dispatch.h"

static const ct_layernorm_fn layernorm_impl[CT_DEVICE_TYPE_COUNT] = {[CT_DEVICE_CPU] = ct_cpu_layernorm};
static const ct_layernorm_backward_fn layernorm_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = ct_cpu_layernorm_backward};
static const ct_rmsnorm_fn rmsnorm_impl[CT_DEVICE_TYPE_COUNT] = {[CT_DEVICE_CPU] = ct_cpu_rmsnorm};
static const ct_rmsnorm_backward_fn rmsnorm_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = ct_cpu_rmsnorm_backward};

static bool float_dtype(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16;
}

static ct_dtype stat_dtype(const ct_tensor *x) { return x->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32; }

/* A required input is NULL: keep the earlier failure's message when there is one. */
static ct_status null_input(const char *op, const char *name)
{
    if (ct_last_status() != CT_OK) return ct_last_status();
    return ct_error_set(CT_ERR_INVALID, "%s: %s is NULL", op, name);
}

static ct_status check_x(const char *op, const char *name, const ct_tensor *x)
{
    char a[200];
    if (!float_dtype(x->dtype) || x->ndim < 1)
        return ct_error_set(CT_ERR_INVALID, "%s: %s must be an f32, f64, bf16 or f16 tensor of shape (..., C), got %s",
                            op, name, ct_tensor_describe(x, a, sizeof a));
    return CT_OK;
}

/* w or b: absent, or a float vector of x's last size. */
static ct_status check_param(const char *op, const char *name, const ct_tensor *p, const ct_tensor *x)
{
    char a[200], b[200];
    if (p && (!float_dtype(p->dtype) || p->ndim != 1 || p->shape[0] != x->shape[x->ndim - 1]))
        return ct_error_set(CT_ERR_INVALID, "%s: %s %s must be an f32, f64, bf16 or f16 vector of shape [%lld] to match x %s",
                            op, name, ct_tensor_describe(p, a, sizeof a), (long long)x->shape[x->ndim - 1],
                            ct_tensor_describe(x, b, sizeof b));
    return CT_OK;
}

static ct_status check_eps(const char *op, double eps)
{
    if (!(eps >= 0) || isinf(eps)) return ct_error_set(CT_ERR_INVALID, "%s: eps must be finite and >= 0, got %g", op, eps);
    return CT_OK;
}

/* mean or rstd from the forward: x's shape without the last dim, stat dtype. */
static ct_status check_stat(const char *op, const char *name, const ct_tensor *s, const ct_tensor *x)
{
    char a[200], b[200];
    bool ok = s->dtype == stat_dtype(x) && s->ndim == x->ndim - 1;
    for (int d = 0; ok && d < s->ndim; d++) ok = s->shape[d] == x->shape[d];
    if (!ok)
        return ct_error_set(CT_ERR_INVALID, "%s: %s %s must be %s with x's shape without its last dim (x %s)", op,
                            name, ct_tensor_describe(s, a, sizeof a), ct_dtype_name(stat_dtype(x)),
                            ct_tensor_describe(x, b, sizeof b));
    return CT_OK;
}

static ct_status check_dy(const char *op, const ct_tensor *dy, const ct_tensor *x)
{
    char a[200], b[200];
    if (!ct_tensor_same_shape(dy, x) || dy->dtype != x->dtype)
        return ct_error_set(CT_ERR_INVALID, "%s: dy %s and x %s must have the same shape and dtype", op,
                            ct_tensor_describe(dy, a, sizeof a), ct_tensor_describe(x, b, sizeof b));
    return CT_OK;
}

/* t itself when contiguous or NULL, else a contiguous copy in the current frame;
 * clears *ok when the copy fails. */
static const ct_tensor *contiguous(const ct_tensor *t, bool *ok)
{
    if (!t || ct_tensor_is_contiguous(t)) return t;
    ct_tensor *c = ct_tensor_clone(t);
    if (!c) *ok = false;
    return c;
}

/* A new output in the current frame when wanted (out non-NULL), else NULL. */
static ct_tensor *make_out(ct_tensor **out, ct_device dev, ct_dtype dt, int ndim, const int64_t *shape, bool *ok)
{
    if (!out) return NULL;
    ct_tensor *t = ct_tensor_empty_on(dev, dt, ndim, shape);
    if (!t) *ok = false;
    return t;
}

static void set_out(ct_tensor **out, ct_tensor *t)
{
    if (out) *out = t;
}

ct_status ct_kernel_layernorm(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps,
                              ct_tensor **y, ct_tensor **mean, ct_tensor **rstd)
{
    const char *op = "layernorm";
    set_out(y, NULL), set_out(mean, NULL), set_out(rstd, NULL);
    if (!x) return null_input(op, "x");
    if (!y) return ct_error_set(CT_ERR_INVALID, "%s: the y output pointer is NULL", op);
    ct_status st = check_x(op, "x", x);
    if (!st) st = check_param(op, "w", w, x);
    if (!st) st = check_param(op, "b", b, x);
    if (!st) st = check_eps(op, eps);
    if (!st) st = ct_kernel_same_device(op, (const ct_tensor *[]){x, w, b}, 3);
    if (st) return st;
    ct_layernorm_fn fn = layernorm_impl[x->device.type];
    if (!fn) return ct_kernel_unavailable(op, x->device);
    bool ok = true;
    ct_tensor *yt = make_out(y, x->device, x->dtype, x->ndim, x->shape, &ok);
    ct_tensor *mt = make_out(mean, x->device, stat_dtype(x), x->ndim - 1, x->shape, &ok);
    ct_tensor *rt = make_out(rstd, x->device, stat_dtype(x), x->ndim - 1, x->shape, &ok);
    if (!ok) return ct_last_status();
    ct_threads_sync();
    ct_frame_push();
    const ct_tensor *xc = contiguous(x, &ok), *wc = contiguous(w, &ok), *bc = contiguous(b, &ok);
    st = ok ? fn(xc, wc, bc, eps, yt, mt, rt) : ct_last_status();
    ct_frame_pop();
    if (st) return st;
    set_out(y, yt), set_out(mean, mt), set_out(rstd, rt);
    return CT_OK;
}

ct_status ct_kernel_layernorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                       const ct_tensor *mean, const ct_tensor *rstd, ct_tensor **dx,
                                       ct_tensor **dw, ct_tensor **db)
{
    const char *op = "layernorm_backward";
    set_out(dx, NULL), set_out(dw, NULL), set_out(db, NULL);
    if (!dy) return null_input(op, "dy");
    if (!x) return null_input(op, "x");
    if (!mean) return null_input(op, "mean");
    if (!rstd) return null_input(op, "rstd");
    ct_status st = check_x(op, "x", x);
    if (!st) st = check_dy(op, dy, x);
    if (!st) st = check_param(op, "w", w, x);
    if (!st) st = check_stat(op, "mean", mean, x);
    if (!st) st = check_stat(op, "rstd", rstd, x);
    if (!st) st = ct_kernel_same_device(op, (const ct_tensor *[]){dy, x, w, mean, rstd}, 5);
    if (st) return st;
    ct_layernorm_backward_fn fn = layernorm_backward_impl[x->device.type];
    if (!fn) return ct_kernel_unavailable(op, x->device);
    bool ok = true;
    const int64_t *C = &x->shape[x->ndim - 1];
    ct_tensor *dxt = make_out(dx, x->device, x->dtype, x->ndim, x->shape, &ok);
    ct_tensor *dwt = w ? make_out(dw, x->device, w->dtype, 1, C, &ok) : NULL;
    ct_tensor *dbt = make_out(db, x->device, w ? w->dtype : x->dtype, 1, C, &ok);
    if (!ok) return ct_last_status();
    ct_threads_sync();
    ct_frame_push();
    const ct_tensor *dyc = contiguous(dy, &ok), *xc = contiguous(x, &ok), *wc = contiguous(w, &ok);
    const ct_tensor *mc = contiguous(mean, &ok), *rc = contiguous(rstd, &ok);
    st = ok ? fn(dyc, xc, wc, mc, rc, dxt, dwt, dbt) : ct_last_status();
    ct_frame_pop();
    if (st) return st;
    set_out(dx, dxt), set_out(dw, dwt), set_out(db, dbt);
    return CT_OK;
}

ct_status ct_kernel_rmsnorm(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor **y, ct_tensor **rstd)
{
    const char *op = "rmsnorm";
    set_out(y, NULL), set_out(rstd, NULL);
    if (!x) return null_input(op, "x");
    if (!y) return ct_error_set(CT_ERR_INVALID, "%s: the y output pointer is NULL", op);
    ct_status st = check_x(op, "x", x);
    if (!st) st = check_param(op, "w", w, x);
    if (!st) st = check_eps(op, eps);
    if (!st) st = ct_kernel_same_device(op, (const ct_tensor *[]){x, w}, 2);
    if (st) return st;
    ct_rmsnorm_fn fn = rmsnorm_impl[x->device.type];
    if (!fn) return ct_kernel_unavailable(op, x->device);
    bool ok = true;
    ct_tensor *yt = make_out(y, x->device, x->dtype, x->ndim, x->shape, &ok);
    ct_tensor *rt = make_out(rstd, x->device, stat_dtype(x), x->ndim - 1, x->shape, &ok);
    if (!ok) return ct_last_status();
    ct_threads_sync();
    ct_frame_push();
    const ct_tensor *xc = contiguous(x, &ok), *wc = contiguous(w, &ok);
    st = ok ? fn(xc, wc, eps, yt, rt) : ct_last_status();
    ct_frame_pop();
    if (st) return st;
    set_out(y, yt), set_out(rstd, rt);
    return CT_OK;
}

ct_status ct_kernel_rmsnorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                     const ct_tensor *rstd, ct_tensor **dx, ct_tensor **dw)
{
    const char *op = "rmsnorm_backward";
    set_out(dx, NULL), set_out(dw, NULL);
    if (!dy) return null_input(op, "dy");
    if (!x) return null_input(op, "x");
    if (!rstd) return null_input(op, "rstd");
    ct_status st = check_x(op, "x", x);
    if (!st) st = check_dy(op, dy, x);
    if (!st) st = check_param(op, "w", w, x);
    if (!st) st = check_stat(op, "rstd", rstd, x);
    if (!st) st = ct_kernel_same_device(op, (const ct_tensor *[]){dy, x, w, rstd}, 4);
    if (st) return st;
    ct_rmsnorm_backward_fn fn = rmsnorm_backward_impl[x->device.type];
    if (!fn) return ct_kernel_unavailable(op, x->device);
    bool ok = true;
    ct_tensor *dxt = make_out(dx, x->device, x->dtype, x->ndim, x->shape, &ok);
    ct_tensor *dwt = w ? make_out(dw, x->device, w->dtype, 1, &x->shape[x->ndim - 1], &ok) : NULL;
    if (!ok) return ct_last_status();
    ct_threads_sync();
    ct_frame_push();
    const ct_tensor *dyc = contiguous(dy, &ok), *xc = contiguous(x, &ok), *wc = contiguous(w, &ok);
    const ct_tensor *rc = contiguous(rstd, &ok);
    st = ok ? fn(dyc, xc, wc, rc, dxt, dwt) : ct_last_status();
    ct_frame_pop();
    if (st) return st;
    set_out(dx, dxt), set_out(dw, dwt);
    return CT_OK;
}
