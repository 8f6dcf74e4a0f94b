/* CUDA kernels over gradient lists (kernels/foreach.h): norm partials, scaling,
 * clamping, the fp16 unscale.
 *
 * Norm partial, deterministic: the tensor is cut into chunks of 8192 elements as
 * on the CPU; one block per chunk sums its elements in double (each thread a fixed
 * stride, then a fixed-shape tree), and one block sums the chunk partials in index
 * order the same way. Same data, same bits, whatever the GPU.
 *
 * Unscale: each gradient is scaled in place by one grid-stride kernel that raises a
 * flag in device memory when a result is not finite (every writer writes 1, so the
 * race is benign); the flag is read back once for the whole list. */
#include "kernels/cuda/foreach.h"

#include <math.h>

#include "kernels/cuda/common.cuh"

namespace {

constexpr int CHUNK = 8192;
constexpr int THREADS = 256;

__device__ __forceinline__ double max_nan(double m, double a) { return a > m || a != a ? a : m; }

template <typename T>
__device__ __forceinline__ double term(T x, int kind, double p)
{
    double v = fabs((double)x);
    switch (kind) {
    case 0: return v * v;
    case 1: return v;
    case 2: return pow(v, p);
    default: return v;
    }
}

/* Fixed-shape block reduction in double (sum, or max with NaN winning). */
__device__ double block_reduce(double v, bool is_max, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            double o = sh[threadIdx.x + s];
            sh[threadIdx.x] = is_max ? max_nan(sh[threadIdx.x], o) : sh[threadIdx.x] + o;
        }
        __syncthreads();
    }
    return sh[0];
}

template <typename T>
__global__ void chunk_partials(const T *x, int64_t n, int kind, double p, double *parts)
{
    __shared__ double sh[THREADS];
    const int64_t lo = (int64_t)blockIdx.x * CHUNK;
    const int64_t hi = lo + CHUNK < n ? lo + CHUNK : n;
    const bool is_max = kind == 3;
    double acc = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        double t = term(x[i], kind, p);
        acc = is_max ? max_nan(acc, t) : acc + t;
    }
    double r = block_reduce(acc, is_max, sh);
    if (threadIdx.x == 0) parts[blockIdx.x] = r;
}

__global__ void sum_partials(const double *parts, int64_t nb, int kind, double *out)
{
    __shared__ double sh[THREADS];
    const bool is_max = kind == 3;
    double acc = 0;
    for (int64_t i = threadIdx.x; i < nb; i += blockDim.x) acc = is_max ? max_nan(acc, parts[i]) : acc + parts[i];
    double r = block_reduce(acc, is_max, sh);
    if (threadIdx.x == 0) *out = r;
}

template <typename T>
__global__ void partial_ref(const T *x, int64_t n, int kind, double p, double *out)
{
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        double t = term(x[i], kind, p);
        acc = kind == 3 ? max_nan(acc, t) : acc + t;
    }
    *out = acc;
}

template <typename T> __global__ void scale_kernel(T *x, int64_t n, T c)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= c;
}

/* a NaN compares false both ways and is kept */
template <typename T> __global__ void clamp_kernel(T *x, int64_t n, T c)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T v = x[i];
        x[i] = v > c ? c : v < -c ? -c : v;
    }
}

__global__ void unscale_kernel(float *g, int64_t n, float inv, int *flag)
{
    bool bad = false;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = g[i] * inv;
        g[i] = v;
        bad |= !isfinite(v);
    }
    if (bad) *flag = 1;
}

/* A one-element device scratch tensor of dtype dt on x's device (current frame). */
ct_tensor *scratch(const ct_tensor *x, ct_dtype dt, int64_t n)
{
    return ct_tensor_empty_on(x->device, dt, 1, &n);
}

ct_status read_double(const ct_tensor *dev_val, double *out, const char *op)
{
    return cti_cuda_copy_host(dev_val->device.index, out, ct_tensor_data(dev_val), sizeof(double), 1, NULL, op);
}

} // namespace

