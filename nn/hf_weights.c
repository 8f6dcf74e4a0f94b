/* Hugging Face model directories' weights, single-file or sharded (nn/hf_weights.h). */
#include "nn/hf_weights.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/atomic_file.h"
#include "core/frame.h"
#include "precision/autocast.h"

#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"

struct ct_hf_weights {
    char *label; /* the directory or file opened */
    int nshards;
    ct_safetensors **shards;
    int n;
    const char **names; /* borrowed from the shards */
    int *shard_of;
};

/* ---- small file helpers ---------------------------------------------------------- */

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", dir, name);
    return s;
}

static bool is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

char *ct_hf_text_read(const char *path)
{
    if (!path) return ct_error_set(CT_ERR_INVALID, "hf_text_read: path is NULL"), NULL;
    return cti_file_read_text(path, (size_t)64 << 20, "reading a JSON file", NULL);
}

ct_status ct_hf_text_write(const char *path, const char *text)
{
    if (!path || !text) return ct_error_set(CT_ERR_INVALID, "hf_text_write: NULL path or text");
    cti_atomic_file f;
    if (cti_atomic_open(&f, path, "hf_text_write")) return ct_last_status();
    ct_status st = cti_atomic_write(&f, text, strlen(text));
    if (!st) st = cti_atomic_write(&f, "\n", 1);
    return cti_atomic_commit(&f, st, 0);
}

ct_status ct_hf_dir_make(const char *dir)
{
    if (!dir) return ct_error_set(CT_ERR_INVALID, "hf_dir_make: directory is NULL");
    struct stat sb;
    if (mkdir(dir, 0777) == 0 || (errno == EEXIST && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode))) return CT_OK;
    return ct_error_set(CT_ERR_IO, "cannot create directory %s: %s", dir, strerror(errno));
}

/* ---- reading --------------------------------------------------------------------- */

void ct_hf_weights_close(ct_hf_weights *w)
{
    if (!w) return;
    for (int i = 0; i < w->nshards; i++) ct_safetensors_close(w->shards[i]);
    free(w->shards);
    free(w->names);
    free(w->shard_of);
    free(w->label);
    free(w);
}

/* Lists every tensor of every shard, shard by shard. */
static ct_status index_names(ct_hf_weights *w)
{
    int total = 0;
    for (int s = 0; s < w->nshards; s++) total += ct_safetensors_count(w->shards[s]);
    w->names = calloc((size_t)(total ? total : 1), sizeof *w->names);
    w->shard_of = calloc((size_t)(total ? total : 1), sizeof *w->shard_of);
    if (!w->names || !w->shard_of) return ct_error_set(CT_ERR_NOMEM, "hf_weights_open %s: out of memory", w->label);
    for (int s = 0; s < w->nshards; s++)
        for (int j = 0; j < ct_safetensors_count(w->shards[s]); j++) {
            w->names[w->n] = ct_safetensors_name(w->shards[s], j);
            w->shard_of[w->n++] = s;
        }
    return CT_OK;
}

static ct_status open_single(ct_hf_weights *w, const char *file)
{
    w->shards = calloc(1, sizeof *w->shards);
    if (!w->shards) return ct_error_set(CT_ERR_NOMEM, "hf_weights_open %s: out of memory", file);
    if (!(w->shards[0] = ct_safetensors_open(file))) return ct_last_status();
    w->nshards = 1;
    return index_names(w);
}

/* A shard's name must stay inside the directory. */
static bool plain_file_name(const char *s)
{
    return *s && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && !strchr(s, '\\');
}

