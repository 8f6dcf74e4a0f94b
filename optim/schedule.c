/* ctrain — learning-rate schedules and the scheduler that applies them (see
 * optim/schedule.h for the formulas). */
#include "optim/schedule.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

struct ct_scheduler {
    ct_optimizer *opt; /* borrowed */
    ct_lr_schedule s;
    int64_t position;
};

static const char *decay_name(ct_lr_decay d)
{
    return d == CT_LR_CONSTANT ? "constant" : d == CT_LR_COSINE ? "cosine" : d == CT_LR_LINEAR ? "linear" : "invalid";
}

ct_status ct_lr_schedule_check(const ct_lr_schedule *s)
{
    const char *op = "lr_schedule";
    if (!s) return ct_error_set(CT_ERR_INVALID, "%s: schedule is NULL", op);
    if (s->decay != CT_LR_CONSTANT && s->decay != CT_LR_COSINE && s->decay != CT_LR_LINEAR)
        return ct_error_set(CT_ERR_INVALID, "%s: decay %d is not CT_LR_CONSTANT, CT_LR_COSINE or CT_LR_LINEAR", op, (int)s->decay);
    if (!(s->max_lr >= 0) || isinf(s->max_lr) || !(s->min_lr >= 0) || isinf(s->min_lr))
        return ct_error_set(CT_ERR_INVALID, "%s: max_lr and min_lr must be finite and >= 0, got %g and %g", op, s->max_lr,
                            s->min_lr);
    if (s->warmup_steps < 0 || s->total_steps < 0)
        return ct_error_set(CT_ERR_INVALID, "%s: warmup_steps and total_steps must be >= 0, got %" PRId64 " and %" PRId64, op,
                            s->warmup_steps, s->total_steps);
    if (s->decay != CT_LR_CONSTANT && s->total_steps <= s->warmup_steps)
        return ct_error_set(CT_ERR_INVALID, "%s: %s decay needs total_steps > warmup_steps, got total_steps %" PRId64
                            " and warmup_steps %" PRId64, op, decay_name(s->decay), s->total_steps, s->warmup_steps);
    return CT_OK;
}

double ct_lr_schedule_at(const ct_lr_schedule *s, int64_t step)
{
    if (ct_lr_schedule_check(s)) return NAN;
    if (step < 0) return ct_error_set(CT_ERR_INVALID, "lr_schedule_at: step must be >= 0, got %" PRId64, step), NAN;
    if (step < s->warmup_steps) return s->max_lr * (double)(step + 1) / (double)s->warmup_steps;
    if (s->decay == CT_LR_CONSTANT) return s->max_lr;
    if (step > s->total_steps) return s->min_lr;
    const double r = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    if (s->decay == CT_LR_COSINE) return s->min_lr + 0.5 * (1 + cos(M_PI * r)) * (s->max_lr - s->min_lr);
    return s->max_lr - r * (s->max_lr - s->min_lr);
}

static ct_status apply(ct_scheduler *sch, int64_t position)
{
    const double lr = ct_lr_schedule_at(&sch->s, position);
    if (isnan(lr)) return ct_last_status();
    ct_status st = ct_optimizer_set_lr(sch->opt, lr);
    if (!st) sch->position = position;
    return st;
}

ct_scheduler *ct_scheduler_new(ct_optimizer *o, const ct_lr_schedule *s)
{
    if (!o || !s) {
        ct_error_set(CT_ERR_INVALID, "scheduler_new: %s is NULL", o ? "schedule" : "optimizer");
        return NULL;
    }
    ct_scheduler *sch = calloc(1, sizeof *sch);
    if (!sch) {
        ct_error_set(CT_ERR_NOMEM, "scheduler_new: out of memory");
        return NULL;
    }
    sch->opt = o;
    sch->s = *s;
    if (sch->s.max_lr == 0) sch->s.max_lr = ct_optimizer_lr(o);
    if (ct_lr_schedule_check(&sch->s) || apply(sch, 0)) {
        ct_error_prefix("scheduler_new: ");
        free(sch);
        return NULL;
    }
    return sch;
}

ct_status ct_scheduler_step(ct_scheduler *sch)
{
    if (!sch) return ct_error_set(CT_ERR_INVALID, "scheduler_step: scheduler is NULL");
    if (sch->position == INT64_MAX) return ct_error_set(CT_ERR_INVALID, "scheduler_step: position overflow");
    /* a step skipped by the optimizer's hooks (accumulation micro-step, fp16
     * overflow) moved no parameter, so the schedule does not move either */
    if (ct_optimizer_step_was_skipped(sch->opt)) return CT_OK;
    return apply(sch, sch->position + 1);
}

int64_t ct_scheduler_position(const ct_scheduler *sch) { return sch ? sch->position : 0; }

ct_status ct_scheduler_set_position(ct_scheduler *sch, int64_t position)
{
    if (!sch) return ct_error_set(CT_ERR_INVALID, "scheduler_set_position: scheduler is NULL");
    if (position < 0)
        return ct_error_set(CT_ERR_INVALID, "scheduler_set_position: position must be >= 0, got %" PRId64, position);
    return apply(sch, position);
}

double ct_scheduler_lr(const ct_scheduler *sch) { return sch ? ct_lr_schedule_at(&sch->s, sch->position) : NAN; }

const ct_lr_schedule *ct_scheduler_schedule(const ct_scheduler *sch) { return sch ? &sch->s : NULL; }

void ct_scheduler_free(ct_scheduler *sch) { free(sch); }
