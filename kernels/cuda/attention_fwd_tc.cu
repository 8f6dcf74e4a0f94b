/* ctrain — CUDA attention forward for bf16 and f16 on tensor cores (WMMA).
 *
 * The algorithm of attention_fwd.cu (online softmax over key tiles, causal tiles
 * skipped past the diagonal, out = O / l and lse = m + log l saved), with the two tile
 * products on tensor cores: 16 x 16 x 16 fragments of 16-bit values, f32 accumulators.
 * Per block: 64 query rows (8 warps, 8 rows each for the softmax), key tiles of 64.
 *   S = Q K^T      Q (64, Dp) and K (64, Dp) as stored (16-bit), S (64, 64) f32
 *   softmax rows   m, l (double), P = exp(S * scale - m) rounded to the input dtype
 *   O = O * corr + P V   O (64, Dvp) f32 in shared memory, V (64, Dvp) 16-bit
 * Dp, Dvp: the head dims rounded up to 16, zero-padded (the pad adds 0 to every dot).
 * What differs from the f32 arithmetic: P is rounded to bf16/f16 before P V (as GPU
 * flash attention and the CPU's bf16 dot-product kernels do); l sums the unrounded P,
 * so lse, which the backward recomputes P from, keeps f32 accuracy. Scores, the
 * softmax and every accumulator are f32, the output is rounded once.
 *
 * WMMA needs 32-byte aligned tile pointers and row pitches that are multiples of 8
 * (16-bit) or 4 (f32) elements: every region below starts on 128 bytes, every pitch is
 * a multiple of 8 elements, and fragments start on rows and columns that are multiples
 * of 16.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "kernels/cuda/attention_tile.cuh"

extern __shared__ __align__(128) unsigned char cti_attn_tc_smem[];

namespace {

/* The CUDA type of a storage type's bits, for the fragments. */
template <typename T> struct tc_type;
template <> struct tc_type<cti_bf16> { typedef __nv_bfloat16 type; };
template <> struct tc_type<cti_f16> { typedef __half type; };

__device__ __forceinline__ uint16_t tc_round(cti_bf16 *, float v) { return cti_f32_to_bf16_bits(v); }
__device__ __forceinline__ uint16_t tc_round(cti_f16 *, float v) { return cti_f32_to_f16_bits(v); }

constexpr int TC_ROWS = 64, TC_KEYS = 64, TC_RPW = TC_ROWS / CTI_ATTN_WARPS;

/* Shared memory layout (in bytes from the start) for head dims D, Dv. */
struct tc_layout {
    int dp, dvp;       /* head dims rounded up to 16 */
    int lq, lv, ls, lp, lo; /* pitches in elements: Q and K, V, S (f32), P, O (f32) */
    size_t q, k, v, s, p, o, bytes;
};

__host__ __device__ __forceinline__ size_t tc_round128(size_t x) { return (x + 127) / 128 * 128; }

__host__ __device__ __forceinline__ tc_layout tc_layout_of(int D, int Dv)
{
    tc_layout L;
    L.dp = (D + 15) / 16 * 16, L.dvp = (Dv + 15) / 16 * 16;
    /* +8 elements: consecutive rows start 16 bytes apart modulo 128, fewer bank conflicts */
    L.lq = L.dp + 8, L.lv = L.dvp + 8, L.ls = TC_KEYS + 8, L.lp = TC_KEYS + 8, L.lo = L.dvp + 8;
    L.q = 0;
    L.k = L.q + tc_round128((size_t)TC_ROWS * L.lq * 2);
    L.v = L.k + tc_round128((size_t)TC_KEYS * L.lq * 2);
    L.s = L.v + tc_round128((size_t)TC_KEYS * L.lv * 2);
    L.p = L.s + tc_round128((size_t)TC_ROWS * L.ls * 4);
    L.o = L.p + tc_round128((size_t)TC_ROWS * L.lp * 2);
    L.bytes = L.o + tc_round128((size_t)TC_ROWS * L.lo * 4);
    return L;
}

/* dst[r * pitch + c] <- the bits of rows [t0, t0 + n) x columns [0, ncols) of a head,
 * zeros in rows [n, rows) and columns [ncols, cols) (cols: the padded width). */
template <typename T>
__device__ __forceinline__ void tc_load(uint16_t *dst, int pitch, const T *head, int64_t st, int64_t sd, int64_t t0,
                                        int n, int rows, int ncols, int cols)
{
    const int total = rows * cols;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        const int r = e / cols, c = e - r * cols;
        dst[r * pitch + c] = r < n && c < ncols ? head[(t0 + r) * st + (int64_t)c * sd].bits : (uint16_t)0;
    }
}

