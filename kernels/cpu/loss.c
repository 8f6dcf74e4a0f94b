/* CPU fused cross-entropy, forward and backward.
 *
 * Rows are independent: the forward writes each row's lse and loss term, then
 * one thread sums the terms in row order (deterministic for any thread count).
 * bf16/f16 rows are widened one row at a time into a per-thread f32 buffer, so
 * a (B*T, V) logits tensor is never copied whole.
 *
 * The backward uses the saved lse only as the shift that keeps exp() in range,
 * and normalises the row by its own sum: lse is stored in f32, and its rounding
 * (up to 5e-4 at logits of 1e4) would otherwise scale every probability of the
 * row by the same wrong factor.
 */
#include "kernels/cpu/loss.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/threads.h"
#include "kernels/cpu/indices.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/softmax.h" /* ct_cpu_row_max, ct_cpu_expsum: the vectorised exp */

#define PAR_MIN 32768 /* elements of work below which a loop stays on one thread */

/* Every target is ignore_index or in [0, V); *count = the rows not ignored. */
static ct_status check_targets(const char *op, const ct_tensor *targets, int64_t V, int64_t ignore, int64_t *count)
{
    int64_t i = cti_cpu_index_find_bad(targets, V, true, ignore, count);
    if (i < 0) return CT_OK;
    char pos[160], d[200];
    int64_t t = cti_cpu_index_at(ct_tensor_data(targets), targets->dtype == CT_DTYPE_I64, i);
    return ct_error_set(CT_ERR_INVALID,
                        "%s: target %lld at position %s of targets %s is out of range for V = %lld classes "
                        "(expected 0 <= target < %lld, or ignore_index %lld)",
                        op, (long long)t, cti_cpu_index_pos(targets, i, pos, sizeof pos),
                        ct_tensor_describe(targets, d, sizeof d), (long long)V, (long long)V, (long long)ignore);
}

/* ---- fast kernels, generated for T = float (compute dtype CD = f32) and double
 *
 * forward, per row: lse = m + log(sum exp(x - m)) (m = max x, sum in double),
 *                   term = lse - x[t], or 0 when t is ignored
 * backward, per row not ignored, overwriting dx:
 *   e = exp(x - lse), dx = e * (sc / sum(e)), dx[t] -= sc    (sc = dloss / count)
 * x rows in another dtype than T go through scratch (two V-buffers per thread). */
