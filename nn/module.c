#include "nn/module.h"

#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/safetensors.h"
#include "nn/hf_weights.h"

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

void ct_module_set_loss_runner(ct_module *m, const ct_module_loss_runner *r)
{
    if (m) m->loss_runner = r ? *r : (ct_module_loss_runner){0};
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

ct_status ct_module_load(ct_module *m, const char *path, bool strict, ct_load_report *report)
{
    return ct_module_load_mapped(m, path, strict, report, NULL, NULL);
}

ct_status ct_module_load_mapped(ct_module *m, const char *path, bool strict, ct_load_report *report,
                                ct_load_key_fn map, void *ctx)
{
    /* one reader for one file and for Hugging Face's directories, sharded or not */
    return ct_hf_weights_load(m, path, strict, report, map, ctx);
}
