/* ctrain — CUDA attention, plain reference kernels: one thread per row, every sum in
 * double, no tiles, no shared memory. Slow and obviously right; the tests compare the
 * tiled kernels (attention_fwd.cu, attention_bwd.cu) and the CPU against them, and
 * the tiled entry points fall back to them for head dims past 128.
 *
 * Forward, one thread per query row i of head (b,h), two passes over the keys it sees:
 *   1. m = max_j s_ij,  s_ij = q_i . k_j * scale
 *   2. l = sum_j exp(s_ij - m),  acc = sum_j exp(s_ij - m) v_j  (acc: f64 scratch row)
 *   out_i = acc / l,  lse_i = m + log l;  a row that sees no key: out 0, lse -inf.
 * Backward (ignores out and lse, like the CPU reference: the softmax is recomputed):
 *   per query row i: lse_i as above, rowsum_i = sum_j P_ij dP_ij, dQ_i = scale sum_j dS_ij k_j
 *   per key row j (a loop over queries): dV_j = sum_i P_ij dO_i, dK_j = scale sum_i dS_ij q_i
 * with P_ij = exp(s_ij - lse_i), dP_ij = dO_i . v_j, dS_ij = P_ij (dP_ij - rowsum_i).
 */
#include "kernels/cuda/attention_tile.cuh"

#define CTI_ATTN_REF_THREADS 128

/* Element (b,h,t,d) of operand o as a double. */
template <typename T> __device__ __forceinline__ double cti_attn_ref_ld(const cti_attn_op &o, int64_t b, int64_t h,
                                                                       int64_t t, int64_t d)
{
    return (double)ld<T>((const T *)o.p + cti_attn_row(o, b, h, t) + d * o.st[3]);
}

/* Rounds v once from double to T, as the CPU reference's attn_store (through f32 a
 * 16-bit result could be rounded twice). */
template <typename T> __device__ __forceinline__ void cti_attn_ref_round(T *p, double v) { *p = (T)v; }
template <> __device__ __forceinline__ void cti_attn_ref_round<cti_bf16>(cti_bf16 *p, double v)
{
    p->bits = cti_f64_to_bf16_bits(v);
}
template <> __device__ __forceinline__ void cti_attn_ref_round<cti_f16>(cti_f16 *p, double v)
{
    p->bits = cti_f64_to_f16_bits(v);
}

template <typename T> __device__ __forceinline__ void cti_attn_ref_st(const cti_attn_op &o, int64_t b, int64_t h,
                                                                      int64_t t, int64_t d, double v)
{
    cti_attn_ref_round<T>((T *)o.p + cti_attn_row(o, b, h, t) + d * o.st[3], v);
}

/* q_i . k_j * scale in double. */
template <typename T>
__device__ double cti_attn_ref_score(const cti_attn_args &a, int64_t b, int64_t h, int64_t i, int64_t j)
{
    double s = 0;
    for (int64_t d = 0; d < a.D; d++) s += cti_attn_ref_ld<T>(a.q, b, h, i, d) * cti_attn_ref_ld<T>(a.k, b, h, j, d);
    return s * a.scale;
}

/* dO_i . v_j in double. */
template <typename T>
__device__ double cti_attn_ref_dp(const cti_attn_args &a, int64_t b, int64_t h, int64_t i, int64_t j)
{
    double s = 0;
    for (int64_t c = 0; c < a.Dv; c++)
        s += cti_attn_ref_ld<T>(a.dout, b, h, i, c) * cti_attn_ref_ld<T>(a.v, b, h, j, c);
    return s;
}

/* Query row i sees key j; written out here rather than through cti_attn_kend. */
__device__ __forceinline__ bool cti_attn_ref_sees(const cti_attn_args &a, int64_t i, int64_t j)
{
    return !a.causal || j <= i + (a.S - a.T);
}

/* The max and the logsumexp of row i's visible scores; -inf when it sees none. */
template <typename T>
__device__ void cti_attn_ref_lse(const cti_attn_args &a, int64_t b, int64_t h, int64_t i, double *mx, double *lse)
{
    double m = -INFINITY, l = 0;
    for (int64_t j = 0; j < a.S; j++) {
        if (!cti_attn_ref_sees(a, i, j)) continue;
        const double s = cti_attn_ref_score<T>(a, b, h, i, j);
        m = s > m ? s : m;
    }
    for (int64_t j = 0; j < a.S && m > -INFINITY; j++)
        if (cti_attn_ref_sees(a, i, j)) l += exp(cti_attn_ref_score<T>(a, b, h, i, j) - m);
    *mx = m;
    *lse = m > -INFINITY ? m + log(l) : -INFINITY;
}

