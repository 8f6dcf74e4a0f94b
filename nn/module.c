#include "nn/module.h"

#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/safetensors.h"
#include "precision/autocast.h"

void *ct_module_alloc(size_t size, const char *type, ct_module_destroy_fn destroy)
{
    ct_module *m = size >= sizeof *m ? calloc(1, size) : NULL;
    if (!m) {
        ct_error_set(CT_ERR_NOMEM, "%s: out of memory", type);
        return NULL;
    }
    ct_module_init(m, type, destroy);
    return m;
}

void ct_module_init(ct_module *m, const char *type, ct_module_destroy_fn destroy)
{
    m->type = type;
    m->destroy = destroy;
    m->training = true;
}

static void entries_free(ct_module_entry *e, int n)
{
    for (int i = 0; i < n; i++) {
        free(e[i].name);
        ct_tensor_release(e[i].tensor);
    }
    free(e);
}

void ct_module_free(ct_module *m)
{
    if (!m) return;
    for (int i = 0; i < m->nchildren; i++) {
        ct_module_free(m->children[i].module);
        free(m->children[i].name);
    }
    free(m->children);
    entries_free(m->params, m->nparams);
    entries_free(m->buffers, m->nbuffers);
    if (m->destroy) m->destroy(m);
    free(m);
}

void ct_module_set_hooks(ct_module *m, const ct_module_hooks *h)
{
    if (m) m->hooks = h ? *h : (ct_module_hooks){0};
}

ct_status ct_module_forward_begin(ct_module *m)
{
    return m && m->hooks.pre ? m->hooks.pre(m, m->hooks.data) : CT_OK;
}

ct_tensor *ct_module_forward_end(ct_module *m, ct_tensor *out)
{
    return m && m->hooks.post ? m->hooks.post(m, out, m->hooks.data) : out;
}

static bool name_taken(const ct_module *m, const char *name)
{
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name)) return true;
    for (int i = 0; i < m->nbuffers; i++)
        if (!strcmp(m->buffers[i].name, name)) return true;
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->children[i].name, name)) return true;
    return false;
}

static ct_status check_name(const char *op, const ct_module *m, const char *name)
{
    if (!m || !name || !name[0] || strchr(name, '.'))
        return ct_error_set(CT_ERR_INVALID, "%s: bad name \"%s\" (non-empty, no dots)", op, name ? name : "(null)");
    if (name_taken(m, name))
        return ct_error_set(CT_ERR_INVALID, "%s: %s already has a member named \"%s\"", op, m->type, name);
    return CT_OK;
}

static ct_status add_entry(const char *op, ct_module *m, ct_module_entry **v, int *n, const char *name,
                           ct_tensor *t)
{
    if (!t) return ct_last_status() ? ct_last_status() : ct_error_set(CT_ERR_INVALID, "%s: tensor is NULL", op);
    ct_status st = check_name(op, m, name);
    if (st) return st;
    ct_module_entry *nv = realloc(*v, (size_t)(*n + 1) * sizeof *nv);
    char *copy = strdup(name);
    if (!nv || !copy) {
        if (nv) *v = nv;
        free(copy);
        return ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
    }
    *v = nv;
    nv[*n] = (ct_module_entry){copy, ct_tensor_retain(t)};
    (*n)++;
    return CT_OK;
}

ct_status ct_module_add_param(ct_module *m, const char *name, ct_tensor *t)
{
    ct_status st = add_entry("module_add_param", m, &m->params, &m->nparams, name, t);
    if (!st && !t->grad_fn) st = ct_tensor_set_requires_grad(t, true);
    return st;
}

ct_status ct_module_add_buffer(ct_module *m, const char *name, ct_tensor *t)
{
    return add_entry("module_add_buffer", m, &m->buffers, &m->nbuffers, name, t);
}

ct_status ct_module_add_child(ct_module *m, const char *name, ct_module *child)
{
    if (!child) return ct_last_status() ? ct_last_status() : ct_error_set(CT_ERR_INVALID, "module_add_child: NULL");
    ct_status st = check_name("module_add_child", m, name);
    if (st) {
        ct_module_free(child);
        return st;
    }
    void *nv = realloc(m->children, (size_t)(m->nchildren + 1) * sizeof *m->children);
    char *copy = strdup(name);
    if (!nv || !copy) {
        if (nv) m->children = nv;
        free(copy);
        ct_module_free(child);
        return ct_error_set(CT_ERR_NOMEM, "module_add_child: out of memory");
    }
    m->children = nv;
    m->children[m->nchildren].name = copy;
    m->children[m->nchildren].module = child;
    m->nchildren++;
    return CT_OK;
}

void ct_module_train(ct_module *m, bool training)
{
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->nchildren; i++) ct_module_train(m->children[i].module, training);
}

/* ---- flattening ----------------------------------------------------------------- */

static bool list_has(const ct_param_list *l, const ct_tensor *t)
{
    for (int i = 0; i < l->n; i++)
        if (l->tensors[i] == t) return true;
    return false;
}

