/* CUDA unary elementwise ops and their backward, over any strided operands.
 *
 *   x (...) -> y (same shape); y = f(x)
 *   gout, x, y (...) -> gin (same shape); gin = gout * f'(x), overwritten
 *
 * One thread per element in a grid-stride loop, offsets from the index
 * calculator of kernels/cuda/elementwise.cuh. The formulas are
 * kernels/cpu/unary.c's, in the same compute type (f32 for f32/f16/bf16, rounded
 * once; f64 for f64), with CUDA's libm in place of the CPU's polynomials:
 *   sigmoid(x) = 1/(1+e) for x >= 0 and e/(1+e) below, e = exp(-|x|), so exp never
 *     overflows; SILU = x sigmoid(x);
 *   GELU-tanh = x sigmoid(2u), u = k (x + c x^3), k = sqrt(2/pi), c = 0.044715 (in
 *     f32 as x / (1 + exp(-2u)), which gives 0 where exp(-2u) overflows, as the CPU);
 *   GELU-erf = 0.5 x erfc(-x / sqrt 2);
 *   RSQRT = 1 / sqrt(x) (correctly rounded sqrt and division, not rsqrtf);
 *   RELU = max(x, 0) with NaN kept; integer NEG/ABS wrap (-INT_MIN = INT_MIN).
 * Backward: ABS'(0) = 0, RELU'(x <= 0) = 0 (a NaN x passes gout), EXP/TANH/SIGMOID
 * from y when given.
 *
 * The *_ref kernels: one thread per element, each operand's offset from its own
 * shape and strides, math in double (kernels/cpu/elementwise.c's reference
 * formulas: GELU-tanh as 0.5 x (1 + tanh u), sigmoid as 1/(1+exp(-x))), one
 * rounding. */
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/elementwise.h"

#define EW_GELU_K 0.7978845608028654     /* sqrt(2/pi) */
#define EW_GELU_C 0.044715
#define EW_SQRT1_2 0.70710678118654752440 /* 1/sqrt(2) */
#define EW_2_SQRTPI 1.12837916709551257390 /* 2/sqrt(pi) */

/* ---- the math, in float and double -------------------------------------------------------- */

__device__ __forceinline__ float ew_exp(float x) { return expf(x); }
__device__ __forceinline__ double ew_exp(double x) { return exp(x); }
__device__ __forceinline__ float ew_log(float x) { return logf(x); }
__device__ __forceinline__ double ew_log(double x) { return log(x); }
__device__ __forceinline__ float ew_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double ew_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float ew_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double ew_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float ew_erfc(float x) { return erfcf(x); }
__device__ __forceinline__ double ew_erfc(double x) { return erfc(x); }
__device__ __forceinline__ float ew_fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double ew_fabs(double x) { return fabs(x); }

template <typename C> __device__ __forceinline__ C ew_sigmoid(C x)
{
    const C e = ew_exp(-ew_fabs(x));
    const C s = (C)1 / ((C)1 + e);
    return x >= (C)0 ? s : e * s;
}

/* sigmoid(2u) of GELU-tanh: one-sided in f32 (kernels/cpu/unary.c), stable in f64. */
__device__ __forceinline__ float ew_gelu_sig(float x)
{
    return 1.0f / (1.0f + expf((float)(-2.0 * EW_GELU_K) * fmaf((float)EW_GELU_C * x * x, x, x)));
}
__device__ __forceinline__ double ew_gelu_sig(double x)
{
    return ew_sigmoid(2.0 * EW_GELU_K * (x + EW_GELU_C * x * x * x));
}

__device__ __forceinline__ float ew_gelu_tanh(float x)
{
    return x / (1.0f + expf((float)(-2.0 * EW_GELU_K) * fmaf((float)EW_GELU_C * x * x, x, x)));
}
__device__ __forceinline__ double ew_gelu_tanh(double x) { return x * ew_gelu_sig(x); }

