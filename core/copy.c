/* Copies, casts and element access. Conversions round to nearest even
 * (core/convert.h); a row that is contiguous in both tensors is converted in
 * one bulk call. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/convert.h"
#include "core/cuda_internal.h"
#include "core/frame.h"
#include "core/iter_internal.h"
#include "core/tensor_internal.h"
#include "core/threads.h"

static ct_status copy_impl(ct_tensor *dst, const ct_tensor *src, bool saturate);

/* dst and src on different devices: src is brought to dst's device as a contiguous
 * tensor of its own dtype (one transfer, staged through pinned memory), then the
 * copy (broadcast, strides, dtype) happens there. */
static ct_status copy_across(ct_tensor *dst, const ct_tensor *src, bool saturate)
{
    ct_status st;
    ct_frame_push();
    ct_tensor *moved = ct_tensor_to(src, dst->device);
    st = moved ? copy_impl(dst, moved, saturate) : ct_last_status();
    ct_frame_pop();
    return st;
}

static ct_status copy_impl(ct_tensor *dst, const ct_tensor *src, bool saturate)
{
    char a[200], b[200];
    if (!dst || !src) return ct_error_set(CT_ERR_INVALID, "tensor_copy_: NULL tensor");
    if (ct_tensor_require_data(src, "tensor_copy_") || ct_tensor_require_data(dst, "tensor_copy_"))
        return ct_last_status();
    if (!ct_device_equal(dst->device, src->device)) return copy_across(dst, src, saturate);
    /* broadcast src to dst's shape without allocating a header in the frame */
    int64_t sst[CT_MAX_DIMS];
    int lead = dst->ndim - src->ndim;
    bool ok = lead >= 0;
    for (int d = 0; ok && d < dst->ndim; d++) {
        if (d < lead) {
            sst[d] = 0;
        } else if (src->shape[d - lead] == dst->shape[d]) {
            sst[d] = src->strides[d - lead];
        } else if (src->shape[d - lead] == 1) {
            sst[d] = 0;
        } else {
            ok = false;
        }
    }
    if (!ok)
        return ct_error_set(CT_ERR_INVALID, "tensor_copy_: cannot broadcast source %s to destination %s",
                            ct_tensor_describe(src, b, sizeof b), ct_tensor_describe(dst, a, sizeof a));
#ifdef CT_HAVE_CUDA
    if (dst->device.type == CT_DEVICE_CUDA) return cti_cuda_copy_strided(dst, src, sst, saturate);
#endif
    const int64_t *strides[2] = {dst->strides, sst};
    ct_iter it;
    cti_iter_init(&it, dst->ndim, dst->shape, 2, strides);
    size_t des = ct_dtype_size(dst->dtype), ses = ct_dtype_size(src->dtype);
    char *dp = ct_tensor_data(dst);
    const char *sp = ct_tensor_data(src);
    bool same = dst->dtype == src->dtype;
    int64_t nrows = it.nrows;
    if (nrows == 1 && it.inner_stride[0] == 1 && it.inner_stride[1] == 1) {
        /* one long contiguous run (the common cast): split it into chunks so that
         * every thread converts a part */
        const int64_t chunk = 1 << 16;
        int64_t n = it.inner, nchunks = (n + chunk - 1) / chunk;
        #pragma omp parallel for num_threads(ct_get_num_threads()) if (nchunks > 1 && dst->storage != src->storage) schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t lo = c * chunk, len = n - lo < chunk ? n - lo : chunk;
            if (same) memmove(dp + lo * (int64_t)des, sp + lo * (int64_t)ses, (size_t)len * des);
            else ct_convert_n(dst->dtype, dp + lo * (int64_t)des, src->dtype, sp + lo * (int64_t)ses, len, saturate);
        }
        return CT_OK;
    }
    #pragma omp parallel for num_threads(ct_get_num_threads()) if (nrows * it.inner > (1 << 16)) schedule(static)
    for (int64_t r = 0; r < nrows; r++) {
        int64_t off[2];
        cti_iter_row(&it, r, off);
        char *d = dp + off[0] * (int64_t)des;
        const char *s = sp + off[1] * (int64_t)ses;
        if (it.inner_stride[0] == 1 && it.inner_stride[1] == 1) {
            if (same) memmove(d, s, (size_t)it.inner * des);
            else ct_convert_n(dst->dtype, d, src->dtype, s, it.inner, saturate);
            continue;
        }
        for (int64_t i = 0; i < it.inner; i++) {
            char *de = d + i * it.inner_stride[0] * (int64_t)des;
            const char *se = s + i * it.inner_stride[1] * (int64_t)ses;
            if (same) memcpy(de, se, des);
            else ct_convert_n(dst->dtype, de, src->dtype, se, 1, saturate);
        }
    }
    return CT_OK;
}

