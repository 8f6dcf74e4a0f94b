/* ctrain — CPU attention for bf16 q, k, v on CPUs with AVX512-BF16: the blockwise
 * algorithm of kernels/cpu/attention.c (the same 64 x 64 tiles, online softmax and
 * causal corner skipping, the same f32 row steps) with every tile product a bf16
 * dot product instead of an f32 FMA on widened copies.
 *
 * vdpbf16ps: for each f32 lane i, c[i] += a[2i]*b[2i] + a[2i+1]*b[2i+1]; the bf16
 * products are exact in f32 (8-bit significands), so a product over K runs over K/2
 * pairs, and operands are packed with the two elements of a pair side by side in
 * one 32-bit word:
 *   rows   A(m, 2p..2p+1) of a row-major bf16 A: word p of row m, as stored.
 *   words  B(2p..2p+1, n) of B = X^T: word p of X's row n, moved to (K/2, N) by an
 *          8 x 8 transpose of 32-bit words.
 *   pairs  B(2p..2p+1, n) of B = X: rows 2p and 2p+1 of X interleaved element by
 *          element into (K/2, N) words.
 * q, k, v, dout are bf16 already, so packing moves 16-bit values and never widens
 * one (the f32 kernels widen every element they pack).
 *
 * What differs from the f32 kernels' arithmetic: the probabilities P and dS are
 * rounded to bf16 before the products that take them (P V, P^T dO, dS^T Q, dS K),
 * as GPU flash attention does; scores, the softmax and its sums, and every
 * accumulator stay f32, and results are rounded to bf16 once at the end.
 * vdpbf16ps and vcvtneps2bf16 (the rounding) treat subnormals as zero.
 *
 * The backward always runs head by head (attention.c's "heads" mode), so results
 * never depend on the thread count.
 */
#include "kernels/cpu/attention_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "core/threads.h"
#include "kernels/cpu/cpu_features.h"

#if defined(__AVX512BF16__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define CT_ATTN_HAVE_BF16 1
#else
#define CT_ATTN_HAVE_BF16 0
#endif

/* The path: CTRAIN_BF16_ATTENTION=dot|widen (read once), unless a test forced one. */
enum { BF16_AUTO, BF16_DOT, BF16_WIDEN, BF16_BAD };
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_mode = BF16_AUTO;
static char env_value[48];
static atomic_int forced; /* 0: not forced, else BF16_DOT or BF16_WIDEN */

static bool bf16_dot_available(void) { return CT_ATTN_HAVE_BF16 && cti_cpu_features_get()->avx512_bf16; }

static void env_parse(void)
{
    const char *e = getenv("CTRAIN_BF16_ATTENTION");
    if (!e || !*e) return;
    snprintf(env_value, sizeof env_value, "%s", e);
    if (!strcmp(e, "widen")) env_mode = BF16_WIDEN;
    else if (!strcmp(e, "dot")) env_mode = bf16_dot_available() ? BF16_DOT : BF16_BAD;
    else env_mode = BF16_BAD;
}

void cti_cpu_attention_set_bf16_dot(bool on) { atomic_store(&forced, on ? BF16_DOT : BF16_WIDEN); }

bool cti_cpu_attention_bf16_dot(void)
{
    const int f = atomic_load(&forced);
    if (f) return f == BF16_DOT && bf16_dot_available();
    pthread_once(&env_once, env_parse);
    return env_mode != BF16_WIDEN && env_mode != BF16_BAD && bf16_dot_available();
}

const char *cti_cpu_attention_bf16_env_error(void)
{
    pthread_once(&env_once, env_parse);
    if (env_mode != BF16_BAD || atomic_load(&forced)) return NULL;
    static char msg[160];
    if (!strcmp(env_value, "dot"))
        snprintf(msg, sizeof msg, "CTRAIN_BF16_ATTENTION=dot, but this %s has no AVX512-BF16",
                 CT_ATTN_HAVE_BF16 ? "CPU" : "build");
    else
        snprintf(msg, sizeof msg, "CTRAIN_BF16_ATTENTION='%s': expected dot or widen", env_value);
    return msg;
}

