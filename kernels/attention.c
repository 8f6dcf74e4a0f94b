#include "kernels/attention.h"

#include <math.h>

#include "kernels/cpu/attention.h"
#include "kernels/dispatch_internal.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/attention.h"
#endif

static const ct_attention_fn attention_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_attention,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_attention,
#endif
};
static const ct_attention_backward_fn attention_backward_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_attention_backward,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_attention_backward,
#endif
};

/* Checks q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv): ranks, matching dims, one float dtype,
 * one device, a usable scale. On failure records a message naming op and operands. */
static ct_status attention_check(const char *op, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                 double scale)
{
    char a[200], b[200], c[200];
    ct_tensor_describe(q, a, sizeof a), ct_tensor_describe(k, b, sizeof b), ct_tensor_describe(v, c, sizeof c);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return ct_error_set(CT_ERR_INVALID, "%s: expected 4-d q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv); got q %s, k %s, v %s",
                            op, a, b, c);
    if (q->shape[0] != k->shape[0] || q->shape[0] != v->shape[0] || q->shape[1] != k->shape[1] ||
        q->shape[1] != v->shape[1] || k->shape[2] != v->shape[2] || q->shape[3] != k->shape[3])
        return ct_error_set(CT_ERR_INVALID,
                            "%s: shapes do not fit q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv): q %s, k %s, v %s", op, a, b,
                            c);
    if (q->shape[3] < 1)
        return ct_error_set(CT_ERR_INVALID, "%s: head dim D must be >= 1: q %s, k %s, v %s", op, a, b, c);
    if (!cti_kernel_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return ct_error_set(CT_ERR_INVALID, "%s: q, k, v need one dtype among f32, f64, bf16, f16: q %s, k %s, v %s",
                            op, a, b, c);
    if (isnan(scale) || isinf(scale))
        return ct_error_set(CT_ERR_INVALID, "%s: scale must be finite (<= 0 for 1/sqrt(D)), got %g (q %s)", op, scale,
                            a);
    const ct_tensor *ts[3] = {q, k, v};
    return cti_kernel_same_device(op, ts, 3);
}

/* t is (d0, d1, d2, d3) with the given dtype and q's device, any strides. */
static ct_status attention_check_result(const char *op, const char *what, const ct_tensor *t, const ct_tensor *q,
                                        int ndim, const int64_t *want, ct_dtype dt)
{
    char a[200], b[200];
    bool ok = t && t->ndim == ndim && t->dtype == dt && ct_device_equal(t->device, q->device);
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (ok) return CT_OK;
    if (!t) return ct_error_set(CT_ERR_INVALID, "%s: NULL %s", op, what);
    char w[96];
    int n = snprintf(w, sizeof w, "(%lld,%lld,%lld", (long long)want[0], (long long)want[1], (long long)want[2]);
    snprintf(w + n, sizeof w - (size_t)n, ndim == 4 ? ",%lld)" : ")", ndim == 4 ? (long long)want[3] : 0LL);
    ct_tensor_describe(t, a, sizeof a), ct_tensor_describe(q, b, sizeof b);
    return ct_error_set(CT_ERR_INVALID, "%s: %s is %s; q %s needs it %s %s on q's device", op, what, a, b, w,
                        ct_dtype_name(dt));
}

ct_status ct_kernel_attention_into(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                   double scale, ct_tensor *out, ct_tensor *lse)
{
    const char *op = "attention";
    if (!q || !k || !v) return ct_last_status() ? ct_last_status() : ct_error_set(CT_ERR_INVALID, "%s: NULL input", op);
    ct_status st = attention_check(op, q, k, v, scale);
    if (st) return st;
    const int64_t want[4] = {q->shape[0], q->shape[1], q->shape[2], v->shape[3]};
    if ((st = attention_check_result(op, "out", out, q, 4, want, q->dtype))) return st;
    if (lse && (st = attention_check_result(op, "lse", lse, q, 3, want, cti_kernel_stat_dtype(q->dtype)))) return st;
    ct_attention_fn fn = attention_impl[q->device.type];
    if (!fn) return cti_kernel_unavailable(op, q->device);
    return fn(q, k, v, causal, scale, out, lse);
}

ct_tensor *ct_kernel_attention(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                               double scale, ct_tensor **lse)
{
    if (!q || !k || !v) return NULL;
    if (attention_check("attention", q, k, v, scale)) return NULL;
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], Dv = v->shape[3];
    ct_tensor *out = ct_tensor_empty_on(q->device, q->dtype, CT_SHAPE(B, H, T, Dv));
    ct_tensor *l = lse ? ct_tensor_empty_on(q->device, cti_kernel_stat_dtype(q->dtype), CT_SHAPE(B, H, T)) : NULL;
    if (!out || (lse && !l)) return NULL;
    if (ct_kernel_attention_into(q, k, v, causal, scale, out, l)) return NULL;
    if (lse) *lse = l;
    return out;
}

