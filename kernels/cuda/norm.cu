/* ctrain — CUDA layernorm and rmsnorm, forward and backward.
 *
 * rmsnorm is layernorm without centring (mean taken as 0) and without bias; both
 * share these kernels through a `center` flag, as on the CPU.
 *
 * x (rows, C):
 *   forward   mean = sum(x) / C, var = sum((x - mean)^2) / C (two passes, sums in
 *             double), rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * w + b,
 *             one warp per row up to WARP_ROW_MAX, else one block per row;
 *   backward  xhat = (x - mean) * rstd, g = dy * w,
 *             dx = rstd * (g - mean_C(g) - xhat * mean_C(g * xhat))  (overwritten),
 *             per row like the forward, sums and the elementwise step in double;
 *             dw = sum_rows dy * xhat, db = sum_rows dy  (overwritten) in two
 *             deterministic stages: blocks of DW_COLS columns x a chunk of rows write
 *             partial sums (double) to a scratch tensor, then one thread per column
 *             adds its chunks in order. No atomics: the same bits on every run.
 * The elementwise math of the forward is f32 (f64 for f64 x) with double statistics;
 * w and b of another dtype than the compute dtype are converted first (C elements),
 * absent ones count as 1 and 0. mean and rstd are stored in the stat dtype (f32, f64
 * for f64 x).
 */
#include "kernels/cuda/norm.h"

#include "kernels/cuda/rows.cuh"

extern "C" {
#include "kernels/dispatch_internal.h"
}

#define WARP_ROW_MAX 1024 /* rows up to this length: one warp each */
#define WARP_THREADS 256  /* 8 rows per block in the warp-per-row kernels */
#define ROW_THREADS 512   /* threads per row in the block-per-row kernels */
#define REF_THREADS 128
#define DW_COLS 32        /* columns per block of the dw/db partial sums */
#define DW_ROWS 8         /* row lanes per block of the dw/db partial sums */
#define DW_CHUNK 256      /* rows per partial sum (at least; more when rows > 65535 chunks) */

/* ---- the compute-dtype copy of w or b ------------------------------------------------ */

template <typename S, typename A> __global__ void convert_kernel(const S *__restrict__ src, A *__restrict__ dst, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = (A)ld(src + i);
}

/* p's data in dtype cd (f32 or f64): p's own when it already is, else a converted copy
 * in the current frame, queued on s. NULL for a NULL p; *st set on failure. */
static const void *param_as(const ct_tensor *p, ct_dtype cd, cudaStream_t s, ct_status *st)
{
    if (!p || *st) return NULL;
    if (p->dtype == cd) return ct_tensor_data(p);
    ct_tensor *t = ct_tensor_empty_on(p->device, cd, p->ndim, p->shape);
    if (!t) {
        *st = ct_last_status();
        return NULL;
    }
    int64_t n = ct_tensor_numel(p);
    unsigned blocks = cti_cu_blocks(n, 256);
    CTI_CU_DISPATCH_FLOAT(p->dtype, S, {
        if (cd == CT_DTYPE_F64) convert_kernel<S, double><<<blocks, 256, 0, s>>>(cti_cu_ptr<const S>(p), cti_cu_ptr<double>(t), n);
        else convert_kernel<S, float><<<blocks, 256, 0, s>>>(cti_cu_ptr<const S>(p), cti_cu_ptr<float>(t), n);
    })
    *st = cti_cuda_launched("norm: converting a parameter", t);
    return *st ? NULL : ct_tensor_data(t);
}

/* ---- fast kernels ------------------------------------------------------------------- */