static ct_status list_push(ct_param_list *l, int *cap, const char *prefix, const char *name, ct_tensor *t)
{
    if (list_has(l, t)) return CT_OK;
    if (l->n == *cap) {
        int c = *cap ? *cap * 2 : 32;
        ct_tensor **nt = realloc(l->tensors, (size_t)c * sizeof *nt);
        if (nt) l->tensors = nt;
        char **nn = realloc(l->names, (size_t)c * sizeof *nn);
        if (nn) l->names = nn;
        if (!nt || !nn) return ct_error_set(CT_ERR_NOMEM, "module parameters: out of memory");
        *cap = c;
    }
    size_t len = strlen(prefix) + strlen(name) + 1;
    char *full = malloc(len);
    if (!full) return ct_error_set(CT_ERR_NOMEM, "module parameters: out of memory");
    snprintf(full, len, "%s%s", prefix, name);
    l->tensors[l->n] = t;
    l->names[l->n] = full;
    l->n++;
    return CT_OK;
}

static ct_status walk(const ct_module *m, const char *prefix, bool params, bool buffers, ct_param_list *l, int *cap)
{
    ct_status st = CT_OK;
    for (int i = 0; params && i < m->nparams && !st; i++)
        st = list_push(l, cap, prefix, m->params[i].name, m->params[i].tensor);
    for (int i = 0; buffers && i < m->nbuffers && !st; i++)
        st = list_push(l, cap, prefix, m->buffers[i].name, m->buffers[i].tensor);
    for (int i = 0; i < m->nchildren && !st; i++) {
        size_t len = strlen(prefix) + strlen(m->children[i].name) + 2;
        char *p = malloc(len);
        if (!p) return ct_error_set(CT_ERR_NOMEM, "module parameters: out of memory");
        snprintf(p, len, "%s%s.", prefix, m->children[i].name);
        st = walk(m->children[i].module, p, params, buffers, l, cap);
        free(p);
    }
    return st;
}

ct_status ct_module_named_tensors(const ct_module *m, bool buffers, ct_param_list *out)
{
    *out = (ct_param_list){0};
    if (!m) return ct_error_set(CT_ERR_INVALID, "module_named_tensors: module is NULL");
    int cap = 0;
    /* parameters first, then buffers, each in registration order */
    ct_status st = walk(m, "", true, false, out, &cap);
    if (!st && buffers) st = walk(m, "", false, true, out, &cap);
    if (st) ct_param_list_free(out);
    return st;
}

void ct_param_list_free(ct_param_list *l)
{
    if (!l) return;
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    free(l->tensors);
    *l = (ct_param_list){0};
}

int64_t ct_module_num_params(const ct_module *m)
{
    ct_param_list l;
    if (ct_module_named_tensors(m, false, &l)) return -1;
    int64_t n = 0;
    for (int i = 0; i < l.n; i++) n += ct_tensor_numel(l.tensors[i]);
    ct_param_list_free(&l);
    return n;
}

ct_tensor *ct_module_find(const ct_module *m, const char *name)
{
    if (!m || !name) return NULL;
    const char *dot = strchr(name, '.');
    if (!dot) {
        for (int i = 0; i < m->nparams; i++)
            if (!strcmp(m->params[i].name, name)) return m->params[i].tensor;
        for (int i = 0; i < m->nbuffers; i++)
            if (!strcmp(m->buffers[i].name, name)) return m->buffers[i].tensor;
        return NULL;
    }
    size_t len = (size_t)(dot - name);
    for (int i = 0; i < m->nchildren; i++)
        if (strlen(m->children[i].name) == len && !strncmp(m->children[i].name, name, len))
            return ct_module_find(m->children[i].module, dot + 1);
    return NULL;
}

void ct_module_zero_grad(ct_module *m)
{
    ct_param_list l;
    if (ct_module_named_tensors(m, false, &l)) return;
    for (int i = 0; i < l.n; i++) ct_tensor_zero_grad(l.tensors[i]);
    ct_param_list_free(&l);
}

/* ---- state dicts ------------------------------------------------------------------ */

ct_status ct_module_save(const ct_module *m, const char *path, int nmeta, const char *const *meta_keys,
                         const char *const *meta_values)
{
    ct_param_list l;
    ct_status st = ct_module_named_tensors(m, true, &l);
    if (st) return st;
    st = ct_safetensors_save(path, l.n, (const char *const *)l.names, l.tensors, nmeta, meta_keys, meta_values);
    ct_param_list_free(&l);
    return st;
}

static ct_status push_name(char ***v, int *n, const char *fmt, const char *a, const char *b, const char *c)
{
    char **nv = realloc(*v, (size_t)(*n + 1) * sizeof *nv);
    if (!nv) return ct_error_set(CT_ERR_NOMEM, "module_load: out of memory");
    *v = nv;
    size_t len = strlen(fmt) + strlen(a) + (b ? strlen(b) : 0) + (c ? strlen(c) : 0) + 1;
    char *s = malloc(len);
    if (!s) return ct_error_set(CT_ERR_NOMEM, "module_load: out of memory");
    snprintf(s, len, fmt, a, b ? b : "", c ? c : "");
    nv[(*n)++] = s;
    return CT_OK;
}