template <typename C> __device__ __forceinline__ C ew_unary_float(int op, C x)
{
    switch (op) {
    case CT_UNARY_NEG: return -x;
    case CT_UNARY_ABS: return ew_fabs(x);
    case CT_UNARY_EXP: return ew_exp(x);
    case CT_UNARY_LOG: return ew_log(x);
    case CT_UNARY_SQRT: return ew_sqrt(x);
    case CT_UNARY_RSQRT: return (C)1 / ew_sqrt(x);
    case CT_UNARY_TANH: return ew_tanh(x);
    case CT_UNARY_SIGMOID: return ew_sigmoid(x);
    case CT_UNARY_RELU: return x < (C)0 ? (C)0 : x;
    case CT_UNARY_GELU_TANH: return ew_gelu_tanh(x);
    case CT_UNARY_GELU_ERF: return (C)0.5 * x * ew_erfc(-x * (C)EW_SQRT1_2);
    default: return x * ew_sigmoid(x); /* SILU */
    }
}

/* NEG, ABS, RELU; U is the unsigned type of T's width. u8 has no negative values. */
template <typename T, typename U> __device__ __forceinline__ T ew_unary_int(int op, T x)
{
    const T neg = (T)(U)((U)0 - (U)x);
    switch (op) {
    case CT_UNARY_NEG: return neg;
    case CT_UNARY_ABS: return x < 0 ? neg : x;
    default: return x < 0 ? (T)0 : x; /* RELU */
    }
}

__device__ __forceinline__ float ew_unary(int op, float x) { return ew_unary_float(op, x); }
__device__ __forceinline__ double ew_unary(int op, double x) { return ew_unary_float(op, x); }
__device__ __forceinline__ int32_t ew_unary(int op, int32_t x) { return ew_unary_int<int32_t, uint32_t>(op, x); }
__device__ __forceinline__ int64_t ew_unary(int op, int64_t x)
{
    return ew_unary_int<int64_t, unsigned long long>(op, x);
}
__device__ __forceinline__ uint8_t ew_unary(int op, uint8_t x)
{
    return op == CT_UNARY_NEG ? (uint8_t)(0u - x) : x;
}

/* gout * f'(x); y = f(x) or unused (has_y false). */
template <typename C> __device__ __forceinline__ C ew_backward(int op, C g, C x, C y, bool has_y)
{
    const C k = (C)EW_GELU_K, c = (C)EW_GELU_C;
    switch (op) {
    case CT_UNARY_NEG: return -g;
    case CT_UNARY_ABS: return g * (C)((x > (C)0) - (x < (C)0));
    case CT_UNARY_EXP: return g * (has_y ? y : ew_exp(x));
    case CT_UNARY_LOG: return g / x;
    case CT_UNARY_SQRT: return (C)0.5 * g / ew_sqrt(x);
    case CT_UNARY_RSQRT: {
        const C r = (C)1 / ew_sqrt(x);
        return (C)-0.5 * g * r * r * r;
    }
    case CT_UNARY_TANH: {
        const C t = has_y ? y : ew_tanh(x);
        return g * ((C)1 - t * t);
    }
    case CT_UNARY_SIGMOID: {
        const C s = has_y ? y : ew_sigmoid(x);
        return g * s * ((C)1 - s);
    }
    case CT_UNARY_RELU: return x <= (C)0 ? (C)0 : g;
    case CT_UNARY_GELU_TANH: {
        /* 0.5(1+t) = s and 0.5(1-t^2) = 2 s (1-s) with s = sigmoid(2u) */
        const C s = ew_gelu_sig(x);
        return g * (s + (C)2 * x * s * ((C)1 - s) * k * ((C)1 + (C)3 * c * x * x));
    }
    case CT_UNARY_GELU_ERF:
        return g * ((C)0.5 * ew_erfc(-x * (C)EW_SQRT1_2) +
                    x * ew_exp((C)-0.5 * x * x) * (C)(0.5 * EW_2_SQRTPI * EW_SQRT1_2));
    default: { /* SILU */
        const C s = ew_sigmoid(x);
        return g * s * ((C)1 + x * ((C)1 - s));
    }
    }
}

/* ---- fast kernels ---------------------------------------------------------------------------- */

/* Operands: 0 out, 1 x. vec: flat, and both aligned for vectors of cti_ew_width<T>
 * elements: those go as vectors, the tail element by element. */
