/* ctrain — training-state checkpoints, shared by accel/checkpoint_files.c (the
 * manifest, checksums, directories, automatic naming), accel/checkpoint_save.c and
 * accel/checkpoint_load.c. Not installed. The layout is in docs/checkpoints.md.
 */
#ifndef CT_ACCEL_CHECKPOINT_INTERNAL_H
#define CT_ACCEL_CHECKPOINT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "accel/accelerator_internal.h"
#include "accel/checkpoint.h"

#define CT_CKPT_FORMAT "ctrain-checkpoint"
#define CT_CKPT_FORMAT_VERSION 1
#define CT_CKPT_MANIFEST "manifest.json"
#define CT_CKPT_STATE "trainer_state.json"
#define CT_CKPT_MODEL "model.safetensors"
#define CT_CKPT_FP8 "fp8_state.safetensors"
#define CT_CKPT_OPT_PREFIX "optimizer"
#define CT_CKPT_OPT_FORMAT "sharded-optimizer-v1"
/* the longest file name a checkpoint holds (custom_<64 chars>.safetensors fits) */
#define CT_CKPT_NAME_MAX 96

/* Optimizer parameter i as a checkpoint names it: its model parameter's name (the one it
 * is, or, sharded, the one it is a slice of), else "optimizer.param.<i>", into buf; the
 * full parameter (its shape) and the elements [*b, *e) of it this rank holds. */
void cti_ckpt_opt_param(const ct_accelerator *a, int i, char *buf, size_t cap, const ct_tensor **full, int64_t *b,
                        int64_t *e);

/* One file of a checkpoint as the manifest lists it. */
typedef struct cti_ckpt_file {
    char name[CT_CKPT_NAME_MAX];
    int64_t bytes;
    uint64_t xxh3;
    int64_t tensors; /* in a safetensors file; 0 otherwise */
    char dtypes[64]; /* its tensors' dtypes, distinct, in order of first use: "f32,i64"; "" otherwise */
} cti_ckpt_file;

/* XXH3-64 and size of the file at path (read through a mapping). */
ct_status cti_ckpt_hash_file(const char *path, uint64_t *xxh3, int64_t *bytes);
/* Adds dt to f->dtypes unless it is there. */
void cti_ckpt_note_dtype(cti_ckpt_file *f, ct_dtype dt);
/* Writes n tensors to dir/name (ct_safetensors_save_hashed) and describes the file
 * into *f from what was written: no second read. */
ct_status cti_ckpt_save_tensors(const char *dir, const char *name, int n, const char *const *names,
                                ct_tensor *const *ts, cti_ckpt_file *f);
/* Fills f for dir/name by reading it: size, checksum, tensor count, dtypes. */
ct_status cti_ckpt_describe_file(const char *dir, const char *name, cti_ckpt_file *f);
/* The same for a file whose checksum and size are known from writing it: only its
 * safetensors header is read (tensor count, dtypes). */
ct_status cti_ckpt_describe_written(const char *dir, const char *name, uint64_t xxh3, int64_t bytes, cti_ckpt_file *f);
/* Reads the whole file at path (at most max bytes) into *text (malloc'd, NUL-ended) and
 * *len: 0; the errno of a failed open (> 0); -1 when it cannot be read or is too large. */
int cti_ckpt_read_text(const char *path, size_t max, char **text, size_t *len);
/* Writes text to dir/name durably (temporary file, fsync, rename, directory fsync). */
ct_status cti_ckpt_write_text(const char *dir, const char *name, const char *text);
/* Creates dir and its missing parents (mode 0755). */
ct_status cti_ckpt_mkdirs(const char *dir);
/* Removes path and everything under it; a missing path is fine. */
ct_status cti_ckpt_remove_tree(const char *path);
/* The manifest of a save (rank 0 writes it last). */
typedef struct cti_ckpt_manifest {
    int64_t step;
    int world_size, shard_world;
    const char *strategy, *mixed_precision, *optimizer;
    bool sharded_model;
    int tp, dp, pp; /* the Megatron-LM layout (tp, pp 1 without it; dp the data-parallel ranks) */
    const cti_ckpt_file *files;
    int nfiles;
} cti_ckpt_manifest;
ct_status cti_ckpt_write_manifest(const char *dir, const cti_ckpt_manifest *m);
/* Reads and checks dir's manifest and (verify) every file it lists; *files and *n
 * the list (malloc'd, caller frees). */
ct_status cti_ckpt_read_manifest(const char *dir, bool verify, ct_checkpoint_info *info, cti_ckpt_file **files,
                                 int *n, FILE *report);
/* Verifies files [first, n) stepping by stride (each rank its share). */
ct_status cti_ckpt_verify_files(const char *dir, const cti_ckpt_file *files, int n, int first, int stride,
                                FILE *report);

/* <project_dir>/checkpoints (malloc'd). */
char *cti_ckpt_auto_root(const char *project_dir);
/* The i of a name "checkpoint_<i>" exactly (decimal digits, no suffix), or -1. */
int64_t cti_ckpt_auto_index(const char *name);
/* The highest i of a checkpoint_<i> directory under root, complete or not; -1 when none. */
int64_t cti_ckpt_auto_highest(const char *root);
/* Removes the oldest complete checkpoint_<i> beyond the newest `limit` complete ones,
 * and stale "*.tmp-*" directories of interrupted saves; never the newest complete one. */
ct_status cti_ckpt_apply_total_limit(const char *root, int limit);

/* What one rank saves of its own: its process generator and its loader's cursor. */
typedef struct cti_rank_state {
    uint64_t rng_seed, rng_offset;
    int64_t epoch, position;
} cti_rank_state;

/* trainer_state.json: everything but tensors. */
typedef struct cti_trainer_state {
    int64_t step;                 /* optimizer steps */
    bool has_sched;
    int64_t sched_position;
    int accumulation_steps;
    int64_t micro;                /* micro-steps into the window (always 0: saves are refused mid-window) */
    bool has_scaler;              /* fp16 */
    double scale;
    int64_t good_steps, overflows, scaler_steps, scaler_skipped;
    bool has_loader;
    int64_t batch_size, loader_world, num_batches;
    bool shuffle;
    uint64_t loader_seed;
    bool lockstep;                /* replicated: rank 0's stream stands for every rank's */
    bool seeded, seed_per_rank;   /* ct_accelerator_set_seed's rule */
    uint64_t seed_base;
    int nranks;
    cti_rank_state *ranks;        /* nranks (1 when lockstep) */
    bool has_fp8;
    int64_t fp8_history, fp8_slots;
    int ncustom;
    char (*custom)[72];           /* the registered objects' names */
} cti_trainer_state;

ct_status cti_ckpt_write_trainer_state(const char *dir, const cti_trainer_state *s);
/* Reads dir's trainer_state.json into *s (cti_trainer_state_free). */
ct_status cti_ckpt_read_trainer_state(const char *dir, cti_trainer_state *s);
void cti_trainer_state_free(cti_trainer_state *s);

/* The fault-injection point of the crash tests: with CTRAIN_TEST_CHECKPOINT_KILL_AT=k
 * set, the k-th call (1-based) in this process kills it (SIGKILL), as a crash would;
 * without it, nothing. Called after every file of a save is durable, after the
 * manifest and after the rename. */
void cti_ckpt_fault_point(void);

#endif
