/* safetensors reading (mmap, validate the whole header first) and writing
 * (temporary file, fsync, rename). The format and the validation rules are in
 * core/safetensors.h. */
#include "core/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/atomic_file.h"
#include "core/frame.h"
#include "core/tensor_internal.h"

/* Tensor bytes go to and from the file as they sit in memory. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

/* cJSON keeps numbers as doubles: integers above 2^53 would come back rounded, so
 * they are refused rather than silently changed. */
#define MAX_EXACT_INT 9007199254740992.0 /* 2^53 */

/* The mapping (or caller's buffer) shared by the handle and every zero-copy tensor;
 * the last reference unmaps it. */
typedef struct st_mapping {
    int refcount; /* atomic */
    void *addr;
    size_t len;
    bool mapped; /* false: a caller's buffer, not ours to unmap */
} st_mapping;

typedef struct st_entry {
    char *name;
    ct_dtype dtype;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    uint64_t begin, end; /* relative to the data section */
    int header_index;    /* position in the JSON object, to break sorting ties */
} st_entry;

struct ct_safetensors {
    char *label;
    st_mapping *map;
    const uint8_t *data; /* start of the data section */
    uint64_t data_len;
    int n;
    st_entry *entries; /* file order: by begin, end, header position */
    int *by_name;      /* indices into entries, sorted by name */
    int nmeta;
    char **meta_keys, **meta_values;
};

/* ---- mapping lifetime ---------------------------------------------------- */

static void mapping_drop(st_mapping *m)
{
    if (!m || __atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    /* addr and len came from our own successful mmap: failure is an internal bug */
    if (m->mapped) CT_ASSERT(munmap(m->addr, m->len) == 0);
    free(m);
}

static void view_release(void *ctx, void *data, size_t nbytes)
{
    (void)data;
    (void)nbytes;
    mapping_drop(ctx);
}

/* ---- small helpers ------------------------------------------------------- */

/* Records "safetensors '<label>': <message>" and returns st. */
static ct_status st_fail(const char *label, ct_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ct_status st_fail(const char *label, ct_status st, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ct_error_set(st, "safetensors '%s': %s", label, msg);
}

/* Index of the first byte that breaks UTF-8 (overlong forms, surrogates and code
 * points above U+10FFFF included) or is a control character JSON forbids raw
 * (below 0x20 except tab, LF, CR); n when there is none. */
static size_t text_invalid_at(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return i;
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return i;
        if (n - i < len) return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A JSON number that is a whole number in [0, 2^53]. */
static bool exact_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= MAX_EXACT_INT) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static bool dtype_from_st_name(const char *s, ct_dtype *out)
{
    for (int i = 0; i < CT_DTYPE_COUNT; i++) {
        if (strcmp(s, ct_dtype_safetensors_name((ct_dtype)i)) == 0) {
            *out = (ct_dtype)i;
            return true;
        }
    }
    return false;
}

/* Bytes of numel(shape) elements of size es, or false on overflow of u64. */
static bool shape_nbytes(int ndim, const int64_t *shape, size_t es, uint64_t *out)
{
    uint64_t n = es;
    bool zero = false;
    for (int d = 0; d < ndim; d++) zero |= shape[d] == 0;
    if (zero) return *out = 0, true;
    for (int d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(n, (uint64_t)shape[d], &n)) return false;
    *out = n;
    return true;
}

/* ---- header validation --------------------------------------------------- */

/* One tensor entry: exactly {dtype, shape, data_offsets}. */
static ct_status parse_entry(const char *label, const cJSON *item, uint64_t data_len, st_entry *e)
{
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': entry is not a JSON object", name);
    static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
    const cJSON *found[3] = {NULL, NULL, NULL};
    for (const cJSON *c = item->child; c; c = c->next) {
        int k = 0;
        while (k < 3 && strcmp(c->string, keys[k]) != 0) k++;
        if (k == 3)
            return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': unexpected key \"%.100s\" (allowed: dtype, shape, data_offsets)",
                           name, c->string);
        if (found[k]) return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': duplicate key \"%s\"", name, keys[k]);
        found[k] = c;
    }
    for (int k = 0; k < 3; k++)
        if (!found[k]) return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': missing \"%s\"", name, keys[k]);

    if (!cJSON_IsString(found[0]))
        return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': dtype is not a string", name);
    if (!dtype_from_st_name(found[0]->valuestring, &e->dtype))
        return st_fail(label, CT_ERR_FORMAT,
                       "tensor '%.200s': unsupported dtype \"%.40s\" (ctrain reads F32 F64 F16 BF16 F8_E4M3 F8_E5M2 I32 I64 U8 BOOL)",
                       name, found[0]->valuestring);

    const cJSON *shape = found[1];
    if (!cJSON_IsArray(shape)) return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': shape is not an array", name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > CT_MAX_DIMS)
        return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': shape has %d dims, ctrain supports at most %d", name,
                       ndim, CT_MAX_DIMS);
    e->ndim = 0;
    for (const cJSON *c = shape->child; c; c = c->next) {
        uint64_t v;
        if (!exact_uint(c, &v))
            return st_fail(label, CT_ERR_FORMAT,
                           "tensor '%.200s': shape entry %d is not a non-negative integer (at most 2^53)", name, e->ndim);
        e->shape[e->ndim++] = (int64_t)v;
    }

    const cJSON *offs = found[2];
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !exact_uint(offs->child, &e->begin) ||
        !exact_uint(offs->child->next, &e->end))
        return st_fail(label, CT_ERR_FORMAT,
                       "tensor '%.200s': data_offsets is not [begin, end] of non-negative integers (at most 2^53)", name);
    if (e->begin > e->end)
        return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': data_offsets [%llu, %llu] end before they begin", name,
                       (unsigned long long)e->begin, (unsigned long long)e->end);

    char sh[160];
    uint64_t need;
    if (!shape_nbytes(e->ndim, e->shape, ct_dtype_size(e->dtype), &need))
        return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s': %s%s is too large (byte count overflows)", name,
                       ct_dtype_safetensors_name(e->dtype), ct_shape_str(e->ndim, e->shape, sh, sizeof sh));
    if (e->end - e->begin != need)
        return st_fail(label, CT_ERR_FORMAT,
                       "tensor '%.200s': data_offsets [%llu, %llu] hold %llu bytes but %s%s needs %llu", name,
                       (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)(e->end - e->begin), ct_dtype_safetensors_name(e->dtype),
                       ct_shape_str(e->ndim, e->shape, sh, sizeof sh), (unsigned long long)need);
    if (e->end > data_len)
        return st_fail(label, CT_ERR_FORMAT,
                       "tensor '%.200s': data_offsets [%llu, %llu] run past the data section (%llu bytes; file truncated?)",
                       name, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_len);
    if (!(e->name = strdup(name))) return st_fail(label, CT_ERR_NOMEM, "out of memory");
    return CT_OK;
}

