/* fp8 recipe, delayed scaling, quantisation and the CPU fp8 GEMM; the rules are in
 * precision/fp8.h. GPU tensors go to kernels/cuda/fp8.cu (cuBLASLt's fp8 GEMM on
 * sm_89 and later). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/convert.h"
#include "kernels/cpu/matmul.h"
#include "kernels/dispatch_internal.h"
#include "kernels/matmul.h"
#include "precision/fp8.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/fp8.h"
#endif

/* Tensors on a GPU go to kernels/cuda/fp8.cu (in a build with CUDA). */
static bool on_gpu(const ct_tensor *t)
{
#ifdef CT_HAVE_CUDA
    return t->device.type == CT_DEVICE_CUDA;
#else
    (void)t;
    return false;
#endif
}

/* CPU tensors, and GPU tensors where the build has CUDA */
static bool device_ok(const ct_tensor *t) { return t->device.type == CT_DEVICE_CPU || on_gpu(t); }

ct_status ct_fp8_recipe_resolve(const ct_fp8_recipe *in, ct_fp8_recipe *out)
{
    ct_fp8_recipe r = in ? *in : (ct_fp8_recipe){0};
    if (r.format != CT_FP8_HYBRID && r.format != CT_FP8_E4M3)
        return ct_error_set(CT_ERR_INVALID, "fp8 recipe: format %d is not HYBRID (%d) or E4M3 (%d)", (int)r.format,
                            CT_FP8_HYBRID, CT_FP8_E4M3);
    if (r.amax_compute_algo != CT_FP8_AMAX_MAX && r.amax_compute_algo != CT_FP8_AMAX_MOST_RECENT)
        return ct_error_set(CT_ERR_INVALID, "fp8 recipe: amax_compute_algo %d is not max (%d) or most_recent (%d)",
                            (int)r.amax_compute_algo, CT_FP8_AMAX_MAX, CT_FP8_AMAX_MOST_RECENT);
    if (r.amax_history_len == 0) r.amax_history_len = CT_FP8_DEFAULT_HISTORY;
    if (r.amax_history_len < 1 || r.amax_history_len > CT_FP8_MAX_HISTORY)
        return ct_error_set(CT_ERR_INVALID, "fp8 recipe: amax_history_len %d is outside 1 .. %d (0 = %d)",
                            r.amax_history_len, CT_FP8_MAX_HISTORY, CT_FP8_DEFAULT_HISTORY);
    if (r.margin < 0 || r.margin > CT_FP8_MAX_MARGIN)
        return ct_error_set(CT_ERR_INVALID, "fp8 recipe: margin %d is outside 0 .. %d", r.margin, CT_FP8_MAX_MARGIN);
    *out = r;
    return CT_OK;
}

ct_dtype ct_fp8_dtype(const ct_fp8_recipe *r, ct_fp8_role role)
{
    return role == CT_FP8_BACKWARD && r->format == CT_FP8_HYBRID ? CT_DTYPE_F8_E5M2 : CT_DTYPE_F8_E4M3;
}

const char *ct_fp8_format_name(ct_fp8_format f) { return f == CT_FP8_E4M3 ? "e4m3" : "hybrid"; }

const char *ct_fp8_amax_algo_name(ct_fp8_amax_algo a) { return a == CT_FP8_AMAX_MOST_RECENT ? "most_recent" : "max"; }

double ct_fp8_max(ct_dtype dt)
{
    return dt == CT_DTYPE_F8_E4M3 ? 448.0 : dt == CT_DTYPE_F8_E5M2 ? 57344.0 : 0.0;
}

/* ---- delayed scaling ------------------------------------------------------------------- */

ct_status ct_fp8_meta_init(ct_fp8_meta *m, const ct_fp8_recipe *r, ct_fp8_role role)
{
    ct_fp8_recipe rr;
    ct_status st = ct_fp8_recipe_resolve(r, &rr);
    if (st) return st;
    float *h = calloc((size_t)rr.amax_history_len, sizeof *h);
    if (!h)
        return ct_error_set(CT_ERR_NOMEM, "fp8: out of memory for an amax history of %d entries", rr.amax_history_len);
    *m = (ct_fp8_meta){.dtype = ct_fp8_dtype(&rr, role), .scale = 1.0f, .history = h, .len = rr.amax_history_len,
                       .margin = rr.margin, .algo = rr.amax_compute_algo};
    return CT_OK;
}

void ct_fp8_meta_free(ct_fp8_meta *m)
{
    if (!m) return;
    free(m->history);
    m->history = NULL;
    m->len = m->pos = m->seen = 0;
}

