/* ctrain — the Accelerator: one training loop, any number of processes.
 *
 * The four-call conversion of a plain loop (examples/quickstart.c):
 *
 *     ct_accelerator *acc = ct_accelerator_new(NULL);                  (1)
 *     ct_accelerator_prepare(acc, &model->base, opt, loader, sched);   (2)
 *     while (ct_loader_next(loader, &x, &y) == CT_LOADER_BATCH) CT_FRAME {
 *         CT_ACCUMULATE(acc) {                                         (optional)
 *             ct_tensor *loss = forward(model, x, y);
 *             ct_accelerator_backward(acc, loss);                      (3) instead of ct_backward
 *             ct_optimizer_step(opt);                                  (4) unchanged calls, now
 *             ct_scheduler_step(sched);                                    steered by the
 *             ct_optimizer_zero_grad(opt);                                 Accelerator
 *         }
 *     }
 *     ct_accelerator_free(acc);
 *
 * Run as one process (`./train`) it changes nothing: one rank, no sockets. Under
 * `ctrain launch --num_processes N` (or mpirun, or Slurm) every process runs the same
 * program as one rank of N: prepare broadcasts rank 0's parameters, gives each rank
 * its share of the loader's batches (loader.h: "Ranks"), and wraps the model in DDP
 * (parallel/ddp.h), so backward averages the gradients over the ranks while it runs. With
 * a sharded strategy (the shard config, a DeepSpeed or FSDP plugin, or the launcher's
 * --use_deepspeed / --use_fsdp: accel/plugins.h) it builds the sharding engine
 * (parallel/shard.h) instead and hands the optimizer this rank's slices of the parameters
 * (docs/strategies.md). With Megatron-LM's settings (a ct_megatron_lm_plugin, or
 * `ctrain launch --use_megatron_lm --megatron_lm_tp_degree T`) the world becomes a mesh
 * dp x T (parallel/mesh.h): prepare shards the GPT or Llama over each group of T
 * neighbouring ranks (ct_gpt_tensor_parallel, ct_llama_tensor_parallel), hands the
 * optimizer the shards in place of the full parameters, wraps the model in DDP over
 * the data-parallel group, and gives the loader's batches out by data-parallel index
 * (the T ranks of one group see the same batches); the step sums the sequence-parallel
 * partial gradients over tp and clip_grad_norm takes the norm of the whole model.
 *
 * What prepare installs:
 *   - the optimizer's hooks (optim/optimizer.h): before a step the gradient
 *     reductions are waited for; on gradient-accumulation micro-steps step and
 *     zero_grad do nothing (and the step counts as skipped, so a scheduler does not
 *     advance: a prepared scheduler steps exactly once per optimizer step, never
 *     x num_processes, never per micro-step);
 *   - the loader's shard (rank r of N; even batches by default, padded by wrapping,
 *     so all ranks run the same number of steps; gather_for_metrics drops the padding).
 *
 * Gradient accumulation (gradient_accumulation_steps = K): ct_accelerator_backward
 * divides the loss by K; inside CT_ACCUMULATE the gradients are synchronised (and
 * the optimizer really steps) only on every K-th micro-step and on the last batch of
 * the loader's epoch; ct_accelerator_sync_gradients says which. K micro-steps of
 * batch b then equal one step of batch K*b.
 *
 * Errors: functions return a ct_status (or NULL) and set ct_last_error, naming the
 * rank; a collective that fails (a dead or desynchronised rank, a timeout) fails on
 * every rank. Thread-safety: one training thread per handle.
 */
#ifndef CT_ACCEL_ACCELERATOR_H
#define CT_ACCEL_ACCELERATOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/api.h"
#include "core/tensor.h"
#include "data/loader.h"
#include "parallel/ddp.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_model.h"
#include "dist/pg.h"
#include "parallel/shard.h"
#include "accel/checkpoint.h"
#include "accel/plugins.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "precision/fp8.h"
#include "precision/loss_scaler.h"

