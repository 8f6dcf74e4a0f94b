/* ctrain — CUDA attention backward (the FlashAttention-2 algorithm), deterministic.
 *
 * From dout (B,H,T,Dv), q, k, v, out and the forward's lse (B,H,T):
 *   P_ij  = exp(q_i . k_j * scale - lse_i)       for the keys j row i sees, else 0
 *   D_i   = rowsum(dO_i * O_i)                    (pre-kernel, one warp per row)
 *   dP_ij = dO_i . v_j,   dS_ij = P_ij (dP_ij - D_i)
 *   dV_j  = sum_i P_ij dO_i,   dK_j = scale sum_i dS_ij q_i,   dQ_i = scale sum_j dS_ij k_j
 * dq, dk, dv are overwritten. Two passes, no atomics, so every result is one fixed sum:
 *  - dK/dV kernel: one block per (b, h, tile of OWN keys), its K and V in shared memory
 *    and dK, dV in registers (a warp owns RPW keys, a lane columns l, l+32, ...); it
 *    walks the query tiles that see its keys (from the causal diagonal on), recomputing
 *    P and dS for the tile (SPAN queries) into shared memory.
 *  - dQ kernel: one block per (b, h, tile of OWN queries), dQ in registers; it walks
 *    the key tiles its last row sees, recomputing dS per tile.
 * P and dS are recomputed twice (once per pass): the price of needing no atomics.
 * f32, bf16, f16 compute in f32, f64 in f64; head dims up to 128 (wider: the plain
 * kernels of attention_ref.cu).
 */
#include "kernels/cuda/attention_tile.cuh"

extern __shared__ __align__(16) unsigned char cti_attn_bwd_smem[];

/* drow[(b*H + h)*T + i] = sum_c dO_ic O_ic, summed in double and rounded to A once (as the CPU). */
template <typename T>
__global__ void __launch_bounds__(CTI_ATTN_THREADS) cti_attn_drow_kernel(cti_attn_args a)
{
    typedef typename cti_acc<T>::type A;
    const int lane = threadIdx.x & 31;
    const int64_t rows = a.B * a.H * a.T, warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
        const int64_t bh = row / a.T, i = row % a.T, b = bh / a.H, h = bh % a.H;
        const T *dor = (const T *)a.dout.p + cti_attn_row(a.dout, b, h, i);
        const T *orow = (const T *)a.out.p + cti_attn_row(a.out, b, h, i);
        double acc = 0;
        for (int c = lane; c < a.Dv; c += 32)
            acc += (double)ld<T>(dor + (int64_t)c * a.dout.st[3]) * (double)ld<T>(orow + (int64_t)c * a.out.st[3]);
        acc = cti_warp_sum(acc);
        if (lane == 0) ((A *)a.drow)[row] = (A)acc;
    }
}