// x (rows, C), w, b (C) or NULL, -> y (rows, C), mean, rstd (rows) or NULL
template <typename T, bool BLOCK>
__global__ void norm_forward_kernel(const T *__restrict__ x, const typename cti_acc<T>::type *__restrict__ w,
                                    const typename cti_acc<T>::type *__restrict__ b, T *__restrict__ y,
                                    typename cti_acc<T>::type *__restrict__ mean,
                                    typename cti_acc<T>::type *__restrict__ rstd, int64_t rows, int64_t C,
                                    double eps, bool center)
{
    typedef typename cti_acc<T>::type A;
    __shared__ double scratch[32];
    row_group<BLOCK> grp;
    /* the loop bound depends only on the group: a block (or warp) runs every
     * iteration together, as its reductions require */
    for (int64_t r = grp.first; r < rows; r += grp.step) {
        const T *xr = x + r * C;
        T *yr = y + r * C;
        double mu = 0, v = 0;
        if (center) {
            for (int64_t i = grp.rank; i < C; i += grp.size) mu += (double)ld(xr + i);
            mu = group_sum<BLOCK>(mu, scratch) / (double)C;
        }
        for (int64_t i = grp.rank; i < C; i += grp.size) {
            double d = (double)ld(xr + i) - mu;
            v += d * d;
        }
        v = group_sum<BLOCK>(v, scratch);
        double rs = 1.0 / sqrt(v / (double)C + eps);
        if (grp.rank == 0) {
            if (mean) mean[r] = (A)mu;
            if (rstd) rstd[r] = (A)rs;
        }
        /* mean as hi + lo: x - hi is exact near the mean, so a mean far from 0 costs no accuracy */
        const A mh = (A)mu, ml = (A)(mu - (double)mh), s = (A)rs;
        for (int64_t i = grp.rank; i < C; i += grp.size) {
            A wi = w ? w[i] : (A)1, bi = b ? b[i] : (A)0;
            st(yr + i, ((ld(xr + i) - mh) - ml) * s * wi + bi);
        }
    }
}

// dy, x (rows, C), w (C) or NULL, mean (rows) or NULL, rstd (rows) -> dx (rows, C)
template <typename T, bool BLOCK>
__global__ void norm_backward_dx_kernel(const T *__restrict__ dy, const T *__restrict__ x,
                                        const typename cti_acc<T>::type *__restrict__ w,
                                        const typename cti_acc<T>::type *__restrict__ mean,
                                        const typename cti_acc<T>::type *__restrict__ rstd, T *__restrict__ dx,
                                        int64_t rows, int64_t C, bool center)
{
    __shared__ double scratch[32];
    row_group<BLOCK> grp;
    for (int64_t r = grp.first; r < rows; r += grp.step) {
        const T *dyr = dy + r * C, *xr = x + r * C;
        T *dxr = dx + r * C;
        const double m = center ? (double)mean[r] : 0, s = (double)rstd[r];
        double sg = 0, sgx = 0;
        for (int64_t i = grp.rank; i < C; i += grp.size) {
            double g = (double)ld(dyr + i) * (w ? (double)w[i] : 1.0);
            sg += g;
            sgx += g * (((double)ld(xr + i) - m) * s);
        }
        sg = group_sum<BLOCK>(sg, scratch);
        sgx = group_sum<BLOCK>(sgx, scratch);
        const double a = center ? sg / (double)C : 0, q = sgx / (double)C;
        /* in double: with narrow rows the three terms can cancel (C = 1 in rmsnorm leaves
         * g * eps / (x^2 + eps)) */
        for (int64_t i = grp.rank; i < C; i += grp.size) {
            double g = (double)ld(dyr + i) * (w ? (double)w[i] : 1.0);
            std_(dxr + i, s * (g - a - ((double)ld(xr + i) - m) * s * q));
        }
    }
}

/* dw, db partial sums: block (blockIdx.x, blockIdx.y) covers columns
 * [blockIdx.x * DW_COLS, +DW_COLS) and rows [blockIdx.y * chunk, +chunk); thread
 * (tx, ty) sums rows ty, ty + DW_ROWS, ... of column tx, then the DW_ROWS lanes are
 * added in order. pw, pb (chunks, C); either may be NULL. */
template <typename T>
__global__ void norm_dwdb_partial_kernel(const T *__restrict__ dy, const T *__restrict__ x,
                                         const typename cti_acc<T>::type *__restrict__ mean,
                                         const typename cti_acc<T>::type *__restrict__ rstd, double *__restrict__ pw,
                                         double *__restrict__ pb, int64_t rows, int64_t C, int64_t chunk, bool center)
{
    __shared__ double sw[DW_ROWS][DW_COLS], sb[DW_ROWS][DW_COLS];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * DW_COLS + tx, r0 = (int64_t)blockIdx.y * chunk;
    const int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
    double aw = 0, ab = 0;
    if (c < C) {
        for (int64_t r = r0 + ty; r < r1; r += DW_ROWS) {
            double d = (double)ld(dy + r * C + c), m = center ? (double)mean[r] : 0;
            aw += d * (((double)ld(x + r * C + c) - m) * (double)rstd[r]);
            ab += d;
        }
    }
    sw[ty][tx] = aw;
    sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int k = 1; k < DW_ROWS; k++) aw += sw[k][tx], ab += sb[k][tx];
        if (pw) pw[(int64_t)blockIdx.y * C + c] = aw;
        if (pb) pb[(int64_t)blockIdx.y * C + c] = ab;
    }
}

