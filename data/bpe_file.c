/* Byte-level BPE: encoding text files into an llm.c .bin (temporary file, fsync,
 * rename), uint16 tokens when the vocabulary fits, uint32 otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/bpe_encode_internal.h"
#include "data/token_dataset.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

#define MAX_TOKENS 2147483647LL /* the header's count is an int32 */
#define CHUNK 16384

typedef struct file_sink {
    bpe_sink base;
    const char *path;
    char *tmp;
    int fd;
    int token_bytes;
    int64_t count;
    size_t nbuf;
    uint8_t buf[CHUNK * 4];
} file_sink;

static ct_status write_all(file_sink *w, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t r = write(w->fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ct_error_set(CT_ERR_IO, "bpe: cannot write '%s': %s", w->tmp, strerror(errno));
        p += r;
        n -= (size_t)r;
    }
    return CT_OK;
}

static ct_status flush(file_sink *w)
{
    ct_status st = write_all(w, w->buf, w->nbuf);
    w->nbuf = 0;
    return st;
}

static ct_status file_emit(bpe_sink *sink, const uint32_t *ids, size_t n)
{
    file_sink *w = (file_sink *)sink;
    if ((int64_t)n > MAX_TOKENS - w->count)
        return ct_error_set(CT_ERR_INVALID, "bpe: '%s' would hold more than %lld tokens, the llm.c header's limit",
                            w->path, MAX_TOKENS);
    for (size_t i = 0; i < n; i++) {
        if (w->nbuf + 4 > sizeof w->buf) {
            ct_status st = flush(w);
            if (st) return st;
        }
        if (w->token_bytes == 2) {
            uint16_t v = (uint16_t)ids[i];
            memcpy(w->buf + w->nbuf, &v, 2);
        } else {
            memcpy(w->buf + w->nbuf, &ids[i], 4);
        }
        w->nbuf += (size_t)w->token_bytes;
    }
    w->count += (int64_t)n;
    return CT_OK;
}

/* encodes the whole of one file (mapped read-only) into w */
static ct_status encode_file(ct_bpe *b, const char *path, file_sink *w)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ct_error_set(CT_ERR_IO, "bpe: cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    ct_status st = CT_OK;
    if (fstat(fd, &sb) != 0) st = ct_error_set(CT_ERR_IO, "bpe: cannot stat '%s': %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = ct_error_set(CT_ERR_INVALID, "bpe: '%s' is not a regular file", path);
    if (st || sb.st_size == 0) {
        close(fd);
        return st;
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return ct_error_set(CT_ERR_IO, "bpe: cannot map '%s': %s", path, strerror(errno));
    st = cti_bpe_encode_to(b, p, (size_t)sb.st_size, &w->base);
    munmap(p, (size_t)sb.st_size);
    return st;
}

ct_status ct_bpe_encode_files(ct_bpe *b, const char *const *paths, size_t npaths, int64_t separator_id,
                              const char *out_path, int64_t *ntokens)
{
    if (!b || (!paths && npaths) || !out_path)
        return ct_error_set(CT_ERR_INVALID, "bpe_encode_files: %s is NULL",
                            !b ? "bpe" : !out_path ? "out_token_path" : "text_paths");
    if (separator_id >= b->vocab_size)
        return ct_error_set(CT_ERR_INVALID, "bpe_encode_files: separator_id %lld is outside the vocabulary [0, %lld)",
                            (long long)separator_id, (long long)b->vocab_size);
    for (size_t i = 0; i < npaths; i++)
        if (!paths[i]) return ct_error_set(CT_ERR_INVALID, "bpe_encode_files: text_paths[%zu] is NULL", i);
    file_sink *w = calloc(1, sizeof *w);
    size_t len = strlen(out_path) + 32;
    char *tmp = w ? malloc(len) : NULL;
    if (!tmp) {
        free(w);
        return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory writing '%s'", out_path);
    }
    snprintf(tmp, len, "%s.tmp.%ld", out_path, (long)getpid());
    w->base.emit = file_emit;
    w->path = out_path;
    w->tmp = tmp;
    w->token_bytes = b->vocab_size <= 65536 ? 2 : 4;
    w->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ct_status st = CT_OK;
    if (w->fd < 0) {
        st = ct_error_set(CT_ERR_IO, "bpe: cannot create '%s': %s", tmp, strerror(errno));
        free(tmp);
        free(w);
        return st;
    }
    /* the header is rewritten with the count at the end; zeros hold its place */
    int32_t hdr[CT_LLMC_HEADER_INTS] = {0};
    st = write_all(w, hdr, sizeof hdr);
    for (size_t i = 0; i < npaths && !st; i++) {
        if (separator_id >= 0) {
            uint32_t sep = (uint32_t)separator_id;
            st = file_emit(&w->base, &sep, 1);
        }
        if (!st) st = encode_file(b, paths[i], w);
    }
    if (!st) st = flush(w);
    if (!st) {
        hdr[0] = CT_LLMC_MAGIC;
        hdr[1] = w->token_bytes == 2 ? 1 : 2;
        hdr[2] = (int32_t)w->count;
        ssize_t r;
        do r = pwrite(w->fd, hdr, 3 * sizeof hdr[0], 0);
        while (r < 0 && errno == EINTR);
        if (r != (ssize_t)(3 * sizeof hdr[0]))
            st = ct_error_set(CT_ERR_IO, "bpe: cannot write the header of '%s': %s", tmp,
                              r < 0 ? strerror(errno) : "short write");
    }
    if (!st && fsync(w->fd) != 0) st = ct_error_set(CT_ERR_IO, "bpe: cannot fsync '%s': %s", tmp, strerror(errno));
    if (close(w->fd) != 0 && !st) st = ct_error_set(CT_ERR_IO, "bpe: cannot close '%s': %s", tmp, strerror(errno));
    if (!st && rename(tmp, out_path) != 0)
        st = ct_error_set(CT_ERR_IO, "bpe: cannot rename '%s' to '%s': %s", tmp, out_path, strerror(errno));
    if (st) unlink(tmp); /* best effort: the error already says what went wrong */
    if (!st && ntokens) *ntokens = w->count;
    free(tmp);
    free(w);
    return st;
}
