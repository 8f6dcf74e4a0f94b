/* ctrain — CUDA attention forward, flash-attention style.
 *
 * q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv) -> out (B,H,T,Dv), lse (B,H,T):
 *   s_ij = q_i . k_j * scale over the keys j < kend(i) that row i sees (causal: j <= i + S - T),
 *   out_i = sum_j exp(s_ij - lse_i) v_j,  lse_i = log sum_j exp(s_ij)   (-inf, out 0: no key).
 *
 * One block per (b, h, tile of OWN query rows); a warp owns RPW of the rows. The block
 * walks the key tiles (SPAN keys) its last row sees, stopping at the causal diagonal,
 * with the tile's K and V in shared memory. Per row, the online softmax of the CPU
 * kernel: m the largest scaled score so far, l = sum exp(s - m) (in double, as the CPU),
 * the output accumulator O = sum exp(s - m) v in registers; a tile that raises m
 * rescales l and O by exp(m_old - m). At the end out = O / l, lse = m + log l. Nothing
 * of size T x S exists: shared memory holds Q (OWN x D), K (SPAN x D), V (SPAN x Dv)
 * and the tile's probabilities (OWN x SPAN).
 *
 * f32 computes in f32, f64 in f64; bf16 and f16 take the tensor-core kernel of
 * attention_fwd_tc.cu, and these kernels (16-bit inputs widened to f32 as loaded)
 * only where it cannot run. Head dims up to 128 take these kernels; wider heads (or
 * a device without the shared memory) take the plain kernels of attention_ref.cu.
 */
#include "kernels/cuda/attention_tile.cuh"

extern __shared__ __align__(16) unsigned char cti_attn_fwd_smem[];

template <typename T, int NC>
__global__ void __launch_bounds__(CTI_ATTN_THREADS) cti_attn_fwd_kernel(cti_attn_args a, int64_t nqb)
{
    typedef typename cti_acc<T>::type A;
    constexpr int RPW = cti_attn_geom<A>::RPW, CPL = cti_attn_geom<A>::CPL;
    constexpr int OWN = CTI_ATTN_WARPS * RPW, SPAN = 32 * CPL;
    const int D = a.D, Dv = a.Dv, pk = cti_attn_pitch(D), pv = cti_attn_pitch(Dv);
    A *Qs = (A *)cti_attn_fwd_smem; /* OWN x pk */
    A *Ks = Qs + OWN * pk;          /* SPAN x pk */
    A *Vs = Ks + SPAN * pk;         /* SPAN x pv */
    A *Ps = Vs + SPAN * pv;         /* OWN x SPAN */

    /* the last query tiles of a head see the most keys under the causal mask: they go first */
    const int64_t bh = (int64_t)blockIdx.x / nqb, qb = nqb - 1 - (int64_t)blockIdx.x % nqb;
    const int64_t b = bh / a.H, h = bh % a.H, i0 = qb * OWN;
    const int nq = (int)cti_attn_min(OWN, a.T - i0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const A scale = (A)a.scale;
    const T *qh = (const T *)a.q.p + cti_attn_row(a.q, b, h, 0);
    const T *kh = (const T *)a.k.p + cti_attn_row(a.k, b, h, 0);
    const T *vh = (const T *)a.v.p + cti_attn_row(a.v, b, h, 0);

    cti_attn_load_tile<T, A>(Qs, pk, qh, a.q.st[2], a.q.st[3], i0, nq, OWN, D);

    A m[RPW], acc[RPW][NC];
    double l[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        m[rr] = -INFINITY, l[rr] = 0;
#pragma unroll
        for (int c = 0; c < NC; c++) acc[rr][c] = 0;
    }

    const int64_t kend_blk = cti_attn_kend(a, i0 + nq - 1); /* the tile's last row sees the most keys */
    for (int64_t j0 = 0; j0 < kend_blk; j0 += SPAN) {
        const int nk = (int)cti_attn_min(SPAN, kend_blk - j0);
        __syncthreads(); /* every warp is done with the previous K, V tile (and Q is loaded) */
        cti_attn_load_tile<T, A>(Ks, pk, kh, a.k.st[2], a.k.st[3], j0, nk, SPAN, D);
        cti_attn_load_tile<T, A>(Vs, pv, vh, a.v.st[2], a.v.st[3], j0, nk, SPAN, Dv);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = warp * RPW + rr;
            if (r >= nq) continue;
            /* keys [0, lim) of the tile are visible to row r; warp-uniform, like r */
            const int64_t lim64 = cti_attn_kend(a, i0 + r) - j0;
            if (lim64 <= 0) continue; /* P = 0: O, m and l stay */
            const int lim = (int)cti_attn_min(nk, lim64);
            const A *qr = Qs + r * pk;
            A s[CPL], mx = -INFINITY;
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) {
                const int jj = lane + 32 * cc;
                s[cc] = jj < lim ? cti_attn_dot(qr, Ks + jj * pk, D) * scale : (A)-INFINITY;
                mx = s[cc] > mx ? s[cc] : mx;
            }
            mx = cti_warp_max(mx); /* finite: key 0 of the tile is visible */
            const A mnew = mx > m[rr] ? mx : m[rr];
            const A corr = exp(m[rr] - mnew); /* 0 on the row's first visible tile (m = -inf) */
            A psum = 0;
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) {
                const int jj = lane + 32 * cc;
                const A p = jj < lim ? exp(s[cc] - mnew) : (A)0;
                Ps[r * SPAN + jj] = p;
                psum += p;
            }
            psum = cti_warp_sum(psum);
            l[rr] = l[rr] * (double)corr + (double)psum;
            m[rr] = mnew;
            __syncwarp(); /* the row's probabilities, written by every lane, are read by every lane */
            const A *pr = Ps + r * SPAN;
#pragma unroll
            for (int c = 0; c < NC; c++) acc[rr][c] *= corr;
            for (int j = 0; j < lim; j++) {
                const A p = pr[j];
                const A *vr = Vs + j * pv;
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    const int col = lane + 32 * c;
                    if (col < Dv) acc[rr][c] += p * vr[col];
                }
            }
            __syncwarp(); /* Ps row r is rewritten only after the next __syncthreads, but keep lanes together */
        }
    }

    T *oh = (T *)a.out.p + cti_attn_row(a.out, b, h, 0);
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        if (r >= nq) continue;
        const int64_t i = i0 + r;
        const A inv = l[rr] > 0 ? (A)(1.0 / l[rr]) : (A)0;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int col = lane + 32 * c;
            if (col < Dv) st<T>(oh + i * a.out.st[2] + (int64_t)col * a.out.st[3], acc[rr][c] * inv);
        }
        if (a.lse.p && lane == 0) cti_attn_lse_store(a, b, h, i, l[rr] > 0 ? (double)m[rr] + log(l[rr]) : -INFINITY);
    }
}

