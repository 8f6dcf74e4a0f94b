/* ctrain — the sharding engine's state as parts (see parallel/shard_state.h). */
#include "parallel/shard_state.h"

#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "parallel/shard_internal.h"
#include "precision/autocast.h"

ct_status ct_shard_local_parts(const ct_shard *s, ct_shard_part **parts, int *n, bool *writer)
{
    if (!s || !parts || !n) return ct_error_set(CT_ERR_INVALID, "shard_local_parts: NULL argument");
    *parts = NULL, *n = 0;
    if (writer) *writer = s->rank < s->sworld;
    int cap = 0;
    for (int i = 0; i < s->plan.nunits; i++) cap += s->plan.units[i].nparams;
    ct_shard_part *out = calloc((size_t)(cap ? cap : 1), sizeof *out);
    if (!out) return ct_error_set(CT_ERR_NOMEM, "shard_local_parts: out of memory");
    int k = 0;
    for (int i = 0; i < s->plan.nunits; i++) {
        const shard_unit *u = &s->units[i];
        /* the slice's values in f32: the master's, else the compute slice's (widened);
         * detached, the model's own parameters (contiguous, gathered), which the caller
         * may have changed since */
        const ct_tensor *src = u->master ? u->master : u->shard;
        for (int j = 0; j < u->plan->nparams; j++) {
            const ct_shard_param *sp = &u->plan->params[j];
            int64_t b, e;
            ct_shard_param_slice(u->plan, sp, s->srank, &b, &e);
            if (b == e) continue;
            const ct_tensor *from = s->detached ? sp->param : src;
            const int64_t at = s->detached ? b : sp->offset + b - (int64_t)s->srank * u->plan->shard;
            ct_tensor *v = ct_tensor_from_storage(from->storage, from->dtype, 1, (const int64_t[]){e - b}, NULL,
                                                  from->offset + at);
            if (v && v->dtype != CT_DTYPE_F32) v = ct_tensor_cast(v, CT_DTYPE_F32);
            else if (v) v = ct_tensor_clone(v);
            if (!v) {
                free(out);
                return ct_error_prefix("shard_local_parts (rank %d), parameter %s: ", s->rank, sp->name);
            }
            const ct_dtype dt = u->master && !s->detached ? u->master->dtype : sp->param->dtype;
            out[k++] = (ct_shard_part){sp->name, sp->param, dt, b, e, v};
        }
    }
    *parts = out, *n = k;
    return CT_OK;
}

/* ---- loading ------------------------------------------------------------------------ */

/* Every parameter of the plan is in src with the model's shape. */
static ct_status check_source(const ct_shard *s, const ct_shard_source *src)
{
    for (int i = 0; i < s->plan.nunits; i++)
        for (int j = 0; j < s->plan.units[i].nparams; j++) {
            const ct_shard_param *sp = &s->plan.units[i].params[j];
            const ct_tensor *p = sp->param;
            int nd = 0;
            int64_t sh[CT_MAX_DIMS] = {0};
            if (!src->shape(src->ctx, sp->name, &nd, sh))
                return ct_error_set(CT_ERR_INVALID, "parameter '%s' is not in the checkpoint", sp->name);
            if (nd != p->ndim || memcmp(sh, p->shape, (size_t)nd * sizeof *sh)) {
                char a[96], b[96];
                return ct_error_set(CT_ERR_INVALID, "parameter '%s' is %s in the checkpoint but %s in the model",
                                    sp->name, ct_shape_str(nd, sh, a, sizeof a),
                                    ct_shape_str(p->ndim, p->shape, b, sizeof b));
            }
        }
    return CT_OK;
}

/* Unit u's values from src, f32, into a new buffer of the current frame: the whole
 * unit (u->plan->padded elements, padding zero) when whole, else this rank's slice
 * (u->plan->shard elements). */
