/* CUDA binary elementwise ops (tensor op tensor, tensor op scalar) and where,
 * with numpy broadcasting over any strided operands.
 *
 *   a (...), b (...) -> out (broadcast shape); out[i] = a[i'] op b[i'']
 *   cond, a, b (...) -> out (broadcast shape); out[i] = cond[i'] ? a[i''] : b[i''']
 *
 * One thread per output element in a grid-stride loop, operand offsets from the
 * index calculator of kernels/cuda/elementwise.cuh (a flat loop when every operand
 * is contiguous in the output's order). The op is a kernel argument: every thread
 * of a launch takes the same branch.
 *
 * Numerics are kernels/cpu/binary.c's: f32 and f64 in their own precision,
 * f16/bf16 in f32 rounded once; POW with exponent 2 is x * x; MAX/MIN propagate
 * NaN (x wins when it is NaN, y when y is); integer ADD/SUB/MUL wrap (unsigned
 * arithmetic of the same width); comparisons give BOOL (0/1). A scalar operand is
 * converted to the compute type first (f32 for f32/f16/bf16 tensors). where moves
 * elements as opaque words of the dtype's size.
 *
 * The *_ref kernels: one thread per output element, each operand's offset from
 * its own shape and strides, math in double (int64 for integer dtypes), one
 * rounding, as kernels/cpu/elementwise.c's references. */
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/elementwise.h"

/* ---- the math ---------------------------------------------------------------------------- */

__device__ __forceinline__ float ew_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double ew_pow(double x, double y) { return pow(x, y); }

template <typename C> __device__ __forceinline__ C ew_bin_float(int op, C x, C y)
{
    switch (op) {
    case CT_BINARY_ADD: return x + y;
    case CT_BINARY_SUB: return x - y;
    case CT_BINARY_MUL: return x * y;
    case CT_BINARY_DIV: return x / y;
    case CT_BINARY_POW: return y == (C)2 ? x * x : ew_pow(x, y);
    case CT_BINARY_MAX: return (x > y || x != x) ? x : y;
    default: return (x < y || x != x) ? x : y; /* MIN */
    }
}

/* U: the unsigned type of T's width, for wrap-around arithmetic. */
template <typename T, typename U> __device__ __forceinline__ T ew_bin_int(int op, T x, T y)
{
    switch (op) {
    case CT_BINARY_ADD: return (T)(U)((U)x + (U)y);
    case CT_BINARY_SUB: return (T)(U)((U)x - (U)y);
    case CT_BINARY_MUL: return (T)(U)((U)x * (U)y);
    case CT_BINARY_MAX: return x > y ? x : y;
    default: return x < y ? x : y; /* MIN */
    }
}

__device__ __forceinline__ float ew_bin(int op, float x, float y) { return ew_bin_float(op, x, y); }
__device__ __forceinline__ double ew_bin(int op, double x, double y) { return ew_bin_float(op, x, y); }
__device__ __forceinline__ int32_t ew_bin(int op, int32_t x, int32_t y) { return ew_bin_int<int32_t, uint32_t>(op, x, y); }
__device__ __forceinline__ int64_t ew_bin(int op, int64_t x, int64_t y)
{
    return ew_bin_int<int64_t, unsigned long long>(op, x, y);
}
__device__ __forceinline__ uint8_t ew_bin(int op, uint8_t x, uint8_t y) { return ew_bin_int<uint8_t, uint8_t>(op, x, y); }

/* NaN compares unequal to everything (NE true, the rest false). */
template <typename C> __device__ __forceinline__ uint8_t ew_cmp(int op, C x, C y)
{
    switch (op) {
    case CT_BINARY_EQ: return x == y;
    case CT_BINARY_NE: return x != y;
    case CT_BINARY_LT: return x < y;
    case CT_BINARY_LE: return x <= y;
    case CT_BINARY_GT: return x > y;
    default: return x >= y; /* GE */
    }
}

/* ---- fast kernels ------------------------------------------------------------------------- */

/* The output's storage type: BOOL (uint8_t) for comparisons. */
template <typename T, bool CMP> struct ew_out { typedef T type; };
template <typename T> struct ew_out<T, true> { typedef uint8_t type; };

/* Where the scalar of binary_scalar goes: none (a op b), right (a op s), left (s op a). */
enum { EW_TENSORS = 0, EW_SCALAR_RIGHT = 1, EW_SCALAR_LEFT = 2 };

