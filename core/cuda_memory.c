/* GPU memory: the caching allocator over cudaMalloc (logic in core/cuda_alloc.c),
 * its statistics, and the pinned staging buffers that copies between host and
 * device go through.
 *
 * Staging: pageable host memory cannot be read by the copy engine directly, and
 * cudaMemcpyAsync from it silently becomes a synchronous copy through a driver
 * buffer. Instead each device has two pinned 8 MiB buffers used in turn: the host
 * fills one (memcpy) while the engine drains the other, each guarded by an event,
 * so large copies run at the link's rate and a host -> device copy returns as soon
 * as the last chunk is queued. */
#include "core/cuda_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda_alloc_internal.h"

#ifdef CT_HAVE_CUDA

#include <cuda_runtime_api.h>

/* ---- the allocator over CUDA ------------------------------------------------ */

static ct_status raw_alloc(void *ctx, int dev, size_t n, void **out)
{
    (void)ctx;
    if (cti_cuda_enter(dev, "cuda malloc")) return ct_last_status();
    cudaError_t e = cudaMalloc(out, n);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return CT_ERR_NOMEM;
    }
    return cti_cuda_check(e, "cudaMalloc", dev, "");
}

static void raw_free(void *ctx, int dev, void *p)
{
    (void)ctx;
    if (cti_cuda_enter(dev, "cuda free") == CT_OK) (void)cudaFree(p);
}

static void *event_create(void *ctx, int dev)
{
    (void)ctx;
    cudaEvent_t e;
    if (cti_cuda_enter(dev, "cuda event") || cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (void *)e;
}

static ct_status event_record(void *ctx, void *ev, void *stream)
{
    (void)ctx;
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e == cudaSuccess ? CT_OK : CT_ERR_DEVICE;
}

static int event_done(void *ctx, void *ev)
{
    (void)ctx;
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess) return 1;
    (void)cudaGetLastError();
    return e == cudaErrorNotReady ? 0 : -1;
}

static void event_sync(void *ctx, void *ev)
{
    (void)ctx;
    if (cudaEventSynchronize((cudaEvent_t)ev) != cudaSuccess) (void)cudaGetLastError();
}

static void event_destroy(void *ctx, void *ev)
{
    (void)ctx;
    (void)cudaEventDestroy((cudaEvent_t)ev);
}

static void mem_info(void *ctx, int dev, int64_t *free_b, int64_t *total_b)
{
    (void)ctx;
    size_t f = 0, t = 0;
    if (cti_cuda_enter(dev, "cuda mem info") == CT_OK && cudaMemGetInfo(&f, &t) == cudaSuccess) {
        *free_b = (int64_t)f;
        *total_b = (int64_t)t;
    } else {
        (void)cudaGetLastError();
    }
}

static pthread_once_t alloc_once = PTHREAD_ONCE_INIT;
static cti_devmem *allocator;

static void make_allocator(void)
{
    cti_devmem_backend b = {raw_alloc, raw_free, event_create, event_record, event_done,
                            event_sync, event_destroy, mem_info, NULL};
    allocator = cti_devmem_new(&b);
}

static cti_devmem *get_allocator(void)
{
    pthread_once(&alloc_once, make_allocator);
    return allocator;
}

void *cti_cuda_malloc(int dev, size_t n, void *stream, size_t *cap, const char *op)
{
    if (cti_cuda_enter(dev, op)) return NULL;
    cti_devmem *a = get_allocator();
    if (!a) {
        ct_error_set(CT_ERR_NOMEM, "%s: out of host memory for the cuda allocator", op);
        return NULL;
    }
    return cti_devmem_alloc(a, dev, n, stream ? stream : cti_cuda_stream(dev), cap, op);
}

void cti_cuda_free(int dev, void *p, size_t cap)
{
    (void)cap;
    if (p) cti_devmem_free(get_allocator(), dev, p);
}

static ct_status check_dev(int dev, const char *op)
{
    int n = ct_cuda_device_count();
    if (n == 0) return ct_error_set(CT_ERR_UNSUPPORTED, "%s: no GPU: %s", op, ct_cuda_unavailable_reason());
    if (dev < 0 || dev >= n) return ct_error_set(CT_ERR_INVALID, "%s: no device cuda:%d (%d GPUs)", op, dev, n);
    return CT_OK;
}

ct_status ct_cuda_memory_stats_get(int dev, ct_cuda_memory_stats *out)
{
    if (!out) return ct_error_set(CT_ERR_INVALID, "cuda_memory_stats_get: out is NULL");
    memset(out, 0, sizeof *out);
    if (check_dev(dev, "cuda_memory_stats_get")) return ct_last_status();
    cti_devmem_stats(get_allocator(), dev, out);
    return CT_OK;
}

