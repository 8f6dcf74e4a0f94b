/* The byte-level tokenizer and its llm.c .bin writer (temporary file, fsync,
 * rename). */
#include "data/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/token_dataset.h"
#include "data/token_writer.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

#define CHUNK 16384

int64_t ct_tokenizer_encode(const void *text, int64_t n, uint16_t *tokens, int64_t cap)
{
    if (n < 0 || (n > 0 && (!text || !tokens))) {
        ct_error_set(CT_ERR_INVALID, "tokenizer_encode: %s",
                     n < 0 ? "n is negative" : !text ? "text is NULL" : "tokens is NULL");
        return -1;
    }
    if (cap < n) {
        ct_error_set(CT_ERR_INVALID, "tokenizer_encode: %lld bytes need %lld tokens but cap is %lld", (long long)n,
                     (long long)n, (long long)cap);
        return -1;
    }
    const uint8_t *p = text;
    for (int64_t i = 0; i < n; i++) tokens[i] = p[i];
    return n;
}

int64_t ct_tokenizer_decode(const int64_t *tokens, int64_t n, char *buf, int64_t cap)
{
    if (n < 0 || (n > 0 && !tokens) || !buf) {
        ct_error_set(CT_ERR_INVALID, "tokenizer_decode: %s",
                     n < 0 ? "n is negative" : !buf ? "buf is NULL" : "tokens is NULL");
        return -1;
    }
    if (cap < n + 1) {
        ct_error_set(CT_ERR_INVALID,
                     "tokenizer_decode: %lld tokens need a buffer of %lld bytes (with the NUL) but cap is %lld",
                     (long long)n, (long long)n + 1, (long long)cap);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= CT_TOKENIZER_VOCAB_SIZE) {
            ct_error_set(CT_ERR_INVALID,
                         "tokenizer_decode: token %lld at position %lld is outside the byte vocabulary [0, %d)",
                         (long long)tokens[i], (long long)i, CT_TOKENIZER_VOCAB_SIZE);
            return -1;
        }
        buf[i] = (char)(uint8_t)tokens[i];
    }
    buf[n] = '\0';
    return n;
}

/* ---- writing .bin files -------------------------------------------------- */

/* Appends n bytes as tokens (each byte is its own id). */
static ct_status add_bytes(cti_token_writer *w, const uint8_t *bytes, size_t n)
{
    uint32_t ids[CTI_TOKEN_WRITER_CHUNK];
    for (size_t i = 0; i < n; i += CTI_TOKEN_WRITER_CHUNK) {
        size_t m = n - i < CTI_TOKEN_WRITER_CHUNK ? n - i : CTI_TOKEN_WRITER_CHUNK;
        for (size_t k = 0; k < m; k++) ids[k] = bytes[i + k];
        ct_status st = cti_token_writer_add(w, ids, m);
        if (st) return st;
    }
    return CT_OK;
}

/* A writer of 2-byte tokens, on the heap (its buffer is large); NULL + error. */
static cti_token_writer *writer_open(const char *path)
{
    cti_token_writer *w = malloc(sizeof *w);
    if (!w) return ct_error_set(CT_ERR_NOMEM, "tokenizer: out of memory writing '%s'", path), NULL;
    if (cti_token_writer_open(w, path, 2, "tokenizer")) {
        free(w);
        return NULL;
    }
    return w;
}

static ct_status writer_close(cti_token_writer *w, ct_status st)
{
    st = cti_token_writer_close(w, st, NULL);
    free(w);
    return st;
}

ct_status ct_tokenizer_encode_memory(const void *text, size_t n, const char *out_token_path)
{
    if ((!text && n) || !out_token_path)
        return ct_error_set(CT_ERR_INVALID, "tokenizer_encode_memory: %s is NULL",
                            !out_token_path ? "out_token_path" : "text");
    cti_token_writer *w = writer_open(out_token_path);
    if (!w) return ct_last_status();
    return writer_close(w, add_bytes(w, text, n));
}

ct_status ct_tokenizer_encode_file(const char *text_path, const char *out_token_path)
{
    if (!text_path || !out_token_path)
        return ct_error_set(CT_ERR_INVALID, "tokenizer_encode_file: %s is NULL",
                            !text_path ? "text_path" : "out_token_path");
    int in = open(text_path, O_RDONLY | O_CLOEXEC);
    if (in < 0) return ct_error_set(CT_ERR_IO, "tokenizer: cannot open '%s': %s", text_path, strerror(errno));
    struct stat sb;
    ct_status st = CT_OK;
    if (fstat(in, &sb) != 0)
        st = ct_error_set(CT_ERR_IO, "tokenizer: cannot fstat '%s': %s", text_path, strerror(errno));
    else if (S_ISDIR(sb.st_mode))
        st = ct_error_set(CT_ERR_IO, "tokenizer: '%s' is a directory, not a text file", text_path);
    if (st) {
        close(in);
        return st;
    }
    cti_token_writer *w = writer_open(out_token_path);
    if (!w) {
        close(in);
        return ct_last_status();
    }
    uint8_t buf[CHUNK];
    while (!st) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = ct_error_set(CT_ERR_IO, "tokenizer: cannot read '%s': %s", text_path, strerror(errno));
        if (r <= 0) break;
        st = add_bytes(w, buf, (size_t)r);
    }
    if (close(in) != 0 && !st)
        st = ct_error_set(CT_ERR_IO, "tokenizer: cannot close '%s': %s", text_path, strerror(errno));
    return writer_close(w, st);
}
