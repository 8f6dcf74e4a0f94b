/* Tensor-level layernorm / rmsnorm: argument checks, output allocation,
 * dispatch to the device kernels (kernels/cpu/norm.c). */
#include "kernels/norm.h"

#include <math.h>

#include "core/frame.h"
#include "core/threads_internal.h"
#include "kernels/cpu/norm.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/norm.h"
#define CUDA_SLOT(fn) [CT_DEVICE_CUDA] = fn,
#else
#define CUDA_SLOT(fn)
#endif
#include "kernels/dispatch_internal.h"

static const ct_layernorm_fn layernorm_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_layernorm, CUDA_SLOT(cti_cuda_layernorm)};
static const ct_layernorm_backward_fn layernorm_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_layernorm_backward, CUDA_SLOT(cti_cuda_layernorm_backward)};
static const ct_rmsnorm_fn rmsnorm_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_rmsnorm, CUDA_SLOT(cti_cuda_rmsnorm)};
static const ct_rmsnorm_backward_fn rmsnorm_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_rmsnorm_backward, CUDA_SLOT(cti_cuda_rmsnorm_backward)};

/* w or b: absent, or a float vector of x's last size. */
static ct_status check_param(const char *op, const char *name, const ct_tensor *p, const ct_tensor *x)
{
    char a[200], b[200];
    if (p && (!cti_kernel_is_float(p->dtype) || p->ndim != 1 || p->shape[0] != x->shape[x->ndim - 1]))
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
    if (s->dtype != cti_kernel_stat_dtype(x->dtype) || !cti_kernel_is_row_shaped(s, x))
        return ct_error_set(CT_ERR_INVALID, "%s: %s %s must be %s with x's shape without its last dim (x %s)", op,
                            name, ct_tensor_describe(s, a, sizeof a), ct_dtype_name(cti_kernel_stat_dtype(x->dtype)),
                            ct_tensor_describe(x, b, sizeof b));
    return CT_OK;
}

/* cti_kernel_contiguous, clearing *ok when the copy fails. */
static const ct_tensor *contiguous(const ct_tensor *t, bool *ok)
{
    const ct_tensor *c = cti_kernel_contiguous(t);
    if (t && !c) *ok = false;
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
    if (!x) return cti_kernel_null_input(op, "x");
    if (!y) return ct_error_set(CT_ERR_INVALID, "%s: the y output pointer is NULL", op);
    ct_status st = cti_kernel_check_float_rows(op, "x", x, "C");
    if (!st) st = check_param(op, "w", w, x);
    if (!st) st = check_param(op, "b", b, x);
    if (!st) st = check_eps(op, eps);
    if (!st) st = cti_kernel_same_device(op, (const ct_tensor *[]){x, w, b}, 3);
    if (st) return st;
    ct_layernorm_fn fn = layernorm_impl[x->device.type];
    if (!fn) return cti_kernel_unavailable(op, x->device);
    bool ok = true;
    ct_tensor *yt = make_out(y, x->device, x->dtype, x->ndim, x->shape, &ok);
    ct_tensor *mt = make_out(mean, x->device, cti_kernel_stat_dtype(x->dtype), x->ndim - 1, x->shape, &ok);
    ct_tensor *rt = make_out(rstd, x->device, cti_kernel_stat_dtype(x->dtype), x->ndim - 1, x->shape, &ok);
    if (!ok) return ct_last_status();
    cti_threads_sync();
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
    if (!dy) return cti_kernel_null_input(op, "dy");
    if (!x) return cti_kernel_null_input(op, "x");
    if (!mean) return cti_kernel_null_input(op, "mean");
    if (!rstd) return cti_kernel_null_input(op, "rstd");
    ct_status st = cti_kernel_check_float_rows(op, "x", x, "C");
    if (!st) st = cti_kernel_check_same(op, "dy", dy, "x", x);
    if (!st) st = check_param(op, "w", w, x);
    if (!st) st = check_stat(op, "mean", mean, x);
    if (!st) st = check_stat(op, "rstd", rstd, x);
    if (!st) st = cti_kernel_same_device(op, (const ct_tensor *[]){dy, x, w, mean, rstd}, 5);
    if (st) return st;
    ct_layernorm_backward_fn fn = layernorm_backward_impl[x->device.type];
    if (!fn) return cti_kernel_unavailable(op, x->device);
    bool ok = true;
    const int64_t *C = &x->shape[x->ndim - 1];
    ct_tensor *dxt = make_out(dx, x->device, x->dtype, x->ndim, x->shape, &ok);
    ct_tensor *dwt = w ? make_out(dw, x->device, w->dtype, 1, C, &ok) : NULL;
    ct_tensor *dbt = make_out(db, x->device, w ? w->dtype : x->dtype, 1, C, &ok);
    if (!ok) return ct_last_status();
    cti_threads_sync();
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
    if (!x) return cti_kernel_null_input(op, "x");
    if (!y) return ct_error_set(CT_ERR_INVALID, "%s: the y output pointer is NULL", op);
    ct_status st = cti_kernel_check_float_rows(op, "x", x, "C");
    if (!st) st = check_param(op, "w", w, x);
    if (!st) st = check_eps(op, eps);
    if (!st) st = cti_kernel_same_device(op, (const ct_tensor *[]){x, w}, 2);
    if (st) return st;
    ct_rmsnorm_fn fn = rmsnorm_impl[x->device.type];
    if (!fn) return cti_kernel_unavailable(op, x->device);
    bool ok = true;
    ct_tensor *yt = make_out(y, x->device, x->dtype, x->ndim, x->shape, &ok);
    ct_tensor *rt = make_out(rstd, x->device, cti_kernel_stat_dtype(x->dtype), x->ndim - 1, x->shape, &ok);
    if (!ok) return ct_last_status();
    cti_threads_sync();
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
    if (!dy) return cti_kernel_null_input(op, "dy");
    if (!x) return cti_kernel_null_input(op, "x");
    if (!rstd) return cti_kernel_null_input(op, "rstd");
    ct_status st = cti_kernel_check_float_rows(op, "x", x, "C");
    if (!st) st = cti_kernel_check_same(op, "dy", dy, "x", x);
    if (!st) st = check_param(op, "w", w, x);
    if (!st) st = check_stat(op, "rstd", rstd, x);
    if (!st) st = cti_kernel_same_device(op, (const ct_tensor *[]){dy, x, w, rstd}, 4);
    if (st) return st;
    ct_rmsnorm_backward_fn fn = rmsnorm_backward_impl[x->device.type];
    if (!fn) return cti_kernel_unavailable(op, x->device);
    bool ok = true;
    ct_tensor *dxt = make_out(dx, x->device, x->dtype, x->ndim, x->shape, &ok);
    ct_tensor *dwt = w ? make_out(dw, x->device, w->dtype, 1, &x->shape[x->ndim - 1], &ok) : NULL;
    if (!ok) return ct_last_status();
    cti_threads_sync();
    ct_frame_push();
    const ct_tensor *dyc = contiguous(dy, &ok), *xc = contiguous(x, &ok), *wc = contiguous(w, &ok);
    const ct_tensor *rc = contiguous(rstd, &ok);
    st = ok ? fn(dyc, xc, wc, rc, dxt, dwt) : ct_last_status();
    ct_frame_pop();
    if (st) return st;
    set_out(dx, dxt), set_out(dw, dwt);
    return CT_OK;
}