/* dK, dV of keys [j0, j0 + OWN) of head (b,h). */
template <typename T, int NC>
__global__ void __launch_bounds__(CTI_ATTN_THREADS) cti_attn_dkdv_kernel(cti_attn_args a, int64_t nkb)
{
    typedef typename cti_acc<T>::type A;
    constexpr int RPW = cti_attn_geom<A>::RPW, CPL = cti_attn_geom<A>::CPL;
    constexpr int OWN = CTI_ATTN_WARPS * RPW, SPAN = 32 * CPL;
    const int D = a.D, Dv = a.Dv, pk = cti_attn_pitch(D), pv = cti_attn_pitch(Dv);
    A *Ks = (A *)cti_attn_bwd_smem; /* OWN x pk: this block's keys */
    A *Vs = Ks + OWN * pk;          /* OWN x pv */
    A *Qs = Vs + OWN * pv;          /* SPAN x pk: the current query tile */
    A *dOs = Qs + SPAN * pk;        /* SPAN x pv */
    A *Ls = dOs + SPAN * pv;        /* SPAN: lse of the query tile */
    A *Drs = Ls + SPAN;             /* SPAN: D_i of the query tile */
    A *Pt = Drs + SPAN;             /* OWN x SPAN: P^T of the tile (a key row per query column) */
    A *dSt = Pt + OWN * SPAN;       /* OWN x SPAN: dS^T */

    /* under the causal mask the first key tiles are seen by the most queries: they go first */
    const int64_t bh = (int64_t)blockIdx.x / nkb, kb = (int64_t)blockIdx.x % nkb;
    const int64_t b = bh / a.H, h = bh % a.H, j0 = kb * OWN;
    const int nk = (int)cti_attn_min(OWN, a.S - j0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const A scale = (A)a.scale;
    const T *qh = (const T *)a.q.p + cti_attn_row(a.q, b, h, 0);
    const T *kh = (const T *)a.k.p + cti_attn_row(a.k, b, h, 0);
    const T *vh = (const T *)a.v.p + cti_attn_row(a.v, b, h, 0);
    const T *doh = (const T *)a.dout.p + cti_attn_row(a.dout, b, h, 0);
    const A *drow = (const A *)a.drow + bh * a.T;

    cti_attn_load_tile<T, A>(Ks, pk, kh, a.k.st[2], a.k.st[3], j0, nk, OWN, D);
    cti_attn_load_tile<T, A>(Vs, pv, vh, a.v.st[2], a.v.st[3], j0, nk, OWN, Dv);

    A dk[RPW][NC], dv[RPW][NC];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++)
#pragma unroll
        for (int c = 0; c < NC; c++) dk[rr][c] = 0, dv[rr][c] = 0;

    /* the first query that sees key j0: i + (S - T) >= j0 */
    int64_t i_first = a.causal ? j0 - (a.S - a.T) : 0;
    if (i_first < 0) i_first = 0;
    for (int64_t i0 = i_first / SPAN * SPAN; i0 < a.T; i0 += SPAN) {
        const int nq = (int)cti_attn_min(SPAN, a.T - i0);
        __syncthreads(); /* every warp is done with the previous query tile (and K, V are loaded) */
        cti_attn_load_tile<T, A>(Qs, pk, qh, a.q.st[2], a.q.st[3], i0, nq, SPAN, D);
        cti_attn_load_tile<T, A>(dOs, pv, doh, a.dout.st[2], a.dout.st[3], i0, nq, SPAN, Dv);
        for (int r = threadIdx.x; r < SPAN; r += blockDim.x) {
            Ls[r] = r < nq ? (A)cti_attn_lse_load(a, b, h, i0 + r) : (A)0;
            Drs[r] = r < nq ? drow[i0 + r] : (A)0;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = warp * RPW + rr;
            if (r >= nk) continue; /* warp-uniform */
            const int64_t j = j0 + r;
            const A *kr = Ks + r * pk, *vr = Vs + r * pv;
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) {
                const int ii = lane + 32 * cc;
                /* row i0 + ii sees key j: kend(i) > j (a row past T sees nothing) */
                const bool vis = ii < nq && cti_attn_kend(a, i0 + ii) > j;
                A p = 0, ds = 0;
                if (vis) {
                    const A s = cti_attn_dot(Qs + ii * pk, kr, D) * scale;
                    const A dp = cti_attn_dot(dOs + ii * pv, vr, Dv);
                    p = exp(s - Ls[ii]);
                    ds = p * (dp - Drs[ii]);
                }
                Pt[r * SPAN + ii] = p;
                dSt[r * SPAN + ii] = ds;
            }
            __syncwarp(); /* row r of P^T and dS^T, written by every lane, is read by every lane */
            const A *pr = Pt + r * SPAN, *dsr = dSt + r * SPAN;
            for (int ii = 0; ii < nq; ii++) {
                const A p = pr[ii], ds = dsr[ii];
                const A *qr = Qs + ii * pk, *dor = dOs + ii * pv;
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    const int col = lane + 32 * c;
                    if (col < Dv) dv[rr][c] += p * dor[col];
                    if (col < D) dk[rr][c] += ds * qr[col];
                }
            }
            __syncwarp();
        }
    }

    /* every key row of the tile is written, zeros for keys no query sees */
    T *dkh = (T *)a.dk.p + cti_attn_row(a.dk, b, h, 0);
    T *dvh = (T *)a.dv.p + cti_attn_row(a.dv, b, h, 0);
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        if (r >= nk) continue;
        const int64_t j = j0 + r;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int col = lane + 32 * c;
            if (col < D) st<T>(dkh + j * a.dk.st[2] + (int64_t)col * a.dk.st[3], dk[rr][c] * scale);
            if (col < Dv) st<T>(dvh + j * a.dv.st[2] + (int64_t)col * a.dv.st[3], dv[rr][c]);
        }
    }
}

