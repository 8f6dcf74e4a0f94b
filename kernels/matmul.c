/* Tensor-level matmul and linear: argument checks, output allocation, device
 * dispatch. The math and the library calls live in kernels/cpu/matmul.c (OpenBLAS,
 * oneDNN) and kernels/cuda/matmul.cu (cuBLASLt). */
#include "kernels/matmul.h"

#include <string.h>

#include "core/frame.h"
#include "kernels/cpu/matmul.h"
#include "kernels/dispatch_internal.h"
#include "kernels/elementwise.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/matmul.h"
#endif

static const ct_matmul_fn matmul_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = cti_cpu_matmul,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_matmul,
#endif
};

/* y (R, O) = x (R, I) @ w (I, O) + bias (O) [then GELU]; y contiguous, bias contiguous or NULL. */
typedef ct_status (*ct_linear_fn)(ct_tensor *y, const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias,
                                  bool gelu);

/* The CPU's linear: what ct_linear does (bias copied into y, y += x @ w inside the
 * GEMM), then the GELU kernel in place. */
static ct_status linear_compose(ct_tensor *y, const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias,
                                bool gelu)
{
    if (bias && ct_tensor_copy_(y, bias)) return ct_last_status();
    ct_status st = ct_kernel_matmul_out(y, x, w, false, false, 1.0, bias ? 1.0 : 0.0);
    if (st) return st;
    return gelu ? ct_kernel_unary_out(CT_UNARY_GELU_TANH, y, y) : CT_OK;
}

static const ct_linear_fn linear_impl[CT_DEVICE_TYPE_COUNT] = {
    [CT_DEVICE_CPU] = linear_compose,
#ifdef CT_HAVE_CUDA
    [CT_DEVICE_CUDA] = cti_cuda_linear,
#endif
};

/* Checks a and b and writes the result's shape (bcast..., M, N) into *nd, shape. */
static ct_status matmul_check(const char *op, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, int *nd,
                              int64_t *shape)
{
    char da[200], db[200];
    const ct_tensor *ts[2] = {a, b};
    ct_status st = cti_kernel_same_device(op, ts, 2);
    if (st) return st;
    if (a->dtype != b->dtype)
        return ct_error_set(CT_ERR_INVALID, "%s: dtype mismatch: a %s, b %s (both must have one dtype)", op,
                            ct_tensor_describe(a, da, sizeof da), ct_tensor_describe(b, db, sizeof db));
    if (!cti_kernel_is_float(a->dtype))
        return ct_error_set(CT_ERR_INVALID, "%s: unsupported dtype %s for a %s, b %s (f32, f64, bf16, f16)", op,
                            ct_dtype_name(a->dtype), ct_tensor_describe(a, da, sizeof da),
                            ct_tensor_describe(b, db, sizeof db));
    if (a->ndim < 2 || b->ndim < 2)
        return ct_error_set(CT_ERR_INVALID, "%s: a %s and b %s must both have at least 2 dims", op,
                            ct_tensor_describe(a, da, sizeof da), ct_tensor_describe(b, db, sizeof db));
    int64_t m = a->shape[a->ndim - (ta ? 1 : 2)], ka = a->shape[a->ndim - (ta ? 2 : 1)];
    int64_t kb = b->shape[b->ndim - (tb ? 1 : 2)], n = b->shape[b->ndim - (tb ? 2 : 1)];
    if (ka != kb)
        return ct_error_set(CT_ERR_INVALID,
                            "%s: inner dimensions differ: a %s%s has K=%lld, b %s%s has K=%lld", op,
                            ct_tensor_describe(a, da, sizeof da), ta ? " (transposed)" : "", (long long)ka,
                            ct_tensor_describe(b, db, sizeof db), tb ? " (transposed)" : "", (long long)kb);
    int nb;
    if (!ct_broadcast_shape(a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nb, shape)) {
        char ba[160], bb[160];
        return ct_error_set(CT_ERR_INVALID, "%s: batch dims %s of a %s and %s of b %s do not broadcast", op,
                            ct_shape_str(a->ndim - 2, a->shape, ba, sizeof ba), ct_tensor_describe(a, da, sizeof da),
                            ct_shape_str(b->ndim - 2, b->shape, bb, sizeof bb), ct_tensor_describe(b, db, sizeof db));
    }
    shape[nb] = m;
    shape[nb + 1] = n;
    *nd = nb + 2;
    return CT_OK;
}

static ct_status matmul_run(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb,
                            double alpha, double beta)
{
    ct_matmul_fn fn = matmul_impl[a->device.type];
    if (!fn) return cti_kernel_unavailable("matmul", a->device);
    return fn(out, a, b, ta, tb, alpha, beta);
}