static ct_status parse_metadata(const char *label, const cJSON *md, ct_safetensors *f)
{
    if (!cJSON_IsObject(md)) return st_fail(label, CT_ERR_FORMAT, "__metadata__ is not a JSON object");
    int n = cJSON_GetArraySize(md);
    f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    f->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) return st_fail(label, CT_ERR_NOMEM, "out of memory");
    for (const cJSON *c = md->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return st_fail(label, CT_ERR_FORMAT, "__metadata__ key '%.200s': value is not a string", c->string);
        for (int i = 0; i < f->nmeta; i++)
            if (strcmp(f->meta_keys[i], c->string) == 0)
                return st_fail(label, CT_ERR_FORMAT, "__metadata__: duplicate key '%.200s'", c->string);
        char *k = strdup(c->string), *v = strdup(c->valuestring);
        if (!k || !v) {
            free(k);
            free(v);
            return st_fail(label, CT_ERR_NOMEM, "out of memory");
        }
        f->meta_keys[f->nmeta] = k;
        f->meta_values[f->nmeta++] = v;
    }
    return CT_OK;
}

static int cmp_file_order(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->header_index > y->header_index) - (x->header_index < y->header_index);
}

/* qsort has no context argument: the entries being sorted by name, one thread at a time per call */
static _Thread_local const st_entry *sort_entries;

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(sort_entries[*(const int *)a].name, sort_entries[*(const int *)b].name);
}

static void handle_free(ct_safetensors *f)
{
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->entries[i].name);
    for (int i = 0; i < f->nmeta; i++) free(f->meta_keys[i]), free(f->meta_values[i]);
    free(f->entries);
    free(f->by_name);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->label);
    mapping_drop(f->map);
    free(f);
}

