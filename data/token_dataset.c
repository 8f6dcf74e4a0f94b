/* The token dataset: header validation up front, then (x, y) windows read straight
 * from a read-only mapping. The format and the window arithmetic are in
 * data/token_dataset.h. */
#include "data/token_dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tokens and header words are read as they sit in memory. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

typedef struct token_ds {
    ct_dataset base; /* first: the handle */
    char *name;
    void *map; /* our mapping, or NULL for a caller's buffer */
    size_t map_len;
    const uint8_t *tokens; /* first token of the file */
    ct_token_file_info info;
    int64_t T, stride, begin, end, vocab, nwin;
} token_ds;

static ct_status tok_fail(const char *name, ct_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ct_status tok_fail(const char *name, ct_status st, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ct_error_set(st, "token file '%s': %s", name, msg);
}

static const char *format_name(ct_token_format f)
{
    switch (f) {
    case CT_TOKENS_LLMC: return "llm.c .bin";
    case CT_TOKENS_RAW_U16: return "raw uint16";
    case CT_TOKENS_RAW_U32: return "raw uint32";
    }
    return "unknown";
}

/* Header words may sit at any address in a caller's buffer. */
static int32_t load_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint32_t load_token(const uint8_t *tokens, int token_bytes, int64_t i)
{
    if (token_bytes == 2) {
        uint16_t v;
        memcpy(&v, tokens + i * 2, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, tokens + i * 4, 4);
    return v;
}

#define RAW_HINT "for a headerless file set .format = CT_TOKENS_RAW_U16 or CT_TOKENS_RAW_U32"

static ct_status parse_llmc(const uint8_t *p, size_t size, const char *name, ct_token_file_info *info)
{
    if (size < CT_LLMC_HEADER_BYTES)
        return tok_fail(name, CT_ERR_FORMAT,
                        "%zu bytes is shorter than the %d-byte llm.c header (truncated? " RAW_HINT ")", size,
                        CT_LLMC_HEADER_BYTES);
    int32_t magic = load_i32(p), version = load_i32(p + 4), count = load_i32(p + 8);
    int tb;
    if (magic == CT_LLMC_MAGIC && version == 1) tb = 2;
    else if (magic == CT_LLMC_MAGIC && version == 2) tb = 4;
    else if (magic == CT_LLMC_MAGIC_LLAMA3 && version == 7) tb = 4;
    else if (magic == CT_LLMC_MAGIC || magic == CT_LLMC_MAGIC_LLAMA3)
        return tok_fail(name, CT_ERR_FORMAT,
                        "unknown version %d for magic %d (known: magic %d with version 1 = uint16 tokens or "
                        "2 = uint32 tokens; magic %d with version 7 = uint32 tokens)",
                        (int)version, (int)magic, CT_LLMC_MAGIC, CT_LLMC_MAGIC_LLAMA3);
    else
        return tok_fail(name, CT_ERR_FORMAT, "bad magic %d, expected %d or %d for an llm.c .bin (" RAW_HINT ")",
                        (int)magic, CT_LLMC_MAGIC, CT_LLMC_MAGIC_LLAMA3);
    if (count < 0)
        return tok_fail(name, CT_ERR_FORMAT, "header says %d tokens: a count cannot be negative", (int)count);
    uint64_t want = CT_LLMC_HEADER_BYTES + (uint64_t)count * (uint64_t)tb;
    if ((uint64_t)size != want)
        return tok_fail(name, CT_ERR_FORMAT,
                        "header says %d tokens of %d bytes (%d + %d * %d = %llu bytes) but the file is %zu bytes (%s)",
                        (int)count, tb, CT_LLMC_HEADER_BYTES, (int)count, tb, (unsigned long long)want, size,
                        (uint64_t)size < want ? "truncated" : "trailing bytes after the tokens");
    *info = (ct_token_file_info){.format = CT_TOKENS_LLMC,
                                 .token_bytes = tb,
                                 .header_bytes = CT_LLMC_HEADER_BYTES,
                                 .ntokens = count,
                                 .magic = magic,
                                 .version = version};
    return CT_OK;
}

static ct_status check_format(const char *name, ct_token_format format)
{
    if (format != CT_TOKENS_LLMC && format != CT_TOKENS_RAW_U16 && format != CT_TOKENS_RAW_U32)
        return tok_fail(name, CT_ERR_INVALID,
                        "format = %d is not a ct_token_format (CT_TOKENS_LLMC, CT_TOKENS_RAW_U16, CT_TOKENS_RAW_U32)",
                        (int)format);
    return CT_OK;
}

/* Validates a header (first min(size, 1024) bytes at p) against the whole file's size. */
static ct_status parse_sized(const uint8_t *p, size_t size, const char *name, ct_token_format format,
                             ct_token_file_info *info)
{
    ct_status st = check_format(name, format);
    if (st) return st;
    if (format == CT_TOKENS_LLMC) return parse_llmc(p, size, name, info);
    int tb = format == CT_TOKENS_RAW_U16 ? 2 : 4;
    if (size % (size_t)tb != 0)
        return tok_fail(name, CT_ERR_FORMAT, "%zu bytes is not a whole number of %d-byte %s tokens (truncated?)",
                        size, tb, format_name(format));
    *info = (ct_token_file_info){.format = format, .token_bytes = tb, .ntokens = (int64_t)(size / (size_t)tb)};
    return CT_OK;
}

ct_status ct_token_file_parse(const void *data, size_t size, const char *name, ct_token_format format,
                              ct_token_file_info *info)
{
    if (!name) name = "<memory>";
    if ((!data && size) || !info)
        return tok_fail(name, CT_ERR_INVALID, "%s is NULL", !info ? "info" : "data");
    return parse_sized(data, size, name, format, info);
}

/* ---- opening ------------------------------------------------------------- */

static int64_t token_len(const ct_dataset *ds) { return ((const token_ds *)ds)->nwin; }

/* x[t] = tok[s + t], y[t] = tok[s + t + 1], t < T: the T + 1 tokens of window i. */
static ct_status token_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out, int64_t row)
{
    const token_ds *d = (const token_ds *)ds;
    int64_t s = d->begin + i * d->stride;
    int tb = d->info.token_bytes;
    bool i32 = out[0]->dtype == CT_DTYPE_I32;
    /* check the whole window before writing, so a failed get leaves the batch untouched */
    if (d->vocab > 0 || (i32 && tb == 4)) {
        for (int64_t t = 0; t <= d->T; t++) {
            uint32_t v = load_token(d->tokens, tb, s + t);
            if (d->vocab > 0 && (int64_t)v >= d->vocab)
                return tok_fail(d->name, CT_ERR_FORMAT,
                                "token %u at position %lld (byte offset %lld) is >= vocab_size %lld (item %lld)",
                                (unsigned)v, (long long)(s + t),
                                (long long)(d->info.header_bytes + (s + t) * tb), (long long)d->vocab,
                                (long long)i);
            if (i32 && v > INT32_MAX)
                return tok_fail(d->name, CT_ERR_FORMAT,
                                "token %u at position %lld does not fit the i32 batch dtype (use CT_DTYPE_I64)",
                                (unsigned)v, (long long)(s + t));
        }
    }
    void *xp = ct_dataset_row(out[0], row), *yp = ct_dataset_row(out[1], row);
    if (i32) {
        int32_t *x = xp, *y = yp;
        for (int64_t t = 0; t < d->T; t++) x[t] = (int32_t)load_token(d->tokens, tb, s + t);
        for (int64_t t = 0; t < d->T; t++) y[t] = (int32_t)load_token(d->tokens, tb, s + t + 1);
    } else {
        int64_t *x = xp, *y = yp;
        for (int64_t t = 0; t < d->T; t++) x[t] = load_token(d->tokens, tb, s + t);
        for (int64_t t = 0; t < d->T; t++) y[t] = load_token(d->tokens, tb, s + t + 1);
    }
    return CT_OK;
}

static void token_free(ct_dataset *ds)
{
    token_ds *d = (token_ds *)ds;
    /* addr and len came from our own successful mmap: failure is an internal bug */
    if (d->map) CT_ASSERT(munmap(d->map, d->map_len) == 0);
    free(d->name);
    free(d);
}

static const ct_dataset_vtable token_vtable = {"token", token_len, token_get, token_free};

const ct_token_file_info *ct_token_dataset_file(const ct_dataset *ds)
{
    if (!ds || ds->vt != &token_vtable) {
        ct_error_set(CT_ERR_INVALID, "token_dataset_file: not a token dataset");
        return NULL;
    }
    return &((const token_ds *)ds)->info;
}

/* Checks cfg against the file and fills the window plan. */
static ct_status plan_windows(token_ds *d, const ct_token_dataset_config *c)
{
    const char *n = d->name;
    if (c->block_size < 1)
        return tok_fail(n, CT_ERR_INVALID, "block_size = %lld, must be >= 1", (long long)c->block_size);
    if (c->stride < 0)
        return tok_fail(n, CT_ERR_INVALID, "stride = %lld, must be >= 1 (0 = block_size)", (long long)c->stride);
    if (c->vocab_size < 0)
        return tok_fail(n, CT_ERR_INVALID, "vocab_size = %lld, must be >= 1 (0 = unchecked)", (long long)c->vocab_size);
    if (c->dtype != CT_DTYPE_F32 && c->dtype != CT_DTYPE_I64 && c->dtype != CT_DTYPE_I32)
        return tok_fail(n, CT_ERR_INVALID, "dtype = %s, must be i64 or i32", ct_dtype_name(c->dtype));
    int64_t nt = d->info.ntokens;
    int64_t end = c->end ? c->end : nt;
    if (c->begin < 0 || c->end < 0 || end > nt || c->begin > end)
        return tok_fail(n, CT_ERR_INVALID, "token range begin = %lld, end = %lld is not inside the file's %lld tokens",
                        (long long)c->begin, (long long)c->end, (long long)nt);
    d->T = c->block_size;
    d->stride = c->stride ? c->stride : c->block_size;
    d->begin = c->begin;
    d->end = end;
    d->vocab = c->vocab_size;
    int64_t span = end - c->begin;
    if (span - 1 < d->T) /* span < T + 1 without overflowing at T = INT64_MAX */
        return tok_fail(n, CT_ERR_FORMAT,
                        "%lld tokens in [%lld, %lld) are too few for one window of block_size + 1 = %lld",
                        (long long)span, (long long)c->begin, (long long)end, (long long)d->T + 1);
    d->nwin = (span - 1 - d->T) / d->stride + 1;
    ct_dtype dt = c->dtype == CT_DTYPE_I32 ? CT_DTYPE_I32 : CT_DTYPE_I64;
    ct_dataset_slot slots[2] = {{dt, 1, {d->T}}, {dt, 1, {d->T}}};
    return ct_dataset_init(&d->base, &token_vtable, 2, slots);
}

/* Takes ownership of map (may be NULL: a caller's buffer) on every path. */
static ct_dataset *open_buffer(const uint8_t *p, size_t size, void *map, const char *name,
                               const ct_token_dataset_config *cfg)
{
    token_ds *d = calloc(1, sizeof *d);
    char *nm = strdup(name);
    if (!d || !nm) {
        free(d);
        free(nm);
        if (map) munmap(map, size);
        ct_error_set(CT_ERR_NOMEM, "token file '%s': out of memory", name);
        return NULL;
    }
    *d = (token_ds){.name = nm, .map = map, .map_len = size};
    ct_status st = parse_sized(p, size, name, cfg->format, &d->info);
    if (!st) st = plan_windows(d, cfg);
    if (st) {
        token_free(&d->base);
        return NULL;
    }
    d->tokens = p + d->info.header_bytes;
    return &d->base;
}

ct_dataset *ct_token_dataset_open_memory(const void *data, size_t size, const char *name,
                                         const ct_token_dataset_config *cfg)
{
    if (!name) name = "<memory>";
    if ((!data && size) || !cfg) {
        tok_fail(name, CT_ERR_INVALID, "%s is NULL", !cfg ? "config" : "data");
        return NULL;
    }
    return open_buffer(data, size, NULL, name, cfg);
}

/* Opens path and checks it is a regular file; size into *size. -1 and an error. */
static int open_regular(const char *path, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tok_fail(path, CT_ERR_IO, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        tok_fail(path, CT_ERR_IO, "cannot fstat: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        tok_fail(path, CT_ERR_IO, "not a regular file");
        close(fd);
        return -1;
    }
    *size = (size_t)sb.st_size;
    return fd;
}

ct_status ct_token_file_probe(const char *path, ct_token_format format, ct_token_file_info *info)
{
    if (!path || !info) return ct_error_set(CT_ERR_INVALID, "token_file_probe: %s is NULL", !path ? "path" : "info");
    size_t size;
    int fd = open_regular(path, &size);
    if (fd < 0) return ct_last_status();
    uint8_t hdr[CT_LLMC_HEADER_BYTES];
    size_t want = size < sizeof hdr ? size : sizeof hdr, got = 0;
    while (got < want) {
        ssize_t r = pread(fd, hdr + got, want - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            ct_status st = r < 0 ? tok_fail(path, CT_ERR_IO, "cannot read the header: %s", strerror(errno))
                                 : tok_fail(path, CT_ERR_IO, "file shrank while reading its header");
            close(fd);
            return st;
        }
        got += (size_t)r;
    }
    if (close(fd) != 0) return tok_fail(path, CT_ERR_IO, "cannot close: %s", strerror(errno));
    return parse_sized(hdr, size, path, format, info);
}

ct_dataset *ct_token_dataset_open(const char *path, const ct_token_dataset_config *cfg)
{
    if (!path || !cfg) {
        ct_error_set(CT_ERR_INVALID, "token_dataset_open: %s is NULL", !path ? "path" : "config");
        return NULL;
    }
    size_t size;
    int fd = open_regular(path, &size);
    if (fd < 0) return NULL;
    if (size == 0) {
        /* mmap cannot map nothing; the parser explains what an empty file lacks */
        close(fd);
        return open_buffer(NULL, 0, NULL, path, cfg);
    }
    void *addr = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    int map_errno = errno;
    if (close(fd) != 0) {
        tok_fail(path, CT_ERR_IO, "cannot close: %s", strerror(errno));
        if (addr != MAP_FAILED) munmap(addr, size);
        return NULL;
    }
    if (addr == MAP_FAILED) {
        tok_fail(path, CT_ERR_IO, "cannot mmap %zu bytes: %s", size, strerror(map_errno));
        return NULL;
    }
    return open_buffer(addr, size, addr, path, cfg);
}