static ct_status open_index(ct_hf_weights *w, const char *dir, const char *index)
{
    char *text = ct_hf_text_read(index);
    if (!text) return ct_last_status();
    cJSON *j = cJSON_Parse(text);
    ct_status st = CT_OK;
    const char **files = NULL; /* distinct shard names, borrowed from j */
    int nfiles = 0;
    const cJSON *map = j ? cJSON_GetObjectItemCaseSensitive(j, "weight_map") : NULL;
    if (!j) {
        const char *e = cJSON_GetErrorPtr();
        st = ct_error_set(CT_ERR_FORMAT, "index %s: not valid JSON (near '%.24s')", index, e ? e : "");
    } else if (!cJSON_IsObject(j)) {
        st = ct_error_set(CT_ERR_FORMAT, "index %s: not a JSON object", index);
    } else if (!cJSON_IsObject(map)) {
        st = ct_error_set(CT_ERR_FORMAT, "index %s: no \"weight_map\" object (tensor name -> shard file)", index);
    }
    int nmap = st ? 0 : cJSON_GetArraySize(map);
    if (!st && nmap == 0) st = ct_error_set(CT_ERR_FORMAT, "index %s: \"weight_map\" is empty", index);
    if (!st && !(files = calloc((size_t)nmap, sizeof *files)))
        st = ct_error_set(CT_ERR_NOMEM, "index %s: out of memory", index);
    /* every entry a tensor name -> a plain shard file name, each name once */
    for (const cJSON *e = st ? NULL : map->child; e && !st; e = e->next) {
        if (!cJSON_IsString(e) || !plain_file_name(e->valuestring)) {
            st = ct_error_set(CT_ERR_FORMAT, "index %s: weight_map[\"%s\"] must be the file name of a shard in the "
                              "directory (a string without '/')", index, e->string);
            break;
        }
        for (const cJSON *p = map->child; p != e; p = p->next)
            if (!strcmp(p->string, e->string)) {
                st = ct_error_set(CT_ERR_FORMAT, "index %s: tensor %s is mapped more than once", index, e->string);
                break;
            }
        int f = 0;
        while (f < nfiles && strcmp(files[f], e->valuestring)) f++;
        if (f == nfiles) files[nfiles++] = e->valuestring;
    }
    if (!st && !(w->shards = calloc((size_t)nfiles, sizeof *w->shards)))
        st = ct_error_set(CT_ERR_NOMEM, "index %s: out of memory", index);
    for (int f = 0; f < nfiles && !st; f++) {
        char *path = join(dir, files[f]);
        if (!path) st = ct_error_set(CT_ERR_NOMEM, "index %s: out of memory", index);
        else if (!is_file(path))
            st = ct_error_set(CT_ERR_IO, "index %s: shard %s is missing (%s: %s)", index, files[f], path,
                              strerror(errno ? errno : ENOENT));
        else if (!(w->shards[f] = ct_safetensors_open(path)))
            st = ct_error_prefix("index %s: shard %s: ", index, files[f]), ct_last_status();
        else w->nshards = f + 1;
        free(path);
    }
    /* both directions: mapped names are in their shard, a shard's tensors are mapped to it */
    for (const cJSON *e = st ? NULL : map->child; e && !st; e = e->next) {
        int f = 0;
        while (strcmp(files[f], e->valuestring)) f++;
        if (!ct_safetensors_info(w->shards[f], e->string, NULL, NULL, NULL))
            st = ct_error_set(CT_ERR_FORMAT, "index %s: maps tensor %s to shard %s, which does not hold it", index,
                              e->string, e->valuestring);
    }
    for (int f = 0; f < nfiles && !st; f++)
        for (int t = 0; t < ct_safetensors_count(w->shards[f]) && !st; t++) {
            const char *name = ct_safetensors_name(w->shards[f], t);
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(map, name);
            if (!e || strcmp(e->valuestring, files[f]))
                st = ct_error_set(CT_ERR_FORMAT, "index %s: shard %s holds tensor %s, which the weight_map %s", index,
                                  files[f], name, e ? "maps to another shard" : "does not list");
        }
    if (!st) st = index_names(w);
    free(files);
    cJSON_Delete(j);
    free(text);
    return st;
}

ct_hf_weights *ct_hf_weights_open(const char *path)
{
    if (!path) return ct_error_set(CT_ERR_INVALID, "hf_weights_open: path is NULL"), NULL;
    ct_hf_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->label = strdup(path))) {
        free(w);
        return ct_error_set(CT_ERR_NOMEM, "hf_weights_open %s: out of memory", path), NULL;
    }
    struct stat sb;
    ct_status st;
    if (stat(path, &sb) || !S_ISDIR(sb.st_mode)) { /* the file reader says what is wrong with a file */
        st = open_single(w, path);
    } else {
        char *single = join(path, SINGLE_NAME), *index = join(path, INDEX_NAME);
        if (!single || !index) st = ct_error_set(CT_ERR_NOMEM, "hf_weights_open %s: out of memory", path);
        else if (is_file(single)) st = open_single(w, single);
        else if (is_file(index)) st = open_index(w, path, index);
        else st = ct_error_set(CT_ERR_IO, "model directory %s holds neither %s nor %s", path, SINGLE_NAME, INDEX_NAME);
        free(single);
        free(index);
    }
    if (st) {
        ct_hf_weights_close(w);
        return NULL;
    }
    return w;
}

