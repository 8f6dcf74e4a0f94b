/* CUDA reductions: sum, mean, max, min, var, argmax.
 *
 *   x (...) -> out (x's kept dims); out[o] = reduce over the reduced dims of x[o, r]
 *
 * As on the CPU (kernels/cpu/reduce.c) the dims are split into a kept and a
 * reduced list (size-1 dims dropped, each list coalesced where strides allow), so
 * a reduction is "nout outputs, each over nred elements", in one of two layouts:
 *   inner  each output's elements are read by one thread (nred <= 16), one warp
 *          (nred <= 2048) or one block of 256 threads, strided by the lane, then
 *          combined by shuffles and shared memory: rows of a contiguous tensor,
 *          any strided view;
 *   outer  the kept dims end in a contiguous run of at least 16 outputs and the
 *          reduced dims do not (column sums of an (N, C) matrix): a block of
 *          32 x 8 threads takes 32 neighbouring outputs (coalesced loads across
 *          x) and splits the reduced range over y, combined in shared memory.
 * When there are too few outputs to fill the GPU, each output's reduced range is
 * cut into nsplit chunks whose partial results go to a scratch buffer, combined in
 * chunk order by a second kernel. Every choice depends on the shape only, and
 * every combination happens in a fixed order, so the bits never depend on the
 * device or on timing.
 *
 * Accumulation: double for float inputs (f16/bf16 widened exactly), rounded once
 * to out's dtype, as the CPU; int64 for integer inputs (sums wrap, as unsigned
 * 64-bit arithmetic). max/min propagate NaN: a NaN element takes over and stays.
 * mean = sum / nred; var = sum((x - mean)^2) / (nred - correction), the mean from
 * a first pass into a double scratch buffer.
 *
 * argmax: (value, index) pairs combined by "NaN beats everything, then the larger
 * value, then the smaller index", which makes the first NaN or else the first
 * maximum win whatever the combination order; one thread per output when the
 * reduced dim is strided and outputs are many, else a warp or a block.
 *
 * The *_ref kernels: one thread per output, x's own shape and strides, the
 * reduced elements in row-major order, a double (int64) accumulator. */
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.h"
#include "kernels/reduce_plan.h"

#include <limits.h>

enum { M_SUM, M_MAX, M_MIN, M_SQDEV }; /* MEAN is SUM, then a division */
enum { RED_THREADS = 256, RED_THREAD_MAX = 16, RED_WARP_MAX = 2048, OUTER_X = 32, OUTER_Y = 8, OUTER_MIN_RUN = 16 };
enum { GROUP_THREAD, GROUP_WARP, GROUP_BLOCK }; /* who reduces one item of the inner layout */

/* ---- plan ------------------------------------------------------------------------------------ */

/* Element offset of flat index i over the first n dims of (shape, stride), row-major;
 * constant indices keep the plan in parameter space. */
__device__ __forceinline__ int64_t plan_offset(int n, const int64_t *shape, const int64_t *stride, int64_t i)
{
    int64_t off = 0;
#pragma unroll
    for (int d = CT_MAX_DIMS - 1; d >= 0; d--) {
        if (d < n) {
            const int64_t q = cti_ew_div(i, shape[d]);
            off += (i - q * shape[d]) * stride[d];
            i = q;
        }
    }
    return off;
}

__device__ __forceinline__ int64_t plan_roff(const cti_red_plan &p, int64_t j)
{
    return p.nr == 1 ? j * p.rstride[0] : plan_offset(p.nr, p.rshape, p.rstride, j);
}

/* ---- accumulators ------------------------------------------------------------------------------ */

/* double for float inputs, long long for integer ones */
template <typename T> struct red_acc { typedef double type; };
template <> struct red_acc<int32_t> { typedef long long type; };
template <> struct red_acc<int64_t> { typedef long long type; };
template <> struct red_acc<uint8_t> { typedef long long type; };

__device__ __forceinline__ double red_identity(int m, double)
{
    return m == M_MAX ? -(double)INFINITY : m == M_MIN ? (double)INFINITY : 0.0;
}
__device__ __forceinline__ long long red_identity(int m, long long)
{
    return m == M_MAX ? LLONG_MIN : m == M_MIN ? LLONG_MAX : 0;
}