bool cti_cpu_attention_bf16_takes(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                  const ct_tensor *dout, const ct_tensor *out, ct_status *err)
{
    *err = CT_OK;
    if (q->dtype != CT_DTYPE_BF16) return false;
    const char *bad = cti_cpu_attention_bf16_env_error();
    if (bad) {
        *err = ct_error_set(CT_ERR_INVALID, "attention: %s", bad);
        return false;
    }
    if (!cti_cpu_attention_bf16_dot()) return false;
    if (q->shape[3] % 2 || v->shape[3] % 2 || q->shape[2] == 0 || k->shape[2] == 0) return false;
    const ct_tensor *ts[] = {q, k, v, dout, out};
    for (int i = 0; i < 5; i++)
        if (ts[i] && ts[i]->strides[3] != 1) return false;
    return true;
}

#if CT_ATTN_HAVE_BF16

#define BQ CT_ATTN_BLOCK_Q
#define BK CT_ATTN_BLOCK_K
#define MR 4  /* query rows are padded to this, as in attention.c (its split h stays even) */
#define NR 16 /* columns of a micro-tile: two 8-lane registers */
#define PAR_MIN_WORK 32768

/* Rows [m0, m0+mr) x columns [n0, n0+16) of C (f32) [+]= sum over p < P of the pair
 * products A(m, p) . B(p, n): A's word (m, p) at A[m*ars + p*acs] (either layout, so
 * A^T costs nothing), B's at B[p*ldb + n]. 2*mr accumulators stay in registers. */
static inline __attribute__((always_inline)) void bf_gemm_block(int mr, int64_t m0, int64_t n0, int64_t P,
                                                                const uint32_t *A, int64_t ars, int64_t acs,
                                                                const uint32_t *B, int64_t ldb, float *C,
                                                                int64_t ldc, bool accumulate)
{
    __m256 c0[8], c1[8];
    for (int r = 0; r < mr; r++) {
        const float *cr = C + (m0 + r) * ldc + n0;
        c0[r] = accumulate ? _mm256_loadu_ps(cr) : _mm256_setzero_ps();
        c1[r] = accumulate ? _mm256_loadu_ps(cr + 8) : _mm256_setzero_ps();
    }
    const uint32_t *a = A + m0 * ars, *b = B + n0;
    for (int64_t p = 0; p < P; p++, b += ldb) {
        const __m256bh b0 = (__m256bh)_mm256_loadu_si256((const __m256i *)b);
        const __m256bh b1 = (__m256bh)_mm256_loadu_si256((const __m256i *)(b + 8));
        for (int r = 0; r < mr; r++) {
            const __m256bh ar = (__m256bh)_mm256_set1_epi32((int)a[r * ars + p * acs]);
            c0[r] = _mm256_dpbf16_ps(c0[r], ar, b0);
            c1[r] = _mm256_dpbf16_ps(c1[r], ar, b1);
        }
    }
    for (int r = 0; r < mr; r++) {
        float *cr = C + (m0 + r) * ldc + n0;
        _mm256_storeu_ps(cr, c0[r]);
        _mm256_storeu_ps(cr + 8, c1[r]);
    }
}

/* C (M, N) [+]= A (M, 2P) B (2P, N) in pairs, as bf_gemm_block. M even, N % 16 == 0:
 * callers pad. Row blocks of 8 (16 accumulators of the 32 registers), then 6, 4 or 2;
 * every element is the same P loop whichever block it falls in. */
static void bf_gemm(int64_t M, int64_t N, int64_t P, const uint32_t *A, int64_t ars, int64_t acs, const uint32_t *B,
                    int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    const int64_t M8 = M / 8 * 8;
    for (int64_t n0 = 0; n0 < N; n0 += NR) {
        for (int64_t m0 = 0; m0 < M8; m0 += 8) bf_gemm_block(8, m0, n0, P, A, ars, acs, B, ldb, C, ldc, accumulate);
        switch (M - M8) {
        case 6: bf_gemm_block(6, M8, n0, P, A, ars, acs, B, ldb, C, ldc, accumulate); break;
        case 4: bf_gemm_block(4, M8, n0, P, A, ars, acs, B, ldb, C, ldc, accumulate); break;
        case 2: bf_gemm_block(2, M8, n0, P, A, ars, acs, B, ldb, C, ldc, accumulate); break;
        default: break;
        }
    }
}

static inline const uint16_t *bf_row(const attn_op *o, int64_t b, int64_t h, int64_t t)
{
    return (const uint16_t *)attn_row(o, b, h, t);
}