void ct_fp8_meta_observe(ct_fp8_meta *m, float amax)
{
    if (isnan(amax) || isnan(m->pending)) m->pending = NAN;
    else if (amax > m->pending) m->pending = amax;
}

float ct_fp8_meta_amax(const ct_fp8_meta *m)
{
    if (!m->seen) return 0.0f;
    if (m->algo == CT_FP8_AMAX_MOST_RECENT) return m->history[(m->pos + m->len - 1) % m->len];
    float a = 0.0f;
    int n = m->seen < m->len ? m->seen : m->len;
    for (int i = 0; i < n; i++) {
        float h = m->history[i];
        if (isnan(h) || isnan(a)) a = NAN;
        else if (h > a) a = h;
    }
    return a;
}

void ct_fp8_meta_step(ct_fp8_meta *m)
{
    m->history[m->pos] = m->pending;
    m->pos = (m->pos + 1) % m->len;
    if (m->seen < m->len) m->seen++;
    m->pending = 0.0f;
    float a = ct_fp8_meta_amax(m);
    if (!(a > 0.0f) || !isfinite(a)) return; /* nothing seen, or an overflowing step: keep the scale */
    double s = ct_fp8_max(m->dtype) / (double)a / ldexp(1.0, m->margin);
    if (isfinite((float)s) && (float)s > 0.0f) m->scale = (float)s;
}

/* ---- quantisation ---------------------------------------------------------------------- */

static bool quant_args(const ct_tensor *x, ct_dtype dt, float scale, const char *op)
{
    char d[128];
    if (!x) {
        if (!ct_last_status()) ct_error_set(CT_ERR_INVALID, "%s: x is NULL", op);
        return false;
    }
    bool src_ok = x->dtype == CT_DTYPE_F32 || x->dtype == CT_DTYPE_BF16 || x->dtype == CT_DTYPE_F16;
    if (!src_ok || (dt != CT_DTYPE_F8_E4M3 && dt != CT_DTYPE_F8_E5M2) || !device_ok(x)) {
        ct_error_set(CT_ERR_INVALID, "%s: x %s to %s: want an f32, bf16 or f16 CPU tensor and f8_e4m3 or f8_e5m2 (or a GPU "
                     "tensor in a CUDA build)", op,
                     ct_tensor_describe(x, d, sizeof d), ct_dtype_name(dt));
        return false;
    }
    if (!(scale > 0.0f) || !isfinite(scale)) {
        ct_error_set(CT_ERR_INVALID, "%s: scale %g is not a finite positive number", op, (double)scale);
        return false;
    }
    return true;
}

static uint8_t quant_one(ct_dtype dt, float v, float scale)
{
    float y = v * scale; /* the f32 product, rounded once more to the format */
    return dt == CT_DTYPE_F8_E4M3 ? ct_f32_to_e4m3(y, true) : ct_f32_to_e5m2(y, true);
}

#define QBLOCK 1024

/* q[0..n) = quantised src (n <= QBLOCK contiguous values of dtype sdt); returns
 * max |src| (NaN if src has one). The products go through a buffer so that both
 * loops are plain array loops the compiler vectorises, and the rounding is
 * ct_convert_n's, the same as quant_one's. */
static float quant_block(ct_dtype dt, uint8_t *q, ct_dtype sdt, const void *src, int64_t n, float scale)
{
    float wide[QBLOCK], y[QBLOCK];
    const float *v = src;
    if (sdt != CT_DTYPE_F32) {
        ct_convert_n(CT_DTYPE_F32, wide, sdt, src, n, false); /* exact */
        v = wide;
    }
    float a = 0.0f;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        float av = fabsf(v[i]);
        nan |= av != av;
        a = av > a ? av : a;
        y[i] = v[i] * scale;
    }
    ct_convert_n(dt, q, CT_DTYPE_F32, y, n, true);
    return nan ? NAN : a;
}