void ct_cuda_memory_peak_reset(int dev)
{
    if (dev >= 0 && dev < ct_cuda_device_count()) cti_devmem_peak_reset(get_allocator(), dev);
}

ct_status ct_cuda_empty_cache(void)
{
    if (ct_cuda_device_count() == 0) return CT_OK; /* nothing cached */
    return cti_devmem_empty_cache(get_allocator());
}

/* ---- pinned staging ------------------------------------------------------------- */

#define STAGE_BYTES ((size_t)8 << 20)

typedef struct stage {
    pthread_mutex_t lock;
    bool ready;
    void *buf[2];
    cudaEvent_t done[2]; /* the engine finished with buf[i] */
} stage;

static stage stages[CTI_DEVMEM_MAX_DEVICES];
static pthread_mutex_t stages_lock = PTHREAD_MUTEX_INITIALIZER;

static stage *get_stage(int dev, const char *op)
{
    stage *s = &stages[dev];
    pthread_mutex_lock(&stages_lock);
    if (!s->ready) {
        pthread_mutex_init(&s->lock, NULL);
        for (int i = 0; i < 2; i++) {
            if (cti_cuda_check(cudaHostAlloc(&s->buf[i], STAGE_BYTES, cudaHostAllocPortable), op, dev,
                               "(pinned staging buffer)") ||
                cti_cuda_check(cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming), op, dev, "")) {
                pthread_mutex_unlock(&stages_lock);
                return NULL;
            }
        }
        s->ready = true;
    }
    pthread_mutex_unlock(&stages_lock);
    return s;
}

ct_status cti_cuda_copy_host(int dev, void *dst, const void *src, size_t n, int dir, void *stream, const char *op)
{
    if (n == 0) return CT_OK;
    if (cti_cuda_enter(dev, op)) return ct_last_status();
    cudaStream_t st = (cudaStream_t)(stream ? stream : cti_cuda_stream(dev));
    stage *s = get_stage(dev, op);
    if (!s) return ct_last_status();
    ct_status rc = CT_OK;
    pthread_mutex_lock(&s->lock);
    if (dir == 0) {
        /* host -> device: fill buffer i (after its previous copy drained), queue it */
        for (size_t off = 0, i = 0; off < n && !rc; off += STAGE_BYTES, i ^= 1) {
            size_t len = n - off < STAGE_BYTES ? n - off : STAGE_BYTES;
            if ((rc = cti_cuda_check(cudaEventSynchronize(s->done[i]), op, dev, "(staging)"))) break;
            memcpy(s->buf[i], (const char *)src + off, len);
            rc = cti_cuda_check(cudaMemcpyAsync((char *)dst + off, s->buf[i], len, cudaMemcpyHostToDevice, st), op,
                                dev, "(host to device copy)");
            if (!rc) rc = cti_cuda_check(cudaEventRecord(s->done[i], st), op, dev, "");
        }
    } else {
        /* device -> host: queue chunk k + 1 before unpacking chunk k */
        size_t nchunks = (n + STAGE_BYTES - 1) / STAGE_BYTES;
        for (size_t k = 0; k <= nchunks && !rc; k++) {
            if (k < nchunks) {
                size_t off = k * STAGE_BYTES, len = n - off < STAGE_BYTES ? n - off : STAGE_BYTES;
                rc = cti_cuda_check(cudaMemcpyAsync(s->buf[k & 1], (const char *)src + off, len,
                                                    cudaMemcpyDeviceToHost, st),
                                    op, dev, "(device to host copy)");
                if (!rc) rc = cti_cuda_check(cudaEventRecord(s->done[k & 1], st), op, dev, "");
            }
            if (!rc && k > 0) {
                size_t j = k - 1, off = j * STAGE_BYTES, len = n - off < STAGE_BYTES ? n - off : STAGE_BYTES;
                rc = cti_cuda_check(cudaEventSynchronize(s->done[j & 1]), op, dev, "(device to host copy)");
                if (!rc) memcpy((char *)dst + off, s->buf[j & 1], len);
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (!rc) cti_cuda_note_op(op, dev, dir == 0 ? "(host to device)" : "(device to host)");
    return rc;
}

#else /* built without CUDA */

ct_status ct_cuda_memory_stats_get(int dev, ct_cuda_memory_stats *out)
{
    (void)dev;
    if (out) memset(out, 0, sizeof *out);
    return ct_error_set(CT_ERR_UNSUPPORTED, "cuda_memory_stats_get: no CUDA device: %s", ct_cuda_unavailable_reason());
}

void ct_cuda_memory_peak_reset(int dev) { (void)dev; }

ct_status ct_cuda_empty_cache(void) { return CT_OK; }

#endif
