/* ctrain — CUDA softmax / log-softmax, forward and backward.
 *
 * A tensor is seen as (outer, C, inner) around the softmax dim.
 * - dim last (inner = 1), C <= WARP_ROW_MAX: one warp per row;
 * - dim last, longer rows: one block of ROW_THREADS per row;
 * - another dim: one thread per (outer, inner) line, stepping through C with stride
 *   inner, so neighbouring threads read neighbouring addresses.
 * A row is read twice in the row kernels: once for its max and sum of exp(x - max)
 * together (online, row_softmax_stats in kernels/cuda/rows.cuh), once for the
 * output; the per-line kernel takes the CPU's three passes. Every finite row stays
 * finite, and rows with -inf, +inf or NaN give the CPU's results. Sums run in
 * double (the CPU's f32 path sums in double too), the elementwise math in f32 (f64
 * for f64); bf16/f16 are loaded to f32 and rounded once on store.
 *
 *   softmax      y = exp(x - m) * (1 / s),  s = sum exp(x - m)
 *   log_softmax  y = (x - m) - log(s)
 *   backward, y the forward output (dx overwritten):
 *   softmax      dx = y * (dy - sum(dy * y))
 *   log_softmax  dx = dy - exp(y) * sum(dy)
 */
#include "kernels/cuda/softmax.h"

#include "kernels/cuda/rows.cuh"

extern "C" {
#include "kernels/dispatch_internal.h"
}

#define WARP_ROW_MAX 1024 /* rows up to this length: one warp each */
#define WARP_THREADS 256  /* 8 rows per block in the warp-per-row kernels */
#define ROW_THREADS 512   /* threads per row in the block-per-row kernels */
#define LINE_THREADS 256  /* threads per block in the per-line kernels */

typedef struct geom {
    int64_t outer, C, inner;
} geom;

static geom geometry(const ct_tensor *t, int dim)
{
    geom g = {1, 1, 1};
    if (t->ndim == 0) return g;
    for (int d = 0; d < dim; d++) g.outer *= t->shape[d];
    g.C = t->shape[dim];
    for (int d = dim + 1; d < t->ndim; d++) g.inner *= t->shape[d];
    return g;
}

// x (rows, C) -> y (rows, C), softmax or log-softmax of each row
template <typename T, bool BLOCK>
__global__ void softmax_rows_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t rows, int64_t C, bool lg)
{
    typedef typename cti_acc<T>::type A;
    __shared__ A smax[32];
    __shared__ double ssum[32];
    row_group<BLOCK> grp;
    /* the loop bound depends only on the group, so a whole block (or warp) runs
     * every iteration together, as its reductions require */
    for (int64_t r = grp.first; r < rows; r += grp.step) {
        const T *xr = x + r * C;
        T *yr = y + r * C;
        A m;
        double s;
        row_softmax_stats<BLOCK>(xr, C, grp, smax, ssum, &m, &s);
        if (lg) {
            A ls = (A)log(s);
            for (int64_t i = grp.rank; i < C; i += grp.size) st(yr + i, (ld(xr + i) - m) - ls);
        } else {
            A inv = (A)(1.0 / s);
            for (int64_t i = grp.rank; i < C; i += grp.size) st(yr + i, cu_exp(ld(xr + i) - m) * inv);
        }
    }
}

// dy, y (rows, C) -> dx (rows, C), overwritten
template <typename T, bool BLOCK>
__global__ void softmax_backward_rows_kernel(const T *__restrict__ dy, const T *__restrict__ y, T *__restrict__ dx,
                                             int64_t rows, int64_t C, bool lg)
{
    typedef typename cti_acc<T>::type A;
    __shared__ double ssum[32];
    row_group<BLOCK> grp;
    for (int64_t r = grp.first; r < rows; r += grp.step) {
        const T *dyr = dy + r * C, *yr = y + r * C;
        T *dxr = dx + r * C;
        double s = 0;
        for (int64_t i = grp.rank; i < C; i += grp.size)
            s += lg ? (double)ld(dyr + i) : (double)ld(dyr + i) * (double)ld(yr + i);
        A sa = (A)group_sum<BLOCK>(s, ssum);
        for (int64_t i = grp.rank; i < C; i += grp.size) {
            A d = ld(dyr + i), v = ld(yr + i);
            st(dxr + i, lg ? d - cu_exp(v) * sa : v * (d - sa));
        }
    }
}

