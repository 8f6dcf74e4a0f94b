/* ctrain — sharded model checkpoints (SHARDED_STATE_DICT): the reader and its
 * checks, the ranks' agreement, the save and the merge (the format:
 * accel/model_shards_internal.h; loading: accel/model_load.c). */
#include "accel/model_shards_internal.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/frame.h"
#include "parallel/shard_state.h"

#define PART_KEY "ctrain.part."
/* a whole tensor's place in the merged order: after every parameter, in file order */
#define WHOLE_INDEX ((int64_t)1 << 40)
/* an error message as the agreement sends it: status byte, text, NUL */
#define AGREE_BYTES 1024

/* ---- names ------------------------------------------------------------------------ */

/* A malloc'd printf; NULL + error when out of memory. */
static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s) {
        ct_error_set(CT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

void cti_ckpt_rank_file_name(char *buf, size_t cap, const char *prefix, int r, int n)
{
    snprintf(buf, cap, "%s-rank%05d-of-%05d.safetensors", prefix, r, n);
}

/* Whether name is exactly a rank file's name with this prefix, and its rank and count. */
static bool is_rank_file(const char *name, const char *prefix, int *r, int *n)
{
    char again[96];
    const size_t lp = strlen(prefix);
    if (strncmp(name, prefix, lp) || sscanf(name + lp, "-rank%d-of-%d.safetensors", r, n) != 2 || *n < 1 || *r < 0 ||
        *r >= *n)
        return false;
    cti_ckpt_rank_file_name(again, sizeof again, prefix, *r, *n);
    return !strcmp(again, name);
}

/* ---- reading --------------------------------------------------------------------------- */

void cti_ckpt_close(ct_ckpt *ck)
{
    if (!ck) return;
    for (int i = 0; i < ck->nfiles; i++) {
        ct_safetensors_close(ck->files ? ck->files[i] : NULL);
        free(ck->paths ? ck->paths[i] : NULL);
    }
    for (int i = 0; i < ck->n; i++) free(ck->e[i].parts);
    free(ck->files), free(ck->paths), free(ck->e);
    *ck = (ct_ckpt){0};
}

const ct_ckpt_entry *cti_ckpt_find(const ct_ckpt *ck, const char *name)
{
    for (int i = 0; i < ck->n; i++)
        if (!strcmp(ck->e[i].name, name)) return &ck->e[i];
    return NULL;
}

static bool numel_of(int ndim, const int64_t *shape, int64_t *numel)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] && n > INT64_MAX / shape[d])) return false;
        n *= shape[d];
    }
    *numel = n;
    return true;
}

static const char *shape_of(const ct_ckpt_entry *x, char *buf, int cap)
{
    return ct_shape_str(x->ndim, x->shape, buf, cap);
}

/* Adds part (of the tensor described by proto) to its entry, creating the entry on
 * its first part; a tensor must be described alike by every file. */
static ct_status add_part(ct_ckpt *ck, const ct_ckpt_entry *proto, ct_ckpt_part part)
{
    ct_ckpt_entry *x = (ct_ckpt_entry *)cti_ckpt_find(ck, proto->name);
    if (!x) {
        if (ck->n == ck->cap) {
            int cap = ck->cap ? 2 * ck->cap : 64;
            ct_ckpt_entry *e = realloc(ck->e, (size_t)cap * sizeof *e);
            if (!e) return ct_error_set(CT_ERR_NOMEM, "out of memory");
            ck->e = e, ck->cap = cap;
        }
        x = &ck->e[ck->n++];
        *x = *proto;
        x->parts = NULL, x->nparts = x->cap = 0;
    } else {
        const char *first = ck->paths[x->parts[0].file], *here = ck->paths[part.file];
        char a[96], b[96];
        if (x->whole || proto->whole)
            return ct_error_set(CT_ERR_FORMAT,
                                "'%s' is in both %s and %s, whole in one of them: only parameters are split", x->name,
                                first, here);
        if (x->ndim != proto->ndim || memcmp(x->shape, proto->shape, (size_t)x->ndim * sizeof *x->shape) ||
            x->dtype != proto->dtype || x->index != proto->index)
            return ct_error_set(CT_ERR_FORMAT,
                                "parameter '%s' is %s %s (index %" PRId64 ") in %s but %s %s (index %" PRId64
                                ") in %s: files of different models",
                                x->name, ct_dtype_name(x->dtype), shape_of(x, a, sizeof a), x->index, first,
                                ct_dtype_name(proto->dtype), shape_of(proto, b, sizeof b), proto->index, here);
    }
    if (x->nparts == x->cap) {
        int cap = x->cap ? 2 * x->cap : 4;
        ct_ckpt_part *p = realloc(x->parts, (size_t)cap * sizeof *p);
        if (!p) return ct_error_set(CT_ERR_NOMEM, "out of memory");
        x->parts = p, x->cap = cap;
    }
    x->parts[x->nparts++] = part;
    return CT_OK;
}

