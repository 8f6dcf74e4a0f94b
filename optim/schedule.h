/* ctrain — learning-rate schedules: constant, or linear warmup then cosine or linear
 * decay to a floor, as nanoGPT and llm.c do it. For step s (0-based):
 *
 *   s < warmup                lr = max_lr * (s + 1) / warmup
 *   warmup <= s <= total      r = (s - warmup) / (total - warmup)
 *                               CONSTANT  lr = max_lr
 *                               COSINE    lr = min_lr + 0.5 * (1 + cos(pi * r)) * (max_lr - min_lr)
 *                               LINEAR    lr = max_lr - r * (max_lr - min_lr)
 *   s > total                 lr = min_lr (CONSTANT: max_lr)
 *
 * A scheduler applies a schedule to an optimizer, as PyTorch's LambdaLR: it sets the
 * optimizer's base lr to lr(0) when made and to lr(k) at its k-th ct_scheduler_step,
 * so a loop of { forward; backward; ct_optimizer_step; ct_scheduler_step } runs step s
 * at lr(s). Groups keep their lr_scale (optim/optimizer.h). The scheduler's position
 * is one integer: save ct_scheduler_position with a checkpoint and hand it to
 * ct_scheduler_set_position on resume.
 */
#ifndef CT_OPTIM_SCHEDULE_H
#define CT_OPTIM_SCHEDULE_H

#include <stdint.h>

#include "core/api.h"
#include "core/error.h"
#include "optim/optimizer.h"

typedef enum ct_lr_decay {
    CT_LR_CONSTANT = 0, /* max_lr after the warmup */
    CT_LR_COSINE,
    CT_LR_LINEAR,
} ct_lr_decay;

typedef struct ct_lr_schedule {
    ct_lr_decay decay;    /* CT_LR_CONSTANT by default */
    double max_lr;        /* the peak; 0 in a scheduler = the optimizer's lr when the scheduler is made */
    double min_lr;        /* the floor reached at total_steps (COSINE, LINEAR); 0 by default */
    int64_t warmup_steps; /* 0 = no warmup */
    int64_t total_steps;  /* where the decay ends; COSINE and LINEAR need total_steps > warmup_steps */
} ct_lr_schedule;

/* lr at step (>= 0). NAN + error for a bad schedule or step: lrs must be finite and
 * >= 0, step counts >= 0, decay a ct_lr_decay value. */
CT_API double ct_lr_schedule_at(const ct_lr_schedule *s, int64_t step);
/* CT_OK or an error naming the bad field. */
CT_API ct_status ct_lr_schedule_check(const ct_lr_schedule *s);

typedef struct ct_scheduler ct_scheduler; /* handle */

/* A scheduler driving o (borrowed: o must outlive it) with a copy of s; sets o's lr
 * to lr(0). The caller owns the handle (ct_scheduler_free). NULL + error. */
CT_API ct_scheduler *ct_scheduler_new(ct_optimizer *o, const ct_lr_schedule *s);
/* Position + 1; sets the optimizer's lr to lr(position). Does nothing (CT_OK) when
 * the optimizer's last step was skipped by its hooks (ct_optimizer_step_was_skipped:
 * a gradient-accumulation micro-step or an fp16 overflow under the Accelerator), so a
 * schedule counts optimizer updates, never micro-steps. */
CT_API ct_status ct_scheduler_step(ct_scheduler *sch);
/* The number of ct_scheduler_step calls so far (the step whose lr is set now). */
CT_API int64_t ct_scheduler_position(const ct_scheduler *sch);
/* Restores a saved position (>= 0) and sets the optimizer's lr to lr(position). */
CT_API ct_status ct_scheduler_set_position(ct_scheduler *sch, int64_t position);
/* lr(position), the value the scheduler last set. */
CT_API double ct_scheduler_lr(const ct_scheduler *sch);
/* The schedule in use (max_lr filled in). Borrowed. */
CT_API const ct_lr_schedule *ct_scheduler_schedule(const ct_scheduler *sch);
/* Frees sch (not the optimizer it drives); NULL is fine. */
CT_API void ct_scheduler_free(ct_scheduler *sch);

#endif