ct_status ct_tensor_copy_(ct_tensor *dst, const ct_tensor *src) { return copy_impl(dst, src, false); }

static ct_tensor *cast_impl(const ct_tensor *t, ct_dtype dt, bool saturate)
{
    if (!t) return NULL;
    ct_tensor *out = ct_tensor_empty_on(t->device, dt, t->ndim, t->shape);
    if (!out) return NULL;
    if (copy_impl(out, t, saturate)) return NULL;
    return out;
}

ct_tensor *ct_tensor_cast(const ct_tensor *t, ct_dtype dt) { return cast_impl(t, dt, false); }

ct_tensor *ct_tensor_cast_saturate(const ct_tensor *t, ct_dtype dt) { return cast_impl(t, dt, true); }

ct_tensor *ct_tensor_clone(const ct_tensor *t) { return t ? cast_impl(t, t->dtype, false) : NULL; }

ct_tensor *ct_tensor_contiguous(ct_tensor *t)
{
    if (!t) return NULL;
    if (ct_tensor_is_contiguous(t)) return ct_frame_adopt(ct_tensor_retain(t));
    return ct_tensor_clone(t);
}

ct_status ct_tensor_fill_(ct_tensor *t, double value)
{
    if (!t) return ct_error_set(CT_ERR_INVALID, "tensor_fill_: tensor is NULL");
    if (ct_tensor_require_data(t, "tensor_fill_")) return ct_last_status();
#ifdef CT_HAVE_CUDA
    if (t->device.type == CT_DEVICE_CUDA) return cti_cuda_fill(t, value);
#endif
    if (t->device.type != CT_DEVICE_CPU)
        return ct_error_set(CT_ERR_UNSUPPORTED, "tensor_fill_: no fill for this device in this build");
    unsigned char one[8];
    ct_scalar_store(t->dtype, one, value);
    size_t es = ct_dtype_size(t->dtype);
    const int64_t *strides[1] = {t->strides};
    ct_iter it;
    cti_iter_init(&it, t->ndim, t->shape, 1, strides);
    char *base = ct_tensor_data(t);
    for (int64_t r = 0; r < it.nrows; r++) {
        int64_t off;
        cti_iter_row(&it, r, &off);
        char *p = base + off * (int64_t)es;
        for (int64_t i = 0; i < it.inner; i++) memcpy(p + i * it.inner_stride[0] * (int64_t)es, one, es);
    }
    return CT_OK;
}

/* The address of an element (on t's device), or NULL + error. */
static char *element_ptr(const char *op, const ct_tensor *t, const int64_t *index)
{
    if (!t) {
        ct_error_set(CT_ERR_INVALID, "%s: tensor is NULL", op);
        return NULL;
    }
    int64_t off = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        if (index[d] < 0 || index[d] >= t->shape[d]) {
            char s[200];
            ct_error_set(CT_ERR_INVALID, "%s: index %lld out of range for dim %d of %s", op, (long long)index[d], d,
                         ct_tensor_describe(t, s, sizeof s));
            return NULL;
        }
        off += index[d] * t->strides[d];
    }
    if (ct_tensor_require_data(t, op)) return NULL;
    return (char *)t->storage->data + off * (int64_t)ct_dtype_size(t->dtype);
}

/* One element between a GPU and the host (dir 1: read, 0: write). A read waits
 * for the work queued before it, as PyTorch's .item() does. */
