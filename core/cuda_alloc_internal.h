/* ctrain — the device caching allocator's logic (core/cuda_alloc.c), apart from
 * CUDA itself so that the CPU test suite can drive it through a fake device.
 *
 * Blocks come from the device (raw_alloc) in size classes: multiples of 512 bytes
 * up to 1 MiB, then four classes per power of two (at most 25% slack). A freed
 * block goes back to the free list of the stream it was allocated for, with an
 * event recorded on that stream:
 *   - the same stream takes it again at once (its later work is ordered after the
 *     work that used the block);
 *   - another stream takes it only once the event says that work finished;
 *   - when the device refuses an allocation, every cached block is waited for and
 *     returned, and the allocation tried once more; if it fails again, the error
 *     says what was requested and what is allocated, reserved and free.
 * All counters are per device. Thread-safe (one lock). */
#ifndef CT_CORE_CUDA_ALLOC_INTERNAL_H
#define CT_CORE_CUDA_ALLOC_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h>
#include <stdint.h>

#include "core/cuda.h"
#include "core/error.h"

/* The device under the allocator. Events are opaque handles. raw_alloc returns
 * CT_OK, CT_ERR_NOMEM (the device is full: the allocator frees its cache and
 * retries) or another error (recorded by the backend; reported as is). */
typedef struct cti_devmem_backend {
    ct_status (*raw_alloc)(void *ctx, int dev, size_t n, void **out);
    void (*raw_free)(void *ctx, int dev, void *p);
    void *(*event_create)(void *ctx, int dev);
    ct_status (*event_record)(void *ctx, void *ev, void *stream);
    int (*event_done)(void *ctx, void *ev); /* 1 finished, 0 not yet, < 0 error */
    void (*event_sync)(void *ctx, void *ev);
    void (*event_destroy)(void *ctx, void *ev);
    /* free and total bytes of the device, for the out-of-memory message */
    void (*mem_info)(void *ctx, int dev, int64_t *free_bytes, int64_t *total_bytes);
    void *ctx;
} cti_devmem_backend;

typedef struct cti_devmem cti_devmem;

#define CTI_DEVMEM_MAX_DEVICES 64

/* A new allocator over b (copied). NULL when out of host memory. */
cti_devmem *cti_devmem_new(const cti_devmem_backend *b);
/* Returns every cached block to the device and frees the allocator; blocks still
 * in use are leaked to the device (the caller frees them first). */
void cti_devmem_delete(cti_devmem *a);

/* The class capacity a request of n bytes gets (>= n, >= 512). */
size_t cti_devmem_round(size_t n);
/* A block of at least n bytes on dev for stream; *cap its capacity. NULL + error
 * (CT_ERR_NOMEM, naming op, the request and the counters) when the device has no
 * room even after the cache is emptied. */
void *cti_devmem_alloc(cti_devmem *a, int dev, size_t n, void *stream, size_t *cap, const char *op);
/* Gives a block back (p NULL: nothing). p must come from cti_devmem_alloc on dev. */
void cti_devmem_free(cti_devmem *a, int dev, void *p);
/* Waits for and returns every cached block of every device. */
ct_status cti_devmem_empty_cache(cti_devmem *a);
void cti_devmem_stats(cti_devmem *a, int dev, ct_cuda_memory_stats *out);
void cti_devmem_peak_reset(cti_devmem *a, int dev);

#ifdef __cplusplus
}
#endif

#endif
