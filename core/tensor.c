/* Tensor metadata, lifetime and creation. Views are in core/view.c, copies and
 * casts in core/copy.c, printing in core/print.c. */
#include "core/tensor.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor_internal.h"

void (*cti_autograd_release_hook)(ct_tensor *t);

int64_t ct_tensor_numel(const ct_tensor *t)
{
    if (!t) return 0;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

size_t ct_tensor_nbytes(const ct_tensor *t)
{
    return t ? (size_t)ct_tensor_numel(t) * ct_dtype_size(t->dtype) : 0;
}

bool ct_tensor_is_contiguous(const ct_tensor *t)
{
    if (!t) return false;
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expect) return false;
        expect *= t->shape[d];
    }
    return true;
}

void *ct_tensor_data(const ct_tensor *t)
{
    if (!t || !t->storage) return NULL;
    /* a worker of a parallel region never starts the collective that gathers it */
    if (!t->storage->data && t->storage->residency.materialize && !omp_in_parallel()) {
        ct_frame_push(); /* the residency's temporaries go with it */
        ct_storage_materialize(t->storage);
        ct_frame_pop();
    }
    if (!t->storage->data) return NULL;
    return (char *)t->storage->data + t->offset * (int64_t)ct_dtype_size(t->dtype);
}

ct_status ct_tensor_require_data(const ct_tensor *t, const char *op)
{
    if (!t || !t->storage || t->storage->data || ct_tensor_numel(t) == 0) return CT_OK;
    const ct_storage_residency *r = &t->storage->residency;
    char d[200], who[300] = "";
    ct_tensor_describe(t, d, sizeof d);
    if (r->describe) r->describe(r->ctx, t, who, sizeof who);
    if (!r->materialize)
        return ct_error_set(CT_ERR_INVALID, "%s: %s%s%s%s has no memory: its storage was released (ct_storage_resize "
                            "to 0) and nothing can give it back", op, t->name ? "'" : "", t->name ? t->name : "",
                            t->name ? "' " : "", d);
    ct_frame_push();
    ct_status st = ct_storage_materialize(t->storage);
    ct_frame_pop();
    if (t->storage->data) return CT_OK;
    if (!st) st = CT_ERR_INTERNAL;
    if (st == CT_ERR_INVALID && t->storage->materializing)
        return ct_error_set(st, "%s: %s (%s) was read while it was being gathered", op, who, d);
    return ct_error_prefix("%s: %s (%s) is sharded and could not be gathered: ", op, who[0] ? who : "a tensor", d);
}

const char *ct_shape_str(int ndim, const int64_t *shape, char *buf, int cap)
{
    int n = snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

const char *ct_tensor_describe(const ct_tensor *t, char *buf, int cap)
{
    if (!t) {
        snprintf(buf, cap, "NULL");
        return buf;
    }
    char sh[160], dev[32];
    snprintf(buf, cap, "%s%s %s", ct_dtype_name(t->dtype), ct_shape_str(t->ndim, t->shape, sh, sizeof sh),
             ct_device_str(t->device, dev, sizeof dev));
    return buf;
}

bool ct_tensor_same_shape(const ct_tensor *a, const ct_tensor *b)
{
    if (!a || !b || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

bool ct_broadcast_shape(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout, int64_t *out)
{
    int n = na > nb ? na : nb;
    if (n > CT_MAX_DIMS) return false;
    for (int i = 0; i < n; i++) {
        int64_t a = i < n - na ? 1 : sa[i - (n - na)];
        int64_t b = i < n - nb ? 1 : sb[i - (n - nb)];
        if (a != b && a != 1 && b != 1) return false;
        out[i] = a == 1 ? b : a;
    }
    *nout = n;
    return true;
}

ct_tensor *ct_tensor_retain(ct_tensor *t)
{
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

void ct_tensor_release(ct_tensor *t)
{
    if (!t) return;
    if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    ct_storage_release(t->storage);
    ct_tensor_release(t->grad);
    if ((t->grad_fn || t->grad_hooks) && cti_autograd_release_hook) cti_autograd_release_hook(t);
    free(t->name);
    free(t);
}

ct_status cti_check_shape(const char *op, int ndim, const int64_t *shape)
{
    if (ndim < 0 || ndim > CT_MAX_DIMS)
        return ct_error_set(CT_ERR_INVALID, "%s: %d dims requested, ctrain supports 0..%d", op, ndim,
                            CT_MAX_DIMS);
    if (ndim > 0 && !shape) return ct_error_set(CT_ERR_INVALID, "%s: shape is NULL for %d dims", op, ndim);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            char sh[160];
            return ct_error_set(CT_ERR_INVALID, "%s: negative size in shape %s", op,
                                ct_shape_str(ndim, shape, sh, sizeof sh));
        }
    }
    return CT_OK;
}

/* A fresh header over s (takes over the caller's reference to s), contiguous
 * strides, registered in the current frame. */
ct_tensor *cti_tensor_wrap_storage(ct_storage *s, ct_dtype dt, int ndim, const int64_t *shape)
{
    ct_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        ct_storage_release(s);
        ct_error_set(CT_ERR_NOMEM, "tensor: out of memory for a tensor header");
        return NULL;
    }
    t->refcount = 1;
    t->dtype = dt;
    t->device = s->device;
    t->ndim = ndim;
    t->storage = s;
    t->scale = 1.0f;
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->strides[d] = st;
        st *= shape[d];
    }
    return ct_frame_adopt(t);
}