/* rows: dst (rows_pad, ld) bf16 <- rows [t0, t0+n) of head (b,h), ncols columns;
 * the rest zero. */
static void bf_pack_rows(const attn_op *o, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t ncols,
                         uint16_t *dst, int64_t ld, int64_t rows_pad)
{
    for (int64_t r = 0; r < rows_pad; r++) {
        uint16_t *d = dst + r * ld;
        int64_t c = 0;
        if (r < n) memcpy(d, bf_row(o, b, h, t0 + r), (size_t)ncols * 2), c = ncols;
        memset(d + c, 0, (size_t)(ld - c) * 2);
    }
}

/* words: dst (ncols/2, ld) words, dst[p*ld + r] = word p of row t0+r of head (b,h)
 * for r < n; columns [n, ld) zero. */
static void bf_pack_words(const attn_op *o, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t ncols,
                          uint32_t *dst, int64_t ld)
{
    const int64_t nw = ncols / 2;
    int64_t r = 0;
    if (nw % 8 == 0)
        for (; r + 8 <= n; r += 8) {
            const float *src[8];
            for (int i = 0; i < 8; i++) src[i] = (const float *)bf_row(o, b, h, t0 + r + i);
            for (int64_t c = 0; c < nw; c += 8) {
                const float *blk[8];
                for (int i = 0; i < 8; i++) blk[i] = src[i] + c;
                attn_transpose8x8(blk, (float *)dst + c * ld + r, ld);
            }
        }
    for (; r < n; r++) {
        const uint16_t *s = bf_row(o, b, h, t0 + r);
        for (int64_t p = 0; p < nw; p++) memcpy(dst + p * ld + r, s + 2 * p, 4);
    }
    for (int64_t p = 0; p < nw; p++) memset(dst + p * ld + n, 0, (size_t)(ld - n) * 4);
}

/* pairs: dst (rows_pad/2, ld) words, word (p, c) = (X[t0+2p][c], X[t0+2p+1][c]) for
 * the rows of head (b,h) below t0+n and c < ncols; everything else zero. */
static void bf_pack_pairs(const attn_op *o, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t ncols,
                          uint32_t *dst, int64_t ld, int64_t rows_pad)
{
    for (int64_t p = 0; p < rows_pad / 2; p++) {
        uint32_t *d = dst + p * ld;
        const uint16_t *x0 = 2 * p < n ? bf_row(o, b, h, t0 + 2 * p) : NULL;
        const uint16_t *x1 = 2 * p + 1 < n ? bf_row(o, b, h, t0 + 2 * p + 1) : NULL;
        int64_t c = 0;
        if (x1)
            for (; c < ncols; c++) d[c] = x0[c] | (uint32_t)x1[c] << 16;
        else if (x0)
            for (; c < ncols; c++) d[c] = x0[c];
        memset(d + c, 0, (size_t)(ld - c) * 4);
    }
}

/* dst[c] = bf16(src[c]), rounded to nearest even, for c < n (n % 16 == 0). */
static void bf_round_row(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t c = 0; c < n; c += 16)
        _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + c)));
}

/* dst[c] = the pair (bf16(x0[c]), bf16(x1[c])) for c < n (n % 16 == 0). */
static void bf_round_pair(const float *x0, const float *x1, uint32_t *dst, int64_t n)
{
    for (int64_t c = 0; c < n; c += 16) {
        const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x0 + c)));
        const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x1 + c)));
        _mm512_storeu_si512(dst + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}

/* rows [t0, t0+n) of head (b,h) <- src (n, ld) f32, first ncols columns, rounded once. */
static void bf_store_rows(const attn_op *o, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t ncols,
                          const float *src, int64_t ld)
{
    for (int64_t r = 0; r < n; r++) {
        char *dst = (char *)attn_row(o, b, h, t0 + r);
        if (o->st[3] == 1 && o->dt == CT_DTYPE_BF16 && ncols % 16 == 0)
            bf_round_row(src + r * ld, (uint16_t *)dst, ncols); /* inline: a library call per row costs more */
        else if (o->st[3] == 1 && o->dt == CT_DTYPE_BF16)
            (void)ct_convert_n(CT_DTYPE_BF16, dst, CT_DTYPE_F32, src + r * ld, ncols, false);
        else
            for (int64_t c = 0; c < ncols; c++) attn_store(o->dt, dst, c * o->st[3], src[r * ld + c]);
    }
}

