/* ctrain — the files of a training-state checkpoint: checksums (XXH3-64, libxxhash),
 * the manifest (cJSON), durable writes, directories and automatic naming
 * (accel/checkpoint_internal.h). */
#include "accel/checkpoint_internal.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>
#include <xxhash.h>

#include "core/atomic_file.h"
#include "core/safetensors.h"

#ifndef CTRAIN_VERSION
#define CTRAIN_VERSION "unknown"
#endif

/* ---- checksums --------------------------------------------------------------------- */

/* XXH3-64 of the file at path without touching the error state (safe on any thread):
 * 0, or the errno of the call that failed (*what names it). */
static int hash_quiet(const char *path, uint64_t *xxh3, int64_t *bytes, const char **what)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return *what = "open", errno;
    struct stat sb;
    if (fstat(fd, &sb)) {
        int e = errno;
        close(fd);
        return *what = "stat", e;
    }
    *bytes = sb.st_size;
    if (sb.st_size == 0) {
        close(fd);
        *xxh3 = XXH3_64bits(NULL, 0);
        return 0;
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return *what = "map", e;
    /* sequential: let the kernel read ahead */
    madvise(p, (size_t)sb.st_size, MADV_SEQUENTIAL);
    *xxh3 = XXH3_64bits(p, (size_t)sb.st_size);
    munmap(p, (size_t)sb.st_size);
    return 0;
}

ct_status cti_ckpt_hash_file(const char *path, uint64_t *xxh3, int64_t *bytes)
{
    const char *what = "";
    const int e = hash_quiet(path, xxh3, bytes, &what);
    return e ? ct_error_set(CT_ERR_IO, "cannot %s '%s': %s", what, path, strerror(e)) : CT_OK;
}

void cti_ckpt_note_dtype(cti_ckpt_file *f, ct_dtype dt)
{
    const char *dn = ct_dtype_name(dt);
    char with[80], want[24];
    snprintf(with, sizeof with, ",%s,", f->dtypes);
    snprintf(want, sizeof want, ",%s,", dn);
    const size_t at = strlen(f->dtypes);
    if (!strstr(with, want) && at + strlen(dn) + 2 < sizeof f->dtypes)
        snprintf(f->dtypes + at, sizeof f->dtypes - at, "%s%s", at ? "," : "", dn);
}

ct_status cti_ckpt_save_tensors(const char *dir, const char *name, int n, const char *const *names,
                                ct_tensor *const *ts, cti_ckpt_file *f)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *f = (cti_ckpt_file){.tensors = n};
    snprintf(f->name, sizeof f->name, "%s", name);
    for (int i = 0; i < n; i++) cti_ckpt_note_dtype(f, ts[i]->dtype);
    return ct_safetensors_save_hashed(path, n, names, ts, 0, NULL, NULL, &f->xxh3, &f->bytes);
}

ct_status cti_ckpt_describe_file(const char *dir, const char *name, cti_ckpt_file *f)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    uint64_t h = 0;
    int64_t bytes = 0;
    ct_status st = cti_ckpt_hash_file(path, &h, &bytes);
    return st ? st : cti_ckpt_describe_written(dir, name, h, bytes, f);
}

ct_status cti_ckpt_describe_written(const char *dir, const char *name, uint64_t xxh3, int64_t bytes, cti_ckpt_file *f)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *f = (cti_ckpt_file){.xxh3 = xxh3, .bytes = bytes};
    snprintf(f->name, sizeof f->name, "%s", name);
    ct_status st = CT_OK;
    const size_t n = strlen(name), ext = strlen(".safetensors");
    if (n > ext && !strcmp(name + n - ext, ".safetensors")) {
        ct_safetensors *s = ct_safetensors_open(path);
        if (!s) return ct_last_status();
        f->tensors = ct_safetensors_count(s);
        for (int i = 0; i < f->tensors; i++) {
            ct_dtype dt;
            int nd;
            int64_t sh[CT_MAX_DIMS];
            ct_safetensors_info(s, ct_safetensors_name(s, i), &dt, &nd, sh);
            cti_ckpt_note_dtype(f, dt);
        }
        ct_safetensors_close(s);
    }
    return st;
}

/* ---- durable writes and directories ---------------------------------------------------- */