template <typename T> __global__ void __launch_bounds__(CTI_ATTN_THREADS) tc_fwd_kernel(cti_attn_args a, int64_t nqb)
{
    using namespace nvcuda;
    typedef typename tc_type<T>::type H;
    const tc_layout L = tc_layout_of(a.D, a.Dv);
    uint16_t *Qh = (uint16_t *)(cti_attn_tc_smem + L.q); /* TC_ROWS x lq */
    uint16_t *Kh = (uint16_t *)(cti_attn_tc_smem + L.k); /* TC_KEYS x lq */
    uint16_t *Vh = (uint16_t *)(cti_attn_tc_smem + L.v); /* TC_KEYS x lv */
    float *Ss = (float *)(cti_attn_tc_smem + L.s);       /* TC_ROWS x ls */
    uint16_t *Ph = (uint16_t *)(cti_attn_tc_smem + L.p); /* TC_ROWS x lp */
    float *Os = (float *)(cti_attn_tc_smem + L.o);       /* TC_ROWS x lo */

    /* the last query tiles of a head see the most keys under the causal mask: they go first */
    const int64_t bh = (int64_t)blockIdx.x / nqb, qb = nqb - 1 - (int64_t)blockIdx.x % nqb;
    const int64_t b = bh / a.H, h = bh % a.H, i0 = qb * TC_ROWS;
    const int nq = (int)cti_attn_min(TC_ROWS, a.T - i0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float scale = (float)a.scale;
    const T *qh = (const T *)a.q.p + cti_attn_row(a.q, b, h, 0);
    const T *kh = (const T *)a.k.p + cti_attn_row(a.k, b, h, 0);
    const T *vh = (const T *)a.v.p + cti_attn_row(a.v, b, h, 0);

    tc_load<T>(Qh, L.lq, qh, a.q.st[2], a.q.st[3], i0, nq, TC_ROWS, a.D, L.dp);
    for (int e = threadIdx.x; e < TC_ROWS * L.lo; e += blockDim.x) Os[e] = 0;

    float m[TC_RPW];
    double l[TC_RPW];
#pragma unroll
    for (int rr = 0; rr < TC_RPW; rr++) m[rr] = -INFINITY, l[rr] = 0;

    const int64_t kend_blk = cti_attn_kend(a, i0 + nq - 1); /* the tile's last row sees the most keys */
    for (int64_t j0 = 0; j0 < kend_blk; j0 += TC_KEYS) {
        const int nk = (int)cti_attn_min(TC_KEYS, kend_blk - j0);
        __syncthreads(); /* the previous tile's K, V, P are no longer read (and Q, O are ready) */
        tc_load<T>(Kh, L.lq, kh, a.k.st[2], a.k.st[3], j0, nk, TC_KEYS, a.D, L.dp);
        tc_load<T>(Vh, L.lv, vh, a.v.st[2], a.v.st[3], j0, nk, TC_KEYS, a.Dv, L.dvp);
        __syncthreads();

        /* S (64 x 64) = Q K^T: 16 fragments, two per warp; K^T is K read column-major */
        for (int t = warp; t < (TC_ROWS / 16) * (TC_KEYS / 16); t += CTI_ATTN_WARPS) {
            const int ti = t / (TC_KEYS / 16), tj = t % (TC_KEYS / 16);
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < L.dp; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, (const H *)(Qh + ti * 16 * L.lq + kk), L.lq);
                wmma::load_matrix_sync(fb, (const H *)(Kh + tj * 16 * L.lq + kk), L.lq);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(Ss + ti * 16 * L.ls + tj * 16, acc, L.ls, wmma::mem_row_major);
        }
        __syncthreads();

        /* online softmax of the warp's rows; every row of P is written (zeros where masked),
         * since the P V fragments read all 64 x 64 */
#pragma unroll
        for (int rr = 0; rr < TC_RPW; rr++) {
            const int r = warp * TC_RPW + rr;
            const int64_t lim64 = r < nq ? cti_attn_kend(a, i0 + r) - j0 : 0;
            const int lim = (int)cti_attn_min(nk, lim64 > 0 ? lim64 : 0); /* warp-uniform */
            uint16_t *pr = Ph + r * L.lp;
            float *orow = Os + r * L.lo;
            if (lim == 0) {
                for (int jj = lane; jj < TC_KEYS; jj += 32) pr[jj] = 0;
                continue; /* O, m and l stay */
            }
            float s[TC_KEYS / 32], mx = -INFINITY;
#pragma unroll
            for (int cc = 0; cc < TC_KEYS / 32; cc++) {
                const int jj = lane + 32 * cc;
                s[cc] = jj < lim ? Ss[r * L.ls + jj] * scale : -INFINITY;
                mx = s[cc] > mx ? s[cc] : mx;
            }
            mx = cti_warp_max(mx); /* finite: key 0 of the tile is visible */
            const float mnew = mx > m[rr] ? mx : m[rr];
            const float corr = expf(m[rr] - mnew); /* 0 on the row's first visible tile */
            float psum = 0;
#pragma unroll
            for (int cc = 0; cc < TC_KEYS / 32; cc++) {
                const int jj = lane + 32 * cc;
                const float p = jj < lim ? expf(s[cc] - mnew) : 0.0f;
                pr[jj] = tc_round((T *)0, p);
                psum += p;
            }
            psum = cti_warp_sum(psum);
            l[rr] = l[rr] * (double)corr + (double)psum;
            m[rr] = mnew;
            for (int c = lane; c < L.dvp; c += 32) orow[c] *= corr;
        }
        __syncthreads();

        /* O (64 x Dvp) += P V: fragments of O spread over the warps, keys of the tile only */
        const int kfrag = (nk + 15) / 16, ofrag = (TC_ROWS / 16) * (L.dvp / 16);
        for (int t = warp; t < ofrag; t += CTI_ATTN_WARPS) {
            const int ti = t / (L.dvp / 16), tj = t % (L.dvp / 16);
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            float *op = Os + ti * 16 * L.lo + tj * 16;
            wmma::load_matrix_sync(acc, op, L.lo, wmma::mem_row_major);
            for (int kk = 0; kk < kfrag; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, (const H *)(Ph + ti * 16 * L.lp + kk * 16), L.lp);
                wmma::load_matrix_sync(fb, (const H *)(Vh + kk * 16 * L.lv + tj * 16), L.lv);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(op, acc, L.lo, wmma::mem_row_major);
        }
    }
    __syncthreads(); /* O complete */

    T *oh = (T *)a.out.p + cti_attn_row(a.out, b, h, 0);
#pragma unroll
    for (int rr = 0; rr < TC_RPW; rr++) {
        const int r = warp * TC_RPW + rr;
        if (r >= nq) continue;
        const int64_t i = i0 + r;
        const float inv = l[rr] > 0 ? (float)(1.0 / l[rr]) : 0.0f;
        for (int c = lane; c < a.Dv; c += 32)
            st<T>(oh + i * a.out.st[2] + (int64_t)c * a.out.st[3], Os[r * L.lo + c] * inv);
        if (a.lse.p && lane == 0) cti_attn_lse_store(a, b, h, i, l[rr] > 0 ? (double)m[rr] + log(l[rr]) : -INFINITY);
    }
}