static ct_tensor *read_unit(const ct_shard *s, const shard_unit *u, const ct_shard_source *src, bool whole)
{
    const ct_shard_unit *pu = u->plan;
    const int64_t lo = whole ? 0 : (int64_t)s->srank * pu->shard, len = whole ? pu->padded : pu->shard;
    ct_tensor *buf = ct_tensor_zeros(CT_DTYPE_F32, 1, (const int64_t[]){len});
    if (!buf) return NULL;
    for (int j = 0; j < pu->nparams; j++) {
        const ct_shard_param *sp = &pu->params[j];
        /* the parameter's elements inside [lo, lo + len) of the unit's layout */
        const int64_t a = sp->offset > lo ? sp->offset : lo;
        const int64_t z = sp->offset + sp->numel < lo + len ? sp->offset + sp->numel : lo + len;
        if (a >= z) continue;
        ct_tensor *dst = ct_tensor_narrow(buf, 0, a - lo, z - a);
        ct_status st = dst ? src->read(src->ctx, sp->name, a - sp->offset, z - sp->offset, dst) : ct_last_status();
        if (st) {
            ct_error_prefix("parameter '%s': ", sp->name);
            return NULL;
        }
    }
    return buf;
}

/* After ct_shard_detach the parameters are plain, full tensors: each is read whole,
 * and written once everything is read. */
static ct_status load_plain(ct_shard *s, const ct_shard_source *src)
{
    int n = 0;
    for (int i = 0; i < s->plan.nunits; i++) n += s->plan.units[i].nparams;
    ct_tensor **got = calloc((size_t)(n ? n : 1), sizeof *got);
    if (!got) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    ct_status st = CT_OK;
    ct_frame_push();
    for (int pass = 0, k = 0; pass < 2 && !st; pass++, k = 0)
        for (int i = 0; i < s->plan.nunits && !st; i++)
            for (int j = 0; j < s->plan.units[i].nparams && !st; j++, k++) {
                const ct_shard_param *sp = &s->plan.units[i].params[j];
                if (pass == 0) {
                    got[k] = ct_tensor_empty(CT_DTYPE_F32, 1, (const int64_t[]){sp->numel});
                    st = got[k] ? src->read(src->ctx, sp->name, 0, sp->numel, got[k]) : ct_last_status();
                    if (st) ct_error_prefix("parameter '%s': ", sp->name);
                } else {
                    ct_tensor *v = ct_tensor_view(got[k], sp->param->ndim, sp->param->shape);
                    st = v ? ct_tensor_copy_(sp->param, v) : ct_last_status();
                }
            }
    ct_frame_pop();
    free(got);
    if (!st) ct_autocast_weights_changed();
    return st;
}

ct_status ct_shard_load_params(ct_shard *s, const ct_shard_source *src)
{
    if (!s || !src || !src->shape || !src->read)
        return ct_error_set(CT_ERR_INVALID, "shard_load_params: NULL argument");
    if (s->failed)
        return ct_error_set(CT_ERR_PEER,
                            "shard_load_params (rank %d): an earlier collective failed; the group is broken", s->rank);
    ct_status st = check_source(s, src);
    if (!st && s->detached) st = load_plain(s, src);
    /* a gather landing later would overwrite the full buffer with the old slice */
    if (!st) st = cti_shard_drain(s);
    if (st || s->detached) return st ? ct_error_prefix("shard_load_params (rank %d): ", s->rank) : CT_OK;
    /* after ct_shard_gather_full under 16-bit parameters: back to the buffers written below */
    cti_shard_leave_full_f32(s);
    ct_tensor **got = calloc((size_t)s->plan.nunits, sizeof *got);
    if (!got) return ct_error_set(CT_ERR_NOMEM, "shard_load_params (rank %d): out of memory", s->rank);
    ct_frame_push();
    for (int i = 0; i < s->plan.nunits && !st; i++) {
        const shard_unit *u = &s->units[i];
        if (!(got[i] = read_unit(s, u, src, !s->free_params || u->gathered))) st = ct_last_status();
    }
    for (int i = 0; i < s->plan.nunits && !st; i++) {
        shard_unit *u = &s->units[i];
        const bool whole = !s->free_params || u->gathered;
        ct_tensor *slice = whole ? ct_tensor_narrow(got[i], 0, (int64_t)s->srank * u->plan->shard, u->plan->shard)
                                 : got[i];
        /* the optimizer's slices are views of the master (CPU offload, 16-bit parameters) or of the compute
         * slice: writing these in place is what makes the next step start from here */
        if (!slice || (u->master && ct_tensor_copy_(u->master, slice)) || ct_tensor_copy_(u->shard, slice) ||
            (whole && ct_tensor_copy_(u->flat, got[i])))
            st = ct_last_status();
    }
    ct_frame_pop();
    free(got);
    if (st) return ct_error_prefix("shard_load_params (rank %d): ", s->rank);
    ct_autocast_weights_changed();
    return CT_OK;
}