ct_tensor *ct_tensor_empty_on(ct_device dev, ct_dtype dt, int ndim, const int64_t *shape)
{
    if (!ct_dtype_is_valid(dt)) {
        ct_error_set(CT_ERR_INVALID, "tensor_empty: invalid dtype %d", (int)dt);
        return NULL;
    }
    if (cti_check_shape("tensor_empty", ndim, shape)) return NULL;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] && n > INT64_MAX / 16 / shape[d]) {
            char sh[160];
            ct_error_set(CT_ERR_INVALID, "tensor_empty: shape %s is too large",
                         ct_shape_str(ndim, shape, sh, sizeof sh));
            return NULL;
        }
        n *= shape[d];
    }
    ct_storage *s = ct_storage_new(dev, (size_t)n * ct_dtype_size(dt));
    if (!s) {
        char sh[160];
        ct_error_prefix("tensor_empty(%s%s): ", ct_dtype_name(dt), ct_shape_str(ndim, shape, sh, sizeof sh));
        return NULL;
    }
    return cti_tensor_wrap_storage(s, dt, ndim, shape);
}

ct_tensor *ct_tensor_empty(ct_dtype dt, int ndim, const int64_t *shape)
{
    return ct_tensor_empty_on(CT_CPU, dt, ndim, shape);
}

ct_tensor *ct_tensor_empty_like(const ct_tensor *t)
{
    if (!t) return NULL;
    return ct_tensor_empty_on(t->device, t->dtype, t->ndim, t->shape);
}

ct_tensor *ct_tensor_full(ct_dtype dt, int ndim, const int64_t *shape, double value)
{
    ct_tensor *t = ct_tensor_empty(dt, ndim, shape);
    if (t && ct_tensor_fill_(t, value)) return NULL;
    return t;
}

ct_tensor *ct_tensor_zeros(ct_dtype dt, int ndim, const int64_t *shape)
{
    ct_tensor *t = ct_tensor_empty(dt, ndim, shape);
    if (t) memset(t->storage->data, 0, t->storage->nbytes);
    return t;
}

ct_tensor *ct_tensor_ones(ct_dtype dt, int ndim, const int64_t *shape)
{
    return ct_tensor_full(dt, ndim, shape, 1.0);
}

ct_tensor *ct_tensor_zeros_like(const ct_tensor *t)
{
    if (!t) return NULL;
    if (t->device.type == CT_DEVICE_CPU) return ct_tensor_zeros(t->dtype, t->ndim, t->shape);
    ct_tensor *z = ct_tensor_empty_on(t->device, t->dtype, t->ndim, t->shape);
    return z && ct_tensor_fill_(z, 0.0) == CT_OK ? z : NULL;
}

ct_tensor *ct_tensor_scalar(ct_dtype dt, double value) { return ct_tensor_full(dt, 0, NULL, value); }

ct_tensor *ct_tensor_arange(ct_dtype dt, double start, double end, double step)
{
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
        ct_error_set(CT_ERR_INVALID, "tensor_arange: start %g, end %g, step %g: step must be non-zero and all finite",
                     start, end, step);
        return NULL;
    }
    double len = ceil((end - start) / step);
    int64_t n = len > 0 ? (int64_t)len : 0;
    ct_tensor *t = ct_tensor_empty(dt, CT_SHAPE(n));
    if (!t) return NULL;
    char *p = t->storage->data;
    size_t es = ct_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) ct_scalar_store(dt, p + i * es, start + (double)i * step);
    return t;
}

