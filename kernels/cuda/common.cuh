/* ctrain — what every CUDA kernel file includes (the .cu files of kernels/cuda and core).
 *
 * - element access: ld<T>(p) reads one element of storage type T as float (double
 *   for f64), st<T>(p, v) writes v rounded to T with the same bits the CPU gives
 *   (core/convert_bits.h: round to nearest even; fp8 saturates on request);
 * - the dtype switch: CTI_CU_DISPATCH_FLOAT(dtype, T, ...) runs its body with T the
 *   storage type of an f32/f64/bf16/f16 tensor;
 * - reductions within a warp and a block;
 * - launch geometry and the stream of a tensor's device.
 *
 * Half types are stored as raw bits (cti_bf16, cti_f16: uint16_t wrappers) so that
 * every conversion goes through the shared bit functions; the tensor-core paths
 * (cuBLASLt, attention) reinterpret them as __nv_bfloat16 / __half.
 */
#ifndef CT_KERNELS_CUDA_COMMON_CUH
#define CT_KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "core/convert.h"
#include "core/convert_bits.h"
#include "core/cuda_internal.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/frame.h"
#include "core/tensor.h"
}

/* The storage types of the 16- and 8-bit float dtypes. */
struct cti_bf16 { uint16_t bits; };
struct cti_f16 { uint16_t bits; };
struct cti_e4m3 { uint8_t bits; };
struct cti_e5m2 { uint8_t bits; };

/* The arithmetic type of a storage type: float, except double for f64. */
template <typename T> struct cti_acc { typedef float type; };
template <> struct cti_acc<double> { typedef double type; };

template <typename T> __device__ __forceinline__ typename cti_acc<T>::type ld(const T *p) { return *p; }
template <> __device__ __forceinline__ float ld<cti_bf16>(const cti_bf16 *p) { return cti_bf16_bits_to_f32(p->bits); }
template <> __device__ __forceinline__ float ld<cti_f16>(const cti_f16 *p) { return cti_f16_bits_to_f32(p->bits); }
template <> __device__ __forceinline__ float ld<cti_e4m3>(const cti_e4m3 *p) { return cti_e4m3_bits_to_f32(p->bits); }
template <> __device__ __forceinline__ float ld<cti_e5m2>(const cti_e5m2 *p) { return cti_e5m2_bits_to_f32(p->bits); }

template <typename T> __device__ __forceinline__ void st(T *p, typename cti_acc<T>::type v) { *p = (T)v; }
template <> __device__ __forceinline__ void st<cti_bf16>(cti_bf16 *p, float v) { p->bits = cti_f32_to_bf16_bits(v); }
template <> __device__ __forceinline__ void st<cti_f16>(cti_f16 *p, float v) { p->bits = cti_f32_to_f16_bits(v); }
template <> __device__ __forceinline__ void st<cti_e4m3>(cti_e4m3 *p, float v) { p->bits = cti_f32_to_e4m3_bits(v, false); }
template <> __device__ __forceinline__ void st<cti_e5m2>(cti_e5m2 *p, float v) { p->bits = cti_f32_to_e5m2_bits(v, false); }

/* Runs the statement list with T the storage type of a float dtype (f32, f64, bf16,
 * f16); any other dtype falls to the default, which the caller writes after it:
 *     CTI_CU_DISPATCH_FLOAT(x->dtype, T, { launch<T>(...); })
 *     else return cti_kernel_unsupported_dtype(op, x);   -- not reached for floats */
#define CTI_CU_DISPATCH_FLOAT(dt, T, ...)                         \
    if ((dt) == CT_DTYPE_F32) {                                   \
        typedef float T;                                          \
        __VA_ARGS__                                               \
    } else if ((dt) == CT_DTYPE_F64) {                            \
        typedef double T;                                         \
        __VA_ARGS__                                               \
    } else if ((dt) == CT_DTYPE_BF16) {                           \
        typedef cti_bf16 T;                                       \
        __VA_ARGS__                                               \
    } else if ((dt) == CT_DTYPE_F16) {                            \
        typedef cti_f16 T;                                        \
        __VA_ARGS__                                               \
    }

/* ---- reductions ------------------------------------------------------------------ */

template <typename A> __device__ __forceinline__ A cti_warp_sum(A v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename A> __device__ __forceinline__ A cti_warp_max(A v)
{
    for (int o = 16; o > 0; o >>= 1) {
        A w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
 * the result. scratch: __shared__ A[32]. Contains __syncthreads: call from all threads. */
template <typename A> __device__ __forceinline__ A cti_block_sum(A v, A *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = cti_warp_sum(v);
    __syncthreads(); /* scratch may still be read from a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : (A)0;
    return cti_warp_sum(v);
}

template <typename A> __device__ __forceinline__ A cti_block_max(A v, A *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = cti_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : scratch[0];
    return cti_warp_max(v);
}

/* ---- launch geometry --------------------------------------------------------------- */

/* Blocks of `threads` covering n elements with a grid-stride loop: at most 16 blocks
 * per SM-ish bound of 65535 * 8, at least 1. */
static inline unsigned cti_cu_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)b;
}

/* The current stream of t's device for the calling thread. */
static inline cudaStream_t cti_cu_stream(const ct_tensor *t) { return (cudaStream_t)cti_cuda_stream(t->device.index); }

/* Typed data pointer of a contiguous tensor (storage + offset). */
template <typename T> static inline T *cti_cu_ptr(const ct_tensor *t) { return (T *)ct_tensor_data(t); }

#endif