/* "begin=B end=E shape=[d0,d1] dtype=D index=I" into x's shape, dtype and index and
 * the part's range; false when v is not that. */
static bool parse_part(const char *v, ct_ckpt_entry *x, int64_t *begin, int64_t *end)
{
    long long b, e, index;
    int n = 0;
    if (sscanf(v, "begin=%lld end=%lld shape=[%n", &b, &e, &n) != 2 || !n) return false;
    const char *p = v + n;
    x->ndim = 0;
    while (*p != ']') {
        char *q;
        errno = 0;
        long long d = strtoll(p, &q, 10);
        if (q == p || errno || d < 0 || x->ndim == CT_MAX_DIMS) return false;
        x->shape[x->ndim++] = d;
        p = q;
        if (*p == ',' && p[1] != ']') p++;
        else if (*p != ']') return false;
    }
    char dt[16];
    int m = -1;
    if (sscanf(p + 1, " dtype=%15[a-z0-9_] index=%lld%n", dt, &index, &m) != 2 || m < 0 || p[1 + m] != '\0')
        return false;
    if (!ct_dtype_parse(dt, &x->dtype) || !ct_dtype_is_float(x->dtype) || index < 0 || index >= WHOLE_INDEX)
        return false;
    x->index = index;
    *begin = b, *end = e;
    return numel_of(x->ndim, x->shape, &x->numel);
}

/* File r's header against the checkpoint's: format, count, place, save, parameters
 * (file 0's id and parameter count go into id and *nparams). */
static ct_status check_header(const ct_ckpt *ck, int r, char *id, size_t idcap, int *nparams)
{
    const ct_safetensors *f = ck->files[r];
    const char *path = ck->paths[r];
    const char *fmt = ct_safetensors_metadata(f, "ctrain.format"), *files = ct_safetensors_metadata(f, "ctrain.files");
    const char *file = ct_safetensors_metadata(f, "ctrain.file"),
               *cid = ct_safetensors_metadata(f, "ctrain.checkpoint");
    if (!fmt || strcmp(fmt, ck->format))
        return ct_error_set(CT_ERR_FORMAT,
                            "%s: ctrain.format is '%s', expected '%s': not a file of a ctrain sharded checkpoint", path,
                            fmt ? fmt : "(none)", ck->format);
    char want_files[16], want_file[16];
    snprintf(want_files, sizeof want_files, "%d", ck->nfiles);
    snprintf(want_file, sizeof want_file, "%d", r);
    if (!files || !file || strcmp(files, want_files) || strcmp(file, want_file))
        return ct_error_set(
            CT_ERR_FORMAT, "%s says it is file %s of %s, but its name says file %d of %d: a file of another checkpoint",
            path, file ? file : "(none)", files ? files : "(none)", r, ck->nfiles);
    if (!cid) return ct_error_set(CT_ERR_FORMAT, "%s: no ctrain.checkpoint entry", path);
    if (r == 0) snprintf(id, idcap, "%s", cid);
    else if (strcmp(id, cid))
        return ct_error_set(CT_ERR_FORMAT, "%s belongs to save %s but %s to save %s: files of two saves; save again",
                            path, cid, ck->paths[0], id);
    const char *np = ct_safetensors_metadata(f, "ctrain.params");
    char *end = NULL;
    long v = np ? strtol(np, &end, 10) : -1;
    if (!np || end == np || *end || v < 0 || v >= INT_MAX || (r > 0 && v != *nparams))
        return ct_error_set(CT_ERR_FORMAT, "%s: ctrain.params is '%s'%s", path, np ? np : "(none)",
                            r > 0 ? ", unlike file 0's: a file of another model" : "; expected a count");
    *nparams = (int)v;
    return CT_OK;
}

