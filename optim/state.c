/* ctrain — optimizer state to and from safetensors files (the layout is in
 * optim/optimizer.h). Loading validates the whole file against the optimizer and
 * reads every tensor before it replaces anything, so a failed load leaves the
 * optimizer as it was. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "core/safetensors.h"
#include "optim/optimizer.h"
#include "optim/optimizer_internal.h"

#define STATE_FORMAT "ctrain-optimizer"
#define STATE_VERSION "1"

static ct_tensor **state_slot(ct_param_state *s, const char *key)
{
    if (!strcmp(key, "exp_avg")) return &s->exp_avg;
    if (!strcmp(key, "exp_avg_sq")) return &s->exp_avg_sq;
    return &s->momentum_buffer;
}

/* ---- save ----------------------------------------------------------------- */

typedef struct strlist {
    char **s;
    int n, cap;
    bool oom;
} strlist;

static void sl_addf(strlist *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sl_addf(strlist *l, const char *fmt, ...)
{
    if (l->oom) return;
    if (l->n == l->cap) {
        int c = l->cap ? 2 * l->cap : 32;
        char **a = realloc(l->s, (size_t)c * sizeof *a);
        if (!a) {
            l->oom = true;
            return;
        }
        l->s = a, l->cap = c;
    }
    va_list ap;
    va_start(ap, fmt);
    char *str = NULL;
    if (vasprintf(&str, fmt, ap) < 0) str = NULL;
    va_end(ap);
    if (!str) l->oom = true;
    else l->s[l->n++] = str;
}

static void sl_free(strlist *l)
{
    for (int i = 0; i < l->n; i++) free(l->s[i]);
    free(l->s);
}

/* One metadata pair: key and value appended to their lists together. */
#define META(k, ...) (sl_addf(&keys, "%s", k), sl_addf(&vals, __VA_ARGS__))

ct_status ct_optimizer_save(const ct_optimizer *o, const char *path)
{
    if (!o || !path)
        return ct_error_set(CT_ERR_INVALID, "optimizer_save: %s is NULL", o ? "path" : "optimizer");
    const char *skeys[2];
    const int nkeys = cti_optim_state_keys(o->kind, o->hyper.momentum, skeys);
    strlist names = {0}, keys = {0}, vals = {0};
    ct_tensor **tensors = malloc((size_t)(o->nparams * nkeys + 1) * sizeof *tensors);
    int nt = 0;
    for (int i = 0; i < o->nparams && tensors; i++) {
        if (o->state[i].step == 0) continue;
        for (int k = 0; k < nkeys; k++) {
            ct_param_state *s = &o->state[i];
            CT_ASSERT(*state_slot(s, skeys[k]) != NULL);
            tensors[nt++] = *state_slot(s, skeys[k]);
            sl_addf(&names, "state.%d.%s", i, skeys[k]);
        }
    }
    META("format", STATE_FORMAT);
    META("version", STATE_VERSION);
    META("optimizer", "%s", ct_optimizer_name(o));
    META("step", "%" PRId64, o->step);
    META("lr", "%.17g", o->lr);
    META("params", "%d", o->nparams);
    META("groups", "%d", o->ngroups);
    for (int g = 0; g < o->ngroups; g++) {
        sl_addf(&keys, "group.%d.params", g), sl_addf(&vals, "%d", o->groups[g].n);
        sl_addf(&keys, "group.%d.lr_scale", g), sl_addf(&vals, "%.17g", o->groups[g].lr_scale);
        sl_addf(&keys, "group.%d.weight_decay", g), sl_addf(&vals, "%.17g", o->groups[g].weight_decay);
    }
    if (o->kind == CT_OPTIM_SGD) {
        META("momentum", "%.17g", o->hyper.momentum);
        META("dampening", "%.17g", o->hyper.dampening);
        META("nesterov", "%s", o->hyper.nesterov ? "true" : "false");
    } else {
        META("beta1", "%.17g", o->hyper.beta1);
        META("beta2", "%.17g", o->hyper.beta2);
        META("eps", "%.17g", o->hyper.eps);
    }
    for (int i = 0; i < o->nparams; i++)
        if (o->state[i].step) sl_addf(&keys, "state.%d.step", i), sl_addf(&vals, "%" PRId64, o->state[i].step);

    ct_status st;
    if (!tensors || names.oom || keys.oom || vals.oom) st = ct_error_set(CT_ERR_NOMEM, "optimizer_save: %s: out of memory", path);
    else if ((st = ct_safetensors_save(path, nt, (const char *const *)names.s, tensors, keys.n, (const char *const *)keys.s,
                                       (const char *const *)vals.s)))
        ct_error_prefix("optimizer_save: ");
    free(tensors);
    sl_free(&names), sl_free(&keys), sl_free(&vals);
    return st;
}

/* ---- load ----------------------------------------------------------------- */

typedef struct loader {
    ct_safetensors *f;
    const char *path;
} loader;

static const char *meta_get(const loader *L, const char *key)
{
    const char *v = ct_safetensors_metadata(L->f, key);
    if (!v)
        ct_error_set(CT_ERR_FORMAT, "optimizer_load: %s: __metadata__ has no '%s' (was it written by ct_optimizer_save?)",
                     L->path, key);
    return v;
}

static bool meta_i64(const loader *L, const char *key, int64_t lo, int64_t *out)
{
    const char *v = meta_get(L, key);
    if (!v) return false;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo) {
        ct_error_set(CT_ERR_FORMAT, "optimizer_load: %s: __metadata__ '%s' is '%s', expected an integer >= %" PRId64,
                     L->path, key, v, lo);
        return false;
    }
    *out = x;
    return true;
}