/* The next 64-byte aligned slice of `bytes` at offset *off of base (NULL while only
 * measuring: base NULL gives NULL slices and just the total). */
static void *bf_carve(char *base, int64_t *off, int64_t bytes)
{
    void *p = base ? base + *off : NULL;
    *off += round_up(bytes, 64);
    return p;
}

/* ---- forward ----------------------------------------------------------------- */

/* One forward thread's buffers: a query block as rows, the head's K as words (D/2, Sp)
 * and V as pairs (Sp/2, Dvp), holding the first `packed` keys of head (pb, ph), so
 * consecutive blocks of a head pack once; a score tile, its bf16 copy, the output. */
typedef struct bf_fws {
    uint32_t *Qr, *Kw, *Vp, *Pb;
    float *Sc, *O;
    int64_t Sp, pb, ph, packed;
} bf_fws;

static int64_t bf_fws_bytes(int64_t S, int64_t D, int64_t Dv, bf_fws *w, char *base)
{
    const int64_t Sp = round_up(S, NR), Dvp = round_up(Dv, NR);
    int64_t at = 0;
    bf_fws tmp = {.Sp = Sp, .pb = -1, .ph = -1};
    tmp.Qr = bf_carve(base, &at, BQ * D * 2);
    tmp.Kw = bf_carve(base, &at, D / 2 * Sp * 4);
    tmp.Vp = bf_carve(base, &at, Sp / 2 * Dvp * 4);
    tmp.Pb = bf_carve(base, &at, BQ * BK * 2);
    tmp.Sc = bf_carve(base, &at, BQ * BK * 4);
    tmp.O = bf_carve(base, &at, BQ * Dvp * 4);
    if (w) *w = tmp;
    return at;
}

static void bf_fwd_pack_kv(const attn_dims *dm, const attn_op *k, const attn_op *v, int64_t b, int64_t h, int64_t n,
                           bf_fws *w)
{
    if (w->pb == b && w->ph == h && w->packed >= n) return;
    bf_pack_words(k, b, h, 0, n, dm->D, w->Kw, w->Sp);
    bf_pack_pairs(v, b, h, 0, n, dm->Dv, w->Vp, round_up(dm->Dv, NR), round_up(n, 2));
    w->pb = b, w->ph = h, w->packed = n;
}