// p (chunks, C) -> out[c] = sum over chunks of p[k, c], in chunk order
template <typename D> __global__ void column_total_kernel(const double *__restrict__ p, int64_t chunks, int64_t C, D *out)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        double s = 0;
        for (int64_t k = 0; k < chunks; k++) s += p[k * C + c];
        std_(out + c, s);
    }
}

/* ---- reference: one thread per row (per column for dw, db), all in double ---------------- */

template <typename T>
__global__ void norm_forward_ref_kernel(const T *x, const typename cti_acc<T>::type *w,
                                        const typename cti_acc<T>::type *b, T *y, typename cti_acc<T>::type *mean,
                                        typename cti_acc<T>::type *rstd, int64_t rows, int64_t C, double eps,
                                        bool center)
{
    typedef typename cti_acc<T>::type A;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        double mu = 0, var = 0;
        if (center) {
            for (int64_t i = 0; i < C; i++) mu += ldd(x + r * C + i);
            mu /= (double)C;
        }
        for (int64_t i = 0; i < C; i++) {
            double d = ldd(x + r * C + i) - mu;
            var += d * d;
        }
        double rs = 1 / sqrt(var / (double)C + eps);
        if (mean) mean[r] = (A)mu;
        if (rstd) rstd[r] = (A)rs;
        for (int64_t i = 0; i < C; i++) {
            double wi = w ? (double)w[i] : 1, bi = b ? (double)b[i] : 0;
            std_(y + r * C + i, (ldd(x + r * C + i) - mu) * rs * wi + bi);
        }
    }
}

template <typename T>
__global__ void norm_backward_dx_ref_kernel(const T *dy, const T *x, const typename cti_acc<T>::type *w,
                                            const typename cti_acc<T>::type *mean,
                                            const typename cti_acc<T>::type *rstd, T *dx, int64_t rows, int64_t C,
                                            bool center)
{
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        double mu = center ? (double)mean[r] : 0, rs = (double)rstd[r], sg = 0, sgx = 0;
        for (int64_t i = 0; i < C; i++) {
            double g = ldd(dy + r * C + i) * (w ? (double)w[i] : 1);
            sg += g;
            sgx += g * (ldd(x + r * C + i) - mu) * rs;
        }
        for (int64_t i = 0; i < C; i++) {
            double g = ldd(dy + r * C + i) * (w ? (double)w[i] : 1);
            double xhat = (ldd(x + r * C + i) - mu) * rs;
            std_(dx + r * C + i, rs * (g - (center ? sg / (double)C : 0) - xhat * sgx / (double)C));
        }
    }
}

/* sums of column c over all rows into pw[c], pb[c] (then rounded by column_total_kernel
 * with one chunk) */
template <typename T>
__global__ void norm_dwdb_ref_kernel(const T *dy, const T *x, const typename cti_acc<T>::type *mean,
                                     const typename cti_acc<T>::type *rstd, double *pw, double *pb, int64_t rows,
                                     int64_t C, bool center)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        double sw = 0, sb = 0;
        for (int64_t r = 0; r < rows; r++) {
            double mu = center ? (double)mean[r] : 0;
            sw += ldd(dy + r * C + c) * (ldd(x + r * C + c) - mu) * (double)rstd[r];
            sb += ldd(dy + r * C + c);
        }
        if (pw) pw[c] = sw;
        if (pb) pb[c] = sb;
    }
}

/* ---- host side ------------------------------------------------------------------------ */

static ct_dtype compute_dtype(const ct_tensor *x) { return x->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32; }