/* dQ of queries [i0, i0 + OWN) of head (b,h). */
template <typename T, int NC>
__global__ void __launch_bounds__(CTI_ATTN_THREADS) cti_attn_dq_kernel(cti_attn_args a, int64_t nqb)
{
    typedef typename cti_acc<T>::type A;
    constexpr int RPW = cti_attn_geom<A>::RPW, CPL = cti_attn_geom<A>::CPL;
    constexpr int OWN = CTI_ATTN_WARPS * RPW, SPAN = 32 * CPL;
    const int D = a.D, Dv = a.Dv, pk = cti_attn_pitch(D), pv = cti_attn_pitch(Dv);
    A *Qs = (A *)cti_attn_bwd_smem; /* OWN x pk: this block's queries */
    A *dOs = Qs + OWN * pk;         /* OWN x pv */
    A *Ks = dOs + OWN * pv;         /* SPAN x pk: the current key tile */
    A *Vs = Ks + SPAN * pk;         /* SPAN x pv */
    A *dSs = Vs + SPAN * pv;        /* OWN x SPAN: dS of the tile */

    /* the last query tiles see the most keys under the causal mask: they go first */
    const int64_t bh = (int64_t)blockIdx.x / nqb, qb = nqb - 1 - (int64_t)blockIdx.x % nqb;
    const int64_t b = bh / a.H, h = bh % a.H, i0 = qb * OWN;
    const int nq = (int)cti_attn_min(OWN, a.T - i0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const A scale = (A)a.scale;
    const T *qh = (const T *)a.q.p + cti_attn_row(a.q, b, h, 0);
    const T *kh = (const T *)a.k.p + cti_attn_row(a.k, b, h, 0);
    const T *vh = (const T *)a.v.p + cti_attn_row(a.v, b, h, 0);
    const T *doh = (const T *)a.dout.p + cti_attn_row(a.dout, b, h, 0);
    const A *drow = (const A *)a.drow + bh * a.T;

    cti_attn_load_tile<T, A>(Qs, pk, qh, a.q.st[2], a.q.st[3], i0, nq, OWN, D);
    cti_attn_load_tile<T, A>(dOs, pv, doh, a.dout.st[2], a.dout.st[3], i0, nq, OWN, Dv);

    A dq[RPW][NC], L[RPW], Dr[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        L[rr] = r < nq ? (A)cti_attn_lse_load(a, b, h, i0 + r) : (A)0;
        Dr[rr] = r < nq ? drow[i0 + r] : (A)0;
#pragma unroll
        for (int c = 0; c < NC; c++) dq[rr][c] = 0;
    }

    const int64_t kend_blk = cti_attn_kend(a, i0 + nq - 1);
    for (int64_t j0 = 0; j0 < kend_blk; j0 += SPAN) {
        const int nk = (int)cti_attn_min(SPAN, kend_blk - j0);
        __syncthreads(); /* every warp is done with the previous key tile (and Q, dO are loaded) */
        cti_attn_load_tile<T, A>(Ks, pk, kh, a.k.st[2], a.k.st[3], j0, nk, SPAN, D);
        cti_attn_load_tile<T, A>(Vs, pv, vh, a.v.st[2], a.v.st[3], j0, nk, SPAN, Dv);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = warp * RPW + rr;
            if (r >= nq) continue; /* warp-uniform, like lim */
            const int64_t lim64 = cti_attn_kend(a, i0 + r) - j0;
            if (lim64 <= 0) continue; /* dS = 0 for the whole tile */
            const int lim = (int)cti_attn_min(nk, lim64);
            const A *qr = Qs + r * pk, *dor = dOs + r * pv;
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) {
                const int jj = lane + 32 * cc;
                A ds = 0;
                if (jj < lim) {
                    const A s = cti_attn_dot(qr, Ks + jj * pk, D) * scale;
                    const A dp = cti_attn_dot(dor, Vs + jj * pv, Dv);
                    ds = exp(s - L[rr]) * (dp - Dr[rr]);
                }
                dSs[r * SPAN + jj] = ds;
            }
            __syncwarp(); /* row r of dS, written by every lane, is read by every lane */
            const A *dsr = dSs + r * SPAN;
            for (int jj = 0; jj < lim; jj++) {
                const A ds = dsr[jj];
                const A *kr = Ks + jj * pk;
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    const int col = lane + 32 * c;
                    if (col < D) dq[rr][c] += ds * kr[col];
                }
            }
            __syncwarp();
        }
    }

    T *dqh = (T *)a.dq.p + cti_attn_row(a.dq, b, h, 0);
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        if (r >= nq) continue;
        const int64_t i = i0 + r;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int col = lane + 32 * c;
            if (col < D) st<T>(dqh + i * a.dq.st[2] + (int64_t)col * a.dq.st[3], dq[rr][c] * scale);
        }
    }
}

