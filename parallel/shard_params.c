/* ctrain — the sharding engine's parameters: gathering and freeing units, the
 * forward hooks, the node that gathers a unit again for its backward, and prefetch
 * (see parallel/shard.h). */
#include "parallel/shard_internal.h"

#include <pthread.h>
#include <stdio.h>

#include "autograd/autograd.h"
#include "autograd/node.h"
#include "core/frame.h"
#include "core/storage.h"
#include "precision/autocast.h"

#define MAX_GATHERS_IN_FLIGHT 2

static int64_t flat_bytes(const shard_unit *u) { return u->plan->padded * (int64_t)ct_dtype_size(u->flat->dtype); }

ct_status cti_shard_gather_start(ct_shard *s, shard_unit *u)
{
    if (u->gathered || u->gather.work) return CT_OK;
    if (s->failed) return ct_error_set(CT_ERR_PEER, "shard: an earlier collective failed; the group is broken");
    ct_status st = ct_storage_resize(u->flat->storage, (size_t)flat_bytes(u));
    if (st) return ct_error_prefix("shard: gathering unit '%s': ", cti_shard_unit_label(u));
    ct_work *w = ct_pg_allgather(s->gather_pg, u->flat, u->shard);
    if (!w) {
        ct_storage_resize(u->flat->storage, 0);
        return ct_error_prefix("shard: gathering unit '%s': ", cti_shard_unit_label(u));
    }
    u->gather = (shard_op){.work = w, .t_submit = cti_shard_now()};
    s->run_gathers++;
    cti_shard_count_sent(s, flat_bytes(u), s->sworld, 1);
    s->gathered_bytes += flat_bytes(u);
    if (s->gathered_bytes > s->stats.memory.gathered_peak) s->stats.memory.gathered_peak = s->gathered_bytes;
    return CT_OK;
}

ct_status cti_shard_gather_land(ct_shard *s, shard_unit *u)
{
    if (!u->gather.work) return CT_OK;
    ct_status st = cti_shard_op_wait(s, &u->gather);
    if (!st) u->gathered = true;
    return st;
}

ct_status cti_shard_gather_wait(ct_shard *s, shard_unit *u)
{
    if (u->gathered) return CT_OK;
    ct_status st = cti_shard_gather_start(s, u);
    if (!st) st = cti_shard_gather_land(s, u);
    return st ? ct_error_prefix("shard: gathering unit '%s' (rank %d): ", cti_shard_unit_label(u), s->rank) : CT_OK;
}

void cti_shard_reshard(ct_shard *s, shard_unit *u)
{
    if (cti_shard_keeps_full(s, u)) return;
    /* memory under a collective in flight stays until it lands */
    if (cti_shard_gather_land(s, u)) return;
    if (!u->flat->storage->data) return; /* (ct_tensor_data would gather it) */
    ct_storage_resize(u->flat->storage, 0);
    u->gathered = false;
    s->gathered_bytes -= flat_bytes(u);
}

/* All-gathers in flight, and their elements. */
static int gathers_in_flight(const ct_shard *s, int64_t *numel)
{
    int n = 0;
    *numel = 0;
    for (int i = 0; i < s->plan.nunits; i++)
        if (s->units[i].gather.work) n++, *numel += s->units[i].plan->padded;
    return n;
}

/* Position of unit i in the forward order, or -1. */
static int order_pos(const ct_shard *s, int i)
{
    for (int k = 0; k < s->norder; k++)
        if (s->order[k] == i) return k;
    return -1;
}

/* Starts the gather of the unit at forward-order position k (when there is one,
 * fewer than two are in flight, and it keeps to prefetch_bucket elements in flight
 * unless none is): a prefetch, so its failure shows at the wait. */
static void prefetch(ct_shard *s, int k)
{
    if (!s->free_params || !s->order_known || k < 0 || k >= s->norder) return;
    int64_t numel;
    const int n = gathers_in_flight(s, &numel);
    shard_unit *u = &s->units[s->order[k]];
    if (n >= MAX_GATHERS_IN_FLIGHT || (n && s->cfg.prefetch_bucket && numel + u->plan->padded > s->cfg.prefetch_bucket))
        return;
    ct_frame_push();
    cti_shard_gather_start(s, u);
    ct_frame_pop();
}

void cti_shard_prefetch_previous(ct_shard *s, const shard_unit *u) { prefetch(s, order_pos(s, u->index) - 1); }

/* ---- any read of a freed parameter gathers its unit (core/storage.h, residency) --------- */

