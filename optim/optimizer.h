/* ctrain — optimizers: SGD (momentum, dampening, nesterov), Adam and AdamW.
 *
 * The update math is PyTorch's torch.optim.SGD / Adam / AdamW (see kernels/optim.h);
 * each parameter is updated by one fused pass of ct_kernel_sgd / ct_kernel_adamw.
 *
 * Parameters. A parameter is a contiguous f32 or f64 CPU tensor whose `grad` field
 * (core/tensor.h) holds its gradient (same shape and dtype, any layout) or NULL.
 * The optimizer retains every parameter (ct_tensor_retain) and releases it in
 * ct_optimizer_free, so a caller may drop its own references. A tensor may belong
 * to one group of one optimizer only once.
 *
 * Groups. Parameters are held in groups, as PyTorch's param_groups: ct_*_new makes
 * group 0, ct_optimizer_add_group appends more (typically biases and norm weights
 * without weight decay). Parameters are indexed 0..count-1 across the groups in the
 * order they were added; saved state uses those indices.
 *
 * Learning rate. The optimizer has one base lr (ct_optimizer_lr, ct_optimizer_set_lr,
 * what a schedule drives); a group's lr is lr_scale * base lr, so a group keeps its
 * ratio to the base when the base changes.
 *
 * State. Moments and momentum buffers are allocated on a parameter's first step
 * with a gradient and are owned by the optimizer (never in a frame). As in PyTorch,
 * each parameter counts its own steps: a parameter skipped (grad NULL) does not
 * advance its Adam bias correction, and SGD's momentum buffer starts as the first
 * gradient the parameter actually receives.
 *
 * Errors. Constructors return NULL, other calls a non-zero ct_status, with a message
 * (ct_last_error) naming the call, the parameter (index and name when set), shapes,
 * dtypes and the offending value. A failing step or load changes nothing.
 *
 * An optimizer is not thread-safe: one thread steps it at a time.
 */
#ifndef CT_OPTIM_OPTIMIZER_H
#define CT_OPTIM_OPTIMIZER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"
#include "core/tensor.h"

typedef struct ct_optimizer ct_optimizer; /* handle */

/* Fields left 0 take the default given beside them (PyTorch's defaults). */
typedef struct ct_sgd_config {
    double lr;           /* 0 = 1e-3 */
    double momentum;     /* 0 = no momentum buffer */
    double dampening;    /* 0 = none */
    double weight_decay; /* L2, added to the gradient: g += wd * p; 0 = none */
    bool nesterov;       /* needs momentum > 0 and dampening 0 */
} ct_sgd_config;

typedef struct ct_adam_config {
    double lr;           /* 0 = 1e-3 */
    double beta1;        /* 0 = 0.9 */
    double beta2;        /* 0 = 0.999 */
    double eps;          /* 0 = 1e-8 */
    double weight_decay; /* Adam: L2 added to the gradient, 0 = none.
                          * AdamW: decoupled (p *= 1 - lr * wd), 0 = 0.01. AdamW with no
                          * decay at all is Adam with weight_decay 0 (the same update). */
} ct_adam_config;

typedef ct_adam_config ct_adamw_config;

typedef struct ct_param_group_config {
    double lr_scale;      /* the group's lr = lr_scale * the optimizer's lr; 0 = 1 */
    double weight_decay;  /* > 0: the group's weight decay; 0 = the optimizer's */
    bool no_weight_decay; /* true: no weight decay in this group (weight_decay must be 0) */
} ct_param_group_config;

/* New optimizers over n parameters (group 0); cfg NULL = all defaults. n may be 0
 * (params may then be NULL) when every group is added later. The caller owns the
 * handle (ct_optimizer_free). NULL + error on a bad parameter or config. */
CT_API ct_optimizer *ct_sgd_new(int n, ct_tensor *const *params, const ct_sgd_config *cfg);
CT_API ct_optimizer *ct_adam_new(int n, ct_tensor *const *params, const ct_adam_config *cfg);
CT_API ct_optimizer *ct_adamw_new(int n, ct_tensor *const *params, const ct_adamw_config *cfg);