template <typename T>
static void launch_forward(const ct_tensor *x, const void *w, const void *b, double eps, ct_tensor *y, ct_tensor *mean,
                           ct_tensor *rstd, bool center, bool ref, cudaStream_t s)
{
    typedef typename cti_acc<T>::type A;
    int64_t rows = cti_cu_row_count(x), C = cti_cu_row_len(x);
    const T *xp = cti_cu_ptr<const T>(x);
    T *yp = cti_cu_ptr<T>(y);
    const A *wp = (const A *)w, *bp = (const A *)b;
    A *mp = mean ? cti_cu_ptr<A>(mean) : NULL, *rp = rstd ? cti_cu_ptr<A>(rstd) : NULL;
    if (ref)
        norm_forward_ref_kernel<T>
            <<<cti_cu_blocks(rows, REF_THREADS), REF_THREADS, 0, s>>>(xp, wp, bp, yp, mp, rp, rows, C, eps, center);
    else if (C <= WARP_ROW_MAX)
        norm_forward_kernel<T, false><<<cti_cu_blocks(rows, WARP_THREADS / 32), WARP_THREADS, 0, s>>>(
            xp, wp, bp, yp, mp, rp, rows, C, eps, center);
    else
        norm_forward_kernel<T, true>
            <<<cti_cu_blocks(rows, 1), ROW_THREADS, 0, s>>>(xp, wp, bp, yp, mp, rp, rows, C, eps, center);
}

static ct_status norm_forward(const char *op, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps,
                              ct_tensor *y, ct_tensor *mean, ct_tensor *rstd, bool center, bool ref)
{
    if (cti_cu_row_count(x) == 0) return CT_OK;
    ct_status st = cti_cuda_enter(y->device.index, op);
    if (st) return st;
    cudaStream_t s = cti_cu_stream(y);
    ct_dtype cd = compute_dtype(x);
    const void *wp = param_as(w, cd, s, &st), *bp = param_as(b, cd, s, &st);
    if (st) return st;
    CTI_CU_DISPATCH_FLOAT(x->dtype, T, { launch_forward<T>(x, wp, bp, eps, y, mean, rstd, center, ref, s); })
    else return cti_kernel_unsupported_dtype(op, x);
    return cti_cuda_launched(op, y);
}

/* dw and/or db (C) from per-chunk partial sums; out tensors of any float dtype. */
static ct_status total_into(const char *op, const double *p, int64_t chunks, int64_t C, ct_tensor *out, cudaStream_t s)
{
    if (!out) return CT_OK;
    unsigned blocks = cti_cu_blocks(C, 256);
    CTI_CU_DISPATCH_FLOAT(out->dtype, D, { column_total_kernel<D><<<blocks, 256, 0, s>>>(p, chunks, C, cti_cu_ptr<D>(out)); })
    else return cti_kernel_unsupported_dtype(op, out);
    return cti_cuda_launched(op, out);
}