/* Query block [i0, i0+nq) of head (b,h) -> its out rows and lse, as attn_fwd_block. */
static void bf_fwd_block(const attn_dims *dm, const attn_op *q, const attn_op *k, const attn_op *v,
                         const attn_op *out, const attn_op *lse, int64_t b, int64_t h, int64_t i0, bf_fws *w)
{
    const int64_t Dw = dm->D / 2, Dv = dm->Dv, Dvp = round_up(Dv, NR), Sp = w->Sp;
    const int64_t nq = min64(BQ, dm->T - i0), nqp = round_up(nq, MR);
    const float scale = (float)dm->scale;
    float *Sc = w->Sc, *O = w->O, m[BQ];
    double l[BQ];

    bf_pack_rows(q, b, h, i0, nq, dm->D, (uint16_t *)w->Qr, dm->D, nqp);
    memset(O, 0, (size_t)(nqp * Dvp) * sizeof(float));
    for (int64_t r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;

    const int64_t kend_blk = attn_kend(dm, i0 + nq - 1);
    bf_fwd_pack_kv(dm, k, v, b, h, attn_kend(dm, dm->T - 1), w);
    for (int64_t j0 = 0; j0 < kend_blk; j0 += BK) {
        const int64_t nk = min64(BK, kend_blk - j0), nkp = round_up(nk, NR), nkw = nkp / 2;
        const uint32_t *Kj = w->Kw + j0, *Vj = w->Vp + j0 / 2 * Dvp;
        int64_t k1 = 0;
        const int64_t hs = attn_tile_split(dm, i0, nq, nqp, j0, nk, NR, &k1);
        if (hs) { /* rows [0, hs) columns [k1, nkp) are masked: the row step zeroes them */
            bf_gemm(hs, k1, Dw, w->Qr, Dw, 1, Kj, Sp, Sc, nkp, false);
            bf_gemm(nqp - hs, nkp, Dw, w->Qr + hs * Dw, Dw, 1, Kj, Sp, Sc + hs * nkp, nkp, false);
        } else {
            bf_gemm(nqp, nkp, Dw, w->Qr, Dw, 1, Kj, Sp, Sc, nkp, false);
        }
        for (int64_t r = 0; r < nqp; r++) {
            float *s = Sc + r * nkp;
            if (r >= nq) { /* padding rows: P = 0 */
                memset(s, 0, (size_t)nkp * sizeof(float));
            } else {
                const float corr =
                    cti_cpu_attn_fwd_row_f32(s, min64(nk, attn_kend(dm, i0 + r) - j0), nkp, scale, &m[r], &l[r]);
                if (corr != 1)
                    for (int64_t c = 0; c < Dvp; c++) O[r * Dvp + c] *= corr;
            }
            bf_round_row(s, (uint16_t *)w->Pb + r * nkp, nkp);
        }
        /* O += P V over key pairs; an odd nk reads one more key, whose P is 0 */
        if (hs) {
            bf_gemm(hs, Dvp, (min64(k1, nk) + 1) / 2, w->Pb, nkw, 1, Vj, Dvp, O, Dvp, true);
            bf_gemm(nqp - hs, Dvp, (nk + 1) / 2, w->Pb + hs * nkw, nkw, 1, Vj, Dvp, O + hs * Dvp, Dvp, true);
        } else {
            bf_gemm(nqp, Dvp, (nk + 1) / 2, w->Pb, nkw, 1, Vj, Dvp, O, Dvp, true);
        }
    }
    for (int64_t r = 0; r < nq; r++) {
        const float inv = l[r] > 0 ? (float)(1.0 / l[r]) : 0;
        for (int64_t c = 0; c < Dv; c++) O[r * Dvp + c] *= inv;
        if (lse) attn_store(lse->dt, (char *)attn_row(lse, b, h, i0 + r), 0, l[r] > 0 ? m[r] + log(l[r]) : -INFINITY);
    }
    bf_store_rows(out, b, h, i0, nq, Dv, O, Dvp);
}

ct_status cti_cpu_attention_bf16(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                 double scale, ct_tensor *out, ct_tensor *lse)
{
    const attn_dims dm = attn_dims_of(q, k, v, causal, scale);
    const attn_op oq = attn_op_of(q), ok = attn_op_of(k), ov = attn_op_of(v), oo = attn_op_of(out);
    const attn_op ol = lse ? attn_op_of(lse) : (attn_op){0};
    const int64_t nqb = (dm.T + BQ - 1) / BQ, ntask = dm.B * dm.H * nqb;
    const int64_t ws_bytes = bf_fws_bytes(dm.S, dm.D, dm.Dv, NULL, NULL);
    const int64_t work = dm.B * dm.H * dm.T * dm.S * (dm.D + dm.Dv);
    atomic_int failed = 0;
#pragma omp parallel num_threads(ct_get_num_threads()) if (work > PAR_MIN_WORK)
    {
        char *ws = attn_alloc(ws_bytes, 1);
        if (!ws) atomic_store(&failed, 1);
        bf_fws w = {0};
        if (ws) bf_fws_bytes(dm.S, dm.D, dm.Dv, &w, ws);
        /* dynamic, as in attention.c: each task owns its output rows */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            if (!ws) continue;
            const int64_t bh = t / nqb;
            bf_fwd_block(&dm, &oq, &ok, &ov, &oo, lse ? &ol : NULL, bh / dm.H, bh % dm.H, (t % nqb) * BQ, &w);
        }
        free(ws);
    }
    if (failed)
        return ct_error_set(CT_ERR_NOMEM, "attention (bf16): out of memory for a %lld-byte tile workspace",
                            (long long)ws_bytes);
    return CT_OK;
}

/* ---- backward ---------------------------------------------------------------- */

/* One backward thread's buffers. The head's Q and dO as rows (A of S = Q K^T and
 * dP = dO V^T) and as pairs (B of dK += dS^T Q and dV += P^T dO), its lse; the key
 * block's K as words and pairs, V as words; the tile's S (then P) and dP (then dS) in
 * f32, P and dS as pairs over query rows and dS as rows in bf16; the block's dK and
 * dV and the head's dQ in f32. */