void ct_load_report_free(ct_load_report *r)
{
    if (!r) return;
    for (int i = 0; i < r->nmissing; i++) free(r->missing[i]);
    for (int i = 0; i < r->nunexpected; i++) free(r->unexpected[i]);
    for (int i = 0; i < r->nmismatched; i++) free(r->mismatched[i]);
    free(r->missing);
    free(r->unexpected);
    free(r->mismatched);
    *r = (ct_load_report){0};
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

ct_status ct_module_load(ct_module *m, const char *path, bool strict, ct_load_report *report)
{
    return ct_module_load_mapped(m, path, strict, report, NULL, NULL);
}

/* The file's tensor whose module-side key is name, or -1. */
static int find_key(char *const *keys, int nfile, const char *name)
{
    for (int j = 0; j < nfile; j++)
        if (keys[j] && !strcmp(keys[j], name)) return j;
    return -1;
}

ct_status ct_module_load_mapped(ct_module *m, const char *path, bool strict, ct_load_report *report,
                                ct_load_key_fn map, void *ctx)
{
    ct_load_report r = {0};
    ct_param_list l;
    ct_status st = ct_module_named_tensors(m, true, &l);
    if (st) return st;
    ct_safetensors *f = ct_safetensors_open(path);
    if (!f) {
        ct_param_list_free(&l);
        return ct_last_status();
    }
    int nfile = ct_safetensors_count(f);
    bool *used = calloc((size_t)(nfile ? nfile : 1), sizeof *used);
    char **keys = calloc((size_t)(nfile ? nfile : 1), sizeof *keys);
    int *src_of = calloc((size_t)(l.n ? l.n : 1), sizeof *src_of);
    if (!used || !keys || !src_of) st = ct_error_set(CT_ERR_NOMEM, "module_load: out of memory");
    /* pass 0: the module-side key of each file tensor; NULL = ignored by the map */
    for (int j = 0; j < nfile && !st; j++) {
        const char *fname = ct_safetensors_name(f, j);
        char buf[512];
        const char *k = map ? map(fname, buf, sizeof buf, ctx) : fname;
        if (!k) {
            used[j] = true;
            continue;
        }
        if (!(keys[j] = strdup(k))) st = ct_error_set(CT_ERR_NOMEM, "module_load: out of memory");
    }
    /* pass 1: match names and shapes without touching data */
    for (int i = 0; i < l.n && !st; i++) {
        int j = src_of[i] = find_key(keys, nfile, l.names[i]);
        if (j < 0) {
            st = push_name(&r.missing, &r.nmissing, "%s", l.names[i], NULL, NULL);
            continue;
        }
        ct_dtype dt;
        int nd;
        int64_t sh[CT_MAX_DIMS];
        ct_safetensors_info(f, ct_safetensors_name(f, j), &dt, &nd, sh);
        used[j] = true;
        ct_tensor *t = l.tensors[i];
        bool same = nd == t->ndim;
        for (int d = 0; same && d < nd; d++) same = sh[d] == t->shape[d];
        if (!same) {
            char fs[200], ms[200], tmp[160];
            snprintf(fs, sizeof fs, "%s%s", ct_dtype_name(dt), ct_shape_str(nd, sh, tmp, sizeof tmp));
            snprintf(ms, sizeof ms, "%s%s", ct_dtype_name(t->dtype), ct_shape_str(t->ndim, t->shape, tmp, sizeof tmp));
            st = push_name(&r.mismatched, &r.nmismatched, "%s: file %s, module %s", l.names[i], fs, ms);
            src_of[i] = -1;
        }
    }
    for (int j = 0; j < nfile && !st; j++)
        if (!used[j]) st = push_name(&r.unexpected, &r.nunexpected, "%s", ct_safetensors_name(f, j), NULL, NULL);
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
    /* pass 2: copy what matches */
    for (int i = 0; i < l.n && !st; i++) {
        if (src_of[i] < 0) continue;
        const char *fname = ct_safetensors_name(f, src_of[i]);
        ct_frame_push();
        ct_tensor *src = ct_safetensors_get(f, fname);
        st = src ? ct_tensor_copy_(l.tensors[i], src) : ct_last_status();
        ct_frame_pop();
        if (st) ct_error_prefix("module_load %s: tensor %s: ", path, fname);
    }
    for (int j = 0; keys && j < nfile; j++) free(keys[j]);
    free(keys);
    free(src_of);
    free(used);
    ct_safetensors_close(f);
    ct_param_list_free(&l);
    ct_autocast_weights_changed(); /* tensors were written in place: autocast copies are stale */
    if (report && !st) *report = r;
    else ct_load_report_free(&r);
    return st;
}