/* File 0's list of the parameters ("ctrain.param.I" = name) against the parts found:
 * a parameter none of whose elements is in any file shows only here. */
static ct_status check_params(const ct_ckpt *ck, const char *dir, int nparams)
{
    for (int i = 0; i < nparams; i++) {
        char key[48];
        snprintf(key, sizeof key, "ctrain.param.%d", i);
        const char *name = ct_safetensors_metadata(ck->files[0], key);
        if (!name) return ct_error_set(CT_ERR_FORMAT, "%s: no %s (of %d parameters)", ck->paths[0], key, nparams);
        const ct_ckpt_entry *x = cti_ckpt_find(ck, name);
        if (!x) return ct_error_set(CT_ERR_FORMAT, "parameter '%s': its elements are in no file of '%s'", name, dir);
        if (x->whole || x->index != i)
            return ct_error_set(CT_ERR_FORMAT, "parameter '%s' is #%d in the list of %s, but its parts say %s", name, i,
                                ck->paths[0], x->whole ? "it is a buffer" : "another index");
    }
    for (int j = 0; j < ck->n; j++)
        if (!ck->e[j].whole && ck->e[j].index >= nparams)
            return ct_error_set(CT_ERR_FORMAT, "parameter '%s': index %" PRId64 ", but '%s' lists %d parameters",
                                ck->e[j].name, ck->e[j].index, dir, nparams);
    return CT_OK;
}

/* File r's tensors into the entries: parts, and (file 0) whole buffers. */
static ct_status add_file(ct_ckpt *ck, int r)
{
    ct_safetensors *f = ck->files[r];
    const char *path = ck->paths[r];
    const int n = ct_safetensors_count(f);
    for (int i = 0; i < n; i++) {
        ct_ckpt_entry x = {.name = ct_safetensors_name(f, i)};
        ct_dtype dt;
        int nd;
        int64_t sh[CT_MAX_DIMS];
        ct_safetensors_info(f, x.name, &dt, &nd, sh);
        char *key = format(PART_KEY "%s", x.name);
        if (!key) return ct_last_status();
        const char *v = ct_safetensors_metadata(f, key);
        free(key);
        int64_t b = 0, e = 0;
        if (!v) {
            if (r)
                return ct_error_set(CT_ERR_FORMAT,
                                    "%s: tensor '%s' has no " PART_KEY
                                    "%s entry: only file 0 holds whole tensors (buffers)",
                                    path, x.name, x.name);
            x.whole = true, x.dtype = dt, x.ndim = nd, x.index = WHOLE_INDEX + i;
            memcpy(x.shape, sh, sizeof sh);
            numel_of(nd, sh, &x.numel);
            e = x.numel;
        } else if (!parse_part(v, &x, &b, &e)) {
            return ct_error_set(CT_ERR_FORMAT,
                                "%s, parameter '%s': " PART_KEY "%s is '%s'; expected 'begin=B end=E shape=[d0,d1,...] "
                                "dtype=D index=I'",
                                path, x.name, x.name, v);
        } else if (b < 0 || b >= e || e > x.numel) {
            char s[96];
            return ct_error_set(CT_ERR_FORMAT, "%s, parameter '%s': elements [%" PRId64 ", %" PRId64
                                ") are not inside its %" PRId64 " elements (shape %s)",
                                path, x.name, b, e, x.numel, shape_of(&x, s, sizeof s));
        } else if ((dt != CT_DTYPE_F32 && dt != CT_DTYPE_F64) || nd != 1 || sh[0] != e - b) {
            char s[96];
            return ct_error_set(CT_ERR_FORMAT,
                                "%s, parameter '%s': the part is %s %s, but elements [%" PRId64 ", %" PRId64
                                ") need F32 (or F64) [%" PRId64 "]",
                                path, x.name, ct_dtype_name(dt), ct_shape_str(nd, sh, s, sizeof s), b, e, e - b);
        }
        ct_status st = add_part(ck, &x, (ct_ckpt_part){r, b, e});
        if (st) return st;
    }
    /* a part's entry without its tensor would read as elements missing elsewhere */
    for (int k = 0; k < ct_safetensors_metadata_count(f); k++) {
        const char *key = ct_safetensors_metadata_key(f, k);
        if (strncmp(key, PART_KEY, strlen(PART_KEY))) continue;
        bool found = false;
        for (int i = 0; i < n && !found; i++) found = !strcmp(ct_safetensors_name(f, i), key + strlen(PART_KEY));
        if (!found)
            return ct_error_set(CT_ERR_FORMAT, "%s: %s describes a part, but the file has no tensor '%s'", path, key,
                                key + strlen(PART_KEY));
    }
    return CT_OK;
}

