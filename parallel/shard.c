/* ctrain — the sharding engine: set-up, the optimizer's slices, accounting (see
 * parallel/shard.h; gathering in parallel/shard_params.c, reductions in parallel/shard_grads.c). */
#include "parallel/shard_internal.h"

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/storage.h"
#include "dist/env.h"
#include "parallel/module_sync_internal.h"
#include "parallel/shard_flat.h"

double cti_shard_now(void) { return (double)uv_hrtime() * 1e-9; }

const char *ct_shard_strategy_name(ct_shard_strategy st)
{
    static const char *const names[] = {"NO_SHARD", "OPTIMIZER", "GRAD_OP", "FULL", "HYBRID"};
    return st >= CT_SHARD_NO_SHARD && st <= CT_SHARD_HYBRID ? names[st] : "invalid";
}

void cti_shard_count_sent(ct_shard *s, int64_t nbytes, int g, int factor)
{
    if (g > 1) s->run_sent += factor * (nbytes / g) * (g - 1);
}

ct_status cti_shard_op_wait(ct_shard *s, shard_op *op)
{
    if (!op->work) return CT_OK;
    double t = cti_shard_now();
    ct_status st = ct_work_wait(op->work);
    s->run_exposed += cti_shard_now() - t;
    double t1 = ct_work_end_time(op->work);
    if (s->niv == s->cap_iv) {
        int cap = s->cap_iv ? 2 * s->cap_iv : 64;
        shard_interval *iv = realloc(s->iv, (size_t)cap * sizeof *iv);
        if (iv) s->iv = iv, s->cap_iv = cap;
    }
    if (s->niv < s->cap_iv) s->iv[s->niv++] = (shard_interval){op->t_submit, t1 > 0 ? t1 : cti_shard_now()};
    ct_work_free(op->work);
    ct_tensor_release(op->keep);
    *op = (shard_op){0};
    if (st) s->failed = true;
    return st;
}

ct_status cti_shard_drain(ct_shard *s)
{
    ct_status first = CT_OK;
    for (int i = 0; i < s->plan.nunits; i++) {
        ct_status a = cti_shard_gather_land(s, &s->units[i]);
        ct_status b = cti_shard_op_wait(s, &s->units[i].reduce);
        ct_status c = cti_shard_op_wait(s, &s->units[i].replica);
        if (!first) first = a ? a : b ? b : c;
    }
    return first;
}

static int cmp_interval(const void *a, const void *b)
{
    double x = ((const shard_interval *)a)->t0, y = ((const shard_interval *)b)->t0;
    return (x > y) - (x < y);
}

void cti_shard_step_done(ct_shard *s)
{
    /* comm time: the union of the collectives' [submitted, completed] intervals */
    qsort(s->iv, (size_t)s->niv, sizeof *s->iv, cmp_interval);
    double comm = 0, end = -1;
    for (int i = 0; i < s->niv; i++) {
        double t0 = s->iv[i].t0 > end ? s->iv[i].t0 : end;
        if (s->iv[i].t1 > t0) comm += s->iv[i].t1 - t0;
        if (s->iv[i].t1 > end) end = s->iv[i].t1;
    }
    s->stats.steps++;
    s->stats.bytes_sent = s->run_sent;
    s->stats.gathers = s->run_gathers;
    s->stats.comm_s = comm;
    s->stats.exposed_s = s->run_exposed < comm ? s->run_exposed : comm;
    s->stats.memory.step_peak = ct_storage_peak_bytes();
    s->stats.memory.step_peak_reserved = ct_storage_peak_reserved_bytes();
    ct_storage_peak_reset();
    s->run_sent = s->run_gathers = 0;
    s->run_exposed = 0;
    s->niv = 0;
}

/* ---- set-up ---------------------------------------------------------------------- */