template <typename T>
__global__ void unary_kernel(int op, cti_ew_geom g, bool flat, bool vec, int64_t n, T *out, const T *x)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t start = 0;
    if (vec) {
        constexpr int V = cti_ew_width<T>::value;
        typedef cti_ew_vec<T, V> VT;
        const int64_t nv = n / V;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += step) {
            const VT vx = ((const VT *)x)[i];
            VT vo;
#pragma unroll
            for (int k = 0; k < V; k++) cti_ew_st(&vo.v[k], ew_unary(op, cti_ew_ld(&vx.v[k])));
            ((VT *)out)[i] = vo;
        }
        start = nv * V;
    }
    for (int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t off[2];
        if (flat) off[0] = off[1] = i;
        else cti_ew_offsets<2>(g, i, off);
        cti_ew_st(out + off[0], ew_unary(op, cti_ew_ld(x + off[1])));
    }
}

/* Operands: 0 gin, 1 gout, 2 x (NULL: unused), 3 y (NULL: unused). vec as in
 * unary_kernel, over the operands present. */
template <typename T>
__global__ void unary_backward_kernel(int op, cti_ew_geom g, bool flat, bool vec, int64_t n, T *gin, const T *gout,
                                      const T *x, const T *y)
{
    typedef typename cti_ew_c<T>::type C;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t start = 0;
    if (vec) {
        constexpr int V = cti_ew_width<T>::value;
        typedef cti_ew_vec<T, V> VT;
        const int64_t nv = n / V;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += step) {
            const VT vg = ((const VT *)gout)[i];
            const VT vx = x ? ((const VT *)x)[i] : vg;
            const VT vy = y ? ((const VT *)y)[i] : vg;
            VT vo;
#pragma unroll
            for (int k = 0; k < V; k++) {
                const C xv = x ? cti_ew_ld(&vx.v[k]) : (C)0;
                const C yv = y ? cti_ew_ld(&vy.v[k]) : (C)0;
                cti_ew_st(&vo.v[k], ew_backward(op, cti_ew_ld(&vg.v[k]), xv, yv, y != NULL));
            }
            ((VT *)gin)[i] = vo;
        }
        start = nv * V;
    }
    for (int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t off[4];
        if (flat) off[0] = off[1] = off[2] = off[3] = i;
        else cti_ew_offsets<4>(g, i, off);
        const C gv = cti_ew_ld(gout + off[1]);
        const C xv = x ? cti_ew_ld(x + off[2]) : (C)0;
        const C yv = y ? cti_ew_ld(y + off[3]) : (C)0;
        cti_ew_st(gin + off[0], ew_backward(op, gv, xv, yv, y != NULL));
    }
}

/* Folds the common shape with each operand's own strides (no broadcasting here). */
static bool ew_same_shape_geom(cti_ew_geom *g, const ct_tensor *const *ts, int nops)
{
    int64_t st[CTI_EW_MAX_OPS][CT_MAX_DIMS];
    memset(st, 0, sizeof st);
    for (int k = 0; k < nops; k++)
        if (ts[k]) memcpy(st[k], ts[k]->strides, sizeof(int64_t) * (size_t)ts[k]->ndim);
    cti_ew_geom_init(g, ts[0]->ndim, ts[0]->shape, nops, st);
    if (cti_ew_geom_flat(g, 1)) { /* every present operand must be contiguous too */
        for (int k = 1; k < nops; k++)
            if (ts[k] && g->ndim == 1 && g->st[k][0] != 1) return false;
        return true;
    }
    return false;
}

// x (...) -> out (same shape); out = f(x); out overwritten (may be x)
ct_status cti_cuda_unary(ct_unary_op op, ct_tensor *out, const ct_tensor *x)
{
    const char *name = ct_unary_op_name(op);
    const int64_t n = ct_tensor_numel(out);
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(out->device.index, name)) return ct_last_status();
    cti_ew_geom g;
    const ct_tensor *ts[2] = {out, x};
    const bool flat = ew_same_shape_geom(&g, ts, 2);
    cudaStream_t stream = cti_cu_stream(out);
    CTI_EW_DISPATCH(x->dtype, T, {
        const int V = cti_ew_width<T>::value;
        T *po = cti_cu_ptr<T>(out);
        const T *px = cti_cu_ptr<T>(x);
        const bool vec = flat && cti_ew_aligned(po, V, sizeof(T)) && cti_ew_aligned(px, V, sizeof(T));
        const unsigned blocks = cti_cu_blocks(vec ? n / V + 1 : n, CTI_EW_THREADS);
        unary_kernel<T><<<blocks, CTI_EW_THREADS, 0, stream>>>(op, g, flat, vec, n, po, px);
    })
    else return cti_kernel_unsupported_dtype(name, x);
    return cti_cuda_launched(name, out);
}