typedef struct bf_bws {
    uint32_t *Qr, *Qp, *dOr, *dOp, *Kw, *Kp, *Vw, *Pt, *dSt, *dSr;
    float *lse, *Sc, *dS, *dK, *dV, *dQ;
} bf_bws;

static int64_t bf_bws_bytes(int64_t T, int64_t D, int64_t Dv, bf_bws *w, char *base)
{
    const int64_t Tp = round_up(T, MR), Dp = round_up(D, NR), Dvp = round_up(Dv, NR);
    int64_t at = 0;
    bf_bws t;
    t.Qr = bf_carve(base, &at, Tp * D * 2), t.Qp = bf_carve(base, &at, Tp / 2 * Dp * 4);
    t.dOr = bf_carve(base, &at, Tp * Dv * 2), t.dOp = bf_carve(base, &at, Tp / 2 * Dvp * 4);
    t.Kw = bf_carve(base, &at, D / 2 * BK * 4), t.Kp = bf_carve(base, &at, BK / 2 * Dp * 4), t.Vw = bf_carve(base, &at, Dv / 2 * BK * 4);
    t.Pt = bf_carve(base, &at, BQ / 2 * BK * 4), t.dSt = bf_carve(base, &at, BQ / 2 * BK * 4), t.dSr = bf_carve(base, &at, BQ * BK * 2);
    t.lse = bf_carve(base, &at, Tp * 4), t.Sc = bf_carve(base, &at, BQ * BK * 4), t.dS = bf_carve(base, &at, BQ * BK * 4);
    t.dK = bf_carve(base, &at, BK * Dp * 4), t.dV = bf_carve(base, &at, BK * Dvp * 4), t.dQ = bf_carve(base, &at, Tp * Dp * 4);
    if (w) *w = t;
    return at;
}

/* Tile (query block i0, key block j0): P, dS from the packed operands, then
 * dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i += dS K_j (scale folded into dS). */