static int cmp_part(const void *a, const void *b)
{
    const int64_t x = ((const ct_ckpt_part *)a)->begin, y = ((const ct_ckpt_part *)b)->begin;
    return (x > y) - (x < y);
}

/* Every element of every parameter in exactly one file. */
static ct_status check_coverage(ct_ckpt *ck, const char *dir)
{
    for (int i = 0; i < ck->n; i++) {
        ct_ckpt_entry *x = &ck->e[i];
        qsort(x->parts, (size_t)x->nparts, sizeof *x->parts, cmp_part);
        int64_t at = 0;
        int last = -1; /* the part that reaches furthest so far */
        for (int k = 0; k < x->nparts; k++) {
            const ct_ckpt_part *p = &x->parts[k];
            if (p->begin > at)
                return ct_error_set(CT_ERR_FORMAT,
                                    "parameter '%s': elements [%" PRId64 ", %" PRId64 ") are in no file of '%s'",
                                    x->name, at, p->begin, dir);
            if (p->begin < at)
                return ct_error_set(
                    CT_ERR_FORMAT, "parameter '%s': elements [%" PRId64 ", %" PRId64 ") are in both %s and %s", x->name,
                    p->begin, p->end < at ? p->end : at, ck->paths[x->parts[last].file], ck->paths[p->file]);
            at = p->end, last = k;
        }
        if (at < x->numel)
            return ct_error_set(CT_ERR_FORMAT,
                                "parameter '%s': elements [%" PRId64 ", %" PRId64 ") are in no file of '%s'", x->name,
                                at, x->numel, dir);
    }
    return CT_OK;
}

static ct_status open_sharded(const char *dir, ct_ckpt *ck)
{
    DIR *d = opendir(dir);
    if (!d) return ct_error_set(CT_ERR_IO, "cannot read directory '%s': %s", dir, strerror(errno));
    int count = 0;
    char first[256] = "";
    ct_status st = CT_OK;
    struct dirent *de;
    while (!st && (de = readdir(d)) != NULL) {
        int r, n;
        if (!is_rank_file(de->d_name, ck->prefix, &r, &n)) continue;
        if (!count) count = n, snprintf(first, sizeof first, "%s", de->d_name);
        else if (n != count)
            st =
                ct_error_set(CT_ERR_FORMAT, "'%s' holds files of %d and of %d ranks (%s, %s): files of two checkpoints",
                             dir, count, n, first, de->d_name);
    }
    closedir(d);
    if (st) return st;
    if (!count)
        return ct_error_set(CT_ERR_FORMAT, "'%s' holds no %s-rank*-of-*.safetensors file: not a sharded checkpoint",
                            dir, ck->prefix);
    ck->sharded = true;
    ck->files = calloc((size_t)count, sizeof *ck->files);
    ck->paths = calloc((size_t)count, sizeof *ck->paths);
    if (!ck->files || !ck->paths) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    ck->nfiles = count;
    char id[64] = "";
    int nparams = 0;
    for (int r = 0; r < count && !st; r++) {
        char name[96];
        cti_ckpt_rank_file_name(name, sizeof name, ck->prefix, r, count);
        if (!(ck->paths[r] = format("%s/%s", dir, name))) return ct_last_status();
        if (access(ck->paths[r], F_OK))
            return ct_error_set(CT_ERR_FORMAT, "'%s': %s is missing (rank %d of %d): every rank's file is needed", dir,
                                name, r, count);
        if (!(ck->files[r] = ct_safetensors_open(ck->paths[r]))) return ct_last_status();
        st = check_header(ck, r, id, sizeof id, &nparams);
        if (!st) st = add_file(ck, r);
    }
    if (!st) st = check_coverage(ck, dir);
    return st ? st : check_params(ck, dir, nparams);
}

