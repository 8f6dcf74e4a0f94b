/* ctrain — CPU attention: blockwise (flash-attention style) forward and backward,
 * and the plain double references the tests compare them against.
 *
 * Tiles. A head is cut into query blocks of BQ rows and key blocks of BK rows.
 * Each tile product is one call of a small register-blocked gemm (4 rows x NR
 * columns of accumulators) on packed, zero-padded copies of the tile's rows, so
 * the packing step also absorbs strides (transposed (B,T,H,D) views) and dtype
 * conversion (bf16/f16 -> f32). Nothing of size T x S is ever allocated.
 *
 * This file includes itself: the part under `#else` below is a template compiled
 * twice, with real = float (f32, bf16, f16 inputs) and real = double (f64 inputs),
 * so the tile code exists once. The outer part holds the shared helpers, the
 * references and the public entry points.
 */
#include "kernels/cpu/attention.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/convert.h"
#include "core/threads_internal.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/vmath.h"

#if defined(__FMA__) || defined(__AVX__)
#include <immintrin.h>
#endif

#ifndef CT_ATTN_REAL

#define BQ CT_ATTN_BLOCK_Q
#define BK CT_ATTN_BLOCK_K
#define MR 4 /* rows of the gemm micro-tile; its columns NR are two SIMD registers */
#ifdef __AVX__
#define CT_ATTN_VBYTES 32
#else
#define CT_ATTN_VBYTES 16
#endif
#define PAR_MIN_WORK 32768

/* Element counts of the two workspaces (each slice padded to 16 elements so every
 * slice of a 64-byte aligned block stays 32-byte aligned for doubles, 64 for floats).
 * Forward: a query block, the head's keys transposed (D, Sp) and values (Sp, Dvp),
 * packed once per head (or once per task), a score tile and the output block. */
static int64_t attn_fwd_ws_elems(int64_t S, int64_t D, int64_t Dv, int64_t nr)
{
    int64_t Dvp = round_up(Dv, nr), Sp = round_up(S, nr);
    return round_up(BQ * D, 16) + round_up(D * Sp, 16) + round_up(Sp * Dvp, 16) + round_up(BQ * BK, 16) +
           round_up(BQ * Dvp, 16);
}

/* head_rows: rows of the per-head buffers (dQ accumulator, and Q, dO, lse packed once
 * per head) in mode "heads"; 0 in mode "blocks", where dQ holds one query block. */
static int64_t attn_bwd_ws_elems(int64_t head_rows, int64_t D, int64_t Dv, int64_t nr)
{
    int64_t Dp = round_up(D, nr), Dvp = round_up(Dv, nr), hr = round_up(head_rows, MR);
    int64_t dq_rows = head_rows ? hr : round_up(BQ, MR);
    return round_up(BQ * Dp, 16) + round_up(BQ * Dvp, 16) + round_up(D * BK, 16) + round_up(BK * Dp, 16) +
           round_up(Dv * BK, 16) + 2 * round_up(BQ * BK, 16) + round_up(BK * Dp, 16) + round_up(BK * Dvp, 16) +
           2 * round_up(BQ, 16) + round_up(hr * Dp, 16) + round_up(hr * Dvp, 16) + round_up(hr, 16) +
           round_up(dq_rows * Dp, 16);
}

/* Backward scheduling. Mode "heads": one task per head does every tile of it, key
 * blocks outer (dK, dV of a block finished in one go, dQ of the head accumulated in
 * the workspace): no recomputation, but only B*H tasks. Mode "blocks": one pass over
 * (head, key block) for dK, dV and one over (head, query block) for dQ: B*H*T/64
 * tasks, at the price of recomputing P and dP once more (7 tile products instead of 5).
 * Both run the same tiles in the same order for every accumulator, so they give the
 * same bits: the choice only balances the threads. */
static bool attn_bwd_by_heads(int64_t heads, int nt) { return nt <= 1 || heads % nt == 0 || heads >= 4 * nt; }

#define CT_ATTN_CAT_(a, b) a##b
#define CT_ATTN_CAT(a, b) CT_ATTN_CAT_(a, b)

#define CT_ATTN_REAL float
#define CT_ATTN_DTYPE CT_DTYPE_F32
#define CT_ATTN_SFX _f32
#define CT_ATTN_MM_FMADD _mm256_fmadd_ps
#define CT_ATTN_EXP expf
#define CT_ATTN_INT int32_t
#define CT_ATTN_VEXP 1
#define NR (2 * CT_ATTN_VBYTES / 4)
#include "kernels/cpu/attention.c"
#undef CT_ATTN_REAL
#undef CT_ATTN_DTYPE
#undef CT_ATTN_SFX
#undef CT_ATTN_MM_FMADD
#undef CT_ATTN_EXP
#undef CT_ATTN_INT
#undef CT_ATTN_VEXP
#undef NR

float cti_cpu_attn_fwd_row_f32(float *s, int64_t lim, int64_t n, float scale, float *m, double *l)
{
    return attn_fwd_row_f32(s, lim, n, scale, m, l);
}

void cti_cpu_attn_bwd_row_f32(float *p, float *ds, int64_t lim, int64_t n, float scale, float lse, float drow)
{
    attn_bwd_row_f32(p, ds, lim, n, scale, lse, drow);
}

#define CT_ATTN_REAL double
#define CT_ATTN_DTYPE CT_DTYPE_F64
#define CT_ATTN_SFX _f64
#define CT_ATTN_MM_FMADD _mm256_fmadd_pd
#define CT_ATTN_EXP exp
#define CT_ATTN_INT int64_t
#define CT_ATTN_VEXP 0 /* f64 is for gradchecks: libm's exp, no speed needed */
#define NR (2 * CT_ATTN_VBYTES / 8)
#include "kernels/cpu/attention.c"

/* ---- public entry points ---------------------------------------------------- */

ct_status cti_cpu_attention(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                            double scale, ct_tensor *out, ct_tensor *lse)
{
    cti_threads_sync();
    ct_status st;
    if (cti_cpu_attention_bf16_takes(q, k, v, NULL, NULL, &st)) return cti_cpu_attention_bf16(q, k, v, causal, scale, out, lse);
    if (st) return st;
    attn_dims dm = attn_dims_of(q, k, v, causal, scale);
    attn_op oq = attn_op_of(q), ok = attn_op_of(k), ov = attn_op_of(v), oo = attn_op_of(out);
    attn_op ol = lse ? attn_op_of(lse) : (attn_op){0};
    if (q->dtype == CT_DTYPE_F64) return attn_forward_f64(&dm, &oq, &ok, &ov, &oo, lse ? &ol : NULL);
    return attn_forward_f32(&dm, &oq, &ok, &ov, &oo, lse ? &ol : NULL);
}

