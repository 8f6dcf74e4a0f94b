/* ctrain — CUDA embedding: gather forward, deterministic scatter-add backward.
 *
 * forward   weight (V, C), ids (n) -> out (n, C); out[i] = weight[ids[i]], a copy of
 *           elements of any dtype (by their size: 1, 2, 4 or 8 bytes).
 * backward  dweight (V, C) += dout rows by id, without float atomics, as a stable
 *           counting sort of the positions by id:
 *             1. count[v] = #positions with id v              (integer atomics: exact)
 *             2. start = exclusive prefix sum of count        (one block)
 *             3. pos[start[v] ..] = the positions of id v, increasing
 *                (one block walks the ids in tiles of PLACE_TILE; a position's slot
 *                is its id's cursor plus the number of equal ids before it in the
 *                tile, so the placement is stable and the same on every run)
 *             4. one block per dweight row adds its dout rows in position order,
 *                in f32 (f64 for f64 dweight), rounding the row once.
 *           For f32 that is bit for bit the CPU's result (and the naive loop
 *           for n: dweight[ids[n]] += dout[n]). O(V + n) scratch.
 * Ids are checked first (kernels/cuda/rows.cu): one synchronisation per call.
 */
#include "kernels/cuda/embedding.h"

#include "kernels/cuda/rows.cuh"

extern "C" {
#include "kernels/dispatch_internal.h"
}

#define COPY_THREADS 256
#define SCAN_THREADS 1024
#define PLACE_TILE 1024
#define ROW_THREADS 256
#define REF_THREADS 128

/* ---- forward ---------------------------------------------------------------------- */

// weight (V, C), ids (n) -> out (n, C), elements of E's size
template <typename E>
__global__ void gather_kernel(const E *__restrict__ w, const void *__restrict__ ids, bool i64, E *__restrict__ out,
                              int64_t n, int64_t C)
{
    const int64_t total = n * C;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / C, c = e - i * C;
        out[e] = w[cti_cu_index_at(ids, i64, i) * C + c];
    }
}

template <typename E>
__global__ void gather_ref_kernel(const E *w, const void *ids, bool i64, E *out, int64_t n, int64_t C)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t id = cti_cu_index_at(ids, i64, i);
        for (int64_t c = 0; c < C; c++) out[i * C + c] = w[id * C + c];
    }
}

/* ---- backward: the stable counting sort -------------------------------------------- */

__global__ void fill_zero_kernel(unsigned long long *p, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) p[i] = 0;
}

__global__ void count_kernel(const void *__restrict__ ids, bool i64, int64_t n, unsigned long long *__restrict__ count)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        atomicAdd(count + cti_cu_index_at(ids, i64, i), 1ull);
}

// count (V) -> start (V + 1) exclusive prefix sums, cursor (V) = start; one block
__global__ void scan_kernel(const unsigned long long *__restrict__ count, int64_t V, int64_t *__restrict__ start,
                            int64_t *__restrict__ cursor)
{
    __shared__ int64_t part[SCAN_THREADS];
    const int64_t per = (V + blockDim.x - 1) / blockDim.x;
    const int64_t v0 = threadIdx.x * per, v1 = v0 + per < V ? v0 + per : V;
    int64_t s = 0;
    for (int64_t v = v0; v < v1; v++) s += (int64_t)count[v];
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t acc = 0;
        for (unsigned k = 0; k < blockDim.x; k++) {
            int64_t c = part[k];
            part[k] = acc;
            acc += c;
        }
        start[V] = acc;
    }
    __syncthreads();
    s = part[threadIdx.x];
    for (int64_t v = v0; v < v1; v++) {
        start[v] = s;
        cursor[v] = s;
        s += (int64_t)count[v];
    }
}

