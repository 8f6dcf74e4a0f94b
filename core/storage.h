/* ctrain — storage: a refcounted block of device memory that tensors view.
 *
 * CPU storage is 64-byte aligned. A storage either owns its memory (freed when
 * the last reference goes) or wraps a caller's buffer with an optional release
 * callback (a caller's array, an mmap'ed file region).
 */
#ifndef CT_CORE_STORAGE_H
#define CT_CORE_STORAGE_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "core/device.h"
#include "core/error.h"

typedef void (*ct_storage_release_fn)(void *ctx, void *data, size_t nbytes);

/* Who released a storage's memory on purpose, and how to get it back: the sharding
 * engine (parallel/shard.h) frees a unit's gathered parameters between uses and sets
 * this on their storage, so that any read of a parameter -- through a module's
 * forward or not -- gathers the unit again (ct_tensor_data), and what cannot be
 * gathered is an error naming the parameter and the strategy (ct_tensor_require_data)
 * instead of a NULL pointer. */
typedef struct ct_storage_residency {
    /* Gives the storage its memory (and contents) back; called on the thread that
     * reads, only when the storage has none; may refuse (returns the error). */
    ct_status (*materialize)(void *ctx);
    /* "parameter 'fc1.weight' of unit '(root)' (FULL sharding)": for messages. */
    void (*describe)(void *ctx, const void *tensor, char *buf, int cap);
    void *ctx;
} ct_storage_residency;

typedef struct ct_storage {
    int refcount; /* atomic */
    void *data;
    size_t nbytes;
    size_t capacity; /* bytes actually allocated (owned storage; size-class rounded) */
    ct_device device;
    bool owned;                    /* true: ctrain allocated data and frees it */
    ct_storage_release_fn release; /* called for wrapped memory when set */
    void *release_ctx;
    ct_storage_residency residency; /* all NULL: none (see above) */
    bool materializing;             /* materialize is running: no re-entry */
} ct_storage;

#define CT_CPU_ALIGN 64

/* New storage of nbytes, uninitialised, refcount 1 (the caller's). NULL + error on failure. */
CT_API ct_storage *ct_storage_new(ct_device dev, size_t nbytes);
/* Wraps a caller's memory; release (may be NULL) is called when the last reference goes. */
CT_API ct_storage *ct_storage_wrap(ct_device dev, void *data, size_t nbytes, ct_storage_release_fn release,
                            void *ctx);
/* Adds one reference to s. */
CT_API void ct_storage_retain(ct_storage *s);
/* Drops one reference to s (NULL is fine); the last one frees the memory. */
CT_API void ct_storage_release(ct_storage *s);

/* Gives an owned storage nbytes of fresh, uninitialised memory in place of what it
 * had, or with 0 no memory at all (data NULL): the object, and every tensor viewing
 * it, stays. How the sharding engine frees a unit's gathered parameters between uses
 * and gathers them again into the same tensors (FSDP's storage resize). A tensor of a
 * storage without memory has no data (ct_tensor_data is NULL); do not compute with it.
 * Errors: NULL, a wrapped storage, no memory (the old memory is then kept). */
CT_API ct_status ct_storage_resize(ct_storage *s, size_t nbytes);

/* Installs r (copied) on s, or removes it with NULL. The owner of r's ctx removes it
 * before ctx goes. */
CT_API void ct_storage_set_residency(ct_storage *s, const ct_storage_residency *r);
/* Gives s its memory back through its residency when it has none and has one.
 * CT_OK also when there is nothing to do (the caller checks s->data); else the
 * residency's error, or CT_ERR_INVALID (no message) when called from within it. */
CT_API ct_status ct_storage_materialize(ct_storage *s);

/* Bytes of CPU storage currently allocated by ctrain and in use (not wrapped
 * buffers, not the cache): for leak tests. */
CT_API int64_t ct_storage_live_bytes(void);
/* The largest ct_storage_live_bytes since the last ct_storage_peak_reset (which sets
 * it to the current live bytes): a step's peak, for memory accounting. The reserved
 * peak counts the cache too (live + cached bytes, what ctrain holds from the system,
 * as PyTorch's max_memory_reserved beside max_memory_allocated). */
CT_API int64_t ct_storage_peak_bytes(void);
CT_API int64_t ct_storage_peak_reserved_bytes(void);
/* Sets the peak counters to the current live and reserved bytes. */
CT_API void ct_storage_peak_reset(void);
/* Freed blocks of 128 KiB and more are cached for reuse (at most a quarter of physical
 * memory and at least 1 GiB, or CTRAIN_CPU_CACHE_BYTES; 0 turns the cache off). Bytes
 * held now / release all. */
CT_API int64_t ct_storage_cache_bytes(void);
/* Returns every cached free block to the system. */
CT_API void ct_storage_cache_clear(void);

#ifdef __cplusplus
}
#endif

#endif