static bool meta_f64(const loader *L, const char *key, double *out)
{
    const char *v = meta_get(L, key);
    if (!v) return false;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno) {
        ct_error_set(CT_ERR_FORMAT, "optimizer_load: %s: __metadata__ '%s' is '%s', expected a number", L->path, key, v);
        return false;
    }
    *out = x;
    return true;
}

static bool meta_expect(const loader *L, const char *key, const char *want, const char *what)
{
    const char *v = meta_get(L, key);
    if (!v) return false;
    if (strcmp(v, want)) {
        ct_error_set(CT_ERR_FORMAT, "optimizer_load: %s: %s: __metadata__ '%s' is '%s', expected '%s'", L->path, what, key,
                     v, want);
        return false;
    }
    return true;
}

/* Everything read from the file, installed only when all of it checks out. */
typedef struct loaded {
    int64_t step;
    double lr;
    ct_optim_hyper hyper;
    double *lr_scale, *weight_decay; /* per group */
    ct_param_state *state;           /* per parameter; tensors owned */
} loaded;

static void loaded_free(loaded *d, int nparams)
{
    if (d->state)
        for (int i = 0; i < nparams; i++) {
            ct_tensor_release(d->state[i].exp_avg);
            ct_tensor_release(d->state[i].exp_avg_sq);
            ct_tensor_release(d->state[i].momentum_buffer);
        }
    free(d->state);
    free(d->lr_scale);
    free(d->weight_decay);
}