#define DEFINE_CE_KERNELS(T, SUF, CD)                                                                        \
    static inline double row_lse_##SUF(const T *restrict x, int64_t V)                                       \
    {                                                                                                        \
        T m = cti_cpu_row_max_##SUF(x, V);                                                                   \
        return (double)m + log(cti_cpu_expsum_##SUF(x, m, NULL, V));                                         \
    }                                                                                                        \
                                                                                                             \
    static void fwd_##SUF(const void *x, ct_dtype xdt, const void *tg, bool i64, int64_t ignore,             \
                          T *restrict lse, double *restrict term, T *restrict scratch, int nt, int64_t rows,  \
                          int64_t V)                                                                         \
    {                                                                                                        \
        int64_t es = (int64_t)ct_dtype_size(xdt);                                                            \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if (rows * V > PAR_MIN)")                 \
        for (int64_t r = 0; r < rows; r++) {                                                                 \
            const T *xr;                                                                                     \
            if (xdt == CD) {                                                                                 \
                xr = (const T *)x + r * V;                                                                   \
            } else {                                                                                         \
                T *buf = scratch + (int64_t)omp_get_thread_num() * 2 * V;                                    \
                ct_convert_n(CD, buf, xdt, (const char *)x + r * V * es, V, false);                          \
                xr = buf;                                                                                    \
            }                                                                                                \
            double l = row_lse_##SUF(xr, V);                                                                 \
            if (lse) lse[r] = (T)l;                                                                          \
            int64_t t = cti_cpu_index_at(tg, i64, r);                                                         \
            term[r] = t == ignore ? 0 : l - (double)xr[t];                                                   \
        }                                                                                                    \
    }                                                                                                        \
                                                                                                             \
    static void bwd_##SUF(const void *x, ct_dtype xdt, const void *tg, bool i64, int64_t ignore,             \
                          const T *restrict lse, double sc, void *dx, T *restrict scratch, int nt,           \
                          int64_t rows, int64_t V)                                                           \
    {                                                                                                        \
        int64_t es = (int64_t)ct_dtype_size(xdt);                                                            \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if (rows * V > PAR_MIN)")                 \
        for (int64_t r = 0; r < rows; r++) {                                                                 \
            char *dxr = (char *)dx + r * V * es;                                                             \
            int64_t t = cti_cpu_index_at(tg, i64, r);                                                         \
            if (t == ignore) {                                                                               \
                memset(dxr, 0, (size_t)(V * es)); /* all-zero bits are +0 in every float format */          \
                continue;                                                                                    \
            }                                                                                                \
            const T *xr;                                                                                     \
            T *out;                                                                                          \
            if (xdt == CD) {                                                                                 \
                xr = (const T *)x + r * V;                                                                   \
                out = (T *)dxr;                                                                              \
            } else {                                                                                         \
                T *buf = scratch + (int64_t)omp_get_thread_num() * 2 * V;                                    \
                ct_convert_n(CD, buf, xdt, (const char *)x + r * V * es, V, false);                          \
                xr = buf;                                                                                    \
                out = buf + V;                                                                               \
            }                                                                                                \
            T k = (T)(sc / cti_cpu_expsum_##SUF(xr, lse[r], out, V));                                        \
            for (int64_t i = 0; i < V; i++) out[i] *= k;                                                     \
            out[t] -= (T)sc;                                                                                 \
            if (xdt != CD) ct_convert_n(xdt, dxr, CD, out, V, false);                                        \
        }                                                                                                    \
    }

DEFINE_CE_KERNELS(float, f32, CT_DTYPE_F32)
DEFINE_CE_KERNELS(double, f64, CT_DTYPE_F64)

/* Per-thread scratch for rows of another dtype than the compute dtype cd; NULL
 * (and *ok kept) when not needed. */
static void *scratch_for(const ct_tensor *logits, ct_dtype cd, int nt, int64_t V, bool *ok)
{
    if (logits->dtype == cd) return NULL;
    ct_tensor *s = ct_tensor_empty_on(logits->device, cd, 1, (int64_t[]){(int64_t)nt * 2 * V});
    if (!s) *ok = false;
    return s ? ct_tensor_data(s) : NULL;
}

ct_status cti_cpu_cross_entropy(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                ct_tensor *loss, ct_tensor *lse)
{
    int64_t rows = ct_tensor_numel(targets), V = cti_cpu_row_len(logits), count;
    ct_status st = check_targets("cross_entropy", targets, V, ignore_index, &count);
    if (st) return st;
    ct_dtype cd = logits->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32;
    int nt = ct_get_num_threads();
    bool ok = true;
    ct_frame_push();
    ct_tensor *term = ct_tensor_empty(CT_DTYPE_F64, 1, &rows);
    void *scratch = scratch_for(logits, cd, nt, V, &ok);
    if (term && ok) {
        double *tp = ct_tensor_data(term), s = 0;
        const void *x = ct_tensor_data(logits), *tg = ct_tensor_data(targets);
        bool i64 = targets->dtype == CT_DTYPE_I64;
        void *lp = lse ? ct_tensor_data(lse) : NULL;
        if (cd == CT_DTYPE_F64) fwd_f64(x, logits->dtype, tg, i64, ignore_index, lp, tp, scratch, nt, rows, V);
        else fwd_f32(x, logits->dtype, tg, i64, ignore_index, lp, tp, scratch, nt, rows, V);
        for (int64_t r = 0; r < rows; r++) s += tp[r];
        ct_scalar_store(loss->dtype, ct_tensor_data(loss), count ? s / (double)count : NAN);
    } else {
        ok = false;
    }
    ct_frame_pop();
    return ok ? CT_OK : ct_last_status();
}

