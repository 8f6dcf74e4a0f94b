/* CPU kernels over gradient lists (kernels/foreach.h): norm partials, scaling,
 * clamping and the fp16 unscale.
 *
 * A norm partial is reduced in fixed blocks of BLOCK elements: each block in double
 * (four interleaved accumulators), the blocks in order, so the bits depend only on
 * the data, never on the thread count. */
#include "kernels/cpu/foreach.h"

#include <math.h>
#include <stdlib.h>

#include "core/threads.h"

#define BLOCK 8192
#define PAR_MIN_WORK 32768

typedef enum norm_kind { NORM_SQ, NORM_ABS, NORM_POW, NORM_MAX } norm_kind;

/* a > m or a is NaN: the max that keeps a NaN once it has seen one */
static inline double max_nan(double m, double a) { return a > m || a != a ? a : m; }

// x (n) -> one partial: sum x^2 | sum |x| | sum |x|^p | max |x|, accumulated in double
#define BLOCK_PARTIAL(T)                                                                         \
    static double block_partial_##T(const T *x, int64_t n, norm_kind k, double p)                \
    {                                                                                            \
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                                   \
        int64_t i = 0;                                                                           \
        switch (k) {                                                                             \
        case NORM_SQ:                                                                            \
            for (; i + 4 <= n; i += 4) {                                                         \
                const double a = x[i], b = x[i + 1], c = x[i + 2], d = x[i + 3];                 \
                s0 += a * a, s1 += b * b, s2 += c * c, s3 += d * d;                              \
            }                                                                                    \
            for (; i < n; i++) s0 += (double)x[i] * x[i];                                        \
            break;                                                                               \
        case NORM_ABS:                                                                           \
            for (; i + 4 <= n; i += 4) {                                                         \
                s0 += fabs((double)x[i]), s1 += fabs((double)x[i + 1]);                          \
                s2 += fabs((double)x[i + 2]), s3 += fabs((double)x[i + 3]);                      \
            }                                                                                    \
            for (; i < n; i++) s0 += fabs((double)x[i]);                                         \
            break;                                                                               \
        case NORM_POW:                                                                           \
            for (; i < n; i++) s0 += pow(fabs((double)x[i]), p);                                 \
            break;                                                                               \
        case NORM_MAX:                                                                           \
            for (; i < n; i++) s0 = max_nan(s0, fabs((double)x[i]));                             \
            return s0;                                                                           \
        }                                                                                        \
        return (s0 + s1) + (s2 + s3);                                                            \
    }
BLOCK_PARTIAL(float)
BLOCK_PARTIAL(double)

/* The partial of one contiguous f32/f64 tensor; false + error on no memory. */
static bool tensor_partial(const ct_tensor *g, norm_kind k, double p, double *out)
{
    const int64_t n = ct_tensor_numel(g), nb = (n + BLOCK - 1) / BLOCK;
    const void *data = ct_tensor_data(g);
    const bool f64 = g->dtype == CT_DTYPE_F64;
    if (nb <= 1) {
        *out = f64 ? block_partial_double(data, n, k, p) : block_partial_float(data, n, k, p);
        return true;
    }
    double *parts = malloc((size_t)nb * sizeof *parts);
    if (!parts) return ct_error_set(CT_ERR_NOMEM, "grad_norm: out of memory for %lld blocks", (long long)nb), false;
#pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN_WORK)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * BLOCK, len = lo + BLOCK <= n ? BLOCK : n - lo;
        parts[b] = f64 ? block_partial_double((const double *)data + lo, len, k, p)
                       : block_partial_float((const float *)data + lo, len, k, p);
    }
    double acc = 0;
    for (int64_t b = 0; b < nb; b++) acc = k == NORM_MAX ? max_nan(acc, parts[b]) : acc + parts[b];
    free(parts);
    *out = acc;
    return true;
}


ct_status cti_cpu_norm_partial(const ct_tensor *x, int kind, double p, double *out)
{
    return tensor_partial(x, (norm_kind)kind, p, out) ? CT_OK : ct_last_status();
}

ct_status cti_cpu_norm_partial_ref(const ct_tensor *x, int kind, double p, double *out)
{
    const int64_t n = ct_tensor_numel(x);
    const void *data = ct_tensor_data(x);
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = fabs(x->dtype == CT_DTYPE_F64 ? ((const double *)data)[i] : (double)((const float *)data)[i]);
        switch ((norm_kind)kind) {
        case NORM_SQ: acc += v * v; break;
        case NORM_ABS: acc += v; break;
        case NORM_POW: acc += pow(v, p); break;
        case NORM_MAX: acc = max_nan(acc, v); break;
        }
    }
    *out = acc;
    return CT_OK;
}

// x (n) -> x * coef, in x's own precision (the PyTorch mul_ of a same-dtype scalar)
static void scale_fn(void *x, int64_t n, bool f64, double coef)
{
    if (f64) {
        double *d = x;
#pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN_WORK)
        for (int64_t i = 0; i < n; i++) d[i] *= coef;
    } else {
        float *d = x;
        const float c = (float)coef;
#pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN_WORK)
        for (int64_t i = 0; i < n; i++) d[i] *= c;
    }
}

// x (n) -> clamp(x, -v, v); a NaN compares false both ways and is kept
static void clamp_fn(void *x, int64_t n, bool f64, double v)
{
    if (f64) {
        double *d = x;
#pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN_WORK)
        for (int64_t i = 0; i < n; i++) d[i] = d[i] > v ? v : d[i] < -v ? -v : d[i];
    } else {
        float *d = x;
        const float c = (float)v;
#pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN_WORK)
        for (int64_t i = 0; i < n; i++) d[i] = d[i] > c ? c : d[i] < -c ? -c : d[i];
    }
}

ct_status cti_cpu_scale_(ct_tensor *x, double coef)
{
    scale_fn(ct_tensor_data(x), ct_tensor_numel(x), x->dtype == CT_DTYPE_F64, coef);
    return CT_OK;
}

ct_status cti_cpu_clamp_abs_(ct_tensor *x, double v)
{
    clamp_fn(ct_tensor_data(x), ct_tensor_numel(x), x->dtype == CT_DTYPE_F64, v);
    return CT_OK;
}

ct_status cti_cpu_unscale_(int n, ct_tensor *const *grads, float inv, bool *found_inf)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!grads[i]) continue;
        float *p = ct_tensor_data(grads[i]);
        int64_t m = ct_tensor_numel(grads[i]);
        #pragma omp parallel for reduction(| : bad) schedule(static) if (m > 65536)
        for (int64_t j = 0; j < m; j++) {
            float v = p[j] * inv;
            p[j] = v;
            bad |= !isfinite(v);
        }
    }
    *found_inf = bad != 0;
    return CT_OK;
}