ct_status ct_kernel_attention_backward_into(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                            const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                            bool causal, double scale, ct_tensor *dq, ct_tensor *dk, ct_tensor *dv)
{
    const char *op = "attention_backward";
    if (!dout || !q || !k || !v || !out || !lse) {
        if (ct_last_status() == CT_OK)
            return ct_error_set(CT_ERR_INVALID, "%s: NULL tensor among dout, q, k, v, out, lse", op);
        return ct_last_status();
    }
    ct_status st = attention_check(op, q, k, v, scale);
    if (st) return st;
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], Dv = v->shape[3];
    char a[200], b[200], c[200], d[200];
    ct_tensor_describe(dout, a, sizeof a), ct_tensor_describe(out, b, sizeof b);
    ct_tensor_describe(lse, c, sizeof c), ct_tensor_describe(q, d, sizeof d);
    const int64_t want[4] = {B, H, T, Dv};
    bool shapes_ok = dout->ndim == 4 && out->ndim == 4 && lse->ndim == 3;
    for (int i = 0; shapes_ok && i < 4; i++) shapes_ok = dout->shape[i] == want[i] && out->shape[i] == want[i];
    for (int i = 0; shapes_ok && i < 3; i++) shapes_ok = lse->shape[i] == want[i];
    if (!shapes_ok)
        return ct_error_set(CT_ERR_INVALID,
                            "%s: expected dout and out (B,H,T,Dv) and lse (B,H,T) matching q %s; got dout %s, out %s, lse %s",
                            op, d, a, b, c);
    if (dout->dtype != q->dtype || out->dtype != q->dtype ||
        (lse->dtype != CT_DTYPE_F32 && lse->dtype != CT_DTYPE_F64))
        return ct_error_set(CT_ERR_INVALID, "%s: dout and out need q's dtype and lse f32 or f64: q %s, dout %s, out %s, lse %s",
                            op, d, a, b, c);
    const ct_tensor *ts[6] = {dout, q, k, v, out, lse};
    if ((st = cti_kernel_same_device(op, ts, 6))) return st;
    ct_attention_backward_fn fn = attention_backward_impl[q->device.type];
    if (!fn) return cti_kernel_unavailable(op, q->device);
    if ((st = attention_check_result(op, "dq", dq, q, 4, q->shape, q->dtype)) ||
        (st = attention_check_result(op, "dk", dk, q, 4, k->shape, q->dtype)) ||
        (st = attention_check_result(op, "dv", dv, q, 4, v->shape, q->dtype)))
        return st;
    return fn(dout, q, k, v, out, lse, causal, scale, dq, dk, dv);
}

ct_status ct_kernel_attention_backward(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                       const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse, bool causal,
                                       double scale, ct_tensor **dq, ct_tensor **dk, ct_tensor **dv)
{
    if (!dq || !dk || !dv)
        return ct_error_set(CT_ERR_INVALID, "attention_backward: NULL result pointer for dq, dk or dv");
    if (!q || !k || !v) return ct_kernel_attention_backward_into(dout, q, k, v, out, lse, causal, scale, NULL, NULL, NULL);
    ct_tensor *gq = ct_tensor_empty_on(q->device, q->dtype, q->ndim, q->shape);
    ct_tensor *gk = ct_tensor_empty_on(k->device, k->dtype, k->ndim, k->shape);
    ct_tensor *gv = ct_tensor_empty_on(v->device, v->dtype, v->ndim, v->shape);
    if (!gq || !gk || !gv) return ct_last_status();
    ct_status st = ct_kernel_attention_backward_into(dout, q, k, v, out, lse, causal, scale, gq, gk, gv);
    if (st) return st;
    *dq = gq, *dk = gk, *dv = gv;
    return CT_OK;
}