/* Everything about the tensors that can be checked from the header and the sizes. */
static ct_status validate(ct_safetensors *f, const uint8_t *buf, size_t len)
{
    const char *label = f->label;
    if (len < 8)
        return st_fail(label, CT_ERR_FORMAT, "%zu bytes is shorter than the 8-byte header length (truncated or not safetensors)",
                       len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen < 2)
        return st_fail(label, CT_ERR_FORMAT, "header length %llu is below 2, the size of \"{}\" (not a safetensors file?)",
                       (unsigned long long)hlen);
    if (hlen > CT_SAFETENSORS_MAX_HEADER)
        return st_fail(label, CT_ERR_FORMAT, "header length %llu exceeds the %u-byte limit (not a safetensors file?)",
                       (unsigned long long)hlen, CT_SAFETENSORS_MAX_HEADER);
    if (hlen > len - 8)
        return st_fail(label, CT_ERR_FORMAT, "header length %llu runs past the end of the %zu-byte file (truncated?)",
                       (unsigned long long)hlen, len);
    const char *hdr = (const char *)buf + 8;
    size_t bad = text_invalid_at((const uint8_t *)hdr, hlen);
    if (bad < hlen)
        return st_fail(label, CT_ERR_FORMAT, "header byte %zu (0x%02x) is not valid UTF-8 JSON text", bad,
                       (unsigned char)hdr[bad]);
    f->data = buf + 8 + hlen;
    f->data_len = len - 8 - hlen;

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, false);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
        return st_fail(label, CT_ERR_FORMAT, "header is not valid JSON (parsing stopped near header byte %zu of %llu)", at,
                       (unsigned long long)hlen);
    }
    ct_status st = CT_OK;
    for (const char *p = end; p < hdr + hlen && !st; p++)
        if (!is_json_space(*p))
            st = st_fail(label, CT_ERR_FORMAT, "unexpected bytes after the JSON header at header byte %zu",
                         (size_t)(p - hdr));
    if (!st && !cJSON_IsObject(root)) st = st_fail(label, CT_ERR_FORMAT, "header is not a JSON object");

    int count = st ? 0 : cJSON_GetArraySize(root);
    const cJSON *md = NULL;
    if (!st && !(f->entries = calloc((size_t)count + 1, sizeof *f->entries)))
        st = st_fail(label, CT_ERR_NOMEM, "out of memory for %d header entries", count);
    int index = 0;
    for (const cJSON *c = st ? NULL : root->child; c && !st; c = c->next, index++) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (md) st = st_fail(label, CT_ERR_FORMAT, "duplicate \"__metadata__\"");
            md = c;
            continue;
        }
        st_entry *e = &f->entries[f->n];
        e->header_index = index;
        st = parse_entry(label, c, f->data_len, e);
        if (!st) f->n++;
    }
    if (!st && md) st = parse_metadata(label, md, f);
    cJSON_Delete(root);
    if (st) return st;

    /* names: sort an index and compare neighbours (cJSON keeps duplicate keys) */
    if (!(f->by_name = malloc(((size_t)f->n + 1) * sizeof *f->by_name)))
        return st_fail(label, CT_ERR_NOMEM, "out of memory");
    qsort(f->entries, (size_t)f->n, sizeof *f->entries, cmp_file_order);
    for (int i = 0; i < f->n; i++) f->by_name[i] = i;
    sort_entries = f->entries;
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_by_name);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->entries[f->by_name[i - 1]].name, f->entries[f->by_name[i]].name) == 0)
            return st_fail(label, CT_ERR_FORMAT, "duplicate tensor name '%.200s'", f->entries[f->by_name[i]].name);

    /* overlaps: in begin order, each non-empty tensor must start at or after the end
     * of the previous non-empty one (empty tensors occupy no bytes) */
    const st_entry *prev = NULL;
    for (int i = 0; i < f->n; i++) {
        const st_entry *e = &f->entries[i];
        if (e->begin == e->end) continue;
        if (prev && e->begin < prev->end)
            return st_fail(label, CT_ERR_FORMAT, "tensor '%.200s' [%llu, %llu) overlaps tensor '%.200s' [%llu, %llu)",
                           e->name, (unsigned long long)e->begin, (unsigned long long)e->end, prev->name,
                           (unsigned long long)prev->begin, (unsigned long long)prev->end);
        prev = e;
    }
    return CT_OK;
}

