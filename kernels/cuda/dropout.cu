/* ctrain — CUDA dropout, forward and backward.
 *
 * x (n) -> y (n), mask (n) u8: word i of the stream (block first + i / 4, lane i % 4,
 * Philox4x32-10 from core/philox_bits.h, the CPU's own function) keeps element i iff
 * word >= ceil(p * 2^32);  y = keep ? x * (1 / (1 - p)) : 0  (f32 math for f32, bf16
 * and f16, rounded once; f64 for f64), as kernels/cpu/dropout.c computes it.
 * One thread per Philox block of four elements. p = 0 copies x with an all-ones mask
 * and p = 1 writes zeros and an all-zeros mask; neither reads the stream.
 * backward: dx = mask ? dy * (1 / (1 - p)) : 0, zeros for p = 1.
 */
#include "kernels/cuda/dropout.h"

#include "kernels/cuda/rows.cuh"

extern "C" {
#include "core/philox_bits.h"
#include "kernels/dispatch_internal.h"
}

#define THREADS 256

/* Smallest word that is kept: u32 >= p * 2^32 <=> u32 >= ceil(p * 2^32) (exact in
 * double: p * 2^32 only shifts the exponent). */
static uint64_t keep_threshold(double p) { return (uint64_t)ceil(p * 4294967296.0); }

// x (n) -> y (n), mask (n); thread per block of 4 words
template <typename T>
__global__ void dropout_kernel(const T *__restrict__ x, T *__restrict__ y, uint8_t *__restrict__ mask, int64_t n,
                               uint64_t seed, uint64_t first, uint64_t thr, typename cti_acc<T>::type scale)
{
    typedef typename cti_acc<T>::type A;
    const int64_t nb = (n + 3) / 4;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += (int64_t)gridDim.x * blockDim.x) {
        uint32_t w[4];
        cti_philox_stream_block(seed, first + (uint64_t)b, w);
        const int64_t i0 = 4 * b;
        const int m = n - i0 < 4 ? (int)(n - i0) : 4;
        for (int k = 0; k < m; k++) {
            const bool keep = (uint64_t)w[k] >= thr;
            mask[i0 + k] = keep;
            st(y + i0 + k, keep ? ld(x + i0 + k) * scale : (A)0);
        }
    }
}

/* p = 0 (keep): y = x bit for bit, mask 1; p = 1: y = +0, mask 0 */
template <typename T>
__global__ void dropout_all_kernel(const T *__restrict__ x, T *__restrict__ y, uint8_t *__restrict__ mask, int64_t n,
                                   bool keep)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        mask[i] = keep;
        if (keep) y[i] = x[i];
        else memset(y + i, 0, sizeof(T)); /* all-zero bits are +0 in every float format */
    }
}

// dy (n), mask (n) -> dx (n) = mask ? dy * scale : 0; zeros when zero is set (p = 1)
template <typename T>
__global__ void dropout_backward_kernel(const T *__restrict__ dy, const uint8_t *__restrict__ mask, T *__restrict__ dx,
                                        int64_t n, typename cti_acc<T>::type scale, bool zero)
{
    typedef typename cti_acc<T>::type A;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        st(dx + i, !zero && mask[i] ? ld(dy + i) * scale : (A)0);
}

/* ---- reference: one thread per element, the rule literally, in double ---------------- */

template <typename T>
__global__ void dropout_ref_kernel(const T *x, T *y, uint8_t *mask, int64_t n, uint64_t seed, uint64_t first, double p)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        bool keep;
        if (p == 0) {
            keep = true;
        } else if (p == 1) {
            keep = false;
        } else {
            uint32_t w[4];
            cti_philox_stream_block(seed, first + (uint64_t)(i / 4), w);
            keep = (double)w[i % 4] >= p * 4294967296.0;
        }
        mask[i] = keep;
        std_(y + i, keep ? ldd(x + i) / (1 - p) : 0);
    }
}