/* Whatever reads a parameter of u while u is freed -- a layer's forward called
 * directly instead of through the unit's module, a parameter used in a plain C
 * function, a tied weight read by another unit, a backward node -- lands here
 * through ct_tensor_data: the unit is gathered and stays so until its gradients
 * are final (or the step's finish), as the root unit does. Every rank reads the
 * same parameters in the same order, so the all-gathers match as the module
 * hooks' do. */
static ct_status unit_materialize(void *ctx)
{
    shard_unit *u = ctx;
    ct_shard *s = u->engine;
    if (!pthread_equal(pthread_self(), s->thread))
        return ct_error_set(CT_ERR_INVALID, "unit '%s' is read from a thread other than the one that created the %s "
                            "engine: only the training thread gathers parameters", cti_shard_unit_label(u),
                            ct_shard_strategy_name(s->cfg.strategy));
    if (!s->order_known && order_pos(s, u->index) < 0) s->order[s->norder++] = u->index;
    return cti_shard_gather_wait(s, u);
}

static void unit_describe(void *ctx, const void *tensor, char *buf, int cap)
{
    const shard_unit *u = ctx;
    const ct_tensor *t = tensor;
    const char *name = NULL;
    for (int k = 0; k < u->plan->nparams && !name; k++) {
        const ct_tensor *p = u->plan->params[k].param;
        if (t == p || (t->offset >= p->offset && t->offset < p->offset + u->plan->params[k].numel))
            name = u->plan->params[k].name;
    }
    snprintf(buf, (size_t)cap, "parameter '%s' of unit '%s' (%s sharding, rank %d of %d)", name ? name : "?",
             cti_shard_unit_label(u), ct_shard_strategy_name(u->engine->cfg.strategy), u->engine->rank,
             u->engine->world);
}

void ct_shard_residency_install(ct_shard *s)
{
    for (int i = 0; i < s->plan.nunits; i++) {
        shard_unit *u = &s->units[i];
        if (cti_shard_keeps_full(s, u)) continue;
        ct_storage_set_residency(u->flat->storage,
                                 &(ct_storage_residency){.materialize = unit_materialize, .describe = unit_describe,
                                                         .ctx = u});
    }
}

void ct_shard_residency_remove(ct_shard *s)
{
    for (int i = 0; s->units && i < s->plan.nunits; i++)
        if (s->units[i].flat) ct_storage_set_residency(s->units[i].flat->storage, NULL);
}

/* ---- the node that gathers a unit before its backward ----------------------------------- */

typedef struct gate_ctx {
    ct_shard *s;
    int unit;
} gate_ctx;

static ct_status gate_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const gate_ctx *c = ct_node_ctx(n);
    ct_shard *s = c->s;
    ct_status st = cti_shard_gather_wait(s, &s->units[c->unit]);
    if (st) return st;
    if (s->cfg.backward_prefetch == CT_PREFETCH_BACKWARD_PRE) cti_shard_prefetch_previous(s, &s->units[c->unit]);
    gx[0] = gy;
    return CT_OK;
}

/* out, as a new tensor whose node gathers unit u when backward reaches it. */
static ct_tensor *gate(ct_shard *s, shard_unit *u, ct_tensor *out)
{
    ct_tensor *y = ct_detach(out);
    ct_node *n = y ? ct_node_new("shard_gather", gate_backward, 1, &out) : NULL;
    if (!n) return NULL;
    *(gate_ctx *)ct_node_ctx(n) = (gate_ctx){s, u->index};
    return ct_node_attach(n, y) ? NULL : y;
}

/* ---- forward hooks -------------------------------------------------------------------- */

static ct_status pre_forward(ct_module *m, void *data)
{
    (void)m;
    shard_unit *u = data;
    ct_shard *s = u->engine;
    /* after ct_shard_gather_full under param_dtype, computing goes back to 16 bits */
    cti_shard_leave_full_f32(s);
    if (!s->order_known && order_pos(s, u->index) < 0) s->order[s->norder++] = u->index;
    s->pass_open = true; /* the units' counts restart at the first grad-ready hook */
    if (!s->free_params) return CT_OK;
    ct_status st = cti_shard_gather_wait(s, u);
    if (!st && s->cfg.forward_prefetch) prefetch(s, order_pos(s, u->index) + 1);
    return st;
}

static ct_tensor *post_forward(ct_module *m, ct_tensor *out, void *data)
{
    (void)m;
    shard_unit *u = data;
    ct_shard *s = u->engine;
    if (!s->free_params) return out;
    const bool backward_follows = out && out->requires_grad && ct_grad_is_enabled();
    if (u->index == s->root) {
        /* the root's parameters serve the whole forward and backward (its first and
         * last layers): freed when its gradients are final, or now without backward */
        if (!backward_follows) cti_shard_reshard(s, u);
        return out;
    }
    ct_tensor *y = backward_follows ? gate(s, u, out) : out;
    if (!backward_follows || !s->cfg.no_reshard_after_forward) cti_shard_reshard(s, u);
    return y;
}