ct_status cti_ckpt_write_text(const char *dir, const char *name, const char *text)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return ct_error_set(CT_ERR_INVALID, "checkpoint path '%.64s.../%s' is too long", dir, name);
    cti_atomic_file f;
    if (cti_atomic_open(&f, path, "checkpoint")) return ct_last_status();
    return cti_atomic_commit(&f, cti_atomic_write(&f, text, strlen(text)), 1);
}

int cti_ckpt_read_text(const char *path, size_t max, char **text, size_t *len)
{
    *text = NULL, *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return errno ? errno : EIO;
    long n = -1;
    int st = 0;
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || (size_t)n > max || fseek(f, 0, SEEK_SET) ||
        !(*text = malloc((size_t)n + 1)) || fread(*text, 1, (size_t)n, f) != (size_t)n)
        st = -1;
    fclose(f);
    if (st) free(*text), *text = NULL;
    else (*text)[n] = '\0', *len = (size_t)n;
    return st;
}

ct_status cti_ckpt_mkdirs(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return ct_error_set(CT_ERR_INVALID, "checkpoint path '%.64s...' is too long", dir);
    for (char *c = p + 1;; c++) {
        const bool end = *c == '\0';
        if (*c != '/' && !end) continue;
        *c = '\0';
        struct stat sb;
        if (mkdir(p, 0755) && errno != EEXIST)
            return ct_error_set(CT_ERR_IO, "cannot create directory '%s': %s", p, strerror(errno));
        if (stat(p, &sb) || !S_ISDIR(sb.st_mode))
            return ct_error_set(CT_ERR_INVALID, "'%s' exists and is not a directory", p);
        if (end) break;
        *c = '/';
    }
    return CT_OK;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path) && errno != ENOENT ? -1 : 0;
}

ct_status cti_ckpt_remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb)) return errno == ENOENT ? CT_OK : ct_error_set(CT_ERR_IO, "'%s': %s", path, strerror(errno));
    if (nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS))
        return ct_error_set(CT_ERR_IO, "cannot remove '%s': %s", path, strerror(errno));
    return CT_OK;
}

/* ---- the manifest ------------------------------------------------------------------------ */

ct_status cti_ckpt_write_manifest(const char *dir, const cti_ckpt_manifest *m)
{
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateArray();
    int64_t tensors = 0, bytes = 0;
    bool ok = root && files;
    if (ok) {
        cJSON_AddStringToObject(root, "format", CT_CKPT_FORMAT);
        cJSON_AddNumberToObject(root, "format_version", CT_CKPT_FORMAT_VERSION);
        cJSON_AddStringToObject(root, "ctrain_version", CTRAIN_VERSION);
        cJSON_AddNumberToObject(root, "step", (double)m->step);
        cJSON_AddNumberToObject(root, "world_size", m->world_size);
        cJSON_AddNumberToObject(root, "shard_world", m->shard_world);
        cJSON_AddStringToObject(root, "strategy", m->strategy);
        cJSON_AddStringToObject(root, "mixed_precision", m->mixed_precision);
        cJSON_AddStringToObject(root, "optimizer", m->optimizer ? m->optimizer : "");
        cJSON_AddStringToObject(root, "model", m->sharded_model ? "sharded" : "full");
        cJSON_AddNumberToObject(root, "tp_degree", m->tp > 0 ? m->tp : 1);
        cJSON_AddNumberToObject(root, "dp_degree", m->dp > 0 ? m->dp : 1);
        cJSON_AddNumberToObject(root, "pp_degree", m->pp > 0 ? m->pp : 1);
    }
    for (int i = 0; ok && i < m->nfiles; i++) {
        const cti_ckpt_file *f = &m->files[i];
        cJSON *o = cJSON_CreateObject();
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, f->xxh3);
        ok = o && cJSON_AddStringToObject(o, "name", f->name) && cJSON_AddNumberToObject(o, "bytes", (double)f->bytes) &&
             cJSON_AddStringToObject(o, "xxh3", hex) && cJSON_AddNumberToObject(o, "tensors", (double)f->tensors) &&
             cJSON_AddStringToObject(o, "dtypes", f->dtypes);
        if (o) cJSON_AddItemToArray(files, o);
        tensors += f->tensors, bytes += f->bytes;
    }
    if (ok) {
        cJSON_AddNumberToObject(root, "tensors", (double)tensors);
        cJSON_AddNumberToObject(root, "bytes", (double)bytes);
        cJSON_AddItemToObject(root, "files", files);
        files = NULL;
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(files);
    cJSON_Delete(root);
    if (!text) return ct_error_set(CT_ERR_NOMEM, "checkpoint manifest: out of memory");
    ct_status st = cti_ckpt_write_text(dir, CT_CKPT_MANIFEST, text);
    free(text);
    return st;
}

