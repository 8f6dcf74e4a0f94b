/* ctrain — CUDA fused cross-entropy (log-softmax + NLL, mean over counted rows).
 *
 * logits (rows, V), targets (rows); row r with target t (not ignore_index):
 *   forward   lse_r = m + log(sum_v exp(x_v - m)), m = max_v x_v  (sum in double)
 *             term_r = lse_r - x_t  (0 for ignored rows),  loss = sum_r term_r / count
 *   backward  dx_v = exp(x_v - lse_r) * (sc / sum_v exp(x_v - lse_r)) - [v == t] * sc,
 *             sc = dloss / count; 0 on ignored rows  (dlogits overwritten)
 * One warp per row up to WARP_ROW_MAX classes, else one block per row. Only lse (rows)
 * is kept between forward and backward, never the probabilities. The loss is the sum
 * of the per-row terms (a scratch f64 vector) by one block in a fixed order, so it is
 * the same on every run. As on the CPU the backward uses lse only as the shift that
 * keeps exp() in range and normalises each row by its own sum (lse is stored in f32).
 *
 * Targets are checked first (kernels/cuda/rows.cu): one synchronisation per call.
 */
#include "kernels/cuda/loss.h"

#include "kernels/cuda/rows.cuh"

extern "C" {
#include "kernels/dispatch_internal.h"
}

#define WARP_ROW_MAX 1024 /* rows up to this length: one warp each */
#define WARP_THREADS 256  /* 8 rows per block in the warp-per-row kernels */
#define ROW_THREADS 512   /* threads per row in the block-per-row kernels */
#define SUM_THREADS 1024  /* the one block that adds the row terms */
#define REF_THREADS 128

/* One element of any float dtype, as a double (dloss). */
__device__ __forceinline__ double load_float(const void *p, ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F64: return *(const double *)p;
    case CT_DTYPE_BF16: return (double)ld((const cti_bf16 *)p);
    case CT_DTYPE_F16: return (double)ld((const cti_f16 *)p);
    default: return (double)*(const float *)p;
    }
}

// logits (rows, V), targets (rows) -> lse (rows) or NULL, term (rows) f64
template <typename T, bool BLOCK>
__global__ void ce_forward_kernel(const T *__restrict__ x, const void *__restrict__ tg, bool i64, int64_t ignore,
                                  typename cti_acc<T>::type *__restrict__ lse, double *__restrict__ term, int64_t rows,
                                  int64_t V)
{
    typedef typename cti_acc<T>::type A;
    __shared__ A smax[32];
    __shared__ double ssum[32];
    row_group<BLOCK> grp;
    /* the loop bound depends only on the group: a block (or warp) runs every
     * iteration together, as its reductions require */
    for (int64_t r = grp.first; r < rows; r += grp.step) {
        const T *xr = x + r * V;
        A m;
        double s;
        row_softmax_stats<BLOCK>(xr, V, grp, smax, ssum, &m, &s); /* one read of the row */
        if (grp.rank == 0) {
            double l = (double)m + log(s);
            if (lse) lse[r] = (A)l;
            int64_t t = cti_cu_index_at(tg, i64, r);
            term[r] = t == ignore ? 0 : l - (double)ld(xr + t);
        }
    }
}

// term (rows) -> loss = sum term / count (NaN for count 0), one block, fixed order
template <typename T>
__global__ void ce_total_kernel(const double *__restrict__ term, int64_t rows, int64_t count, T *__restrict__ loss)
{
    __shared__ double scratch[32];
    double s = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += term[r];
    s = cti_block_sum(s, scratch);
    if (threadIdx.x == 0) std_(loss, count ? s / (double)count : (double)NAN);
}

// logits (rows, V), targets, lse (rows), dloss -> dlogits (rows, V)
template <typename T, bool BLOCK>
__global__ void ce_backward_kernel(const T *__restrict__ x, const void *__restrict__ tg, bool i64, int64_t ignore,
                                   const typename cti_acc<T>::type *__restrict__ lse, const void *__restrict__ dloss,
                                   ct_dtype dloss_dt, int64_t count, T *__restrict__ dx, int64_t rows, int64_t V)
{
    typedef typename cti_acc<T>::type A;
    __shared__ double ssum[32];
    row_group<BLOCK> grp;
    const double sc = count ? load_float(dloss, dloss_dt) / (double)count : 0;
    for (int64_t r = grp.first; r < rows; r += grp.step) {
        const T *xr = x + r * V;
        T *dxr = dx + r * V;
        const int64_t t = cti_cu_index_at(tg, i64, r);
        if (t == ignore) { /* uniform over the group: the whole warp or block skips the row */
            for (int64_t i = grp.rank; i < V; i += grp.size) st(dxr + i, (A)0);
            continue;
        }
        const A l = lse[r];
        double s = 0;
        for (int64_t i = grp.rank; i < V; i += grp.size) s += (double)cu_exp(ld(xr + i) - l);
        s = group_sum<BLOCK>(s, ssum);
        const A k = (A)(sc / s), sca = (A)sc;
        for (int64_t i = grp.rank; i < V; i += grp.size) {
            A v = cu_exp(ld(xr + i) - l) * k;
            if (i == t) v -= sca;
            st(dxr + i, v);
        }
    }
}