static ct_status open_full(const char *path, ct_ckpt *ck)
{
    ck->files = calloc(1, sizeof *ck->files);
    ck->paths = calloc(1, sizeof *ck->paths);
    if (!ck->files || !ck->paths || !(ck->paths[0] = format("%s", path)))
        return ct_error_set(CT_ERR_NOMEM, "out of memory");
    ck->nfiles = 1;
    if (!(ck->files[0] = ct_safetensors_open(path))) return ct_last_status();
    for (int i = 0; i < ct_safetensors_count(ck->files[0]); i++) {
        ct_ckpt_entry x = {.name = ct_safetensors_name(ck->files[0], i), .whole = true, .index = i};
        ct_safetensors_info(ck->files[0], x.name, &x.dtype, &x.ndim, x.shape);
        numel_of(x.ndim, x.shape, &x.numel);
        ct_status st = add_part(ck, &x, (ct_ckpt_part){0, 0, x.numel});
        if (st) return st;
    }
    return CT_OK;
}

ct_status cti_ckpt_open_parts(const char *dir, const char *prefix, const char *format, ct_ckpt *ck)
{
    *ck = (ct_ckpt){.prefix = prefix, .format = format};
    return open_sharded(dir, ck);
}

ct_status cti_ckpt_open(const char *path, bool sharded_only, ct_ckpt *ck)
{
    *ck = (ct_ckpt){.prefix = "model", .format = CT_MODEL_SHARDS_FORMAT};
    struct stat sb;
    if (!path) return ct_error_set(CT_ERR_INVALID, "checkpoint path is NULL");
    if (stat(path, &sb)) return ct_error_set(CT_ERR_IO, "'%s': %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return open_sharded(path, ck);
    if (sharded_only)
        return ct_error_set(CT_ERR_INVALID,
                            "'%s' is not a directory: a sharded checkpoint (SHARDED_STATE_DICT) is a directory of "
                            "model-rank*-of-*.safetensors files",
                            path);
    return open_full(path, ck);
}

ct_status cti_ckpt_read(const ct_ckpt *ck, const ct_ckpt_entry *x, int64_t begin, int64_t end, ct_tensor *dst)
{
    ct_status st = CT_OK;
    for (int k = 0; k < x->nparts && !st; k++) {
        const ct_ckpt_part *p = &x->parts[k];
        const int64_t a = begin > p->begin ? begin : p->begin, z = end < p->end ? end : p->end;
        if (a >= z) continue;
        ct_frame_push();
        /* a zero-copy view of the mapping (a copy when misaligned), seen flat */
        ct_tensor *t = ct_safetensors_get(ck->files[p->file], x->name);
        ct_tensor *flat = t ? ct_tensor_view(t, 1, (const int64_t[]){p->end - p->begin}) : NULL;
        ct_tensor *src = flat ? ct_tensor_narrow(flat, 0, a - p->begin, z - a) : NULL;
        ct_tensor *to = src ? ct_tensor_narrow(dst, 0, a - begin, z - a) : NULL;
        if (!to || ct_tensor_copy_(to, src)) st = ct_error_prefix("%s, '%s': ", ck->paths[p->file], x->name);
        ct_frame_pop();
    }
    return st;
}

ct_tensor *cti_ckpt_read_whole(const ct_ckpt *ck, const ct_ckpt_entry *x)
{
    if (x->whole) {
        ct_tensor *t = ct_safetensors_get(ck->files[x->parts[0].file], x->name);
        if (!t) ct_error_prefix("%s: ", ck->paths[x->parts[0].file]);
        return t;
    }
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_F32, x->ndim, x->shape);
    ct_tensor *flat = t ? ct_tensor_view(t, 1, (const int64_t[]){x->numel}) : NULL;
    if (!flat || cti_ckpt_read(ck, x, 0, x->numel, flat)) return NULL;
    return x->dtype == CT_DTYPE_F32 ? t : ct_tensor_cast(t, x->dtype);
}

/* ---- the ranks' agreement ------------------------------------------------------------- */