static ct_status check_config(const ct_shard_config *c)
{
    if (c->strategy == CT_SHARD_NO_SHARD)
        return ct_error_set(CT_ERR_INVALID, "strategy NO_SHARD replicates the parameters: use DDP (parallel/ddp.h)");
    if (c->strategy < CT_SHARD_NO_SHARD || c->strategy > CT_SHARD_HYBRID)
        return ct_error_set(CT_ERR_INVALID, "strategy %d; allowed: OPTIMIZER, GRAD_OP, FULL, HYBRID", (int)c->strategy);
    if (c->backward_prefetch < CT_PREFETCH_BACKWARD_PRE || c->backward_prefetch > CT_PREFETCH_NONE)
        return ct_error_set(CT_ERR_INVALID, "backward_prefetch %d; allowed: BACKWARD_PRE, BACKWARD_POST, NONE",
                            (int)c->backward_prefetch);
    if (c->reduce_dtype && c->reduce_dtype != CT_DTYPE_BF16 && c->reduce_dtype != CT_DTYPE_F16 &&
        c->reduce_dtype != CT_DTYPE_F32)
        return ct_error_set(CT_ERR_INVALID, "reduce_dtype %s; allowed: bf16, f16, f32 (or 0: the parameters')",
                            ct_dtype_name(c->reduce_dtype));
    if (c->param_dtype && c->param_dtype != CT_DTYPE_BF16 && c->param_dtype != CT_DTYPE_F16 &&
        c->param_dtype != CT_DTYPE_F32)
        return ct_error_set(CT_ERR_INVALID, "param_dtype %s; allowed: bf16, f16, f32 (or 0: the parameters')",
                            ct_dtype_name(c->param_dtype));
    const struct {
        const char *name;
        int64_t v;
    } counts[] = {{"allgather_bucket", c->allgather_bucket},
                  {"prefetch_bucket", c->prefetch_bucket},
                  {"persistence_threshold", c->persistence_threshold}};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
        if (counts[i].v < 0)
            return ct_error_set(CT_ERR_INVALID, "%s = %lld; expected >= 0 elements (0: the default)", counts[i].name,
                                (long long)counts[i].v);
    if (c->shard_group_size < 0)
        return ct_error_set(CT_ERR_INVALID, "shard_group_size = %d; expected >= 1 (0 = ranks per machine)",
                            c->shard_group_size);
    return CT_OK;
}

/* Sub-groups of consecutive blocks of S ranks (stride 1) or of ranks j, j+S, ...
 * (stride S): every rank calls ct_pg_new_subgroup for every group, in order, and
 * keeps the one it belongs to. */
static ct_status make_groups(ct_shard *s, bool replica, ct_pg **out)
{
    const int S = s->sworld, count = replica ? S : s->world / S, size = replica ? s->world / S : S;
    int *ranks = malloc((size_t)size * sizeof *ranks);
    if (!ranks) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    ct_status st = CT_OK;
    for (int g = 0; g < count && !st; g++) {
        for (int i = 0; i < size; i++) ranks[i] = replica ? g + i * S : g * S + i;
        ct_pg *p = ct_pg_new_subgroup(s->pg, ranks, size);
        if (p) *out = p;
        else st = ct_last_status();
    }
    free(ranks);
    return st;
}

/* Rank 0's parameters (each unit's flat buffer) and buffers on every rank. */
static ct_status broadcast_state(ct_shard *s)
{
    ct_param_list units = {.n = s->plan.nunits, .tensors = calloc((size_t)s->plan.nunits, sizeof(ct_tensor *)),
                           .names = calloc((size_t)s->plan.nunits, sizeof(char *))};
    ct_param_list all = {0};
    ct_status st = units.tensors && units.names ? CT_OK : ct_error_set(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->plan.nunits && !st; i++) {
        units.tensors[i] = s->units[i].flat;
        units.names[i] = (char *)cti_shard_unit_label(&s->units[i]);
    }
    if (!st) st = cti_dist_broadcast_tensors(s->pg, &units, 0, "shard");
    free(units.tensors), free(units.names);
    /* named tensors list the parameters (each in its unit, sent above) before the buffers */
    int64_t nparams = 0;
    for (int i = 0; i < s->plan.nunits; i++) nparams += s->plan.units[i].nparams;
    if (!st && s->subset) { /* the parameters left alone are neither sent nor read */
        ct_param_list p = {0};
        st = ct_module_named_tensors(s->model, false, &p);
        nparams = p.n;
        ct_param_list_free(&p);
    }
    if (!st) st = ct_module_named_tensors(s->model, true, &all);
    if (!st) st = cti_dist_broadcast_tensors(s->pg, &all, (int)nparams, "shard");
    ct_param_list_free(&all);
    return st;
}

