#include "core/storage.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static _Atomic int64_t live_bytes;

int64_t ct_storage_live_bytes(void) { return atomic_load(&live_bytes); }

ct_storage *ct_storage_new(ct_device dev, size_t nbytes)
{
    if (dev.type != CT_DEVICE_CPU) {
        char buf[32];
        ct_error_set(CT_ERR_UNSUPPORTED, "storage_new: device %s is not available in this build",
                     ct_device_str(dev, buf, sizeof buf));
        return NULL;
    }
    ct_storage *s = calloc(1, sizeof *s);
    /* aligned_alloc needs a size that is a multiple of the alignment; a zero-size
     * storage still gets a valid, unique pointer. */
    size_t cap = (nbytes + CT_CPU_ALIGN - 1) / CT_CPU_ALIGN * CT_CPU_ALIGN;
    if (cap == 0) cap = CT_CPU_ALIGN;
    void *data = s ? aligned_alloc(CT_CPU_ALIGN, cap) : NULL;
    if (!data) {
        free(s);
        ct_error_set(CT_ERR_NOMEM, "storage_new: cannot allocate %zu bytes on cpu", nbytes);
        return NULL;
    }
    s->refcount = 1;
    s->owned = true;
    s->data = data;
    s->nbytes = nbytes;
    s->device = dev;
    atomic_fetch_add(&live_bytes, (int64_t)nbytes);
    return s;
}

ct_storage *ct_storage_wrap(ct_device dev, void *data, size_t nbytes, ct_storage_release_fn release,
                            void *ctx)
{
    ct_storage *s = calloc(1, sizeof *s);
    if (!s) {
        ct_error_set(CT_ERR_NOMEM, "storage_wrap: out of memory");
        return NULL;
    }
    s->refcount = 1;
    s->data = data;
    s->nbytes = nbytes;
    s->device = dev;
    s->release = release;
    s->release_ctx = ctx;
    return s;
}

void ct_storage_retain(ct_storage *s)
{
    if (s) __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
}

void ct_storage_release(ct_storage *s)
{
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (s->release) {
        s->release(s->release_ctx, s->data, s->nbytes);
    } else if (s->owned) {
        free(s->data);
        atomic_fetch_sub(&live_bytes, (int64_t)s->nbytes);
    }
    free(s);
}