ct_tensor *ct_fp8_quantize(const ct_tensor *x, ct_dtype dt, float scale, float *amax)
{
    if (!quant_args(x, dt, scale, "fp8_quantize")) return NULL;
    ct_tensor *xc = ct_tensor_contiguous((ct_tensor *)x);
    ct_tensor *out = xc ? ct_tensor_empty_on(x->device, dt, x->ndim, x->shape) : NULL;
    if (!out) return NULL;
#ifdef CT_HAVE_CUDA
    if (on_gpu(x)) {
        float ga = 0.0f;
        if (cti_cuda_fp8_quantize(out, xc, scale, &ga)) return NULL;
        out->scale = scale;
        out->amax = ga;
        if (amax) *amax = ga;
        return out;
    }
#endif
    const char *p = ct_tensor_data(xc);
    uint8_t *q = ct_tensor_data(out);
    int64_t n = ct_tensor_numel(x), nblocks = (n + QBLOCK - 1) / QBLOCK;
    size_t es = ct_dtype_size(x->dtype);
    float a = 0.0f;
    int nan = 0;
    #pragma omp parallel for reduction(max : a) reduction(| : nan) schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t i = b * QBLOCK, m = n - i < QBLOCK ? n - i : QBLOCK;
        float ab = quant_block(dt, q + i, x->dtype, p + (size_t)i * es, m, scale);
        nan |= isnan(ab);
        if (ab > a) a = ab;
    }
    out->scale = scale;
    out->amax = nan ? NAN : a;
    if (amax) *amax = out->amax;
    return out;
}

ct_tensor *ct_fp8_quantize_ref(const ct_tensor *x, ct_dtype dt, float scale, float *amax)
{
    if (!quant_args(x, dt, scale, "fp8_quantize_ref")) return NULL;
    ct_tensor *out = ct_tensor_empty_on(x->device, dt, x->ndim, x->shape);
    if (!out) return NULL;
#ifdef CT_HAVE_CUDA
    if (on_gpu(x)) {
        float ga = 0.0f;
        ct_tensor *xc = ct_tensor_contiguous((ct_tensor *)x);
        if (!xc || cti_cuda_fp8_quantize_ref(out, xc, scale, &ga)) return NULL;
        out->scale = scale;
        out->amax = ga;
        if (amax) *amax = ga;
        return out;
    }
#endif
    uint8_t *q = ct_tensor_data(out);
    const char *base = ct_tensor_data(x);
    size_t es = ct_dtype_size(x->dtype);
    int64_t n = ct_tensor_numel(x), idx[CT_MAX_DIMS] = {0};
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        /* row-major index -> strided offset */
        int64_t off = 0, rest = i;
        for (int d = x->ndim - 1; d >= 0; d--) {
            idx[d] = rest % x->shape[d];
            rest /= x->shape[d];
            off += idx[d] * x->strides[d];
        }
        float v = (float)ct_scalar_load(x->dtype, base + (size_t)off * es); /* exact */
        if (isnan(v) || isnan(a)) a = NAN;
        else if (fabsf(v) > a) a = fabsf(v);
        q[i] = quant_one(dt, v, scale);
    }
    out->scale = scale;
    out->amax = a;
    if (amax) *amax = a;
    return out;
}

/* ---- GEMM ------------------------------------------------------------------------------ */

static bool is_fp8(ct_dtype dt) { return dt == CT_DTYPE_F8_E4M3 || dt == CT_DTYPE_F8_E5M2; }

/* Checks a and b; *M, *N, *K of op(a) (M, K) @ op(b) (K, N). */
static bool gemm_args(const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, const char *op, int64_t *M,
                      int64_t *N, int64_t *K)
{
    char da[128], db[128];
    if (!a || !b) {
        if (!ct_last_status()) ct_error_set(CT_ERR_INVALID, "%s: %s is NULL", op, a ? "b" : "a");
        return false;
    }
    const ct_tensor *ts[2] = {a, b};
    if (cti_kernel_same_device(op, ts, 2)) return false;
    int64_t k2 = 0;
    bool ok = a->ndim == 2 && b->ndim == 2 && is_fp8(a->dtype) && is_fp8(b->dtype) && device_ok(a) && a->scale > 0 &&
              b->scale > 0;
    if (ok) {
        *M = ta ? a->shape[1] : a->shape[0];
        *K = ta ? a->shape[0] : a->shape[1];
        k2 = tb ? b->shape[1] : b->shape[0];
        *N = tb ? b->shape[0] : b->shape[1];
        ok = *K == k2;
    }
    if (!ok)
        ct_error_set(CT_ERR_INVALID,
                     "%s: a %s (scale %g)%s, b %s (scale %g)%s: want 2-D fp8 CPU tensors with positive scales and "
                     "matching inner sizes (or GPU tensors in a CUDA build)",
                     op, ct_tensor_describe(a, da, sizeof da), (double)a->scale, ta ? " transposed" : "",
                     ct_tensor_describe(b, db, sizeof db), (double)b->scale, tb ? " transposed" : "");
    return ok;
}