/* a (accumulated) with v (new): a NaN v takes over, a NaN a stays. */
__device__ __forceinline__ double red_combine(int m, double a, double v)
{
    if (m == M_MAX) return (v > a || v != v) ? v : a;
    if (m == M_MIN) return (v < a || v != v) ? v : a;
    return a + v;
}
__device__ __forceinline__ long long red_combine(int m, long long a, long long v)
{
    if (m == M_MAX) return v > a ? v : a;
    if (m == M_MIN) return v < a ? v : a;
    return (long long)((unsigned long long)a + (unsigned long long)v);
}

/* What one element adds: itself, or its squared deviation from the output's mean. */
__device__ __forceinline__ double red_elem(int m, double v, double mean)
{
    if (m == M_SQDEV) {
        const double d = v - mean;
        return d * d;
    }
    return v;
}
__device__ __forceinline__ long long red_elem(int, long long v, double) { return v; }

template <typename A> __device__ __forceinline__ A red_warp(int m, A v)
{
    for (int o = 16; o > 0; o >>= 1) v = red_combine(m, v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Over the block (blockDim.x a multiple of 32); thread 0 gets the result. Contains
 * __syncthreads: call from every thread. */
template <typename A> __device__ __forceinline__ A red_block(int m, A v, A *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = red_warp(m, v);
    __syncthreads(); /* scratch may still be read from the previous item */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? scratch[lane] : red_identity(m, v);
        v = red_warp(m, v);
    }
    return v;
}

/* ---- results ------------------------------------------------------------------------------------ */

enum { OUT_F32, OUT_F64, OUT_BF16, OUT_F16, OUT_I64, OUT_I32, OUT_U8 };

/* Where results go: p[o] of kind, after dividing float results by div when divide. */
typedef struct red_out {
    void *p;
    int kind;
    bool divide;
    double div;
} red_out;

static red_out out_of(const ct_tensor *t, bool divide, double div)
{
    red_out r = {ct_tensor_data(t), OUT_F32, divide, div};
    switch (t->dtype) {
    case CT_DTYPE_F64: r.kind = OUT_F64; break;
    case CT_DTYPE_BF16: r.kind = OUT_BF16; break;
    case CT_DTYPE_F16: r.kind = OUT_F16; break;
    case CT_DTYPE_I64: r.kind = OUT_I64; break;
    case CT_DTYPE_I32: r.kind = OUT_I32; break;
    case CT_DTYPE_U8:
    case CT_DTYPE_BOOL: r.kind = OUT_U8; break;
    default: break;
    }
    return r;
}

/* A double result rounded once to out's float dtype (the bits ct_convert_n gives from f64). */
__device__ __forceinline__ void red_store(const red_out &r, int64_t o, double v)
{
    if (r.divide) v /= r.div;
    switch (r.kind) {
    case OUT_F32: ((float *)r.p)[o] = (float)v; break;
    case OUT_F64: ((double *)r.p)[o] = v; break;
    case OUT_BF16: ((uint16_t *)r.p)[o] = cti_f64_to_bf16_bits(v); break;
    default: ((uint16_t *)r.p)[o] = cti_f64_to_f16_bits(v); break;
    }
}
__device__ __forceinline__ void red_store(const red_out &r, int64_t o, long long v)
{
    switch (r.kind) {
    case OUT_I64: ((int64_t *)r.p)[o] = v; break;
    case OUT_I32: ((int32_t *)r.p)[o] = (int32_t)v; break;
    default: ((uint8_t *)r.p)[o] = (uint8_t)v; break;
    }
}

/* ---- kernels --------------------------------------------------------------------------------------- */

/* Item it = (output o, chunk s) covers reduced elements [s * chunk, min(+chunk, nred)).
 * nsplit == 1 stores the result; else part[o * nsplit + s] gets the partial.
 * mean: per-output means for M_SQDEV, else NULL. */
template <typename T, typename A>
__global__ void reduce_inner_kernel(cti_red_plan p, int m, const T *x, const double *mean, int64_t nsplit, int64_t chunk,
                                    int group, A *part, red_out out)
{
    __shared__ A scratch[32];
    const int64_t items = p.nout * nsplit;
    const A id = red_identity(m, (A)0);
    const int lane = threadIdx.x & 31;
    /* the threads that share an item: one (GROUP_THREAD), a warp, or the block */
    const int64_t gsize = group == GROUP_THREAD ? 1 : group == GROUP_WARP ? 32 : blockDim.x;
    const int64_t gid = group == GROUP_THREAD ? 0 : group == GROUP_WARP ? lane : threadIdx.x;
    const int64_t groups = group == GROUP_THREAD ? (int64_t)gridDim.x * blockDim.x
                           : group == GROUP_WARP ? (int64_t)gridDim.x * (blockDim.x >> 5) : gridDim.x;
    const int64_t first = group == GROUP_THREAD ? (int64_t)blockIdx.x * blockDim.x + threadIdx.x
                          : group == GROUP_WARP ? (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)
                                                : blockIdx.x;
    /* every thread of a block runs the same number of GROUP_BLOCK iterations (first
     * and groups are per block there), so red_block's barriers are reached by all */
    for (int64_t it = first; it < items; it += groups) {
        const int64_t o = it / nsplit, s = it - o * nsplit;
        const int64_t j0 = s * chunk, j1 = j0 + chunk < p.nred ? j0 + chunk : p.nred;
        const T *base = x + plan_offset(p.nk, p.kshape, p.kstride, o);
        const double mo = mean ? mean[o] : 0.0;
        A acc = id;
        for (int64_t j = j0 + gid; j < j1; j += gsize)
            acc = red_combine(m, acc, red_elem(m, (A)cti_ew_ld(base + plan_roff(p, j)), mo));
        if (group == GROUP_WARP) acc = red_warp(m, acc);
        else if (group == GROUP_BLOCK) acc = red_block(m, acc, scratch);
        if (gid == 0) {
            if (nsplit == 1) red_store(out, o, acc);
            else part[o * nsplit + s] = acc;
        }
    }
}

/* Outputs o = ko * J + c with c in a contiguous run of J (the last kept dim, stride
 * 1); a block (OUTER_X, OUTER_Y) takes item it = ((ko, tile of OUTER_X columns), chunk s). */
template <typename T, typename A>
__global__ void reduce_outer_kernel(cti_red_plan p, int m, const T *x, const double *mean, int64_t J, int64_t ntile,
                                    int64_t nsplit, int64_t chunk, A *part, red_out out)
{
    __shared__ A sm[OUTER_Y][OUTER_X + 1];
    const int64_t items = p.nout / J * ntile * nsplit;
    const A id = red_identity(m, (A)0);
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        const int64_t s = it % nsplit, t = it / nsplit, ko = t / ntile, c = (t - ko * ntile) * OUTER_X + threadIdx.x;
        const int64_t o = ko * J + c;
        const int64_t j0 = s * chunk, j1 = j0 + chunk < p.nred ? j0 + chunk : p.nred;
        A acc = id;
        if (c < J) {
            const T *base = x + plan_offset(p.nk - 1, p.kshape, p.kstride, ko) + c;
            const double mo = mean ? mean[o] : 0.0;
            for (int64_t j = j0 + threadIdx.y; j < j1; j += OUTER_Y)
                acc = red_combine(m, acc, red_elem(m, (A)cti_ew_ld(base + plan_roff(p, j)), mo));
        }
        sm[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && c < J) {
            A r = sm[0][threadIdx.x];
            for (int y = 1; y < OUTER_Y; y++) r = red_combine(m, r, sm[y][threadIdx.x]);
            if (nsplit == 1) red_store(out, o, r);
            else part[o * nsplit + s] = r;
        }
        __syncthreads(); /* sm is rewritten by the next item */
    }
}

