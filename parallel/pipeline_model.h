/* ctrain — the GPT and the Llama cut into pipeline stages, trained with the pipeline engine.
 *
 *     ct_set_seed(seed); ct_gpt *m = ct_gpt_new(&cfg);          the same model on every stage
 *     ct_pipeline_model *pm = ct_pipeline_gpt_new(m, stages, s, NULL);
 *     const ct_param_list *p = ct_pipeline_model_params(pm);    this stage's parameters only
 *     ct_optimizer *opt = ct_adamw_new(p->n, p->tensors, &ocfg);
 *     for each step:
 *         ct_optimizer_zero_grad(opt);
 *         for each of the k accumulation steps:
 *             ct_pipeline_model_step(pm, tokens, targets, M, &loss);    loss on every stage
 *         ct_pipeline_model_sync_grads(pm);                    once, after the last one
 *         ct_pipeline_model_clip_grad_norm(pm, 1.0);           the norm over all stages
 *         ct_optimizer_step(opt);
 *
 * Stages. `stages` has one rank per stage, group rank s running stage s (as for
 * ct_pipeline_new); every rank of it calls the constructor (collective) and then every
 * step with the same M. Stage s runs the layers ct_pipeline_stage_layers gives it (cut
 * by count: more stages than layers is an error naming both numbers); stage 0 also the
 * embeddings (GPT: wte + wpe, then the embedding dropout; Llama: embed_tokens), the
 * last stage the final norm (ln_f / model.norm), the head and the loss: the mean
 * cross-entropy of the micro-batch's logits against its targets (ignore_index -1).
 * Between stages travel the hidden states (B/M, T, C); the last stage's forward
 * returns the loss, which the engine scales by 1/M, so after a step every parameter's
 * .grad has gained the gradient of the whole batch's mean loss, as
 * ct_backward(ct_gpt_loss(m, tokens, targets)) on one process gives it.
 *
 * The model is borrowed and cut: with more than one stage, the memory of every
 * parameter this stage does not use (the other stages' layers, the embeddings off the
 * first stage, the head and final norm off the last) is released when the handle is
 * made; the tensors stay in the model with their names and shapes, and reading one
 * (a forward of the whole model, a save of it) is an error naming it. What a stage
 * trains is ct_pipeline_model_params: build the optimizer, clipping and checkpoints
 * over that list only (its names are the model's dotted names).
 *
 * Tied embeddings (the GPT's head is wte; a Llama with tie_word_embeddings uses
 * embed_tokens): with more than one stage, the first and the last stage each hold a
 * copy and each gets the gradient of its own use. ct_pipeline_model_sync_tied_grads
 * sums the two (an allreduce over a group of just those two stages, Megatron's
 * embedding group), after which both copies have the whole gradient and, updated by
 * identical optimizers, stay equal. Call it once per optimizer step, after the last
 * accumulation step: calling it after each step would add a copy's earlier share twice.
 *
 * The global gradient norm is sqrt(sum over stages of each stage's sum of g^2), the
 * tied weight counted once (on the first stage): what ct_grad_norm gives over the
 * whole model in one process.
 *
 * Tensor parallelism inside the stages (tp x pp, parallel/mesh.h): shard the model
 * first (ct_gpt_tensor_parallel / ct_llama_tensor_parallel over the mesh's tp_group),
 * then cut it over the mesh's pp_group. Each tp rank of a stage talks to the same tp
 * rank of the next stage, so the hidden states between stages are the tp group's
 * replicated activations, or under sequence parallelism each rank's chunk of the
 * sequence (B/M, T/tp, C); the last stage computes the vocabulary-parallel
 * cross-entropy of its logit columns. The tied embedding's rows are summed stage to
 * stage per tp rank, and the global norm adds the shards' squares over tp.
 */
#ifndef CT_PARALLEL_PIPELINE_MODEL_H
#define CT_PARALLEL_PIPELINE_MODEL_H

#include "core/api.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/module.h"
#include "parallel/pipeline.h"

typedef struct ct_pipeline_model ct_pipeline_model;

/* Stage `stage` of the model m (borrowed: it must outlive the handle) cut into
 * ct_pg_size(stages) stages (stages NULL: one stage, no communication). cfg: the
 * engine's (schedule, tag; may be NULL). Collective over `stages`. New handle owned
 * by the caller, or NULL with the error set (more stages than layers, naming both;
 * a stage other than the group rank; the groups' failure). */