typedef struct ct_accelerator ct_accelerator;

/* Zero means default for every field; unset fields also read the launcher's
 * CTRAIN_* variables (ctrain launch flags). */
typedef struct ct_accelerator_config {
    int gradient_accumulation_steps; /* K >= 1; 0: CTRAIN_GRADIENT_ACCUMULATION_STEPS or 1 */
    const char *mixed_precision;     /* "no" (default; CTRAIN_MIXED_PRECISION), "bf16", "fp16", "fp8":
                                      * every op of the process autocasts (precision/autocast.h) from
                                      * ct_accelerator_new to ct_accelerator_free; fp16 adds the loss
                                      * scaler; fp8 runs linears in fp8 and the rest as bf16 */
    ct_loss_scaler_config loss_scaler; /* fp16's scaler; zero = defaults (65536, x2 after 2000, x0.5) */
    ct_fp8_recipe fp8;               /* fp8's recipe; a zero field reads the launcher's CTRAIN_FP8_*
                                      * variable, else its default (HYBRID, history 1024, margin 0,
                                      * max, embedding and head in bf16) */
    bool cpu;                        /* run on the CPU even where a GPU can be used (also the
                                      * launcher's --cpu: CTRAIN_USE_CPU=1); otherwise one
                                      * process trains on cuda:(local rank) when a GPU exists */
    ct_ddp_config ddp;               /* bucket sizes, compression */
    ct_shard_config shard;           /* strategy NO_SHARD (default): replicated, DDP with several
                                      * ranks; OPTIMIZER, GRAD_OP, FULL, HYBRID: the sharding engine
                                      * (parallel/shard.h), also with one rank. Its param_dtype 0
                                      * follows mixed_precision: bf16 (fp8: bf16) and fp16 make
                                      * the parameters 16-bit beside f32 masters; CT_DTYPE_F32
                                      * keeps them f32 (autocast per op) */
    const ct_deepspeed_plugin *deepspeed_plugin; /* or the sharding as DeepSpeed's settings */
    const ct_fsdp_plugin *fsdp_plugin;           /* or as FSDP's (accel/plugins.h); with none of
                                      * the three, the launcher's --use_deepspeed / --use_fsdp flags */
    const ct_megatron_lm_plugin *megatron_lm_plugin; /* Megatron-LM tensor parallelism (or the
                                      * launcher's --use_megatron_lm): prepare shards a GPT or a
                                      * Llama over tp_degree ranks, DDP over the rest (docs/strategies.md,
                                      * "Megatron-LM through the Accelerator") */
    double timeout_s;                /* collectives and rendezvous; 0: CTRAIN_TIMEOUT or 300 */
    ct_project_config project;       /* where save_state(acc, NULL) puts checkpoints
                                      * (accel/checkpoint.h); project_dir is copied */
} ct_accelerator_config;

/* Joins the job the environment describes (dist/env.h: ctrain launch, mpirun, Slurm,
 * or one plain process) and sets ctrain's thread count from
 * CTRAIN_NUM_THREADS when the launcher set it. cfg NULL = all defaults. New handle
 * owned by the caller (ct_accelerator_free); NULL + error (a bad setting names the
 * key and value; an unreachable rank 0 names the address). */
CT_API ct_accelerator *ct_accelerator_new(const ct_accelerator_config *cfg);

/* Prepares the training objects, each optional (NULL): model (broadcast from rank
 * 0, wrapped in DDP when there are several ranks, or sharded), optimizer (hooks; its
 * parameters become this rank's slices when sharded), loader (this rank's shard),
 * scheduler (steps once per real optimizer step). A ds_config's batch sizes are checked
 * here, against the loader's. Call once, on every rank, before the loop; the objects
 * stay the caller's and must outlive the handle. */
CT_API ct_status ct_accelerator_prepare(ct_accelerator *acc, ct_module *model, ct_optimizer *opt, ct_loader *loader,
                                        ct_scheduler *sched);