template <typename T> __global__ void dropout_backward_ref_kernel(const T *dy, const uint8_t *mask, T *dx, int64_t n, double p)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        std_(dx + i, mask[i] && p < 1 ? ldd(dy + i) / (1 - p) : 0);
}

/* ---- host side --------------------------------------------------------------------- */

template <typename T>
static void launch_forward(const ct_tensor *x, double p, uint64_t seed, uint64_t first, ct_tensor *y, ct_tensor *mask,
                           bool ref, cudaStream_t s)
{
    typedef typename cti_acc<T>::type A;
    int64_t n = ct_tensor_numel(x);
    const T *xp = cti_cu_ptr<const T>(x);
    T *yp = cti_cu_ptr<T>(y);
    uint8_t *mp = cti_cu_ptr<uint8_t>(mask);
    if (ref)
        dropout_ref_kernel<T><<<cti_cu_blocks(n, THREADS), THREADS, 0, s>>>(xp, yp, mp, n, seed, first, p);
    else if (p == 0 || p == 1)
        dropout_all_kernel<T><<<cti_cu_blocks(n, THREADS), THREADS, 0, s>>>(xp, yp, mp, n, p == 0);
    else
        dropout_kernel<T><<<cti_cu_blocks((n + 3) / 4, THREADS), THREADS, 0, s>>>(xp, yp, mp, n, seed, first,
                                                                                  keep_threshold(p), (A)(1.0 / (1.0 - p)));
}

static ct_status forward(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask, bool ref)
{
    const char *op = "dropout";
    int64_t n = ct_tensor_numel(x);
    if (n == 0) return CT_OK;
    ct_status st = cti_cuda_enter(y->device.index, op);
    if (st) return st;
    /* the words ct_rng_u32 would read, and the same advance of rng; p = 0 and 1 read none */
    uint64_t seed = 0, first = 0;
    if (p > 0 && p < 1) cti_rng_reserve_blocks(rng, (uint64_t)((n + 3) / 4), &seed, &first);
    cudaStream_t s = cti_cu_stream(y);
    CTI_CU_DISPATCH_FLOAT(x->dtype, T, { launch_forward<T>(x, p, seed, first, y, mask, ref, s); })
    else return cti_kernel_unsupported_dtype(op, x);
    return cti_cuda_launched(op, y);
}

static ct_status backward(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx, bool ref)
{
    const char *op = "dropout_backward";
    int64_t n = ct_tensor_numel(dy);
    if (n == 0) return CT_OK;
    ct_status st = cti_cuda_enter(dx->device.index, op);
    if (st) return st;
    cudaStream_t s = cti_cu_stream(dx);
    /* u8 and bool masks alike: any non-zero byte keeps */
    const uint8_t *mp = cti_cu_ptr<const uint8_t>(mask);
    unsigned blocks = cti_cu_blocks(n, THREADS);
    CTI_CU_DISPATCH_FLOAT(dy->dtype, T, {
        typedef typename cti_acc<T>::type A;
        if (ref)
            dropout_backward_ref_kernel<T><<<blocks, THREADS, 0, s>>>(cti_cu_ptr<const T>(dy), mp, cti_cu_ptr<T>(dx), n, p);
        else
            dropout_backward_kernel<T><<<blocks, THREADS, 0, s>>>(cti_cu_ptr<const T>(dy), mp, cti_cu_ptr<T>(dx), n,
                                                                 p < 1 ? (A)(1.0 / (1.0 - p)) : (A)0, p == 1);
    })
    else return cti_kernel_unsupported_dtype(op, dy);
    return cti_cuda_launched(op, dx);
}

ct_status cti_cuda_dropout(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask)
{
    return forward(x, p, rng, y, mask, false);
}

ct_status cti_cuda_dropout_ref(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask)
{
    return forward(x, p, rng, y, mask, true);
}

ct_status cti_cuda_dropout_backward(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx)
{
    return backward(dy, mask, p, dx, false);
}

ct_status cti_cuda_dropout_backward_ref(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx)
{
    return backward(dy, mask, p, dx, true);
}