template <typename T, int NC>
static ct_status cti_attn_bwd_launch(cti_attn_args a, const ct_tensor *dq, const ct_tensor *dk, bool *done)
{
    typedef typename cti_acc<T>::type A;
    constexpr int RPW = cti_attn_geom<A>::RPW, CPL = cti_attn_geom<A>::CPL;
    constexpr int OWN = CTI_ATTN_WARPS * RPW, SPAN = 32 * CPL;
    const int pk = cti_attn_pitch(a.D), pv = cti_attn_pitch(a.Dv);
    const int dev = dq->device.index;
    const size_t tiles = (size_t)OWN * pk + (size_t)OWN * pv + (size_t)SPAN * pk + (size_t)SPAN * pv;
    const size_t smem_kv = sizeof(A) * (tiles + 2 * (size_t)SPAN + 2 * (size_t)OWN * SPAN);
    const size_t smem_q = sizeof(A) * (tiles + (size_t)OWN * SPAN);
    bool fits_kv = false, fits_q = false;
    ct_status st;
    if ((st = cti_attn_smem((const void *)cti_attn_dkdv_kernel<T, NC>, smem_kv, dev, "attention_backward", &fits_kv)) ||
        (st = cti_attn_smem((const void *)cti_attn_dq_kernel<T, NC>, smem_q, dev, "attention_backward", &fits_q)))
        return st;
    const int64_t heads = a.B * a.H, nkb = (a.S + OWN - 1) / OWN, nqb = (a.T + OWN - 1) / OWN;
    *done = fits_kv && fits_q && heads * nkb <= 0x7fffffff && heads * nqb <= 0x7fffffff;
    if (!*done) return CT_OK; /* the plain kernels instead */

    /* D_i = rowsum(dO * O), one value per (b,h,t) row */
    const int64_t rows = heads * a.T;
    const int64_t shape[1] = {rows > 0 ? rows : 1};
    ct_tensor *drow = ct_tensor_empty_on(dq->device, sizeof(A) == 8 ? CT_DTYPE_F64 : CT_DTYPE_F32, 1, shape);
    if (!drow) return ct_last_status();
    a.drow = ct_tensor_data(drow);
    cudaStream_t s = cti_cu_stream(dq);
    const int warps_per_block = CTI_ATTN_THREADS / 32;
    cti_attn_drow_kernel<T><<<cti_cu_blocks(rows, warps_per_block), CTI_ATTN_THREADS, 0, s>>>(a);
    if ((st = cti_cuda_launched("attention_backward", dq))) return st;
    if (heads * nkb > 0) {
        cti_attn_dkdv_kernel<T, NC><<<(unsigned)(heads * nkb), CTI_ATTN_THREADS, smem_kv, s>>>(a, nkb);
        if ((st = cti_cuda_launched("attention_backward", dk))) return st;
    }
    if (heads * nqb > 0) {
        cti_attn_dq_kernel<T, NC><<<(unsigned)(heads * nqb), CTI_ATTN_THREADS, smem_q, s>>>(a, nqb);
        if ((st = cti_cuda_launched("attention_backward", dq))) return st;
    }
    return CT_OK;
}

extern "C" ct_status cti_cuda_attention_backward(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                                 const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                                 bool causal, double scale, ct_tensor *dq, ct_tensor *dk,
                                                 ct_tensor *dv)
{
    ct_status st = cti_cuda_enter(q->device.index, "attention_backward");
    if (st) return st;
    const int64_t D = q->shape[3], Dv = v->shape[3];
    if (D > CTI_ATTN_MAX_DIM || Dv > CTI_ATTN_MAX_DIM)
        return cti_cuda_attention_backward_ref(dout, q, k, v, out, lse, causal, scale, dq, dk, dv);
    cti_attn_args a = cti_attn_args_of(q, k, v, out, lse, dout, dq, dk, dv, causal, scale);
    const bool wide = D > 64 || Dv > 64;
    bool done = false;
    CTI_CU_DISPATCH_FLOAT(q->dtype, T_, {
        st = wide ? cti_attn_bwd_launch<T_, 4>(a, dq, dk, &done) : cti_attn_bwd_launch<T_, 2>(a, dq, dk, &done);
    })
    else return ct_error_set(CT_ERR_UNSUPPORTED, "attention_backward: no CUDA kernel for %s", ct_dtype_name(q->dtype));
    if (st || done) return st;
    return cti_cuda_attention_backward_ref(dout, q, k, v, out, lse, causal, scale, dq, dk, dv);
}