int ct_hf_weights_count(const ct_hf_weights *w) { return w ? w->n : 0; }
int ct_hf_weights_shard_count(const ct_hf_weights *w) { return w ? w->nshards : 0; }

const char *ct_hf_weights_name(const ct_hf_weights *w, int i)
{
    if (!w || i < 0 || i >= w->n) return ct_error_set(CT_ERR_INVALID, "hf_weights_name: index %d out of range", i), NULL;
    return w->names[i];
}

int ct_hf_weights_find(const ct_hf_weights *w, const char *name)
{
    for (int i = 0; w && name && i < w->n; i++)
        if (!strcmp(w->names[i], name)) return i;
    return -1;
}

ct_safetensors *ct_hf_weights_shard(const ct_hf_weights *w, int i)
{
    return w && i >= 0 && i < w->n ? w->shards[w->shard_of[i]] : NULL;
}

ct_tensor *ct_hf_weights_get(ct_hf_weights *w, const char *name)
{
    int i = ct_hf_weights_find(w, name);
    if (i < 0) return ct_error_set(CT_ERR_INVALID, "model weights %s: no tensor %s", w ? w->label : "?", name), NULL;
    return ct_safetensors_get(w->shards[w->shard_of[i]], name);
}

/* ---- loading into a module ------------------------------------------------------ */

static ct_status push_name(char ***v, int *n, const char *s)
{
    char **nv = realloc(*v, (size_t)(*n + 1) * sizeof *nv);
    if (!nv) return ct_error_set(CT_ERR_NOMEM, "hf_weights_load: out of memory");
    *v = nv;
    if (!(nv[*n] = strdup(s))) return ct_error_set(CT_ERR_NOMEM, "hf_weights_load: out of memory");
    (*n)++;
    return CT_OK;
}

/* "a, b, c" (at most the first 8) for error messages */
static void join_names(char *buf, size_t cap, char **names, int n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && i < 8 && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", names[i]);
    if (n > 8 && k < cap) snprintf(buf + k, cap - k, ", ... (%d in all)", n);
}