/* Appends a group of n parameters; g NULL = lr_scale 1 and the optimizer's weight
 * decay. Nothing is added on error. */
CT_API ct_status ct_optimizer_add_group(ct_optimizer *o, int n, ct_tensor *const *params,
                                        const ct_param_group_config *g);

/* One update of every parameter whose grad is not NULL; the others are skipped, as
 * PyTorch does. Every gradient is checked (shape, dtype, device) before any
 * parameter is touched. Step count + 1 on success. */
CT_API ct_status ct_optimizer_step(ct_optimizer *o);

/* Releases every parameter's grad and sets it to NULL (PyTorch's set_to_none). */
CT_API void ct_optimizer_zero_grad(ct_optimizer *o);

/* The base lr (finite, >= 0); each group runs at lr_scale * lr. */
CT_API ct_status ct_optimizer_set_lr(ct_optimizer *o, double lr);
CT_API double ct_optimizer_lr(const ct_optimizer *o);
/* Successful ct_optimizer_step calls so far (restored by ct_optimizer_load). */
CT_API int64_t ct_optimizer_step_count(const ct_optimizer *o);
/* "sgd", "adam" or "adamw". Static string. */
CT_API const char *ct_optimizer_name(const ct_optimizer *o);

/* Number of parameters o updates, over every group. */
CT_API int ct_optimizer_param_count(const ct_optimizer *o);
/* Parameter i (0-based across the groups). Borrowed; NULL + error when out of range. */
CT_API ct_tensor *ct_optimizer_param(const ct_optimizer *o, int i);
/* Number of parameter groups (at least 1). */
CT_API int ct_optimizer_group_count(const ct_optimizer *o);
/* Group g's current lr (lr_scale * base lr) and weight decay; NAN + error when out of range. */
CT_API double ct_optimizer_group_lr(const ct_optimizer *o, int g);
CT_API double ct_optimizer_group_weight_decay(const ct_optimizer *o, int g);
/* Parameter i's state tensor "exp_avg", "exp_avg_sq" (Adam, AdamW) or
 * "momentum_buffer" (SGD with momentum). Borrowed: owned by the optimizer, valid until
 * the next load or free. NULL without an error while the parameter has not been
 * stepped yet; NULL + error for a bad index or a key this optimizer does not keep. */
CT_API ct_tensor *ct_optimizer_state(const ct_optimizer *o, int i, const char *key);
/* Updates parameter i has received (its bias-correction step); -1 + error when out of range. */
CT_API int64_t ct_optimizer_param_step(const ct_optimizer *o, int i);

/* Puts params[i] in place of parameter i, for every i (n must be the parameter
 * count; each keeps its group, lr scale and weight decay), before the first step
 * (no state yet): how the sharding engine hands the optimizer the slices of the
 * parameters this rank owns, so its moments are sharded too. Each new parameter is
 * checked as ct_*_new checks them and retained, the old ones released. Nothing changes
 * on error. */
CT_API ct_status ct_optimizer_replace_params(ct_optimizer *o, int n, ct_tensor *const *params);

/* Releases the parameters, the state and the handle. NULL is fine. */
CT_API void ct_optimizer_free(ct_optimizer *o);

/* Hooks a wrapper installs around an optimizer so the user's plain loop (step,
 * zero_grad) stays unchanged: the Accelerator skips the step and zero_grad on
 * gradient-accumulation micro-steps, waits for gradient reductions before a step,
 * and (fp16) skips a step whose gradients overflowed. Each field may be NULL.
 *   before_step:  runs first in ct_optimizer_step. Returns CT_OK to step, a
 *                 non-zero status to fail the step (nothing changed), or sets
 *                 *skip to make the step a no-op that returns CT_OK.
 *   after_step:   runs after a step that updated the parameters; its non-zero
 *                 status is the step's (the update itself has been made).
 *   skip_zero_grad: true makes ct_optimizer_zero_grad do nothing. */