/* out[o] = the nsplit partials of output o combined in chunk order. */
template <typename A>
__global__ void reduce_finish_kernel(int m, int64_t nout, int64_t nsplit, const A *part, red_out out)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < nout; o += step) {
        A acc = part[o * nsplit];
        for (int64_t s = 1; s < nsplit; s++) acc = red_combine(m, acc, part[o * nsplit + s]);
        red_store(out, o, acc);
    }
}

/* ---- launch ------------------------------------------------------------------------------------------ */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Chunks for an output's nred elements: as many as `want` (to give the GPU enough
 * items), each at least min_chunk elements long. */
static void split_of(int64_t nred, int64_t want, int64_t min_chunk, int64_t *nsplit, int64_t *chunk)
{
    int64_t n = nred == 0 ? 1 : ceil_div(nred, min_chunk);
    if (n > want) n = want;
    if (n < 1) n = 1;
    *chunk = ceil_div(nred, n);
    *nsplit = *chunk ? ceil_div(nred, *chunk) : 1;
}

/* Queues one reduction pass of mode m of x (plan pl) into out; scratch on x's device
 * in the current frame. */
static ct_status reduce_pass(const char *name, int m, const ct_tensor *x, const cti_red_plan *pl, const double *mean,
                             red_out out)
{
    cudaStream_t stream = cti_cu_stream(x);
    const bool integer = !ct_dtype_is_float(x->dtype);
    const bool outer = pl->nk > 0 && pl->kstride[pl->nk - 1] == 1 && pl->kshape[pl->nk - 1] >= OUTER_MIN_RUN &&
                       pl->nr > 0 && pl->rstride[pl->nr - 1] != 1;
    const int group = outer ? GROUP_BLOCK
                      : pl->nred <= RED_THREAD_MAX ? GROUP_THREAD
                      : pl->nred <= RED_WARP_MAX ? GROUP_WARP : GROUP_BLOCK;
    int64_t nsplit = 1, chunk = pl->nred, J = 0, ntile = 0;
    if (outer) {
        J = pl->kshape[pl->nk - 1];
        ntile = ceil_div(J, OUTER_X);
        const int64_t tiles = pl->nout / J * ntile;
        split_of(pl->nred, tiles >= 512 ? 1 : ceil_div(512, tiles), 256, &nsplit, &chunk);
    } else if (group == GROUP_BLOCK) {
        split_of(pl->nred, pl->nout >= 1024 ? 1 : ceil_div(1024, pl->nout), 8192, &nsplit, &chunk);
    }
    const int64_t items = outer ? pl->nout / J * ntile * nsplit : pl->nout * nsplit;
    const int64_t per_block = outer || group == GROUP_BLOCK ? 1 : group == GROUP_WARP ? RED_THREADS / 32 : RED_THREADS;
    const unsigned blocks = cti_cu_blocks(items, (int)per_block);
    ct_tensor *part = NULL;
    if (nsplit > 1) {
        const int64_t np = pl->nout * nsplit;
        part = ct_tensor_empty_on(x->device, integer ? CT_DTYPE_I64 : CT_DTYPE_F64, 1, &np);
        if (!part) return ct_last_status();
    }
#define RED_LAUNCH(T)                                                                                         \
    do {                                                                                                      \
        typedef typename red_acc<T>::type A;                                                                  \
        A *pp = part ? cti_cu_ptr<A>(part) : (A *)0;                                                         \
        if (outer)                                                                                            \
            reduce_outer_kernel<T, A><<<blocks, dim3(OUTER_X, OUTER_Y), 0, stream>>>(                         \
                *pl, m, cti_cu_ptr<T>(x), mean, J, ntile, nsplit, chunk, pp, out);                            \
        else                                                                                                  \
            reduce_inner_kernel<T, A><<<blocks, RED_THREADS, 0, stream>>>(*pl, m, cti_cu_ptr<T>(x), mean,     \
                                                                         nsplit, chunk, group, pp, out);      \
        if (part) {                                                                                           \
            if (cti_cuda_launched(name, x)) return ct_last_status();                                          \
            reduce_finish_kernel<A><<<cti_cu_blocks(pl->nout, RED_THREADS), RED_THREADS, 0, stream>>>(         \
                m, pl->nout, nsplit, pp, out);                                                                \
        }                                                                                                     \
    } while (0)
    CTI_EW_DISPATCH(x->dtype, T, { RED_LAUNCH(T); })
    else return cti_kernel_unsupported_dtype(name, x);
#undef RED_LAUNCH
    return cti_cuda_launched(name, x);
}