template <typename T, int NC>
static ct_status cti_attn_fwd_launch(const cti_attn_args &a, const ct_tensor *out, bool *done)
{
    typedef typename cti_acc<T>::type A;
    constexpr int RPW = cti_attn_geom<A>::RPW, CPL = cti_attn_geom<A>::CPL;
    constexpr int OWN = CTI_ATTN_WARPS * RPW, SPAN = 32 * CPL;
    const int pk = cti_attn_pitch(a.D), pv = cti_attn_pitch(a.Dv);
    const size_t smem = sizeof(A) * ((size_t)OWN * pk + (size_t)SPAN * pk + (size_t)SPAN * pv + (size_t)OWN * SPAN);
    const int dev = out->device.index;
    ct_status st = cti_attn_smem((const void *)cti_attn_fwd_kernel<T, NC>, smem, dev, "attention", done);
    if (st || !*done) return st;
    const int64_t nqb = (a.T + OWN - 1) / OWN, blocks = nqb * a.B * a.H;
    if (blocks > 0x7fffffff) {
        *done = false; /* more tiles than a grid holds: the plain kernels loop instead */
        return CT_OK;
    }
    cti_attn_fwd_kernel<T, NC><<<(unsigned)blocks, CTI_ATTN_THREADS, smem, cti_cu_stream(out)>>>(a, nqb);
    return cti_cuda_launched("attention", out);
}

extern "C" ct_status cti_cuda_attention(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                        double scale, ct_tensor *out, ct_tensor *lse)
{
    ct_status st = cti_cuda_enter(q->device.index, "attention");
    if (st) return st;
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], Dv = v->shape[3];
    if (B * H * T == 0) return CT_OK; /* nothing to write (S = 0 still writes out = 0, lse = -inf) */
    if (D > CTI_ATTN_MAX_DIM || Dv > CTI_ATTN_MAX_DIM) return cti_cuda_attention_ref(q, k, v, causal, scale, out, lse);
    const cti_attn_args a = cti_attn_args_of(q, k, v, out, lse, NULL, NULL, NULL, NULL, causal, scale);
    bool done = false;
    if ((st = cti_attn_fwd_tc(a, out, q->dtype, &done)) || done) return st;
    const bool wide = D > 64 || Dv > 64;
    CTI_CU_DISPATCH_FLOAT(q->dtype, T_, {
        st = wide ? cti_attn_fwd_launch<T_, 4>(a, out, &done) : cti_attn_fwd_launch<T_, 2>(a, out, &done);
    })
    else return ct_error_set(CT_ERR_UNSUPPORTED, "attention: no CUDA kernel for %s", ct_dtype_name(q->dtype));
    if (st || done) return st;
    return cti_cuda_attention_ref(q, k, v, causal, scale, out, lse);
}