// ids (n) -> pos (n): positions grouped by id, increasing within an id; one block of PLACE_TILE
__global__ void place_kernel(const void *__restrict__ ids, bool i64, int64_t n, int64_t *__restrict__ cursor,
                             int64_t *__restrict__ pos)
{
    __shared__ int64_t tile[PLACE_TILE];
    const int t = threadIdx.x;
    for (int64_t base = 0; base < n; base += PLACE_TILE) {
        const int64_t i = base + t;
        const int len = n - base < PLACE_TILE ? (int)(n - base) : PLACE_TILE;
        const int64_t id = i < n ? cti_cu_index_at(ids, i64, i) : -1;
        tile[t] = id;
        __syncthreads();
        int64_t rank = 0;
        bool last = true;
        if (i < n) {
            for (int k = 0; k < t; k++) rank += tile[k] == id;
            for (int k = t + 1; k < len && last; k++) last = tile[k] != id;
            pos[cursor[id] + rank] = i;
        }
        __syncthreads(); /* every slot of this tile is read from cursor before it moves */
        if (i < n && last) cursor[id] += rank + 1;
        __syncthreads(); /* the moved cursors (and the free tile) for the next tile */
    }
}

// dweight (V, C) += sum of dout[pos[j]] for j in [start[v], start[v + 1]), in j order
template <typename W, typename D>
__global__ void accumulate_kernel(W *__restrict__ dw, const D *__restrict__ dout, const int64_t *__restrict__ start,
                                  const int64_t *__restrict__ pos, int64_t V, int64_t C)
{
    typedef typename cti_acc<W>::type A;
    for (int64_t v = blockIdx.x; v < V; v += gridDim.x) {
        const int64_t b = start[v], e = start[v + 1];
        if (b == e) continue;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            A acc = ld(dw + v * C + c);
            /* each term rounded to the accumulator's type first, as the CPU converts dout rows */
            for (int64_t j = b; j < e; j++) acc += (A)ld(dout + pos[j] * C + c);
            st(dw + v * C + c, acc);
        }
    }
}

// dweight[v, c] += sum over positions i with ids[i] = v of dout[i, c], in double, rounded once
template <typename W, typename D>
__global__ void accumulate_ref_kernel(W *dw, const D *dout, const void *ids, bool i64, int64_t n, int64_t V, int64_t C)
{
    const int64_t total = V * C;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t v = e / C, c = e - v * C;
        double acc = ldd(dw + e);
        bool touched = false;
        for (int64_t i = 0; i < n; i++)
            if (cti_cu_index_at(ids, i64, i) == v) acc += ldd(dout + i * C + c), touched = true;
        if (touched) std_(dw + e, acc);
    }
}

/* ---- host side --------------------------------------------------------------------- */

/* Every id in [0, V). */
static ct_status check_ids(const char *op, const ct_tensor *ids, const char *name, const ct_tensor *table)
{
    int64_t V = table->shape[0];
    cti_cu_index_check bad;
    ct_status st = cti_cuda_index_check(op, ids, V, false, 0, &bad, NULL);
    if (st || bad.pos < 0) return st;
    char pos[160], a[200], b[200];
    return ct_error_set(CT_ERR_INVALID,
                        "%s: id %lld at position %s of ids %s is out of range for the V = %lld rows of %s %s "
                        "(expected 0 <= id < %lld)",
                        op, (long long)bad.value, cti_cuda_index_pos(ids, bad.pos, pos, sizeof pos),
                        ct_tensor_describe(ids, a, sizeof a), (long long)V, name,
                        ct_tensor_describe(table, b, sizeof b), (long long)V);
}

template <typename E>
static void launch_gather(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out, bool ref, cudaStream_t s)
{
    int64_t n = ct_tensor_numel(ids), C = weight->shape[1];
    const E *w = cti_cu_ptr<const E>(weight);
    E *o = cti_cu_ptr<E>(out);
    bool i64 = ids->dtype == CT_DTYPE_I64;
    if (ref)
        gather_ref_kernel<E><<<cti_cu_blocks(n, REF_THREADS), REF_THREADS, 0, s>>>(w, ct_tensor_data(ids), i64, o, n, C);
    else
        gather_kernel<E><<<cti_cu_blocks(n * C, COPY_THREADS), COPY_THREADS, 0, s>>>(w, ct_tensor_data(ids), i64, o, n, C);
}

