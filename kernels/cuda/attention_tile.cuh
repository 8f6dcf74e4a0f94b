/* ctrain — what the CUDA attention files share (kernels/cuda/attention_fwd.cu,
 * attention_fwd_tc.cu, attention_bwd.cu, attention_ref.cu): the operand and problem descriptions, the
 * causal rule, the tile geometry and the cooperative tile loads. Not installed.
 *
 * Operands are strided views: element (b,h,t,d) of an operand lives at
 * base + b*st[0] + h*st[1] + t*st[2] + d*st[3] elements (3-d lse leaves st[3] = 0),
 * so transposed (B,T,H,D) views and the column blocks of a (B,T,3C) gradient are
 * read and written in place, as the CPU kernels do.
 */
#ifndef CT_KERNELS_CUDA_ATTENTION_TILE_CUH
#define CT_KERNELS_CUDA_ATTENTION_TILE_CUH

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/attention.h"

struct cti_attn_op {
    void *p;
    int64_t st[4];
};

/* Everything a kernel needs, passed by value. Dimensions as in kernels/attention.h:
 * q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv), out and dout (B,H,T,Dv), lse (B,H,T);
 * scale already resolved (<= 0 became 1/sqrt(D)). lse is f64 when lse64, else f32;
 * its p is NULL when the forward does not write it. drow: rowsum(dO * O) per
 * (b,h,t) row, contiguous, of the compute type (backward only). */
struct cti_attn_args {
    cti_attn_op q, k, v, out, lse, dout, dq, dk, dv;
    const void *drow;
    int64_t B, H, T, S;
    int D, Dv;
    double scale;
    bool causal, lse64;
};

static inline cti_attn_op cti_attn_op_of(const ct_tensor *t)
{
    cti_attn_op o = {NULL, {0, 0, 0, 0}};
    if (!t) return o;
    o.p = ct_tensor_data(t);
    for (int i = 0; i < t->ndim && i < 4; i++) o.st[i] = t->strides[i];
    return o;
}

/* The arguments of a problem; lse, dout, dq, dk, dv may be NULL. */
static inline cti_attn_args cti_attn_args_of(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                             const ct_tensor *out, const ct_tensor *lse, const ct_tensor *dout,
                                             const ct_tensor *dq, const ct_tensor *dk, const ct_tensor *dv,
                                             bool causal, double scale)
{
    cti_attn_args a;
    a.q = cti_attn_op_of(q), a.k = cti_attn_op_of(k), a.v = cti_attn_op_of(v), a.out = cti_attn_op_of(out);
    a.lse = cti_attn_op_of(lse), a.dout = cti_attn_op_of(dout);
    a.dq = cti_attn_op_of(dq), a.dk = cti_attn_op_of(dk), a.dv = cti_attn_op_of(dv);
    a.drow = NULL;
    a.B = q->shape[0], a.H = q->shape[1], a.T = q->shape[2], a.S = k->shape[2];
    a.D = (int)q->shape[3], a.Dv = (int)v->shape[3];
    a.scale = scale > 0 ? scale : 1.0 / sqrt((double)q->shape[3]);
    a.causal = causal;
    a.lse64 = lse && lse->dtype == CT_DTYPE_F64;
    return a;
}

__host__ __device__ __forceinline__ int64_t cti_attn_min(int64_t x, int64_t y) { return x < y ? x : y; }

/* Offset of row t of head (b,h) of o, in elements. */
__host__ __device__ __forceinline__ int64_t cti_attn_row(const cti_attn_op &o, int64_t b, int64_t h, int64_t t)
{
    return b * o.st[0] + h * o.st[1] + t * o.st[2];
}

/* Keys [0, kend) are visible to query row i: causal query i sees keys j <= i + (S - T). */
__device__ __forceinline__ int64_t cti_attn_kend(const cti_attn_args &a, int64_t i)
{
    if (!a.causal) return a.S;
    const int64_t e = i + (a.S - a.T) + 1;
    return e < 0 ? 0 : (e > a.S ? a.S : e);
}

