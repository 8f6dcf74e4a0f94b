/* Views: new headers over the same storage. Every function checks its
 * arguments against t's shape and names both in the error. */
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "core/tensor_internal.h"

bool cti_dim_normalize(int *dim, int ndim)
{
    int d = *dim < 0 ? *dim + ndim : *dim;
    if (d < 0 || d >= ndim) return false;
    *dim = d;
    return true;
}

ct_tensor *cti_tensor_alias(const ct_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                            int64_t offset)
{
    ct_tensor *v = calloc(1, sizeof *v);
    if (!v) {
        ct_error_set(CT_ERR_NOMEM, "tensor view: out of memory for a tensor header");
        return NULL;
    }
    v->refcount = 1;
    v->dtype = t->dtype;
    v->device = t->device;
    v->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        v->shape[d] = shape[d];
        v->strides[d] = strides[d];
    }
    v->offset = offset;
    v->storage = t->storage;
    ct_storage_retain(t->storage);
    v->scale = t->scale;
    v->amax = t->amax;
    return ct_frame_adopt(v);
}

static ct_tensor *bad_dim(const char *op, const ct_tensor *t, int dim)
{
    char d[200];
    ct_error_set(CT_ERR_INVALID, "%s: dim %d out of range for %s (%d dims)", op, dim,
                 ct_tensor_describe(t, d, sizeof d), t->ndim);
    return NULL;
}

/* Resolves a -1 entry and checks the element count; out gets the final shape. */
static bool resolve_shape(const char *op, const ct_tensor *t, int ndim, const int64_t *shape, int64_t *out)
{
    char d[200], sh[160];
    if (ndim < 0 || ndim > CT_MAX_DIMS || (ndim && !shape)) {
        ct_error_set(CT_ERR_INVALID, "%s: bad target rank %d for %s", op, ndim, ct_tensor_describe(t, d, sizeof d));
        return false;
    }
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1 && infer < 0) {
            infer = i;
        } else if (shape[i] < 0) {
            ct_error_set(CT_ERR_INVALID, "%s: bad target shape %s for %s", op, ct_shape_str(ndim, shape, sh, sizeof sh),
                         ct_tensor_describe(t, d, sizeof d));
            return false;
        } else {
            known *= shape[i];
        }
        out[i] = shape[i];
    }
    int64_t n = ct_tensor_numel(t);
    if (infer >= 0) {
        if (known == 0 || n % known != 0) {
            ct_error_set(CT_ERR_INVALID, "%s: cannot infer -1 in %s for %s (%lld elements)", op,
                         ct_shape_str(ndim, shape, sh, sizeof sh), ct_tensor_describe(t, d, sizeof d), (long long)n);
            return false;
        }
        out[infer] = n / known;
        known *= out[infer];
    }
    if (known != n) {
        ct_error_set(CT_ERR_INVALID, "%s: shape %s has %lld elements, %s has %lld", op,
                     ct_shape_str(ndim, shape, sh, sizeof sh), (long long)known, ct_tensor_describe(t, d, sizeof d),
                     (long long)n);
        return false;
    }
    return true;
}

/* Strides for viewing t with new_shape without a copy, PyTorch's rule: each
 * group of new dims must map onto a run of old dims that is contiguous in
 * memory. Returns false when no such strides exist. */