void cti_shard_hooks_install(ct_shard *s)
{
    for (int i = 0; i < s->plan.nunits; i++)
        ct_module_set_hooks((ct_module *)s->plan.units[i].module,
                            &(ct_module_hooks){.pre = pre_forward, .post = post_forward, .data = &s->units[i]});
}

void cti_shard_hooks_remove(ct_shard *s)
{
    for (int i = 0; s->units && i < s->plan.nunits; i++) ct_module_set_hooks((ct_module *)s->plan.units[i].module, NULL);
}

ct_status cti_shard_unit_point(shard_unit *u, ct_tensor *buf)
{
    for (int k = 0; k < u->plan->nparams; k++) {
        ct_tensor *p = u->plan->params[k].param;
        ct_tensor_zero_grad(p); /* a gradient of the old dtype would not fit */
        ct_status st = ct_tensor_repoint(p, buf, u->plan->params[k].offset);
        if (st) return st;
    }
    return CT_OK;
}

/* param_dtype: every unit's f32 masters all-gathered into a full f32 buffer, and
 * the parameters pointed at it. */
static ct_status gather_full_f32(ct_shard *s)
{
    if (s->full_f32) return CT_OK;
    if (s->failed) return ct_error_set(CT_ERR_PEER, "shard: an earlier collective failed; the group is broken");
    ct_status st = CT_OK;
    ct_frame_push();
    for (int i = 0; i < s->plan.nunits && !st; i++) {
        shard_unit *u = &s->units[i];
        ct_tensor *full = ct_tensor_empty_on(u->master->device, CT_DTYPE_F32, 1, (const int64_t[]){u->plan->padded});
        ct_work *w = full ? ct_pg_allgather(s->gather_pg, full, u->master) : NULL;
        if (!w) {
            st = ct_error_prefix("shard: gathering the f32 parameters of unit '%s': ", cti_shard_unit_label(u));
            break;
        }
        u->full32 = ct_tensor_retain(full);
        u->gather = (shard_op){.work = w, .t_submit = cti_shard_now()};
        cti_shard_count_sent(s, ct_tensor_nbytes(full), s->sworld, 1);
    }
    for (int i = 0; i < s->plan.nunits; i++) {
        ct_status w = cti_shard_op_wait(s, &s->units[i].gather);
        if (!st) st = w;
    }
    for (int i = 0; i < s->plan.nunits && !st; i++) st = cti_shard_unit_point(&s->units[i], s->units[i].full32);
    s->full_f32 = true; /* also on failure: leave_full_f32 points back whatever moved */
    ct_frame_pop();
    ct_autocast_weights_changed();
    return st;
}

void cti_shard_leave_full_f32(ct_shard *s)
{
    if (!s->full_f32) return;
    for (int i = 0; i < s->plan.nunits; i++) {
        shard_unit *u = &s->units[i];
        /* same device, the buffer the parameters came from: nothing to refuse */
        cti_shard_unit_point(u, u->flat);
        ct_tensor_release(u->full32);
        u->full32 = NULL;
    }
    s->full_f32 = false;
    ct_autocast_weights_changed();
}

ct_status ct_shard_gather_full(ct_shard *s)
{
    if (!s) return ct_error_set(CT_ERR_INVALID, "shard_gather_full: engine is NULL");
    if (s->detached) return CT_OK;
    if (s->low) {
        ct_status st = cti_shard_drain(s);
        return st ? st : gather_full_f32(s);
    }
    ct_status st = CT_OK;
    for (int i = 0; i < s->plan.nunits && !st; i++) st = cti_shard_gather_start(s, &s->units[i]);
    for (int i = 0; i < s->plan.nunits && !st; i++) st = cti_shard_gather_wait(s, &s->units[i]);
    return st;
}

void ct_shard_release_full(ct_shard *s)
{
    if (!s || s->detached) return;
    cti_shard_leave_full_f32(s);
    for (int i = 0; i < s->plan.nunits; i++) cti_shard_reshard(s, &s->units[i]);
}

ct_status ct_shard_detach(ct_shard *s)
{
    if (!s) return ct_error_set(CT_ERR_INVALID, "shard_detach: engine is NULL");
    if (s->detached) return CT_OK;
    ct_status st = cti_shard_drain(s);
    if (!st) st = ct_shard_gather_full(s);
    if (st) return ct_error_prefix("shard_detach (rank %d): ", s->rank);
    cti_shard_hooks_remove(s);
    cti_shard_grad_hooks_remove(s);
    ct_shard_residency_remove(s);
    s->detached = true;
    return CT_OK;
}
