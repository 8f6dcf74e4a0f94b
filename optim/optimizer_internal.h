/* ctrain — the optimizer handle's layout, shared by optim/optimizer.c (groups, step
 * loop), optim/sgd.c and optim/adam.c (the per-parameter updates) and optim/state.c
 * (save/load). Not installed. */
#ifndef CT_OPTIM_OPTIMIZER_INTERNAL_H
#define CT_OPTIM_OPTIMIZER_INTERNAL_H

#include "optim/optimizer.h"

typedef enum ct_optim_kind { CT_OPTIM_SGD, CT_OPTIM_ADAM, CT_OPTIM_ADAMW } ct_optim_kind;

typedef struct ct_param_group {
    int first, n; /* parameters [first, first + n) of the optimizer */
    double lr_scale, weight_decay;
} ct_param_group;

/* Owned references or NULL until the parameter's first step. */
typedef struct ct_param_state {
    ct_tensor *exp_avg, *exp_avg_sq; /* Adam, AdamW */
    ct_tensor *momentum_buffer;      /* SGD with momentum != 0 */
    int64_t step;                    /* updates this parameter has received */
} ct_param_state;

/* The hyper-parameters besides lr and weight decay; a union of the kinds' fields. */
typedef struct ct_optim_hyper {
    double beta1, beta2, eps;             /* Adam, AdamW */
    double momentum, dampening;           /* SGD */
    bool nesterov;                        /* SGD */
} ct_optim_hyper;

struct ct_optimizer {
    ct_optim_kind kind;
    double lr;           /* base lr */
    double weight_decay; /* the default for groups */
    ct_optim_hyper hyper;
    int64_t step;

    int nparams, cap_params;
    ct_tensor **params;    /* owned references */
    ct_param_state *state; /* nparams entries */
    int ngroups, cap_groups;
    ct_param_group *groups;
    ct_optimizer_hooks hooks;
    bool last_skipped; /* the last ct_optimizer_step was skipped by hooks.before_step */
};

/* A handle with no parameters and no groups; NULL + error (op named) on no memory. */
ct_optimizer *cti_optim_alloc(const char *op, ct_optim_kind kind, double lr, double weight_decay,
                              const ct_optim_hyper *hyper);
/* Adds group 0 and frees o on failure; returns o or NULL. */
ct_optimizer *cti_optim_finish_new(ct_optimizer *o, int n, ct_tensor *const *params);

/* Checks: finite and >= 0 (name labels the value in the message). */
ct_status cti_optim_check_nonneg(const char *op, const char *name, double v);
/* Hyper-parameters of the kind, after defaults are applied. */
ct_status cti_optim_check_hyper(const char *op, ct_optim_kind kind, const ct_optim_hyper *h);

/* A zero tensor shaped as p, owned by the caller (not in any frame); NULL + error. */
ct_tensor *cti_optim_zeros_like(const ct_tensor *p);

/* Allocates what parameter i needs before its first update (zeros); CT_OK when it
 * has it already. */
ct_status cti_optim_sgd_init_state(ct_optimizer *o, int i);
ct_status cti_optim_adam_init_state(ct_optimizer *o, int i);
/* One update of parameter i of group g with the contiguous gradient grad (checked).
 * Advances state[i].step. */
ct_status cti_optim_sgd_update(ct_optimizer *o, int i, const ct_param_group *g, const ct_tensor *grad);
ct_status cti_optim_adam_update(ct_optimizer *o, int i, const ct_param_group *g, const ct_tensor *grad);

/* The state keys an optimizer of this kind and momentum keeps per stepped parameter
 * (ct_optimizer_state_keys; optim/state.c asks it of a file's momentum). */
int cti_optim_state_keys(ct_optim_kind kind, double momentum, const char *keys[2]);

/* "parameter 3 'h.0.attn.weight' (f32[2, 3] cpu)" into buf; returns buf. */
const char *cti_optim_param_label(const ct_tensor *p, int i, char *buf, int cap);

#endif