ct_status cti_cpu_attention_backward(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                     const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                     bool causal, double scale, ct_tensor *dq, ct_tensor *dk, ct_tensor *dv)
{
    cti_threads_sync();
    ct_status st;
    if (cti_cpu_attention_bf16_takes(q, k, v, dout, out, &st))
        return cti_cpu_attention_backward_bf16(dout, q, k, v, out, lse, causal, scale, dq, dk, dv);
    if (st) return st;
    attn_dims dm = attn_dims_of(q, k, v, causal, scale);
    attn_op o[9] = {attn_op_of(dout), attn_op_of(q), attn_op_of(k), attn_op_of(v), attn_op_of(out),
                    attn_op_of(lse),  attn_op_of(dq), attn_op_of(dk), attn_op_of(dv)};
    if (q->dtype == CT_DTYPE_F64) return attn_backward_f64(&dm, o);
    return attn_backward_f32(&dm, o);
}

size_t cti_cpu_attention_workspace_bytes(int64_t T, int64_t S, int64_t D, int64_t Dv, size_t elem_size)
{
    int64_t nr = 2 * CT_ATTN_VBYTES / (elem_size >= 8 ? 8 : 4);
    int64_t fwd = attn_fwd_ws_elems(S, D, Dv, nr), bwd = attn_bwd_ws_elems(T, D, Dv, nr);
    return (size_t)round_up(max64(fwd, bwd) * (int64_t)elem_size, 64);
}

/* ---- references: the whole score matrix of a head, in double ------------------ */

/* P (T,S) = softmax of the visible scores of head (b,h); the row lse into lse_row.
 * The causal rule is written out here rather than taken from attn_kend, so the
 * reference does not share the fast kernel's masking. */
static void attn_ref_probs(const attn_dims *dm, const attn_op *q, const attn_op *k, int64_t b, int64_t h,
                           double *P, double *lse_row)
{
    for (int64_t i = 0; i < dm->T; i++) {
        double *p = P + i * dm->S, mx = -INFINITY;
        const char *qr = attn_row(q, b, h, i);
        for (int64_t j = 0; j < dm->S; j++) {
            p[j] = -INFINITY;
            if (dm->causal && j > i + (dm->S - dm->T)) continue;
            const char *kr = attn_row(k, b, h, j);
            double s = 0;
            for (int64_t d = 0; d < dm->D; d++) s += attn_load(q->dt, qr, d * q->st[3]) * attn_load(k->dt, kr, d * k->st[3]);
            p[j] = s * dm->scale;
            if (p[j] > mx) mx = p[j];
        }
        double sum = 0;
        for (int64_t j = 0; j < dm->S && mx > -INFINITY; j++) sum += exp(p[j] - mx);
        for (int64_t j = 0; j < dm->S; j++) p[j] = mx > -INFINITY ? exp(p[j] - mx) / sum : 0;
        lse_row[i] = mx > -INFINITY ? mx + log(sum) : -INFINITY;
    }
}

ct_status cti_cpu_attention_ref(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                double scale, ct_tensor *out, ct_tensor *lse)
{
    attn_dims dm = attn_dims_of(q, k, v, causal, scale);
    attn_op oq = attn_op_of(q), ok = attn_op_of(k), ov = attn_op_of(v), oo = attn_op_of(out);
    attn_op ol = lse ? attn_op_of(lse) : (attn_op){0};
    double *P = malloc((size_t)max64(1, dm.T * dm.S) * sizeof(double));
    double *lr = malloc((size_t)max64(1, dm.T) * sizeof(double));
    if (!P || !lr) {
        free(P), free(lr);
        return ct_error_set(CT_ERR_NOMEM, "attention_ref: out of memory for a %lld x %lld score matrix",
                            (long long)dm.T, (long long)dm.S);
    }
    for (int64_t b = 0; b < dm.B; b++)
        for (int64_t h = 0; h < dm.H; h++) {
            attn_ref_probs(&dm, &oq, &ok, b, h, P, lr);
            for (int64_t i = 0; i < dm.T; i++) {
                char *orow = (char *)attn_row(&oo, b, h, i);
                for (int64_t c = 0; c < dm.Dv; c++) {
                    double acc = 0;
                    for (int64_t j = 0; j < dm.S; j++)
                        acc += P[i * dm.S + j] * attn_load(ov.dt, attn_row(&ov, b, h, j), c * ov.st[3]);
                    attn_store(oo.dt, orow, c * oo.st[3], acc);
                }
                if (lse) attn_store(ol.dt, (char *)attn_row(&ol, b, h, i), 0, lr[i]);
            }
        }
    free(P), free(lr);
    return CT_OK;
}

/* Ignores out and lse: P is recomputed by attn_ref_probs and rowsum(dO * O) is taken
 * in its other form, sum_j P_ij dP_ij, so the reference checks the fast kernel's
 * use of the saved tensors instead of sharing it. */