static const char *const op_names[CT_REDUCE_OP_COUNT] = {"sum", "mean", "max", "min"};

// x (...) -> out (kept dims); out = sum | mean | max | min over the dims in mask; out overwritten
ct_status cti_cuda_reduce(ct_reduce_op op, ct_tensor *out, const ct_tensor *x, uint32_t mask)
{
    const char *name = op_names[op];
    if (ct_tensor_numel(out) == 0) return CT_OK;
    if (cti_cuda_enter(x->device.index, name)) return ct_last_status();
    cti_red_plan pl;
    cti_red_plan_init(&pl, x, mask);
    const int m = op == CT_REDUCE_MAX ? M_MAX : op == CT_REDUCE_MIN ? M_MIN : M_SUM;
    ct_frame_push();
    ct_status st = reduce_pass(name, m, x, &pl, NULL, out_of(out, op == CT_REDUCE_MEAN, (double)pl.nred));
    ct_frame_pop();
    return st;
}

// x (...) -> out (kept dims); out = sum((x - mean)^2) / (N - correction), two passes in double
ct_status cti_cuda_var(ct_tensor *out, const ct_tensor *x, uint32_t mask, int64_t correction)
{
    const int64_t nout = ct_tensor_numel(out);
    if (nout == 0) return CT_OK;
    if (cti_cuda_enter(x->device.index, "var")) return ct_last_status();
    cti_red_plan pl;
    cti_red_plan_init(&pl, x, mask);
    if (pl.nred <= correction) return cti_cuda_fill(out, (double)NAN);
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *mean = ct_tensor_empty_on(x->device, CT_DTYPE_F64, 1, &nout);
    if (!mean) st = ct_last_status();
    else if (!(st = reduce_pass("var", M_SUM, x, &pl, NULL, out_of(mean, true, (double)pl.nred))))
        st = reduce_pass("var", M_SQDEV, x, &pl, cti_cu_ptr<double>(mean),
                         out_of(out, true, (double)(pl.nred - correction)));
    ct_frame_pop();
    return st;
}