template <typename T, bool CMP> __device__ __forceinline__ void ew_binary_one(int op, int mode, const T *pa, const T *pb,
                                                                           typename cti_ew_c<T>::type s, void *po)
{
    typedef typename cti_ew_c<T>::type C;
    const C u = cti_ew_ld(pa);
    C x = u, y = s;
    if (mode == EW_TENSORS) y = cti_ew_ld(pb);
    else if (mode == EW_SCALAR_LEFT) x = s, y = u;
    if constexpr (CMP) *(uint8_t *)po = ew_cmp(op, x, y);
    else cti_ew_st((T *)po, ew_bin(op, x, y));
}

/* Operands: 0 out, 1 a (the tensor of a scalar op), 2 b (unused with a scalar).
 * CMP: out is BOOL (uint8_t) instead of T. vec: flat, and every operand aligned
 * for vectors of cti_ew_width<T> elements: those go as vectors, the tail (fewer
 * than a vector's worth) element by element. */
template <typename T, bool CMP>
__global__ void binary_kernel(int op, int mode, cti_ew_geom g, bool flat, bool vec, int64_t n, void *out,
                              const T *a, const T *b, typename cti_ew_c<T>::type s)
{
    typedef typename cti_ew_c<T>::type C;
    typedef typename ew_out<T, CMP>::type TO;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t start = 0;
    if (vec) {
        constexpr int V = cti_ew_width<T>::value;
        typedef cti_ew_vec<T, V> VT;
        typedef cti_ew_vec<TO, V> VO;
        const int64_t nv = n / V;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += step) {
            const VT va = ((const VT *)a)[i];
            const VT vb = mode == EW_TENSORS ? ((const VT *)b)[i] : va;
            VO vo;
#pragma unroll
            for (int k = 0; k < V; k++) ew_binary_one<T, CMP>(op, mode, &va.v[k], &vb.v[k], s, &vo.v[k]);
            ((VO *)out)[i] = vo;
        }
        start = nv * V;
    }
    for (int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t off[3];
        if (flat) off[0] = off[1] = off[2] = i;
        else cti_ew_offsets<3>(g, i, off);
        const T *pa = a + off[1], *pb = mode == EW_TENSORS ? b + off[2] : pa;
        ew_binary_one<T, CMP>(op, mode, pa, pb, s, (TO *)out + off[0]);
    }
}

/* W: an unsigned word of the dtype's size. */
template <typename W>
__global__ void where_kernel(cti_ew_geom g, bool flat, int64_t n, W *out, const uint8_t *cond, const W *a,
                             const W *b)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t off[4];
        if (flat) off[0] = off[1] = off[2] = off[3] = i;
        else cti_ew_offsets<4>(g, i, off);
        out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
    }
}

/* Folds out's shape with out's strides and the inputs' broadcast strides. */
static bool ew_geom(cti_ew_geom *g, const ct_tensor *out, const ct_tensor *const *in, int nin)
{
    int64_t st[CTI_EW_MAX_OPS][CT_MAX_DIMS];
    memset(st, 0, sizeof st);
    memcpy(st[0], out->strides, sizeof(int64_t) * (size_t)out->ndim);
    for (int k = 0; k < nin; k++) cti_ew_bcast_strides(in[k], out->ndim, out->shape, st[k + 1]);
    cti_ew_geom_init(g, out->ndim, out->shape, nin + 1, st);
    return cti_ew_geom_flat(g, nin + 1);
}

static ct_status binary_launch(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b, double s,
                               int mode)
{
    const char *name = ct_binary_op_name(op);
    const int64_t n = ct_tensor_numel(out);
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(out->device.index, name)) return ct_last_status();
    cti_ew_geom g;
    const ct_tensor *in[2] = {a, b};
    const bool flat = ew_geom(&g, out, in, mode == EW_TENSORS ? 2 : 1);
    const bool cmp = ct_binary_op_is_comparison(op);
    cudaStream_t stream = cti_cu_stream(out);
    void *o = ct_tensor_data(out);
    CTI_EW_DISPATCH(a->dtype, T, {
        typedef typename cti_ew_c<T>::type C;
        const T *pa = cti_cu_ptr<T>(a), *pb = mode == EW_TENSORS ? cti_cu_ptr<T>(b) : (const T *)0;
        /* the scalar takes the compute type's precision, as on the CPU (kernels/elementwise.h) */
        const C sc = (C)s;
        const int V = cti_ew_width<T>::value;
        const bool vec = flat && cti_ew_aligned(pa, V, sizeof(T)) && (!pb || cti_ew_aligned(pb, V, sizeof(T))) &&
                         cti_ew_aligned(o, V, cmp ? 1 : sizeof(T));
        const unsigned blocks = cti_cu_blocks(vec ? n / V + 1 : n, CTI_EW_THREADS);
        if (cmp) binary_kernel<T, true><<<blocks, CTI_EW_THREADS, 0, stream>>>(op, mode, g, flat, vec, n, o, pa, pb, sc);
        else binary_kernel<T, false><<<blocks, CTI_EW_THREADS, 0, stream>>>(op, mode, g, flat, vec, n, o, pa, pb, sc);
    })
    else return cti_kernel_unsupported_dtype(name, a);
    return cti_cuda_launched(name, out);
}