static ct_status setup_unit(ct_shard *s, int i)
{
    shard_unit *u = &s->units[i];
    u->engine = s;
    u->plan = &s->plan.units[i];
    u->index = i;
    u->gathered = true;
    for (int k = 0; k < u->plan->nparams; k++) u->nreq += u->plan->params[k].param->requires_grad;
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *flat = ct_shard_unit_flatten(u->plan);
        if (!flat) st = ct_last_status();
        else u->flat = ct_tensor_retain(flat);
        if (flat) s->gathered_bytes += ct_tensor_nbytes(flat);
    }
    return st;
}

ct_dtype cti_shard_grad_dtype(const ct_shard *s, const shard_unit *u)
{
    if (!s->low) return u->flat->dtype;
    return s->cfg.reduce_dtype ? s->cfg.reduce_dtype : s->low;
}

/* param_dtype: the f32 slice becomes the master, and the unit's buffer (so every
 * parameter of it) its 16-bit rounding. */
static ct_status to_low(ct_shard *s, shard_unit *u)
{
    const int64_t n = u->plan->shard, at = (int64_t)s->srank * n;
    ct_tensor *mine = ct_tensor_narrow(u->flat, 0, at, n);
    ct_tensor *m = mine ? ct_tensor_clone(mine) : NULL;
    ct_tensor *low = m ? ct_tensor_cast(u->flat, s->low) : NULL;
    if (!low) return ct_last_status();
    ct_status st = cti_shard_unit_point(u, low);
    if (st) return st;
    s->gathered_bytes += (int64_t)ct_tensor_nbytes(low) - (int64_t)ct_tensor_nbytes(u->flat);
    ct_tensor_release(u->flat);
    u->flat = ct_tensor_retain(low);
    u->master = ct_tensor_retain(m);
    return CT_OK;
}

/* The slices and gradient buffers, once the parameters are rank 0's. */
static ct_status setup_shards(ct_shard *s, int i)
{
    shard_unit *u = &s->units[i];
    const int64_t n = u->plan->shard, at = (int64_t)s->srank * n;
    ct_status st = CT_OK;
    CT_FRAME {
        if (s->low) st = to_low(s, u);
        ct_tensor *mine = st ? NULL : ct_tensor_narrow(u->flat, 0, at, n);
        ct_tensor *shard = !mine ? NULL : s->free_params ? ct_tensor_clone(mine) : mine;
        /* offloaded, the reduced gradient moves to the master side each step */
        ct_tensor *g = ct_tensor_empty_on(u->flat->device, s->cfg.offload_optimizer ? CT_DTYPE_F32
                                                                                    : cti_shard_grad_dtype(s, u),
                                          1, (const int64_t[]){n});
        if (st || !shard || !g || ct_tensor_fill_(g, 0)) st = st ? st : ct_last_status();
        else {
            u->shard = ct_tensor_retain(shard);
            if (s->cfg.offload_optimizer) u->master_grad = ct_tensor_retain(g);
            else u->grad_shard = ct_tensor_retain(g);
        }
        if (!st && s->cfg.offload_optimizer && !u->master) {
            ct_tensor *m = ct_tensor_clone(shard);
            if (!m) st = ct_last_status();
            else u->master = ct_tensor_retain(m);
        }
        if (!st && s->cfg.strategy == CT_SHARD_OPTIMIZER && u->nreq == u->plan->nparams) {
            ct_tensor *fg = ct_shard_unit_flat_grads(u->plan);
            if (!fg) st = ct_last_status();
            else u->flat_grad = ct_tensor_retain(fg);
        }
    }
    if (!st && s->free_params) cti_shard_reshard(s, u);
    return st;
}

