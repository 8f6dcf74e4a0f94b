/* ctrain — the sharding engine's plan (see parallel/shard_plan.h). */
#include "parallel/shard_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every parameter once, in the order of ct_module_named_tensors (a module's own
 * parameters, then its children's, depth first), with the module that registered it
 * first. */
typedef struct entry {
    ct_tensor *t;
    const ct_module *owner;
    char *name;
} entry;

/* A module of the tree in pre-order, with its dotted name and its parent's index. */
typedef struct node {
    const ct_module *m;
    char *name;
    int parent;   /* -1 for the root */
    bool wrapped; /* a unit of its own */
    int unit;     /* index in the plan, or -1 */
} node;

typedef struct builder {
    entry *e;
    int ne, cap_e;
    node *n;
    int nn, cap_n;
    const ct_param_list *only; /* NULL: every parameter */
} builder;

static bool listed(const ct_param_list *l, const ct_tensor *t)
{
    for (int i = 0; i < l->n; i++)
        if (l->tensors[i] == t) return true;
    return false;
}

static char *join_name(const char *prefix, const char *name)
{
    size_t len = strlen(prefix) + strlen(name) + 2;
    char *s = malloc(len);
    if (s) snprintf(s, len, "%s%s%s", prefix, *prefix ? "." : "", name);
    return s;
}

static ct_status collect(builder *b, const ct_module *m, const char *name, int parent)
{
    if (b->nn == b->cap_n) {
        int c = b->cap_n ? 2 * b->cap_n : 16;
        node *nn = realloc(b->n, (size_t)c * sizeof *nn);
        if (!nn) return ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
        b->n = nn, b->cap_n = c;
    }
    const int self = b->nn++;
    b->n[self] = (node){.m = m, .name = strdup(name), .parent = parent, .unit = -1};
    if (!b->n[self].name) return ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
    for (int i = 0; i < m->nparams; i++) {
        ct_tensor *t = m->params[i].tensor;
        bool seen = false;
        for (int j = 0; j < b->ne && !seen; j++) seen = b->e[j].t == t;
        if (seen || (b->only && !listed(b->only, t))) continue;
        if (b->ne == b->cap_e) {
            int c = b->cap_e ? 2 * b->cap_e : 32;
            entry *ne = realloc(b->e, (size_t)c * sizeof *ne);
            if (!ne) return ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
            b->e = ne, b->cap_e = c;
        }
        char *full = join_name(name, m->params[i].name);
        if (!full) return ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
        b->e[b->ne++] = (entry){.t = t, .owner = m, .name = full};
    }
    for (int i = 0; i < m->nchildren; i++) {
        char *child = join_name(name, m->children[i].name);
        if (!child) return ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
        ct_status st = collect(b, m->children[i].module, child, self);
        free(child);
        if (st) return st;
    }
    return CT_OK;
}

static bool in_classes(const ct_wrap_config *w, const char *type)
{
    for (int i = 0; i < w->nclasses; i++)
        if (type && w->classes[i] && !strcmp(type, w->classes[i])) return true;
    return false;
}

/* size_based_wrap, bottom up: the elements of node k's subtree not yet in a unit;
 * node k is wrapped (and reports 0) when they reach min, unless it is a container
 * (FSDP's size policy never wraps ModuleList or ModuleDict either). Children follow their parent
 * in pre-order, so walking k downwards visits every child after k was set up. */
static int64_t size_wrap(builder *b, int k, int64_t min)
{
    int64_t own = 0;
    for (int j = 0; j < b->ne; j++)
        if (b->e[j].owner == b->n[k].m) own += ct_tensor_numel(b->e[j].t);
    for (int c = k + 1; c < b->nn; c++)
        if (b->n[c].parent == k) own += size_wrap(b, c, min);
    const char *type = b->n[k].m->type;
    const bool container = type && (!strcmp(type, "ModuleList") || !strcmp(type, "ModuleDict"));
    if (k > 0 && own >= min && !container) {
        b->n[k].wrapped = true;
        return 0;
    }
    return own;
}