/* Takes over the caller's reference to map (dropped on failure). */
static ct_safetensors *open_buffer(const uint8_t *buf, size_t len, const char *label, st_mapping *map)
{
    ct_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->label = strdup(label))) {
        free(f);
        mapping_drop(map);
        ct_error_set(CT_ERR_NOMEM, "safetensors '%s': out of memory", label);
        return NULL;
    }
    f->map = map;
    if (validate(f, buf, len)) {
        handle_free(f);
        return NULL;
    }
    return f;
}

ct_safetensors *ct_safetensors_open_memory(const void *buf, size_t len, const char *label)
{
    if (!label) label = "<memory>";
    if (!buf && len) {
        ct_error_set(CT_ERR_INVALID, "safetensors '%s': buffer is NULL with length %zu", label, len);
        return NULL;
    }
    st_mapping *m = calloc(1, sizeof *m);
    if (!m) {
        ct_error_set(CT_ERR_NOMEM, "safetensors '%s': out of memory", label);
        return NULL;
    }
    *m = (st_mapping){.refcount = 1, .addr = (void *)buf, .len = len, .mapped = false};
    return open_buffer(buf, len, label, m);
}

ct_safetensors *ct_safetensors_open(const char *path)
{
    if (!path) {
        ct_error_set(CT_ERR_INVALID, "safetensors_open: path is NULL");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ct_error_set(CT_ERR_IO, "safetensors '%s': cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        ct_error_set(CT_ERR_IO, "safetensors '%s': cannot fstat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        ct_error_set(CT_ERR_IO, "safetensors '%s': not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        st_fail(path, CT_ERR_FORMAT, "%zu bytes is shorter than the 8-byte header length (truncated or not safetensors)",
                len);
        return NULL;
    }
    /* private and writable: tensors loaded as views may be updated in place (copy on
     * write) without the file ever changing */
    void *addr = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    if (close(fd) != 0 && addr != MAP_FAILED) {
        ct_error_set(CT_ERR_IO, "safetensors '%s': cannot close: %s", path, strerror(errno));
        munmap(addr, len);
        return NULL;
    }
    if (addr == MAP_FAILED) {
        ct_error_set(CT_ERR_IO, "safetensors '%s': cannot mmap %zu bytes: %s", path, len, strerror(map_errno));
        return NULL;
    }
    st_mapping *m = calloc(1, sizeof *m);
    if (!m) {
        munmap(addr, len);
        ct_error_set(CT_ERR_NOMEM, "safetensors '%s': out of memory", path);
        return NULL;
    }
    *m = (st_mapping){.refcount = 1, .addr = addr, .len = len, .mapped = true};
    return open_buffer(addr, len, path, m);
}

void ct_safetensors_close(ct_safetensors *f) { handle_free(f); }

/* ---- queries ------------------------------------------------------------- */

int ct_safetensors_count(const ct_safetensors *f) { return f ? f->n : 0; }

const char *ct_safetensors_label(const ct_safetensors *f) { return f ? f->label : NULL; }

const char *ct_safetensors_name(const ct_safetensors *f, int i)
{
    if (!f) return NULL;
    if (i < 0 || i >= f->n) {
        st_fail(f->label, CT_ERR_INVALID, "tensor index %d is outside 0..%d", i, f->n - 1);
        return NULL;
    }
    return f->entries[i].name;
}

static const st_entry *find(const ct_safetensors *f, const char *name)
{
    if (!f) return NULL;
    if (!name) {
        st_fail(f->label, CT_ERR_INVALID, "tensor name is NULL");
        return NULL;
    }
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const st_entry *e = &f->entries[f->by_name[mid]];
        int c = strcmp(name, e->name);
        if (c == 0) return e;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    st_fail(f->label, CT_ERR_INVALID, "no tensor named '%.200s' (the file holds %d tensors)", name, f->n);
    return NULL;
}

bool ct_safetensors_info(const ct_safetensors *f, const char *name, ct_dtype *dt, int *ndim, int64_t *shape)
{
    const st_entry *e = find(f, name);
    if (!e) return false;
    if (dt) *dt = e->dtype;
    if (ndim) *ndim = e->ndim;
    if (shape) memcpy(shape, e->shape, (size_t)e->ndim * sizeof *shape);
    return true;
}

ct_tensor *ct_safetensors_get(ct_safetensors *f, const char *name)
{
    const st_entry *e = find(f, name);
    if (!e) return NULL;
    size_t nbytes = (size_t)(e->end - e->begin);
    if (nbytes == 0) return ct_tensor_empty(e->dtype, e->ndim, e->shape);
    const uint8_t *p = f->data + e->begin;
    ct_tensor *t = NULL;
    bool bool_ok = true;
    if (e->dtype == CT_DTYPE_BOOL)
        for (size_t i = 0; i < nbytes && bool_ok; i++) bool_ok = p[i] <= 1;
    if (!bool_ok) {
        if ((t = ct_tensor_empty(e->dtype, e->ndim, e->shape))) {
            uint8_t *q = ct_tensor_data(t);
            for (size_t i = 0; i < nbytes; i++) q[i] = p[i] != 0;
        }
    } else if ((uintptr_t)p % ct_dtype_size(e->dtype) == 0) {
        __atomic_add_fetch(&f->map->refcount, 1, __ATOMIC_RELAXED);
        ct_storage *s = ct_storage_wrap(CT_CPU, (void *)p, nbytes, view_release, f->map);
        if (!s) mapping_drop(f->map);
        /* consumes s; on failure releasing s drops the mapping reference */
        else t = cti_tensor_wrap_storage(s, e->dtype, e->ndim, e->shape);
    } else {
        t = ct_tensor_from_data(e->dtype, e->ndim, e->shape, p);
    }
    if (!t) ct_error_prefix("safetensors '%s': tensor '%.200s': ", f->label, e->name);
    return t;
}

const char *ct_safetensors_metadata(const ct_safetensors *f, const char *key)
{
    if (!f || !key) return NULL;
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

int ct_safetensors_metadata_count(const ct_safetensors *f) { return f ? f->nmeta : 0; }

const char *ct_safetensors_metadata_key(const ct_safetensors *f, int i)
{
    if (!f) return NULL;
    if (i < 0 || i >= f->nmeta) {
        st_fail(f->label, CT_ERR_INVALID, "metadata index %d is outside 0..%d", i, f->nmeta - 1);
        return NULL;
    }
    return f->meta_keys[i];
}

/* ---- writing ------------------------------------------------------------- */

/* Where a save writes: the file, and what is done to the bytes on the way. */
typedef struct sink {
    cti_atomic_file *file;
    XXH3_state_t *hash; /* NULL: no checksum wanted */
    int64_t written, flushed;
} sink;

/* Writeback is started every this many bytes, so the device writes while the rest is
 * copied in and the final fsync waits for little. */
#define SINK_FLUSH_BYTES ((int64_t)64 << 20)

static ct_status write_all(sink *o, const void *buf, size_t n)
{
    if (o->hash) XXH3_64bits_update(o->hash, buf, n);
    ct_status st = cti_atomic_write(o->file, buf, n);
    if (st) return st;
    o->written += (int64_t)n;
    if (o->written - o->flushed >= SINK_FLUSH_BYTES) {
        /* a hint: a filesystem without it still gets the fsync at the end */
        (void)sync_file_range(o->file->fd, o->flushed, o->written - o->flushed, SYNC_FILE_RANGE_WRITE);
        o->flushed = o->written;
    }
    return CT_OK;
}

/* BOOL tensors may hold any nonzero byte for true; the file gets 0/1. */
static ct_status write_bool(sink *o, const uint8_t *src, size_t n)
{
    uint8_t chunk[4096];
    for (size_t i = 0; i < n; i += sizeof chunk) {
        size_t m = n - i < sizeof chunk ? n - i : sizeof chunk;
        for (size_t k = 0; k < m; k++) chunk[k] = src[i + k] != 0;
        ct_status st = write_all(o, chunk, m);
        if (st) return st;
    }
    return CT_OK;
}

/* Adds item under key (NULL key: to an array), deleting it when it cannot be attached. */
static bool json_add(cJSON *parent, const char *key, cJSON *item)
{
    bool ok = item && (key ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item));
    if (!ok) cJSON_Delete(item);
    return ok;
}

/* An integer written exactly (cJSON would print it through a double). */
static cJSON *json_int(uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(buf);
}

static bool valid_text(const char *s) { return text_invalid_at((const uint8_t *)s, strlen(s)) == strlen(s); }

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted copy of the n string pointers in v; the first repeated string, or NULL. */
static const char *first_duplicate(int n, const char *const *v, bool *nomem)
{
    *nomem = false;
    if (n < 2) return NULL;
    const char **s = malloc((size_t)n * sizeof *s);
    if (!s) return *nomem = true, NULL;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_str_ptr);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0) dup = s[i];
    free(s);
    return dup;
}