static ct_tensor *random_fill(const char *op, ct_dtype dt, int ndim, const int64_t *shape, double a, double b,
                              bool normal)
{
    if (!ct_dtype_is_float(dt)) {
        ct_error_set(CT_ERR_INVALID, "%s: dtype %s is not a floating type", op, ct_dtype_name(dt));
        return NULL;
    }
    ct_tensor *t = ct_tensor_empty(dt, ndim, shape);
    if (!t) return NULL;
    int64_t n = ct_tensor_numel(t);
    ct_rng *r = ct_rng_default();
    if (dt == CT_DTYPE_F64) {
        if (normal) ct_rng_normal_f64(r, t->storage->data, n, a, b);
        else ct_rng_uniform_f64(r, t->storage->data, n, a, b);
        return t;
    }
    float *buf = dt == CT_DTYPE_F32 ? t->storage->data : malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!buf) {
        ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
        return NULL;
    }
    if (normal) ct_rng_normal_f32(r, buf, n, (float)a, (float)b);
    else ct_rng_uniform_f32(r, buf, n, (float)a, (float)b);
    if (dt != CT_DTYPE_F32) {
        ct_convert_n(dt, t->storage->data, CT_DTYPE_F32, buf, n, true);
        free(buf);
    }
    return t;
}

ct_tensor *ct_tensor_rand(ct_dtype dt, int ndim, const int64_t *shape, double lo, double hi)
{
    return random_fill("tensor_rand", dt, ndim, shape, lo, hi, false);
}

ct_tensor *ct_tensor_randn(ct_dtype dt, int ndim, const int64_t *shape, double mean, double std)
{
    return random_fill("tensor_randn", dt, ndim, shape, mean, std, true);
}

ct_tensor *ct_tensor_from_data(ct_dtype dt, int ndim, const int64_t *shape, const void *data)
{
    ct_tensor *t = ct_tensor_empty(dt, ndim, shape);
    if (!t) return NULL;
    if (!data && t->storage->nbytes) {
        ct_error_set(CT_ERR_INVALID, "tensor_from_data: data is NULL");
        return NULL;
    }
    if (t->storage->nbytes) memcpy(t->storage->data, data, t->storage->nbytes);
    return t;
}

ct_tensor *ct_tensor_from_buffer(ct_dtype dt, int ndim, const int64_t *shape, void *data,
                                 ct_storage_release_fn release, void *ctx)
{
    if (!ct_dtype_is_valid(dt)) {
        ct_error_set(CT_ERR_INVALID, "tensor_from_buffer: invalid dtype %d", (int)dt);
        return NULL;
    }
    if (cti_check_shape("tensor_from_buffer", ndim, shape)) return NULL;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (!data && n) {
        ct_error_set(CT_ERR_INVALID, "tensor_from_buffer: data is NULL");
        return NULL;
    }
    ct_storage *s = ct_storage_wrap(CT_CPU, data, (size_t)n * ct_dtype_size(dt), release, ctx);
    if (!s) return NULL;
    return cti_tensor_wrap_storage(s, dt, ndim, shape);
}

ct_tensor *ct_tensor_from_storage(ct_storage *s, ct_dtype dt, int ndim, const int64_t *shape,
                                  const int64_t *strides, int64_t offset)
{
    if (!s) {
        ct_error_set(CT_ERR_INVALID, "tensor_from_storage: storage is NULL");
        return NULL;
    }
    if (!ct_dtype_is_valid(dt) || cti_check_shape("tensor_from_storage", ndim, shape)) {
        if (!ct_dtype_is_valid(dt)) ct_error_set(CT_ERR_INVALID, "tensor_from_storage: invalid dtype %d", (int)dt);
        return NULL;
    }
    /* bounds: the lowest and highest element touched must lie in the storage */
    int64_t lo = offset, hi = offset, n = 1;
    for (int d = 0; d < ndim; d++) {
        int64_t st = strides ? strides[d] : 0;
        n *= shape[d];
        if (shape[d] == 0) continue;
        if (st >= 0) hi += st * (shape[d] - 1);
        else lo += st * (shape[d] - 1);
    }
    if (strides == NULL) hi = offset + (n ? n - 1 : 0);
    int64_t cap = (int64_t)(s->nbytes / ct_dtype_size(dt));
    if (n > 0 && (lo < 0 || hi >= cap)) {
        char sh[160];
        ct_error_set(CT_ERR_INVALID,
                     "tensor_from_storage: %s%s at offset %lld reaches elements %lld..%lld outside a storage of %lld",
                     ct_dtype_name(dt), ct_shape_str(ndim, shape, sh, sizeof sh), (long long)offset, (long long)lo,
                     (long long)hi, (long long)cap);
        return NULL;
    }
    ct_storage_retain(s);
    ct_tensor *t = cti_tensor_wrap_storage(s, dt, ndim, shape);
    if (!t) return NULL;
    if (strides)
        for (int d = 0; d < ndim; d++) t->strides[d] = strides[d];
    t->offset = offset;
    return t;
}

ct_status ct_tensor_set_name(ct_tensor *t, const char *name)
{
    if (!t) return ct_error_set(CT_ERR_INVALID, "tensor_set_name: tensor is NULL");
    char *copy = NULL;
    if (name && !(copy = strdup(name))) return ct_error_set(CT_ERR_NOMEM, "tensor_set_name: out of memory");
    free(t->name);
    t->name = copy;
    return CT_OK;
}
