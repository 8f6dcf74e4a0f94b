/* ctrain — the byte-level tokenizer: token = byte, vocabulary 256.
 *
 * Every byte string round-trips exactly (decode(encode(s)) == s), including NUL,
 * control characters and invalid UTF-8: bytes are never escaped or dropped. Files
 * it writes are llm.c .bin files (magic 20240520, version 1, uint16 tokens; see
 * data/token_dataset.h), so a token dataset reads them with the default format and
 * .vocab_size = CT_TOKENIZER_VOCAB_SIZE. llm.c's header holds the count as int32,
 * so one file holds at most 2^31 - 1 tokens (bytes of text).
 */
#ifndef CT_DATA_TOKENIZER_H
#define CT_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"

#define CT_TOKENIZER_VOCAB_SIZE 256

/* tokens[i] = text[i] for i < n. Returns n, or -1 and an error when cap < n or an
 * argument is NULL (with n > 0). */
CT_API int64_t ct_tokenizer_encode(const void *text, int64_t n, uint16_t *tokens, int64_t cap);

/* Encodes n bytes of text into an llm.c .bin at out_token_path. The file is written
 * to a temporary name beside it, fsynced and renamed, so a failure never leaves a
 * half-written file under that name. */
CT_API ct_status ct_tokenizer_encode_memory(const void *text, size_t n, const char *out_token_path);

/* The same for the whole content of the file text_path, streamed (any size up to
 * the format's 2^31 - 1 tokens). Errors name the file and the failing call. */
CT_API ct_status ct_tokenizer_encode_file(const char *text_path, const char *out_token_path);

/* buf[i] = tokens[i] for i < n, then buf[n] = '\0' (so text without NUL bytes can be
 * printed as a C string). Needs cap >= n + 1. Returns n, or -1 and an error naming
 * the position and value of a token outside [0, 256), or a too-small buffer. */
CT_API int64_t ct_tokenizer_decode(const int64_t *tokens, int64_t n, char *buf, int64_t cap);

#endif
