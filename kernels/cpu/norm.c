/* CPU layernorm and rmsnorm, forward and backward.
 *
 * rmsnorm is layernorm without centring (mean taken as 0) and without bias, so
 * both share one set of kernels with a `center` flag.
 *
 * Row statistics sum in double over LANES independent partial sums added in a
 * fixed order: the compiler can vectorise the lanes without reassociating, and
 * the bits do not depend on the thread count. The variance is a second pass over
 * (x - mean), never E[x^2] - E[x]^2. dw and db are reduced over rows by column
 * blocks, each block owned by one task, so they need no atomics and no
 * per-thread partials.
 *
 * For f32 x the forward's elementwise math is f32 with double statistics and the
 * backward's is double (its terms can cancel); f64 is all double; bf16 and f16
 * are widened into f32 buffers and rounded once at the end. w and b of another
 * dtype are converted to the compute dtype (C elements) first; absent w and b
 * become ones and zeros so the inner loops have no branches.
 */
#include "kernels/cpu/norm.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/threads.h"
#include "kernels/cpu/rows.h"

#define PAR_MIN 32768   /* elements of work below which a loop stays on one thread */
#define LANES 8         /* partial sums per row reduction */
#define BLOCK_COLS 32   /* columns of dw/db per task */
/* Rows at least this wide take dx's elementwise step in f32 (the sums stay double):
 * the cancellation that needs double comes with narrow rows (C = 1 or 2 leave
 * differences of order eps / var). Measured: within 1.2e-7 (max-norm relative) of
 * the double reference at C = 64, 256, 1024 on random rows; backward 1.81 -> 1.39 ns
 * per element at the W1 GPT's shape (2048 x 256). */
#define F32_DX_MIN_C 64

/* ---- buffers in the compute dtype ------------------------------------------ */

/* t's data in dtype cd: t's own data when it already is, else a converted copy
 * in the current frame. NULL for a NULL t; clears *ok when allocation fails. */
static void *in_buf(const ct_tensor *t, ct_dtype cd, bool *ok)
{
    if (!t) return NULL;
    if (t->dtype == cd) return ct_tensor_data(t);
    ct_tensor *b = ct_tensor_empty_on(t->device, cd, t->ndim, t->shape);
    if (!b) {
        *ok = false;
        return NULL;
    }
    cti_cpu_convert_par(cd, ct_tensor_data(b), t->dtype, ct_tensor_data(t), ct_tensor_numel(t));
    return ct_tensor_data(b);
}

/* Where to compute output t in dtype cd: its own data, or a scratch buffer that
 * out_finish converts into t. */
static void *out_buf(const ct_tensor *t, ct_dtype cd, bool *ok)
{
    if (!t) return NULL;
    if (t->dtype == cd) return ct_tensor_data(t);
    ct_tensor *b = ct_tensor_empty_on(t->device, cd, t->ndim, t->shape);
    if (!b) {
        *ok = false;
        return NULL;
    }
    return ct_tensor_data(b);
}

static void out_finish(ct_tensor *t, const void *p, ct_dtype cd)
{
    if (t && t->dtype != cd) cti_cpu_convert_par(t->dtype, ct_tensor_data(t), cd, p, ct_tensor_numel(t));
}

/* C copies of v in dtype cd (stand-in for an absent w or b). */
static void *const_buf(int64_t C, ct_dtype cd, double v, bool *ok)
{
    ct_tensor *t = ct_tensor_full(cd, 1, (int64_t[]){C}, v);
    if (!t) *ok = false;
    return t ? ct_tensor_data(t) : NULL;
}

/* ---- fast kernels, generated for T = float and T = double ------------------ */

