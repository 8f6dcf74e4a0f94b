/* ctrain — rank 0's tensors on every rank (parallel/module_sync_internal.h). */
#include "parallel/module_sync_internal.h"

#include "precision/autocast.h"

ct_status cti_dist_broadcast_tensors(ct_pg *pg, const ct_param_list *l, int first, const char *who)
{
    ct_status st = CT_OK;
    for (int i = first; i < l->n && !st; i++) {
        ct_tensor *t = l->tensors[i];
        if (!ct_tensor_is_contiguous(t)) {
            st = ct_error_set(CT_ERR_INVALID, "%s: %s is not contiguous; it is broadcast in place", who, l->names[i]);
            break;
        }
        ct_work *w = ct_pg_broadcast(pg, t, 0);
        st = w ? ct_work_wait(w) : ct_last_status();
        ct_work_free(w);
        if (st) ct_error_prefix("%s: broadcasting %s from rank 0: ", who, l->names[i]);
    }
    ct_autocast_weights_changed(); /* the tensors were written in place */
    return st;
}
