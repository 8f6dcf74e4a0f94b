/* ctrain — the weights of a Hugging Face model directory, single-file or sharded.
 *
 * Reading. A directory holds either
 *   model.safetensors                     every tensor in one file, or
 *   model.safetensors.index.json          {"metadata": {...}, "weight_map": {"name": "shard file", ...}}
 *   model-00001-of-0000N.safetensors ...  the shards it names
 * (model.safetensors wins when both exist, as in transformers). Opening an index
 * checks it whole before any tensor is read: a JSON object with a "weight_map" object
 * of strings, shard names that are plain file names in the directory, every shard
 * present and valid, every tensor of every shard mapped to that shard exactly once,
 * every mapped name present in its shard.
 *
 * Writing follows transformers' save_pretrained: tensors in order fill a shard until
 * the next one would take it past max_shard_bytes (a tensor larger than that gets a
 * shard of its own); one shard is written as model.safetensors, several as
 * model-XXXXX-of-YYYYY.safetensors plus the index, with "total_size" (the bytes of
 * tensor data) in its metadata. Every file carries the metadata {"format": "pt"}.
 * Weight files of the other layout, or stale shards, left in the directory are
 * removed after the new ones are written.
 */
#ifndef CT_NN_HF_WEIGHTS_H
#define CT_NN_HF_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "nn/module.h"

/* transformers' default max_shard_size "5GB" (decimal gigabytes) */
#define CT_HF_MAX_SHARD_DEFAULT ((int64_t)5000000000)

typedef struct ct_hf_weights ct_hf_weights;

/* Opens path: a model directory as above, or one .safetensors file. The caller owns
 * the handle (ct_hf_weights_close). NULL + error naming the file and the problem. */
CT_API ct_hf_weights *ct_hf_weights_open(const char *path);
CT_API void ct_hf_weights_close(ct_hf_weights *w); /* NULL is fine */
/* Number of tensors over all shards. */
CT_API int ct_hf_weights_count(const ct_hf_weights *w);
/* Name of tensor i (shard by shard, file order in each). Borrowed. */
CT_API const char *ct_hf_weights_name(const ct_hf_weights *w, int i);
/* Index of the tensor with this name, or -1. */
CT_API int ct_hf_weights_find(const ct_hf_weights *w, const char *name);
/* The open shard holding tensor i. Borrowed. */
CT_API ct_safetensors *ct_hf_weights_shard(const ct_hf_weights *w, int i);
/* Number of shard files (1 for a single file). */
CT_API int ct_hf_weights_shard_count(const ct_hf_weights *w);
/* The tensor's data (new reference, current frame), or NULL + error. */
CT_API ct_tensor *ct_hf_weights_get(ct_hf_weights *w, const char *name);

/* ct_module_load_mapped over a directory's weights (or one file): map NULL = names as
 * they are; strict and report as ct_module_load; nothing is copied when a strict
 * load is refused. */
CT_API ct_status ct_hf_weights_load(ct_module *m, const char *path, bool strict, ct_load_report *report,
                                    ct_load_key_fn map, void *ctx);

/* Writes n tensors (any device) under dir (which must exist) as described above;
 * max_shard_bytes <= 0 = CT_HF_MAX_SHARD_DEFAULT. */
CT_API ct_status ct_hf_weights_save(const char *dir, int n, const char *const *names, ct_tensor *const *tensors,
                                    int64_t max_shard_bytes);
/* A module's parameters and buffers (tied tensors once), through ct_hf_weights_save. */
CT_API ct_status ct_hf_weights_save_module(const ct_module *m, const char *dir, int64_t max_shard_bytes);

/* Whole-file text helpers for config.json and the index. read: malloc'ed,
 * NUL-terminated text (the caller frees it), NULL + error naming the path; files over
 * 64 MiB are refused. write: atomically (temporary file, fsync, rename). */
CT_API char *ct_hf_text_read(const char *path);
CT_API ct_status ct_hf_text_write(const char *path, const char *text);
/* Creates dir if it does not exist (one level). */
CT_API ct_status ct_hf_dir_make(const char *dir);

#endif