// gout, x, y (...) -> gin (same shape); gin = gout * f'(x); gin overwritten
ct_status cti_cuda_unary_backward(ct_unary_op op, ct_tensor *gin, const ct_tensor *gout, const ct_tensor *x,
                                  const ct_tensor *y)
{
    const char *name = ct_unary_op_name(op);
    const int64_t n = ct_tensor_numel(gin);
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(gin->device.index, name)) return ct_last_status();
    cti_ew_geom g;
    const ct_tensor *ts[4] = {gin, gout, x, y};
    const bool flat = ew_same_shape_geom(&g, ts, 4);
    cudaStream_t stream = cti_cu_stream(gin);
    CTI_CU_DISPATCH_FLOAT(gin->dtype, T, {
        const int V = cti_ew_width<T>::value;
        T *pgi = cti_cu_ptr<T>(gin);
        const T *pg = cti_cu_ptr<T>(gout), *px = x ? cti_cu_ptr<T>(x) : (const T *)0;
        const T *py = y ? cti_cu_ptr<T>(y) : (const T *)0;
        const bool vec = flat && cti_ew_aligned(pgi, V, sizeof(T)) && cti_ew_aligned(pg, V, sizeof(T)) &&
                         (!px || cti_ew_aligned(px, V, sizeof(T))) && (!py || cti_ew_aligned(py, V, sizeof(T)));
        const unsigned blocks = cti_cu_blocks(vec ? n / V + 1 : n, CTI_EW_THREADS);
        unary_backward_kernel<T><<<blocks, CTI_EW_THREADS, 0, stream>>>(op, g, flat, vec, n, pgi, pg, px, py);
    })
    else return cti_kernel_unsupported_dtype(name, gin);
    return cti_cuda_launched(name, gin);
}

/* ---- references ------------------------------------------------------------------------------- */

__device__ __forceinline__ double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

__device__ __forceinline__ double ref_unary_f(int op, double x)
{
    switch (op) {
    case CT_UNARY_NEG: return -x;
    case CT_UNARY_ABS: return fabs(x);
    case CT_UNARY_EXP: return exp(x);
    case CT_UNARY_LOG: return log(x);
    case CT_UNARY_SQRT: return sqrt(x);
    case CT_UNARY_RSQRT: return 1.0 / sqrt(x);
    case CT_UNARY_TANH: return tanh(x);
    case CT_UNARY_SIGMOID: return ref_sigmoid(x);
    case CT_UNARY_RELU: return x < 0 ? 0.0 : x;
    case CT_UNARY_GELU_TANH: return 0.5 * x * (1.0 + tanh(EW_GELU_K * (x + EW_GELU_C * x * x * x)));
    case CT_UNARY_GELU_ERF: return 0.5 * x * (1.0 + erf(x * EW_SQRT1_2));
    default: return x * ref_sigmoid(x);
    }
}

__device__ __forceinline__ int64_t ref_unary_i(int op, int64_t x)
{
    switch (op) {
    case CT_UNARY_NEG: return (int64_t)(0ull - (unsigned long long)x);
    case CT_UNARY_ABS: return x < 0 ? (int64_t)(0ull - (unsigned long long)x) : x;
    default: return x < 0 ? 0 : x; /* RELU */
    }
}