CT_API ct_pipeline_model *ct_pipeline_gpt_new(ct_gpt *m, ct_pg *stages, int stage, const ct_pipeline_config *cfg);
CT_API ct_pipeline_model *ct_pipeline_llama_new(ct_llama *m, ct_pg *stages, int stage,
                                                const ct_pipeline_config *cfg);

/* The parameters this stage uses, in the model's registration order, under the
 * model's dotted names (borrowed; valid until ct_pipeline_model_free). */
CT_API const ct_param_list *ct_pipeline_model_params(const ct_pipeline_model *pm);
/* The layers of this stage: [*first, *first + *count). */
CT_API void ct_pipeline_model_layers(const ct_pipeline_model *pm, int *first, int *count);
/* The engine (borrowed): its stage, stats, ct_pipeline_broadcast_metrics. */
CT_API ct_pipeline *ct_pipeline_model_engine(const ct_pipeline_model *pm);
/* Bytes this stage has sent: the engine's activations and gradients (its stats'
 * bytes_sent) plus the handle's own collectives as ct_pg_bytes_sent counts them (the
 * tied embedding's gradient sum, the gradient norms). 0 for NULL. */
CT_API double ct_pipeline_model_bytes_sent(const ct_pipeline_model *pm);

/* Forward and backward of the batch tokens (B, T) against targets (B, T) (integer
 * tensors; every stage passes the same batch and uses what it needs) as num_micro
 * micro-batches of B / num_micro rows, by the engine's schedule. Gradients accumulate
 * into this stage's parameters' .grad (the gradient of the batch's mean loss); *loss
 * (may be NULL): the batch's mean loss, on every stage. Errors name the numbers: B not
 * divisible by num_micro, num_micro < 1, shapes that differ or are not (B, T), T past
 * the GPT's block_size; a failure inside the pipeline breaks it (pipeline.h). */
CT_API ct_status ct_pipeline_model_step(ct_pipeline_model *pm, ct_tensor *tokens, ct_tensor *targets, int num_micro,
                                        double *loss);

/* A forward-only pass of the batch (evaluation) as ct_pipeline_model_step cuts it:
 * no gradients, *loss the batch's mean loss on every stage. Every stage calls it. */
CT_API ct_status ct_pipeline_model_eval(ct_pipeline_model *pm, ct_tensor *tokens, ct_tensor *targets, int num_micro,
                                        double *loss);

/* The stage that holds the parameter called name (the tied embedding: 0), or -1 when
 * no stage does. No collective. */
CT_API int ct_pipeline_model_stage_of(const ct_pipeline_model *pm, const char *name);

/* Once per optimizer step, after the last accumulation step: the tied embedding's sum
 * (ct_pipeline_model_sync_tied_grads) and, for a model sharded for tensor parallelism
 * with sequence parallelism, the sum of the replicated parameters' partial gradients
 * over tp (ct_gpt_tp_sync_grads / ct_llama_tp_sync_grads). Collective. */
CT_API ct_status ct_pipeline_model_sync_grads(ct_pipeline_model *pm);

/* Sums the tied embedding's gradient over the first and the last stage (see above);
 * a no-op without a tie or with one stage. Collective over the stages. A copy without
 * a gradient counts as zeros and gets the sum. */
CT_API ct_status ct_pipeline_model_sync_tied_grads(ct_pipeline_model *pm);

/* The 2-norm of the gradients of all stages together, on every stage (collective
 * over the stages and, for a tensor-parallel model, its tp group): the shards' squares
 * summed over tp, the replicated parameters counted once; call after
 * ct_pipeline_model_sync_grads. NAN + error on failure. */
CT_API double ct_pipeline_model_grad_norm(ct_pipeline_model *pm);
/* Scales this stage's gradients by ct_clip_coef(total, max_norm), total being
 * ct_pipeline_model_grad_norm, which it returns (PyTorch's clip_grad_norm_ over the
 * whole model). Collective. NAN + error on failure. */
CT_API double ct_pipeline_model_clip_grad_norm(ct_pipeline_model *pm, double max_norm);

/* Frees the handle, its engine and groups; the model stays. NULL is a no-op. */
CT_API void ct_pipeline_model_free(ct_pipeline_model *pm);

#endif