static ct_status check_save_args(const char *path, int n, const char *const *names, ct_tensor *const *tensors,
                                 int nmeta, const char *const *keys, const char *const *values)
{
    if (!path || !*path) return ct_error_set(CT_ERR_INVALID, "safetensors_save: path is NULL or empty");
    if (n < 0 || (n > 0 && (!names || !tensors)))
        return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': %d tensors with names %p, tensors %p", path, n,
                            (const void *)names, (const void *)tensors);
    if (nmeta < 0 || (nmeta > 0 && (!keys || !values)))
        return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': %d metadata pairs with keys %p, values %p", path,
                            nmeta, (const void *)keys, (const void *)values);
    char desc[200];
    for (int i = 0; i < n; i++) {
        const char *nm = names[i];
        const ct_tensor *t = tensors[i];
        if (!nm || !*nm) return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': tensor %d has an empty name", path, i);
        if (strcmp(nm, "__metadata__") == 0 || !valid_text(nm))
            return ct_error_set(CT_ERR_INVALID,
                                "safetensors_save '%s': tensor %d: name '%.200s' is reserved or not valid UTF-8 text", path,
                                i, nm);
        if (!t) return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': tensor '%.200s' is NULL", path, nm);
        if (!ct_dtype_is_valid(t->dtype) || t->ndim < 0 || t->ndim > CT_MAX_DIMS)
            return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': tensor '%.200s' has dtype %d, %d dims", path, nm,
                                (int)t->dtype, t->ndim);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0 || (double)t->shape[d] > MAX_EXACT_INT)
                return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': tensor '%.200s' %s: sizes must be in 0..2^53",
                                    path, nm, ct_tensor_describe(t, desc, sizeof desc));
    }
    for (int i = 0; i < nmeta; i++) {
        if (!keys[i] || !values[i] || !valid_text(keys[i]) || !valid_text(values[i]))
            return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': metadata pair %d (key '%.200s') is NULL or not valid UTF-8 text",
                                path, i, keys[i] ? keys[i] : "NULL");
    }
    bool nomem;
    const char *dup = first_duplicate(n, names, &nomem);
    if (!nomem && !dup) dup = first_duplicate(nmeta, keys, &nomem);
    if (nomem) return ct_error_set(CT_ERR_NOMEM, "safetensors_save '%s': out of memory", path);
    if (dup) return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': duplicate name or metadata key '%.200s'", path, dup);
    return CT_OK;
}