/* acc: (B*H*T, Dv) f64 scratch, one row per thread. */
template <typename T> __global__ void cti_attn_ref_fwd_kernel(cti_attn_args a, double *acc)
{
    const int64_t rows = a.B * a.H * a.T, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += stride) {
        const int64_t bh = row / a.T, i = row % a.T, b = bh / a.H, h = bh % a.H;
        double *o = acc + row * a.Dv;
        for (int64_t c = 0; c < a.Dv; c++) o[c] = 0;
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < a.S; j++) {
            if (!cti_attn_ref_sees(a, i, j)) continue;
            const double s = cti_attn_ref_score<T>(a, b, h, i, j);
            m = s > m ? s : m;
        }
        for (int64_t j = 0; j < a.S && m > -INFINITY; j++) {
            if (!cti_attn_ref_sees(a, i, j)) continue;
            const double e = exp(cti_attn_ref_score<T>(a, b, h, i, j) - m);
            l += e;
            for (int64_t c = 0; c < a.Dv; c++) o[c] += e * cti_attn_ref_ld<T>(a.v, b, h, j, c);
        }
        for (int64_t c = 0; c < a.Dv; c++) cti_attn_ref_st<T>(a.out, b, h, i, c, l > 0 ? o[c] / l : 0.0);
        if (a.lse.p) cti_attn_lse_store(a, b, h, i, l > 0 ? m + log(l) : -INFINITY);
    }
}

/* Per query row: dQ, and (lse_i, rowsum_i) into stat[2 * row] for the key pass.
 * acc: (B*H*T, D) f64 scratch. */
template <typename T> __global__ void cti_attn_ref_dq_kernel(cti_attn_args a, double *acc, double *stat)
{
    const int64_t rows = a.B * a.H * a.T, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += stride) {
        const int64_t bh = row / a.T, i = row % a.T, b = bh / a.H, h = bh % a.H;
        double m, lse, rowsum = 0;
        cti_attn_ref_lse<T>(a, b, h, i, &m, &lse);
        for (int64_t j = 0; j < a.S; j++)
            if (cti_attn_ref_sees(a, i, j))
                rowsum += exp(cti_attn_ref_score<T>(a, b, h, i, j) - lse) * cti_attn_ref_dp<T>(a, b, h, i, j);
        double *g = acc + row * a.D;
        for (int64_t d = 0; d < a.D; d++) g[d] = 0;
        for (int64_t j = 0; j < a.S; j++) {
            if (!cti_attn_ref_sees(a, i, j)) continue;
            const double p = exp(cti_attn_ref_score<T>(a, b, h, i, j) - lse);
            const double ds = p * (cti_attn_ref_dp<T>(a, b, h, i, j) - rowsum);
            for (int64_t d = 0; d < a.D; d++) g[d] += ds * cti_attn_ref_ld<T>(a.k, b, h, j, d);
        }
        for (int64_t d = 0; d < a.D; d++) cti_attn_ref_st<T>(a.dq, b, h, i, d, g[d] * a.scale);
        stat[2 * row] = lse, stat[2 * row + 1] = rowsum;
    }
}

/* Per key row j: dK, dV over the queries that see it. acc: (B*H*S, D + Dv) f64 scratch. */
template <typename T> __global__ void cti_attn_ref_dkdv_kernel(cti_attn_args a, double *acc, const double *stat)
{
    const int64_t rows = a.B * a.H * a.S, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += stride) {
        const int64_t bh = row / a.S, j = row % a.S, b = bh / a.H, h = bh % a.H;
        double *gk = acc + row * (a.D + a.Dv), *gv = gk + a.D;
        for (int64_t d = 0; d < a.D + a.Dv; d++) gk[d] = 0;
        for (int64_t i = 0; i < a.T; i++) {
            if (!cti_attn_ref_sees(a, i, j)) continue;
            const double lse = stat[2 * (bh * a.T + i)], rowsum = stat[2 * (bh * a.T + i) + 1];
            const double p = exp(cti_attn_ref_score<T>(a, b, h, i, j) - lse);
            const double ds = p * (cti_attn_ref_dp<T>(a, b, h, i, j) - rowsum);
            for (int64_t d = 0; d < a.D; d++) gk[d] += ds * cti_attn_ref_ld<T>(a.q, b, h, i, d);
            for (int64_t c = 0; c < a.Dv; c++) gv[c] += p * cti_attn_ref_ld<T>(a.dout, b, h, i, c);
        }
        for (int64_t d = 0; d < a.D; d++) cti_attn_ref_st<T>(a.dk, b, h, j, d, gk[d] * a.scale);
        for (int64_t c = 0; c < a.Dv; c++) cti_attn_ref_st<T>(a.dv, b, h, j, c, gv[c]);
    }
}