// a (...), b (...) -> out (broadcast); out = a op b; out overwritten
ct_status cti_cuda_binary(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b)
{
    return binary_launch(op, out, a, b, 0.0, EW_TENSORS);
}

// a (...) -> out (same shape); out = a op s, or s op a when reversed; out overwritten
ct_status cti_cuda_binary_scalar(ct_binary_op op, ct_tensor *out, const ct_tensor *a, double s, bool reversed)
{
    return binary_launch(op, out, a, NULL, s, reversed ? EW_SCALAR_LEFT : EW_SCALAR_RIGHT);
}

// cond, a, b (broadcast) -> out; out = cond ? a : b; out overwritten
ct_status cti_cuda_where(ct_tensor *out, const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b)
{
    const int64_t n = ct_tensor_numel(out);
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(out->device.index, "where")) return ct_last_status();
    cti_ew_geom g;
    const ct_tensor *in[3] = {cond, a, b};
    const bool flat = ew_geom(&g, out, in, 3);
    const unsigned blocks = cti_cu_blocks(n, CTI_EW_THREADS);
    cudaStream_t stream = cti_cu_stream(out);
    const uint8_t *c = cti_cu_ptr<uint8_t>(cond);
#define WHERE_LAUNCH(W)                                                                                  \
    where_kernel<W><<<blocks, CTI_EW_THREADS, 0, stream>>>(g, flat, n, cti_cu_ptr<W>(out), c, cti_cu_ptr<W>(a), \
                                                           cti_cu_ptr<W>(b))
    switch (ct_dtype_size(out->dtype)) {
    case 1: WHERE_LAUNCH(uint8_t); break;
    case 2: WHERE_LAUNCH(uint16_t); break;
    case 4: WHERE_LAUNCH(uint32_t); break;
    default: WHERE_LAUNCH(unsigned long long); break;
    }
#undef WHERE_LAUNCH
    return cti_cuda_launched("where", out);
}

/* ---- references ------------------------------------------------------------------------------ */

__device__ __forceinline__ double ref_binary_f(int op, double x, double y)
{
    switch (op) {
    case CT_BINARY_ADD: return x + y;
    case CT_BINARY_SUB: return x - y;
    case CT_BINARY_MUL: return x * y;
    case CT_BINARY_DIV: return x / y;
    case CT_BINARY_POW: return pow(x, y);
    case CT_BINARY_MAX: return x != x || y != y ? (double)NAN : (x > y ? x : y);
    case CT_BINARY_MIN: return x != x || y != y ? (double)NAN : (x < y ? x : y);
    default: return ew_cmp(op, x, y);
    }
}

__device__ __forceinline__ int64_t ref_binary_i(int op, int64_t x, int64_t y)
{
    switch (op) {
    case CT_BINARY_ADD: return (int64_t)((unsigned long long)x + (unsigned long long)y);
    case CT_BINARY_SUB: return (int64_t)((unsigned long long)x - (unsigned long long)y);
    case CT_BINARY_MUL: return (int64_t)((unsigned long long)x * (unsigned long long)y);
    case CT_BINARY_MAX: return x > y ? x : y;
    case CT_BINARY_MIN: return x < y ? x : y;
    default: return ew_cmp(op, x, y);
    }
}

/* An int64 result stored with a C cast's wrap-around (T integer) or as 0/1 (BOOL). */
template <typename T> __device__ __forceinline__ void ref_store_int(T *p, int64_t v) { *p = (T)v; }

/* Operands as in binary_kernel; s is the scalar in double (the kernel rounds it to
 * the compute type's precision as the CPU reference does). */