ct_status cti_ckpt_agree(ct_accelerator *acc, ct_status st)
{
    ct_pg *pg = ct_accelerator_pg(acc);
    const int rank = ct_pg_rank(pg), world = ct_pg_size(pg);
    unsigned char msg[AGREE_BYTES] = {(unsigned char)st};
    if (st) snprintf((char *)msg + 1, sizeof msg - 1, "%s", ct_last_error());
    ct_status out = st;
    ct_frame_push();
    /* the lowest failing rank, then its message from it */
    ct_tensor *who = ct_tensor_from_data(CT_DTYPE_I32, CT_SHAPE(1), (int32_t[]){st ? rank : world});
    ct_status cs = who ? ct_work_run(ct_pg_allreduce(pg, who, CT_REDUCE_MIN)) : ct_last_status();
    const int first = cs ? world : *(const int32_t *)ct_tensor_data(who);
    ct_tensor *m = NULL;
    if (!cs && first < world) {
        m = ct_tensor_from_data(CT_DTYPE_U8, CT_SHAPE(AGREE_BYTES), msg);
        cs = m ? ct_work_run(ct_pg_broadcast(pg, m, first)) : ct_last_status();
    }
    if (cs) out = cs;
    else if (first < world && first != rank) {
        const unsigned char *got = ct_tensor_data(m);
        ct_status their = got[0] > CT_OK && got[0] <= CT_ERR_PEER ? (ct_status)got[0] : CT_ERR_PEER;
        out = ct_error_set(their, "rank %d failed: %.*s", first, AGREE_BYTES - 2, (const char *)got + 1);
    }
    ct_frame_pop();
    return out;
}

/* ---- saving ---------------------------------------------------------------------------- */

/* FNV-1a over 8-byte words (then the tail bytes): a cheap fingerprint of a save. */
static uint64_t fingerprint(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (; n >= 8; c += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, c, 8);
        h = (h ^ w) * 0x100000001b3ULL;
    }
    for (; n; c++, n--) h = (h ^ *c) * 0x100000001b3ULL;
    return h;
}

static uint64_t fingerprint_tensor(uint64_t h, const char *name, ct_tensor *t)
{
    h = fingerprint(h, name, strlen(name));
    ct_tensor *c = ct_tensor_contiguous(t);
    return c && ct_tensor_data(c) ? fingerprint(h, ct_tensor_data(c), ct_tensor_nbytes(c)) : h;
}

/* Creates dir (or finds it); the first rank also removes the rank files of an earlier
 * save with another count, which would make the directory read as two checkpoints. */
static ct_status prepare_dir(const char *dir, int nfiles, bool clean)
{
    if (mkdir(dir, 0755) && errno != EEXIST)
        return ct_error_set(CT_ERR_IO, "cannot create directory '%s': %s", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb)) return ct_error_set(CT_ERR_IO, "'%s': %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return ct_error_set(
            CT_ERR_INVALID,
            "'%s' exists and is not a directory: a sharded checkpoint (SHARDED_STATE_DICT) is a directory; "
            "remove the file or save elsewhere",
            dir);
    if (!clean) return CT_OK;
    DIR *d = opendir(dir);
    if (!d) return ct_error_set(CT_ERR_IO, "cannot read directory '%s': %s", dir, strerror(errno));
    ct_status st = CT_OK;
    struct dirent *de;
    while (!st && (de = readdir(d)) != NULL) {
        int r, n;
        if (!is_rank_file(de->d_name, "model", &r, &n) || n == nfiles) continue;
        char *p = format("%s/%s", dir, de->d_name);
        if (!p) st = ct_last_status();
        else if (unlink(p) && errno != ENOENT)
            st = ct_error_set(CT_ERR_IO, "cannot remove '%s' of an earlier save with %d files: %s", p, n,
                              strerror(errno));
        free(p);
    }
    closedir(d);
    return st;
}

/* The position of name in list, or -1. */
static int64_t position(int n, const char *const *list, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i], name)) return i;
    return -1;
}