/* ---- argmax ------------------------------------------------------------------------------------------- */

/* Whether (bv, bi) beats (av, ai): a NaN first (the earlier of two), then the larger
 * value, then the earlier index. A total order, so any combination order gives
 * the first NaN, else the first maximum. */
template <typename A> __device__ __forceinline__ bool am_better(A bv, int64_t bi, A av, int64_t ai)
{
    const bool an = av != av, bn = bv != bv;
    if (an || bn) return bn && (!an || bi < ai);
    return bv > av || (bv == av && bi < ai);
}

template <typename A> __device__ __forceinline__ void am_warp(A &v, int64_t &i)
{
    for (int o = 16; o > 0; o >>= 1) {
        const A w = __shfl_xor_sync(0xffffffffu, v, o);
        const int64_t k = __shfl_xor_sync(0xffffffffu, i, o);
        if (am_better(w, k, v, i)) v = w, i = k;
    }
}

/* mode 0: one thread per output; 1: a warp; 2: the block. Along the dim: n elements
 * at stride s from each output's base (kept dims of the plan). */
template <typename T>
__global__ void argmax_kernel(cti_red_plan p, int mode, int64_t n, int64_t s, const T *x, int64_t *out)
{
    typedef typename red_acc<T>::type A;
    __shared__ A sv[32];
    __shared__ int64_t si[32];
    const A lowest = red_identity(M_MAX, (A)0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int64_t gsize = mode == 0 ? 1 : mode == 1 ? 32 : blockDim.x;
    const int64_t gid = mode == 0 ? 0 : mode == 1 ? lane : threadIdx.x;
    const int64_t groups = mode == 0 ? (int64_t)gridDim.x * blockDim.x
                           : mode == 1 ? (int64_t)gridDim.x * nwarps : gridDim.x;
    const int64_t first = mode == 0 ? (int64_t)blockIdx.x * blockDim.x + threadIdx.x
                          : mode == 1 ? (int64_t)blockIdx.x * nwarps + warp : blockIdx.x;
    for (int64_t o = first; o < p.nout; o += groups) {
        const T *base = x + plan_offset(p.nk, p.kshape, p.kstride, o);
        A bv = lowest;
        int64_t bi = INT64_MAX;
        for (int64_t j = gid; j < n; j += gsize) {
            const A v = (A)cti_ew_ld(base + j * s);
            if (am_better(v, j, bv, bi)) bv = v, bi = j;
        }
        if (mode >= 1) am_warp(bv, bi);
        if (mode == 2) {
            __syncthreads(); /* sv, si may still be read from the previous output */
            if (lane == 0) sv[warp] = bv, si[warp] = bi;
            __syncthreads();
            if (warp == 0) {
                bv = lane < nwarps ? sv[lane] : lowest;
                bi = lane < nwarps ? si[lane] : INT64_MAX;
                am_warp(bv, bi);
            }
        }
        if (gid == 0) out[o] = bi;
    }
}

// x (...) -> out (I64, x's dims without dim); out = first index of the max (or of a NaN) along dim
ct_status cti_cuda_argmax(ct_tensor *out, const ct_tensor *x, int dim)
{
    if (ct_tensor_numel(out) == 0) return CT_OK;
    if (cti_cuda_enter(x->device.index, "argmax")) return ct_last_status();
    cti_red_plan pl;
    cti_red_plan_init(&pl, x, x->ndim ? 1u << dim : 0u);
    const int64_t n = pl.nr ? pl.rshape[0] : 1, s = pl.nr ? pl.rstride[0] : 0;
    const int mode = s != 1 && pl.nout >= 1024 ? 0 : n <= RED_WARP_MAX ? 1 : 2;
    const int64_t per_block = mode == 0 ? RED_THREADS : mode == 1 ? RED_THREADS / 32 : 1;
    const unsigned blocks = cti_cu_blocks(pl.nout, (int)per_block);
    cudaStream_t stream = cti_cu_stream(x);
    CTI_EW_DISPATCH(x->dtype, T, {
        argmax_kernel<T><<<blocks, RED_THREADS, 0, stream>>>(pl, mode, n, s, cti_cu_ptr<T>(x),
                                                             cti_cu_ptr<int64_t>(out));
    })
    else return cti_kernel_unsupported_dtype("argmax", x);
    return cti_cuda_launched("argmax", out);
}

/* ---- references ------------------------------------------------------------------------------------------ */

/* x's shape and strides with its kept (kd) and reduced (rd) dims listed in order. */
typedef struct red_ref {
    int ndim, nk, nr;
    int64_t shape[CT_MAX_DIMS], strides[CT_MAX_DIMS];
    int kd[CT_MAX_DIMS], rd[CT_MAX_DIMS];
    int64_t nout, nred;
} red_ref;

static void ref_init(red_ref *r, const ct_tensor *x, uint32_t mask)
{
    memset(r, 0, sizeof *r);
    r->ndim = x->ndim;
    memcpy(r->shape, x->shape, sizeof r->shape);
    memcpy(r->strides, x->strides, sizeof r->strides);
    r->nout = r->nred = 1;
    for (int d = 0; d < x->ndim; d++) {
        if ((mask >> d) & 1) r->rd[r->nr++] = d, r->nred *= x->shape[d];
        else r->kd[r->nk++] = d, r->nout *= x->shape[d];
    }
}

/* Writes flat index i over the listed dims into idx (other entries untouched). */
__device__ __forceinline__ void ref_set_index(const red_ref &r, int n, const int *dims, int64_t i, int64_t *idx)
{
    for (int k = n - 1; k >= 0; k--) {
        idx[dims[k]] = i % r.shape[dims[k]];
        i /= r.shape[dims[k]];
    }
}

__device__ __forceinline__ int64_t ref_offset(const red_ref &r, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < r.ndim; d++) off += idx[d] * r.strides[d];
    return off;
}