static bool view_strides(const ct_tensor *t, int ndim, const int64_t *shape, int64_t *strides)
{
    /* drop size-1 old dims; they never constrain the layout */
    int64_t osh[CT_MAX_DIMS], ost[CT_MAX_DIMS];
    int on = 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != 1) {
            osh[on] = t->shape[d];
            ost[on] = t->strides[d];
            on++;
        }
    if (ct_tensor_numel(t) == 0) {
        int64_t st = 1;
        for (int d = ndim - 1; d >= 0; d--) {
            strides[d] = st;
            st *= shape[d] ? shape[d] : 1;
        }
        return true;
    }
    int oi = 0, ni = 0;
    while (ni < ndim) {
        if (shape[ni] == 1) {
            strides[ni] = oi < on ? ost[oi] * osh[oi] : 1;
            ni++;
            continue;
        }
        /* take a chunk of old dims [oi, oj) and new dims [ni, nj) with equal products */
        int64_t op = osh[oi], np = shape[ni];
        int oj = oi + 1, nj = ni + 1;
        while (op != np) {
            if (op < np) op *= osh[oj++];
            else np *= shape[nj++];
        }
        for (int k = oi; k < oj - 1; k++)
            if (ost[k] != ost[k + 1] * osh[k + 1]) return false;
        int64_t st = ost[oj - 1];
        for (int k = nj - 1; k >= ni; k--) {
            strides[k] = st;
            st *= shape[k];
        }
        oi = oj;
        ni = nj;
    }
    return true;
}

ct_tensor *ct_tensor_view(ct_tensor *t, int ndim, const int64_t *shape)
{
    if (!t) return NULL;
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    if (!resolve_shape("tensor_view", t, ndim, shape, sh)) return NULL;
    if (!view_strides(t, ndim, sh, st)) {
        char d[200], s[160];
        ct_error_set(CT_ERR_INVALID,
                     "tensor_view: %s with strides %s cannot be viewed as %s without a copy; use ct_tensor_reshape",
                     ct_tensor_describe(t, d, sizeof d), ct_shape_str(t->ndim, t->strides, s, sizeof s),
                     ct_shape_str(ndim, sh, (char[160]){0}, 160));
        return NULL;
    }
    return cti_tensor_alias(t, ndim, sh, st, t->offset);
}

ct_tensor *ct_tensor_reshape(ct_tensor *t, int ndim, const int64_t *shape)
{
    if (!t) return NULL;
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    if (!resolve_shape("tensor_reshape", t, ndim, shape, sh)) return NULL;
    if (view_strides(t, ndim, sh, st)) return cti_tensor_alias(t, ndim, sh, st, t->offset);
    ct_tensor *c = ct_tensor_contiguous(t);
    return c ? ct_tensor_view(c, ndim, sh) : NULL;
}

ct_tensor *ct_tensor_flatten(ct_tensor *t) { return ct_tensor_reshape(t, CT_SHAPE(-1)); }

ct_tensor *ct_tensor_transpose(ct_tensor *t, int d0, int d1)
{
    if (!t) return NULL;
    if (!cti_dim_normalize(&d0, t->ndim)) return bad_dim("tensor_transpose", t, d0);
    if (!cti_dim_normalize(&d1, t->ndim)) return bad_dim("tensor_transpose", t, d1);
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->strides, sizeof st);
    sh[d0] = t->shape[d1], sh[d1] = t->shape[d0];
    st[d0] = t->strides[d1], st[d1] = t->strides[d0];
    return cti_tensor_alias(t, t->ndim, sh, st, t->offset);
}

ct_tensor *ct_tensor_permute(ct_tensor *t, const int *dims)
{
    if (!t) return NULL;
    if (!dims && t->ndim) {
        ct_error_set(CT_ERR_INVALID, "tensor_permute: dims is NULL");
        return NULL;
    }
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    bool seen[CT_MAX_DIMS] = {0};
    for (int i = 0; i < t->ndim; i++) {
        int d = dims[i];
        if (!cti_dim_normalize(&d, t->ndim) || seen[d]) {
            char s[200];
            ct_error_set(CT_ERR_INVALID, "tensor_permute: dims[%d] = %d is out of range or repeated for %s", i,
                         dims[i], ct_tensor_describe(t, s, sizeof s));
            return NULL;
        }
        seen[d] = true;
        sh[i] = t->shape[d];
        st[i] = t->strides[d];
    }
    return cti_tensor_alias(t, t->ndim, sh, st, t->offset);
}