/* The layout: kind, counts, groups, hyper-parameters and per-parameter steps. */
static ct_status read_meta(const ct_optimizer *o, const loader *L, loaded *d)
{
    char op[512];
    snprintf(op, sizeof op, "optimizer_load: %s", L->path);
    char what[64];
    snprintf(what, sizeof what, "this optimizer is %s", ct_optimizer_name(o));
    if (!meta_expect(L, "format", STATE_FORMAT, "not an optimizer state file") ||
        !meta_expect(L, "version", STATE_VERSION, "unsupported version") || !meta_expect(L, "optimizer", ct_optimizer_name(o), what))
        return ct_last_status();
    int64_t np, ng;
    if (!meta_i64(L, "params", 0, &np) || !meta_i64(L, "groups", 0, &ng)) return ct_last_status();
    if (np != o->nparams)
        return ct_error_set(CT_ERR_INVALID, "%s: the file holds state for %" PRId64 " parameters, this optimizer has %d", op,
                            np, o->nparams);
    if (ng != o->ngroups)
        return ct_error_set(CT_ERR_INVALID, "%s: the file holds %" PRId64 " parameter groups, this optimizer has %d", op, ng,
                            o->ngroups);
    d->lr_scale = calloc((size_t)o->ngroups + 1, sizeof *d->lr_scale);
    d->weight_decay = calloc((size_t)o->ngroups + 1, sizeof *d->weight_decay);
    d->state = calloc((size_t)o->nparams + 1, sizeof *d->state);
    if (!d->lr_scale || !d->weight_decay || !d->state) return ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
    char key[64];
    for (int g = 0; g < o->ngroups; g++) {
        int64_t n;
        snprintf(key, sizeof key, "group.%d.params", g);
        if (!meta_i64(L, key, 0, &n)) return ct_last_status();
        if (n != o->groups[g].n)
            return ct_error_set(CT_ERR_INVALID, "%s: group %d holds %" PRId64 " parameters in the file, %d in this optimizer", op,
                                g, n, o->groups[g].n);
        snprintf(key, sizeof key, "group.%d.lr_scale", g);
        if (!meta_f64(L, key, &d->lr_scale[g]) || cti_optim_check_nonneg(op, key, d->lr_scale[g])) return ct_last_status();
        snprintf(key, sizeof key, "group.%d.weight_decay", g);
        if (!meta_f64(L, key, &d->weight_decay[g]) || cti_optim_check_nonneg(op, key, d->weight_decay[g]))
            return ct_last_status();
    }
    if (!meta_i64(L, "step", 0, &d->step) || !meta_f64(L, "lr", &d->lr) || cti_optim_check_nonneg(op, "lr", d->lr))
        return ct_last_status();
    if (o->kind == CT_OPTIM_SGD) {
        const char *nes = meta_get(L, "nesterov");
        if (!meta_f64(L, "momentum", &d->hyper.momentum) || !meta_f64(L, "dampening", &d->hyper.dampening) || !nes)
            return ct_last_status();
        if (strcmp(nes, "true") && strcmp(nes, "false"))
            return ct_error_set(CT_ERR_FORMAT, "%s: __metadata__ 'nesterov' is '%s', expected 'true' or 'false'", op, nes);
        d->hyper.nesterov = !strcmp(nes, "true");
    } else if (!meta_f64(L, "beta1", &d->hyper.beta1) || !meta_f64(L, "beta2", &d->hyper.beta2) ||
               !meta_f64(L, "eps", &d->hyper.eps)) {
        return ct_last_status();
    }
    if (cti_optim_check_hyper(op, o->kind, &d->hyper)) return CT_ERR_INVALID;
    for (int i = 0; i < o->nparams; i++) {
        snprintf(key, sizeof key, "state.%d.step", i);
        if (ct_safetensors_metadata(L->f, key) && !meta_i64(L, key, 1, &d->state[i].step)) return ct_last_status();
    }
    return CT_OK;
}

/* Every tensor in the file must be one this optimizer expects: "state.<i>.<key>" for a
 * parameter i with steps, and a key of the kind. */
static ct_status check_names(const ct_optimizer *o, const loader *L, const loaded *d)
{
    const char *keys[2];
    const int nkeys = cti_optim_state_keys(o->kind, d->hyper.momentum, keys);
    for (int t = 0; t < ct_safetensors_count(L->f); t++) {
        const char *name = ct_safetensors_name(L->f, t);
        const char *why = "is not a state tensor of this optimizer";
        char *end = NULL;
        long i = -1;
        if (!strncmp(name, "state.", 6)) {
            errno = 0;
            i = strtol(name + 6, &end, 10);
            if (end == name + 6 || *end != '.' || errno) i = -1;
        }
        if (i >= 0 && i < o->nparams) {
            int k = 0;
            while (k < nkeys && strcmp(end + 1, keys[k])) k++;
            if (k == nkeys && nkeys == 0 && !strcmp(end + 1, "momentum_buffer")) why = "is a momentum buffer, but momentum is 0";
            else if (k == nkeys) why = "is not a state tensor of this optimizer";
            else if (d->state[i].step == 0) why = "belongs to a parameter that has no steps (no state.<i>.step)";
            else why = NULL;
        } else if (i >= 0) {
            return ct_error_set(CT_ERR_INVALID, "optimizer_load: %s: tensor '%s' names parameter %ld, this optimizer has %d",
                                L->path, name, i, o->nparams);
        }
        if (why) return ct_error_set(CT_ERR_FORMAT, "optimizer_load: %s: tensor '%s' %s", L->path, name, why);
    }
    return CT_OK;
}