ct_status ct_hf_weights_load(ct_module *m, const char *path, bool strict, ct_load_report *report, ct_load_key_fn map,
                             void *ctx)
{
    if (!m || !path) return ct_error_set(CT_ERR_INVALID, "hf_weights_load: module or path is NULL");
    ct_hf_weights *w = ct_hf_weights_open(path);
    if (!w) return ct_last_status();
    ct_load_report r = {0};
    ct_param_list l;
    ct_status st = ct_module_named_tensors(m, true, &l);
    if (st) {
        ct_hf_weights_close(w);
        return st;
    }
    int nfile = w->n;
    bool *used = calloc((size_t)(nfile ? nfile : 1), sizeof *used);
    char **keys = calloc((size_t)(nfile ? nfile : 1), sizeof *keys);
    int *src_of = calloc((size_t)(l.n ? l.n : 1), sizeof *src_of);
    if (!used || !keys || !src_of) st = ct_error_set(CT_ERR_NOMEM, "hf_weights_load: out of memory");
    /* the module-side key of each file tensor; NULL = ignored by the map */
    for (int j = 0; j < nfile && !st; j++) {
        char buf[512];
        const char *k = map ? map(w->names[j], buf, sizeof buf, ctx) : w->names[j];
        if (!k) used[j] = true;
        else if (!(keys[j] = strdup(k))) st = ct_error_set(CT_ERR_NOMEM, "hf_weights_load: out of memory");
    }
    /* match names and shapes without touching data */
    for (int i = 0; i < l.n && !st; i++) {
        int j = -1;
        for (int k = 0; k < nfile && j < 0; k++)
            if (keys[k] && !strcmp(keys[k], l.names[i])) j = k;
        src_of[i] = j;
        if (j < 0) {
            st = push_name(&r.missing, &r.nmissing, l.names[i]);
            continue;
        }
        used[j] = true;
        ct_dtype dt;
        int nd;
        int64_t sh[CT_MAX_DIMS];
        ct_safetensors_info(w->shards[w->shard_of[j]], w->names[j], &dt, &nd, sh);
        ct_tensor *t = l.tensors[i];
        bool same = nd == t->ndim;
        for (int d = 0; same && d < nd; d++) same = sh[d] == t->shape[d];
        if (!same) {
            char fs[160], ms[160], msg[512];
            snprintf(msg, sizeof msg, "%s: file %s%s, module %s%s", l.names[i], ct_dtype_name(dt),
                     ct_shape_str(nd, sh, fs, sizeof fs), ct_dtype_name(t->dtype),
                     ct_shape_str(t->ndim, t->shape, ms, sizeof ms));
            st = push_name(&r.mismatched, &r.nmismatched, msg);
            src_of[i] = -1;
        }
    }
    for (int j = 0; j < nfile && !st; j++)
        if (!used[j]) st = push_name(&r.unexpected, &r.nunexpected, w->names[j]);
    if (!st && strict && (r.nmissing || r.nunexpected || r.nmismatched)) {
        char a[600], b[600], c[900];
        join_names(a, sizeof a, r.missing, r.nmissing);
        join_names(b, sizeof b, r.unexpected, r.nunexpected);
        join_names(c, sizeof c, r.mismatched, r.nmismatched);
        st = ct_error_set(CT_ERR_FORMAT,
                          "module_load %s: strict load of %s refused, nothing was loaded; missing keys (%d): %s; "
                          "unexpected keys (%d): %s; shape mismatches (%d): %s",
                          path, m->type, r.nmissing, a, r.nunexpected, b, r.nmismatched, c);
    }
    for (int i = 0; i < l.n && !st; i++) {
        if (src_of[i] < 0) continue;
        int j = src_of[i];
        ct_frame_push();
        ct_tensor *src = ct_safetensors_get(w->shards[w->shard_of[j]], w->names[j]);
        st = src ? ct_tensor_copy_(l.tensors[i], src) : ct_last_status();
        ct_frame_pop();
        if (st) ct_error_prefix("module_load %s: tensor %s: ", path, w->names[j]);
    }
    for (int j = 0; keys && j < nfile; j++) free(keys[j]);
    free(keys);
    free(src_of);
    free(used);
    ct_hf_weights_close(w);
    ct_param_list_free(&l);
    ct_autocast_weights_changed(); /* tensors were written in place: autocast copies are stale */
    if (report && !st) *report = r;
    else ct_load_report_free(&r);
    return st;
}

/* ---- writing --------------------------------------------------------------------- */

static int cmp_names(const void *a, const void *b, void *names)
{
    const char *const *n = names;
    return strcmp(n[*(const int *)a], n[*(const int *)b]);
}

/* Removes weight files of dir that the save just made stale: model.safetensors or the
 * index when the other layout was written, shards model-XXXXX-of-YYYYY not of this save. */