static ct_status element_transfer(const char *op, const ct_tensor *t, void *host, const char *dev_ptr, int dir)
{
#ifdef CT_HAVE_CUDA
    if (t->device.type == CT_DEVICE_CUDA)
        return dir ? cti_cuda_copy_host(t->device.index, host, dev_ptr, ct_dtype_size(t->dtype), 1, NULL, op)
                   : cti_cuda_copy_host(t->device.index, (void *)dev_ptr, host, ct_dtype_size(t->dtype), 0, NULL, op);
#endif
    (void)host;
    (void)dev_ptr;
    (void)dir;
    char d[32];
    return ct_error_set(CT_ERR_UNSUPPORTED, "%s: no element access on %s in this build", op,
                        ct_device_str(t->device, d, sizeof d));
}

double ct_tensor_get(const ct_tensor *t, const int64_t *index)
{
    const char *p = element_ptr("tensor_get", t, index);
    if (!p) return NAN;
    if (t->device.type == CT_DEVICE_CPU) return ct_scalar_load(t->dtype, p);
    unsigned char one[8];
    return element_transfer("tensor_get", t, one, p, 1) ? NAN : ct_scalar_load(t->dtype, one);
}

ct_status ct_tensor_set(ct_tensor *t, const int64_t *index, double value)
{
    char *p = element_ptr("tensor_set", t, index);
    if (!p) return ct_last_status();
    if (t->device.type == CT_DEVICE_CPU) {
        ct_scalar_store(t->dtype, p, value);
        return CT_OK;
    }
    unsigned char one[8];
    ct_scalar_store(t->dtype, one, value);
    return element_transfer("tensor_set", t, one, p, 0);
}

double ct_tensor_item(const ct_tensor *t)
{
    if (!t) return NAN;
    if (ct_tensor_numel(t) != 1) {
        char s[200];
        ct_error_set(CT_ERR_INVALID, "tensor_item: %s has %lld elements, not 1", ct_tensor_describe(t, s, sizeof s),
                     (long long)ct_tensor_numel(t));
        return NAN;
    }
    int64_t zero[CT_MAX_DIMS] = {0};
    return ct_tensor_get(t, zero);
}

/* Moves the bytes of contiguous src into contiguous dst of the same dtype and
 * shape on another device. */
static ct_status transfer(ct_tensor *dst, const ct_tensor *src)
{
    size_t n = ct_tensor_nbytes(src);
#ifdef CT_HAVE_CUDA
    if (src->device.type == CT_DEVICE_CPU && dst->device.type == CT_DEVICE_CUDA)
        return cti_cuda_copy_host(dst->device.index, ct_tensor_data(dst), ct_tensor_data(src), n, 0, NULL, "tensor_to");
    if (src->device.type == CT_DEVICE_CUDA && dst->device.type == CT_DEVICE_CPU)
        return cti_cuda_copy_host(src->device.index, ct_tensor_data(dst), ct_tensor_data(src), n, 1, NULL, "tensor_to");
    if (src->device.type == CT_DEVICE_CUDA && dst->device.type == CT_DEVICE_CUDA)
        return cti_cuda_copy_strided(dst, src, src->strides, false);
#endif
    (void)n;
    char a[200], b[200];
    return ct_error_set(CT_ERR_UNSUPPORTED, "tensor_to: cannot move %s to %s in this build",
                        ct_tensor_describe(src, a, sizeof a), ct_tensor_describe(dst, b, sizeof b));
}

ct_tensor *ct_tensor_to(const ct_tensor *t, ct_device dev)
{
    if (!t) return NULL;
    if (ct_device_equal(t->device, dev)) return ct_frame_adopt(ct_tensor_retain((ct_tensor *)t));
    if (ct_tensor_require_data(t, "tensor_to")) return NULL;
    ct_tensor *out = NULL;
    ct_frame_push();
    const ct_tensor *src = ct_tensor_is_contiguous(t) ? t : ct_tensor_clone(t);
    ct_tensor *dst = src ? ct_tensor_empty_on(dev, t->dtype, t->ndim, t->shape) : NULL;
    if (dst && transfer(dst, src) == CT_OK) {
        dst->requires_grad = t->requires_grad;
        dst->scale = t->scale; /* an fp8 tensor's scale and amax are part of its value */
        dst->amax = t->amax;
        out = ct_keep(dst);
    }
    ct_frame_pop();
    if (!out) {
        char a[200], d[32];
        ct_error_prefix("tensor_to(%s -> %s): ", ct_tensor_describe(t, a, sizeof a), ct_device_str(dev, d, sizeof d));
    }
    return out;
}