static ct_status gather(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out, bool ref)
{
    const char *op = "embedding";
    ct_status st = cti_cuda_enter(weight->device.index, op);
    if (!st) st = check_ids(op, ids, "weight", weight);
    if (st) return st;
    if (ct_tensor_numel(out) == 0) return CT_OK;
    cudaStream_t s = cti_cu_stream(out);
    switch (ct_dtype_size(weight->dtype)) {
    case 1: launch_gather<uint8_t>(weight, ids, out, ref, s); break;
    case 2: launch_gather<uint16_t>(weight, ids, out, ref, s); break;
    case 4: launch_gather<uint32_t>(weight, ids, out, ref, s); break;
    case 8: launch_gather<uint64_t>(weight, ids, out, ref, s); break;
    default: return cti_kernel_unsupported_dtype(op, weight);
    }
    return cti_cuda_launched(op, out);
}

template <typename W, typename D>
static ct_status launch_accumulate(const char *op, ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids,
                                   bool ref, cudaStream_t s)
{
    int64_t n = ct_tensor_numel(ids), V = dweight->shape[0], C = dweight->shape[1];
    W *dw = cti_cu_ptr<W>(dweight);
    const D *d = cti_cu_ptr<const D>(dout);
    const void *ip = ct_tensor_data(ids);
    bool i64 = ids->dtype == CT_DTYPE_I64;
    if (ref) {
        accumulate_ref_kernel<W, D><<<cti_cu_blocks(V * C, REF_THREADS), REF_THREADS, 0, s>>>(dw, d, ip, i64, n, V, C);
        return cti_cuda_launched(op, dweight);
    }
    /* count (V) | start (V + 1) | cursor (V) | pos (n), as i64 */
    const int64_t words = 3 * V + 1 + n;
    ct_tensor *scratch = ct_tensor_empty_on(dweight->device, CT_DTYPE_I64, 1, &words);
    if (!scratch) return ct_last_status();
    int64_t *base = cti_cu_ptr<int64_t>(scratch);
    unsigned long long *count = (unsigned long long *)base;
    int64_t *start = base + V, *cursor = start + V + 1, *pos = cursor + V;
    fill_zero_kernel<<<cti_cu_blocks(V, 256), 256, 0, s>>>(count, V);
    count_kernel<<<cti_cu_blocks(n, 256), 256, 0, s>>>(ip, i64, n, count);
    scan_kernel<<<1, SCAN_THREADS, 0, s>>>(count, V, start, cursor);
    place_kernel<<<1, PLACE_TILE, 0, s>>>(ip, i64, n, cursor, pos);
    ct_status st = cti_cuda_launched(op, scratch);
    if (st) return st;
    int threads = C >= ROW_THREADS ? ROW_THREADS : (int)((C + 31) / 32 * 32);
    accumulate_kernel<W, D><<<cti_cu_blocks(V, 1), threads, 0, s>>>(dw, d, start, pos, V, C);
    return cti_cuda_launched(op, dweight);
}

static ct_status scatter_add(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids, bool ref)
{
    const char *op = "embedding_backward";
    ct_status st = cti_cuda_enter(dweight->device.index, op);
    if (!st) st = check_ids(op, ids, "dweight", dweight);
    if (st) return st;
    if (ct_tensor_numel(ids) == 0 || dweight->shape[1] == 0) return CT_OK;
    cudaStream_t s = cti_cu_stream(dweight);
    CTI_CU_DISPATCH_FLOAT(dweight->dtype, W, {
        CTI_CU_DISPATCH_FLOAT(dout->dtype, D, { return launch_accumulate<W, D>(op, dweight, dout, ids, ref, s); })
        return cti_kernel_unsupported_dtype(op, dout);
    })
    return cti_kernel_unsupported_dtype(op, dweight);
}

ct_status cti_cuda_embedding(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out)
{
    return gather(weight, ids, out, false);
}

ct_status cti_cuda_embedding_ref(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out)
{
    return gather(weight, ids, out, true);
}

ct_status cti_cuda_embedding_backward(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids)
{
    return scatter_add(dweight, dout, ids, false);
}

ct_status cti_cuda_embedding_backward_ref(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids)
{
    return scatter_add(dweight, dout, ids, true);
}
