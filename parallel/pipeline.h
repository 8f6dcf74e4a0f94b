/* ctrain — pipeline parallelism: one rank's stage of a model cut into stages.
 *
 *     // stage s holds layers [first, first + count) (ct_pipeline_stage_layers)
 *     ct_pipeline *pp = ct_pipeline_new(stages, s, stage_forward, my_stage, NULL);
 *     for each step:
 *         ct_optimizer_zero_grad(opt);
 *         double loss;
 *         ct_pipeline_run(pp, M, s == 0 ? micro_inputs : NULL, &loss);   every stage
 *         ct_optimizer_step(opt);                                        this stage's parameters
 *     ct_pipeline_free(pp);
 *
 * The group `stages` has one rank per stage, group rank i running stage i (a
 * sub-group of the world, or of a device mesh's pipeline dimension). Every rank of it
 * calls ct_pipeline_new (it makes a sub-group of its own, so it is collective and
 * blocks until all stages are there) and then every ct_pipeline_run with the same M.
 *
 * The stage. fwd(ctx, input, micro) computes this stage's part for micro-batch micro
 * (0 .. M-1) and returns its output, a new reference in the current frame (the
 * engine keeps it). Stage 0's input is inputs[micro], the caller's; a later stage's
 * is the activation stage - 1 returned for that micro-batch, received into a fresh
 * leaf that requires grad. The last stage returns the micro-batch's loss, a tensor of
 * one element (its targets are the callback's business: ctx and micro say which).
 * Outputs sent on must be CPU tensors of a float dtype (the process group moves CPU
 * memory); any shape.
 *
 * A run executes the schedule (parallel/pipeline_schedule.h, GPipe or 1F1B) for M
 * micro-batches:
 *   FORWARD m:  receive m's activation from stage - 1 (stages > 0), y = fwd(..), send
 *               y to stage + 1 (asynchronous; the engine keeps y for backward).
 *   BACKWARD m: receive dL/dy from stage + 1 (the last stage uses 1/M instead),
 *               ct_backward_with(y, dL/dy), send the received activation's .grad to
 *               stage - 1 (asynchronous).
 * The loss of micro-batch m is scaled by 1/M, so when the micro-batches are equal
 * parts of one batch and each loss is a mean over its part, every parameter's .grad
 * after the run equals the gradient of the whole batch's mean loss (gradients add up
 * across micro-batches as in ordinary accumulation, and across runs unless zeroed).
 * *loss is the mean of the M losses, computed on the last stage and given to every
 * stage by an allreduce (a sum with zeros from the others: exact). The allreduce
 * ends the run, and no rank leaves it before all have entered it, so every transfer
 * of the run has been posted when any stage returns: a stage may free its handle
 * at once.
 *
 * Overlap: the receive of micro-batch m + 1's activation is posted before m's
 * forward computes, and the receive of m's output gradient right after m's output is
 * sent, so transfers run on the communication thread while this thread computes;
 * sends are never waited for before the schedule needs their buffer back.
 *
 * Each activation travels with a small header (micro-batch, M, schedule, dtype,
 * shape), checked on arrival: a stage given another M or schedule than its
 * predecessor, or an activation of another dtype or shape than expected (the
 * configured in_shape, else micro-batch 0's shape in this run: all micro-batches of a
 * run must have one shape), is an error naming both sides.
 *
 * Failures. Every error names the stage, the micro-batch and the operation
 * ("pipeline stage 1 of 4, micro-batch 2, recv activation from stage 0: ...").
 * A failure on one stage (its forward failed, a shape mismatch, a peer that died)
 * breaks the pipeline: its sub-group is freed at once, so the other stages' pending
 * transfers with this one fail within moments (naming this stage) instead of
 * waiting for the group timeout; a transfer that never comes fails after the
 * group's timeout. A broken pipeline fails every later run; free it.
 *
 * Memory accounting: a micro-batch is live on a stage from its forward to its
 * backward. The engine counts, per run, the most live micro-batches at once
 * (peak_live: GPipe M, 1F1B min(M, num_stages - stage); ct_pipeline_peak_micro_batches)
 * and the most bytes of the stage-boundary tensors it holds for them (each live
 * micro-batch's received input, its output and, between stages, the buffer of its
 * output gradient). What the autograd graph saves inside the stage follows the same
 * count.
 *
 * Thread-safety: one thread per handle; fwd runs on that thread.
 */
