/* CPU softmax / log-softmax, forward and backward.
 *
 * A tensor is seen as (outer, C, inner) around the softmax dim. When the dim is
 * the last one (inner == 1) each row of C elements is one task; otherwise a task
 * is a (C, up to BLOCK_COLS) block of one outer slice, and the loops run along
 * the contiguous inner axis so they stay vectorisable. Rows and blocks are
 * independent, so the result does not depend on the thread count.
 *
 * Reductions run over fixed lanes, never in scheduling order. f32 keeps elements
 * in f32, sums in double and takes its exponentials from the vectorisable
 * cti_cpu_expf (kernels/cpu/vmath.h); f64 computes in double with libm; bf16
 * and f16 are widened to f32 buffers, run through the f32 kernel and rounded
 * once.
 */
#include "kernels/cpu/softmax.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/threads.h"
#include "kernels/cpu/rows.h"

#define PAR_MIN 32768  /* elements of work below which a loop stays on one thread */
#define BLOCK_COLS 256 /* inner positions per task when the dim is not the last */

typedef struct geom {
    int64_t outer, C, inner;
} geom;

static geom geometry(const ct_tensor *t, int dim)
{
    geom g = {1, 1, 1};
    if (t->ndim == 0) return g;
    for (int d = 0; d < dim; d++) g.outer *= t->shape[d];
    g.C = t->shape[dim];
    for (int d = dim + 1; d < t->ndim; d++) g.inner *= t->shape[d];
    return g;
}

/* An f32 tensor with t's shape in the current frame, holding t's values when
 * fill is set; NULL (error recorded) when allocation fails. */
static float *f32_buffer(const ct_tensor *t, bool fill)
{
    ct_tensor *b = ct_tensor_empty_on(t->device, CT_DTYPE_F32, t->ndim, t->shape);
    if (!b) return NULL;
    if (fill) cti_cpu_convert_par(CT_DTYPE_F32, ct_tensor_data(b), t->dtype, ct_tensor_data(t), ct_tensor_numel(t));
    return ct_tensor_data(b);
}

/* ---- fast kernels, generated for T = float and T = double ------------------
 *
 * forward, per row (or per column of a block), m = max x:
 *   softmax      y = exp(x - m) * (1 / s),  s = sum exp(x - m) in double
 *   log_softmax  y = (x - m) - log(s)       ((x - m) first: exact near the max)
 * backward, y the forward output, both overwrite dx:
 *   softmax      dx = y * (dy - sum(dy * y))
 *   log_softmax  dx = dy - exp(y) * sum(dy)
 * The exponentials come from the row helpers in kernels/cpu/softmax.h.
 */