ct_status cti_cpu_cross_entropy_backward(const ct_tensor *dloss, const ct_tensor *logits, const ct_tensor *targets,
                                         const ct_tensor *lse, int64_t ignore_index, ct_tensor *dlogits)
{
    int64_t rows = ct_tensor_numel(targets), V = cti_cpu_row_len(logits), count;
    ct_status st = check_targets("cross_entropy_backward", targets, V, ignore_index, &count);
    if (st) return st;
    ct_dtype cd = logits->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32;
    /* count = 0: every row is ignored and gets zeros, sc is never used */
    double sc = count ? ct_scalar_load(dloss->dtype, ct_tensor_data(dloss)) / (double)count : 0;
    int nt = ct_get_num_threads();
    bool ok = true;
    ct_frame_push();
    void *scratch = scratch_for(logits, cd, nt, V, &ok);
    if (ok) {
        const void *x = ct_tensor_data(logits), *tg = ct_tensor_data(targets);
        bool i64 = targets->dtype == CT_DTYPE_I64;
        if (cd == CT_DTYPE_F64)
            bwd_f64(x, logits->dtype, tg, i64, ignore_index, ct_tensor_data(lse), sc, ct_tensor_data(dlogits),
                    scratch, nt, rows, V);
        else
            bwd_f32(x, logits->dtype, tg, i64, ignore_index, ct_tensor_data(lse), sc, ct_tensor_data(dlogits),
                    scratch, nt, rows, V);
    }
    ct_frame_pop();
    return ok ? CT_OK : ct_last_status();
}

/* ---- reference: every element through double; backward recomputes softmax -- */

/* max and sum exp(x - max) of row r */
static void row_stats(const ct_tensor *x, int64_t r, int64_t V, double *m, double *s)
{
    *m = -INFINITY;
    *s = 0;
    for (int64_t v = 0; v < V; v++)
        if (cti_cpu_load_at(x, r * V + v) > *m) *m = cti_cpu_load_at(x, r * V + v);
    for (int64_t v = 0; v < V; v++) *s += exp(cti_cpu_load_at(x, r * V + v) - *m);
}

ct_status cti_cpu_cross_entropy_ref(const ct_tensor *logits, const ct_tensor *targets, int64_t ignore_index,
                                    ct_tensor *loss, ct_tensor *lse)
{
    int64_t rows = ct_tensor_numel(targets), V = cti_cpu_row_len(logits), count;
    ct_status st = check_targets("cross_entropy", targets, V, ignore_index, &count);
    if (st) return st;
    double sum = 0;
    for (int64_t r = 0; r < rows; r++) {
        double m, s;
        row_stats(logits, r, V, &m, &s);
        if (lse) cti_cpu_store_at(lse, r, m + log(s));
        int64_t t = (int64_t)cti_cpu_load_at(targets, r);
        if (t != ignore_index) sum += m + log(s) - cti_cpu_load_at(logits, r * V + t);
    }
    cti_cpu_store_at(loss, 0, count ? sum / (double)count : NAN);
    return CT_OK;
}

ct_status cti_cpu_cross_entropy_backward_ref(const ct_tensor *dloss, const ct_tensor *logits,
                                             const ct_tensor *targets, const ct_tensor *lse, int64_t ignore_index,
                                             ct_tensor *dlogits)
{
    (void)lse;
    int64_t rows = ct_tensor_numel(targets), V = cti_cpu_row_len(logits), count;
    ct_status st = check_targets("cross_entropy_backward", targets, V, ignore_index, &count);
    if (st) return st;
    double sc = count ? cti_cpu_load_at(dloss, 0) / (double)count : 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = (int64_t)cti_cpu_load_at(targets, r);
        double m, s;
        row_stats(logits, r, V, &m, &s);
        for (int64_t v = 0; v < V; v++) {
            double p = exp(cti_cpu_load_at(logits, r * V + v) - m) / s;
            cti_cpu_store_at(dlogits, r * V + v, t == ignore_index ? 0 : (p - (v == t)) * sc);
        }
    }
    return CT_OK;
}
