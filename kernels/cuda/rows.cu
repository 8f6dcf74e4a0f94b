/* ctrain — the index range check shared by the CUDA embedding and cross-entropy
 * kernels (see kernels/cuda/rows.cuh).
 *
 * One block scans the indices with a block-stride loop: integer sums and a
 * minimum, so the result is exact and the same on every run. */
#include "kernels/cuda/rows.cuh"

#define CHECK_THREADS 1024

/* idx (n) -> out[0] = #entries counted (not ignored, in range),
 * out[1] = first position outside [0, V) or -1, out[2] = its value. */
__global__ void index_check_kernel(const void *idx, bool i64, int64_t n, int64_t V, bool skip, int64_t ignore,
                                   int64_t *out)
{
    __shared__ long long s_count[CHECK_THREADS / 32];
    __shared__ long long s_first[CHECK_THREADS / 32];
    long long count = 0, first = LLONG_MAX;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        int64_t v = cti_cu_index_at(idx, i64, i);
        if (skip && v == ignore) continue;
        if (v < 0 || v >= V) {
            if (i < first) first = i;
        } else {
            count++;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        count += __shfl_xor_sync(0xffffffffu, count, o);
        long long f = __shfl_xor_sync(0xffffffffu, first, o);
        first = f < first ? f : first;
    }
    if (lane == 0) s_count[warp] = count, s_first[warp] = first;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long c = 0, f = LLONG_MAX;
        for (int w = 0; w < nwarps; w++) {
            c += s_count[w];
            f = s_first[w] < f ? s_first[w] : f;
        }
        out[1] = f == LLONG_MAX ? -1 : f;
        out[2] = f == LLONG_MAX ? 0 : cti_cu_index_at(idx, i64, f);
        /* the CPU counts the entries before the first bad one; with a bad entry the op
         * fails and the count is not used, so the total is kept */
        out[0] = c;
    }
}

ct_status cti_cuda_index_check(const char *op, const ct_tensor *idx, int64_t V, bool skip, int64_t ignore,
                               cti_cu_index_check *bad, const int64_t **counted)
{
    const int64_t three = 3;
    ct_tensor *buf = ct_tensor_empty_on(idx->device, CT_DTYPE_I64, 1, &three);
    if (!buf) return ct_last_status();
    int64_t *d = cti_cu_ptr<int64_t>(buf);
    cudaStream_t s = cti_cu_stream(idx);
    index_check_kernel<<<1, CHECK_THREADS, 0, s>>>(ct_tensor_data(idx), idx->dtype == CT_DTYPE_I64,
                                                   ct_tensor_numel(idx), V, skip, ignore, d);
    ct_status st = cti_cuda_launched(op, idx);
    if (st) return st;
    int64_t h[3];
    st = cti_cuda_copy_host(idx->device.index, h, d, sizeof h, 1, s, op);
    if (st) return st;
    bad->count = h[0];
    bad->pos = h[1];
    bad->value = h[2];
    if (counted) *counted = d;
    return CT_OK;
}

const char *cti_cuda_index_pos(const ct_tensor *t, int64_t i, char *buf, int cap)
{
    int64_t idx[CT_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    return ct_shape_str(t->ndim, idx, buf, cap);
}