/* ---- reference: one thread per row, every element through double ----------------- */

template <typename T>
__device__ void ref_row_stats(const T *xr, int64_t V, double *m, double *s)
{
    *m = -INFINITY;
    *s = 0;
    for (int64_t v = 0; v < V; v++)
        if (ldd(xr + v) > *m) *m = ldd(xr + v);
    for (int64_t v = 0; v < V; v++) *s += exp(ldd(xr + v) - *m);
}

template <typename T>
__global__ void ce_forward_ref_kernel(const T *x, const void *tg, bool i64, int64_t ignore,
                                      typename cti_acc<T>::type *lse, double *term, int64_t rows, int64_t V)
{
    typedef typename cti_acc<T>::type A;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        double m, s;
        ref_row_stats(x + r * V, V, &m, &s);
        if (lse) lse[r] = (A)(m + log(s));
        int64_t t = cti_cu_index_at(tg, i64, r);
        term[r] = t == ignore ? 0 : m + log(s) - ldd(x + r * V + t);
    }
}

template <typename T> __global__ void ce_total_ref_kernel(const double *term, int64_t rows, int64_t count, T *loss)
{
    double s = 0;
    for (int64_t r = 0; r < rows; r++) s += term[r];
    std_(loss, count ? s / (double)count : (double)NAN);
}

template <typename T>
__global__ void ce_backward_ref_kernel(const T *x, const void *tg, bool i64, int64_t ignore, const void *dloss,
                                       ct_dtype dloss_dt, int64_t count, T *dx, int64_t rows, int64_t V)
{
    const double sc = count ? load_float(dloss, dloss_dt) / (double)count : 0;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = cti_cu_index_at(tg, i64, r);
        double m, s;
        ref_row_stats(x + r * V, V, &m, &s);
        for (int64_t v = 0; v < V; v++) {
            double p = exp(ldd(x + r * V + v) - m) / s;
            std_(dx + r * V + v, t == ignore ? 0 : (p - (double)(v == t)) * sc);
        }
    }
}

/* ---- host side --------------------------------------------------------------------- */

/* Every target is ignore_index or in [0, V); *count = the rows not ignored. */
static ct_status check_targets(const char *op, const ct_tensor *targets, int64_t V, int64_t ignore, int64_t *count)
{
    cti_cu_index_check bad;
    ct_status st = cti_cuda_index_check(op, targets, V, true, ignore, &bad, NULL);
    if (st) return st;
    *count = bad.count;
    if (bad.pos < 0) return CT_OK;
    char pos[160], d[200];
    return ct_error_set(CT_ERR_INVALID,
                        "%s: target %lld at position %s of targets %s is out of range for V = %lld classes "
                        "(expected 0 <= target < %lld, or ignore_index %lld)",
                        op, (long long)bad.value, cti_cuda_index_pos(targets, bad.pos, pos, sizeof pos),
                        ct_tensor_describe(targets, d, sizeof d), (long long)V, (long long)V, (long long)ignore);
}

template <typename T>
static ct_status launch_forward(const char *op, const ct_tensor *logits, const ct_tensor *targets, int64_t ignore,
                                int64_t count, ct_tensor *loss, ct_tensor *lse, bool ref, cudaStream_t s)
{
    typedef typename cti_acc<T>::type A;
    int64_t rows = ct_tensor_numel(targets), V = cti_cu_row_len(logits);
    ct_tensor *term = ct_tensor_empty_on(logits->device, CT_DTYPE_F64, 1, &rows);
    if (!term) return ct_last_status();
    const T *xp = cti_cu_ptr<const T>(logits);
    const void *tg = ct_tensor_data(targets);
    bool i64 = targets->dtype == CT_DTYPE_I64;
    A *lp = lse ? cti_cu_ptr<A>(lse) : NULL;
    double *tp = cti_cu_ptr<double>(term);
    if (rows > 0) {
        if (ref)
            ce_forward_ref_kernel<T>
                <<<cti_cu_blocks(rows, REF_THREADS), REF_THREADS, 0, s>>>(xp, tg, i64, ignore, lp, tp, rows, V);
        else if (V <= WARP_ROW_MAX)
            ce_forward_kernel<T, false><<<cti_cu_blocks(rows, WARP_THREADS / 32), WARP_THREADS, 0, s>>>(
                xp, tg, i64, ignore, lp, tp, rows, V);
        else
            ce_forward_kernel<T, true>
                <<<cti_cu_blocks(rows, 1), ROW_THREADS, 0, s>>>(xp, tg, i64, ignore, lp, tp, rows, V);
        ct_status st = cti_cuda_launched(op, logits);
        if (st) return st;
    }
    if (ref) ce_total_ref_kernel<T><<<1, 1, 0, s>>>(tp, rows, count, cti_cu_ptr<T>(loss));
    else ce_total_kernel<T><<<1, SUM_THREADS, 0, s>>>(tp, rows, count, cti_cu_ptr<T>(loss));
    return cti_cuda_launched(op, loss);
}

