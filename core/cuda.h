/* ctrain — CUDA devices: availability, streams, events, memory.
 *
 * A tensor on cuda:N lives in that GPU's memory (ct_tensor_empty_on(CT_CUDA(n), ...),
 * ct_tensor_to). Every function here works in every build: where ctrain was built
 * without CUDA, or the machine has no GPU or no driver, ct_cuda_device_count is 0,
 * ct_cuda_unavailable_reason says why, and the functions that need a device return
 * CT_ERR_UNSUPPORTED with that reason.
 *
 * Streams (as in PyTorch): each thread has a current stream per device, which every
 * kernel and copy of that thread is queued on. It starts as the device's default
 * compute stream, shared by all threads; ct_cuda_stream_set makes another current.
 * Work on two streams is ordered only by events (ct_cuda_event_record on one,
 * ct_cuda_event_wait on the other).
 *
 * Errors: every CUDA call is checked. A kernel that fails while running is reported
 * at the next synchronisation (a copy to the host, ct_cuda_synchronize, an event
 * synchronize) with the ops launched since the previous one; CTRAIN_CUDA_SYNC=1 makes
 * every launch synchronous, so the error names the op that caused it.
 */
#ifndef CT_CORE_CUDA_H
#define CT_CORE_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"

/* ---- devices ----------------------------------------------------------------- */

/* The number of usable GPUs (0 when none, or built without CUDA). */
CT_API int ct_cuda_device_count(void);
/* True when at least one GPU can be used. */
CT_API bool ct_cuda_is_available(void);
/* Why no GPU can be used ("built without CUDA (make CUDA=1)", "no CUDA driver: ...",
 * "no GPU: ..."), or NULL when one can. The string is static. */
CT_API const char *ct_cuda_unavailable_reason(void);
/* True when this build has the CUDA backend compiled in (with or without a GPU). */
CT_API bool ct_cuda_built(void);

typedef struct ct_cuda_device_props {
    char name[256];
    int major, minor;        /* compute capability */
    int multiprocessors;
    int64_t total_memory;    /* bytes */
    int64_t free_memory;     /* bytes, at the time of the call */
    int clock_khz;           /* SM clock */
    int memory_clock_khz;
    int memory_bus_width;    /* bits */
    int driver_version;      /* e.g. 13000 */
    int runtime_version;
} ct_cuda_device_props;

/* Fills *out for GPU dev. Errors: no such device, CUDA unavailable. */
CT_API ct_status ct_cuda_device_props_get(int dev, ct_cuda_device_props *out);
/* Waits for all work queued on every stream of GPU dev; reports an asynchronous
 * kernel error (with the ops launched since the last synchronisation). */
CT_API ct_status ct_cuda_synchronize(int dev);

/* TF32 tensor-core math for f32 matmuls: off by default (PyTorch's
 * torch.backends.cuda.matmul.allow_tf32 = False), process-wide. */
CT_API void ct_cuda_set_allow_tf32(bool on);
CT_API bool ct_cuda_allow_tf32(void);

/* ---- streams and events -------------------------------------------------------- */

typedef struct ct_cuda_stream ct_cuda_stream;
typedef struct ct_cuda_event ct_cuda_event;

/* A new stream on GPU dev (non-blocking against the legacy default stream); NULL +
 * error when unavailable. Free with ct_cuda_stream_free after its work is done
 * (free synchronizes it first). */
CT_API ct_cuda_stream *ct_cuda_stream_new(int dev);
CT_API void ct_cuda_stream_free(ct_cuda_stream *s);
/* This thread's current stream on dev (the default compute stream unless set). */
CT_API ct_cuda_stream *ct_cuda_stream_current(int dev);
/* Makes s this thread's current stream on s's device; NULL for a device index
 * restores the default: ct_cuda_stream_reset(dev). */
CT_API ct_status ct_cuda_stream_set(ct_cuda_stream *s);
CT_API void ct_cuda_stream_reset(int dev);
/* Waits for s's queued work; reports an asynchronous error as ct_cuda_synchronize. */
CT_API ct_status ct_cuda_stream_synchronize(ct_cuda_stream *s);
CT_API int ct_cuda_stream_device(const ct_cuda_stream *s);

/* An event (timing disabled unless timing): records a point in a stream's work. */
CT_API ct_cuda_event *ct_cuda_event_new(int dev, bool timing);
CT_API void ct_cuda_event_free(ct_cuda_event *e);
/* Records e at the current end of s's queue (NULL: this thread's current stream). */
CT_API ct_status ct_cuda_event_record(ct_cuda_event *e, ct_cuda_stream *s);
/* Makes s's later work wait for e without blocking the host. */
CT_API ct_status ct_cuda_event_wait(ct_cuda_event *e, ct_cuda_stream *s);
/* 1 when the work before e has finished, 0 when not yet, < 0 on error. */
CT_API int ct_cuda_event_query(ct_cuda_event *e);
CT_API ct_status ct_cuda_event_synchronize(ct_cuda_event *e);
/* Milliseconds between two recorded timing events (both finished). */
CT_API ct_status ct_cuda_event_elapsed(ct_cuda_event *start, ct_cuda_event *end, float *ms);

/* ---- memory -------------------------------------------------------------------- */

/* The caching allocator's counters for one GPU (bytes unless said), as PyTorch's
 * torch.cuda.memory_stats: allocated = in tensors now; reserved = held from the
 * device (allocated + cached); peaks since the last reset. */
typedef struct ct_cuda_memory_stats {
    int64_t allocated, reserved, peak_allocated, peak_reserved;
    int64_t cached;         /* reserved - allocated: free blocks kept for reuse */
    int64_t num_allocs;     /* allocations served */
    int64_t num_device_allocs; /* of which new blocks from the device (cudaMalloc) */
    int64_t num_frees_to_device; /* blocks handed back (empty_cache, OOM retry) */
    int64_t num_ooms;       /* allocations that failed for lack of memory */
} ct_cuda_memory_stats;

CT_API ct_status ct_cuda_memory_stats_get(int dev, ct_cuda_memory_stats *out);
/* Sets the peaks to the current values. */
CT_API void ct_cuda_memory_peak_reset(int dev);
/* Returns every cached free block to the device (blocks with work still queued are
 * waited for first). Tensors keep their memory. */
CT_API ct_status ct_cuda_empty_cache(void);

#ifdef __cplusplus
}
#endif

#endif
