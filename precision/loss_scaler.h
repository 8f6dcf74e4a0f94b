/* ctrain — the dynamic loss scaler of fp16 training.
 *
 *     ct_loss_scaler s;
 *     ct_loss_scaler_init(&s, NULL);                      65536, x2 after 2000, x0.5
 *     loss * ct_loss_scaler_scale(&s) -> backward          small fp16 gradients survive
 *     (DDP: the gradients are all-reduced here)
 *     ct_loss_scaler_unscale(&s, n, grads, &found_inf)     grads /= scale, once per step
 *     if (!ct_loss_scaler_update(&s, found_inf)) optimizer step;   else the step is skipped
 *
 * The update, per optimizer step (as torch.cuda.amp.GradScaler and DeepSpeed):
 *   - an inf or NaN anywhere in the (all-reduced) gradients: the step is skipped and,
 *     once `hysteresis` such steps have come since the last clean one, the scale is
 *     multiplied by backoff_factor (never below min_scale); the count of clean steps
 *     starts again;
 *   - a clean step: after growth_interval clean steps in a row the scale is multiplied
 *     by growth_factor (never above max_scale) and the count starts again.
 * Unscaling multiplies every gradient by 1 / scale in f32 and looks for non-finite
 * values in the same pass; a second unscale in the same step is an error (clipping
 * must see unscaled gradients exactly once).
 */
#ifndef CT_PRECISION_LOSS_SCALER_H
#define CT_PRECISION_LOSS_SCALER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"
#include "core/tensor.h"

/* Zero means default for every field. */
typedef struct ct_loss_scaler_config {
    double init_scale;     /* default 65536 (2^16) */
    double growth_factor;  /* default 2; > 1 */
    double backoff_factor; /* default 0.5; in (0, 1) */
    int growth_interval;   /* default 2000 clean steps; >= 1 */
    int hysteresis;        /* default 1: back off at the first overflow (DeepSpeed's default is 2) */
    double min_scale;      /* default 2^-24 */
    double max_scale;      /* default 2^24 */
} ct_loss_scaler_config;

typedef struct ct_loss_scaler {
    ct_loss_scaler_config cfg; /* resolved */
    double scale;
    int good_steps;   /* clean steps since the last growth or overflow */
    int overflows;    /* overflowing steps since the last clean one */
    bool unscaled;    /* unscale ran in this step */
    bool last_skipped;
    int64_t steps, skipped; /* updates so far; of which skipped */
} ct_loss_scaler;

/* CT_ERR_INVALID naming the field, its value and the allowed range. */
CT_API ct_status ct_loss_scaler_init(ct_loss_scaler *s, const ct_loss_scaler_config *cfg);
/* The current loss scale. */
CT_API double ct_loss_scaler_scale(const ct_loss_scaler *s);
/* grads[i] *= 1 / scale for the f32 contiguous CPU gradients (NULL entries skipped);
 * *found_inf: some value is inf or NaN (after unscaling). CT_ERR_INVALID for another
 * dtype or layout, or a second call in one step. */
CT_API ct_status ct_loss_scaler_unscale(ct_loss_scaler *s, int n, ct_tensor *const *grads, bool *found_inf);
/* Ends the step: returns true when its optimizer step must be skipped (found_inf),
 * and updates the scale as above. */
CT_API bool ct_loss_scaler_update(ct_loss_scaler *s, bool found_inf);
/* Whether the last update skipped its step. */
CT_API bool ct_loss_scaler_step_was_skipped(const ct_loss_scaler *s);

#endif