ct_shard *ct_shard_new(ct_pg *pg, ct_module *model, const ct_shard_config *cfg)
{
    if (!pg || !model) {
        ct_error_set(CT_ERR_INVALID, "shard_new: %s is NULL", !pg ? "group" : "model");
        return NULL;
    }
    const ct_shard_config c = cfg ? *cfg : (ct_shard_config){.strategy = CT_SHARD_FULL};
    const int rank = ct_pg_rank(pg), world = ct_pg_size(pg);
    ct_status st = check_config(&c);
    if (st) {
        ct_error_prefix("shard_new (rank %d of %d): ", rank, world);
        return NULL;
    }
    ct_shard *s = calloc(1, sizeof *s);
    if (!s) {
        ct_error_set(CT_ERR_NOMEM, "shard_new: out of memory");
        return NULL;
    }
    s->pg = pg, s->model = model, s->cfg = c;
    s->thread = pthread_self();
    s->rank = rank, s->world = world;
    s->sync = true;
    s->root = -1;
    s->free_params = c.strategy == CT_SHARD_FULL || c.strategy == CT_SHARD_HYBRID;
    s->low = c.param_dtype == CT_DTYPE_BF16 || c.param_dtype == CT_DTYPE_F16 ? c.param_dtype : 0;
    s->sworld = world;
    if (c.strategy == CT_SHARD_HYBRID) {
        s->sworld = c.shard_group_size;
        if (!s->sworld && (st = ct_dist_env_int("LOCAL_WORLD_SIZE", world, 1, &s->sworld))) goto fail;
        if (s->sworld > world || world % s->sworld) {
            st = ct_error_set(CT_ERR_INVALID, "HYBRID: a shard group of %d ranks%s does not divide the %d ranks",
                              s->sworld, c.shard_group_size ? "" : " (LOCAL_WORLD_SIZE)", world);
            goto fail;
        }
    }
    s->srank = rank % s->sworld;
    s->replicas = world / s->sworld;
    /* a shard group of one holds everything: nothing to free between uses */
    if (s->sworld == 1) s->free_params = false;
    if ((st = ct_shard_plan_build_subset(model, &c.wrap, s->sworld, c.params, &s->plan))) goto fail;
    s->subset = c.params != NULL;
    s->cfg.params = NULL; /* borrowed for the call only */
    if (!(s->units = calloc((size_t)s->plan.nunits, sizeof *s->units)) ||
        !(s->order = calloc((size_t)s->plan.nunits, sizeof *s->order)) ||
        !(s->reduce_order = calloc((size_t)s->plan.nunits, sizeof *s->reduce_order))) {
        st = ct_error_set(CT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < s->plan.nunits && !st; i++) {
        st = setup_unit(s, i);
        if (s->plan.units[i].module == model) s->root = i;
        s->units[i].persistent = s->free_params && s->plan.units[i].numel < c.persistence_threshold;
    }
    /* the parameters' old storage, left in the allocator's cache by the flattening,
     * goes back to the system: a sharded run is about memory */
    ct_storage_cache_clear();
    if (!st && !c.no_broadcast) st = broadcast_state(s);
    if (!st) st = make_groups(s, false, &s->gather_pg);
    if (!st) st = make_groups(s, false, &s->reduce_pg);
    if (!st && s->replicas > 1) st = make_groups(s, true, &s->replica_pg);
    for (int i = 0; i < s->plan.nunits && !st; i++) st = setup_shards(s, i);
    if (st) goto fail;
    /* reductions in the order backward finishes the units: the inner units from the
     * last to the first, the root (whose tied and first-used parameters finish last) at
     * the end */
    int k = 0;
    for (int i = s->plan.nunits - 1; i >= 0; i--)
        if (i != s->root) s->reduce_order[k++] = i;
    if (s->root >= 0) s->reduce_order[k++] = s->root;
    s->shard_ready = true;
    if ((st = cti_shard_grad_hooks_install(s))) goto fail;
    cti_shard_hooks_install(s);
    ct_shard_residency_install(s);
    s->stats.memory.gathered_peak = s->gathered_bytes;
    s->stats.strategy = c.strategy;
    s->stats.units = s->plan.nunits;
    s->stats.numel = s->plan.numel;
    s->stats.padded = s->plan.padded;
    s->stats.shard_world = s->sworld;
    s->stats.replicas = s->replicas;
    s->stats.memory.setup_peak_reserved = ct_storage_peak_reserved_bytes();
    ct_storage_peak_reset();
    return s;
fail:
    ct_error_prefix("shard_new (rank %d of %d, %s): ", rank, world, ct_shard_strategy_name(c.strategy));
    ct_shard_free(s);
    return NULL;
}

/* ---- the optimizer's slices ---------------------------------------------------------- */

static bool is_model_param(const ct_shard *s, const ct_tensor *p)
{
    ct_param_list l = {0};
    bool found = false;
    if (ct_module_named_tensors(s->model, false, &l)) return false;
    for (int i = 0; i < l.n && !found; i++) found = l.tensors[i] == p;
    ct_param_list_free(&l);
    return found;
}

static bool find_param(const ct_shard *s, const ct_tensor *p, int *unit, const ct_shard_param **sp)
{
    for (int i = 0; i < s->plan.nunits; i++)
        for (int k = 0; k < s->plan.units[i].nparams; k++)
            if (s->plan.units[i].params[k].param == p) {
                *unit = i, *sp = &s->plan.units[i].params[k];
                return true;
            }
    return false;
}

ct_status ct_shard_prepare_optimizer(ct_shard *s, ct_optimizer *opt)
{
    if (!s || !opt) return ct_error_set(CT_ERR_INVALID, "shard_prepare_optimizer: NULL argument");
    if (s->slices) return ct_error_set(CT_ERR_INVALID, "shard_prepare_optimizer: an optimizer is prepared already");
    const int n = ct_optimizer_param_count(opt);
    ct_tensor **slices = calloc((size_t)(n ? n : 1), sizeof *slices);
    int *unit = calloc((size_t)(n ? n : 1), sizeof *unit);
    int64_t *off = calloc((size_t)(n ? n : 1), sizeof *off);
    const ct_shard_param **sps = calloc((size_t)(n ? n : 1), sizeof *sps);
    int64_t *range = calloc((size_t)(n ? 2 * n : 2), sizeof *range);
    ct_status st = slices && unit && off && sps && range ? CT_OK : ct_error_set(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !st; i++) {
        const ct_tensor *p = ct_optimizer_param(opt, i);
        const ct_shard_param *sp = NULL;
        int ui = -1;
        char d[200];
        if (!find_param(s, p, &ui, &sp) && s->subset && is_model_param(s, p)) {
            /* left alone (ct_shard_config.params): it stays as it is, with no part */
            if (!(slices[i] = ct_tensor_retain((ct_tensor *)p))) st = ct_last_status();
            unit[i] = -1;
            continue;
        }
        if (!sp) {
            st = ct_error_set(CT_ERR_INVALID,
                              "optimizer parameter %d (%s%s%s%s) is not a parameter of the prepared model: the %s "
                              "strategy shards only what the model holds; register it in the model "
                              "(ct_module_add_param) before prepare, or leave it out of this optimizer",
                              i, p->name ? "'" : "", p->name ? p->name : "", p->name ? "' " : "",
                              ct_tensor_describe(p, d, sizeof d), ct_shard_strategy_name(s->cfg.strategy));
            break;
        }
        const shard_unit *u = &s->units[ui];
        const ct_tensor *base = u->master ? u->master : u->shard;
        int64_t b, e;
        ct_shard_param_slice(u->plan, sp, s->srank, &b, &e);
        sps[i] = sp, range[2 * i] = b, range[2 * i + 1] = e;
        ct_tensor *t;
        if (b == e) { /* this rank's slices miss the parameter */
            t = ct_tensor_empty_on(p->device, base->dtype, 1, (const int64_t[]){0});
            unit[i] = -1;
        } else {
            off[i] = sp->offset + b - (int64_t)s->srank * u->plan->shard;
            t = ct_tensor_from_storage(base->storage, base->dtype, 1, (const int64_t[]){e - b}, NULL,
                                       base->offset + off[i]);
            unit[i] = ui;
        }
        if (!t) st = ct_last_status();
        else if (!(slices[i] = ct_tensor_retain(t)) || (st = ct_tensor_set_requires_grad(slices[i], true))) break;
    }
    if (!st) st = ct_optimizer_replace_params(opt, n, slices);
    if (st) {
        for (int i = 0; slices && i < n; i++) ct_tensor_release(slices[i]);
        free(slices), free(unit), free(off), free(sps), free(range);
        return ct_error_prefix("shard_prepare_optimizer (rank %d): ", s->rank);
    }
    s->slices = slices, s->slice_unit = unit, s->slice_offset = off, s->nslices = n;
    s->slice_param = sps, s->slice_range = range;
    s->opt = opt;
    return CT_OK;
}

ct_tensor *const *ct_shard_slices(const ct_shard *s, int *n)
{
    if (n) *n = s ? s->nslices : 0;
    return s ? s->slices : NULL;
}

ct_status ct_shard_slice_part(const ct_shard *s, int i, const char **name, const ct_tensor **param, int64_t *begin,
                              int64_t *end)
{
    if (!s || !s->slices || i < 0 || i >= s->nslices)
        return ct_error_set(CT_ERR_INVALID, "shard_slice_part: slice %d of %d (prepare an optimizer first)", i,
                            s ? s->nslices : 0);
    /* a parameter left alone (ct_shard_config.params) is its own slice */
    if (name) *name = s->slice_param[i] ? s->slice_param[i]->name : NULL;
    if (param) *param = s->slice_param[i] ? s->slice_param[i]->param : s->slices[i];
    if (begin) *begin = s->slice_range[2 * i];
    if (end) *end = s->slice_range[2 * i + 1];
    return CT_OK;
}

bool ct_shard_writes_parts(const ct_shard *s) { return s && s->rank < s->sworld; }

/* ---- accounting ------------------------------------------------------------------ */

static int64_t nbytes_of(const ct_tensor *t) { return t ? ct_tensor_numel(t) * (int64_t)ct_dtype_size(t->dtype) : 0; }

ct_shard_stats ct_shard_stats_get(const ct_shard *s)
{
    if (!s) return (ct_shard_stats){0};
    ct_shard_stats st = s->stats;
    ct_shard_memory *m = &st.memory;
    m->params = m->grads = m->optimizer = m->master = 0;
    for (int i = 0; i < s->plan.nunits; i++) {
        const shard_unit *u = &s->units[i];
        /* full parameters kept (all but FULL/HYBRID's freed units), slices kept apart */
        m->params += (cti_shard_keeps_full(s, u) ? nbytes_of(u->flat) : 0) + (s->free_params ? nbytes_of(u->shard) : 0);
        m->grads += nbytes_of(u->grad_shard) + nbytes_of(u->flat_grad);
        m->master += nbytes_of(u->master) + nbytes_of(u->master_grad);
    }
    static const char *const adam_keys[] = {"exp_avg", "exp_avg_sq"}, *const sgd_keys[] = {"momentum_buffer"};
    const bool sgd = s->opt && !strcmp(ct_optimizer_name(s->opt), "sgd");
    for (int i = 0; s->opt && i < s->nslices; i++)
        for (int k = 0; k < (sgd ? 1 : 2); k++)
            m->optimizer += nbytes_of(ct_optimizer_state(s->opt, i, sgd ? sgd_keys[k] : adam_keys[k]));
    const int64_t kept = m->params + m->grads + m->optimizer + m->master;
    m->activations = m->step_peak > kept ? m->step_peak - kept : 0;
    return st;
}

const ct_shard_plan *ct_shard_get_plan(const ct_shard *s) { return s ? &s->plan : NULL; }

/* ---- the end ------------------------------------------------------------------------ */

void ct_shard_free(ct_shard *s)
{
    if (!s) return;
    if (s->units) {
        ct_status st = cti_shard_drain(s);
        cti_shard_hooks_remove(s);
        cti_shard_grad_hooks_remove(s);
        ct_shard_residency_remove(s);
        /* the model keeps its values: gather every unit back (collective), f32 from
         * the masters under param_dtype */
        if (!st && !s->failed && !s->detached && s->gather_pg && s->shard_ready) {
            if (s->low) st = ct_shard_gather_full(s);
            else if (s->free_params)
                for (int i = 0; i < s->plan.nunits && !st; i++) st = cti_shard_gather_wait(s, &s->units[i]);
        }
        cti_shard_drain(s);
    }
    for (int i = 0; s->units && i < s->plan.nunits; i++) {
        shard_unit *u = &s->units[i];
        ct_tensor_release(u->flat);
        ct_tensor_release(u->shard);
        ct_tensor_release(u->grad_shard);
        ct_tensor_release(u->flat_grad);
        ct_tensor_release(u->master);
        ct_tensor_release(u->master_grad);
        ct_tensor_release(u->reduced_low);
        ct_tensor_release(u->full32);
    }
    for (int i = 0; i < s->nslices; i++) ct_tensor_release(s->slices[i]);
    free(s->slices), free(s->slice_unit), free(s->slice_offset), free(s->slice_param), free(s->slice_range);
    ct_pg_free(s->gather_pg);
    ct_pg_free(s->reduce_pg);
    ct_pg_free(s->replica_pg);
    ct_shard_plan_free(&s->plan);
    free(s->units), free(s->order), free(s->reduce_order), free(s->iv);
    free(s);
}
