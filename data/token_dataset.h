/* ctrain — a dataset of (x, y) windows over a memory-mapped file of tokens.
 *
 * File formats (little-endian):
 *   CT_TOKENS_LLMC (default): llm.c's .bin. A header of 256 int32:
 *       [0] magic, [1] version, [2] number of tokens n, the rest unused;
 *     then n tokens. Known (magic, version) pairs:
 *       20240520, 1  uint16 tokens   (llm.c's GPT-2 files)
 *       20240520, 2  uint32 tokens
 *       20240801, 7  uint32 tokens   (llm.c's LLaMA-3 files)
 *     The file must be exactly 1024 + n * token_size bytes.
 *   CT_TOKENS_RAW_U16, CT_TOKENS_RAW_U32: headerless tokens; the size must be a
 *     multiple of the token size. The format is never guessed from the bytes: a
 *     raw file is read only when the config says so.
 *
 * Items. With T = block_size, the dataset reads the token range [begin, end) of
 * the file (the whole file by default; two ranges of one file give a train and a
 * validation split) and item i is the window of T + 1 tokens starting at
 *     s = begin + i * stride,  stride = T by default:
 *     x = tokens[s : s + T],  y = tokens[s + 1 : s + T + 1]   (y is x shifted by one)
 * Every window lies wholly inside the range, so there are
 *     len = (end - begin - (T + 1)) / stride + 1
 * items, and a range shorter than T + 1 tokens is an error. With the default stride
 * the x parts tile the range without overlap (each window shares only its last
 * token, the final target, with the next window's first input), as in llm.c; a
 * smaller stride gives overlapping windows, a larger one skips tokens.
 *
 * Slots: 0 = x, 1 = y, each of shape (T) per item and dtype I64 (or I32).
 *
 * Validation happens when the dataset is opened: size against the header, magic,
 * version, range and length. Token values are checked against vocab_size (when
 * given) as they are read, so opening a large file stays O(1): ct_dataset_get then
 * fails with a message naming the file, the token's position in it and its value.
 * The mapping is read-only and shared by every reader; get is thread-safe.
 */
#ifndef CT_DATA_TOKEN_DATASET_H
#define CT_DATA_TOKEN_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "data/dataset.h"

#define CT_LLMC_HEADER_INTS 256
#define CT_LLMC_HEADER_BYTES (CT_LLMC_HEADER_INTS * 4)
#define CT_LLMC_MAGIC 20240520
#define CT_LLMC_MAGIC_LLAMA3 20240801

typedef enum ct_token_format {
    CT_TOKENS_LLMC = 0, /* llm.c .bin with its 1024-byte header (default) */
    CT_TOKENS_RAW_U16,  /* headerless uint16 tokens */
    CT_TOKENS_RAW_U32,  /* headerless uint32 tokens */
} ct_token_format;

/* What a file's header (or size) says. */
typedef struct ct_token_file_info {
    ct_token_format format;
    int token_bytes;      /* 2 or 4 */
    int64_t header_bytes; /* 1024 for llm.c files, 0 for raw ones */
    int64_t ntokens;      /* tokens in the file */
    int32_t magic, version; /* from the llm.c header; 0 for raw files */
} ct_token_file_info;

/* Zero means default for every field. */
typedef struct ct_token_dataset_config {
    int64_t block_size;   /* T, required, >= 1 */
    int64_t stride;       /* tokens between window starts; 0 = block_size */
    int64_t begin, end;   /* token range [begin, end) of the file; end = 0: to the end */
    int64_t vocab_size;   /* > 0: reading a token >= vocab_size is an error; 0 = unchecked */
    ct_token_format format;
    ct_dtype dtype;       /* of x and y: CT_DTYPE_I64 (also when left 0) or CT_DTYPE_I32 */
} ct_token_dataset_config;

/* Validates a token file held in memory (all of it: size bytes) and describes it.
 * name is used in messages. CT_ERR_FORMAT (with a message naming the file and the
 * problem) when it does not follow the format. */
CT_API ct_status ct_token_file_parse(const void *data, size_t size, const char *name, ct_token_format format,
                                     ct_token_file_info *info);

/* The same for a file on disk, reading only its header and size (to plan splits). */
CT_API ct_status ct_token_file_probe(const char *path, ct_token_format format, ct_token_file_info *info);

/* Opens path read-only and maps it. Returns a new dataset the caller frees with
 * ct_dataset_free (the mapping goes with it), or NULL and an error naming the file
 * and the problem (system calls: the call and strerror(errno)). */
CT_API ct_dataset *ct_token_dataset_open(const char *path, const ct_token_dataset_config *cfg);

/* The same over a caller's buffer holding a whole file, borrowed: it must outlive
 * the dataset. name labels messages (NULL: "<memory>"). */
CT_API ct_dataset *ct_token_dataset_open_memory(const void *data, size_t size, const char *name,
                                                const ct_token_dataset_config *cfg);

/* The file behind a token dataset (borrowed; NULL and an error for another kind). */
CT_API const ct_token_file_info *ct_token_dataset_file(const ct_dataset *ds);

#endif