/* An f64 scratch tensor of n elements (at least 1) on t's device, in the current frame. */
static double *cti_attn_ref_scratch(const ct_tensor *t, int64_t n)
{
    const int64_t shape[1] = {n > 0 ? n : 1};
    ct_tensor *s = ct_tensor_empty_on(t->device, CT_DTYPE_F64, 1, shape);
    return s ? (double *)ct_tensor_data(s) : NULL;
}

extern "C" ct_status cti_cuda_attention_ref(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                            double scale, ct_tensor *out, ct_tensor *lse)
{
    ct_status st = cti_cuda_enter(q->device.index, "attention_ref");
    if (st) return st;
    const cti_attn_args a = cti_attn_args_of(q, k, v, out, lse, NULL, NULL, NULL, NULL, causal, scale);
    const int64_t rows = a.B * a.H * a.T;
    if (rows == 0) return CT_OK;
    double *acc = cti_attn_ref_scratch(q, rows * a.Dv);
    if (!acc) return ct_last_status();
    const unsigned blocks = cti_cu_blocks(rows, CTI_ATTN_REF_THREADS);
    cudaStream_t s = cti_cu_stream(out);
    CTI_CU_DISPATCH_FLOAT(q->dtype, T_, { cti_attn_ref_fwd_kernel<T_><<<blocks, CTI_ATTN_REF_THREADS, 0, s>>>(a, acc); })
    else return ct_error_set(CT_ERR_UNSUPPORTED, "attention_ref: no CUDA kernel for %s", ct_dtype_name(q->dtype));
    return cti_cuda_launched("attention_ref", out);
}

extern "C" ct_status cti_cuda_attention_backward_ref(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                                     const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                                     bool causal, double scale, ct_tensor *dq, ct_tensor *dk,
                                                     ct_tensor *dv)
{
    ct_status st = cti_cuda_enter(q->device.index, "attention_backward_ref");
    if (st) return st;
    (void)out, (void)lse;
    const cti_attn_args a = cti_attn_args_of(q, k, v, NULL, NULL, dout, dq, dk, dv, causal, scale);
    const int64_t qrows = a.B * a.H * a.T, krows = a.B * a.H * a.S;
    double *gq = cti_attn_ref_scratch(q, qrows * a.D), *stat = cti_attn_ref_scratch(q, 2 * qrows);
    double *gkv = cti_attn_ref_scratch(q, krows * (a.D + a.Dv));
    if (!gq || !stat || !gkv) return ct_last_status();
    cudaStream_t s = cti_cu_stream(dq);
    const unsigned qblocks = cti_cu_blocks(qrows, CTI_ATTN_REF_THREADS);
    const unsigned kblocks = cti_cu_blocks(krows, CTI_ATTN_REF_THREADS);
    /* the key pass reads the query pass's lse and rowsum: same stream, in order */
    CTI_CU_DISPATCH_FLOAT(q->dtype, T_, {
        if (qrows > 0) {
            cti_attn_ref_dq_kernel<T_><<<qblocks, CTI_ATTN_REF_THREADS, 0, s>>>(a, gq, stat);
            if ((st = cti_cuda_launched("attention_backward_ref", dq))) return st;
        }
        if (krows > 0) {
            cti_attn_ref_dkdv_kernel<T_><<<kblocks, CTI_ATTN_REF_THREADS, 0, s>>>(a, gkv, stat);
            if ((st = cti_cuda_launched("attention_backward_ref", dk))) return st;
        }
    })
    else return ct_error_set(CT_ERR_UNSUPPORTED, "attention_backward_ref: no CUDA kernel for %s",
                             ct_dtype_name(q->dtype));
    return CT_OK;
}
