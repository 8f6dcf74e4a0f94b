/* The dynamic loss scaler; the rules are in precision/loss_scaler.h. */
#include <math.h>
#include <stdio.h>

#include "precision/loss_scaler.h"

#include "kernels/foreach.h"

ct_status ct_loss_scaler_init(ct_loss_scaler *s, const ct_loss_scaler_config *cfg)
{
    ct_loss_scaler_config c = cfg ? *cfg : (ct_loss_scaler_config){0};
    if (c.init_scale == 0) c.init_scale = 65536.0;
    if (c.growth_factor == 0) c.growth_factor = 2.0;
    if (c.backoff_factor == 0) c.backoff_factor = 0.5;
    if (c.growth_interval == 0) c.growth_interval = 2000;
    if (c.hysteresis == 0) c.hysteresis = 1;
    if (c.min_scale == 0) c.min_scale = ldexp(1.0, -24);
    if (c.max_scale == 0) c.max_scale = ldexp(1.0, 24);
    const char *bad = NULL;
    double v = 0;
    char want[64] = "";
    if (!(c.min_scale > 0 && isfinite(c.min_scale))) bad = "min_scale", v = c.min_scale, snprintf(want, sizeof want, "> 0");
    else if (!(c.max_scale >= c.min_scale && isfinite(c.max_scale)))
        bad = "max_scale", v = c.max_scale, snprintf(want, sizeof want, ">= min_scale %g, finite", c.min_scale);
    else if (!(c.init_scale >= c.min_scale && c.init_scale <= c.max_scale))
        bad = "init_scale", v = c.init_scale, snprintf(want, sizeof want, "in %g .. %g", c.min_scale, c.max_scale);
    else if (!(c.growth_factor > 1 && isfinite(c.growth_factor)))
        bad = "growth_factor", v = c.growth_factor, snprintf(want, sizeof want, "> 1");
    else if (!(c.backoff_factor > 0 && c.backoff_factor < 1))
        bad = "backoff_factor", v = c.backoff_factor, snprintf(want, sizeof want, "in (0, 1)");
    else if (c.growth_interval < 1) bad = "growth_interval", v = c.growth_interval, snprintf(want, sizeof want, ">= 1");
    else if (c.hysteresis < 1) bad = "hysteresis", v = c.hysteresis, snprintf(want, sizeof want, ">= 1");
    if (bad) return ct_error_set(CT_ERR_INVALID, "loss_scaler: %s = %g; want %s", bad, v, want);
    *s = (ct_loss_scaler){.cfg = c, .scale = c.init_scale};
    return CT_OK;
}

double ct_loss_scaler_scale(const ct_loss_scaler *s) { return s ? s->scale : 1.0; }

ct_status ct_loss_scaler_unscale(ct_loss_scaler *s, int n, ct_tensor *const *grads, bool *found_inf)
{
    char d[128];
    if (s->unscaled)
        return ct_error_set(CT_ERR_INVALID,
                            "loss_scaler_unscale: the gradients of this step are unscaled already (clip first, then "
                            "step: unscale runs once per step)");
    for (int i = 0; i < n; i++) {
        const ct_tensor *g = grads[i];
        if (g && (g->dtype != CT_DTYPE_F32 || !ct_tensor_is_contiguous(g)))
            return ct_error_set(CT_ERR_INVALID, "loss_scaler_unscale: gradient %d is %s; want f32, contiguous", i,
                                ct_tensor_describe(g, d, sizeof d));
    }
    /* 1 / scale in f32: scales are powers of two unless configured otherwise, so this
     * is usually exact */
    float inv = (float)(1.0 / s->scale);
    bool bad = false;
    /* one pass per gradient on its device; a GPU list costs one host sync in all */
    if (ct_kernel_unscale_(n, grads, inv, &bad)) return ct_error_prefix("loss_scaler_unscale: ");
    s->unscaled = true;
    *found_inf = bad;
    return CT_OK;
}

bool ct_loss_scaler_update(ct_loss_scaler *s, bool found_inf)
{
    const ct_loss_scaler_config *c = &s->cfg;
    s->steps++;
    s->unscaled = false;
    s->last_skipped = found_inf;
    if (found_inf) {
        s->skipped++;
        s->good_steps = 0;
        if (++s->overflows >= c->hysteresis) {
            s->scale = fmax(s->scale * c->backoff_factor, c->min_scale);
            s->overflows = 0;
        }
        return true;
    }
    s->overflows = 0;
    if (++s->good_steps >= c->growth_interval) {
        s->scale = fmin(s->scale * c->growth_factor, c->max_scale);
        s->good_steps = 0;
    }
    return false;
}

bool ct_loss_scaler_step_was_skipped(const ct_loss_scaler *s) { return s && s->last_skipped; }
