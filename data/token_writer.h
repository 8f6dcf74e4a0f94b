/* Writing llm.c .bin token files (data/token_dataset.h has the format): the header
 * (magic, version, count) and the tokens, uint16 (version 1) or uint32 (version 2),
 * through core/atomic_file.h, so the file appears whole or not at all.
 *
 * Shared by the byte-level tokenizer (data/tokenizer.c) and BPE encoding
 * (data/bpe_file.c). Internal (cti_): not in ctrain.h. */
#ifndef CT_DATA_TOKEN_WRITER_H
#define CT_DATA_TOKEN_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "core/atomic_file.h"

#define CTI_TOKEN_WRITER_CHUNK 16384 /* tokens buffered before a write */

typedef struct cti_token_writer {
    cti_atomic_file file;
    const char *what;  /* the op named in messages ("bpe", "tokenizer") */
    int token_bytes;   /* 2 or 4 */
    int64_t count;     /* tokens added */
    size_t nbuf;       /* bytes waiting in buf */
    uint8_t buf[CTI_TOKEN_WRITER_CHUNK * 4];
} cti_token_writer;

/* Opens path's temporary file and writes a zeroed header that close fills in.
 * token_bytes 2 or 4 (the ids must fit). On failure nothing is left to close. */
ct_status cti_token_writer_open(cti_token_writer *w, const char *path, int token_bytes, const char *what);

/* Appends n ids (each below 2^(8 * token_bytes); the caller checks the vocabulary).
 * CT_ERR_INVALID when the file would hold more than the header's int32 count. */
ct_status cti_token_writer_add(cti_token_writer *w, const uint32_t *ids, size_t n);

/* st == CT_OK: flushes, writes the header and commits the file; otherwise (or on a
 * failure here) removes it. Returns the first failure; *count (may be NULL) gets the
 * number of tokens written. */
ct_status cti_token_writer_close(cti_token_writer *w, ct_status st, int64_t *count);

#endif
