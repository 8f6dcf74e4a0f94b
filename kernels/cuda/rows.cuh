/* ctrain — helpers for the CUDA kernels that work on rows (softmax, norms,
 * cross-entropy, embedding): double-precision element access for the _ref kernels,
 * index tensors (read, range check, error position) and a deterministic sum of a
 * short vector by one block. */
#ifndef CT_KERNELS_CUDA_ROWS_CUH
#define CT_KERNELS_CUDA_ROWS_CUH

#include "kernels/cuda/common.cuh"

/* Element of storage type T as a double, and a double rounded once to T (the _ref
 * kernels: the CPU references store through ct_scalar_store, which rounds a double
 * directly, never through f32). */
template <typename T> __device__ __forceinline__ double ldd(const T *p) { return (double)ld<T>(p); }
template <typename T> __device__ __forceinline__ void std_(T *p, double v) { st<T>(p, (typename cti_acc<T>::type)v); }
template <> __device__ __forceinline__ void std_<cti_bf16>(cti_bf16 *p, double v) { p->bits = cti_f64_to_bf16_bits(v); }
template <> __device__ __forceinline__ void std_<cti_f16>(cti_f16 *p, double v) { p->bits = cti_f64_to_f16_bits(v); }

/* exp and log in the compute type (f32 math for f32, f64 for f64). */
__device__ __forceinline__ float cu_exp(float v) { return expf(v); }
__device__ __forceinline__ double cu_exp(double v) { return exp(v); }
__device__ __forceinline__ float cu_log(float v) { return logf(v); }
__device__ __forceinline__ double cu_log(double v) { return log(v); }

/* ---- one row per warp or per block ----------------------------------------------
 * Reductions over the threads that share a row: a warp (BLOCK false), or the whole
 * block. scratch: __shared__ A[32]; the block versions contain __syncthreads. */
template <bool BLOCK, typename A> __device__ __forceinline__ A group_max(A v, A *scratch)
{
    if constexpr (BLOCK) return cti_block_max(v, scratch);
    else return cti_warp_max(v);
}

template <bool BLOCK> __device__ __forceinline__ double group_sum(double v, double *scratch)
{
    if constexpr (BLOCK) return cti_block_sum(v, scratch);
    else return cti_warp_sum(v);
}

/* The row this group starts on, the rows it steps by, and its thread's rank in it. */
template <bool BLOCK> struct row_group {
    int64_t first, step;
    int rank, size;
    __device__ row_group()
    {
        if constexpr (BLOCK) {
            first = blockIdx.x, step = gridDim.x, rank = threadIdx.x, size = blockDim.x;
        } else {
            int per_block = blockDim.x >> 5;
            first = (int64_t)blockIdx.x * per_block + (threadIdx.x >> 5);
            step = (int64_t)gridDim.x * per_block, rank = threadIdx.x & 31, size = 32;
        }
    }
};

/* The softmax statistics of one row in a single read (online): m = max x (NaN never
 * enters it, as on the CPU) and s = sum exp(x - m) in double, rescaled by
 * exp(old - new) whenever a thread's max grows, then merged over the group. A row
 * whose max is infinite (all -inf, or a +inf) gets s = NaN, which is what the
 * two-pass formula gives there (exp(-inf - -inf), exp(inf - inf)); -inf entries of
 * any other row add exactly 0. Every thread of the group gets m and s; contains
 * the group's reductions (call from all its threads). */
template <bool BLOCK, typename T>
__device__ __forceinline__ void row_softmax_stats(const T *xr, int64_t C, const row_group<BLOCK> &grp,
                                                  typename cti_acc<T>::type *smax, double *ssum,
                                                  typename cti_acc<T>::type *m_out, double *s_out)
{
    typedef typename cti_acc<T>::type A;
    A m = -INFINITY;
    double s = 0;
    for (int64_t i = grp.rank; i < C; i += grp.size) {
        const A v = ld(xr + i);
        if (v > m) {
            s = s * (double)cu_exp(m - v) + 1.0; /* exp(-inf) = 0 for the first finite v */
            m = v;
        } else if (v != -INFINITY) {
            s += (double)cu_exp(v - m); /* NaN v: NaN, as on the CPU */
        }
    }
    const A M = group_max<BLOCK>(m, smax);
    s = group_sum<BLOCK>(m == M ? s : s * (double)cu_exp(m - M), ssum);
    /* no elements (C = 0) keep m = -inf, s = 0, as on the CPU */
    if (C > 0 && isinf(M)) s = NAN;
    *m_out = M;
    *s_out = s;
}

/* Entry i of an i64 (i64 true) or i32 index buffer. */
__device__ __forceinline__ int64_t cti_cu_index_at(const void *p, bool i64, int64_t i)
{
    return i64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* Rows of a contiguous tensor: its last dim is the row (1 for 0-d). */
static inline int64_t cti_cu_row_len(const ct_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }
static inline int64_t cti_cu_row_count(const ct_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim - 1; d++) n *= t->shape[d];
    return n;
}

/* The range check of an index tensor (embedding ids, cross-entropy targets), on the
 * device. Entries equal to ignore are skipped when skip is set. Writes, into a small
 * device buffer, the number of counted entries and the flat position and value of the
 * first entry outside [0, V) (-1 when none), then copies them to the host: the one
 * synchronisation of these ops, needed because their API reports a bad index as an
 * error of the call itself, before anything is written (as the CPU does).
 * counted (when not NULL) receives a device pointer to the count, valid in the
 * current frame and ordered on idx's stream. Returns CT_OK (bad->pos = -1 when all
 * are in range), or a device error. */
struct cti_cu_index_check {
    int64_t count, pos, value;
};
ct_status cti_cuda_index_check(const char *op, const ct_tensor *idx, int64_t V, bool skip, int64_t ignore,
                               cti_cu_index_check *bad, const int64_t **counted);

/* Flat position i of t as a multi-index "[1, 2]" into buf; returns buf. */
const char *cti_cuda_index_pos(const ct_tensor *t, int64_t i, char *buf, int cap);

#endif