static void builder_free(builder *b)
{
    for (int i = 0; i < b->ne; i++) free(b->e[i].name);
    for (int i = 0; i < b->nn; i++) free(b->n[i].name);
    free(b->e), free(b->n);
}

/* The unit that takes the parameters registered by node k: its nearest wrapped
 * ancestor (itself included), else the root unit. */
static int unit_of(const builder *b, int k, int root_unit)
{
    for (; k >= 0; k = b->n[k].parent)
        if (b->n[k].wrapped) return b->n[k].unit;
    return root_unit;
}

ct_status ct_shard_plan_build(const ct_module *root, const ct_wrap_config *wrap, int world, ct_shard_plan *out)
{
    return ct_shard_plan_build_subset(root, wrap, world, NULL, out);
}

ct_status ct_shard_plan_build_subset(const ct_module *root, const ct_wrap_config *wrap, int world,
                                     const ct_param_list *only, ct_shard_plan *out)
{
    *out = (ct_shard_plan){0};
    if (!root || !wrap) return ct_error_set(CT_ERR_INVALID, "shard_plan: the model and the wrap policy are required");
    if (world < 1) return ct_error_set(CT_ERR_INVALID, "shard_plan: world size %d is not >= 1", world);
    if (wrap->policy == CT_WRAP_TRANSFORMER && (wrap->nclasses < 1 || !wrap->classes))
        return ct_error_set(CT_ERR_INVALID,
                            "shard_plan: transformer_based_wrap needs the module classes to wrap (e.g. \"Block\")");
    if (wrap->policy == CT_WRAP_SIZE && wrap->min_num_params < 1)
        return ct_error_set(CT_ERR_INVALID, "shard_plan: size_based_wrap's min_num_params %lld is not >= 1",
                            (long long)wrap->min_num_params);
    if (wrap->policy != CT_WRAP_NONE && wrap->policy != CT_WRAP_TRANSFORMER && wrap->policy != CT_WRAP_SIZE)
        return ct_error_set(CT_ERR_INVALID, "shard_plan: unknown wrap policy %d", (int)wrap->policy);

    builder b = {.only = only};
    ct_status st = collect(&b, root, "", -1);
    if (!st && b.ne == 0) st = ct_error_set(CT_ERR_INVALID, "shard_plan: the model has no parameters to shard");
    for (int j = 0; !st && j < b.ne; j++) {
        const ct_dtype dt = b.e[j].t->dtype;
        if (dt != CT_DTYPE_F32 && dt != CT_DTYPE_F64 && dt != CT_DTYPE_BF16 && dt != CT_DTYPE_F16)
            st = ct_error_set(CT_ERR_INVALID, "shard_plan: parameter '%s' is %s: only floating-point parameters shard",
                              b.e[j].name, ct_dtype_name(dt));
    }
    if (!st && wrap->policy == CT_WRAP_TRANSFORMER) {
        for (int c = 0; c < wrap->nclasses && !st; c++) {
            bool found = false;
            for (int k = 0; k < b.nn && !found; k++) found = b.n[k].m->type && wrap->classes[c] &&
                                                                !strcmp(b.n[k].m->type, wrap->classes[c]);
            if (!found)
                st = ct_error_set(CT_ERR_INVALID,
                                  "shard_plan: transformer_based_wrap names class '%s', but the model has no module of "
                                  "that type",
                                  wrap->classes[c] ? wrap->classes[c] : "(null)");
        }
        for (int k = 1; k < b.nn; k++) b.n[k].wrapped = in_classes(wrap, b.n[k].m->type);
    } else if (!st && wrap->policy == CT_WRAP_SIZE) {
        size_wrap(&b, 0, wrap->min_num_params);
    }
    if (st) {
        builder_free(&b);
        return st;
    }

    /* units in pre-order of their modules, the root unit last; a unit without
     * parameters of its own (all tied elsewhere) is dropped */
    int nunits = 0;
    for (int k = 0; k < b.nn; k++)
        if (b.n[k].wrapped) b.n[k].unit = nunits++;
    const int root_unit = nunits++;
    ct_shard_unit *units = calloc((size_t)nunits, sizeof *units);
    int *count = calloc((size_t)nunits, sizeof *count);
    if (!units || !count) {
        free(units), free(count);
        builder_free(&b);
        return ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
    }
    int *unit_of_entry = malloc((size_t)b.ne * sizeof *unit_of_entry);
    for (int j = 0; unit_of_entry && j < b.ne; j++) {
        int k = 0;
        while (b.n[k].m != b.e[j].owner) k++;
        unit_of_entry[j] = unit_of(&b, k, root_unit);
        count[unit_of_entry[j]]++;
    }
    for (int u = 0; unit_of_entry && u < nunits && !st; u++) {
        units[u].params = calloc((size_t)(count[u] ? count[u] : 1), sizeof *units[u].params);
        if (!units[u].params) st = ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
    }
    if (!unit_of_entry) st = ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
    for (int k = 0; !st && k < b.nn; k++)
        if (b.n[k].wrapped) {
            units[b.n[k].unit].module = b.n[k].m;
            units[b.n[k].unit].name = strdup(b.n[k].name);
        }
    if (!st) {
        units[root_unit].module = root;
        units[root_unit].name = strdup("");
    }
    for (int j = 0; !st && j < b.ne; j++) {
        ct_shard_unit *u = &units[unit_of_entry[j]];
        const int64_t n = ct_tensor_numel(b.e[j].t);
        u->params[u->nparams++] = (ct_shard_param){.param = b.e[j].t, .name = b.e[j].name, .offset = u->numel, .numel = n};
        b.e[j].name = NULL; /* the plan owns it now */
        u->numel += n;
    }
    free(count), free(unit_of_entry);
    ct_shard_plan p = {.world = world, .units = units, .nunits = nunits};
    for (int u = 0; !st && u < nunits; u++)
        if (!units[u].name) st = ct_error_set(CT_ERR_NOMEM, "shard_plan: out of memory");
    builder_free(&b);
    if (st) {
        ct_shard_plan_free(&p);
        return st;
    }
    /* drop empty units, keeping the order */
    int kept = 0;
    for (int u = 0; u < nunits; u++) {
        if (!units[u].nparams) {
            free(units[u].params), free(units[u].name);
            continue;
        }
        units[kept++] = units[u];
    }
    p.nunits = kept;
    for (int u = 0; u < kept; u++) {
        ct_shard_unit *x = &p.units[u];
        x->padded = (x->numel + world - 1) / world * world;
        x->shard = x->padded / world;
        p.numel += x->numel;
        p.padded += x->padded;
    }
    *out = p;
    return CT_OK;
}

void ct_shard_plan_free(ct_shard_plan *p)
{
    if (!p) return;
    for (int u = 0; p->units && u < p->nunits; u++) {
        for (int i = 0; i < p->units[u].nparams; i++) free(p->units[u].params[i].name);
        free(p->units[u].params);
        free(p->units[u].name);
    }
    free(p->units);
    *p = (ct_shard_plan){0};
}

void ct_shard_param_slice(const ct_shard_unit *u, const ct_shard_param *p, int r, int64_t *begin, int64_t *end)
{
    /* rank r owns [lo, hi) of the unit's buffer; the parameter covers [offset, offset + numel) */
    const int64_t lo = (int64_t)r * u->shard, hi = lo + u->shard;
    const int64_t a = lo > p->offset ? lo : p->offset, z = hi < p->offset + p->numel ? hi : p->offset + p->numel;
    *begin = *end = 0;
    if (a < z) *begin = a - p->offset, *end = z - p->offset;
}