__device__ __forceinline__ double cti_attn_lse_load(const cti_attn_args &a, int64_t b, int64_t h, int64_t i)
{
    const int64_t off = cti_attn_row(a.lse, b, h, i);
    return a.lse64 ? ((const double *)a.lse.p)[off] : (double)((const float *)a.lse.p)[off];
}

/* Rounds once from v, as the CPU's attn_store. */
__device__ __forceinline__ void cti_attn_lse_store(const cti_attn_args &a, int64_t b, int64_t h, int64_t i, double v)
{
    const int64_t off = cti_attn_row(a.lse, b, h, i);
    if (a.lse64) ((double *)a.lse.p)[off] = v;
    else ((float *)a.lse.p)[off] = (float)v;
}

/* ---- tiled kernels: geometry and tile loads ------------------------------------------
 * A block has CTI_ATTN_WARPS warps. It owns OWN = WARPS * RPW rows (RPW per warp: query
 * rows in the forward and dQ kernels, key rows in the dK/dV kernel) and loops over tiles
 * of SPAN = 32 * CPL rows of the other side (CPL per lane). Head dims up to 32 * NC:
 * lane l holds columns l, l + 32, ... of its rows' accumulators. f64 halves both sides
 * so its tiles fit in shared memory. */
#define CTI_ATTN_WARPS 8
#define CTI_ATTN_THREADS (CTI_ATTN_WARPS * 32)
#define CTI_ATTN_MAX_DIM 128

template <typename A> struct cti_attn_geom {
    static constexpr int RPW = 8, CPL = 2;
};
template <> struct cti_attn_geom<double> {
    static constexpr int RPW = 4, CPL = 1;
};

/* The row pitch of a tile of rows with n columns: odd, so the lanes of a warp reading
 * one column of 32 consecutive rows hit 32 different banks. */
__host__ __device__ __forceinline__ int cti_attn_pitch(int n) { return n | 1; }

/* dst[r * pitch + c] <- rows [t0, t0 + n) x columns [0, ncols) of the head at
 * `head` (an element offset already applied), row stride st, column stride sd; rows
 * [n, rows) are zeros (they meet zero probabilities, and 0 * garbage could be NaN).
 * Called by the whole block; the caller synchronises. */
template <typename T, typename A>
__device__ __forceinline__ void cti_attn_load_tile(A *dst, int pitch, const T *head, int64_t st, int64_t sd,
                                                   int64_t t0, int n, int rows, int ncols)
{
    const int total = rows * ncols;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        const int r = e / ncols, c = e - r * ncols;
        dst[r * pitch + c] = r < n ? (A)ld<T>(head + (t0 + r) * st + (int64_t)c * sd) : (A)0;
    }
}

/* sum over d < n of x[d] * y[d] */
template <typename A> __device__ __forceinline__ A cti_attn_dot(const A *x, const A *y, int n)
{
    A acc = 0;
    for (int d = 0; d < n; d++) acc += x[d] * y[d];
    return acc;
}

/* The dynamic shared memory a kernel needs is allowed on dev: sets the kernel's limit
 * when it passes the default 48 KiB. *fits false (and CT_OK) when the device cannot
 * give that much, so the caller takes the plain kernels instead. */
static inline ct_status cti_attn_smem(const void *kernel, size_t bytes, int dev, const char *op, bool *fits)
{
    int optin = 0;
    ct_status st = cti_cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), op,
                                  dev, "querying the shared memory per block");
    *fits = false;
    if (st) return st;
    if (bytes > (size_t)optin) return CT_OK;
    if (bytes > 48 * 1024 &&
        (st = cti_cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                             op, dev, "raising the kernel's shared memory limit")))
        return st;
    *fits = true;
    return CT_OK;
}

/* The forward of bf16 and f16 on tensor cores (attention_fwd_tc.cu): *done false (and
 * CT_OK) when it does not take the problem (other dtypes, head dims past 128, a device
 * without the shared memory), so the caller runs the f32-math kernels. */
ct_status cti_attn_fwd_tc(const cti_attn_args &a, const ct_tensor *out, ct_dtype dt, bool *done);

#endif