/* "begin=B end=E shape=[d0,d1] dtype=D index=I" (malloc'd). */
static char *part_value(const ct_shard_part *p, int64_t index)
{
    char shape[CT_MAX_DIMS * 21 + 1] = "";
    size_t at = 0;
    for (int d = 0; d < p->param->ndim; d++)
        at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%" PRId64, d ? "," : "", p->param->shape[d]);
    return format("begin=%" PRId64 " end=%" PRId64 " shape=[%s] dtype=%s index=%" PRId64, p->begin, p->end, shape,
                  ct_dtype_name(p->dtype), index);
}

ct_status cti_ckpt_write_parts(const char *dir, const cti_ckpt_parts_file *w)
{
    const int r = w->file, n = w->nparts, nlist = r == 0 ? w->nlist : 0, nwhole = r == 0 ? w->nwhole : 0;
    const int nt = n + nwhole, nm = 5 + n + nlist + w->nmeta;
    const char **names = calloc((size_t)(nt ? nt : 1), sizeof *names);
    ct_tensor **ts = calloc((size_t)(nt ? nt : 1), sizeof *ts);
    char **keys = calloc((size_t)nm, sizeof *keys), **vals = calloc((size_t)nm, sizeof *vals);
    char name[96], *path = NULL;
    cti_ckpt_rank_file_name(name, sizeof name, w->prefix, r, w->nfiles);
    ct_status st = names && ts && keys && vals ? CT_OK : ct_error_set(CT_ERR_NOMEM, "out of memory");
    if (!st) {
        keys[0] = format("ctrain.format"), vals[0] = format("%s", w->format);
        keys[1] = format("ctrain.files"), vals[1] = format("%d", w->nfiles);
        keys[2] = format("ctrain.file"), vals[2] = format("%d", r);
        keys[3] = format("ctrain.checkpoint"), vals[3] = format("%016" PRIx64, w->id);
        keys[4] = format("ctrain.params"), vals[4] = format("%d", w->nlist);
        path = format("%s/%s", dir, name);
    }
    for (int i = 0; i < nlist && !st; i++)
        keys[5 + n + i] = format("ctrain.param.%d", i), vals[5 + n + i] = format("%s", w->list[i]);
    for (int i = 0; i < w->nmeta && !st; i++)
        keys[5 + n + nlist + i] = format("%s", w->meta_keys[i]), vals[5 + n + nlist + i] = format("%s", w->meta_vals[i]);
    for (int i = 0; i < n && !st; i++) {
        const int64_t index = position(w->nlist, w->list, w->parts[i].name);
        if (index < 0) {
            st = ct_error_set(CT_ERR_INTERNAL, "'%s' of the engine is not in the file's list", w->parts[i].name);
            break;
        }
        names[i] = w->parts[i].name, ts[i] = w->parts[i].values;
        keys[5 + i] = format(PART_KEY "%s", w->parts[i].name);
        vals[5 + i] = part_value(&w->parts[i], index);
    }
    for (int j = 0; j < nwhole && !st; j++) names[n + j] = w->whole_names[j], ts[n + j] = w->whole[j];
    for (int k = 0; k < nm && !st; k++)
        if (!keys[k] || !vals[k] || !path) st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    if (!st)
        st = ct_safetensors_save_hashed(path, nt, names, ts, nm, (const char *const *)keys, (const char *const *)vals,
                                        w->xxh3, w->bytes);
    for (int k = 0; keys && vals && k < nm; k++) free(keys[k]), free(vals[k]);
    free(names), free(ts), free(keys), free(vals), free(path);
    return st;
}

ct_status cti_model_shards_save(ct_accelerator *acc, ct_module *model, const char *dir)
{
    return cti_model_shards_save_hashed(acc, model, dir, NULL, NULL);
}