static ct_status forward(const char *op, const ct_tensor *logits, const ct_tensor *targets, int64_t ignore,
                         ct_tensor *loss, ct_tensor *lse, bool ref)
{
    ct_status st = cti_cuda_enter(logits->device.index, op);
    if (st) return st;
    int64_t V = cti_cu_row_len(logits), count;
    st = check_targets(op, targets, V, ignore, &count);
    if (st) return st;
    cudaStream_t s = cti_cu_stream(logits);
    CTI_CU_DISPATCH_FLOAT(logits->dtype, T, { return launch_forward<T>(op, logits, targets, ignore, count, loss, lse, ref, s); })
    return cti_kernel_unsupported_dtype(op, logits);
}

template <typename T>
static void launch_backward(const ct_tensor *dloss, const ct_tensor *logits, const ct_tensor *targets,
                            const ct_tensor *lse, int64_t ignore, int64_t count, ct_tensor *dlogits, bool ref,
                            cudaStream_t s)
{
    typedef typename cti_acc<T>::type A;
    int64_t rows = ct_tensor_numel(targets), V = cti_cu_row_len(logits);
    const T *xp = cti_cu_ptr<const T>(logits);
    const void *tg = ct_tensor_data(targets), *dl = ct_tensor_data(dloss);
    bool i64 = targets->dtype == CT_DTYPE_I64;
    T *dxp = cti_cu_ptr<T>(dlogits);
    if (ref)
        ce_backward_ref_kernel<T><<<cti_cu_blocks(rows, REF_THREADS), REF_THREADS, 0, s>>>(
            xp, tg, i64, ignore, dl, dloss->dtype, count, dxp, rows, V);
    else if (V <= WARP_ROW_MAX)
        ce_backward_kernel<T, false><<<cti_cu_blocks(rows, WARP_THREADS / 32), WARP_THREADS, 0, s>>>(
            xp, tg, i64, ignore, cti_cu_ptr<const A>(lse), dl, dloss->dtype, count, dxp, rows, V);
    else
        ce_backward_kernel<T, true><<<cti_cu_blocks(rows, 1), ROW_THREADS, 0, s>>>(
            xp, tg, i64, ignore, cti_cu_ptr<const A>(lse), dl, dloss->dtype, count, dxp, rows, V);
}

static ct_status backward(const char *op, const ct_tensor *dloss, const ct_tensor *logits, const ct_tensor *targets,
                          const ct_tensor *lse, int64_t ignore, ct_tensor *dlogits, bool ref)
{
    ct_status st = cti_cuda_enter(logits->device.index, op);
    if (st) return st;
    int64_t V = cti_cu_row_len(logits), count;
    st = check_targets(op, targets, V, ignore, &count);
    if (st) return st;
    if (ct_tensor_numel(dlogits) == 0) return CT_OK;
    cudaStream_t s = cti_cu_stream(logits);
    CTI_CU_DISPATCH_FLOAT(logits->dtype, T, { launch_backward<T>(dloss, logits, targets, lse, ignore, count, dlogits, ref, s); })
    else return cti_kernel_unsupported_dtype(op, logits);
    return cti_cuda_launched(op, dlogits);
}

ct_status cti_cuda_cross_entropy(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                 ct_tensor *loss, ct_tensor *lse)
{
    return forward("cross_entropy", logits, targets, ignore_index, loss, lse, false);
}

ct_status cti_cuda_cross_entropy_ref(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                     ct_tensor *loss, ct_tensor *lse)
{
    return forward("cross_entropy", logits, targets, ignore_index, loss, lse, true);
}

ct_status cti_cuda_cross_entropy_backward(const ct_tensor *dloss, const ct_tensor *logits, const ct_tensor *targets,
                                          const ct_tensor *lse, int64_t ignore_index, ct_tensor *dlogits)
{
    return backward("cross_entropy_backward", dloss, logits, targets, lse, ignore_index, dlogits, false);
}

ct_status cti_cuda_cross_entropy_backward_ref(const ct_tensor *dloss, const ct_tensor *logits,
                                              const ct_tensor *targets, const ct_tensor *lse, int64_t ignore_index,
                                              ct_tensor *dlogits)
{
    return backward("cross_entropy_backward", dloss, logits, targets, lse, ignore_index, dlogits, true);
}