/* fp8 -> bf16 and fp8 -> f32 are exact: tables of the 256 patterns of each format */
static uint16_t lut_bf16[2][256];
static float lut_f32[2][256];
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;

static void lut_init(void)
{
    for (int i = 0; i < 256; i++) {
        lut_f32[0][i] = ct_e4m3_to_f32((uint8_t)i);
        lut_f32[1][i] = ct_e5m2_to_f32((uint8_t)i);
        for (int f = 0; f < 2; f++) {
            uint32_t u;
            memcpy(&u, &lut_f32[f][i], sizeof u);
            lut_bf16[f][i] = (uint16_t)(u >> 16); /* the low half is zero: 3 or 2 mantissa bits */
        }
    }
}

/* t (fp8, 2-D) widened exactly into a contiguous bf16 or f32 tensor */
static ct_tensor *widen(const ct_tensor *t, ct_dtype to)
{
    ct_tensor *c = ct_tensor_contiguous((ct_tensor *)t);
    ct_tensor *w = c ? ct_tensor_empty(to, t->ndim, t->shape) : NULL;
    if (!w) return NULL;
    const uint8_t *s = ct_tensor_data(c);
    int64_t n = ct_tensor_numel(t);
    int f = t->dtype == CT_DTYPE_F8_E5M2;
    if (to == CT_DTYPE_BF16) {
        uint16_t *d = ct_tensor_data(w);
        #pragma omp parallel for schedule(static) if (n > 262144)
        for (int64_t i = 0; i < n; i++) d[i] = lut_bf16[f][s[i]];
    } else {
        float *d = ct_tensor_data(w);
        #pragma omp parallel for schedule(static) if (n > 262144)
        for (int64_t i = 0; i < n; i++) d[i] = lut_f32[f][s[i]];
    }
    return w;
}

ct_tensor *ct_fp8_matmul(const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b)
{
    int64_t M, N, K;
    if (!gemm_args(a, b, trans_a, trans_b, "fp8_matmul", &M, &N, &K)) return NULL;
#ifdef CT_HAVE_CUDA
    if (on_gpu(a)) {
        ct_tensor *g = ct_tensor_empty_on(a->device, CT_DTYPE_F32, CT_SHAPE(M, N));
        return g && !cti_cuda_fp8_matmul(g, a, b, trans_a, trans_b) ? g : NULL;
    }
#endif
    pthread_once(&lut_once, lut_init);
    /* exact widening, then a GEMM that sums the (exact) products in f32: bf16 where
     * the CPU multiplies bf16 natively, else f32. The scales come out as alpha. */
    ct_dtype wide = cti_cpu_matmul_backend(CT_DTYPE_BF16) == CT_GEMM_ONEDNN ? CT_DTYPE_BF16 : CT_DTYPE_F32;
    ct_tensor *aw = widen(a, wide), *bw = aw ? widen(b, wide) : NULL;
    ct_tensor *out = bw ? ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(M, N)) : NULL;
    if (!out) return NULL;
    if (ct_kernel_matmul_out(out, aw, bw, trans_a, trans_b, 1.0 / ((double)a->scale * b->scale), 0.0)) {
        ct_error_prefix("fp8_matmul: ");
        return NULL;
    }
    return out;
}

ct_tensor *ct_fp8_matmul_ref(const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b)
{
    int64_t M, N, K;
    if (!gemm_args(a, b, trans_a, trans_b, "fp8_matmul_ref", &M, &N, &K)) return NULL;
    ct_tensor *out = ct_tensor_empty_on(a->device, CT_DTYPE_F32, CT_SHAPE(M, N));
    if (!out) return NULL;
#ifdef CT_HAVE_CUDA
    if (on_gpu(a)) return cti_cuda_fp8_matmul_ref(out, a, b, trans_a, trans_b) ? NULL : out;
#endif
    const uint8_t *pa = ct_tensor_data(a), *pb = ct_tensor_data(b);
    float *o = ct_tensor_data(out), inv = 1.0f / (a->scale * b->scale);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                int64_t ia = trans_a ? k * a->strides[0] + i * a->strides[1] : i * a->strides[0] + k * a->strides[1];
                int64_t ib = trans_b ? j * b->strides[0] + k * b->strides[1] : k * b->strides[0] + j * b->strides[1];
                s += (float)ct_scalar_load(a->dtype, pa + ia) * (float)ct_scalar_load(b->dtype, pb + ib);
            }
            o[i * N + j] = s * inv;
        }
    return out;
}