ct_status cti_model_shards_save_hashed(ct_accelerator *acc, ct_module *model, const char *dir, uint64_t *xxh3,
                                       int64_t *bytes)
{
    ct_shard *s = ct_accelerator_shard(acc);
    if (!s || !model || !dir)
        return ct_error_set(CT_ERR_INVALID, "accelerator_save_model: %s", !s ? "no sharded strategy was prepared"
                                                                           : !model ? "model is NULL" : "path is NULL");
    const int rank = ct_accelerator_process_index(acc), nfiles = ct_shard_stats_get(s).shard_world;
    ct_shard_part *parts = NULL;
    int n = 0;
    bool writer = false;
    ct_param_list params = {0}, all = {0};
    uint64_t h = 0xcbf29ce484222325ULL;
    ct_frame_push();
    ct_status st = ct_shard_local_parts(s, &parts, &n, &writer);
    if (!st) st = ct_module_named_tensors(model, false, &params);
    if (!st) st = ct_module_named_tensors(model, true, &all);
    for (int i = 0; i < n && !st && writer; i++) {
        const int64_t range[2] = {parts[i].begin, parts[i].end};
        h = fingerprint(fingerprint_tensor(h, parts[i].name, parts[i].values), range, sizeof range);
    }
    for (int i = params.n; i < all.n && !st && rank == 0; i++) h = fingerprint_tensor(h, all.names[i], all.tensors[i]);
    if (!st && writer) st = prepare_dir(dir, nfiles, rank == 0);
    st = cti_ckpt_agree(acc, st);
    if (!st) CT_FRAME {
            /* the save's id: the sum of the writers' fingerprints (wrapping), on every rank */
            int64_t mine = 0;
            if (writer) memcpy(&mine, &h, sizeof mine);
            ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), &mine);
            st = t ? ct_work_run(ct_pg_allreduce(ct_accelerator_pg(acc), t, CT_REDUCE_SUM)) : ct_last_status();
            if (!st) memcpy(&h, ct_tensor_data(t), sizeof h);
        }
    if (!st) {
        if (writer)
            st = cti_ckpt_write_parts(dir, &(cti_ckpt_parts_file){.prefix = "model",
                                                                  .format = CT_MODEL_SHARDS_FORMAT,
                                                                  .file = rank,
                                                                  .nfiles = nfiles,
                                                                  .id = h,
                                                                  .parts = parts,
                                                                  .nparts = n,
                                                                  .list = (const char *const *)params.names,
                                                                  .nlist = params.n,
                                                                  .whole_names = (const char *const *)all.names + params.n,
                                                                  .whole = all.tensors + params.n,
                                                                  .nwhole = all.n - params.n,
                                                                  .xxh3 = xxh3,
                                                                  .bytes = bytes});
        st = cti_ckpt_agree(acc, st);
    }
    ct_frame_pop();
    free(parts);
    ct_param_list_free(&params);
    ct_param_list_free(&all);
    return st ? ct_error_prefix("accelerator_save_model (rank %d, sharded '%s'): ", rank, dir) : CT_OK;
}

/* ---- merging ---------------------------------------------------------------------------- */

static int cmp_index(const void *a, const void *b)
{
    const int64_t x = (*(const ct_ckpt_entry *const *)a)->index, y = (*(const ct_ckpt_entry *const *)b)->index;
    return (x > y) - (x < y);
}

ct_status ct_sharded_model_merge(const char *dir, const char *out_path)
{
    if (!dir || !out_path)
        return ct_error_set(CT_ERR_INVALID, "sharded_model_merge: %s is NULL",
                            !dir ? "the directory" : "the output path");
    ct_ckpt ck;
    ct_status st = cti_ckpt_open(dir, true, &ck);
    const ct_ckpt_entry **order = st ? NULL : calloc((size_t)(ck.n ? ck.n : 1), sizeof *order);
    const char **names = st ? NULL : calloc((size_t)(ck.n ? ck.n : 1), sizeof *names);
    ct_tensor **ts = st ? NULL : calloc((size_t)(ck.n ? ck.n : 1), sizeof *ts);
    if (!st && (!order || !names || !ts)) st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    ct_frame_push();
    if (!st) {
        for (int i = 0; i < ck.n; i++) order[i] = &ck.e[i];
        qsort(order, (size_t)ck.n, sizeof *order, cmp_index);
    }
    for (int i = 0; i < ck.n && !st; i++) {
        names[i] = order[i]->name;
        if (!(ts[i] = cti_ckpt_read_whole(&ck, order[i]))) st = ct_last_status();
    }
    if (!st) st = ct_safetensors_save(out_path, ck.n, names, ts, 0, NULL, NULL);
    ct_frame_pop();
    free(order), free(names), free(ts);
    cti_ckpt_close(&ck);
    return st ? ct_error_prefix("sharded_model_merge '%s' -> '%s': ", dir, out_path) : CT_OK;
}