template <typename T>
__global__ void binary_ref_kernel(int op, int mode, cti_ew_ref r, int64_t n, void *out, const T *a, const T *b,
                                  double s, bool s_f32, bool cmp)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t idx[CT_MAX_DIMS];
        cti_ew_ref_unravel(r, i, idx);
        const int64_t oo = cti_ew_ref_offset(r, 0, idx), oa = cti_ew_ref_offset(r, 1, idx);
        if constexpr (cti_ew_is_int<T>::value) {
            const int64_t u = (int64_t)a[oa], sv = (int64_t)s;
            int64_t x = u, y = sv;
            if (mode == EW_TENSORS) y = (int64_t)b[cti_ew_ref_offset(r, 2, idx)];
            else if (mode == EW_SCALAR_LEFT) x = sv, y = u;
            const int64_t v = ref_binary_i(op, x, y);
            if (cmp) ((uint8_t *)out)[oo] = v != 0;
            else ref_store_int((T *)out + oo, v);
        } else {
            const double u = (double)cti_ew_ld(a + oa), sv = s_f32 ? (double)(float)s : s;
            double x = u, y = sv;
            if (mode == EW_TENSORS) y = (double)cti_ew_ld(b + cti_ew_ref_offset(r, 2, idx));
            else if (mode == EW_SCALAR_LEFT) x = sv, y = u;
            const double v = ref_binary_f(op, x, y);
            if (cmp) ((uint8_t *)out)[oo] = v != 0;
            else cti_ew_st_f64((T *)out + oo, v);
        }
    }
}

template <typename W>
__global__ void where_ref_kernel(cti_ew_ref r, int64_t n, W *out, const uint8_t *cond, const W *a, const W *b)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t idx[CT_MAX_DIMS];
        cti_ew_ref_unravel(r, i, idx);
        const bool c = cond[cti_ew_ref_offset(r, 1, idx)] != 0;
        out[cti_ew_ref_offset(r, 0, idx)] = c ? a[cti_ew_ref_offset(r, 2, idx)] : b[cti_ew_ref_offset(r, 3, idx)];
    }
}

static ct_status binary_ref_launch(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b,
                                   double s, int mode)
{
    const char *name = ct_binary_op_name(op);
    const int64_t n = ct_tensor_numel(out);
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(out->device.index, name)) return ct_last_status();
    cti_ew_ref r;
    const ct_tensor *ops[3] = {out, a, mode == EW_TENSORS ? b : NULL};
    cti_ew_ref_init(&r, out, ops, 3);
    const bool cmp = ct_binary_op_is_comparison(op), s_f32 = a->dtype != CT_DTYPE_F64;
    const unsigned blocks = cti_cu_blocks(n, CTI_EW_THREADS);
    cudaStream_t stream = cti_cu_stream(out);
    CTI_EW_DISPATCH(a->dtype, T, {
        const T *pb = mode == EW_TENSORS ? cti_cu_ptr<T>(b) : (const T *)0;
        binary_ref_kernel<T><<<blocks, CTI_EW_THREADS, 0, stream>>>(op, mode, r, n, ct_tensor_data(out),
                                                                    cti_cu_ptr<T>(a), pb, s, s_f32, cmp);
    })
    else return cti_kernel_unsupported_dtype(name, a);
    return cti_cuda_launched(name, out);
}

ct_status cti_cuda_binary_ref(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b)
{
    return binary_ref_launch(op, out, a, b, 0.0, EW_TENSORS);
}

ct_status cti_cuda_binary_scalar_ref(ct_binary_op op, ct_tensor *out, const ct_tensor *a, double s, bool reversed)
{
    return binary_ref_launch(op, out, a, NULL, s, reversed ? EW_SCALAR_LEFT : EW_SCALAR_RIGHT);
}

ct_status cti_cuda_where_ref(ct_tensor *out, const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b)
{
    const int64_t n = ct_tensor_numel(out);
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(out->device.index, "where")) return ct_last_status();
    cti_ew_ref r;
    const ct_tensor *ops[4] = {out, cond, a, b};
    cti_ew_ref_init(&r, out, ops, 4);
    const unsigned blocks = cti_cu_blocks(n, CTI_EW_THREADS);
    cudaStream_t stream = cti_cu_stream(out);
    const uint8_t *c = cti_cu_ptr<uint8_t>(cond);
#define WHERE_REF_LAUNCH(W)                                                                               \
    where_ref_kernel<W><<<blocks, CTI_EW_THREADS, 0, stream>>>(r, n, cti_cu_ptr<W>(out), c, cti_cu_ptr<W>(a), \
                                                               cti_cu_ptr<W>(b))
    switch (ct_dtype_size(out->dtype)) {
    case 1: WHERE_REF_LAUNCH(uint8_t); break;
    case 2: WHERE_REF_LAUNCH(uint16_t); break;
    case 4: WHERE_REF_LAUNCH(uint32_t); break;
    default: WHERE_REF_LAUNCH(unsigned long long); break;
    }
#undef WHERE_REF_LAUNCH
    return cti_cuda_launched("where", out);
}