/* Where prepare puts the model, its gradients, the optimizer's state and the
 * loader's batches: cuda:N when a GPU can be used (one process, no sharding: see
 * cpu above), else the CPU. Tensors the loop makes itself go there with ct_tensor_to. */
CT_API ct_device ct_accelerator_device(const ct_accelerator *acc);

/* backward(loss / K). With DDP and sync on, the reductions start during it. */
CT_API ct_status ct_accelerator_backward(ct_accelerator *acc, ct_tensor *loss);

/* The accumulation scope: CT_ACCUMULATE(acc) { ...one micro-step... } decides, on
 * entry, whether this micro-step synchronises (K-th micro-step or the loader's last
 * batch of the epoch). Equivalent to ct_accelerator_accumulate_begin(acc) before the
 * block. */
CT_API void ct_accelerator_accumulate_begin(ct_accelerator *acc);
#define CT_ACCUMULATE(acc) \
    for (int ct_acc_once_ = (ct_accelerator_accumulate_begin(acc), 1); ct_acc_once_; ct_acc_once_ = 0)
/* True when the current micro-step synchronises gradients (always true with K = 1). */
CT_API bool ct_accelerator_sync_gradients(const ct_accelerator *acc);
/* True when the last optimizer step was skipped: an accumulation micro-step, or (fp16)
 * gradients that held an inf or NaN, after which the scaler backed off and a prepared
 * scheduler did not advance; ct_accelerator_step_overflowed tells the second case. */
CT_API bool ct_accelerator_step_was_skipped(const ct_accelerator *acc);
CT_API bool ct_accelerator_step_overflowed(const ct_accelerator *acc);
/* The loss scale (1 unless fp16), and "no", "bf16", "fp16" or "fp8". */
CT_API double ct_accelerator_loss_scale(const ct_accelerator *acc);
CT_API const char *ct_accelerator_mixed_precision(const ct_accelerator *acc);

/* The global L2 (norm_type 2) or other p-norm of the prepared model's gradients
 * after synchronisation, and clips them to max_norm (like torch's clip_grad_norm_).
 * fp16: the gradients are unscaled first (once per step); when they hold an inf or
 * NaN it returns inf, clips nothing, and the step will be skipped. On a micro-step
 * that does not synchronise it does nothing and returns 0. NAN + error on failure. */
CT_API double ct_accelerator_clip_grad_norm(ct_accelerator *acc, double max_norm, double norm_type);

/* Collectives on tensors, every rank calling with the same shapes (new tensors owned
 * by the current frame; NULL + error):
 *   gather:             t (n, ...) from every rank -> (N*n, ...), rank order;
 *   gather_for_metrics: the same, minus the padding rows even batches added to the
 *                       prepared loader's last batch (so each sample counts once);
 *   reduce:             the sum (or mean) over ranks, on every rank;
 *   pad_across_processes: t padded along dim to the largest size on any rank with
 *                       pad_value (at the end, or at the start with pad_first). */
CT_API ct_tensor *ct_accelerator_gather(ct_accelerator *acc, const ct_tensor *t);
CT_API ct_tensor *ct_accelerator_gather_for_metrics(ct_accelerator *acc, const ct_tensor *t);
CT_API ct_tensor *ct_accelerator_reduce(ct_accelerator *acc, const ct_tensor *t, bool mean);
CT_API ct_tensor *ct_accelerator_pad_across_processes(ct_accelerator *acc, const ct_tensor *t, int dim, double pad_value,
                                                      bool pad_first);

/* Blocks until every rank has called it. */
CT_API ct_status ct_accelerator_wait_for_everyone(ct_accelerator *acc);

