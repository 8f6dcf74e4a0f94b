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
#include "data/token_writer.h"

/* the encoder's sink: each chunk of ids goes to the token file */
typedef struct file_sink {
    bpe_sink base;
    cti_token_writer out;
} file_sink;

static ct_status file_emit(bpe_sink *sink, const uint32_t *ids, size_t n)
{
    return cti_token_writer_add(&((file_sink *)sink)->out, ids, n);
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
    if (!w) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory writing '%s'", out_path);
    w->base.emit = file_emit;
    ct_status st = cti_token_writer_open(&w->out, out_path, b->vocab_size <= 65536 ? 2 : 4, "bpe");
    if (st) {
        free(w);
        return st;
    }
    for (size_t i = 0; i < npaths && !st; i++) {
        if (separator_id >= 0) {
            uint32_t sep = (uint32_t)separator_id;
            st = file_emit(&w->base, &sep, 1);
        }
        if (!st) st = encode_file(b, paths[i], w);
    }
    st = cti_token_writer_close(&w->out, st, ntokens);
    free(w);
    return st;
}