#ifndef CT_PARALLEL_PIPELINE_H
#define CT_PARALLEL_PIPELINE_H

#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "parallel/pipeline_schedule.h"

typedef struct ct_pipeline ct_pipeline;

/* A stage's forward for one micro-batch; returns a new reference in the current
 * frame, or NULL with ct_last_error() set. */
typedef ct_tensor *(*ct_pipeline_forward_fn)(void *ctx, ct_tensor *input, int micro);

/* Zero means default for every field. */
typedef struct ct_pipeline_config {
    ct_pipeline_kind schedule; /* default CT_PIPELINE_1F1B; every stage must use the same */
    /* The activation this stage receives (stages > 0): in_ndim > 0 fixes its shape
     * and dtype (in_dtype, default f32), so its receive is posted whole ahead of
     * time; 0: whatever micro-batch 0 of each run brings, and the others must match. */
    int in_ndim;
    int64_t in_shape[CT_MAX_DIMS];
    ct_dtype in_dtype;
    int tag; /* the first of the three point-to-point tags the engine uses; default 0x5050 */
} ct_pipeline_config;

typedef struct ct_pipeline_stats {
    int64_t runs;                  /* completed runs */
    int peak_live;                 /* last run: most micro-batches live at once on this stage */
    int64_t peak_live_bytes;       /* last run: most bytes of their boundary tensors at once */
    int64_t bytes_sent, bytes_received; /* activations and gradients, all runs (headers not counted) */
    double wait_s;                 /* all runs: time this thread waited for a receive */
    double run_s;                  /* all runs (training and evaluation): their time */
} ct_pipeline_stats;

/* The engine for stage `stage` of ct_pg_size(stages) stages; stages may be NULL for a
 * single stage (no communication). fwd and ctx are borrowed (ctx must outlive the
 * handle); cfg may be NULL. Collective over `stages`. New handle owned by the caller,
 * or NULL with the error set: stage other than the group rank, no fwd, a bad config
 * value (named), the sub-group's failure. */
CT_API ct_pipeline *ct_pipeline_new(ct_pg *stages, int stage, ct_pipeline_forward_fn fwd, void *ctx,
                                    const ct_pipeline_config *cfg);

/* Runs forward and backward of num_micro micro-batches by the schedule; every stage
 * calls it with the same num_micro. inputs: num_micro tensors on stage 0 (borrowed;
 * not modified), ignored (may be NULL) elsewhere. *loss (may be NULL): the mean
 * micro-batch loss, on every stage. Parameter gradients accumulate into .grad. */
CT_API ct_status ct_pipeline_run(ct_pipeline *p, int num_micro, ct_tensor *const *inputs, double *loss);

/* A forward-only run (evaluation): the M forwards in order, without gradients (the
 * autograd graph is not built), the mean micro-batch loss on every stage as for
 * ct_pipeline_run. Every stage must call it for the same run: a stage evaluating while
 * its neighbour trains is an error naming both. */
CT_API ct_status ct_pipeline_eval(ct_pipeline *p, int num_micro, ct_tensor *const *inputs, double *loss);

/* The weight of the loss in later runs' backward: the last stage seeds each
 * micro-batch's loss gradient with scale / M instead of 1 / M (default 1), e.g.
 * gradient accumulation's 1/k times fp16's loss scale. Positive and finite. The
 * reported loss is not scaled. */
CT_API ct_status ct_pipeline_set_grad_scale(ct_pipeline *p, double scale);

/* Copies the last stage's values[0..n-1] into values on every stage (metrics such as
 * an accuracy computed on the last stage), as the loss is shared. Collective over
 * the stages. */
CT_API ct_status ct_pipeline_broadcast_metrics(ct_pipeline *p, double *values, int n);

/* This rank's stage, the number of stages; -1 and 0 for NULL. */
CT_API int ct_pipeline_stage(const ct_pipeline *p);
CT_API int ct_pipeline_num_stages(const ct_pipeline *p);
/* The counters above; zeros for NULL. */
CT_API ct_pipeline_stats ct_pipeline_stats_get(const ct_pipeline *p);

/* Frees the engine and its sub-group (tensors it still holds are released). NULL is
 * a no-op. */
CT_API void ct_pipeline_free(ct_pipeline *p);

#endif
