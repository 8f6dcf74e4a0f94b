/* The dataset handle: argument checks shared by every implementation, so a
 * callback may write into its rows without checking again. */
#include "data/dataset.h"

#include <stddef.h>

#include "core/device.h"

ct_status ct_dataset_init(ct_dataset *ds, const ct_dataset_vtable *vt, int nslots,
                          const ct_dataset_slot *slots)
{
    if (!ds || !vt || !slots)
        return ct_error_set(CT_ERR_INVALID, "dataset_init: %s is NULL",
                            !ds ? "ds" : !vt ? "vtable" : "slots");
    const char *name = vt->type_name ? vt->type_name : "dataset";
    if (!vt->len || !vt->get)
        return ct_error_set(CT_ERR_INVALID, "dataset_init '%s': vtable.%s is NULL (len and get are required)",
                            name, !vt->len ? "len" : "get");
    if (nslots < 1 || nslots > CT_DATASET_MAX_SLOTS)
        return ct_error_set(CT_ERR_INVALID, "dataset_init '%s': nslots = %d, must be 1 .. %d", name,
                            nslots, CT_DATASET_MAX_SLOTS);
    for (int k = 0; k < nslots; k++) {
        const ct_dataset_slot *s = &slots[k];
        if (!ct_dtype_is_valid(s->dtype))
            return ct_error_set(CT_ERR_INVALID, "dataset_init '%s': slot %d has invalid dtype %d", name, k,
                                (int)s->dtype);
        if (s->ndim < 0 || s->ndim > CT_MAX_DIMS - 1)
            return ct_error_set(CT_ERR_INVALID, "dataset_init '%s': slot %d has ndim %d, must be 0 .. %d", name,
                                k, s->ndim, CT_MAX_DIMS - 1);
        for (int d = 0; d < s->ndim; d++)
            if (s->shape[d] < 0)
                return ct_error_set(CT_ERR_INVALID, "dataset_init '%s': slot %d has size %lld in dim %d", name,
                                    k, (long long)s->shape[d], d);
    }
    *ds = (ct_dataset){.vt = vt, .nslots = nslots};
    for (int k = 0; k < nslots; k++) ds->slots[k] = slots[k];
    return CT_OK;
}

const char *ct_dataset_name(const ct_dataset *ds)
{
    return ds && ds->vt && ds->vt->type_name ? ds->vt->type_name : "dataset";
}

int64_t ct_dataset_len(const ct_dataset *ds)
{
    if (!ds || !ds->vt) {
        ct_error_set(CT_ERR_INVALID, "dataset_len: dataset is NULL or not initialised");
        return -1;
    }
    return ds->vt->len(ds);
}

int ct_dataset_batch_shape(const ct_dataset *ds, int k, int64_t batch, int64_t *shape)
{
    const ct_dataset_slot *s = &ds->slots[k];
    shape[0] = batch;
    for (int d = 0; d < s->ndim; d++) shape[1 + d] = s->shape[d];
    return s->ndim + 1;
}

void *ct_dataset_row(ct_tensor *t, int64_t row)
{
    return (char *)ct_tensor_data(t) + (size_t)(row * t->strides[0]) * ct_dtype_size(t->dtype);
}

/* The per-item dims (1 ..) of t are packed row-major, so one row is one block of
 * memory; dims of size 1 may carry any stride. */
static bool rows_contiguous(const ct_tensor *t)
{
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 1; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expect) return false;
        expect *= t->shape[d];
    }
    return true;
}

ct_status ct_dataset_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out_slots, int64_t row)
{
    if (!ds || !ds->vt) return ct_error_set(CT_ERR_INVALID, "dataset_get: dataset is NULL or not initialised");
    const char *name = ct_dataset_name(ds);
    int64_t n = ds->vt->len(ds);
    if (i < 0 || i >= n)
        return ct_error_set(CT_ERR_INVALID, "dataset_get '%s': item %lld out of range [0, %lld)", name,
                            (long long)i, (long long)n);
    if (!out_slots) return ct_error_set(CT_ERR_INVALID, "dataset_get '%s': out_slots is NULL", name);
    for (int k = 0; k < ds->nslots; k++) {
        const ct_dataset_slot *s = &ds->slots[k];
        ct_tensor *t = out_slots[k];
        char got[128], want[128];
        int64_t shape[CT_MAX_DIMS];
        int nd = ct_dataset_batch_shape(ds, k, t ? t->shape[0] : 0, shape);
        bool ok = t && t->device.type == CT_DEVICE_CPU && t->dtype == s->dtype && t->ndim == nd;
        for (int d = 1; ok && d < nd; d++) ok = t->shape[d] == shape[d];
        if (!ok) {
            /* shape text with B in front, the rest from the slot */
            char sh[96];
            int len = snprintf(sh, sizeof sh, "[B");
            for (int d = 1; d < nd && len < (int)sizeof sh; d++)
                len += snprintf(sh + len, sizeof sh - (size_t)len, ", %lld", (long long)shape[d]);
            if (len < (int)sizeof sh) snprintf(sh + len, sizeof sh - (size_t)len, "]");
            snprintf(want, sizeof want, "%s%s cpu", ct_dtype_name(s->dtype), sh);
            return ct_error_set(CT_ERR_INVALID, "dataset_get '%s': slot %d is %s, expected %s", name, k,
                                ct_tensor_describe(t, got, sizeof got), want);
        }
        if (row < 0 || row >= t->shape[0])
            return ct_error_set(CT_ERR_INVALID, "dataset_get '%s': row %lld out of range for slot %d %s", name,
                                (long long)row, k, ct_tensor_describe(t, got, sizeof got));
        if (!rows_contiguous(t))
            return ct_error_set(CT_ERR_INVALID,
                                "dataset_get '%s': slot %d %s must have each row laid out contiguously", name, k,
                                ct_tensor_describe(t, got, sizeof got));
    }
    return ds->vt->get(ds, i, out_slots, row);
}

void ct_dataset_free(ct_dataset *ds)
{
    if (ds && ds->vt && ds->vt->free) ds->vt->free(ds);
}
