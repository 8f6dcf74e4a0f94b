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

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

#define MAX_TOKENS 2147483647LL /* the header's count is an int32 */
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

/* A .bin being written under a temporary name. */
typedef struct bin_writer {
    const char *path;
    char *tmp;
    int fd;
    int64_t count;
} bin_writer;

static ct_status write_all(bin_writer *w, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t r = write(w->fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ct_error_set(CT_ERR_IO, "tokenizer: cannot write '%s': %s", w->tmp, strerror(errno));
        p += r;
        n -= (size_t)r;
    }
    return CT_OK;
}

static ct_status writer_open(bin_writer *w, const char *path)
{
    *w = (bin_writer){.path = path, .fd = -1};
    size_t len = strlen(path) + 32;
    w->tmp = malloc(len);
    if (!w->tmp) return ct_error_set(CT_ERR_NOMEM, "tokenizer: out of memory for '%s'", path);
    snprintf(w->tmp, len, "%s.tmp.%ld", path, (long)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        ct_status st = ct_error_set(CT_ERR_IO, "tokenizer: cannot create '%s': %s", w->tmp, strerror(errno));
        free(w->tmp);
        return st;
    }
    /* the header is rewritten with the count at the end; zeros hold its place */
    int32_t hdr[CT_LLMC_HEADER_INTS] = {0};
    return write_all(w, hdr, sizeof hdr);
}

static ct_status writer_add(bin_writer *w, const uint8_t *bytes, size_t n)
{
    if ((int64_t)n > MAX_TOKENS - w->count)
        return ct_error_set(CT_ERR_INVALID,
                            "tokenizer: '%s' would hold more than %lld tokens, the llm.c header's limit",
                            w->path, MAX_TOKENS);
    uint16_t tok[CHUNK];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        for (size_t k = 0; k < m; k++) tok[k] = bytes[i + k];
        ct_status st = write_all(w, tok, m * sizeof tok[0]);
        if (st) return st;
    }
    w->count += (int64_t)n;
    return CT_OK;
}

/* Finishes (st == CT_OK: header, fsync, close, rename) or abandons the file. */
static ct_status writer_close(bin_writer *w, ct_status st)
{
    if (!st) {
        int32_t hdr[3] = {CT_LLMC_MAGIC, 1, (int32_t)w->count};
        ssize_t r;
        do r = pwrite(w->fd, hdr, sizeof hdr, 0);
        while (r < 0 && errno == EINTR);
        if (r != (ssize_t)sizeof hdr)
            st = ct_error_set(CT_ERR_IO, "tokenizer: cannot write the header of '%s': %s", w->tmp,
                              r < 0 ? strerror(errno) : "short write");
    }
    if (!st && fsync(w->fd) != 0)
        st = ct_error_set(CT_ERR_IO, "tokenizer: cannot fsync '%s': %s", w->tmp, strerror(errno));
    if (close(w->fd) != 0 && !st)
        st = ct_error_set(CT_ERR_IO, "tokenizer: cannot close '%s': %s", w->tmp, strerror(errno));
    if (!st && rename(w->tmp, w->path) != 0)
        st = ct_error_set(CT_ERR_IO, "tokenizer: cannot rename '%s' to '%s': %s", w->tmp, w->path, strerror(errno));
    if (st) unlink(w->tmp); /* best effort: the error already says what went wrong */
    free(w->tmp);
    return st;
}

ct_status ct_tokenizer_encode_memory(const void *text, size_t n, const char *out_token_path)
{
    if ((!text && n) || !out_token_path)
        return ct_error_set(CT_ERR_INVALID, "tokenizer_encode_memory: %s is NULL",
                            !out_token_path ? "out_token_path" : "text");
    bin_writer w;
    ct_status st = writer_open(&w, out_token_path);
    if (w.fd < 0) return st;
    if (!st) st = writer_add(&w, text, n);
    return writer_close(&w, st);
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
    bin_writer w;
    st = writer_open(&w, out_token_path);
    if (w.fd < 0) {
        close(in);
        return st;
    }
    uint8_t buf[CHUNK];
    while (!st) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = ct_error_set(CT_ERR_IO, "tokenizer: cannot read '%s': %s", text_path, strerror(errno));
        if (r <= 0) break;
        st = writer_add(&w, buf, (size_t)r);
    }
    if (close(in) != 0 && !st)
        st = ct_error_set(CT_ERR_IO, "tokenizer: cannot close '%s': %s", text_path, strerror(errno));
    return writer_close(&w, st);
}