static ct_status bad_manifest(const char *path, const char *what)
{
    return ct_error_set(CT_ERR_FORMAT, "%s: %s", path, what);
}

static bool get_int(const cJSON *o, const char *key, int64_t lo, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < (double)lo || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return false;
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool get_str(const cJSON *o, const char *key, char *out, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) return false;
    snprintf(out, cap, "%s", v->valuestring);
    return true;
}

/* A file name the manifest may list: a plain name inside the directory. */
static bool plain_name(const char *s)
{
    if (!*s || !strcmp(s, ".") || !strcmp(s, "..")) return false;
    for (; *s; s++)
        if (*s == '/' || *s == '\\') return false;
    return true;
}

static ct_status parse_manifest(const char *path, const cJSON *root, ct_checkpoint_info *info, cti_ckpt_file **out,
                                int *nout)
{
    char fmt[64];
    int64_t v, w, s, step;
    if (!cJSON_IsObject(root)) return bad_manifest(path, "not a JSON object");
    if (!get_str(root, "format", fmt, sizeof fmt) || strcmp(fmt, CT_CKPT_FORMAT))
        return bad_manifest(path, "\"format\" is not \"" CT_CKPT_FORMAT "\": not a ctrain checkpoint manifest");
    if (!get_int(root, "format_version", 1, &v)) return bad_manifest(path, "\"format_version\" is not an integer >= 1");
    if (v > CT_CKPT_FORMAT_VERSION)
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "%s: checkpoint format version %" PRId64 " was written by a newer ctrain; this ctrain (%s) "
                            "reads format %d and older: upgrade ctrain to load it",
                            path, v, CTRAIN_VERSION, CT_CKPT_FORMAT_VERSION);
    *info = (ct_checkpoint_info){.format_version = (int)v};
    if (!get_int(root, "step", 0, &step) || !get_int(root, "world_size", 1, &w) || !get_int(root, "shard_world", 1, &s) ||
        w > 1 << 20 || s > w)
        return bad_manifest(path, "\"step\", \"world_size\" or \"shard_world\" is missing or out of range");
    info->step = step, info->world_size = (int)w, info->shard_world = (int)s;
    /* the Megatron-LM layout; manifests written before it existed mean tp 1 */
    int64_t tp = 1, dp = w, pp = 1;
    if ((cJSON_GetObjectItemCaseSensitive(root, "tp_degree") && !get_int(root, "tp_degree", 1, &tp)) ||
        (cJSON_GetObjectItemCaseSensitive(root, "dp_degree") && !get_int(root, "dp_degree", 1, &dp)) ||
        (cJSON_GetObjectItemCaseSensitive(root, "pp_degree") && !get_int(root, "pp_degree", 1, &pp)) ||
        tp * dp * pp > w)
        return bad_manifest(path, "\"tp_degree\", \"dp_degree\" or \"pp_degree\" is not an integer >= 1, or their "
                                  "product exceeds \"world_size\"");
    info->tp_degree = (int)tp, info->dp_degree = (int)dp, info->pp_degree = (int)pp;
    if (!get_str(root, "ctrain_version", info->ctrain_version, sizeof info->ctrain_version) ||
        !get_str(root, "strategy", info->strategy, sizeof info->strategy) ||
        !get_str(root, "mixed_precision", info->mixed_precision, sizeof info->mixed_precision) ||
        !get_str(root, "optimizer", info->optimizer, sizeof info->optimizer))
        return bad_manifest(path, "\"ctrain_version\", \"strategy\", \"mixed_precision\" or \"optimizer\" is missing");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const int n = cJSON_GetArraySize(files);
    if (!cJSON_IsArray(files) || n < 1) return bad_manifest(path, "\"files\" is not a list of files");
    cti_ckpt_file *list = calloc((size_t)n, sizeof *list);
    if (!list) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    int i = 0;
    for (const cJSON *f = files->child; f; f = f->next, i++) {
        char hex[32], *end = NULL;
        cti_ckpt_file *x = &list[i];
        if (!get_str(f, "name", x->name, sizeof x->name) || !plain_name(x->name) || !get_int(f, "bytes", 0, &x->bytes) ||
            !get_int(f, "tensors", 0, &x->tensors) || !get_str(f, "xxh3", hex, sizeof hex) || strlen(hex) != 16 ||
            !get_str(f, "dtypes", x->dtypes, sizeof x->dtypes)) {
            free(list);
            return ct_error_set(CT_ERR_FORMAT,
                                "%s: file entry %d is not {name, bytes, xxh3 (16 hex digits), tensors, dtypes}", path,
                                i);
        }
        x->xxh3 = strtoull(hex, &end, 16);
        if (*end) {
            free(list);
            return ct_error_set(CT_ERR_FORMAT, "%s: file '%s': xxh3 '%s' is not hexadecimal", path, x->name, hex);
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(list[j].name, x->name)) {
                free(list);
                return ct_error_set(CT_ERR_FORMAT, "%s: file '%s' is listed twice", path, x->name);
            }
        info->tensors += x->tensors, info->bytes += x->bytes;
    }
    info->nfiles = n;
    *out = list, *nout = n;
    return CT_OK;
}