template <typename T> ct_status tc_launch(const cti_attn_args &a, const ct_tensor *out, bool *done)
{
    const tc_layout L = tc_layout_of(a.D, a.Dv);
    const int dev = out->device.index;
    ct_status st = cti_attn_smem((const void *)tc_fwd_kernel<T>, L.bytes, dev, "attention", done);
    if (st || !*done) return st;
    const int64_t nqb = (a.T + TC_ROWS - 1) / TC_ROWS, blocks = nqb * a.B * a.H;
    if (blocks > 0x7fffffff) {
        *done = false;
        return CT_OK;
    }
    tc_fwd_kernel<T><<<(unsigned)blocks, CTI_ATTN_THREADS, L.bytes, cti_cu_stream(out)>>>(a, nqb);
    return cti_cuda_launched("attention", out);
}

} // namespace

ct_status cti_attn_fwd_tc(const cti_attn_args &a, const ct_tensor *out, ct_dtype dt, bool *done)
{
    *done = false;
    if (a.D > CTI_ATTN_MAX_DIM || a.Dv > CTI_ATTN_MAX_DIM) return CT_OK;
    if (dt == CT_DTYPE_BF16) return tc_launch<cti_bf16>(a, out, done);
    if (dt == CT_DTYPE_F16) return tc_launch<cti_f16>(a, out, done);
    return CT_OK;
}
