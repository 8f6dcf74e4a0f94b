/* ctrain — gradient clipping by global norm and by value (see optim/clip.h).
 *
 * A norm partial is reduced per tensor (kernels/foreach.h: fixed blocks, in
 * double), then the tensors in list order, so the bits depend only on the data,
 * never on the thread count or the device. */
#include "optim/clip.h"

#include <math.h>
#include <stdlib.h>

#include "core/frame.h"
#include "core/threads_internal.h"
#include "kernels/foreach.h"

typedef enum norm_kind { NORM_SQ, NORM_ABS, NORM_POW, NORM_MAX } norm_kind;

static norm_kind kind_of(double p)
{
    return isinf(p) ? NORM_MAX : p == 2 ? NORM_SQ : p == 1 ? NORM_ABS : NORM_POW;
}

/* a > m or a is NaN: the max that keeps a NaN once it has seen one */
static inline double max_nan(double m, double a) { return a > m || a != a ? a : m; }

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
        const char *why = g->dtype != CT_DTYPE_F32 && g->dtype != CT_DTYPE_F64 ? "gradients must be f32 or f64" : NULL;
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
        if (!g || ct_kernel_norm_partial(g, norm_type, &v)) st = ct_error_prefix("%s: ", op);
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
typedef ct_status (*grad_fn)(ct_tensor *x, double a);

static ct_status for_each_grad(const char *op, int n, ct_tensor *const *params, grad_fn f, double a)
{
    ct_status st = CT_OK;
    ct_frame_push();
    for (int i = 0; i < n && !st; i++) {
        ct_tensor *g = params[i]->grad;
        if (!g) continue;
        ct_tensor *c = ct_tensor_contiguous(g);
        if (!c || (st = f(c, a))) {
            st = ct_error_prefix("%s: ", op);
            break;
        }
        if (c != g && (st = ct_tensor_copy_(g, c))) ct_error_prefix("%s: ", op);
    }
    ct_frame_pop();
    return st;
}

ct_status ct_grad_scale(int n, ct_tensor *const *params, double coef)
{
    const char *op = "grad_scale";
    ct_status st = check_list(op, n, params);
    if (st) return st;
    if (!isfinite(coef)) return ct_error_set(CT_ERR_INVALID, "%s: coef must be finite, got %g", op, coef);
    if (coef == 1) return CT_OK;
    return for_each_grad(op, n, params, ct_kernel_scale_, coef);
}

double ct_clip_grad_norm(int n, ct_tensor *const *params, double max_norm, double norm_type)
{
    const char *op = "clip_grad_norm";
    if (!(max_norm >= 0)) return ct_error_set(CT_ERR_INVALID, "%s: max_norm must be >= 0, got %g", op, max_norm), NAN;
    double partial;
    if (partial_impl(op, n, params, norm_type, &partial)) return NAN;
    const double total = ct_grad_norm_from_partial(partial, norm_type);
    const double coef = ct_clip_coef(total, max_norm);
    if (coef < 1 && for_each_grad(op, n, params, ct_kernel_scale_, coef)) return NAN;
    return total;
}

ct_status ct_clip_grad_value(int n, ct_tensor *const *params, double clip_value)
{
    const char *op = "clip_grad_value";
    ct_status st = check_list(op, n, params);
    if (st) return st;
    if (!(clip_value >= 0)) return ct_error_set(CT_ERR_INVALID, "%s: clip_value must be >= 0, got %g", op, clip_value);
    return for_each_grad(op, n, params, ct_kernel_clamp_abs_, clip_value);
}