ct_tensor *ct_tensor_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step)
{
    if (!t) return NULL;
    if (!cti_dim_normalize(&dim, t->ndim)) return bad_dim("tensor_slice", t, dim);
    if (step < 1) {
        char s[200];
        ct_error_set(CT_ERR_INVALID, "tensor_slice: step %lld must be >= 1 (tensor %s)", (long long)step,
                     ct_tensor_describe(t, s, sizeof s));
        return NULL;
    }
    int64_t n = t->shape[dim];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->strides, sizeof st);
    sh[dim] = (end - start + step - 1) / step;
    st[dim] = t->strides[dim] * step;
    return cti_tensor_alias(t, t->ndim, sh, st, t->offset + start * t->strides[dim]);
}

ct_tensor *ct_tensor_narrow(ct_tensor *t, int dim, int64_t start, int64_t length)
{
    if (!t) return NULL;
    if (!cti_dim_normalize(&dim, t->ndim)) return bad_dim("tensor_narrow", t, dim);
    if (start < 0) start += t->shape[dim];
    if (start < 0 || length < 0 || start + length > t->shape[dim]) {
        char s[200];
        ct_error_set(CT_ERR_INVALID, "tensor_narrow: start %lld length %lld exceeds dim %d of %s", (long long)start,
                     (long long)length, dim, ct_tensor_describe(t, s, sizeof s));
        return NULL;
    }
    return ct_tensor_slice(t, dim, start, start + length, 1);
}

ct_tensor *ct_tensor_select(ct_tensor *t, int dim, int64_t index)
{
    if (!t) return NULL;
    if (!cti_dim_normalize(&dim, t->ndim)) return bad_dim("tensor_select", t, dim);
    int64_t i = index < 0 ? index + t->shape[dim] : index;
    if (i < 0 || i >= t->shape[dim]) {
        char s[200];
        ct_error_set(CT_ERR_INVALID, "tensor_select: index %lld out of range for dim %d of %s", (long long)index,
                     dim, ct_tensor_describe(t, s, sizeof s));
        return NULL;
    }
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (d == dim) continue;
        sh[n] = t->shape[d];
        st[n] = t->strides[d];
        n++;
    }
    return cti_tensor_alias(t, n, sh, st, t->offset + i * t->strides[dim]);
}

ct_tensor *ct_tensor_expand(ct_tensor *t, int ndim, const int64_t *shape)
{
    if (!t) return NULL;
    char s[200], sh[160];
    if (ndim < t->ndim || ndim > CT_MAX_DIMS || (ndim && !shape)) {
        ct_error_set(CT_ERR_INVALID, "tensor_expand: cannot expand %s to %d dims", ct_tensor_describe(t, s, sizeof s),
                     ndim);
        return NULL;
    }
    int64_t osh[CT_MAX_DIMS], ost[CT_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int64_t want = shape[d];
        if (d < lead) {
            if (want < 0) goto bad;
            osh[d] = want;
            ost[d] = 0;
            continue;
        }
        int64_t have = t->shape[d - lead];
        if (want == -1 || want == have) {
            osh[d] = have;
            ost[d] = t->strides[d - lead];
        } else if (have == 1 && want >= 0) {
            osh[d] = want;
            ost[d] = 0;
        } else {
            goto bad;
        }
    }
    return cti_tensor_alias(t, ndim, osh, ost, t->offset);
bad:
    ct_error_set(CT_ERR_INVALID, "tensor_expand: cannot broadcast %s to %s", ct_tensor_describe(t, s, sizeof s),
                 ct_shape_str(ndim, shape, sh, sizeof sh));
    return NULL;
}

ct_tensor *ct_tensor_squeeze(ct_tensor *t, int dim)
{
    if (!t) return NULL;
    if (!cti_dim_normalize(&dim, t->ndim)) return bad_dim("tensor_squeeze", t, dim);
    if (t->shape[dim] != 1) {
        char s[200];
        ct_error_set(CT_ERR_INVALID, "tensor_squeeze: dim %d of %s has size %lld, not 1", dim,
                     ct_tensor_describe(t, s, sizeof s), (long long)t->shape[dim]);
        return NULL;
    }
    return ct_tensor_select(t, dim, 0);
}