/* Each stepped parameter's state tensors: present, with its shape and dtype; then
 * read (owned contiguous copies, independent of the file's mapping). */
static ct_status read_tensors(const ct_optimizer *o, const loader *L, loaded *d)
{
    const char *keys[2];
    const int nkeys = cti_optim_state_keys(o->kind, d->hyper.momentum, keys);
    char name[64], lab[320], want[200], sh[200];
    for (int i = 0; i < o->nparams; i++) {
        if (d->state[i].step == 0) continue;
        const ct_tensor *p = o->params[i];
        for (int k = 0; k < nkeys; k++) {
            snprintf(name, sizeof name, "state.%d.%s", i, keys[k]);
            ct_dtype dt;
            int ndim;
            int64_t shape[CT_MAX_DIMS];
            if (!ct_safetensors_info(L->f, name, &dt, &ndim, shape)) return ct_error_prefix("optimizer_load: ");
            if (dt != p->dtype || ndim != p->ndim || memcmp(shape, p->shape, (size_t)ndim * sizeof *shape)) {
                ct_shape_str(ndim, shape, sh, sizeof sh);
                ct_shape_str(p->ndim, p->shape, want, sizeof want);
                return ct_error_set(CT_ERR_INVALID, "optimizer_load: %s: '%s' is %s%s but %s needs %s%s", L->path, name,
                                    ct_dtype_name(dt), sh, cti_optim_param_label(p, i, lab, sizeof lab),
                                    ct_dtype_name(p->dtype), want);
            }
        }
    }
    ct_status st = CT_OK;
    ct_frame_push();
    for (int i = 0; i < o->nparams && !st; i++) {
        if (d->state[i].step == 0) continue;
        for (int k = 0; k < nkeys && !st; k++) {
            snprintf(name, sizeof name, "state.%d.%s", i, keys[k]);
            ct_tensor *t = ct_tensor_clone(ct_safetensors_get(L->f, name));
            if (!t) st = ct_error_prefix("optimizer_load: ");
            else *state_slot(&d->state[i], keys[k]) = ct_tensor_retain(t);
        }
    }
    ct_frame_pop();
    return st;
}

ct_status ct_optimizer_load(ct_optimizer *o, const char *path)
{
    if (!o || !path)
        return ct_error_set(CT_ERR_INVALID, "optimizer_load: %s is NULL", o ? "path" : "optimizer");
    loader L = {.f = ct_safetensors_open(path), .path = path};
    if (!L.f) return ct_error_prefix("optimizer_load: ");
    loaded d = {0};
    ct_status st = read_meta(o, &L, &d);
    if (!st) st = check_names(o, &L, &d);
    if (!st) st = read_tensors(o, &L, &d);
    ct_safetensors_close(L.f);
    if (st) {
        loaded_free(&d, o->nparams);
        return st;
    }
    /* commit: swap the new state in, the old out */
    ct_param_state *old = o->state;
    for (int i = 0; i < o->nparams; i++) {
        ct_param_state t = old[i];
        old[i] = d.state[i];
        d.state[i] = t;
    }
    for (int g = 0; g < o->ngroups; g++) {
        o->groups[g].lr_scale = d.lr_scale[g];
        o->groups[g].weight_decay = d.weight_decay[g];
    }
    o->step = d.step;
    o->lr = d.lr;
    o->hyper = d.hyper;
    loaded_free(&d, o->nparams);
    return CT_OK;
}
