/* ctrain — safetensors files: validated, memory-mapped reading and atomic writing.
 *
 * Format (HuggingFace safetensors):
 *   bytes [0, 8)        N, the header length, a little-endian u64
 *   bytes [8, 8+N)      UTF-8 JSON object:
 *                         "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
 *                         "__metadata__": {"key": "value", ...}   (optional, strings only)
 *   bytes [8+N, ...)    the data section; offsets are relative to its start.
 * Tensor data is raw little-endian, row-major, contiguous. dtypes: F32 F64 F16 BF16
 * F8_E4M3 F8_E5M2 I32 I64 U8 BOOL.
 *
 * Validation. Opening checks the whole header before any tensor byte is touched:
 * header length (>= 2, <= 100 MiB, inside the file), UTF-8, one JSON object followed
 * only by whitespace, every entry exactly {dtype, shape, data_offsets} with a known
 * dtype, at most CT_MAX_DIMS non-negative integer sizes, non-negative integer offsets
 * with begin <= end, end - begin == numel * dtype size (overflow-checked), offsets
 * inside the data section, no two tensors sharing a byte, no duplicate names, and a
 * __metadata__ of strings only. Integers must be exact: a JSON number that is not a
 * whole number or exceeds 2^53 (no real file comes near it) is rejected.
 *
 * Holes. The specification asks the tensors to cover the data section exactly. This
 * reader is more lenient: gaps between tensors and bytes after the last one are
 * accepted (they are never read); overlaps are rejected. Empty tensors may sit at
 * any offset inside the data section. The writer always produces a file that
 * follows the specification strictly (no holes, no padding after the data).
 *
 * Failures return NULL / non-zero and record a message (core/error.h) naming the file
 * (or a buffer's label), the tensor where one is involved, and the problem.
 */
#ifndef CT_CORE_SAFETENSORS_H
#define CT_CORE_SAFETENSORS_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

/* Largest header this reader accepts (the HuggingFace library's limit). */
#define CT_SAFETENSORS_MAX_HEADER (100u << 20)

/* An open, validated file: a handle. Read-only after open, so one handle may serve
 * ct_safetensors_get from several threads at once. */
typedef struct ct_safetensors ct_safetensors;

/* Maps path (private, copy-on-write: writing to a loaded tensor never changes the
 * file) and validates it. Returns a handle the caller owns (ct_safetensors_close),
 * or NULL + error naming the file, the tensor and the problem. The file must not be
 * truncated by someone else while tensors of it live (that would fault on access). */
CT_API ct_safetensors *ct_safetensors_open(const char *path);

/* The same validation on a caller's buffer (tests, fuzzing, an embedded blob).
 * Nothing is copied: buf must outlive the handle and every tensor got from it.
 * label names the buffer in messages (NULL = "<memory>"). Tensors got from it alias
 * buf; write to them only when buf is writable. */
CT_API ct_safetensors *ct_safetensors_open_memory(const void *buf, size_t len, const char *label);

/* Number of tensors (__metadata__ is not a tensor). */
CT_API int ct_safetensors_count(const ct_safetensors *f);

/* Name of tensor i, 0 <= i < count, in file order (by data offset). Borrowed, lives
 * as long as the handle. NULL + error when i is out of range. */
CT_API const char *ct_safetensors_name(const ct_safetensors *f, int i);

/* Looks up a tensor: its dtype, ndim and shape (room for CT_MAX_DIMS) into the
 * non-NULL out-pointers. false + error naming the file and the tensor if absent. */
CT_API bool ct_safetensors_info(const ct_safetensors *f, const char *name, ct_dtype *dt, int *ndim,
                                int64_t *shape);

/* The tensor's data: new reference, owned by the current frame. A zero-copy view of
 * the mapping when its bytes are aligned for the dtype, else a contiguous copy.
 * A view keeps the mapping alive, even after ct_safetensors_close. BOOL data with a
 * byte other than 0/1 comes back as a copy holding 0/1. NULL + error if absent. */
CT_API ct_tensor *ct_safetensors_get(ct_safetensors *f, const char *name);

/* Value of a __metadata__ key. Borrowed, lives as long as the handle; NULL (no
 * error) if absent. */
CT_API const char *ct_safetensors_metadata(const ct_safetensors *f, const char *key);
/* Metadata pairs in header order: count, and key i (borrowed). */
CT_API int ct_safetensors_metadata_count(const ct_safetensors *f);
CT_API const char *ct_safetensors_metadata_key(const ct_safetensors *f, int i);

/* The file's label (its path, or the buffer's label). Borrowed. */
CT_API const char *ct_safetensors_label(const ct_safetensors *f);

/* Releases the handle. Tensors got from it stay valid; the mapping goes away with
 * the last of them. NULL is fine. */
CT_API void ct_safetensors_close(ct_safetensors *f);

/* Writes n CPU tensors (any layout; written contiguous, in the given order, BOOL as
 * 0/1 bytes) and nmeta metadata pairs (nmeta = 0 and NULL arrays for none). The
 * header is padded with spaces so the data section starts 8-byte aligned, as the
 * HuggingFace writer does. Names must be non-empty, unique and not "__metadata__";
 * metadata keys unique. The file is written to "<path>.tmp.<pid>", fsynced and
 * renamed over path (then the directory is fsynced), so a crash never leaves a
 * half-written file under path. Returns CT_OK, or a status + error naming the file
 * and the tensor. */
CT_API ct_status ct_safetensors_save(const char *path, int n, const char *const *names,
                                     ct_tensor *const *tensors, int nmeta, const char *const *meta_keys,
                                     const char *const *meta_values);
/* The same, and the XXH3-64 checksum (libxxhash) of the bytes written into *xxh3 and
 * their count into *bytes (either may be NULL), computed as they are written: what
 * hashing the file afterwards would give, without reading it back. */
CT_API ct_status ct_safetensors_save_hashed(const char *path, int n, const char *const *names,
                                            ct_tensor *const *tensors, int nmeta, const char *const *meta_keys,
                                            const char *const *meta_values, uint64_t *xxh3, int64_t *bytes);

#ifdef __cplusplus
}
#endif

#endif