ct_tensor *ct_kernel_matmul(const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b)
{
    if (!a || !b) return NULL;
    int nd;
    int64_t shape[CT_MAX_DIMS];
    if (matmul_check("matmul", a, b, trans_a, trans_b, &nd, shape)) return NULL;
    ct_tensor *out = ct_tensor_empty_on(a->device, a->dtype, nd, shape);
    if (!out) return NULL;
    if (matmul_run(out, a, b, trans_a, trans_b, 1.0, 0.0)) return NULL;
    return out;
}

ct_status ct_kernel_matmul_out(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b,
                               double alpha, double beta)
{
    if (!out || !a || !b) {
        ct_status prev = ct_last_status();
        return prev ? prev : ct_error_set(CT_ERR_INVALID, "matmul_out: NULL tensor (out, a or b)");
    }
    int nd;
    int64_t shape[CT_MAX_DIMS];
    ct_status st = matmul_check("matmul_out", a, b, trans_a, trans_b, &nd, shape);
    if (st) return st;
    char d0[200], da[200], db[200], sh[160];
    const ct_tensor *ts[2] = {out, a};
    if ((st = cti_kernel_same_device("matmul_out", ts, 2))) return st;
    bool shape_ok = out->ndim == nd;
    for (int d = 0; shape_ok && d < nd; d++) shape_ok = out->shape[d] == shape[d];
    bool f32_out = out->dtype == CT_DTYPE_F32 && (a->dtype == CT_DTYPE_BF16 || a->dtype == CT_DTYPE_F16);
    if (!shape_ok || (out->dtype != a->dtype && !f32_out))
        return ct_error_set(CT_ERR_INVALID, "matmul_out: out %s should be %s%s for a %s @ b %s",
                            ct_tensor_describe(out, d0, sizeof d0), ct_dtype_name(a->dtype),
                            ct_shape_str(nd, shape, sh, sizeof sh), ct_tensor_describe(a, da, sizeof da),
                            ct_tensor_describe(b, db, sizeof db));
    if (!ct_tensor_is_contiguous(out))
        return ct_error_set(CT_ERR_INVALID, "matmul_out: out %s must be contiguous (a %s, b %s)",
                            ct_tensor_describe(out, d0, sizeof d0), ct_tensor_describe(a, da, sizeof da),
                            ct_tensor_describe(b, db, sizeof db));
    /* the GEMM reads a and b while it writes out */
    if (out->storage == a->storage || out->storage == b->storage)
        return ct_error_set(CT_ERR_INVALID, "matmul_out: out %s shares storage with a %s or b %s",
                            ct_tensor_describe(out, d0, sizeof d0), ct_tensor_describe(a, da, sizeof da),
                            ct_tensor_describe(b, db, sizeof db));
    return matmul_run(out, a, b, trans_a, trans_b, alpha, beta);
}

ct_tensor *ct_kernel_linear(const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias, bool gelu)
{
    if (!x || !w) {
        cti_kernel_null_input("linear", x ? "w" : "x");
        return NULL;
    }
    char dx[200], dw[200], db[200];
    const ct_tensor *ts[3] = {x, w, bias};
    if (cti_kernel_same_device("linear", ts, 3)) return NULL;
    if (!cti_kernel_is_float(x->dtype) || x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[0] ||
        (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[1])) || x->dtype != w->dtype ||
        (bias && bias->dtype != w->dtype)) {
        ct_error_set(CT_ERR_INVALID,
                     "linear: x %s, w %s, bias %s: need x (..., in), w (in, out), bias (out) or NULL, one dtype of "
                     "f32, f64, bf16 or f16",
                     ct_tensor_describe(x, dx, sizeof dx), ct_tensor_describe(w, dw, sizeof dw),
                     bias ? ct_tensor_describe(bias, db, sizeof db) : "NULL");
        return NULL;
    }
    ct_linear_fn fn = linear_impl[x->device.type];
    if (!fn) {
        cti_kernel_unavailable("linear", x->device);
        return NULL;
    }
    const int64_t in = w->shape[0], out = w->shape[1];
    ct_tensor *x2 = ct_tensor_reshape((ct_tensor *)x, CT_SHAPE(-1, in));
    const ct_tensor *bc = bias ? cti_kernel_contiguous(bias) : NULL;
    if (!x2 || (bias && !bc)) return NULL;
    ct_tensor *y2 = ct_tensor_empty_on(x->device, x->dtype, CT_SHAPE(x2->shape[0], out));
    if (!y2) return NULL;
    if (fn(y2, x2, w, bc, gelu)) {
        if (strncmp(ct_last_error(), "linear", 6) != 0) ct_error_prefix("linear: ");
        return NULL;
    }
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = out;
    return ct_tensor_view(y2, x->ndim, shape);
}
