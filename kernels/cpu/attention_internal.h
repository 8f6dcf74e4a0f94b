/* ctrain — what the two CPU attention files share: the operand and problem
 * descriptions, the causal masking rule, element access and the aligned workspace.
 * kernels/cpu/attention.c holds the f32/f64 kernels and the references;
 * kernels/cpu/attention_bf16.c the bf16 dot-product kernels. Not installed.
 */
#ifndef CT_KERNELS_CPU_ATTENTION_INTERNAL_H
#define CT_KERNELS_CPU_ATTENTION_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/convert.h"
#include "kernels/cpu/attention.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

/* An operand: element (b,h,t,d) lives at base + (b*st[0] + h*st[1] + t*st[2] + d*st[3]) * esz.
 * 3-d tensors (lse) leave st[3] = 0. */
typedef struct attn_op {
    char *base;
    ct_dtype dt;
    int64_t esz;
    int64_t st[4];
} attn_op;

typedef struct attn_dims {
    int64_t B, H, T, S, D, Dv;
    bool causal;
    double scale;
} attn_dims;

static inline attn_op attn_op_of(const ct_tensor *t)
{
    attn_op o = {.base = ct_tensor_data(t), .dt = t->dtype, .esz = (int64_t)ct_dtype_size(t->dtype)};
    for (int i = 0; i < t->ndim && i < 4; i++) o.st[i] = t->strides[i];
    return o;
}

static inline attn_dims attn_dims_of(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                     double scale)
{
    attn_dims d = {q->shape[0], q->shape[1], q->shape[2], k->shape[2], q->shape[3], v->shape[3], causal, scale};
    if (!(d.scale > 0)) d.scale = 1.0 / sqrt((double)d.D);
    return d;
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Keys [0, kend) are visible to query row i. */
static inline int64_t attn_kend(const attn_dims *dm, int64_t i)
{
    if (!dm->causal) return dm->S;
    return max64(0, min64(dm->S, i + (dm->S - dm->T) + 1));
}

/* A causal tile on the diagonal (query rows i0.., nqp of them padded, keys j0.., nk
 * of them) is half masked: its first h rows see only keys [0, *k1) of the tile. The
 * tile products then skip that masked corner, a quarter of the tile; the skipped
 * terms are exact zeros of P and dS (or never read), so every result keeps its bits.
 * Returns h, even and <= the real rows; 0 when nothing can be skipped. */
static inline int64_t attn_tile_split(const attn_dims *dm, int64_t i0, int64_t nq, int64_t nqp, int64_t j0,
                                      int64_t nk, int64_t nr, int64_t *k1)
{
    if (!dm->causal) return 0;
    const int64_t h = (nqp / 2) & ~(int64_t)1;
    if (h < 2 || h > nq) return 0;
    const int64_t vis = min64(nk, max64(0, attn_kend(dm, i0 + h - 1) - j0));
    *k1 = round_up(vis, nr);
    return *k1 < round_up(nk, nr) ? h : 0;
}

/* bf16 -> f32 is the top half of the f32 (a NaN comes back quiet, as ct_bf16_to_f32
 * gives it): inline, since the packing loops call it per element. */
static inline float attn_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) u |= 0x00400000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline double attn_load(ct_dtype dt, const char *p, int64_t i)
{
    switch (dt) {
    case CT_DTYPE_F32: return ((const float *)p)[i];
    case CT_DTYPE_F64: return ((const double *)p)[i];
    case CT_DTYPE_BF16: return attn_bf16(((const uint16_t *)p)[i]);
    default: return ct_f16_to_f32(((const uint16_t *)p)[i]);
    }
}

/* Rounds once from v (exact for a float v, so float results are rounded once too). */
static inline void attn_store(ct_dtype dt, char *p, int64_t i, double v)
{
    switch (dt) {
    case CT_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case CT_DTYPE_F64: ((double *)p)[i] = v; break;
    case CT_DTYPE_BF16: ((uint16_t *)p)[i] = ct_f64_to_bf16(v); break;
    default: ((uint16_t *)p)[i] = ct_f64_to_f16(v); break;
    }
}

static inline const char *attn_row(const attn_op *o, int64_t b, int64_t h, int64_t t)
{
    return o->base + (b * o->st[0] + h * o->st[1] + t * o->st[2]) * o->esz;
}

static inline void *attn_alloc(int64_t elems, size_t esz)
{
    size_t bytes = (size_t)round_up(elems * (int64_t)esz, 64);
    return aligned_alloc(64, bytes ? bytes : 64);
}

#if defined(__AVX__)
/* d[c * ld + i] = src[i][c] for i, c < 8: an 8 x 8 block of 32-bit elements transposed
 * in registers (unpack, shuffle, permute). Bits are moved, never computed on, so it
 * transposes f32 values and bf16 pairs alike. */
static inline void attn_transpose8x8(const float *const src[8], float *d, int64_t ld)
{
    __m256 x0 = _mm256_loadu_ps(src[0]), x1 = _mm256_loadu_ps(src[1]);
    __m256 x2 = _mm256_loadu_ps(src[2]), x3 = _mm256_loadu_ps(src[3]);
    __m256 x4 = _mm256_loadu_ps(src[4]), x5 = _mm256_loadu_ps(src[5]);
    __m256 x6 = _mm256_loadu_ps(src[6]), x7 = _mm256_loadu_ps(src[7]);
    __m256 t0 = _mm256_unpacklo_ps(x0, x1), t1 = _mm256_unpackhi_ps(x0, x1);
    __m256 t2 = _mm256_unpacklo_ps(x2, x3), t3 = _mm256_unpackhi_ps(x2, x3);
    __m256 t4 = _mm256_unpacklo_ps(x4, x5), t5 = _mm256_unpackhi_ps(x4, x5);
    __m256 t6 = _mm256_unpacklo_ps(x6, x7), t7 = _mm256_unpackhi_ps(x6, x7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(d + 0 * ld, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(d + 1 * ld, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(d + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(d + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(d + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(d + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(d + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(d + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

/* The f32 row steps of kernels/cpu/attention.c, shared so the bf16 kernels compute
 * the softmax exactly as the f32 ones do.
 * Forward, one score row s of a key block (n columns, keys [0, lim) visible): folds
 * the block into the running max *m and sum *l (online softmax), leaves
 * s[c] = exp(s[c]*scale - m_new) for c < lim and 0 up to n; returns the factor
 * exp(m_old - m_new) the row's output accumulator must be multiplied by. */
float cti_cpu_attn_fwd_row_f32(float *s, int64_t lim, int64_t n, float scale, float *m, double *l);
/* Backward, one row: p[c] = exp(p[c]*scale - lse), ds[c] = p[c] (ds[c] - drow) scale
 * for c < lim; both 0 up to n. */
void cti_cpu_attn_bwd_row_f32(float *p, float *ds, int64_t lim, int64_t n, float scale, float lse, float drow);

/* The bf16 dot-product kernels (kernels/cpu/attention_bf16.c). Whether they take a
 * problem: cti_cpu_attention_bf16_dot(), bf16 q, k, v (and dout, out) with unit inner
 * stride and even head dims. false with *err set when CTRAIN_BF16_ATTENTION is bad. */
bool cti_cpu_attention_bf16_takes(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                  const ct_tensor *dout, const ct_tensor *out, ct_status *err);
ct_status cti_cpu_attention_bf16(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                                 double scale, ct_tensor *out, ct_tensor *lse);
ct_status cti_cpu_attention_backward_bf16(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k,
                                          const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                          bool causal, double scale, ct_tensor *dq, ct_tensor *dk, ct_tensor *dv);

#endif