static ct_status remove_stale(const char *dir, int nshards)
{
    ct_status st = CT_OK;
    const char *other = nshards > 1 ? SINGLE_NAME : INDEX_NAME;
    char *p = join(dir, other);
    if (!p) return ct_error_set(CT_ERR_NOMEM, "hf_weights_save %s: out of memory", dir);
    if (remove(p) && errno != ENOENT) st = ct_error_set(CT_ERR_IO, "cannot remove stale %s: %s", p, strerror(errno));
    free(p);
    DIR *d = opendir(dir);
    if (!d) return st ? st : ct_error_set(CT_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    for (struct dirent *e; !st && (e = readdir(d));) {
        int a = 0, b = 0, len = 0;
        if (sscanf(e->d_name, "model-%5d-of-%5d.safetensors%n", &a, &b, &len) != 2 || len != 32 ||
            strlen(e->d_name) != 32)
            continue;
        if (nshards > 1 && b == nshards && a >= 1 && a <= nshards) continue;
        if (!(p = join(dir, e->d_name))) st = ct_error_set(CT_ERR_NOMEM, "hf_weights_save %s: out of memory", dir);
        else if (remove(p) && errno != ENOENT)
            st = ct_error_set(CT_ERR_IO, "cannot remove stale shard %s: %s", p, strerror(errno));
        free(p);
    }
    closedir(d);
    return st;
}

static char *index_json(int n, const char *const *names, const int *shard, int nshards, int64_t total)
{
    int *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    cJSON *j = cJSON_CreateObject(), *meta = j ? cJSON_AddObjectToObject(j, "metadata") : NULL;
    cJSON *map = j ? cJSON_AddObjectToObject(j, "weight_map") : NULL;
    char *s = NULL;
    if (order && meta && map && cJSON_AddNumberToObject(meta, "total_size", (double)total)) {
        for (int i = 0; i < n; i++) order[i] = i;
        qsort_r(order, (size_t)n, sizeof *order, cmp_names, (void *)names); /* HF writes the map sorted */
        bool ok = true;
        for (int k = 0; k < n && ok; k++) {
            char file[64];
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", shard[order[k]] + 1, nshards);
            ok = cJSON_AddStringToObject(map, names[order[k]], file) != NULL;
        }
        if (ok) s = cJSON_Print(j);
    }
    cJSON_Delete(j);
    free(order);
    return s;
}

ct_status ct_hf_weights_save(const char *dir, int n, const char *const *names, ct_tensor *const *tensors,
                             int64_t max_shard_bytes)
{
    if (!dir || n < 0 || (n && (!names || !tensors)))
        return ct_error_set(CT_ERR_INVALID, "hf_weights_save: NULL directory, names or tensors");
    if (max_shard_bytes <= 0) max_shard_bytes = CT_HF_MAX_SHARD_DEFAULT;
    int *shard = malloc((size_t)(n ? n : 1) * sizeof *shard);
    const char **snames = malloc((size_t)(n ? n : 1) * sizeof *snames);
    ct_tensor **sts = malloc((size_t)(n ? n : 1) * sizeof *sts);
    char *path = malloc(strlen(dir) + 48);
    ct_status st = shard && snames && sts && path ? CT_OK : ct_error_set(CT_ERR_NOMEM, "hf_weights_save: out of memory");
    /* greedy, in order, as transformers' shard_checkpoint */
    int nshards = 1;
    int64_t fill = 0, total = 0;
    for (int i = 0; i < n && !st; i++) {
        if (!tensors[i] || !names[i]) {
            st = ct_error_set(CT_ERR_INVALID, "hf_weights_save %s: tensor %d or its name is NULL", dir, i);
            break;
        }
        int64_t b = (int64_t)ct_tensor_nbytes(tensors[i]);
        if (fill > 0 && fill + b > max_shard_bytes) nshards++, fill = 0;
        shard[i] = nshards - 1;
        fill += b, total += b;
    }
    static const char *const meta_k[] = {"format"}, *const meta_v[] = {"pt"};
    for (int s = 0; s < nshards && !st; s++) {
        if (nshards == 1) snprintf(path, strlen(dir) + 48, "%s/%s", dir, SINGLE_NAME);
        else snprintf(path, strlen(dir) + 48, "%s/model-%05d-of-%05d.safetensors", dir, s + 1, nshards);
        ct_frame_push(); /* CPU copies of one shard at a time */
        int k = 0;
        for (int i = 0; i < n && !st; i++) {
            if (shard[i] != s) continue;
            snames[k] = names[i];
            sts[k] = tensors[i]->device.type == CT_DEVICE_CPU ? tensors[i] : ct_tensor_to(tensors[i], CT_CPU);
            if (!sts[k++]) st = ct_last_status();
        }
        if (!st) st = ct_safetensors_save(path, k, snames, sts, 1, meta_k, meta_v);
        ct_frame_pop();
    }
    if (!st && nshards > 1) {
        char *json = index_json(n, names, shard, nshards, total);
        snprintf(path, strlen(dir) + 48, "%s/%s", dir, INDEX_NAME);
        st = json ? ct_hf_text_write(path, json) : ct_error_set(CT_ERR_NOMEM, "hf_weights_save: out of memory");
        cJSON_free(json);
    }
    if (!st) st = remove_stale(dir, nshards);
    free(shard);
    free(snames);
    free(sts);
    free(path);
    return st;
}

ct_status ct_hf_weights_save_module(const ct_module *m, const char *dir, int64_t max_shard_bytes)
{
    if (!m) return ct_error_set(CT_ERR_INVALID, "hf_weights_save: module is NULL");
    ct_param_list l;
    ct_status st = ct_module_named_tensors(m, true, &l);
    if (st) return st;
    st = ct_hf_weights_save(dir, l.n, (const char *const *)l.names, l.tensors, max_shard_bytes);
    ct_param_list_free(&l);
    return st;
}