/* m: M_SUM (MEAN too: out divides), M_MAX, M_MIN. */
template <typename T> __global__ void reduce_ref_kernel(red_ref r, int m, const T *x, red_out out)
{
    typedef typename red_acc<T>::type A;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < r.nout; o += step) {
        int64_t idx[CT_MAX_DIMS] = {0};
        ref_set_index(r, r.nk, r.kd, o, idx);
        A acc = 0;
        for (int64_t j = 0; j < r.nred; j++) {
            ref_set_index(r, r.nr, r.rd, j, idx);
            const A v = (A)cti_ew_ld(x + ref_offset(r, idx));
            if (m == M_SUM) acc = red_combine(M_SUM, acc, v);
            else if (j == 0 || v != v || acc != acc) acc = j == 0 || v != v ? v : acc;
            else acc = m == M_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
        }
        red_store(out, o, acc);
    }
}

template <typename T> __global__ void var_ref_kernel(red_ref r, int64_t correction, const T *x, red_out out)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < r.nout; o += step) {
        int64_t idx[CT_MAX_DIMS] = {0};
        ref_set_index(r, r.nk, r.kd, o, idx);
        double mean = 0, ss = 0;
        for (int64_t j = 0; j < r.nred; j++) {
            ref_set_index(r, r.nr, r.rd, j, idx);
            mean += (double)cti_ew_ld(x + ref_offset(r, idx));
        }
        mean /= (double)r.nred;
        for (int64_t j = 0; j < r.nred; j++) {
            ref_set_index(r, r.nr, r.rd, j, idx);
            const double d = (double)cti_ew_ld(x + ref_offset(r, idx)) - mean;
            ss += d * d;
        }
        red_store(out, o, r.nred > correction ? ss / (double)(r.nred - correction) : (double)NAN);
    }
}