extern "C" ct_status cti_cuda_norm_partial(const ct_tensor *x, int kind, double p, double *out)
{
    const char *op = "norm_partial";
    const int64_t n = ct_tensor_numel(x), nb = (n + CHUNK - 1) / CHUNK;
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *parts = scratch(x, CT_DTYPE_F64, nb), *res = scratch(x, CT_DTYPE_F64, 1);
    if (!parts || !res) st = ct_last_status();
    if (!st) {
        cudaStream_t s = cti_cu_stream(x);
        if (x->dtype == CT_DTYPE_F64)
            chunk_partials<double><<<(unsigned)nb, THREADS, 0, s>>>(cti_cu_ptr<double>(x), n, kind, p,
                                                                    cti_cu_ptr<double>(parts));
        else
            chunk_partials<float><<<(unsigned)nb, THREADS, 0, s>>>(cti_cu_ptr<float>(x), n, kind, p,
                                                                   cti_cu_ptr<double>(parts));
        st = cti_cuda_launched(op, x);
        if (!st) {
            sum_partials<<<1, THREADS, 0, s>>>(cti_cu_ptr<double>(parts), nb, kind, cti_cu_ptr<double>(res));
            st = cti_cuda_launched(op, x);
        }
        if (!st) st = read_double(res, out, op);
    }
    ct_frame_pop();
    return st;
}

extern "C" ct_status cti_cuda_norm_partial_ref(const ct_tensor *x, int kind, double p, double *out)
{
    const char *op = "norm_partial_ref";
    ct_status st;
    ct_frame_push();
    ct_tensor *res = scratch(x, CT_DTYPE_F64, 1);
    st = res ? CT_OK : ct_last_status();
    if (!st) {
        cudaStream_t s = cti_cu_stream(x);
        if (x->dtype == CT_DTYPE_F64)
            partial_ref<double><<<1, 1, 0, s>>>(cti_cu_ptr<double>(x), ct_tensor_numel(x), kind, p,
                                                cti_cu_ptr<double>(res));
        else
            partial_ref<float><<<1, 1, 0, s>>>(cti_cu_ptr<float>(x), ct_tensor_numel(x), kind, p,
                                               cti_cu_ptr<double>(res));
        st = cti_cuda_launched(op, x);
        if (!st) st = read_double(res, out, op);
    }
    ct_frame_pop();
    return st;
}

extern "C" ct_status cti_cuda_scale_(ct_tensor *x, double coef)
{
    const int64_t n = ct_tensor_numel(x);
    if (n == 0) return CT_OK;
    cudaStream_t s = cti_cu_stream(x);
    if (x->dtype == CT_DTYPE_F64)
        scale_kernel<double><<<cti_cu_blocks(n, THREADS), THREADS, 0, s>>>(cti_cu_ptr<double>(x), n, coef);
    else
        scale_kernel<float><<<cti_cu_blocks(n, THREADS), THREADS, 0, s>>>(cti_cu_ptr<float>(x), n, (float)coef);
    return cti_cuda_launched("scale_", x);
}

extern "C" ct_status cti_cuda_clamp_abs_(ct_tensor *x, double v)
{
    const int64_t n = ct_tensor_numel(x);
    if (n == 0) return CT_OK;
    cudaStream_t s = cti_cu_stream(x);
    if (x->dtype == CT_DTYPE_F64)
        clamp_kernel<double><<<cti_cu_blocks(n, THREADS), THREADS, 0, s>>>(cti_cu_ptr<double>(x), n, v);
    else
        clamp_kernel<float><<<cti_cu_blocks(n, THREADS), THREADS, 0, s>>>(cti_cu_ptr<float>(x), n, (float)v);
    return cti_cuda_launched("clamp_abs_", x);
}

extern "C" ct_status cti_cuda_unscale_(int n, ct_tensor *const *grads, float inv, bool *found_inf)
{
    const char *op = "unscale_";
    const ct_tensor *first = NULL;
    for (int i = 0; i < n && !first; i++) first = grads[i];
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *flag = scratch(first, CT_DTYPE_I32, 1);
    if (!flag) st = ct_last_status();
    cudaStream_t s = cti_cu_stream(first);
    if (!st) st = cti_cuda_check(cudaMemsetAsync(ct_tensor_data(flag), 0, sizeof(int), s), op, first->device.index, "");
    for (int i = 0; i < n && !st; i++) {
        const int64_t m = grads[i] ? ct_tensor_numel(grads[i]) : 0;
        if (m == 0) continue;
        unscale_kernel<<<cti_cu_blocks(m, THREADS), THREADS, 0, s>>>(cti_cu_ptr<float>(grads[i]), m, inv,
                                                                     cti_cu_ptr<int>(flag));
        st = cti_cuda_launched(op, grads[i]);
    }
    int host = 0;
    if (!st) st = cti_cuda_copy_host(first->device.index, &host, ct_tensor_data(flag), sizeof host, 1, NULL, op);
    ct_frame_pop();
    if (!st) *found_inf = host != 0;
    return st;
}