#define DEFINE_SOFTMAX_KERNELS(T, SUF)                                                                       \
    /* sum a[i] * b[i] (b NULL: sum a[i]) over 8 double lanes */                                             \
    static inline double row_dot_##SUF(const T *restrict a, const T *restrict b, int64_t n)                  \
    {                                                                                                        \
        double acc[8] = {0}, s = 0;                                                                          \
        int64_t i = 0;                                                                                       \
        if (b) {                                                                                             \
            for (; i + 8 <= n; i += 8)                                                                       \
                for (int k = 0; k < 8; k++) acc[k] += (double)a[i + k] * b[i + k];                           \
            for (; i < n; i++) s += (double)a[i] * b[i];                                                     \
        } else {                                                                                             \
            for (; i + 8 <= n; i += 8)                                                                       \
                for (int k = 0; k < 8; k++) acc[k] += a[i + k];                                              \
            for (; i < n; i++) s += a[i];                                                                    \
        }                                                                                                    \
        for (int k = 0; k < 8; k++) s += acc[k];                                                             \
        return s;                                                                                            \
    }                                                                                                        \
                                                                                                             \
    static void fwd_rows_##SUF(const T *restrict x, T *restrict y, int64_t rows, int64_t C, bool lg)         \
    {                                                                                                        \
        _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (rows * C > PAR_MIN)") \
        for (int64_t r = 0; r < rows; r++) {                                                                 \
            const T *restrict xr = x + r * C;                                                                \
            T *restrict yr = y + r * C;                                                                      \
            T m = cti_cpu_row_max_##SUF(xr, C);                                                              \
            if (lg) {                                                                                        \
                T ls = (T)log(cti_cpu_expsum_##SUF(xr, m, NULL, C));                                         \
                for (int64_t i = 0; i < C; i++) yr[i] = (xr[i] - m) - ls;                                    \
            } else {                                                                                         \
                T inv = (T)(1.0 / cti_cpu_expsum_##SUF(xr, m, yr, C));                                       \
                for (int64_t i = 0; i < C; i++) yr[i] *= inv;                                                \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
                                                                                                             \
    static void fwd_cols_##SUF(const T *restrict x, T *restrict y, geom g, bool lg)                          \
    {                                                                                                        \
        int64_t nb = (g.inner + BLOCK_COLS - 1) / BLOCK_COLS, tasks = g.outer * nb;                          \
        _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (g.outer * g.C * g.inner > PAR_MIN)") \
        for (int64_t t = 0; t < tasks; t++) {                                                                \
            int64_t j0 = (t % nb) * BLOCK_COLS, w = g.inner - j0 < BLOCK_COLS ? g.inner - j0 : BLOCK_COLS;   \
            int64_t base = (t / nb) * g.C * g.inner + j0;                                                    \
            T m[BLOCK_COLS], f[BLOCK_COLS];                                                                  \
            double s[BLOCK_COLS];                                                                            \
            for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, s[j] = 0;                                      \
            for (int64_t c = 0; c < g.C; c++) {                                                              \
                const T *restrict xc = x + base + c * g.inner;                                               \
                for (int64_t j = 0; j < w; j++) m[j] = xc[j] > m[j] ? xc[j] : m[j];                          \
            }                                                                                                \
            for (int64_t c = 0; c < g.C; c++) {                                                              \
                /* log_softmax only needs the sums: the exponentials go to f, reused as scratch */           \
                T *restrict e = lg ? f : y + base + c * g.inner;                                             \
                cti_cpu_exp_sub_##SUF(x + base + c * g.inner, m, e, w);                                      \
                for (int64_t j = 0; j < w; j++) s[j] += e[j];                                                \
            }                                                                                                \
            for (int64_t j = 0; j < w; j++) f[j] = lg ? (T)log(s[j]) : (T)(1.0 / s[j]);                      \
            for (int64_t c = 0; c < g.C; c++) {                                                              \
                const T *restrict xc = x + base + c * g.inner;                                               \
                T *restrict yc = y + base + c * g.inner;                                                     \
                if (lg)                                                                                      \
                    for (int64_t j = 0; j < w; j++) yc[j] = (xc[j] - m[j]) - f[j];                           \
                else                                                                                         \
                    for (int64_t j = 0; j < w; j++) yc[j] *= f[j];                                           \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
                                                                                                             \
    static void bwd_rows_##SUF(const T *restrict dy, const T *restrict y, T *restrict dx, int64_t rows,     \
                               int64_t C, bool lg)                                                           \
    {                                                                                                        \
        _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (rows * C > PAR_MIN)") \
        for (int64_t r = 0; r < rows; r++) {                                                                 \
            const T *restrict dyr = dy + r * C, *restrict yr = y + r * C;                                    \
            T *restrict dxr = dx + r * C;                                                                    \
            T st = (T)row_dot_##SUF(dyr, lg ? NULL : yr, C);                                                 \
            if (lg) {                                                                                        \
                cti_cpu_expsum_##SUF(yr, 0, dxr, C); /* dx = exp(y) first */                                 \
                for (int64_t i = 0; i < C; i++) dxr[i] = dyr[i] - dxr[i] * st;                               \
            } else {                                                                                         \
                for (int64_t i = 0; i < C; i++) dxr[i] = yr[i] * (dyr[i] - st);                              \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
                                                                                                             \
    static void bwd_cols_##SUF(const T *restrict dy, const T *restrict y, T *restrict dx, geom g, bool lg)   \
    {                                                                                                        \
        int64_t nb = (g.inner + BLOCK_COLS - 1) / BLOCK_COLS, tasks = g.outer * nb;                          \
        _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (g.outer * g.C * g.inner > PAR_MIN)") \
        for (int64_t t = 0; t < tasks; t++) {                                                                \
            int64_t j0 = (t % nb) * BLOCK_COLS, w = g.inner - j0 < BLOCK_COLS ? g.inner - j0 : BLOCK_COLS;   \
            int64_t base = (t / nb) * g.C * g.inner + j0;                                                    \
            double s[BLOCK_COLS];                                                                            \
            T st[BLOCK_COLS];                                                                                \
            for (int64_t j = 0; j < w; j++) s[j] = 0;                                                        \
            for (int64_t c = 0; c < g.C; c++) {                                                              \
                const T *restrict dyc = dy + base + c * g.inner, *restrict yc = y + base + c * g.inner;      \
                if (lg)                                                                                      \
                    for (int64_t j = 0; j < w; j++) s[j] += dyc[j];                                          \
                else                                                                                         \
                    for (int64_t j = 0; j < w; j++) s[j] += (double)dyc[j] * yc[j];                          \
            }                                                                                                \
            for (int64_t j = 0; j < w; j++) st[j] = (T)s[j];                                                 \
            for (int64_t c = 0; c < g.C; c++) {                                                              \
                const T *restrict dyc = dy + base + c * g.inner, *restrict yc = y + base + c * g.inner;      \
                T *restrict dxc = dx + base + c * g.inner;                                                   \
                if (lg) {                                                                                    \
                    cti_cpu_expsum_##SUF(yc, 0, dxc, w);                                                     \
                    for (int64_t j = 0; j < w; j++) dxc[j] = dyc[j] - dxc[j] * st[j];                        \
                } else {                                                                                     \
                    for (int64_t j = 0; j < w; j++) dxc[j] = yc[j] * (dyc[j] - st[j]);                       \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }

DEFINE_SOFTMAX_KERNELS(float, f32)
DEFINE_SOFTMAX_KERNELS(double, f64)

static void fwd_f32(const float *x, float *y, geom g, bool lg)
{
    if (g.inner == 1) fwd_rows_f32(x, y, g.outer, g.C, lg);
    else fwd_cols_f32(x, y, g, lg);
}

static void bwd_f32(const float *dy, const float *y, float *dx, geom g, bool lg)
{
    if (g.inner == 1) bwd_rows_f32(dy, y, dx, g.outer, g.C, lg);
    else bwd_cols_f32(dy, y, dx, g, lg);
}

static ct_status softmax_fast(const ct_tensor *x, ct_tensor *y, int dim, bool lg)
{
    geom g = geometry(x, dim);
    if (ct_tensor_numel(x) == 0) return CT_OK;
    switch (x->dtype) {
    case CT_DTYPE_F64:
        if (g.inner == 1) fwd_rows_f64(ct_tensor_data(x), ct_tensor_data(y), g.outer, g.C, lg);
        else fwd_cols_f64(ct_tensor_data(x), ct_tensor_data(y), g, lg);
        return CT_OK;
    case CT_DTYPE_F32:
        fwd_f32(ct_tensor_data(x), ct_tensor_data(y), g, lg);
        return CT_OK;
    default: {
        ct_status st = CT_OK;
        ct_frame_push();
        float *xf = f32_buffer(x, true), *yf = f32_buffer(x, false);
        if (xf && yf) {
            fwd_f32(xf, yf, g, lg);
            cti_cpu_convert_par(y->dtype, ct_tensor_data(y), CT_DTYPE_F32, yf, ct_tensor_numel(y));
        } else {
            st = ct_last_status();
        }
        ct_frame_pop();
        return st;
    }
    }
}

static ct_status softmax_backward_fast(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim, bool lg)
{
    geom g = geometry(y, dim);
    if (ct_tensor_numel(y) == 0) return CT_OK;
    switch (y->dtype) {
    case CT_DTYPE_F64:
        if (g.inner == 1) bwd_rows_f64(ct_tensor_data(dy), ct_tensor_data(y), ct_tensor_data(dx), g.outer, g.C, lg);
        else bwd_cols_f64(ct_tensor_data(dy), ct_tensor_data(y), ct_tensor_data(dx), g, lg);
        return CT_OK;
    case CT_DTYPE_F32:
        bwd_f32(ct_tensor_data(dy), ct_tensor_data(y), ct_tensor_data(dx), g, lg);
        return CT_OK;
    default: {
        ct_status st = CT_OK;
        ct_frame_push();
        float *dyf = f32_buffer(dy, true), *yf = f32_buffer(y, true), *dxf = f32_buffer(y, false);
        if (dyf && yf && dxf) {
            bwd_f32(dyf, yf, dxf, g, lg);
            cti_cpu_convert_par(dx->dtype, ct_tensor_data(dx), CT_DTYPE_F32, dxf, ct_tensor_numel(dx));
        } else {
            st = ct_last_status();
        }
        ct_frame_pop();
        return st;
    }
    }
}

ct_status cti_cpu_softmax(const ct_tensor *x, ct_tensor *y, int dim) { return softmax_fast(x, y, dim, false); }
ct_status cti_cpu_log_softmax(const ct_tensor *x, ct_tensor *y, int dim) { return softmax_fast(x, y, dim, true); }

ct_status cti_cpu_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim)
{
    return softmax_backward_fast(dy, y, dx, dim, false);
}

ct_status cti_cpu_log_softmax_backward(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim)
{
    return softmax_backward_fast(dy, y, dx, dim, true);
}

/* ---- reference: one (outer, inner) line at a time, every element through double */

static ct_status softmax_ref(const ct_tensor *x, ct_tensor *y, int dim, bool lg)
{
    geom g = geometry(x, dim);
    for (int64_t o = 0; o < g.outer; o++) {
        for (int64_t j = 0; j < g.inner; j++) {
            int64_t base = o * g.C * g.inner + j;
            double m = -INFINITY, s = 0;
            for (int64_t c = 0; c < g.C; c++)
                if (cti_cpu_load_at(x, base + c * g.inner) > m) m = cti_cpu_load_at(x, base + c * g.inner);
            for (int64_t c = 0; c < g.C; c++) s += exp(cti_cpu_load_at(x, base + c * g.inner) - m);
            for (int64_t c = 0; c < g.C; c++) {
                double v = cti_cpu_load_at(x, base + c * g.inner) - m;
                cti_cpu_store_at(y, base + c * g.inner, lg ? v - log(s) : exp(v) / s);
            }
        }
    }
    return CT_OK;
}

static ct_status softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim, bool lg)
{
    geom g = geometry(y, dim);
    for (int64_t o = 0; o < g.outer; o++) {
        for (int64_t j = 0; j < g.inner; j++) {
            int64_t base = o * g.C * g.inner + j;
            double s = 0;
            for (int64_t c = 0; c < g.C; c++) {
                int64_t i = base + c * g.inner;
                s += lg ? cti_cpu_load_at(dy, i) : cti_cpu_load_at(dy, i) * cti_cpu_load_at(y, i);
            }
            for (int64_t c = 0; c < g.C; c++) {
                int64_t i = base + c * g.inner;
                double dyi = cti_cpu_load_at(dy, i), yi = cti_cpu_load_at(y, i);
                cti_cpu_store_at(dx, i, lg ? dyi - exp(yi) * s : yi * (dyi - s));
            }
        }
    }
    return CT_OK;
}

ct_status cti_cpu_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim) { return softmax_ref(x, y, dim, false); }
ct_status cti_cpu_log_softmax_ref(const ct_tensor *x, ct_tensor *y, int dim) { return softmax_ref(x, y, dim, true); }

ct_status cti_cpu_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim)
{
    return softmax_backward_ref(dy, y, dx, dim, false);
}

ct_status cti_cpu_log_softmax_backward_ref(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim)
{
    return softmax_backward_ref(dy, y, dx, dim, true);
}