/* printf on the main process only (rank 0); returns what printf returned, 0 elsewhere. */
CT_API int ct_accelerator_print(const ct_accelerator *acc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This process's rank among all processes (0 .. num_processes - 1). */
CT_API int ct_accelerator_process_index(const ct_accelerator *acc);
/* Number of processes taking part (the world size; 1 without a launcher). */
CT_API int ct_accelerator_num_processes(const ct_accelerator *acc);
/* This process's rank on its machine (LOCAL_RANK). */
CT_API int ct_accelerator_local_process_index(const ct_accelerator *acc);
/* True on the process of rank 0. */
CT_API bool ct_accelerator_is_main_process(const ct_accelerator *acc);
/* True on the process of local rank 0 of each machine. */
CT_API bool ct_accelerator_is_local_main_process(const ct_accelerator *acc);
/* Micro-steps per optimizer step (1 unless configured). */
CT_API int ct_accelerator_gradient_accumulation_steps(const ct_accelerator *acc);

/* CT_MAIN_PROCESS_FIRST(acc) { ... }: rank 0 runs the block first, the others wait,
 * then run it (e.g. rank 0 downloads or tokenises, the others then read its files). */
CT_API ct_status ct_accelerator_main_first_begin(ct_accelerator *acc);
CT_API ct_status ct_accelerator_main_first_end(ct_accelerator *acc);
#define CT_MAIN_PROCESS_FIRST(acc)                                                         \
    for (int ct_mpf_once_ = (ct_accelerator_main_first_begin(acc), 1); ct_mpf_once_;     \
         ct_mpf_once_ = 0, ct_accelerator_main_first_end(acc))

/* Seeds every ctrain generator (ct_set_seed) with seed, plus the rank when
 * device_specific (different dropout masks per rank, same initial weights via the
 * broadcast). */
CT_API void ct_accelerator_set_seed(ct_accelerator *acc, uint64_t seed, bool device_specific);

/* The group of all ranks (borrowed) and the DDP engine (borrowed; NULL with one rank
 * or before prepare), for programs that need more. */
CT_API ct_pg *ct_accelerator_pg(const ct_accelerator *acc);
CT_API ct_ddp *ct_accelerator_ddp(const ct_accelerator *acc);
/* The sharding engine (borrowed; NULL unless a sharded strategy was prepared). */
CT_API ct_shard *ct_accelerator_shard(const ct_accelerator *acc);
/* The pp x dp x tp device mesh of Megatron-LM tensor and pipeline parallelism
 * (borrowed; NULL unless prepare sharded a model over tp_degree > 1 ranks or cut it
 * into pp_degree > 1 stages): its per-axis groups. */
CT_API const ct_mesh *ct_accelerator_mesh(const ct_accelerator *acc);
/* Under Megatron-LM pipeline parallelism (pp_degree > 1): this rank's stage
 * (parallel/pipeline_model.h: its layers, parameters, engine statistics and bytes
 * sent), and the seconds this rank spent in the stage's gradient reductions since
 * prepare (the average over dp, the tied embedding's and sequence parallelism's sums;
 * blocking, before each optimizer step: nothing overlaps them). NULL and 0 otherwise. */
CT_API ct_pipeline_model *ct_accelerator_pipeline(const ct_accelerator *acc);
CT_API double ct_accelerator_pipeline_reduce_seconds(const ct_accelerator *acc);
/* True when a forward of the prepared model needs every rank: under a sharded strategy
 * (ZeRO-3 and FSDP gather parameters; the engine's hooks run on every rank), tensor
 * parallelism (the model's collectives) or pipeline parallelism (every stage runs its
 * part of the loss). Evaluation then runs on every rank instead of
 * rank 0 alone. */
CT_API bool ct_accelerator_forward_needs_all_ranks(const ct_accelerator *acc);
/* True when FSDP's state_dict_type is SHARDED_STATE_DICT (ct_fsdp_plugin,
 * --fsdp_state_dict_type, CTRAIN_FSDP_STATE_DICT_TYPE): under a sharded strategy
 * ct_accelerator_save_model then writes a sharded checkpoint. */
CT_API bool ct_accelerator_sharded_state_dict(const ct_accelerator *acc);

/* ---- the model's full state, from any strategy ------------------------------------ */

/* Names and tensors, owned (ct_state_dict_free). */
typedef struct ct_state_dict {
    int n;
    char **names;
    ct_tensor **tensors;
} ct_state_dict;

/* The prepared model's parameters and buffers, full (gathered from the shards under
 * a sharded strategy), as owned copies on every rank. Every rank must call it. Always
 * full, SHARDED_STATE_DICT or not, as Accelerate's get_state_dict. */
CT_API ct_status ct_accelerator_get_state_dict(ct_accelerator *acc, ct_module *model, ct_state_dict *out);
/* Frees a state dict and the tensors it owns; NULL is fine. */
CT_API void ct_state_dict_free(ct_state_dict *sd);
/* Writes the full model to path (safetensors, ct_module_save's format) from rank 0;
 * every rank calls it and returns once the file is written (or with rank 0's error).
 *
 * Under a sharded strategy with SHARDED_STATE_DICT (ct_accelerator_sharded_state_dict)
 * nothing is gathered: path becomes a directory (created with mode 0755; an existing
 * non-directory there is an error naming it) holding one safetensors file per rank
 * of the first shard group, model-rank00000-of-00004.safetensors ...: that rank's
 * part of each parameter as f32, with the parts' places in its metadata
 * (docs/strategies.md, "Sharded checkpoints"); file 0 also holds the buffers. Rank
 * files of an earlier save with another file count are removed from the directory.
 * Every rank calls it; every rank returns CT_OK once every file is written, or the
 * error of the lowest rank that failed (the others' messages name that rank). Read
 * it back with ct_accelerator_load_model, or merge it with ct_sharded_model_merge. */
CT_API ct_status ct_accelerator_save_model(ct_accelerator *acc, ct_module *model, const char *path);
/* Loads a model saved by ct_accelerator_save_model, with any number of ranks and any
 * strategy: path is one full safetensors file or a sharded directory (told apart by
 * what path is). Every rank calls it, after prepare (before prepare it loads into the
 * plain model, which prepare then shares out from rank 0). Replicated (one process,
 * DDP), each rank loads the whole model (a directory is merged in memory); under a
 * sharded strategy each rank reads only the elements of its slices, into the engine
 * (ct_shard_load_params, parallel/shard_state.h), and the buffers. Names and shapes must
 * match the model's exactly: a tensor missing from the checkpoint, one the model does
 * not have, another shape, or a sharded directory that fails the checks of
 * ct_sharded_model_merge is an error naming it, and this rank's model is then left as
 * it was (everything is checked and read before anything is written). The
 * optimizer's state is not touched. Every rank returns CT_OK, or the error of the
 * lowest rank that failed. */
CT_API ct_status ct_accelerator_load_model(ct_accelerator *acc, ct_module *model, const char *path);
/* Merges the sharded checkpoint in dir (written under SHARDED_STATE_DICT) into one
 * safetensors file at out_path (atomically), with the tensors in the model's order and
 * dtypes: the file a FULL_STATE_DICT save of the same model writes, loadable by
 * ct_module_load. The directory is checked first: every rank file present, each with
 * the format, the file count, its own index and the same save; every element of every
 * parameter in exactly one file; one shape per parameter. Each problem is an error
 * naming the file, the parameter and the elements. One process, no Accelerator
 * (`ctrain merge-weights DIR OUT`). */
CT_API ct_status ct_sharded_model_merge(const char *dir, const char *out_path);
/* The plain model back: under a sharded strategy every parameter is gathered into it
 * (every rank calls this) and the engine lets go of it, so one rank alone may then
 * evaluate, sample or save it; the Accelerator no longer trains it (a later step
 * fails, saying so). Without sharding: model itself, nothing changes. NULL + error. */
CT_API ct_module *ct_accelerator_unwrap_model(ct_accelerator *acc, ct_module *model);

/* Removes the hooks it installed, frees DDP and the group. NULL is fine. */
CT_API void ct_accelerator_free(ct_accelerator *acc);

#endif