/* The padded header: 8-byte length + JSON + spaces up to a multiple of 8. malloc'ed. */
static ct_status build_header(const char *path, int n, const char *const *names, ct_tensor *const *tensors, int nmeta,
                              const char *const *keys, const char *const *values, char **out, size_t *out_len)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && nmeta > 0) {
        cJSON *md = cJSON_CreateObject();
        for (int i = 0; md && i < nmeta; i++) ok &= json_add(md, keys[i], cJSON_CreateString(values[i]));
        ok &= json_add(root, "__metadata__", md);
    }
    uint64_t off = 0;
    for (int i = 0; ok && i < n; i++) {
        const ct_tensor *t = tensors[i];
        uint64_t nb;
        if (!shape_nbytes(t->ndim, t->shape, ct_dtype_size(t->dtype), &nb) || nb > UINT64_MAX - off) {
            cJSON_Delete(root);
            return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': tensor '%.200s' is too large", path, names[i]);
        }
        cJSON *e = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        ok &= json_add(e, "dtype", cJSON_CreateString(ct_dtype_safetensors_name(t->dtype)));
        for (int d = 0; d < t->ndim; d++) ok &= json_add(shape, NULL, json_int((uint64_t)t->shape[d]));
        ok &= json_add(offs, NULL, json_int(off));
        ok &= json_add(offs, NULL, json_int(off + nb));
        /* each add runs even after a failure, so every item is attached or deleted */
        ok &= json_add(e, "shape", shape);
        ok &= json_add(e, "data_offsets", offs);
        ok &= json_add(root, names[i], e);
        off += nb;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return ct_error_set(CT_ERR_NOMEM, "safetensors_save '%s': out of memory building the header", path);
    size_t jlen = strlen(json), hlen = (jlen + 7) / 8 * 8;
    if (hlen > CT_SAFETENSORS_MAX_HEADER) {
        free(json);
        return ct_error_set(CT_ERR_INVALID, "safetensors_save '%s': header of %zu bytes exceeds the %u-byte limit", path,
                            hlen, CT_SAFETENSORS_MAX_HEADER);
    }
    char *buf = malloc(8 + hlen);
    if (!buf) {
        free(json);
        return ct_error_set(CT_ERR_NOMEM, "safetensors_save '%s': out of memory", path);
    }
    for (int i = 0; i < 8; i++) buf[i] = (char)(uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, json, jlen);
    memset(buf + 8 + jlen, ' ', hlen - jlen);
    free(json);
    *out = buf;
    *out_len = 8 + hlen;
    return CT_OK;
}