/* Files k = which, which + step, ... of a verification's share: hashed, results in the
 * arrays (no error state touched: this runs on a helper thread too). */
typedef struct hash_job {
    const char *dir;
    const cti_ckpt_file *files;
    int first, stride, mine, which;
    uint64_t *hash;
    int64_t *size;
    int *err;
    const char **what;
    int step;
} hash_job;

static void hash_some(void *arg)
{
    const hash_job *j = arg;
    const int step = j->step ? j->step : 2;
    for (int k = j->which; k < j->mine; k += step) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", j->dir, j->files[j->first + k * j->stride].name);
        j->err[k] = hash_quiet(path, &j->hash[k], &j->size[k], &j->what[k]);
    }
}

ct_status cti_ckpt_verify_files(const char *dir, const cti_ckpt_file *files, int n, int first, int stride, FILE *report)
{
    const int mine = n > first ? (n - first + stride - 1) / stride : 0;
    uint64_t *hash = calloc((size_t)mine + 1, sizeof *hash);
    int64_t *size = calloc((size_t)mine + 1, sizeof *size);
    int *err = calloc((size_t)mine + 1, sizeof *err);
    const char **what = calloc((size_t)mine + 1, sizeof *what);
    if (!hash || !size || !err || !what) {
        free(hash), free(size), free(err), free(what);
        return ct_error_set(CT_ERR_NOMEM, "out of memory");
    }
    /* the files' checksums side by side, one stream each (reading is what a load waits
     * for): a second thread of libuv's takes the odd ones. Not OpenMP: a program that
     * forks after a parallel region of libgomp's deadlocks in the child. */
    hash_job jobs[2];
    for (int t = 0; t < 2; t++)
        jobs[t] = (hash_job){dir, files, first, stride, mine, t, hash, size, err, what, 2};
    uv_thread_t helper;
    const bool two = mine > 1 && !uv_thread_create(&helper, hash_some, &jobs[1]);
    if (!two) jobs[0].step = 1, jobs[0].which = 0;
    hash_some(&jobs[0]);
    if (two) uv_thread_join(&helper);
    ct_status st = CT_OK;
    for (int k = 0; k < mine && !st; k++) {
        const cti_ckpt_file *f = &files[first + k * stride];
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, f->name);
        if (err[k] == ENOENT)
            st = ct_error_set(CT_ERR_FORMAT, "checkpoint '%s': file '%s' is missing (%s)", dir, f->name,
                              strerror(err[k]));
        else if (err[k])
            st = ct_error_set(CT_ERR_IO, "checkpoint '%s': cannot %s '%s': %s", dir, what[k], f->name, strerror(err[k]));
        else if (size[k] != f->bytes)
            st = ct_error_set(CT_ERR_FORMAT,
                              "checkpoint '%s': file '%s' is %" PRId64 " bytes, the manifest says %" PRId64
                              " (truncated or replaced)",
                              dir, f->name, size[k], f->bytes);
        else if (hash[k] != f->xxh3)
            st = ct_error_set(CT_ERR_FORMAT,
                              "checkpoint '%s': file '%s' is corrupted: its XXH3-64 is %016" PRIx64
                              ", the manifest says %016" PRIx64,
                              dir, f->name, hash[k], f->xxh3);
        const size_t nl = strlen(f->name), ext = strlen(".safetensors");
        if (!st && nl > ext && !strcmp(f->name + nl - ext, ".safetensors")) {
            ct_safetensors *sf = ct_safetensors_open(path);
            if (!sf) {
                st = ct_error_prefix("checkpoint '%s': ", dir);
            } else {
                const int64_t count = ct_safetensors_count(sf);
                ct_safetensors_close(sf);
                if (count != f->tensors)
                    st = ct_error_set(CT_ERR_FORMAT,
                                      "checkpoint '%s': file '%s' holds %" PRId64 " tensors, the manifest says %" PRId64,
                                      dir, f->name, count, f->tensors);
            }
        }
        if (!st && report)
            fprintf(report, "  %-44s %12" PRId64 " bytes  %6" PRId64 " tensors %-9s xxh3 %016" PRIx64 "  ok\n", f->name,
                    f->bytes, f->tensors, f->dtypes, f->xxh3);
    }
    free(hash), free(size), free(err), free(what);
    return st;
}