template <typename T>
static ct_status launch_backward(const char *op, const ct_tensor *dy, const ct_tensor *x, const void *w,
                                 const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                 ct_tensor *db, bool center, bool ref, cudaStream_t s)
{
    typedef typename cti_acc<T>::type A;
    int64_t rows = cti_cu_row_count(x), C = cti_cu_row_len(x);
    const T *dyp = cti_cu_ptr<const T>(dy), *xp = cti_cu_ptr<const T>(x);
    const A *wp = (const A *)w, *mp = center ? cti_cu_ptr<const A>(mean) : NULL, *rp = cti_cu_ptr<const A>(rstd);
    if (dx && rows > 0) {
        T *dxp = cti_cu_ptr<T>(dx);
        if (ref)
            norm_backward_dx_ref_kernel<T>
                <<<cti_cu_blocks(rows, REF_THREADS), REF_THREADS, 0, s>>>(dyp, xp, wp, mp, rp, dxp, rows, C, center);
        else if (C <= WARP_ROW_MAX)
            norm_backward_dx_kernel<T, false><<<cti_cu_blocks(rows, WARP_THREADS / 32), WARP_THREADS, 0, s>>>(
                dyp, xp, wp, mp, rp, dxp, rows, C, center);
        else
            norm_backward_dx_kernel<T, true>
                <<<cti_cu_blocks(rows, 1), ROW_THREADS, 0, s>>>(dyp, xp, wp, mp, rp, dxp, rows, C, center);
        ct_status st = cti_cuda_launched(op, dx);
        if (st) return st;
    }
    if ((!dw && !db) || C == 0) return CT_OK;
    /* chunks of rows: at most 65535 (the grid's y limit); none when there are no rows,
     * and then dw, db are empty sums: zeros */
    int64_t chunk = ref ? (rows > 0 ? rows : 1) : DW_CHUNK;
    if ((rows + chunk - 1) / chunk > 65535) chunk = (rows + 65534) / 65535;
    int64_t chunks = (rows + chunk - 1) / chunk;
    int64_t pshape[2] = {chunks > 0 ? chunks : 1, C};
    ct_tensor *pw = dw ? ct_tensor_empty_on(x->device, CT_DTYPE_F64, 2, pshape) : NULL;
    ct_tensor *pb = db ? ct_tensor_empty_on(x->device, CT_DTYPE_F64, 2, pshape) : NULL;
    if ((dw && !pw) || (db && !pb)) return ct_last_status();
    double *pwp = pw ? cti_cu_ptr<double>(pw) : NULL, *pbp = pb ? cti_cu_ptr<double>(pb) : NULL;
    if (chunks > 0) {
        if (ref)
            norm_dwdb_ref_kernel<T>
                <<<cti_cu_blocks(C, REF_THREADS), REF_THREADS, 0, s>>>(dyp, xp, mp, rp, pwp, pbp, rows, C, center);
        else
            norm_dwdb_partial_kernel<T><<<dim3((unsigned)((C + DW_COLS - 1) / DW_COLS), (unsigned)chunks),
                                          dim3(DW_COLS, DW_ROWS), 0, s>>>(dyp, xp, mp, rp, pwp, pbp, rows, C, chunk,
                                                                          center);
        ct_status st = cti_cuda_launched(op, pw ? pw : pb);
        if (st) return st;
    }
    ct_status st = total_into(op, pwp, chunks, C, dw, s);
    return st ? st : total_into(op, pbp, chunks, C, db, s);
}

static ct_status norm_backward(const char *op, const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                               const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                               ct_tensor *db, bool center, bool ref)
{
    ct_status st = cti_cuda_enter(x->device.index, op);
    if (st) return st;
    cudaStream_t s = cti_cu_stream(x);
    const void *wp = param_as(w, compute_dtype(x), s, &st);
    if (st) return st;
    CTI_CU_DISPATCH_FLOAT(x->dtype, T, { return launch_backward<T>(op, dy, x, wp, mean, rstd, dx, dw, db, center, ref, s); })
    return cti_kernel_unsupported_dtype(op, x);
}

ct_status cti_cuda_layernorm(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                             ct_tensor *mean, ct_tensor *rstd)
{
    return norm_forward("layernorm", x, w, b, eps, y, mean, rstd, true, false);
}

ct_status cti_cuda_layernorm_ref(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                                 ct_tensor *mean, ct_tensor *rstd)
{
    return norm_forward("layernorm", x, w, b, eps, y, mean, rstd, true, true);
}

ct_status cti_cuda_layernorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                      const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                      ct_tensor *db)
{
    return norm_backward("layernorm_backward", dy, x, w, mean, rstd, dx, dw, db, true, false);
}

ct_status cti_cuda_layernorm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                          const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                          ct_tensor *db)
{
    return norm_backward("layernorm_backward", dy, x, w, mean, rstd, dx, dw, db, true, true);
}

ct_status cti_cuda_rmsnorm(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y, ct_tensor *rstd)
{
    return norm_forward("rmsnorm", x, w, NULL, eps, y, NULL, rstd, false, false);
}

ct_status cti_cuda_rmsnorm_ref(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y, ct_tensor *rstd)
{
    return norm_forward("rmsnorm", x, w, NULL, eps, y, NULL, rstd, false, true);
}

ct_status cti_cuda_rmsnorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                    const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw)
{
    return norm_backward("rmsnorm_backward", dy, x, w, NULL, rstd, dx, dw, NULL, false, false);
}

ct_status cti_cuda_rmsnorm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                        const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw)
{
    return norm_backward("rmsnorm_backward", dy, x, w, NULL, rstd, dx, dw, NULL, false, true);
}