template <typename T> __global__ void argmax_ref_kernel(red_ref r, const T *x, int64_t *out)
{
    typedef typename red_acc<T>::type A;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < r.nout; o += step) {
        int64_t idx[CT_MAX_DIMS] = {0};
        ref_set_index(r, r.nk, r.kd, o, idx);
        int64_t best = 0;
        A bv = 0;
        for (int64_t j = 0; j < r.nred; j++) {
            ref_set_index(r, r.nr, r.rd, j, idx);
            const A v = (A)cti_ew_ld(x + ref_offset(r, idx));
            if (v != v) {
                best = j;
                break;
            }
            if (j == 0 || v > bv) bv = v, best = j;
        }
        out[o] = best;
    }
}

ct_status cti_cuda_reduce_ref(ct_reduce_op op, ct_tensor *out, const ct_tensor *x, uint32_t mask)
{
    const char *name = op_names[op];
    if (ct_tensor_numel(out) == 0) return CT_OK;
    if (cti_cuda_enter(x->device.index, name)) return ct_last_status();
    red_ref r;
    ref_init(&r, x, mask);
    const int m = op == CT_REDUCE_MAX ? M_MAX : op == CT_REDUCE_MIN ? M_MIN : M_SUM;
    const red_out o = out_of(out, op == CT_REDUCE_MEAN, (double)r.nred);
    cudaStream_t stream = cti_cu_stream(x);
    CTI_EW_DISPATCH(x->dtype, T, {
        reduce_ref_kernel<T><<<cti_cu_blocks(r.nout, RED_THREADS), RED_THREADS, 0, stream>>>(r, m, cti_cu_ptr<T>(x), o);
    })
    else return cti_kernel_unsupported_dtype(name, x);
    return cti_cuda_launched(name, out);
}

ct_status cti_cuda_var_ref(ct_tensor *out, const ct_tensor *x, uint32_t mask, int64_t correction)
{
    if (ct_tensor_numel(out) == 0) return CT_OK;
    if (cti_cuda_enter(x->device.index, "var")) return ct_last_status();
    red_ref r;
    ref_init(&r, x, mask);
    cudaStream_t stream = cti_cu_stream(x);
    CTI_CU_DISPATCH_FLOAT(x->dtype, T, {
        var_ref_kernel<T><<<cti_cu_blocks(r.nout, RED_THREADS), RED_THREADS, 0, stream>>>(
            r, correction, cti_cu_ptr<T>(x), out_of(out, false, 1.0));
    })
    else return cti_kernel_unsupported_dtype("var", x);
    return cti_cuda_launched("var", out);
}

ct_status cti_cuda_argmax_ref(ct_tensor *out, const ct_tensor *x, int dim)
{
    if (ct_tensor_numel(out) == 0) return CT_OK;
    if (cti_cuda_enter(x->device.index, "argmax")) return ct_last_status();
    red_ref r;
    ref_init(&r, x, x->ndim ? 1u << dim : 0u);
    cudaStream_t stream = cti_cu_stream(x);
    CTI_EW_DISPATCH(x->dtype, T, {
        argmax_ref_kernel<T><<<cti_cu_blocks(r.nout, RED_THREADS), RED_THREADS, 0, stream>>>(
            r, cti_cu_ptr<T>(x), cti_cu_ptr<int64_t>(out));
    })
    else return cti_kernel_unsupported_dtype("argmax", x);
    return cti_cuda_launched("argmax", out);
}
