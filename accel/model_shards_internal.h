/* ctrain — sharded model checkpoints (SHARDED_STATE_DICT), shared by
 * accel/model_shards.c (the format, its reader, the save and the merge),
 * accel/model_load.c (ct_accelerator_load_model) and accel/model_state.c (which
 * dispatches save_model). Not installed.
 *
 * A sharded checkpoint is a directory of S files, S the shard group's size when it
 * was written: model-rank00000-of-0000S.safetensors, ... File r holds rank r's part
 * of each parameter its slices reach (elements [begin, end) of the flattened
 * parameter) as a 1-d F32 tensor under the parameter's name; file 0 also holds the
 * buffers, whole. Each header's __metadata__:
 *   ctrain.format      "sharded-model-v1"
 *   ctrain.files       S
 *   ctrain.file        r
 *   ctrain.checkpoint  16 hex digits, the same in every file of one save (a hash of
 *                      all the parts and buffers: files of two saves differ in it)
 *   ctrain.params      P, the model's parameter count
 *   ctrain.param.I     (file 0 only) the name of parameter I, 0 <= I < P: a parameter
 *                      that has no part in any file shows against this list
 *   ctrain.part.NAME   "begin=B end=E shape=[d0,d1] dtype=f32 index=I": the part's
 *                      elements, the full parameter's shape and dtype, and its
 *                      position among the model's parameters (the merged order)
 */
#ifndef CT_ACCEL_MODEL_SHARDS_INTERNAL_H
#define CT_ACCEL_MODEL_SHARDS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "accel/accelerator.h"
#include "core/safetensors.h"
#include "parallel/shard_state.h"

#define CT_MODEL_SHARDS_FORMAT "sharded-model-v1"

/* Where one part of a tensor is: elements [begin, end) of the flattened tensor, in
 * file `file` under the tensor's name. */
typedef struct ct_ckpt_part {
    int file;
    int64_t begin, end;
} ct_ckpt_part;

/* One parameter or buffer of a checkpoint. */
typedef struct ct_ckpt_entry {
    const char *name; /* borrowed from a file's handle */
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t numel;
    ct_dtype dtype;   /* of the model's tensor (a part is F32 whatever this is) */
    int64_t index;    /* the merged order: the parameter's position, buffers after */
    bool whole;       /* one tensor in its own shape and dtype (a buffer, or any tensor of
                       * a full file), read as it is */
    ct_ckpt_part *parts; /* sorted by begin, covering [0, numel) once (checked) */
    int nparts, cap;
} ct_ckpt_entry;

/* An open checkpoint: a full safetensors file or a validated sharded directory. */
typedef struct ct_ckpt {
    const char *prefix; /* of the rank files' names: "model" (<prefix>-rank*-of-*.safetensors) */
    const char *format; /* their ctrain.format: CT_MODEL_SHARDS_FORMAT */
    bool sharded;
    int nfiles;
    ct_safetensors **files;
    char **paths;     /* each file's path, for messages */
    ct_ckpt_entry *e;
    int n, cap;
} ct_ckpt;

/* Opens path: a directory is read as a sharded checkpoint and validated whole
 * (ct_sharded_model_merge lists the checks), a file as one full safetensors file
 * (unless sharded_only: then it is an error naming it). Fills *ck (cti_ckpt_close,
 * also after a failure). */
ct_status cti_ckpt_open(const char *path, bool sharded_only, ct_ckpt *ck);
void cti_ckpt_close(ct_ckpt *ck);
/* Opens the rank files <prefix>-rank*-of-*.safetensors of dir, of this format, as
 * a sharded checkpoint (the same checks). */
ct_status cti_ckpt_open_parts(const char *dir, const char *prefix, const char *format, ct_ckpt *ck);
/* "<prefix>-rank0000r-of-0000n.safetensors" into buf. */
void cti_ckpt_rank_file_name(char *buf, size_t cap, const char *prefix, int r, int n);

/* One rank file to write: its parts (1-d F32 or F64 values of elements [begin, end)
 * of the named tensors), and in file 0 the list of every split tensor's name (the
 * merged order; every part's name must be in it), whole tensors and extra metadata. */
typedef struct cti_ckpt_parts_file {
    const char *prefix, *format;
    int file, nfiles;
    uint64_t id; /* the save's id, the same in every file */
    const ct_shard_part *parts;
    int nparts;
    const char *const *list;
    int nlist;
    const char *const *whole_names; /* file 0 only */
    ct_tensor *const *whole;
    int nwhole;
    const char *const *meta_keys, *const *meta_vals; /* every file */
    int nmeta;
    uint64_t *xxh3; /* when not NULL: the file's XXH3-64 and size, as written */
    int64_t *bytes;
} cti_ckpt_parts_file;
/* Writes w into dir (ct_safetensors_save: atomically). */
ct_status cti_ckpt_write_parts(const char *dir, const cti_ckpt_parts_file *w);
/* The entry named name, or NULL. Borrowed. */
const ct_ckpt_entry *cti_ckpt_find(const ct_ckpt *ck, const char *name);
/* Elements [begin, end) of x, flattened, into dst (1-d, end - begin elements, any
 * floating dtype: converted). */
ct_status cti_ckpt_read(const ct_ckpt *ck, const ct_ckpt_entry *x, int64_t begin, int64_t end, ct_tensor *dst);
/* All of x in its shape and dtype: new tensor in the current frame, NULL + error. */
ct_tensor *cti_ckpt_read_whole(const ct_ckpt *ck, const ct_ckpt_entry *x);

/* Every rank's status, agreed over the Accelerator's group (a collective): CT_OK on
 * every rank when each had CT_OK; else every rank returns the status and the message
 * of the lowest rank that failed (the others' say which rank it was). A failure of
 * the collective itself is returned as it is. */
ct_status cti_ckpt_agree(ct_accelerator *acc, ct_status st);

/* ct_accelerator_save_model under a sharded strategy with SHARDED_STATE_DICT. */
ct_status cti_model_shards_save(ct_accelerator *acc, ct_module *model, const char *dir);
/* The same, and this rank's file's XXH3-64 and size as written (untouched on a rank
 * that writes no file). */
ct_status cti_model_shards_save_hashed(ct_accelerator *acc, ct_module *model, const char *dir, uint64_t *xxh3,
                                       int64_t *bytes);

#endif
