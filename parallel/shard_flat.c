/* ctrain — flat unit buffers (see parallel/shard_flat.h). */
#include "parallel/shard_flat.h"

#include "autograd/autograd.h"
#include "core/frame.h"

/* The unit's zeroed buffer, after checking that its parameters share the first one's
 * dtype and device (and require grad, when grads). NULL + an error naming op otherwise. */
static ct_tensor *unit_buffer(const ct_shard_unit *u, const char *op, bool grads)
{
    if (!u || u->nparams < 1) {
        ct_error_set(CT_ERR_INVALID, "%s: a unit with parameters is required", op);
        return NULL;
    }
    const ct_tensor *p0 = u->params[0].param;
    for (int i = 0; i < u->nparams; i++) {
        const ct_tensor *p = u->params[i].param;
        const bool same = p->dtype == p0->dtype && ct_device_equal(p->device, p0->device);
        if (!same || (grads && !p->requires_grad)) {
            char a[200], b[200];
            if (same)
                ct_error_set(CT_ERR_INVALID, "%s: unit '%s': parameter %s (%s) does not require grad", op, u->name,
                             u->params[i].name, ct_tensor_describe(p, a, sizeof a));
            else
                ct_error_set(CT_ERR_INVALID,
                             "%s: unit '%s' mixes %s (%s) and %s (%s): a flat buffer holds one dtype on one device",
                             op, u->name, u->params[0].name, ct_tensor_describe(p0, a, sizeof a), u->params[i].name,
                             ct_tensor_describe(p, b, sizeof b));
            return NULL;
        }
    }
    ct_tensor *flat = ct_tensor_empty_on(p0->device, p0->dtype, 1, (const int64_t[]){u->padded});
    if (!flat || ct_tensor_fill_(flat, 0)) return NULL;
    return flat;
}

ct_tensor *ct_shard_unit_flatten(const ct_shard_unit *u)
{
    ct_tensor *flat = unit_buffer(u, "shard_unit_flatten", false);
    if (!flat) return NULL;
    /* the checks and the plan's layout leave a rebind only out of memory to fail,
     * and then before it moved anything: earlier parameters stay in the buffer, with
     * their values, which is still a valid state */
    for (int i = 0; i < u->nparams; i++)
        if (ct_tensor_rebind(u->params[i].param, flat, u->params[i].offset)) return NULL;
    return flat;
}

ct_tensor *ct_shard_unit_flat_grads(const ct_shard_unit *u)
{
    ct_tensor *flat = unit_buffer(u, "shard_unit_flat_grads", true);
    if (!flat) return NULL;
    for (int i = 0; i < u->nparams; i++) {
        ct_tensor *p = u->params[i].param;
        ct_tensor *g = ct_tensor_from_storage(flat->storage, flat->dtype, p->ndim, p->shape, NULL,
                                              flat->offset + u->params[i].offset);
        if (!g || (p->grad && ct_tensor_copy_(g, p->grad)) || ct_tensor_set_grad(p, g)) return NULL;
    }
    return flat;
}