ct_status cti_ckpt_read_manifest(const char *dir, bool verify, ct_checkpoint_info *info, cti_ckpt_file **files,
                                 int *n, FILE *report)
{
    char path[4096];
    if (!dir) return ct_error_set(CT_ERR_INVALID, "checkpoint directory is NULL");
    snprintf(path, sizeof path, "%s/%s", dir, CT_CKPT_MANIFEST);
    struct stat sb;
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode))
        return ct_error_set(CT_ERR_INVALID, "checkpoint '%s' is not a directory", dir);
    char *text = NULL;
    size_t len = 0;
    const int e = cti_ckpt_read_text(path, 64u << 20, &text, &len);
    if (e > 0)
        return ct_error_set(CT_ERR_FORMAT,
                            "checkpoint '%s' has no %s (%s): it is not a checkpoint, or its save did not complete",
                            dir, CT_CKPT_MANIFEST, strerror(e));
    ct_status st = e ? ct_error_set(CT_ERR_IO, "cannot read '%s'", path) : CT_OK;
    cJSON *root = st ? NULL : cJSON_ParseWithLength(text, len);
    if (!st && !root) st = bad_manifest(path, "not valid JSON");
    cti_ckpt_file *list = NULL;
    int count = 0;
    if (!st) st = parse_manifest(path, root, info, &list, &count);
    cJSON_Delete(root);
    free(text);
    if (!st && report)
        fprintf(report,
                "checkpoint %s\n  format %d (ctrain %s), step %" PRId64 ", world size %d, %d shard file(s) per part\n"
                "  strategy %s, mixed precision %s, optimizer %s\n  %d files, %" PRId64 " tensors, %" PRId64 " bytes\n",
                dir, info->format_version, info->ctrain_version, info->step, info->world_size, info->shard_world,
                info->strategy, info->mixed_precision, info->optimizer[0] ? info->optimizer : "(none)", info->nfiles,
                info->tensors, info->bytes);
    if (!st && verify) st = cti_ckpt_verify_files(dir, list, count, 0, 1, report);
    if (st || !files) free(list);
    else *files = list, *n = count;
    return st;
}

ct_status ct_checkpoint_inspect(const char *dir, bool verify, ct_checkpoint_info *info, FILE *report)
{
    ct_checkpoint_info local;
    ct_status st = cti_ckpt_read_manifest(dir, verify, info ? info : &local, NULL, NULL, report);
    return st ? ct_error_prefix("checkpoint_inspect: ") : CT_OK;
}

/* ---- automatic naming ---------------------------------------------------------------------- */

