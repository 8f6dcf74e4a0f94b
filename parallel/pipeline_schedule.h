/* ctrain — pipeline schedules: which micro-batch a stage runs forward or backward, when.
 *
 * A model cut into p stages (stage s holds a run of consecutive layers, placed on
 * its own rank) trains a batch as M micro-batches. Each stage runs, for every
 * micro-batch m, one FORWARD m (receive m's activation from stage s-1, compute,
 * send the output to stage s+1) and one BACKWARD m (receive the gradient of that
 * output from stage s+1, backpropagate, send the gradient of the input to stage
 * s-1). A schedule is the order of these 2M steps on each stage:
 *
 *   GPipe: all M forwards, then all M backwards (in micro-batch order). Simple, but a
 *     stage holds the activations of all M micro-batches at once.
 *   1F1B (PipeDream-Flush, Megatron's non-interleaved schedule): stage s runs
 *     w = min(p - s - 1, M) warm-up forwards, then alternates one forward and one
 *     backward (F w, B 0, F w+1, B 1, ...) until the forwards are done, then the
 *     w remaining backwards. A micro-batch's activations are freed by its backward,
 *     so stage s holds at most min(M, p - s) of them — at most p, whatever M is.
 *
 * Both run the backwards in micro-batch order, so the n-th message on each link
 * (activations forward, gradients backward) belongs to micro-batch n on both sides.
 *
 * Both have the same bubble: with forward and backward steps each taking one unit of
 * time, a step takes 2 (M + p - 1) units while each stage computes for 2 M of them,
 * so the idle share of every stage is (p - 1) / (M + p - 1): more micro-batches
 * shrink it; 1F1B's gain is memory, not time.
 */
#ifndef CT_PARALLEL_PIPELINE_SCHEDULE_H
#define CT_PARALLEL_PIPELINE_SCHEDULE_H

#include "core/api.h"
#include "core/error.h"

/* Zero is the default: 1F1B. */
typedef enum ct_pipeline_kind {
    CT_PIPELINE_1F1B = 0,
    CT_PIPELINE_GPIPE,
} ct_pipeline_kind;

typedef enum ct_pipeline_step {
    CT_PIPELINE_FORWARD = 0,
    CT_PIPELINE_BACKWARD,
} ct_pipeline_step;

/* One step of a stage's schedule with the transfers it implies. FORWARD m receives
 * m's activation from recv_from (stage - 1; -1 on the first stage, whose input is the
 * caller's) and sends its output to send_to (stage + 1; -1 on the last stage, whose
 * output is the loss). BACKWARD m receives the gradient of its output from recv_from
 * (stage + 1; -1 on the last stage, which starts from the loss) and sends the
 * gradient of its input to send_to (stage - 1; -1 on the first stage). */
typedef struct ct_pipeline_action {
    ct_pipeline_step step;
    int micro;
    int recv_from, send_to;
} ct_pipeline_action;

/* "gpipe", "1f1b"; "invalid" otherwise (static strings). */
CT_API const char *ct_pipeline_kind_name(ct_pipeline_kind kind);

/* Writes stage's 2 * num_micro actions, in the order it runs them, into out (room for
 * 2 * num_micro). Errors (CT_ERR_INVALID, naming the values): num_stages < 1,
 * num_micro < 1, stage outside [0, num_stages), an unknown kind. */
CT_API ct_status ct_pipeline_schedule(ct_pipeline_kind kind, int num_stages, int num_micro, int stage,
                                      ct_pipeline_action *out);

/* The most micro-batches whose activations stage holds at once (forward run,
 * backward not yet): GPipe M, 1F1B min(M, num_stages - stage). 0 for bad arguments. */
CT_API int ct_pipeline_peak_micro_batches(ct_pipeline_kind kind, int num_stages, int num_micro, int stage);

/* The idle share of each stage's time when forward and backward steps take equal
 * time and transfers none: (p - 1) / (M + p - 1), for both schedules. 0 for bad
 * arguments. */
CT_API double ct_pipeline_bubble_fraction(int num_stages, int num_micro);

/* The layers of stage when num_layers layers (in order) are cut into num_stages
 * stages by layer count: stage s gets floor(L / p) layers, and the first L mod p
 * stages one more, so *first = s * floor(L / p) + min(s, L mod p) and *count is
 * floor(L / p) + (s < L mod p). Every stage needs at least one layer: more stages
 * than layers is an error naming both numbers, as are num_layers < 1, num_stages < 1
 * and stage outside [0, num_stages). */
CT_API ct_status ct_pipeline_stage_layers(int num_layers, int num_stages, int stage, int *first, int *count);

#endif
