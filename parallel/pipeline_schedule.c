/* Pipeline schedules (GPipe, 1F1B), their memory and bubble formulas, and the cut of
 * a layer list into stages. See pipeline_schedule.h for the math. */
#include "parallel/pipeline_schedule.h"

#include <stdbool.h>

static ct_status check_args(const char *op, ct_pipeline_kind kind, int num_stages, int num_micro, int stage)
{
    if (kind != CT_PIPELINE_1F1B && kind != CT_PIPELINE_GPIPE)
        return ct_error_set(CT_ERR_INVALID, "%s: unknown schedule kind %d (allowed: CT_PIPELINE_1F1B, CT_PIPELINE_GPIPE)",
                            op, (int)kind);
    if (num_stages < 1 || num_micro < 1)
        return ct_error_set(CT_ERR_INVALID, "%s: %d stages and %d micro-batches: both must be at least 1", op,
                            num_stages, num_micro);
    if (stage < 0 || stage >= num_stages)
        return ct_error_set(CT_ERR_INVALID, "%s: stage %d is outside [0, %d)", op, stage, num_stages);
    return CT_OK;
}

const char *ct_pipeline_kind_name(ct_pipeline_kind kind)
{
    switch (kind) {
    case CT_PIPELINE_1F1B: return "1f1b";
    case CT_PIPELINE_GPIPE: return "gpipe";
    }
    return "invalid";
}

static ct_pipeline_action action(ct_pipeline_step step, int micro, int num_stages, int stage)
{
    bool first = stage == 0, last = stage == num_stages - 1;
    if (step == CT_PIPELINE_FORWARD)
        return (ct_pipeline_action){step, micro, first ? -1 : stage - 1, last ? -1 : stage + 1};
    return (ct_pipeline_action){step, micro, last ? -1 : stage + 1, first ? -1 : stage - 1};
}

ct_status ct_pipeline_schedule(ct_pipeline_kind kind, int num_stages, int num_micro, int stage,
                               ct_pipeline_action *out)
{
    ct_status st = check_args("pipeline schedule", kind, num_stages, num_micro, stage);
    if (st) return st;
    int n = 0, M = num_micro;
    if (kind == CT_PIPELINE_GPIPE) {
        for (int m = 0; m < M; m++) out[n++] = action(CT_PIPELINE_FORWARD, m, num_stages, stage);
        for (int m = 0; m < M; m++) out[n++] = action(CT_PIPELINE_BACKWARD, m, num_stages, stage);
        return CT_OK;
    }
    /* 1F1B: the warm-up forwards fill the pipe below this stage; then every forward
     * is followed by the backward of the oldest micro-batch held */
    int warm = num_stages - stage - 1 < M ? num_stages - stage - 1 : M;
    int f = 0, b = 0;
    while (f < warm) out[n++] = action(CT_PIPELINE_FORWARD, f++, num_stages, stage);
    while (f < M) {
        out[n++] = action(CT_PIPELINE_FORWARD, f++, num_stages, stage);
        out[n++] = action(CT_PIPELINE_BACKWARD, b++, num_stages, stage);
    }
    while (b < M) out[n++] = action(CT_PIPELINE_BACKWARD, b++, num_stages, stage);
    return CT_OK;
}

int ct_pipeline_peak_micro_batches(ct_pipeline_kind kind, int num_stages, int num_micro, int stage)
{
    if (check_args("pipeline peak", kind, num_stages, num_micro, stage)) {
        ct_error_clear();
        return 0;
    }
    if (kind == CT_PIPELINE_GPIPE) return num_micro;
    return num_micro < num_stages - stage ? num_micro : num_stages - stage;
}

double ct_pipeline_bubble_fraction(int num_stages, int num_micro)
{
    if (num_stages < 1 || num_micro < 1) return 0;
    return (double)(num_stages - 1) / (double)(num_micro + num_stages - 1);
}

ct_status ct_pipeline_stage_layers(int num_layers, int num_stages, int stage, int *first, int *count)
{
    if (num_layers < 1 || num_stages < 1)
        return ct_error_set(CT_ERR_INVALID, "pipeline: %d layers into %d stages: both must be at least 1", num_layers,
                            num_stages);
    if (num_stages > num_layers)
        return ct_error_set(CT_ERR_INVALID,
                            "pipeline: %d stages for %d layers: every stage needs at least one layer (use at most %d "
                            "pipeline stages, or a model with at least %d layers)",
                            num_stages, num_layers, num_layers, num_stages);
    if (stage < 0 || stage >= num_stages)
        return ct_error_set(CT_ERR_INVALID, "pipeline: stage %d is outside [0, %d)", stage, num_stages);
    int base = num_layers / num_stages, extra = num_layers % num_stages;
    *first = stage * base + (stage < extra ? stage : extra);
    *count = base + (stage < extra);
    return CT_OK;
}