ct_status cti_cpu_attention_backward_ref(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                         const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                         bool causal, double scale, ct_tensor *dq, ct_tensor *dk,
                                         ct_tensor *dv)
{
    (void)out, (void)lse;
    attn_dims dm = attn_dims_of(q, k, v, causal, scale);
    attn_op odo = attn_op_of(dout), oq = attn_op_of(q), ok = attn_op_of(k), ov = attn_op_of(v);
    attn_op odq = attn_op_of(dq), odk = attn_op_of(dk), odv = attn_op_of(dv);
    const int64_t T = dm.T, S = dm.S, D = dm.D, Dv = dm.Dv;
    double *P = malloc((size_t)max64(1, T * S) * sizeof(double));
    double *dS = malloc((size_t)max64(1, T * S) * sizeof(double));
    double *lr = malloc((size_t)max64(1, T) * sizeof(double));
    if (!P || !dS || !lr) {
        free(P), free(dS), free(lr);
        return ct_error_set(CT_ERR_NOMEM, "attention_backward_ref: out of memory for a %lld x %lld score matrix",
                            (long long)T, (long long)S);
    }
#define LD(o, b, h, t, d) attn_load((o).dt, attn_row(&(o), b, h, t), (d) * (o).st[3])
    for (int64_t b = 0; b < dm.B; b++)
        for (int64_t h = 0; h < dm.H; h++) {
            attn_ref_probs(&dm, &oq, &ok, b, h, P, lr);
            for (int64_t i = 0; i < T; i++) {
                double rowsum = 0;
                for (int64_t j = 0; j < S; j++) {
                    double dp = 0;
                    for (int64_t c = 0; c < Dv; c++) dp += LD(odo, b, h, i, c) * LD(ov, b, h, j, c);
                    dS[i * S + j] = dp;
                    rowsum += P[i * S + j] * dp;
                }
                for (int64_t j = 0; j < S; j++) dS[i * S + j] = P[i * S + j] * (dS[i * S + j] - rowsum);
            }
            for (int64_t i = 0; i < T; i++)
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < S; j++) acc += dS[i * S + j] * LD(ok, b, h, j, d);
                    attn_store(odq.dt, (char *)attn_row(&odq, b, h, i), d * odq.st[3], acc * dm.scale);
                }
            for (int64_t j = 0; j < S; j++) {
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t i = 0; i < T; i++) acc += dS[i * S + j] * LD(oq, b, h, i, d);
                    attn_store(odk.dt, (char *)attn_row(&odk, b, h, j), d * odk.st[3], acc * dm.scale);
                }
                for (int64_t c = 0; c < Dv; c++) {
                    double acc = 0;
                    for (int64_t i = 0; i < T; i++) acc += P[i * S + j] * LD(odo, b, h, i, c);
                    attn_store(odv.dt, (char *)attn_row(&odv, b, h, j), c * odv.st[3], acc);
                }
            }
        }
#undef LD
    free(P), free(dS), free(lr);
    return CT_OK;
}

#else /* ---- template: real = CT_ATTN_REAL, NR columns per micro-tile ---- */

#define real CT_ATTN_REAL
#define FN(name) CT_ATTN_CAT(name, CT_ATTN_SFX)

/* One SIMD register of reals (GCC/Clang vector extension) and a*b + c on it, fused
 * where the target has FMA (ISO C mode never contracts a*b + c by itself). */
typedef real FN(vec) __attribute__((vector_size(CT_ATTN_VBYTES)));
#define VEC FN(vec)
#define W ((int)(CT_ATTN_VBYTES / sizeof(real)))
#ifdef __FMA__
#define VFMA(a, b, c) ((VEC)CT_ATTN_MM_FMADD((a), (b), (c)))
#else
#define VFMA(a, b, c) ((a) * (b) + (c))
#endif
#define EXP(x) CT_ATTN_EXP(x)
/* GCC otherwise re-reads B from memory in each of the MR FMAs that use it, which makes
 * the micro-kernel load-bound (measured on a 64^3 tile on Zen 3: 45 GFLOP/s; 63 with B
 * kept in registers; 77 with the K loop also unrolled by 4). */
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define CT_ATTN_IN_REGISTERS(a, b) __asm__("" : "+x"(a), "+x"(b))
#else
#define CT_ATTN_IN_REGISTERS(a, b) ((void)0)
#endif
typedef CT_ATTN_INT FN(ivec) __attribute__((vector_size(CT_ATTN_VBYTES)));
#define IVEC FN(ivec)
/* lanes of a where mask m is set, else of b */
#define VSEL(m, a, b) ((VEC)(((IVEC)(a) & (m)) | ((IVEC)(b) & ~(m))))