static ct_status write_tensors(sink *o, const char *tmp, int n, const char *const *names, ct_tensor *const *tensors)
{
    ct_status st = CT_OK;
    for (int i = 0; i < n && !st; i++) {
        ct_frame_push();
        /* a GPU tensor is copied to the host one tensor at a time */
        ct_tensor *c = ct_tensor_contiguous(tensors[i]);
        if (c && c->device.type != CT_DEVICE_CPU) c = ct_tensor_to(c, CT_CPU);
        if (!c) {
            st = ct_error_prefix("safetensors_save '%s': tensor '%.200s': ", tmp, names[i]);
        } else if (ct_tensor_nbytes(c) > 0) {
            if (c->dtype == CT_DTYPE_BOOL) st = write_bool(o, ct_tensor_data(c), ct_tensor_nbytes(c));
            else st = write_all(o, ct_tensor_data(c), ct_tensor_nbytes(c));
        }
        ct_frame_pop();
    }
    return st;
}

/* Makes the rename itself durable. Filesystems that cannot sync a directory say EINVAL. */
ct_status ct_safetensors_save(const char *path, int n, const char *const *names, ct_tensor *const *tensors,
                              int nmeta, const char *const *meta_keys, const char *const *meta_values)
{
    return ct_safetensors_save_hashed(path, n, names, tensors, nmeta, meta_keys, meta_values, NULL, NULL);
}

ct_status ct_safetensors_save_hashed(const char *path, int n, const char *const *names, ct_tensor *const *tensors,
                                     int nmeta, const char *const *meta_keys, const char *const *meta_values,
                                     uint64_t *xxh3, int64_t *bytes)
{
    ct_status st = check_save_args(path, n, names, tensors, nmeta, meta_keys, meta_values);
    if (st) return st;
    char *hdr = NULL;
    size_t hdr_len = 0;
    st = build_header(path, n, names, tensors, nmeta, meta_keys, meta_values, &hdr, &hdr_len);
    if (st) return st;
    cti_atomic_file f;
    if (cti_atomic_open(&f, path, "safetensors_save")) {
        free(hdr);
        return ct_last_status();
    }
    XXH3_state_t *h = xxh3 ? XXH3_createState() : NULL;
    if (h) XXH3_64bits_reset(h);
    else if (xxh3) st = ct_error_set(CT_ERR_NOMEM, "safetensors_save '%s': out of memory", path);
    sink o = {.file = &f, .hash = h};
    if (!st) st = write_all(&o, hdr, hdr_len);
    free(hdr);
    if (!st) st = write_tensors(&o, f.tmp, n, names, tensors);
    if (!st && xxh3) *xxh3 = XXH3_64bits_digest(h);
    if (!st && bytes) *bytes = o.written;
    XXH3_freeState(h);
    return cti_atomic_commit(&f, st, 1);
}