typedef struct ct_optimizer_hooks {
    ct_status (*before_step)(ct_optimizer *o, void *data, bool *skip);
    ct_status (*after_step)(ct_optimizer *o, void *data);
    bool (*skip_zero_grad)(ct_optimizer *o, void *data);
    void *data;
} ct_optimizer_hooks;

/* Installs h (copied) or, with NULL, removes the hooks. One set per optimizer. */
CT_API void ct_optimizer_set_hooks(ct_optimizer *o, const ct_optimizer_hooks *h);
/* True when the last ct_optimizer_step call was skipped by a hook (a scheduler does
 * not advance after such a call: optim/schedule.h). */
CT_API bool ct_optimizer_step_was_skipped(const ct_optimizer *o);

/* ---- the state as values (training-state checkpoints: accel/checkpoint.h) ---------- */

/* The hyper-parameters besides lr and weight decay: beta1, beta2, eps (Adam, AdamW) or
 * momentum, dampening, nesterov (SGD); the other kind's fields are 0. */
typedef struct ct_optimizer_hparams {
    double beta1, beta2, eps;
    double momentum, dampening;
    bool nesterov;
} ct_optimizer_hparams;
/* The optimizer's hyper-parameters as above (all 0 for NULL). */
CT_API ct_optimizer_hparams ct_optimizer_hparams_get(const ct_optimizer *o);
/* Group g's lr_scale (exactly as set); NAN + error when out of range. */
CT_API double ct_optimizer_group_lr_scale(const ct_optimizer *o, int g);
/* The state keys this optimizer keeps per stepped parameter, into keys (static
 * strings): 2 for Adam and AdamW ("exp_avg", "exp_avg_sq"), 1 for SGD with momentum
 * ("momentum_buffer"), 0 for plain SGD. */
CT_API int ct_optimizer_state_keys(const ct_optimizer *o, const char *keys[2]);

/* Everything ct_optimizer_restore puts back. */
typedef struct ct_optimizer_restore_spec {
    int64_t step;                 /* ct_optimizer_step_count */
    double lr;                    /* the base lr */
    ct_optimizer_hparams hparams;
    const double *lr_scale;       /* per group (ct_optimizer_group_count entries) */
    const double *weight_decay;   /* per group: the group's decay */
    const int64_t *param_step;    /* per parameter: updates received; 0 = none yet (no state) */
    ct_tensor *const *state[2];   /* per key of ct_optimizer_state_keys, per parameter: the
                                   * parameter's shape and dtype (any layout, copied); NULL
                                   * where param_step is 0 */
} ct_optimizer_restore_spec;
/* Puts the state r describes in place of o's, so the next step is the step an
 * optimizer with that state would take (bitwise). Everything is checked first (values,
 * every tensor's shape and dtype against its parameter); the message names the
 * parameter and both values, and nothing changes on error. */
CT_API ct_status ct_optimizer_restore(ct_optimizer *o, const ct_optimizer_restore_spec *r);

/* Optimizer state as a safetensors file (core/safetensors.h), written atomically:
 *   tensors   "state.<i>.exp_avg", "state.<i>.exp_avg_sq"   (Adam, AdamW)
 *             "state.<i>.momentum_buffer"                  (SGD with momentum)
 *             for each parameter i that has been stepped, in the parameter's dtype;
 *   metadata  format "ctrain-optimizer", version "1", optimizer, step, lr, params,
 *             groups, group.<g>.params / .lr_scale / .weight_decay, the optimizer's
 *             hyper-parameters (beta1 beta2 eps | momentum dampening nesterov) and
 *             state.<i>.step; numbers printed so that they read back exactly.
 * Loading checks the file against this optimizer before changing anything: the same
 * kind, parameter count, group count and group sizes, and every state tensor's shape
 * and dtype against its parameter; the message names the file, the key and both
 * values. On success it restores the state, the step counts, the base lr, the groups'
 * lr scales and weight decays and the hyper-parameters, so the next step is the step
 * the saving optimizer would have taken (bitwise). */
CT_API ct_status ct_optimizer_save(const ct_optimizer *o, const char *path);
CT_API ct_status ct_optimizer_load(ct_optimizer *o, const char *path);

#endif