char *cti_ckpt_auto_root(const char *project_dir)
{
    char *p = NULL;
    if (asprintf(&p, "%s/checkpoints", project_dir && *project_dir ? project_dir : ".") < 0) {
        ct_error_set(CT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    return p;
}

int64_t cti_ckpt_auto_index(const char *name)
{
    if (strncmp(name, "checkpoint_", 11) || !name[11]) return -1;
    int64_t v = 0;
    for (const char *c = name + 11; *c; c++) {
        if (*c < '0' || *c > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = 10 * v + (*c - '0');
    }
    return v;
}

/* The checkpoint_<i> entries under root, sorted by i, into *idx (malloc'd). */
static int list_auto(const char *root, int64_t **idx)
{
    *idx = NULL;
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const int64_t i = cti_ckpt_auto_index(de->d_name);
        if (i < 0) continue;
        if (n == cap) {
            int64_t *p = realloc(*idx, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *p);
            if (!p) break;
            *idx = p;
        }
        (*idx)[n++] = i;
    }
    closedir(d);
    for (int a = 1; a < n; a++) /* insertion sort: few entries */
        for (int b = a; b > 0 && (*idx)[b - 1] > (*idx)[b]; b--) {
            const int64_t t = (*idx)[b];
            (*idx)[b] = (*idx)[b - 1], (*idx)[b - 1] = t;
        }
    return n;
}

/* Complete: its manifest reads and every listed file has its recorded size (the
 * checksums are for load and `ctrain checkpoint` to verify). */
static bool auto_complete(const char *root, int64_t i)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoint_%" PRId64, root, i);
    ct_checkpoint_info info;
    cti_ckpt_file *files = NULL;
    int n = 0;
    ct_status saved = ct_last_status();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    bool ok = !cti_ckpt_read_manifest(dir, false, &info, &files, &n, NULL);
    for (int k = 0; ok && k < n; k++) {
        char path[4200];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, files[k].name);
        ok = !stat(path, &sb) && sb.st_size == files[k].bytes;
    }
    free(files);
    /* probing is not failing: the caller's error stays as it was */
    if (saved) ct_error_set(saved, "%s", msg);
    else ct_error_clear();
    return ok;
}

int64_t cti_ckpt_auto_highest(const char *root)
{
    int64_t *idx;
    const int n = list_auto(root, &idx);
    const int64_t hi = n ? idx[n - 1] : -1;
    free(idx);
    return hi;
}

int ct_checkpoint_count(const char *project_dir)
{
    char *root = cti_ckpt_auto_root(project_dir);
    if (!root) return -1;
    int64_t *idx;
    const int n = list_auto(root, &idx);
    free(idx);
    free(root);
    return n;
}

ct_status ct_checkpoint_latest(const char *project_dir, char *out, size_t cap)
{
    if (!out || !cap) return ct_error_set(CT_ERR_INVALID, "checkpoint_latest: out is NULL");
    char *root = cti_ckpt_auto_root(project_dir);
    if (!root) return ct_last_status();
    int64_t *idx;
    const int n = list_auto(root, &idx);
    ct_status st = CT_ERR_INVALID;
    for (int k = n - 1; k >= 0 && st; k--)
        if (auto_complete(root, idx[k])) {
            snprintf(out, cap, "%s/checkpoint_%" PRId64, root, idx[k]);
            st = CT_OK;
        }
    if (st)
        ct_error_set(CT_ERR_INVALID, "checkpoint_latest: no complete checkpoint under '%s' (%d checkpoint_<i> "
                     "director%s, none with a manifest whose files are all there)", root, n, n == 1 ? "y" : "ies");
    free(idx);
    free(root);
    return st;
}

ct_status cti_ckpt_apply_total_limit(const char *root, int limit)
{
    ct_status st = CT_OK;
    /* interrupted saves first: "<name>.tmp-<id>" directories (no save runs beside ours) */
    DIR *d = opendir(root);
    struct dirent *de;
    while (d && !st && (de = readdir(d)))
        if (!strncmp(de->d_name, "checkpoint_", 11) && strstr(de->d_name, ".tmp-")) {
            char p[4200];
            snprintf(p, sizeof p, "%s/%s", root, de->d_name);
            st = cti_ckpt_remove_tree(p);
        }
    if (d) closedir(d);
    if (st || limit <= 0) return st;
    int64_t *idx;
    const int n = list_auto(root, &idx);
    int kept = 0;
    /* newest first: keep `limit` complete ones, remove the complete ones older than them;
     * an incomplete directory is left alone (it is not a checkpoint, and not ours to judge) */
    for (int k = n - 1; k >= 0 && !st; k--) {
        if (!auto_complete(root, idx[k])) continue;
        if (kept < limit) {
            kept++;
            continue;
        }
        char p[4200];
        snprintf(p, sizeof p, "%s/checkpoint_%" PRId64, root, idx[k]);
        st = cti_ckpt_remove_tree(p);
    }
    free(idx);
    return st ? st : cti_dir_sync(root);
}

/* ---- crash tests ------------------------------------------------------------------------------ */

void cti_ckpt_fault_point(void)
{
    static int calls;
    const char *k = getenv("CTRAIN_TEST_CHECKPOINT_KILL_AT");
    if (!k || !*k) return;
    if (++calls == atoi(k)) raise(SIGKILL);
}