static void bf_bwd_tile(const attn_dims *dm, int64_t i0, int64_t nq, int64_t j0, int64_t nk, const float *drow,
                        bf_bws *w)
{
    const int64_t Dw = dm->D / 2, Dvw = dm->Dv / 2, Dp = round_up(dm->D, NR), Dvp = round_up(dm->Dv, NR);
    const int64_t nqp = round_up(nq, MR), nkp = round_up(nk, NR), nkw = nkp / 2;
    const uint32_t *Qi = w->Qr + i0 * Dw, *dOi = w->dOr + i0 * Dvw;
    const uint32_t *Qpi = w->Qp + i0 / 2 * Dp, *dOpi = w->dOp + i0 / 2 * Dvp;
    float *dQi = w->dQ + i0 * Dp;
    int64_t k1 = 0;
    const int64_t hs = attn_tile_split(dm, i0, nq, nqp, j0, nk, NR, &k1);
    if (hs) { /* rows [0, hs) x columns [k1, nkp) are masked: the row step zeroes them */
        bf_gemm(hs, k1, Dw, Qi, Dw, 1, w->Kw, nkp, w->Sc, nkp, false);
        bf_gemm(nqp - hs, nkp, Dw, Qi + hs * Dw, Dw, 1, w->Kw, nkp, w->Sc + hs * nkp, nkp, false);
        bf_gemm(hs, k1, Dvw, dOi, Dvw, 1, w->Vw, nkp, w->dS, nkp, false);
        bf_gemm(nqp - hs, nkp, Dvw, dOi + hs * Dvw, Dvw, 1, w->Vw, nkp, w->dS + hs * nkp, nkp, false);
    } else {
        bf_gemm(nqp, nkp, Dw, Qi, Dw, 1, w->Kw, nkp, w->Sc, nkp, false);
        bf_gemm(nqp, nkp, Dvw, dOi, Dvw, 1, w->Vw, nkp, w->dS, nkp, false);
    }
    for (int64_t r = 0; r < nqp; r++) {
        const bool real_row = r < nq;
        const int64_t lim = real_row ? min64(nk, attn_kend(dm, i0 + r) - j0) : 0;
        cti_cpu_attn_bwd_row_f32(w->Sc + r * nkp, w->dS + r * nkp, lim, nkp, (float)dm->scale, w->lse[i0 + r],
                                 real_row ? drow[i0 + r] : 0);
        bf_round_row(w->dS + r * nkp, (uint16_t *)w->dSr + r * nkp, nkp);
    }
    for (int64_t p = 0; p < nqp / 2; p++) {
        bf_round_pair(w->Sc + 2 * p * nkp, w->Sc + (2 * p + 1) * nkp, w->Pt + p * nkp, nkp);
        bf_round_pair(w->dS + 2 * p * nkp, w->dS + (2 * p + 1) * nkp, w->dSt + p * nkp, nkp);
    }
    /* A = P^T (key m, query pair p) = Pt[p*nkp + m]; with a split, keys [k1, nkp) get
     * nothing from queries [0, hs) and queries [0, hs) nothing from keys past k1 */
    if (hs) {
        const int64_t ph = hs / 2, pq = (nq - hs + 1) / 2;
        bf_gemm(k1, Dvp, (nq + 1) / 2, w->Pt, 1, nkp, dOpi, Dvp, w->dV, Dvp, true);
        bf_gemm(nkp - k1, Dvp, pq, w->Pt + k1 + ph * nkp, 1, nkp, dOpi + ph * Dvp, Dvp, w->dV + k1 * Dvp, Dvp, true);
        bf_gemm(k1, Dp, (nq + 1) / 2, w->dSt, 1, nkp, Qpi, Dp, w->dK, Dp, true);
        bf_gemm(nkp - k1, Dp, pq, w->dSt + k1 + ph * nkp, 1, nkp, Qpi + ph * Dp, Dp, w->dK + k1 * Dp, Dp, true);
        bf_gemm(hs, Dp, (min64(k1, nk) + 1) / 2, w->dSr, nkw, 1, w->Kp, Dp, dQi, Dp, true);
        bf_gemm(nqp - hs, Dp, (nk + 1) / 2, w->dSr + hs * nkw, nkw, 1, w->Kp, Dp, dQi + hs * Dp, Dp, true);
    } else {
        bf_gemm(nkp, Dvp, (nq + 1) / 2, w->Pt, 1, nkp, dOpi, Dvp, w->dV, Dvp, true);
        bf_gemm(nkp, Dp, (nq + 1) / 2, w->dSt, 1, nkp, Qpi, Dp, w->dK, Dp, true);
        bf_gemm(nqp, Dp, (nk + 1) / 2, w->dSr, nkw, 1, w->Kp, Dp, dQi, Dp, true);
    }
}

/* o: dout, q, k, v, out, lse, dq, dk, dv. Head (b,h) whole: dK, dV of each key block
 * over the query blocks that see it, in increasing order; dQ accumulated for the head. */
static void bf_bwd_head(const attn_dims *dm, const attn_op *o, const float *drow, int64_t b, int64_t h, bf_bws *w)
{
    const int64_t T = dm->T, Tp = round_up(T, MR), D = dm->D, Dv = dm->Dv;
    const int64_t Dp = round_up(D, NR), Dvp = round_up(Dv, NR);
    bf_pack_rows(&o[1], b, h, 0, T, D, (uint16_t *)w->Qr, D, Tp);
    bf_pack_pairs(&o[1], b, h, 0, T, D, w->Qp, Dp, Tp);
    bf_pack_rows(&o[0], b, h, 0, T, Dv, (uint16_t *)w->dOr, Dv, Tp);
    bf_pack_pairs(&o[0], b, h, 0, T, Dv, w->dOp, Dvp, Tp);
    for (int64_t r = 0; r < Tp; r++) w->lse[r] = r < T ? (float)attn_load(o[5].dt, attn_row(&o[5], b, h, r), 0) : 0;
    memset(w->dQ, 0, (size_t)(Tp * Dp) * sizeof(float));
    for (int64_t j0 = 0; j0 < dm->S; j0 += BK) {
        const int64_t nk = min64(BK, dm->S - j0), nkp = round_up(nk, NR);
        memset(w->dK, 0, (size_t)(nkp * Dp) * sizeof(float));
        memset(w->dV, 0, (size_t)(nkp * Dvp) * sizeof(float));
        const int64_t i_first = dm->causal ? max64(0, j0 - (dm->S - T)) : 0; /* first query that sees j0 */
        if (i_first < T) {
            bf_pack_words(&o[2], b, h, j0, nk, D, w->Kw, nkp);
            bf_pack_pairs(&o[2], b, h, j0, nk, D, w->Kp, Dp, nkp);
            bf_pack_words(&o[3], b, h, j0, nk, Dv, w->Vw, nkp);
            for (int64_t i0 = i_first / BQ * BQ; i0 < T; i0 += BQ) bf_bwd_tile(dm, i0, min64(BQ, T - i0), j0, nk, drow, w);
        }
        bf_store_rows(&o[7], b, h, j0, nk, D, w->dK, Dp);
        bf_store_rows(&o[8], b, h, j0, nk, Dv, w->dV, Dvp);
    }
    bf_store_rows(&o[6], b, h, 0, T, D, w->dQ, Dp);
}