ct_tensor *ct_tensor_unsqueeze(ct_tensor *t, int dim)
{
    if (!t) return NULL;
    if (t->ndim == CT_MAX_DIMS) {
        char s[200];
        ct_error_set(CT_ERR_INVALID, "tensor_unsqueeze: %s already has the maximum %d dims",
                     ct_tensor_describe(t, s, sizeof s), CT_MAX_DIMS);
        return NULL;
    }
    if (!cti_dim_normalize(&dim, t->ndim + 1)) return bad_dim("tensor_unsqueeze", t, dim);
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    for (int d = 0, s = 0; d <= t->ndim; d++) {
        if (d == dim) {
            sh[d] = 1;
            st[d] = s < t->ndim ? t->strides[s] * t->shape[s] : 1;
        } else {
            sh[d] = t->shape[s];
            st[d] = t->strides[s];
            s++;
        }
    }
    return cti_tensor_alias(t, t->ndim + 1, sh, st, t->offset);
}

ct_status ct_tensor_rebind(ct_tensor *t, ct_tensor *base, int64_t offset)
{
    char a[200], b[200];
    if (!t || !base) return ct_error_set(CT_ERR_INVALID, "tensor_rebind: NULL tensor");
    const int64_t n = ct_tensor_numel(t);
    if (t->dtype != base->dtype || !ct_device_equal(t->device, base->device) || !ct_tensor_is_contiguous(base) ||
        offset < 0 || offset > ct_tensor_numel(base) - n)
        return ct_error_set(CT_ERR_INVALID,
                            "tensor_rebind: %s cannot move to element %lld of %s (needs the same dtype and device, a "
                            "contiguous base and room for %lld elements)",
                            ct_tensor_describe(t, a, sizeof a), (long long)offset,
                            ct_tensor_describe(base, b, sizeof b), (long long)n);
    /* the values first, through a view of the target region (memmove when they overlap) */
    int64_t strides[CT_MAX_DIMS], s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) strides[d] = s, s *= t->shape[d];
    ct_frame_push();
    ct_tensor *region = cti_tensor_alias(base, t->ndim, t->shape, strides, base->offset + offset);
    ct_status st = region ? ct_tensor_copy_(region, t) : ct_last_status();
    ct_frame_pop();
    if (st) return st;
    ct_storage *old = t->storage;
    ct_storage_retain(base->storage);
    t->storage = base->storage;
    t->offset = base->offset + offset;
    for (int d = 0; d < t->ndim; d++) t->strides[d] = strides[d];
    ct_storage_release(old);
    return CT_OK;
}

ct_status ct_tensor_repoint(ct_tensor *t, ct_tensor *base, int64_t offset)
{
    char a[200], b[200];
    if (!t || !base) return ct_error_set(CT_ERR_INVALID, "tensor_repoint: NULL tensor");
    const int64_t n = ct_tensor_numel(t);
    if (!ct_device_equal(t->device, base->device) || !ct_tensor_is_contiguous(base) || offset < 0 ||
        offset > ct_tensor_numel(base) - n || (t->grad && t->grad->dtype != base->dtype))
        return ct_error_set(CT_ERR_INVALID,
                            "tensor_repoint: %s cannot point at element %lld of %s (needs the same device, a "
                            "contiguous base with room for %lld elements, and no gradient of another dtype)",
                            ct_tensor_describe(t, a, sizeof a), (long long)offset,
                            ct_tensor_describe(base, b, sizeof b), (long long)n);
    ct_storage *old = t->storage;
    ct_storage_retain(base->storage);
    t->storage = base->storage;
    t->dtype = base->dtype;
    t->offset = base->offset + offset;
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) t->strides[d] = s, s *= t->shape[d];
    ct_storage_release(old);
    return CT_OK;
}