// x (outer, C, inner) -> y, along C; one thread per (outer, inner) line
template <typename T>
__global__ void softmax_lines_kernel(const T *__restrict__ x, T *__restrict__ y, geom g, bool lg)
{
    typedef typename cti_acc<T>::type A;
    const int64_t lines = g.outer * g.inner;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < lines; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t base = (t / g.inner) * g.C * g.inner + t % g.inner;
        A m = -INFINITY;
        for (int64_t c = 0; c < g.C; c++) {
            A v = ld(x + base + c * g.inner);
            m = v > m ? v : m;
        }
        double s = 0;
        for (int64_t c = 0; c < g.C; c++) s += (double)cu_exp(ld(x + base + c * g.inner) - m);
        A f = lg ? (A)log(s) : (A)(1.0 / s);
        for (int64_t c = 0; c < g.C; c++) {
            A v = ld(x + base + c * g.inner) - m;
            st(y + base + c * g.inner, lg ? v - f : cu_exp(v) * f);
        }
    }
}

template <typename T>
__global__ void softmax_backward_lines_kernel(const T *__restrict__ dy, const T *__restrict__ y, T *__restrict__ dx,
                                              geom g, bool lg)
{
    typedef typename cti_acc<T>::type A;
    const int64_t lines = g.outer * g.inner;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < lines; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t base = (t / g.inner) * g.C * g.inner + t % g.inner;
        double s = 0;
        for (int64_t c = 0; c < g.C; c++) {
            int64_t i = base + c * g.inner;
            s += lg ? (double)ld(dy + i) : (double)ld(dy + i) * (double)ld(y + i);
        }
        A sa = (A)s;
        for (int64_t c = 0; c < g.C; c++) {
            int64_t i = base + c * g.inner;
            A d = ld(dy + i), v = ld(y + i);
            st(dx + i, lg ? d - cu_exp(v) * sa : v * (d - sa));
        }
    }
}

/* ---- reference: one thread per line, every element through double ------------- */

template <typename T> __global__ void softmax_ref_kernel(const T *x, T *y, geom g, bool lg)
{
    const int64_t lines = g.outer * g.inner;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < lines; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t base = (t / g.inner) * g.C * g.inner + t % g.inner;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < g.C; c++)
            if (ldd(x + base + c * g.inner) > m) m = ldd(x + base + c * g.inner);
        for (int64_t c = 0; c < g.C; c++) s += exp(ldd(x + base + c * g.inner) - m);
        for (int64_t c = 0; c < g.C; c++) {
            double v = ldd(x + base + c * g.inner) - m;
            std_(y + base + c * g.inner, lg ? v - log(s) : exp(v) / s);
        }
    }
}

template <typename T> __global__ void softmax_backward_ref_kernel(const T *dy, const T *y, T *dx, geom g, bool lg)
{
    const int64_t lines = g.outer * g.inner;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < lines; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t base = (t / g.inner) * g.C * g.inner + t % g.inner;
        double s = 0;
        for (int64_t c = 0; c < g.C; c++) {
            int64_t i = base + c * g.inner;
            s += lg ? ldd(dy + i) : ldd(dy + i) * ldd(y + i);
        }
        for (int64_t c = 0; c < g.C; c++) {
            int64_t i = base + c * g.inner;
            double d = ldd(dy + i), v = ldd(y + i);
            std_(dx + i, lg ? d - exp(v) * s : v * (d - s));
        }
    }
}

/* ---- launches ---------------------------------------------------------------------- */