/* f'(x); y = f(x) when the caller has it. */
__device__ __forceinline__ double ref_derivative(int op, double x, double y, bool have_y)
{
    const double k = EW_GELU_K, c = EW_GELU_C;
    switch (op) {
    case CT_UNARY_NEG: return -1.0;
    case CT_UNARY_ABS: return (double)((x > 0) - (x < 0));
    case CT_UNARY_EXP: return have_y ? y : exp(x);
    case CT_UNARY_LOG: return 1.0 / x;
    case CT_UNARY_SQRT: return 0.5 / sqrt(x);
    case CT_UNARY_RSQRT: return -0.5 / (x * sqrt(x));
    case CT_UNARY_TANH: {
        const double t = have_y ? y : tanh(x);
        return 1.0 - t * t;
    }
    case CT_UNARY_SIGMOID: {
        const double s = have_y ? y : ref_sigmoid(x);
        return s * (1.0 - s);
    }
    case CT_UNARY_RELU: return x <= 0 ? 0.0 : 1.0;
    case CT_UNARY_GELU_TANH: {
        const double t = tanh(k * (x + c * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
    }
    case CT_UNARY_GELU_ERF: return 0.5 * (1.0 + erf(x * EW_SQRT1_2)) + x * exp(-0.5 * x * x) * (0.5 * EW_2_SQRTPI * EW_SQRT1_2);
    default: {
        const double s = ref_sigmoid(x);
        return s * (1.0 + x * (1.0 - s));
    }
    }
}

/* Operands: 0 out, 1 x. */
template <typename T> __global__ void unary_ref_kernel(int op, cti_ew_ref r, int64_t n, T *out, const T *x)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t idx[CT_MAX_DIMS];
        cti_ew_ref_unravel(r, i, idx);
        T *po = out + cti_ew_ref_offset(r, 0, idx);
        const T *px = x + cti_ew_ref_offset(r, 1, idx);
        if constexpr (cti_ew_is_int<T>::value) *po = (T)ref_unary_i(op, (int64_t)*px);
        else cti_ew_st_f64(po, ref_unary_f(op, (double)cti_ew_ld(px)));
    }
}

/* Operands: 0 gin, 1 gout, 2 x, 3 y (NULL: absent). */
template <typename T>
__global__ void unary_backward_ref_kernel(int op, cti_ew_ref r, int64_t n, T *gin, const T *gout, const T *x,
                                          const T *y)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t idx[CT_MAX_DIMS];
        cti_ew_ref_unravel(r, i, idx);
        const double g = (double)cti_ew_ld(gout + cti_ew_ref_offset(r, 1, idx));
        const double xv = x ? (double)cti_ew_ld(x + cti_ew_ref_offset(r, 2, idx)) : (double)NAN;
        const double yv = y ? (double)cti_ew_ld(y + cti_ew_ref_offset(r, 3, idx)) : (double)NAN;
        cti_ew_st_f64(gin + cti_ew_ref_offset(r, 0, idx), g * ref_derivative(op, xv, yv, y != NULL));
    }
}

ct_status cti_cuda_unary_ref(ct_unary_op op, ct_tensor *out, const ct_tensor *x)
{
    const char *name = ct_unary_op_name(op);
    const int64_t n = ct_tensor_numel(out);
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(out->device.index, name)) return ct_last_status();
    cti_ew_ref r;
    const ct_tensor *ops[2] = {out, x};
    cti_ew_ref_init(&r, out, ops, 2);
    const unsigned blocks = cti_cu_blocks(n, CTI_EW_THREADS);
    cudaStream_t stream = cti_cu_stream(out);
    CTI_EW_DISPATCH(x->dtype, T, {
        unary_ref_kernel<T><<<blocks, CTI_EW_THREADS, 0, stream>>>(op, r, n, cti_cu_ptr<T>(out), cti_cu_ptr<T>(x));
    })
    else return cti_kernel_unsupported_dtype(name, x);
    return cti_cuda_launched(name, out);
}

ct_status cti_cuda_unary_backward_ref(ct_unary_op op, ct_tensor *gin, const ct_tensor *gout, const ct_tensor *x,
                                      const ct_tensor *y)
{
    const char *name = ct_unary_op_name(op);
    const int64_t n = ct_tensor_numel(gin);
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(gin->device.index, name)) return ct_last_status();
    cti_ew_ref r;
    const ct_tensor *ops[4] = {gin, gout, x, y};
    cti_ew_ref_init(&r, gin, ops, 4);
    const unsigned blocks = cti_cu_blocks(n, CTI_EW_THREADS);
    cudaStream_t stream = cti_cu_stream(gin);
    CTI_CU_DISPATCH_FLOAT(gin->dtype, T, {
        unary_backward_ref_kernel<T><<<blocks, CTI_EW_THREADS, 0, stream>>>(
            op, r, n, cti_cu_ptr<T>(gin), cti_cu_ptr<T>(gout), x ? cti_cu_ptr<T>(x) : (const T *)0,
            y ? cti_cu_ptr<T>(y) : (const T *)0);
    })
    else return cti_kernel_unsupported_dtype(name, gin);
    return cti_cuda_launched(name, gin);
}
