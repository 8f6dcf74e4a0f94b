/* ctrain — the plain CUDA references for matmul and linear (kernels/cuda/matmul.h):
 * one thread per output element, sums in double in k order, no tiles and no
 * libraries, so tests can hold the cuBLASLt path against two independent codes
 * (this and the CPU reference). Written with its own index arithmetic. */
#include "kernels/cuda/matmul.h"

#include "kernels/cuda/common.cuh"

typedef struct ref_geom {
    int nb;
    int64_t bshape[CT_MAX_DIMS];
    int64_t as[CT_MAX_DIMS], bs[CT_MAX_DIMS], os[CT_MAX_DIMS]; /* batch strides, 0 for a broadcast dim */
    int64_t M, N, K;
    int64_t a_m, a_k, b_k, b_n, o_m, o_n;
    int64_t total; /* batches * M * N */
} ref_geom;

/* v rounded once from double to T (the bits ct_scalar_store gives): bf16/f16 straight
 * from double, never through float, which would round twice. */
template <typename T> __device__ __forceinline__ void st_f64(T *p, double v) { *p = (T)v; }
template <> __device__ __forceinline__ void st_f64<cti_bf16>(cti_bf16 *p, double v) { p->bits = cti_f64_to_bf16_bits(v); }
template <> __device__ __forceinline__ void st_f64<cti_f16>(cti_f16 *p, double v) { p->bits = cti_f64_to_f16_bits(v); }

// out (B..., M, N) = alpha * sum_k op(a)[.., m, k] op(b)[.., k, n] + beta * out (beta = 0: out not read).
template <typename TI, typename TO>
__global__ void matmul_ref_kernel(TO *out, const TI *a, const TI *b, ref_geom g, double alpha, double beta)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < g.total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i % g.N, m = (i / g.N) % g.M;
        int64_t rem = i / (g.N * g.M), ao = 0, bo = 0, oo = 0;
        for (int d = g.nb - 1; d >= 0; d--) {
            const int64_t idx = rem % g.bshape[d];
            rem /= g.bshape[d];
            ao += idx * g.as[d];
            bo += idx * g.bs[d];
            oo += idx * g.os[d];
        }
        double acc = 0;
        for (int64_t k = 0; k < g.K; k++)
            acc += (double)ld<TI>(a + ao + m * g.a_m + k * g.a_k) * (double)ld<TI>(b + bo + k * g.b_k + n * g.b_n);
        TO *p = out + oo + m * g.o_m + n * g.o_n;
        double v = alpha * acc;
        if (beta != 0) v += beta * (double)ld<TO>(p);
        st_f64<TO>(p, v);
    }
}

template <typename TI>
static ct_status matmul_ref_launch(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, const ref_geom &g,
                                   double alpha, double beta, cudaStream_t s)
{
    const unsigned blocks = cti_cu_blocks(g.total, 128);
    if (out->dtype == CT_DTYPE_F32 && a->dtype != CT_DTYPE_F32)
        matmul_ref_kernel<TI, float><<<blocks, 128, 0, s>>>(cti_cu_ptr<float>(out), cti_cu_ptr<TI>(a),
                                                            cti_cu_ptr<TI>(b), g, alpha, beta);
    else
        matmul_ref_kernel<TI, TI><<<blocks, 128, 0, s>>>(cti_cu_ptr<TI>(out), cti_cu_ptr<TI>(a), cti_cu_ptr<TI>(b),
                                                         g, alpha, beta);
    return cti_cuda_launched("matmul_ref", out);
}

extern "C" ct_status cti_cuda_matmul_ref(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                                         bool trans_b, double alpha, double beta)
{
    ct_status st = cti_cuda_enter(out->device.index, "matmul_ref");
    if (st) return st;
    ref_geom g;
    const int nb = out->ndim - 2, na = a->ndim - 2, nbb = b->ndim - 2;
    g.nb = nb;
    g.M = out->shape[nb];
    g.N = out->shape[nb + 1];
    g.K = a->shape[na + (trans_a ? 0 : 1)];
    g.a_m = a->strides[na + (trans_a ? 1 : 0)];
    g.a_k = a->strides[na + (trans_a ? 0 : 1)];
    g.b_k = b->strides[nbb + (trans_b ? 1 : 0)];
    g.b_n = b->strides[nbb + (trans_b ? 0 : 1)];
    g.o_m = out->strides[nb];
    g.o_n = out->strides[nb + 1];
    g.total = g.M * g.N;
    for (int d = 0; d < CT_MAX_DIMS; d++) g.bshape[d] = 1, g.as[d] = g.bs[d] = g.os[d] = 0;
    for (int d = 0; d < nb; d++) {
        const int da = d - nb + na, db = d - nb + nbb;
        g.bshape[d] = out->shape[d];
        g.total *= out->shape[d];
        g.as[d] = da >= 0 && a->shape[da] > 1 ? a->strides[da] : 0;
        g.bs[d] = db >= 0 && b->shape[db] > 1 ? b->strides[db] : 0;
        g.os[d] = out->strides[d];
    }
    if (g.total == 0) return CT_OK;
    cudaStream_t s = cti_cu_stream(out);
    CTI_CU_DISPATCH_FLOAT(a->dtype, TI, { return matmul_ref_launch<TI>(out, a, b, g, alpha, beta, s); })
    return ct_error_set(CT_ERR_INVALID, "matmul_ref: unsupported dtype %s", ct_dtype_name(a->dtype));
}

/* ---- linear ------------------------------------------------------------------------- */

// y (R, O) = gelu?(sum_k x[r, k] w[k, o] + bias[o]), all in double; GELU-tanh as
// 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))).
template <typename T>
__global__ void linear_ref_kernel(T *y, const T *x, const T *w, const T *bias, int64_t R, int64_t O, int64_t I,
                                  int64_t xs0, int64_t xs1, int64_t ws0, int64_t ws1, bool gelu)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < R * O; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / O, o = i % O;
        double v = 0;
        for (int64_t k = 0; k < I; k++) v += (double)ld<T>(x + r * xs0 + k * xs1) * (double)ld<T>(w + k * ws0 + o * ws1);
        if (bias) v += (double)ld<T>(bias + o);
        if (gelu) v = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        st_f64<T>(y + i, v);
    }
}

extern "C" ct_status cti_cuda_linear_ref(ct_tensor *y, const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias,
                                         bool gelu)
{
    ct_status st = cti_cuda_enter(y->device.index, "linear_ref");
    if (st) return st;
    const int64_t R = y->shape[0], O = y->shape[1], I = x->shape[1];
    if (R * O == 0) return CT_OK;
    cudaStream_t s = cti_cu_stream(y);
    CTI_CU_DISPATCH_FLOAT(y->dtype, T, {
        linear_ref_kernel<T><<<cti_cu_blocks(R * O, 128), 128, 0, s>>>(
            cti_cu_ptr<T>(y), cti_cu_ptr<T>(x), cti_cu_ptr<T>(w), bias ? cti_cu_ptr<T>(bias) : NULL, R, O, I,
            x->strides[0], x->strides[1], w->strides[0], w->strides[1], gelu);
        return cti_cuda_launched("linear_ref", y);
    })
    return ct_error_set(CT_ERR_INVALID, "linear_ref: unsupported dtype %s", ct_dtype_name(y->dtype));
}