template <typename T> static void launch_forward(const T *x, T *y, geom g, bool lg, bool ref, cudaStream_t s)
{
    if (ref) {
        softmax_ref_kernel<T><<<cti_cu_blocks(g.outer * g.inner, LINE_THREADS), LINE_THREADS, 0, s>>>(x, y, g, lg);
    } else if (g.inner > 1) {
        softmax_lines_kernel<T><<<cti_cu_blocks(g.outer * g.inner, LINE_THREADS), LINE_THREADS, 0, s>>>(x, y, g, lg);
    } else if (g.C <= WARP_ROW_MAX) {
        softmax_rows_kernel<T, false><<<cti_cu_blocks(g.outer, WARP_THREADS / 32), WARP_THREADS, 0, s>>>(x, y, g.outer,
                                                                                                      g.C, lg);
    } else {
        softmax_rows_kernel<T, true><<<cti_cu_blocks(g.outer, 1), ROW_THREADS, 0, s>>>(x, y, g.outer, g.C, lg);
    }
}

template <typename T>
static void launch_backward(const T *dy, const T *y, T *dx, geom g, bool lg, bool ref, cudaStream_t s)
{
    if (ref) {
        softmax_backward_ref_kernel<T>
            <<<cti_cu_blocks(g.outer * g.inner, LINE_THREADS), LINE_THREADS, 0, s>>>(dy, y, dx, g, lg);
    } else if (g.inner > 1) {
        softmax_backward_lines_kernel<T>
            <<<cti_cu_blocks(g.outer * g.inner, LINE_THREADS), LINE_THREADS, 0, s>>>(dy, y, dx, g, lg);
    } else if (g.C <= WARP_ROW_MAX) {
        softmax_backward_rows_kernel<T, false>
            <<<cti_cu_blocks(g.outer, WARP_THREADS / 32), WARP_THREADS, 0, s>>>(dy, y, dx, g.outer, g.C, lg);
    } else {
        softmax_backward_rows_kernel<T, true>
            <<<cti_cu_blocks(g.outer, 1), ROW_THREADS, 0, s>>>(dy, y, dx, g.outer, g.C, lg);
    }
}

static ct_status forward(const char *op, const ct_tensor *x, ct_tensor *y, int dim, bool lg, bool ref)
{
    if (ct_tensor_numel(x) == 0) return CT_OK;
    ct_status st = cti_cuda_enter(y->device.index, op);
    if (st) return st;
    geom g = geometry(x, dim);
    cudaStream_t s = cti_cu_stream(y);
    CTI_CU_DISPATCH_FLOAT(x->dtype, T, { launch_forward<T>(cti_cu_ptr<const T>(x), cti_cu_ptr<T>(y), g, lg, ref, s); })
    else return cti_kernel_unsupported_dtype(op, x);
    return cti_cuda_launched(op, y);
}

static ct_status backward(const char *op, const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim, bool lg,
                          bool ref)
{
    if (ct_tensor_numel(y) == 0) return CT_OK;
    ct_status st = cti_cuda_enter(dx->device.index, op);
    if (st) return st;
    geom g = geometry(y, dim);
    cudaStream_t s = cti_cu_stream(dx);
    CTI_CU_DISPATCH_FLOAT(y->dtype, T, {
        launch_backward<T>(cti_cu_ptr<const T>(dy), cti_cu_ptr<const T>(y), cti_cu_ptr<T>(dx), g, lg, ref, s);
    })
    else return cti_kernel_unsupported_dtype(op, y);
    return cti_cuda_launched(op, dx);
}

ct_status cti_cuda_softmax(const ct_tensor *x, ct_tensor *y, int dim) { return forward("softmax", x, y, dim, false, false); }
ct_status cti_cuda_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim)
{
    return forward("softmax", x, y, dim, false, true);
}
ct_status cti_cuda_log_softmax(const ct_tensor *x, ct_tensor *y, int dim)
{
    return forward("log_softmax", x, y, dim, true, false);
}
ct_status cti_cuda_log_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim)
{
    return forward("log_softmax", x, y, dim, true, true);
}

ct_status cti_cuda_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim)
{
    return backward("softmax_backward", dy, y, dx, dim, false, false);
}
ct_status cti_cuda_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim)
{
    return backward("softmax_backward", dy, y, dx, dim, false, true);
}
ct_status cti_cuda_log_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim)
{
    return backward("log_softmax_backward", dy, y, dx, dim, true, false);
}
ct_status cti_cuda_log_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim)
{
    return backward("log_softmax_backward", dy, y, dx, dim, true, true);
}
