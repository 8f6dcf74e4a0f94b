/* ctrain — training-state checkpoints: save_state / load_state, as Accelerate's.
 *
 *     ct_accelerator_config cfg = {.project = {.project_dir = "runs/gpt",
 *                                              .automatic_checkpoint_naming = true,
 *                                              .total_limit = 3}};
 *     ct_accelerator *acc = ct_accelerator_new(&cfg);
 *     ct_accelerator_prepare(acc, model, opt, loader, sched);
 *     if (resuming) ct_accelerator_load_state(acc, NULL);     the latest complete checkpoint
 *     for (...) {
 *         ...one optimizer step...
 *         if (step % 100 == 0) ct_accelerator_save_state(acc, NULL);   checkpoint_<i>
 *     }
 *
 * What a checkpoint holds: the model's parameters and buffers as the strategy holds
 * them (model.safetensors, replicated; one model-rank*-of-*.safetensors per rank of
 * the shard group, sharded), the optimizer's state (moments, per-parameter step counts,
 * base lr, group lr scales and weight decays, hyper-parameters; one
 * optimizer-rank*-of-*.safetensors per shard rank, element ranges of each
 * parameter), the scheduler's position, the fp16 loss scaler, the fp8 scaling state
 * (amax histories and scales), every rank's process generator (Philox seed and
 * offset: dropout), the prepared loader's cursor (epoch, position, shuffle seed), the
 * gradient-accumulation counter and the registered objects. manifest.json is written
 * last and lists every file with its size and XXH3-64 checksum; docs/checkpoints.md
 * has the layout.
 *
 * Guarantees:
 *   - resume is bitwise: N steps straight equal k steps, save, load in a new process,
 *     N - k steps (same world size and strategy);
 *   - a checkpoint loads at another world size and strategy (resharding: parameters
 *     and moments are stored as element ranges of each named parameter); the loader
 *     continues at the same sample when the global batch (batch_size x ranks) is kept;
 *   - crash safety: files are written into "<dir>.tmp-<id>", fsynced, the manifest
 *     last, and the directory renamed into place; a save killed at any moment leaves
 *     the previous checkpoint loadable and nothing that reads as complete;
 *   - a failed load (missing, truncated or corrupted file, another model, optimizer or
 *     format) names the file and the tensor, and changes nothing in memory.
 *
 * Ranks. Every rank calls save_state and load_state. Where rank 0 holds the whole state
 * (one process, DDP: replicated), save_state does no collective, so Accelerate's
 * `if (is_main_process) save_state(...)` works there too: rank 0 writes everything,
 * the other ranks return at once. Under DDP the ranks consume their process
 * generators in lockstep (the same ops on the same shapes), so rank 0 records its
 * offset and each rank resumes at it on its own seed (the one ct_accelerator_set_seed
 * gave it). Under a sharded strategy every rank writes its own files and the call is
 * collective: called on rank 0 alone it fails at once, naming the fix, and the other
 * ranks' next collective fails with a desync instead of hanging. Under Megatron-LM
 * tensor parallelism the checkpoint holds the whole model and optimizer state, as one
 * process writes it (gathered over tp; docs/checkpoints.md, "Tensor parallelism"): every
 * rank calls save_state, and it loads at any tp degree, in one process or under DDP.
 */
#ifndef CT_ACCEL_CHECKPOINT_H
#define CT_ACCEL_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/api.h"
#include "core/error.h"
#include "core/philox.h"

typedef struct ct_accelerator ct_accelerator;
typedef struct ct_state_dict ct_state_dict;

/* Accelerate's ProjectConfiguration (the `project` field of ct_accelerator_config). */
typedef struct ct_project_config {
    const char *project_dir;          /* where automatic checkpoints go; NULL = "." */
    bool automatic_checkpoint_naming; /* save_state(acc, NULL) writes
                                       * <project_dir>/checkpoints/checkpoint_<iteration> */
    int total_limit;                  /* > 0: after a save completes, the oldest complete
                                       * automatic checkpoints beyond this many are removed */
    int64_t iteration;                /* the next automatic checkpoint's number; 0 = one past the
                                       * highest present (a resumed run never overwrites) */
} ct_project_config;

/* An object the user adds to the checkpoint (Accelerate's register_for_checkpointing):
 * state_dict fills out with owned tensors (ct_state_dict_free frees them);
 * load_state_dict restores from sd and must check everything before changing anything
 * (a non-zero status fails the whole load). Rank 0's object is saved, under
 * custom_<name>.safetensors; every rank loads it. */