static inline VEC FN(attn_vload)(const real *p)
{
    VEC v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Largest of s[0..n), n >= 1. */
static real FN(attn_rowmax)(const real *s, int64_t n)
{
    real mx = -INFINITY;
    int64_t c = 0;
    if (n >= W) {
        VEC m = FN(attn_vload)(s);
        for (c = W; c + W <= n; c += W) {
            const VEC v = FN(attn_vload)(s + c);
            m = VSEL(v > m, v, m);
        }
        for (int i = 0; i < W; i++) mx = m[i] > mx ? m[i] : mx;
    }
    for (; c < n; c++) mx = s[c] > mx ? s[c] : mx;
    return mx;
}

/* x[c] = exp(x[c] * scale - shift) for c < n, in place. */
static void FN(attn_exp_row)(real *x, int64_t n, real scale, real shift)
{
#if CT_ATTN_VEXP
    /* kernels/cpu/vmath.h's exp: the loop vectorises, and its vector body and scalar
     * tail give the same bits, so a value never depends on its column */
    for (int64_t c = 0; c < n; c++) x[c] = cti_cpu_expf(x[c] * scale - shift);
#else
    for (int64_t c = 0; c < n; c++) x[c] = EXP(x[c] * scale - shift);
#endif
}

/* sum of x[0..n) in double, in a fixed order: two registers of partial sums (one per
 * half of a register of reals), then the tail. */
static double FN(attn_row_sum)(const real *x, int64_t n)
{
    typedef real half __attribute__((vector_size(CT_ATTN_VBYTES / 2)));
    typedef double dvec __attribute__((vector_size(sizeof(double) * (CT_ATTN_VBYTES / 2 / sizeof(real)))));
    dvec part0 = (dvec){0}, part1 = (dvec){0};
    int64_t c = 0;
    for (; c + W <= n; c += W) {
        half lo, hi;
        memcpy(&lo, x + c, sizeof lo);
        memcpy(&hi, x + c + W / 2, sizeof hi);
        part0 += __builtin_convertvector(lo, dvec);
        part1 += __builtin_convertvector(hi, dvec);
    }
    part0 += part1;
    double sum = 0;
    for (int i = 0; i < W / 2; i++) sum += part0[i];
    for (; c < n; c++) sum += x[c];
    return sum;
}

/* Rows [m0, m0+mr) x columns [n0, n0+2W) of C = [C +] A B: an mr x 2W accumulator
 * block (2*mr registers) that stays in registers over the K loop. mr is a constant at
 * every call, so the loops over it unroll. */
static inline __attribute__((always_inline)) void FN(attn_gemm_block)(
    int mr, int64_t m0, int64_t n0, int64_t K, const real *A, int64_t ars, int64_t acs, const real *B, int64_t ldb,
    real *C, int64_t ldc, bool accumulate)
{
    VEC c0[6], c1[6];
    for (int r = 0; r < mr; r++) {
        c0[r] = c1[r] = (VEC){0};
        if (accumulate) {
            memcpy(&c0[r], C + (m0 + r) * ldc + n0, sizeof(VEC));
            memcpy(&c1[r], C + (m0 + r) * ldc + n0 + W, sizeof(VEC));
        }
    }
    const real *a = A + m0 * ars, *b = B + n0;
#pragma GCC unroll 4
    for (int64_t kk = 0; kk < K; kk++, b += ldb) {
        VEC b0 = FN(attn_vload)(b), b1 = FN(attn_vload)(b + W);
        CT_ATTN_IN_REGISTERS(b0, b1);
        for (int r = 0; r < mr; r++) {
            /* x - (+0) == x for every x (unlike x + 0), so this folds to a broadcast */
            const VEC ar = a[r * ars + kk * acs] - (VEC){0};
            c0[r] = VFMA(ar, b0, c0[r]);
            c1[r] = VFMA(ar, b1, c1[r]);
        }
    }
    for (int r = 0; r < mr; r++) {
        memcpy(C + (m0 + r) * ldc + n0, &c0[r], sizeof(VEC));
        memcpy(C + (m0 + r) * ldc + n0 + W, &c1[r], sizeof(VEC));
    }
}

/* C (M,N) = [C +] A (M,K) B (K,N); A(m,k) = A[m*ars + k*acs] (either layout, so A^T costs
 * nothing), B rows ldb apart, C rows ldc apart. M % MR == 0 and N % NR == 0: callers pad.
 * Row blocks of 6 (12 accumulators + 2 of B + 1 broadcast: 15 of the 16 AVX registers),
 * then one of 4 or 2 for the rest: measured on Zen 3, 6 rows beat 4 by about 15% on
 * this kernel. Every element is the same K-loop whichever block it falls in. */
static void FN(attn_gemm)(int64_t M, int64_t N, int64_t K, const real *A, int64_t ars, int64_t acs,
                          const real *B, int64_t ldb, real *C, int64_t ldc, bool accumulate)
{
    const int64_t M6 = M / 6 * 6;
    for (int64_t n0 = 0; n0 < N; n0 += NR) {
        for (int64_t m0 = 0; m0 < M6; m0 += 6)
            FN(attn_gemm_block)(6, m0, n0, K, A, ars, acs, B, ldb, C, ldc, accumulate);
        if (M - M6 == 4) FN(attn_gemm_block)(4, M6, n0, K, A, ars, acs, B, ldb, C, ldc, accumulate);
        if (M - M6 == 2) FN(attn_gemm_block)(2, M6, n0, K, A, ars, acs, B, ldb, C, ldc, accumulate);
    }
}

/* dst (rows_pad, ld) <- rows [t0, t0+n) x cols [0, ncols) of head (b,h), zero-padded. */
static void FN(attn_pack_rows)(const attn_op *o, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t ncols,
                               real *dst, int64_t ld, int64_t rows_pad)
{
    for (int64_t r = 0; r < rows_pad; r++) {
        real *d = dst + r * ld;
        int64_t c = 0;
        if (r < n) {
            const char *src = attn_row(o, b, h, t0 + r);
            if (o->dt == CT_ATTN_DTYPE && o->st[3] == 1) {
                memcpy(d, src, (size_t)ncols * sizeof(real));
                c = ncols;
            } else if (sizeof(real) == 4 && o->st[3] == 1 && (o->dt == CT_DTYPE_BF16 || o->dt == CT_DTYPE_F16)) {
                /* a 16-bit row widens exactly: the library's vector conversion */
                (void)ct_convert_n(CT_DTYPE_F32, d, o->dt, src, ncols, false);
                c = ncols;
            } else {
                for (; c < ncols; c++) d[c] = (real)attn_load(o->dt, src, c * o->st[3]);
            }
        }
        for (; c < ld; c++) d[c] = 0;
    }
}

/* dst (ncols, ld) <- the transpose of rows [t0, t0+n) of head (b,h), columns n.. zeroed. */
static void FN(attn_pack_cols)(const attn_op *o, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t ncols,
                               real *dst, int64_t ld)
{
    int64_t r = 0;
#if defined(__AVX__)
    /* f32 rows with unit stride: 8 x 8 blocks transposed in registers, four times
     * the scalar loop's speed; the scalar loop does the edges.
     * 16-bit rows are widened 8 at a time into wide[] first (exact). */
    bool half = (o->dt == CT_DTYPE_BF16 || o->dt == CT_DTYPE_F16) && ncols <= 256;
    if (sizeof(real) == 4 && (o->dt == CT_DTYPE_F32 || half) && o->st[3] == 1 && ncols % 8 == 0) {
        float wide[8 * 256];
        for (; r + 8 <= n; r += 8) {
            const float *src[8];
            for (int i = 0; i < 8; i++) {
                src[i] = (const float *)attn_row(o, b, h, t0 + r + i);
                if (half) {
                    (void)ct_convert_n(CT_DTYPE_F32, wide + i * ncols, o->dt, src[i], ncols, false);
                    src[i] = wide + i * ncols;
                }
            }
            for (int64_t c = 0; c < ncols; c += 8) {
                const float *blk[8];
                for (int i = 0; i < 8; i++) blk[i] = src[i] + c;
                attn_transpose8x8(blk, (float *)dst + c * ld + r, ld);
            }
        }
    }
#endif
    for (; r < n; r++) {
        const char *src = attn_row(o, b, h, t0 + r);
        if (o->dt == CT_ATTN_DTYPE) {
            const real *s = (const real *)src;
            for (int64_t c = 0; c < ncols; c++) dst[c * ld + r] = s[c * o->st[3]];
        } else {
            for (int64_t c = 0; c < ncols; c++) dst[c * ld + r] = (real)attn_load(o->dt, src, c * o->st[3]);
        }
    }
    for (int64_t c = 0; c < ncols; c++)
        for (int64_t r = n; r < ld; r++) dst[c * ld + r] = 0;
}

/* One score row of a key block into the online softmax (see cti_cpu_attn_fwd_row_f32 in
 * kernels/cpu/attention_internal.h): returns the factor for the row's output. A row
 * that sees none of the block (lim <= 0) gets P = 0 and factor 1. */
static real FN(attn_fwd_row)(real *s, int64_t lim, int64_t n, real scale, real *m, double *l)
{
    if (lim <= 0) {
        memset(s, 0, (size_t)n * sizeof(real));
        return 1;
    }
    const real mx = FN(attn_rowmax)(s, lim) * scale; /* scale > 0 keeps the argmax */
    const real mnew = mx > *m ? mx : *m;
    const real corr = EXP(*m - mnew); /* 0 on the first visible block (m = -inf) */
    FN(attn_exp_row)(s, lim, scale, mnew);
    const double sum = FN(attn_row_sum)(s, lim);
    for (int64_t c = lim; c < n; c++) s[c] = 0;
    *l = *l * corr + sum;
    *m = mnew;
    return corr;
}

/* p = exp(S*scale - lse) and dS = P * (dP - rowsum(dO*O)) * scale over keys [0, lim)
 * of one row; both 0 in [lim, n). */
static void FN(attn_bwd_row)(real *p, real *ds, int64_t lim, int64_t n, real scale, real lse, real drow)
{
    lim = max64(0, lim);
    FN(attn_exp_row)(p, lim, scale, lse);
    for (int64_t c = 0; c < lim; c++) ds[c] = p[c] * (ds[c] - drow) * scale;
    for (int64_t c = lim; c < n; c++) p[c] = 0, ds[c] = 0;
}

/* rows [t0, t0+n) of head (b,h) <- src (n, ld), first ncols columns. */
static void FN(attn_store_rows)(const attn_op *o, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t ncols,
                                const real *src, int64_t ld)
{
    for (int64_t r = 0; r < n; r++) {
        char *dst = (char *)attn_row(o, b, h, t0 + r);
        if (o->dt == CT_ATTN_DTYPE && o->st[3] == 1)
            memcpy(dst, src + r * ld, (size_t)ncols * sizeof(real));
        else if (sizeof(real) == 4 && o->st[3] == 1 && (o->dt == CT_DTYPE_BF16 || o->dt == CT_DTYPE_F16))
            /* rounding the f32 once is what attn_store does through f64 (a float is exact there) */
            (void)ct_convert_n(o->dt, dst, CT_DTYPE_F32, src + r * ld, ncols, false);
        else
            for (int64_t c = 0; c < ncols; c++) attn_store(o->dt, dst, c * o->st[3], src[r * ld + c]);
    }
}

/* One query block [i0, i0+nq) of head (b,h) -> its out rows and lse.
 * Online softmax over the key blocks: after each block, row r holds m (max scaled
 * score so far), l (sum of exp(score - m), in double) and O = sum exp(score - m) v;
 * a new block with a larger max rescales l and O by exp(m_old - m_new). */
/* Workspace of one forward thread; Kt (D, Sp) and V (Sp, Dvp) hold the first
 * `packed` keys of head (pb, ph), so consecutive query blocks of a head pack once. */
typedef struct FN(attn_fws) {
    real *Qi, *Kt, *V, *Sc, *O;
    int64_t Sp, pb, ph, packed;
} FN(attn_fws);

static FN(attn_fws) FN(attn_fws_carve)(real *ws, int64_t S, int64_t D, int64_t Dv)
{
    const int64_t Dvp = round_up(Dv, NR), Sp = round_up(S, NR);
    FN(attn_fws) w = {.Sp = Sp, .pb = -1, .ph = -1, .packed = 0};
    w.Qi = ws, ws += round_up(BQ * D, 16);
    w.Kt = ws, ws += round_up(D * Sp, 16);
    w.V = ws, ws += round_up(Sp * Dvp, 16);
    w.Sc = ws, ws += round_up(BQ * BK, 16);
    w.O = ws;
    return w;
}

/* Makes keys [0, n) of head (b,h) present in w: K^T columns zero-padded to a
 * multiple of NR (the tile gemm reads NR columns at a time). */
static void FN(attn_fwd_pack_kv)(const attn_dims *dm, const attn_op *k, const attn_op *v, int64_t b, int64_t h,
                                 int64_t n, FN(attn_fws) *w)
{
    if (w->pb == b && w->ph == h && w->packed >= n) return;
    FN(attn_pack_cols)(k, b, h, 0, n, dm->D, w->Kt, w->Sp);
    FN(attn_pack_rows)(v, b, h, 0, n, dm->Dv, w->V, round_up(dm->Dv, NR), n);
    w->pb = b, w->ph = h, w->packed = n;
}

static void FN(attn_fwd_block)(const attn_dims *dm, const attn_op *q, const attn_op *k, const attn_op *v,
                               const attn_op *out, const attn_op *lse, int64_t b, int64_t h, int64_t i0,
                               FN(attn_fws) *w)
{
    const int64_t D = dm->D, Dv = dm->Dv, Dvp = round_up(Dv, NR), Sp = w->Sp;
    const int64_t nq = min64(BQ, dm->T - i0), nqp = round_up(nq, MR);
    const real scale = (real)dm->scale;
    real *Qi = w->Qi, *Sc = w->Sc, *O = w->O;
    real m[BQ];
    double l[BQ];

    FN(attn_pack_rows)(q, b, h, i0, nq, D, Qi, D, nqp);
    memset(O, 0, (size_t)(nqp * Dvp) * sizeof(real));
    for (int64_t r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;

    const int64_t kend_blk = attn_kend(dm, i0 + nq - 1); /* the block's last row sees the most keys */
    /* every key the head's last query sees, so the head's other blocks reuse them */
    FN(attn_fwd_pack_kv)(dm, k, v, b, h, attn_kend(dm, dm->T - 1), w);
    for (int64_t j0 = 0; j0 < kend_blk; j0 += BK) {
        const int64_t nk = min64(BK, kend_blk - j0), nkp = round_up(nk, NR);
        const real *V = w->V + j0 * Dvp;
        int64_t k1 = 0;
        const int64_t h = attn_tile_split(dm, i0, nq, nqp, j0, nk, NR, &k1);
        /* score columns [nk, nkp) may see later keys' K, and rows [0, h) columns
         * [k1, nkp) are not computed: the row loop below never reads them */
        if (h) {
            FN(attn_gemm)(h, k1, D, Qi, D, 1, w->Kt + j0, Sp, Sc, nkp, false);
            FN(attn_gemm)(nqp - h, nkp, D, Qi + h * D, D, 1, w->Kt + j0, Sp, Sc + h * nkp, nkp, false);
        } else {
            FN(attn_gemm)(nqp, nkp, D, Qi, D, 1, w->Kt + j0, Sp, Sc, nkp, false);
        }
        for (int64_t r = 0; r < nq; r++) {
            const real corr = FN(attn_fwd_row)(Sc + r * nkp, min64(nk, attn_kend(dm, i0 + r) - j0), nk, scale,
                                               &m[r], &l[r]);
            if (corr != 1)
                for (int64_t c = 0; c < Dvp; c++) O[r * Dvp + c] *= corr;
        }
        if (h) { /* rows [0, h) have P = 0 past key k1 */
            FN(attn_gemm)(h, Dvp, min64(k1, nk), Sc, nkp, 1, V, Dvp, O, Dvp, true);
            FN(attn_gemm)(nqp - h, Dvp, nk, Sc + h * nkp, nkp, 1, V, Dvp, O + h * Dvp, Dvp, true);
        } else {
            FN(attn_gemm)(nqp, Dvp, nk, Sc, nkp, 1, V, Dvp, O, Dvp, true);
        }
    }
    for (int64_t r = 0; r < nq; r++) {
        const real inv = l[r] > 0 ? (real)(1.0 / l[r]) : 0;
        for (int64_t c = 0; c < Dv; c++) O[r * Dvp + c] *= inv;
        if (lse) attn_store(lse->dt, (char *)attn_row(lse, b, h, i0 + r), 0, l[r] > 0 ? m[r] + log(l[r]) : -INFINITY);
    }
    FN(attn_store_rows)(out, b, h, i0, nq, Dv, O, Dvp);
}

static ct_status FN(attn_forward)(const attn_dims *dm, const attn_op *q, const attn_op *k, const attn_op *v,
                                  const attn_op *out, const attn_op *lse)
{
    const int64_t nqb = (dm->T + BQ - 1) / BQ, ntask = dm->B * dm->H * nqb;
    const int64_t ws_elems = attn_fwd_ws_elems(dm->S, dm->D, dm->Dv, NR);
    const int64_t work = dm->B * dm->H * dm->T * dm->S * (dm->D + dm->Dv);
    atomic_int failed = 0;
#pragma omp parallel num_threads(ct_get_num_threads()) if (work > PAR_MIN_WORK)
    {
        real *ws = attn_alloc(ws_elems, sizeof(real));
        if (!ws) atomic_store(&failed, 1);
        FN(attn_fws) w = {0};
        if (ws) w = FN(attn_fws_carve)(ws, dm->S, dm->D, dm->Dv);
        /* dynamic: causal blocks differ in cost; each task owns its output rows, so the
         * schedule cannot change any bit. Consecutive tasks are blocks of one head, so a
         * thread mostly finds the head's keys already packed. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            if (!ws) continue;
            const int64_t bh = t / nqb, i0 = (t % nqb) * BQ;
            FN(attn_fwd_block)(dm, q, k, v, out, lse, bh / dm->H, bh % dm->H, i0, &w);
        }
        free(ws);
    }
    if (failed)
        return ct_error_set(CT_ERR_NOMEM, "attention: out of memory for a %lld-byte tile workspace",
                            (long long)(ws_elems * (int64_t)sizeof(real)));
    return CT_OK;
}

/* Backward workspace of one thread. Qi, dOi, lse_i, drow_i are the current query
 * block's rows: packed per tile into their own slices, or (mode "heads") pointers into
 * Qh, dOh, lseh, where the whole head was packed once. dQ has the head's rows in mode
 * "heads", one block's otherwise. */
typedef struct FN(attn_bws) {
    real *Qi, *dOi, *Kt, *Kj, *Vt, *Sc, *dS, *dKj, *dVj, *dQ, *lse_i, *drow_i;
    real *Qb, *dOb, *lseb, *drowb; /* the per-block slices */
    real *Qh, *dOh, *lseh;         /* NULL unless mode "heads" */
} FN(attn_bws);

static FN(attn_bws) FN(attn_bws_carve)(real *ws, int64_t head_rows, int64_t D, int64_t Dv)
{
    const int64_t Dp = round_up(D, NR), Dvp = round_up(Dv, NR), hr = round_up(head_rows, MR);
    FN(attn_bws) w = {0};
    w.Qi = ws, ws += round_up(BQ * Dp, 16);
    w.dOi = ws, ws += round_up(BQ * Dvp, 16);
    w.Kt = ws, ws += round_up(D * BK, 16);
    w.Kj = ws, ws += round_up(BK * Dp, 16);
    w.Vt = ws, ws += round_up(Dv * BK, 16);
    w.Sc = ws, ws += round_up(BQ * BK, 16);
    w.dS = ws, ws += round_up(BQ * BK, 16);
    w.dKj = ws, ws += round_up(BK * Dp, 16);
    w.dVj = ws, ws += round_up(BK * Dvp, 16);
    w.lse_i = ws, ws += round_up(BQ, 16);
    w.drow_i = ws, ws += round_up(BQ, 16);
    w.Qb = w.Qi, w.dOb = w.dOi, w.lseb = w.lse_i, w.drowb = w.drow_i;
    if (head_rows) {
        w.Qh = ws, ws += round_up(hr * Dp, 16);
        w.dOh = ws, ws += round_up(hr * Dvp, 16);
        w.lseh = ws, ws += round_up(hr, 16);
    } else {
        ws += round_up(hr * Dp, 16) + round_up(hr * Dvp, 16) + round_up(hr, 16);
    }
    w.dQ = ws; /* last: its size varies with the mode */
    return w;
}

/* Points w at query block i0 of head (b,h): Q, dO, lse and rowsum(dO * O) rows, packed
 * here, or found in the head's rows packed once by attn_bwd_pack_head. */
static void FN(attn_bwd_pack_q)(const attn_dims *dm, const attn_op *o, const real *drow, int64_t b, int64_t h,
                                int64_t i0, int64_t nq, FN(attn_bws) *w)
{
    const int64_t nqp = round_up(nq, MR), Dp = round_up(dm->D, NR), Dvp = round_up(dm->Dv, NR);
    const real *drow_head = drow + (b * dm->H + h) * dm->T;
    if (w->Qh) {
        w->Qi = w->Qh + i0 * Dp, w->dOi = w->dOh + i0 * Dvp, w->lse_i = w->lseh + i0;
        w->drow_i = (real *)drow_head + i0;
        return;
    }
    w->Qi = w->Qb, w->dOi = w->dOb, w->lse_i = w->lseb, w->drow_i = w->drowb;
    FN(attn_pack_rows)(&o[1], b, h, i0, nq, dm->D, w->Qi, Dp, nqp);
    FN(attn_pack_rows)(&o[0], b, h, i0, nq, dm->Dv, w->dOi, Dvp, nqp);
    for (int64_t r = 0; r < nq; r++) {
        w->lse_i[r] = (real)attn_load(o[5].dt, attn_row(&o[5], b, h, i0 + r), 0);
        w->drow_i[r] = drow_head[i0 + r];
    }
}

/* Mode "heads": Q, dO and lse of the whole head (b,h), rows zero-padded to a multiple
 * of MR, so each tile reads its query block in place. */
static void FN(attn_bwd_pack_head)(const attn_dims *dm, const attn_op *o, int64_t b, int64_t h, FN(attn_bws) *w)
{
    const int64_t T = dm->T, Tp = round_up(T, MR), Dp = round_up(dm->D, NR), Dvp = round_up(dm->Dv, NR);
    FN(attn_pack_rows)(&o[1], b, h, 0, T, dm->D, w->Qh, Dp, Tp);
    FN(attn_pack_rows)(&o[0], b, h, 0, T, dm->Dv, w->dOh, Dvp, Tp);
    for (int64_t r = 0; r < Tp; r++)
        w->lseh[r] = r < T ? (real)attn_load(o[5].dt, attn_row(&o[5], b, h, r), 0) : 0;
}

static void FN(attn_bwd_pack_k)(const attn_dims *dm, const attn_op *o, int64_t b, int64_t h, int64_t j0, int64_t nk,
                                FN(attn_bws) *w)
{
    const int64_t nkp = round_up(nk, NR), Dp = round_up(dm->D, NR);
    FN(attn_pack_cols)(&o[2], b, h, j0, nk, dm->D, w->Kt, nkp);
    FN(attn_pack_rows)(&o[2], b, h, j0, nk, dm->D, w->Kj, Dp, nk);
    FN(attn_pack_cols)(&o[3], b, h, j0, nk, dm->Dv, w->Vt, nkp);
}

/* Tile (query block i0, key block j0) from the packed rows in w: recomputes
 * P = exp(S*scale - lse) and dS = P * (dP - rowsum(dO*O)) * scale (scale folded here),
 * then accumulates (+=) dV_j += P^T dO_i, dK_j += dS^T Q_i when kv, and dQ_i += dS K_j
 * into dq when dq != NULL. */
static void FN(attn_bwd_tile)(const attn_dims *dm, int64_t i0, int64_t nq, int64_t j0, int64_t nk,
                              FN(attn_bws) *w, bool kv, real *dq)
{
    const int64_t D = dm->D, Dv = dm->Dv, Dp = round_up(D, NR), Dvp = round_up(Dv, NR);
    const int64_t nqp = round_up(nq, MR), nkp = round_up(nk, NR);
    const real scale = (real)dm->scale;
    int64_t k1 = 0;
    const int64_t h = attn_tile_split(dm, i0, nq, nqp, j0, nk, NR, &k1);
    if (h) { /* rows [0, h) x columns [k1, nkp) are masked: not computed, zeroed below */
        FN(attn_gemm)(h, k1, D, w->Qi, Dp, 1, w->Kt, nkp, w->Sc, nkp, false);
        FN(attn_gemm)(nqp - h, nkp, D, w->Qi + h * Dp, Dp, 1, w->Kt, nkp, w->Sc + h * nkp, nkp, false);
        FN(attn_gemm)(h, k1, Dv, w->dOi, Dvp, 1, w->Vt, nkp, w->dS, nkp, false);
        FN(attn_gemm)(nqp - h, nkp, Dv, w->dOi + h * Dvp, Dvp, 1, w->Vt, nkp, w->dS + h * nkp, nkp, false);
    } else {
        FN(attn_gemm)(nqp, nkp, D, w->Qi, Dp, 1, w->Kt, nkp, w->Sc, nkp, false);
        FN(attn_gemm)(nqp, nkp, Dv, w->dOi, Dvp, 1, w->Vt, nkp, w->dS, nkp, false);
    }
    for (int64_t r = 0; r < nqp; r++) {
        const int64_t lim = r < nq ? min64(nk, attn_kend(dm, i0 + r) - j0) : 0;
        /* rows past nq are padding: drow_i may end at the head's last row there */
        FN(attn_bwd_row)(w->Sc + r * nkp, w->dS + r * nkp, lim, nkp, scale, w->lse_i[r], r < nq ? w->drow_i[r] : 0);
    }
    /* with a split, keys [k1, nkp) get nothing from queries [0, h) (P = dS = 0 there)
     * and queries [0, h) nothing from keys past k1 */
    if (kv && h) {
        FN(attn_gemm)(k1, Dvp, nq, w->Sc, 1, nkp, w->dOi, Dvp, w->dVj, Dvp, true);
        FN(attn_gemm)(nkp - k1, Dvp, nq - h, w->Sc + k1 + h * nkp, 1, nkp, w->dOi + h * Dvp, Dvp,
                      w->dVj + k1 * Dvp, Dvp, true);
        FN(attn_gemm)(k1, Dp, nq, w->dS, 1, nkp, w->Qi, Dp, w->dKj, Dp, true);
        FN(attn_gemm)(nkp - k1, Dp, nq - h, w->dS + k1 + h * nkp, 1, nkp, w->Qi + h * Dp, Dp, w->dKj + k1 * Dp, Dp,
                      true);
    } else if (kv) {
        FN(attn_gemm)(nkp, Dvp, nq, w->Sc, 1, nkp, w->dOi, Dvp, w->dVj, Dvp, true);
        FN(attn_gemm)(nkp, Dp, nq, w->dS, 1, nkp, w->Qi, Dp, w->dKj, Dp, true);
    }
    if (dq && h) {
        FN(attn_gemm)(h, Dp, min64(k1, nk), w->dS, nkp, 1, w->Kj, Dp, dq, Dp, true);
        FN(attn_gemm)(nqp - h, Dp, nk, w->dS + h * nkp, nkp, 1, w->Kj, Dp, dq + h * Dp, Dp, true);
    } else if (dq) {
        FN(attn_gemm)(nqp, Dp, nk, w->dS, nkp, 1, w->Kj, Dp, dq, Dp, true);
    }
}

/* Key block j0 of head (b,h): dK_j, dV_j over every query block that sees it, in
 * increasing order; dQ of each such block += into dq_head when given. */
static void FN(attn_bwd_key_block)(const attn_dims *dm, const attn_op *o, const real *drow, int64_t b, int64_t h,
                                   int64_t j0, FN(attn_bws) *w, real *dq_head)
{
    const int64_t nk = min64(BK, dm->S - j0), Dp = round_up(dm->D, NR), Dvp = round_up(dm->Dv, NR);
    const int64_t nkp = round_up(nk, NR);
    memset(w->dKj, 0, (size_t)(nkp * Dp) * sizeof(real));
    memset(w->dVj, 0, (size_t)(nkp * Dvp) * sizeof(real));
    /* first query row that sees key j0 */
    const int64_t i_first = dm->causal ? max64(0, j0 - (dm->S - dm->T)) : 0;
    if (i_first < dm->T) {
        FN(attn_bwd_pack_k)(dm, o, b, h, j0, nk, w);
        for (int64_t i0 = i_first / BQ * BQ; i0 < dm->T; i0 += BQ) {
            const int64_t nq = min64(BQ, dm->T - i0);
            FN(attn_bwd_pack_q)(dm, o, drow, b, h, i0, nq, w);
            FN(attn_bwd_tile)(dm, i0, nq, j0, nk, w, true, dq_head ? dq_head + i0 * Dp : NULL);
        }
    }
    FN(attn_store_rows)(&o[7], b, h, j0, nk, dm->D, w->dKj, Dp);
    FN(attn_store_rows)(&o[8], b, h, j0, nk, dm->Dv, w->dVj, Dvp);
}

/* Query block i0 of head (b,h): dQ_i over the key blocks it sees, in increasing order. */
static void FN(attn_bwd_query_block)(const attn_dims *dm, const attn_op *o, const real *drow, int64_t b,
                                     int64_t h, int64_t i0, FN(attn_bws) *w)
{
    const int64_t nq = min64(BQ, dm->T - i0), Dp = round_up(dm->D, NR);
    memset(w->dQ, 0, (size_t)(round_up(nq, MR) * Dp) * sizeof(real));
    FN(attn_bwd_pack_q)(dm, o, drow, b, h, i0, nq, w);
    const int64_t kend_blk = attn_kend(dm, i0 + nq - 1);
    for (int64_t j0 = 0; j0 < kend_blk; j0 += BK) {
        const int64_t nk = min64(BK, dm->S - j0); /* the same tiles as attn_bwd_key_block */
        FN(attn_bwd_pack_k)(dm, o, b, h, j0, nk, w);
        FN(attn_bwd_tile)(dm, i0, nq, j0, nk, w, false, w->dQ);
    }
    FN(attn_store_rows)(&o[6], b, h, i0, nq, dm->D, w->dQ, Dp);
}

/* o: dout, q, k, v, out, lse, dq, dk, dv. dq, dk, dv are overwritten. */
static ct_status FN(attn_backward)(const attn_dims *dm, const attn_op *o)
{
    const int64_t heads = dm->B * dm->H, T = dm->T, D = dm->D, Dp = round_up(D, NR);
    const int64_t nqb = (T + BQ - 1) / BQ, nkb = (dm->S + BK - 1) / BK;
    const int64_t work = heads * T * dm->S * (D + dm->Dv);
    const int nt = work > PAR_MIN_WORK ? ct_get_num_threads() : 1;
    const bool by_heads = attn_bwd_by_heads(heads, nt);
    const int64_t ws_elems = attn_bwd_ws_elems(by_heads ? T : 0, D, dm->Dv, NR);
    real *drow = attn_alloc(max64(1, heads * T), sizeof(real));
    if (!drow) return ct_error_set(CT_ERR_NOMEM, "attention_backward: out of memory");
    atomic_int failed = 0;
#pragma omp parallel num_threads(nt)
    {
        /* rowsum(dO * O) once per row, in double */
#pragma omp for schedule(static)
        for (int64_t row = 0; row < heads * T; row++) {
            const int64_t b = row / T / dm->H, h = row / T % dm->H, i = row % T;
            const char *dor = attn_row(&o[0], b, h, i), *orow = attn_row(&o[4], b, h, i);
            double acc = 0;
            if (o[0].dt == CT_ATTN_DTYPE && o[4].dt == CT_ATTN_DTYPE && o[0].st[3] == 1 && o[4].st[3] == 1) {
                /* the common case, unit stride: four partial sums (a fixed order, so the
                 * same bits whatever the threads), which vectorises instead of waiting
                 * on one double add per element */
                const real *dp = (const real *)dor, *op = (const real *)orow;
                double part[4] = {0, 0, 0, 0};
                int64_t c = 0;
                for (; c + 4 <= dm->Dv; c += 4)
                    for (int k = 0; k < 4; k++) part[k] += (double)dp[c + k] * op[c + k];
                for (; c < dm->Dv; c++) part[0] += (double)dp[c] * op[c];
                acc = (part[0] + part[1]) + (part[2] + part[3]);
            } else {
                for (int64_t c = 0; c < dm->Dv; c++)
                    acc += attn_load(o[0].dt, dor, c * o[0].st[3]) * attn_load(o[4].dt, orow, c * o[4].st[3]);
            }
            drow[row] = (real)acc;
        }
        real *ws = attn_alloc(ws_elems, sizeof(real));
        if (!ws) atomic_store(&failed, 1);
        FN(attn_bws) w = {0};
        if (ws) w = FN(attn_bws_carve)(ws, by_heads ? T : 0, D, dm->Dv);
        if (by_heads) {
#pragma omp for schedule(static)
            for (int64_t bh = 0; bh < heads; bh++) {
                if (!ws) continue;
                const int64_t b = bh / dm->H, h = bh % dm->H;
                memset(w.dQ, 0, (size_t)(round_up(T, MR) * Dp) * sizeof(real));
                FN(attn_bwd_pack_head)(dm, o, b, h, &w);
                for (int64_t j0 = 0; j0 < dm->S; j0 += BK) FN(attn_bwd_key_block)(dm, o, drow, b, h, j0, &w, w.dQ);
                FN(attn_store_rows)(&o[6], b, h, 0, T, D, w.dQ, Dp);
            }
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < heads * nkb; t++) {
                if (!ws) continue;
                const int64_t bh = t / nkb;
                FN(attn_bwd_key_block)(dm, o, drow, bh / dm->H, bh % dm->H, (t % nkb) * BK, &w, NULL);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < heads * nqb; t++) {
                if (!ws) continue;
                const int64_t bh = t / nqb;
                FN(attn_bwd_query_block)(dm, o, drow, bh / dm->H, bh % dm->H, (t % nqb) * BQ, &w);
            }
        }
        free(ws);
    }
    free(drow);
    if (failed)
        return ct_error_set(CT_ERR_NOMEM, "attention_backward: out of memory for a %lld-byte tile workspace",
                            (long long)(ws_elems * (int64_t)sizeof(real)));
    return CT_OK;
}

#undef real
#undef FN
#undef VEC
#undef W
#undef VFMA
#undef EXP
#undef IVEC
#undef VSEL

#endif /* CT_ATTN_REAL */
