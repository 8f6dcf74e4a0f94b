/* ctrain — gradient clipping by global norm and by value (see optim/clip.h).
 *
 * A norm partial is reduced per tensor in fixed blocks of BLOCK elements: each block
 * in double (four interleaved accumulators), the blocks in order, then the tensors
 * in list order, so the bits depend only on the data, never on the thread count. */
#include "optim/clip.h"

#include <math.h>
#include <stdlib.h>

#include "core/frame.h"
#include "core/threads_internal.h"

#define BLOCK 8192
#define PAR_MIN_WORK 32768

typedef enum norm_kind { NORM_SQ, NORM_ABS, NORM_POW, NORM_MAX } norm_kind;

static norm_kind kind_of(double p)
{
    return isinf(p) ? NORM_MAX : p == 2 ? NORM_SQ : p == 1 ? NORM_ABS : NORM_POW;
}

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

static ct_status check_list(const char *op, int n, ct_tensor *const *params)
{
    if (n < 0 || (n > 0 && !params))
        return ct_error_set(CT_ERR_INVALID, "%s: need n >= 0 and an array of n parameters (n = %d, params %s)", op, n,
                            params ? "given" : "NULL");
    for (int i = 0; i < n; i++) {
        const ct_tensor *p = params[i];
        if (!p) return ct_error_set(CT_ERR_INVALID, "%s: parameter %d is NULL", op, i);
        const ct_tensor *g = p->grad;
        if (!g) continue;
        const char *why = g->dtype != CT_DTYPE_F32 && g->dtype != CT_DTYPE_F64 ? "gradients must be f32 or f64"
                          : g->device.type != CT_DEVICE_CPU                  ? "gradients must be on the cpu"
                                                                             : NULL;
        if (why) {
            char pd[200], gd[200];
            return ct_error_set(CT_ERR_INVALID, "%s: parameter %d%s%s%s (%s): grad %s: %s", op, i, p->name ? " '" : "",
                                p->name ? p->name : "", p->name ? "'" : "", ct_tensor_describe(p, pd, sizeof pd),
                                ct_tensor_describe(g, gd, sizeof gd), why);
        }
    }
    return CT_OK;
}

static ct_status check_norm_type(const char *op, double norm_type)
{
    if (!(norm_type > 0))
        return ct_error_set(CT_ERR_INVALID, "%s: norm_type must be > 0 (2, 1, INFINITY, ...), got %g", op, norm_type);
    return CT_OK;
}

static ct_status partial_impl(const char *op, int n, ct_tensor *const *params, double norm_type, double *out)
{
    ct_status st = check_list(op, n, params);
    if (!st) st = check_norm_type(op, norm_type);
    if (st) return st;
    cti_threads_sync();
    const norm_kind k = kind_of(norm_type);
    double acc = 0;
    ct_frame_push();
    for (int i = 0; i < n && !st; i++) {
        if (!params[i]->grad) continue;
        const ct_tensor *g = ct_tensor_contiguous(params[i]->grad);
        double v;
        if (!g || !tensor_partial(g, k, norm_type, &v)) st = ct_error_prefix("%s: ", op);
        else acc = k == NORM_MAX ? max_nan(acc, v) : acc + v;
    }
    ct_frame_pop();
    *out = acc;
    return st;
}

double ct_grad_norm_partial(int n, ct_tensor *const *params, double norm_type)
{
    double v;
    return partial_impl("grad_norm_partial", n, params, norm_type, &v) ? NAN : v;
}

double ct_grad_norm_sq(int n, ct_tensor *const *params)
{
    double v;
    return partial_impl("grad_norm_sq", n, params, 2, &v) ? NAN : v;
}

double ct_grad_norm_from_partial(double partial, double norm_type)
{
    switch (kind_of(norm_type)) {
    case NORM_SQ: return sqrt(partial);
    case NORM_ABS:
    case NORM_MAX: return partial;
    case NORM_POW: break;
    }
    return pow(partial, 1 / norm_type);
}

double ct_grad_norm(int n, ct_tensor *const *params, double norm_type)
{
    double v;
    return partial_impl("grad_norm", n, params, norm_type, &v) ? NAN : ct_grad_norm_from_partial(v, norm_type);
}

double ct_clip_coef(double total_norm, double max_norm)
{
    if (!isfinite(total_norm)) return 1;
    const double c = max_norm / (total_norm + 1e-6);
    return c < 1 ? c : 1;
}

/* Applies f to each grad through a contiguous buffer (the grad itself when it is
 * contiguous, else a copy written back), so any layout works. */
typedef void (*grad_fn)(void *x, int64_t n, bool f64, double a);

static ct_status for_each_grad(const char *op, int n, ct_tensor *const *params, grad_fn f, double a)
{
    cti_threads_sync();
    ct_status st = CT_OK;
    ct_frame_push();
    for (int i = 0; i < n && !st; i++) {
        ct_tensor *g = params[i]->grad;
        if (!g) continue;
        ct_tensor *c = ct_tensor_contiguous(g);
        if (!c) {
            st = ct_error_prefix("%s: ", op);
            break;
        }
        f(ct_tensor_data(c), ct_tensor_numel(c), c->dtype == CT_DTYPE_F64, a);
        if (c != g && (st = ct_tensor_copy_(g, c))) ct_error_prefix("%s: ", op);
    }
    ct_frame_pop();
    return st;
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

ct_status ct_grad_scale(int n, ct_tensor *const *params, double coef)
{
    const char *op = "grad_scale";
    ct_status st = check_list(op, n, params);
    if (st) return st;
    if (!isfinite(coef)) return ct_error_set(CT_ERR_INVALID, "%s: coef must be finite, got %g", op, coef);
    if (coef == 1) return CT_OK;
    return for_each_grad(op, n, params, scale_fn, coef);
}

double ct_clip_grad_norm(int n, ct_tensor *const *params, double max_norm, double norm_type)
{
    const char *op = "clip_grad_norm";
    if (!(max_norm >= 0)) return ct_error_set(CT_ERR_INVALID, "%s: max_norm must be >= 0, got %g", op, max_norm), NAN;
    double partial;
    if (partial_impl(op, n, params, norm_type, &partial)) return NAN;
    const double total = ct_grad_norm_from_partial(partial, norm_type);
    const double coef = ct_clip_coef(total, max_norm);
    if (coef < 1 && for_each_grad(op, n, params, scale_fn, coef)) return NAN;
    return total;
}

ct_status ct_clip_grad_value(int n, ct_tensor *const *params, double clip_value)
{
    const char *op = "clip_grad_value";
    ct_status st = check_list(op, n, params);
    if (st) return st;
    if (!(clip_value >= 0)) return ct_error_set(CT_ERR_INVALID, "%s: clip_value must be >= 0, got %g", op, clip_value);
    return for_each_grad(op, n, params, clamp_fn, clip_value);
}