#define DEFINE_NORM_KERNELS(T, SUF)                                                                          \
    /* sum of (x[i] - c), or of (x[i] - c)^2 when sq, over n elements */                                    \
    static inline double row_sum_##SUF(const T *restrict x, int64_t n, double c, bool sq)                    \
    {                                                                                                        \
        double acc[LANES] = {0}, s = 0;                                                                      \
        int64_t i = 0;                                                                                       \
        if (sq) {                                                                                            \
            for (; i + LANES <= n; i += LANES)                                                               \
                for (int k = 0; k < LANES; k++) acc[k] += ((double)x[i + k] - c) * ((double)x[i + k] - c);   \
            for (; i < n; i++) s += ((double)x[i] - c) * ((double)x[i] - c);                                 \
        } else {                                                                                             \
            for (; i + LANES <= n; i += LANES)                                                               \
                for (int k = 0; k < LANES; k++) acc[k] += (double)x[i + k] - c;                              \
            for (; i < n; i++) s += (double)x[i] - c;                                                        \
        }                                                                                                    \
        for (int k = 0; k < LANES; k++) s += acc[k];                                                         \
        return s;                                                                                            \
    }                                                                                                        \
                                                                                                             \
    /* x, y (rows, C); w, b (C); mean, rstd (rows) or NULL.                                                  \
     * y = (x - mean) * rstd * w + b, mean = 0 unless center */                                             \
    static void fwd_##SUF(const T *restrict x, const T *restrict w, const T *restrict b, T *restrict y,      \
                          T *restrict mean, T *restrict rstd, int64_t rows, int64_t C, double eps, bool center) \
    {                                                                                                        \
        _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (rows * C > PAR_MIN)") \
        for (int64_t r = 0; r < rows; r++) {                                                                 \
            const T *restrict xr = x + r * C;                                                                \
            T *restrict yr = y + r * C;                                                                      \
            double mu = center ? row_sum_##SUF(xr, C, 0, false) / (double)C : 0;                             \
            double rs = 1.0 / sqrt(row_sum_##SUF(xr, C, mu, true) / (double)C + eps);                        \
            if (mean) mean[r] = (T)mu;                                                                       \
            if (rstd) rstd[r] = (T)rs;                                                                       \
            /* mean as hi + lo: x - hi is exact near the mean, so a mean far from 0 costs no accuracy */   \
            T mh = (T)mu, ml = (T)(mu - (double)mh), s = (T)rs;                                              \
            for (int64_t i = 0; i < C; i++) yr[i] = ((xr[i] - mh) - ml) * s * w[i] + b[i];                   \
        }                                                                                                    \
    }                                                                                                        \
                                                                                                             \
    /* dx (rows, C), overwritten: xhat = (x - mean) * rstd, g = dy * w,                                      \
     * dx = rstd * (g - mean_C(g) - xhat * mean_C(g * xhat)); no mean_C(g) term without center.              \
     * Sums in double; the elementwise step in double below F32_DX_MIN_C, where the three terms can      \
     * cancel (C = 1 in rmsnorm leaves g * eps / (x^2 + eps)) and f32 would lose those digits. */           \
    static void bwd_dx_##SUF(const T *restrict dy, const T *restrict x, const T *restrict w,                 \
                             const T *restrict mean, const T *restrict rstd, T *restrict dx, int64_t rows,    \
                             int64_t C, bool center)                                                         \
    {                                                                                                        \
        _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (rows * C > PAR_MIN)") \
        for (int64_t r = 0; r < rows; r++) {                                                                 \
            const T *restrict dyr = dy + r * C, *restrict xr = x + r * C;                                    \
            T *restrict dxr = dx + r * C;                                                                    \
            double m = center ? (double)mean[r] : 0, s = rstd[r];                                            \
            double ag[LANES] = {0}, agx[LANES] = {0}, sg = 0, sgx = 0;                                       \
            int64_t i = 0;                                                                                   \
            for (; i + LANES <= C; i += LANES)                                                               \
                for (int k = 0; k < LANES; k++) {                                                            \
                    double g = (double)dyr[i + k] * w[i + k];                                                \
                    ag[k] += g;                                                                              \
                    agx[k] += g * (((double)xr[i + k] - m) * s);                                             \
                }                                                                                            \
            for (; i < C; i++) {                                                                             \
                double g = (double)dyr[i] * w[i];                                                            \
                sg += g;                                                                                     \
                sgx += g * (((double)xr[i] - m) * s);                                                        \
            }                                                                                                \
            for (int k = 0; k < LANES; k++) sg += ag[k], sgx += agx[k];                                      \
            double a = center ? sg / (double)C : 0, q = sgx / (double)C;                                     \
            if (sizeof(T) == 4 && C >= F32_DX_MIN_C) {                                                       \
                /* wide rows: the three terms of a random-looking row do not cancel, so the     \
                 * elementwise part in T (half the work of double) keeps f32 accuracy */         \
                const T sf = (T)s, af = (T)a, mh = (T)m, ml = (T)(m - (double)(T)m), sq = (T)(s * q);            \
                for (int64_t j = 0; j < C; j++) dxr[j] = sf * ((dyr[j] * w[j] - af) - ((xr[j] - mh) - ml) * sq); \
            } else {                                                                                         \
                for (int64_t j = 0; j < C; j++)                                                              \
                    dxr[j] = (T)(s * ((double)dyr[j] * w[j] - a - ((double)xr[j] - m) * s * q));             \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
                                                                                                             \
    /* dw = sum over rows of dy * xhat, db = sum over rows of dy; (C) each, overwritten, either NULL */      \
    static void bwd_dwdb_##SUF(const T *restrict dy, const T *restrict x, const T *restrict mean,            \
                               const T *restrict rstd, T *restrict dw, T *restrict db, int64_t rows,         \
                               int64_t C, bool center)                                                       \
    {                                                                                                        \
        int64_t nb = (C + BLOCK_COLS - 1) / BLOCK_COLS;                                                      \
        _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (rows * C > PAR_MIN)") \
        for (int64_t blk = 0; blk < nb; blk++) {                                                             \
            int64_t c0 = blk * BLOCK_COLS, n = C - c0 < BLOCK_COLS ? C - c0 : BLOCK_COLS;                    \
            double aw[BLOCK_COLS] = {0}, ab[BLOCK_COLS] = {0};                                               \
            for (int64_t r = 0; r < rows; r++) {                                                             \
                const T *restrict dyr = dy + r * C + c0, *restrict xr = x + r * C + c0;                      \
                double m = center ? (double)mean[r] : 0, s = rstd[r];                                        \
                for (int64_t j = 0; j < n; j++) {                                                            \
                    aw[j] += (double)dyr[j] * (((double)xr[j] - m) * s);                                     \
                    ab[j] += dyr[j];                                                                         \
                }                                                                                            \
            }                                                                                                \
            for (int64_t j = 0; j < n; j++) {                                                                \
                if (dw) dw[c0 + j] = (T)aw[j];                                                               \
                if (db) db[c0 + j] = (T)ab[j];                                                               \
            }                                                                                                \
        }                                                                                                    \
    }

DEFINE_NORM_KERNELS(float, f32)
DEFINE_NORM_KERNELS(double, f64)

static ct_dtype compute_dtype(const ct_tensor *x) { return x->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32; }

static ct_status norm_fast(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                           ct_tensor *mean, ct_tensor *rstd, bool center)
{
    int64_t rows = cti_cpu_row_count(x), C = cti_cpu_row_len(x);
    ct_dtype cd = compute_dtype(x);
    bool ok = true;
    ct_frame_push();
    void *xp = in_buf(x, cd, &ok), *yp = out_buf(y, cd, &ok);
    void *wp = w ? in_buf(w, cd, &ok) : const_buf(C, cd, 1, &ok);
    void *bp = b ? in_buf(b, cd, &ok) : const_buf(C, cd, 0, &ok);
    void *mp = mean ? ct_tensor_data(mean) : NULL, *rp = rstd ? ct_tensor_data(rstd) : NULL;
    if (ok) {
        if (cd == CT_DTYPE_F64) fwd_f64(xp, wp, bp, yp, mp, rp, rows, C, eps, center);
        else fwd_f32(xp, wp, bp, yp, mp, rp, rows, C, eps, center);
        out_finish(y, yp, cd);
    }
    ct_frame_pop();
    return ok ? CT_OK : ct_last_status();
}

static ct_status norm_backward_fast(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                    const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                    ct_tensor *db, bool center)
{
    int64_t rows = cti_cpu_row_count(x), C = cti_cpu_row_len(x);
    ct_dtype cd = compute_dtype(x);
    bool ok = true;
    ct_frame_push();
    void *dwp = out_buf(dw, cd, &ok), *dbp = out_buf(db, cd, &ok), *dxp = out_buf(dx, cd, &ok);
    void *dyp = in_buf(dy, cd, &ok), *xp = in_buf(x, cd, &ok);
    void *wp = w ? in_buf(w, cd, &ok) : const_buf(C, cd, 1, &ok);
    void *mp = mean ? ct_tensor_data(mean) : NULL, *rp = ct_tensor_data(rstd);
    /* with no rows, dw and db are empty sums: the column loop writes zeros */
    if (ok && C > 0 && cd == CT_DTYPE_F64) {
        if (dxp) bwd_dx_f64(dyp, xp, wp, mp, rp, dxp, rows, C, center);
        if (dwp || dbp) bwd_dwdb_f64(dyp, xp, mp, rp, dwp, dbp, rows, C, center);
    } else if (ok && C > 0) {
        if (dxp) bwd_dx_f32(dyp, xp, wp, mp, rp, dxp, rows, C, center);
        if (dwp || dbp) bwd_dwdb_f32(dyp, xp, mp, rp, dwp, dbp, rows, C, center);
    }
    if (ok) {
        out_finish(dx, dxp, cd);
        out_finish(dw, dwp, cd);
        out_finish(db, dbp, cd);
    }
    ct_frame_pop();
    return ok ? CT_OK : ct_last_status();
}

ct_status cti_cpu_layernorm(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                            ct_tensor *mean, ct_tensor *rstd)
{
    return norm_fast(x, w, b, eps, y, mean, rstd, true);
}

ct_status cti_cpu_layernorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                     const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                     ct_tensor *db)
{
    return norm_backward_fast(dy, x, w, mean, rstd, dx, dw, db, true);
}

ct_status cti_cpu_rmsnorm(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y, ct_tensor *rstd)
{
    return norm_fast(x, w, NULL, eps, y, NULL, rstd, false);
}

ct_status cti_cpu_rmsnorm_backward(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                   const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw)
{
    return norm_backward_fast(dy, x, w, NULL, rstd, dx, dw, NULL, false);
}

/* ---- reference: every element through double, sums in plain order --------- */

static ct_status norm_ref(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                          ct_tensor *mean, ct_tensor *rstd, bool center)
{
    int64_t rows = cti_cpu_row_count(x), C = cti_cpu_row_len(x);
    for (int64_t r = 0; r < rows; r++) {
        double mu = 0, var = 0;
        if (center) {
            for (int64_t i = 0; i < C; i++) mu += cti_cpu_load_at(x, r * C + i);
            mu /= (double)C;
        }
        for (int64_t i = 0; i < C; i++) {
            double d = cti_cpu_load_at(x, r * C + i) - mu;
            var += d * d;
        }
        double rs = 1 / sqrt(var / (double)C + eps);
        if (mean) cti_cpu_store_at(mean, r, mu);
        if (rstd) cti_cpu_store_at(rstd, r, rs);
        for (int64_t i = 0; i < C; i++) {
            double wi = w ? cti_cpu_load_at(w, i) : 1, bi = b ? cti_cpu_load_at(b, i) : 0;
            cti_cpu_store_at(y, r * C + i, (cti_cpu_load_at(x, r * C + i) - mu) * rs * wi + bi);
        }
    }
    return CT_OK;
}

static ct_status norm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                   const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                   ct_tensor *db, bool center)
{
    int64_t rows = cti_cpu_row_count(x), C = cti_cpu_row_len(x);
    for (int64_t r = 0; r < rows && dx; r++) {
        double mu = center ? cti_cpu_load_at(mean, r) : 0, rs = cti_cpu_load_at(rstd, r), sg = 0, sgx = 0;
        for (int64_t i = 0; i < C; i++) {
            double g = cti_cpu_load_at(dy, r * C + i) * (w ? cti_cpu_load_at(w, i) : 1);
            sg += g;
            sgx += g * (cti_cpu_load_at(x, r * C + i) - mu) * rs;
        }
        for (int64_t i = 0; i < C; i++) {
            double g = cti_cpu_load_at(dy, r * C + i) * (w ? cti_cpu_load_at(w, i) : 1);
            double xhat = (cti_cpu_load_at(x, r * C + i) - mu) * rs;
            cti_cpu_store_at(dx, r * C + i, rs * (g - (center ? sg / (double)C : 0) - xhat * sgx / (double)C));
        }
    }
    for (int64_t i = 0; i < C; i++) {
        double sw = 0, sb = 0;
        for (int64_t r = 0; r < rows; r++) {
            double mu = center ? cti_cpu_load_at(mean, r) : 0;
            sw += cti_cpu_load_at(dy, r * C + i) * (cti_cpu_load_at(x, r * C + i) - mu) * cti_cpu_load_at(rstd, r);
            sb += cti_cpu_load_at(dy, r * C + i);
        }
        if (dw) cti_cpu_store_at(dw, i, sw);
        if (db) cti_cpu_store_at(db, i, sb);
    }
    return CT_OK;
}

ct_status cti_cpu_layernorm_ref(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, double eps, ct_tensor *y,
                                ct_tensor *mean, ct_tensor *rstd)
{
    return norm_ref(x, w, b, eps, y, mean, rstd, true);
}

ct_status cti_cpu_layernorm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                         const ct_tensor *mean, const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw,
                                         ct_tensor *db)
{
    return norm_backward_ref(dy, x, w, mean, rstd, dx, dw, db, true);
}

ct_status cti_cpu_rmsnorm_ref(const ct_tensor *x, const ct_tensor *w, double eps, ct_tensor *y, ct_tensor *rstd)
{
    return norm_ref(x, w, NULL, eps, y, NULL, rstd, false);
}

ct_status cti_cpu_rmsnorm_backward_ref(const ct_tensor *dy, const ct_tensor *x, const ct_tensor *w,
                                       const ct_tensor *rstd, ct_tensor *dx, ct_tensor *dw)
{
    return norm_backward_ref(dy, x, w, NULL, rstd, dx, dw, NULL, false);
}