ct_status cti_cpu_attention_backward_bf16(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                          const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                          bool causal, double scale, ct_tensor *dq, ct_tensor *dk, ct_tensor *dv)
{
    const attn_dims dm = attn_dims_of(q, k, v, causal, scale);
    const attn_op o[9] = {attn_op_of(dout), attn_op_of(q),  attn_op_of(k),  attn_op_of(v), attn_op_of(out),
                          attn_op_of(lse),  attn_op_of(dq), attn_op_of(dk), attn_op_of(dv)};
    const int64_t heads = dm.B * dm.H, T = dm.T;
    const int64_t work = heads * T * dm.S * (dm.D + dm.Dv);
    const int nt = work > PAR_MIN_WORK ? ct_get_num_threads() : 1;
    const int64_t ws_bytes = bf_bws_bytes(T, dm.D, dm.Dv, NULL, NULL);
    float *drow = attn_alloc(heads * T, sizeof(float));
    if (!drow) return ct_error_set(CT_ERR_NOMEM, "attention_backward (bf16): out of memory");
    atomic_int failed = 0;
#pragma omp parallel num_threads(nt)
    {
        /* rowsum(dO * O) once per row, in double (bf16 products are exact there) */
#pragma omp for schedule(static)
        for (int64_t row = 0; row < heads * T; row++) {
            const int64_t b = row / T / dm.H, h = row / T % dm.H, i = row % T;
            const uint16_t *dor = bf_row(&o[0], b, h, i), *orow = bf_row(&o[4], b, h, i);
            double part[4] = {0, 0, 0, 0};
            for (int64_t c = 0; c < dm.Dv; c += 2) { /* Dv is even */
                part[c & 2] += (double)attn_bf16(dor[c]) * attn_bf16(orow[c]);
                part[(c & 2) + 1] += (double)attn_bf16(dor[c + 1]) * attn_bf16(orow[c + 1]);
            }
            drow[row] = (float)((part[0] + part[1]) + (part[2] + part[3]));
        }
        char *ws = attn_alloc(ws_bytes, 1);
        if (!ws) atomic_store(&failed, 1);
        bf_bws w = {0};
        if (ws) bf_bws_bytes(T, dm.D, dm.Dv, &w, ws);
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < heads; bh++) {
            if (!ws) continue;
            bf_bwd_head(&dm, o, drow + bh * T, bh / dm.H, bh % dm.H, &w);
        }
        free(ws);
    }
    free(drow);
    if (failed)
        return ct_error_set(CT_ERR_NOMEM, "attention_backward (bf16): out of memory for a %lld-byte workspace",
                            (long long)ws_bytes);
    return CT_OK;
}

#else /* no AVX512-BF16 in this build: cti_cpu_attention_bf16_takes says false */

ct_status cti_cpu_attention_bf16(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                 double scale, ct_tensor *out, ct_tensor *lse)
{
    (void)q, (void)k, (void)v, (void)causal, (void)scale, (void)out, (void)lse;
    return ct_error_set(CT_ERR_UNSUPPORTED, "attention (bf16): this build has no AVX512-BF16 kernels");
}

ct_status cti_cpu_attention_backward_bf16(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                          const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                          bool causal, double scale, ct_tensor *dq, ct_tensor *dk, ct_tensor *dv)
{
    (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)causal, (void)scale;
    (void)dq, (void)dk, (void)dv;
    return ct_error_set(CT_ERR_UNSUPPORTED, "attention_backward (bf16): this build has no AVX512-BF16 kernels");
}

#endif