typedef struct ct_checkpointable {
    const char *name; /* unique among the registered objects: [A-Za-z0-9_.-], 1..64 chars */
    ct_status (*state_dict)(void *obj, ct_state_dict *out);
    ct_status (*load_state_dict)(void *obj, const ct_state_dict *sd);
    void *obj;
} ct_checkpointable;

/* Registers obj (copied; obj->obj borrowed, it must outlive the handle). Error for a bad
 * or taken name, or a NULL callback. */
CT_API ct_status ct_accelerator_register_for_checkpointing(ct_accelerator *acc, const ct_checkpointable *obj);
/* A checkpointable for a generator of the program's own (a dropout layer's rng, a
 * sampler's): its seed and offset, as i64 tensors "seed" and "offset". */
CT_API ct_checkpointable ct_rng_checkpointable(const char *name, ct_rng *rng);

/* Saves the training state into dir (created; an existing checkpoint there is replaced
 * only once the new one is complete). dir NULL: the project's next automatic
 * checkpoint (automatic_checkpoint_naming must be on), then total_limit is applied.
 * Refused in the middle of a gradient-accumulation window (after a micro-step that did
 * not synchronise): the accumulated gradients are not checkpointed. Every rank returns
 * CT_OK or the error of the lowest rank that failed. */
CT_API ct_status ct_accelerator_save_state(ct_accelerator *acc, const char *dir);
/* Restores the state saved in dir; NULL: the latest complete automatic checkpoint of
 * the project (an error when there is none). Call after prepare, on every rank. The
 * whole checkpoint is verified (manifest, sizes, checksums, names, shapes, dtypes, the
 * optimizer's kind and groups) before anything changes; on error nothing has. Any
 * world size and strategy may load it (resharding); the project's iteration becomes
 * one past the loaded checkpoint's number. */
CT_API ct_status ct_accelerator_load_state(ct_accelerator *acc, const char *dir);
/* The directory the last successful save_state wrote or load_state read ("" before).
 * Borrowed, valid until the next save or load. */
CT_API const char *ct_accelerator_last_checkpoint(const ct_accelerator *acc);

/* ---- without an Accelerator: inspecting checkpoints (ctrain checkpoint DIR) -------- */

/* How many checkpoint_<i> directories <project_dir>/checkpoints holds, complete or not
 * (0 when it does not exist; an interrupted save's "checkpoint_<i>.tmp-<id>" is none);
 * -1 out of memory. 0 means a run has nothing to resume: `--resume auto` in the GPT
 * example then starts fresh, while an incomplete one is left to load_state to refuse. */
CT_API int ct_checkpoint_count(const char *project_dir);

/* The latest complete checkpoint_<i> under <project_dir>/checkpoints (the highest i
 * whose manifest verifies in size) into out. CT_ERR_NOT_FOUND-like CT_ERR_INVALID with
 * a message when there is none. */
CT_API ct_status ct_checkpoint_latest(const char *project_dir, char *out, size_t cap);

/* What a manifest says. */
typedef struct ct_checkpoint_info {
    int format_version;
    char ctrain_version[32];
    int64_t step;             /* optimizer steps taken when saved */
    int world_size;           /* ranks that saved it */
    int shard_world;          /* files per sharded part (1 replicated) */
    char strategy[32];        /* "NO_SHARD" (one process, DDP), "OPTIMIZER", "GRAD_OP", "FULL", "HYBRID" */
    char mixed_precision[8];  /* "no", "bf16", "fp16", "fp8" */
    char optimizer[16];       /* "adamw", ...; "" without one */
    int nfiles;
    int64_t tensors;          /* tensors in all files */
    int64_t bytes;            /* bytes in all files */
    int tp_degree, dp_degree; /* Megatron-LM's layout when saved: tensor- and data-parallel
                               * ranks (tp 1 and dp = world_size without it) */
    int pp_degree;            /* and pipeline stages (1 without it) */
} ct_checkpoint_info;

/* Reads dir's manifest into *info and (verify) checks every file it lists: present,
 * the recorded size, the recorded checksum, a safetensors header that parses with the
 * recorded tensor count. Prints to report when not NULL: a summary of the manifest
 * (four lines: directory; format, step, world size; strategy, precision, optimizer;
 * files, tensors, bytes), then one line per verified file. The first problem is the error, naming
 * the file and what was expected and found. */
CT_API ct_status ct_checkpoint_inspect(const char *dir, bool verify, ct_checkpoint_info *info, FILE *report);

#endif
