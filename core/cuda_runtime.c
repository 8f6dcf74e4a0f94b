/* CUDA devices: discovery, per-thread current streams, events, error reports.
 *
 * Discovery runs once (cudaGetDeviceCount). The CUDA runtime is linked statically
 * and loads the driver itself, so a machine without a driver or a GPU gets an
 * error code here, which becomes ct_cuda_unavailable_reason, and ctrain stays on
 * the CPU.
 *
 * Asynchronous errors: a kernel that faults while running poisons the context and
 * surfaces at whatever CUDA call comes next. To say which op it was, every launch
 * and library call notes its description in a small ring per device, emptied at
 * each successful synchronisation; the report lists the ring (oldest first).
 * CTRAIN_CUDA_SYNC=1 synchronises after every launch, so the list has one entry.
 */
#include "core/cuda_internal.h"
#include "core/cublaslt_loader.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CT_HAVE_CUDA

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#define CTI_MAX_GPUS 64
#define RING 8

struct ct_cuda_stream {
    int dev;
    cudaStream_t s;
    bool owned; /* false for a device's default stream (never freed) */
};

struct ct_cuda_event {
    int dev;
    cudaEvent_t e;
};

typedef struct dev_state {
    atomic_bool ready; /* initialised (successfully or not), under devices_lock */
    ct_status init_status;
    char init_error[256];
    ct_cuda_stream compute; /* the default stream every thread starts on */
    char ring[RING][160]; /* ops queued since the last synchronisation */
    int ring_next, ring_count;
} dev_state;

static pthread_once_t discover_once = PTHREAD_ONCE_INIT;
static int device_count;
static char unavailable[320];
static bool sync_mode;
static atomic_bool allow_tf32;
static dev_state devices[CTI_MAX_GPUS];
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER; /* every device's ring */

static _Thread_local int current_device = -1;
static _Thread_local ct_cuda_stream *current_stream[CTI_MAX_GPUS];

static void discover(void)
{
    const char *env = getenv("CTRAIN_CUDA_SYNC");
    sync_mode = env && *env && strcmp(env, "0") != 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        if (e == cudaErrorInsufficientDriver)
            snprintf(unavailable, sizeof unavailable,
                     "no CUDA driver: the NVIDIA driver is missing or older than this CUDA %d.%d runtime (%s)",
                     CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, cudaGetErrorName(e));
        else if (e == cudaErrorNoDevice)
            snprintf(unavailable, sizeof unavailable, "no GPU: the CUDA driver reports no device%s%s%s",
                     vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
        else
            snprintf(unavailable, sizeof unavailable, "CUDA unusable: %s (%s)", cudaGetErrorName(e),
                     cudaGetErrorString(e));
        (void)cudaGetLastError();
        n = 0;
    } else if (n == 0) {
        snprintf(unavailable, sizeof unavailable, "no GPU: the CUDA driver reports no device");
    }
    device_count = n > CTI_MAX_GPUS ? CTI_MAX_GPUS : n;
}

int ct_cuda_device_count(void)
{
    pthread_once(&discover_once, discover);
    return device_count;
}

bool ct_cuda_is_available(void) { return ct_cuda_device_count() > 0; }

const char *ct_cuda_unavailable_reason(void) { return ct_cuda_device_count() > 0 ? NULL : unavailable; }

bool ct_cuda_built(void) { return true; }

bool cti_cuda_sync_mode(void)
{
    pthread_once(&discover_once, discover);
    return sync_mode;
}

void ct_cuda_set_allow_tf32(bool on) { atomic_store(&allow_tf32, on); }
bool ct_cuda_allow_tf32(void) { return atomic_load(&allow_tf32); }

/* ---- errors ------------------------------------------------------------------ */

/* Errors that come from a kernel that already ran: the op that returned them is
 * rarely the op that caused them. */
static bool is_async_error(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure: return true;
    default: return false;
    }
}

/* The ring's entries, oldest first, into buf. */
static void ring_list(int dev, char *buf, size_t cap)
{
    buf[0] = 0;
    if (dev < 0 || dev >= CTI_MAX_GPUS) return;
    dev_state *d = &devices[dev];
    pthread_mutex_lock(&ring_lock);
    size_t len = 0;
    for (int i = 0; i < d->ring_count && len + 2 < cap; i++) {
        int k = (d->ring_next - d->ring_count + i + RING) % RING;
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? "; " : "", d->ring[k]);
    }
    pthread_mutex_unlock(&ring_lock);
}

static void ring_clear(int dev)
{
    if (dev < 0 || dev >= CTI_MAX_GPUS) return;
    pthread_mutex_lock(&ring_lock);
    devices[dev].ring_count = 0;
    pthread_mutex_unlock(&ring_lock);
}

void cti_cuda_note_op(const char *op, int dev, const char *what)
{
    if (dev < 0 || dev >= CTI_MAX_GPUS) return;
    dev_state *d = &devices[dev];
    pthread_mutex_lock(&ring_lock);
    snprintf(d->ring[d->ring_next], sizeof d->ring[0], "%s%s%s", op, what && *what ? " " : "", what ? what : "");
    d->ring_next = (d->ring_next + 1) % RING;
    if (d->ring_count < RING) d->ring_count++;
    pthread_mutex_unlock(&ring_lock);
}

ct_status cti_cuda_check(int err, const char *op, int dev, const char *what)
{
    cudaError_t e = (cudaError_t)err;
    if (e == cudaSuccess) return CT_OK;
    const char *sep = what && *what ? " " : "";
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it */
        return ct_error_set(CT_ERR_NOMEM, "%s: CUDA out of memory (%s)%s%s on cuda:%d", op, cudaGetErrorName(e),
                            sep, what ? what : "", dev);
    }
    if (is_async_error(e)) {
        char ops[RING * 160];
        ring_list(dev, ops, sizeof ops);
        return ct_error_set(CT_ERR_DEVICE,
                            "%s: CUDA error %s (%s) on cuda:%d, raised by a kernel that ran earlier; ops queued since "
                            "the last synchronisation: %s (run with CTRAIN_CUDA_SYNC=1 to stop at the failing op). "
                            "The GPU context is unusable after this error",
                            op, cudaGetErrorName(e), cudaGetErrorString(e), dev, *ops ? ops : "(none recorded)");
    }
    return ct_error_set(CT_ERR_DEVICE, "%s: CUDA error %s (%s)%s%s on cuda:%d", op, cudaGetErrorName(e),
                        cudaGetErrorString(e), sep, what ? what : "", dev);
}

ct_status cti_cublas_check(int status, const char *op, int dev, const char *what)
{
    cublasStatus_t s = (cublasStatus_t)status;
    if (s == CUBLAS_STATUS_SUCCESS) return CT_OK;
    const char *sep = what && *what ? " " : "";
    /* a status comes from a cuBLASLt call, so the library is open */
    const cti_cublaslt_api *lt = cti_cublaslt(op);
    return ct_error_set(s == CUBLAS_STATUS_ALLOC_FAILED ? CT_ERR_NOMEM : CT_ERR_DEVICE,
                        "%s: cuBLASLt error %s (%s)%s%s on cuda:%d", op, lt ? lt->GetStatusName(s) : "?",
                        lt ? lt->GetStatusString(s) : "?", sep, what ? what : "", dev);
}

/* ---- devices and streams ---------------------------------------------------- */

static ct_status check_index(int dev, const char *op)
{
    int n = ct_cuda_device_count();
    if (n == 0) return ct_error_set(CT_ERR_UNSUPPORTED, "%s: cuda:%d is not available: %s", op, dev, unavailable);
    if (dev < 0 || dev >= n)
        return ct_error_set(CT_ERR_INVALID, "%s: no device cuda:%d (this machine has %d GPU%s: cuda:0..cuda:%d)", op,
                            dev, n, n == 1 ? "" : "s", n - 1);
    return CT_OK;
}

static void init_device(int dev)
{
    dev_state *d = &devices[dev];
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&d->compute.s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(d->init_error, sizeof d->init_error, "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        d->init_status = CT_ERR_DEVICE;
        (void)cudaGetLastError();
        return;
    }
    d->compute.dev = dev;
    d->compute.owned = false;
    d->init_status = CT_OK;
}

static ct_status ensure_device(int dev, const char *op)
{
    if (check_index(dev, op)) return ct_last_status();
    if (!atomic_load(&devices[dev].ready)) {
        pthread_mutex_lock(&devices_lock);
        if (!atomic_load(&devices[dev].ready)) {
            init_device(dev);
            atomic_store(&devices[dev].ready, true);
        }
        pthread_mutex_unlock(&devices_lock);
    }
    if (devices[dev].init_status)
        return ct_error_set(CT_ERR_DEVICE, "%s: cannot initialise cuda:%d: %s", op, dev, devices[dev].init_error);
    return CT_OK;
}

ct_status cti_cuda_enter(int dev, const char *op)
{
    if (dev == current_device && dev >= 0) return CT_OK;
    if (ensure_device(dev, op)) return ct_last_status();
    if (cti_cuda_check(cudaSetDevice(dev), op, dev, "(cudaSetDevice)")) return ct_last_status();
    current_device = dev;
    return CT_OK;
}

void *cti_cuda_stream(int dev)
{
    if (cti_cuda_enter(dev, "cuda stream")) return NULL;
    return current_stream[dev] ? current_stream[dev]->s : devices[dev].compute.s;
}

void *cti_cuda_default_stream(int dev)
{
    if (ensure_device(dev, "cuda stream")) return NULL;
    return devices[dev].compute.s;
}

ct_cuda_stream *ct_cuda_stream_current(int dev)
{
    if (ensure_device(dev, "cuda_stream_current")) return NULL;
    return current_stream[dev] ? current_stream[dev] : &devices[dev].compute;
}

ct_cuda_stream *ct_cuda_stream_new(int dev)
{
    if (cti_cuda_enter(dev, "cuda_stream_new")) return NULL;
    ct_cuda_stream *s = calloc(1, sizeof *s);
    if (!s) {
        ct_error_set(CT_ERR_NOMEM, "cuda_stream_new: out of host memory");
        return NULL;
    }
    if (cti_cuda_check(cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking), "cuda_stream_new", dev, "")) {
        free(s);
        return NULL;
    }
    s->dev = dev;
    s->owned = true;
    return s;
}

void ct_cuda_stream_free(ct_cuda_stream *s)
{
    if (!s || !s->owned) return;
    if (current_stream[s->dev] == s) current_stream[s->dev] = NULL;
    if (cti_cuda_enter(s->dev, "cuda_stream_free") == CT_OK) {
        (void)cudaStreamSynchronize(s->s);
        (void)cudaStreamDestroy(s->s);
    }
    free(s);
}

ct_status ct_cuda_stream_set(ct_cuda_stream *s)
{
    if (!s) return ct_error_set(CT_ERR_INVALID, "cuda_stream_set: stream is NULL (ct_cuda_stream_reset restores the default)");
    current_stream[s->dev] = s->owned ? s : NULL;
    return CT_OK;
}

void ct_cuda_stream_reset(int dev)
{
    if (dev >= 0 && dev < CTI_MAX_GPUS) current_stream[dev] = NULL;
}

int ct_cuda_stream_device(const ct_cuda_stream *s) { return s ? s->dev : -1; }

ct_status ct_cuda_stream_synchronize(ct_cuda_stream *s)
{
    if (!s) return ct_error_set(CT_ERR_INVALID, "cuda_stream_synchronize: stream is NULL");
    if (cti_cuda_enter(s->dev, "cuda_stream_synchronize")) return ct_last_status();
    if (cti_cuda_check(cudaStreamSynchronize(s->s), "cuda_stream_synchronize", s->dev, "")) return ct_last_status();
    ring_clear(s->dev);
    return CT_OK;
}

ct_status ct_cuda_synchronize(int dev)
{
    if (cti_cuda_enter(dev, "cuda_synchronize")) return ct_last_status();
    if (cti_cuda_check(cudaDeviceSynchronize(), "cuda_synchronize", dev, "")) return ct_last_status();
    ring_clear(dev);
    return CT_OK;
}

ct_status cti_cuda_launched(const char *op, const ct_tensor *t)
{
    char what[200];
    int dev = t ? t->device.index : current_device;
    if (t) ct_tensor_describe(t, what, sizeof what);
    else what[0] = 0;
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && !is_async_error(e))
        return ct_error_set(CT_ERR_DEVICE, "%s: kernel launch failed for %s: %s (%s)", op, what, cudaGetErrorName(e),
                            cudaGetErrorString(e));
    if (e == cudaSuccess) cti_cuda_note_op(op, dev, what);
    if (e != cudaSuccess) return cti_cuda_check(e, op, dev, what);
    if (cti_cuda_sync_mode()) {
        e = cudaStreamSynchronize((cudaStream_t)cti_cuda_stream(dev));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return ct_error_set(CT_ERR_DEVICE, "%s: kernel failed for %s on cuda:%d: %s (%s) (CTRAIN_CUDA_SYNC=1)", op,
                                what, dev, cudaGetErrorName(e), cudaGetErrorString(e));
        }
        ring_clear(dev);
    }
    return CT_OK;
}

/* ---- events ------------------------------------------------------------------- */

ct_cuda_event *ct_cuda_event_new(int dev, bool timing)
{
    if (cti_cuda_enter(dev, "cuda_event_new")) return NULL;
    ct_cuda_event *e = calloc(1, sizeof *e);
    if (!e) {
        ct_error_set(CT_ERR_NOMEM, "cuda_event_new: out of host memory");
        return NULL;
    }
    if (cti_cuda_check(cudaEventCreateWithFlags(&e->e, timing ? cudaEventDefault : cudaEventDisableTiming),
                       "cuda_event_new", dev, "")) {
        free(e);
        return NULL;
    }
    e->dev = dev;
    return e;
}

void ct_cuda_event_free(ct_cuda_event *e)
{
    if (!e) return;
    if (cti_cuda_enter(e->dev, "cuda_event_free") == CT_OK) (void)cudaEventDestroy(e->e);
    free(e);
}

static cudaStream_t stream_or_current(ct_cuda_stream *s, int dev)
{
    return s ? s->s : (cudaStream_t)cti_cuda_stream(dev);
}

ct_status ct_cuda_event_record(ct_cuda_event *e, ct_cuda_stream *s)
{
    if (!e) return ct_error_set(CT_ERR_INVALID, "cuda_event_record: event is NULL");
    if (s && s->dev != e->dev)
        return ct_error_set(CT_ERR_INVALID, "cuda_event_record: event of cuda:%d on a stream of cuda:%d", e->dev, s->dev);
    if (cti_cuda_enter(e->dev, "cuda_event_record")) return ct_last_status();
    return cti_cuda_check(cudaEventRecord(e->e, stream_or_current(s, e->dev)), "cuda_event_record", e->dev, "");
}

ct_status ct_cuda_event_wait(ct_cuda_event *e, ct_cuda_stream *s)
{
    if (!e) return ct_error_set(CT_ERR_INVALID, "cuda_event_wait: event is NULL");
    int dev = s ? s->dev : e->dev;
    if (cti_cuda_enter(dev, "cuda_event_wait")) return ct_last_status();
    return cti_cuda_check(cudaStreamWaitEvent(stream_or_current(s, dev), e->e, 0), "cuda_event_wait", dev, "");
}

int ct_cuda_event_query(ct_cuda_event *e)
{
    if (!e) {
        ct_error_set(CT_ERR_INVALID, "cuda_event_query: event is NULL");
        return -1;
    }
    if (cti_cuda_enter(e->dev, "cuda_event_query")) return -1;
    cudaError_t r = cudaEventQuery(e->e);
    if (r == cudaSuccess) return 1;
    if (r == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    cti_cuda_check(r, "cuda_event_query", e->dev, "");
    return -1;
}

ct_status ct_cuda_event_synchronize(ct_cuda_event *e)
{
    if (!e) return ct_error_set(CT_ERR_INVALID, "cuda_event_synchronize: event is NULL");
    if (cti_cuda_enter(e->dev, "cuda_event_synchronize")) return ct_last_status();
    return cti_cuda_check(cudaEventSynchronize(e->e), "cuda_event_synchronize", e->dev, "");
}

ct_status ct_cuda_event_elapsed(ct_cuda_event *start, ct_cuda_event *end, float *ms)
{
    if (!start || !end || !ms) return ct_error_set(CT_ERR_INVALID, "cuda_event_elapsed: NULL argument");
    if (cti_cuda_enter(start->dev, "cuda_event_elapsed")) return ct_last_status();
    return cti_cuda_check(cudaEventElapsedTime(ms, start->e, end->e), "cuda_event_elapsed", start->dev,
                          "(both events recorded with timing on and finished?)");
}

/* ---- properties ------------------------------------------------------------------ */

ct_status ct_cuda_device_props_get(int dev, ct_cuda_device_props *out)
{
    if (!out) return ct_error_set(CT_ERR_INVALID, "cuda_device_props_get: out is NULL");
    memset(out, 0, sizeof *out);
    if (cti_cuda_enter(dev, "cuda_device_props_get")) return ct_last_status();
    struct cudaDeviceProp p;
    if (cti_cuda_check(cudaGetDeviceProperties(&p, dev), "cuda_device_props_get", dev, "")) return ct_last_status();
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->multiprocessors = p.multiProcessorCount;
    out->total_memory = (int64_t)p.totalGlobalMem;
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, dev) == cudaSuccess) out->clock_khz = v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, dev) == cudaSuccess) out->memory_clock_khz = v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess) out->memory_bus_width = v;
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) out->free_memory = (int64_t)fr;
    (void)cudaDriverGetVersion(&out->driver_version);
    (void)cudaRuntimeGetVersion(&out->runtime_version);
    return CT_OK;
}

#else /* built without CUDA: every entry point says so */

#define NOT_BUILT "built without CUDA (nvcc was not found, or make CUDA=0)"

int ct_cuda_device_count(void) { return 0; }
bool ct_cuda_is_available(void) { return false; }
const char *ct_cuda_unavailable_reason(void) { return "ctrain was " NOT_BUILT; }
bool ct_cuda_built(void) { return false; }
void ct_cuda_set_allow_tf32(bool on) { (void)on; }
bool ct_cuda_allow_tf32(void) { return false; }

static ct_status not_built(const char *op)
{
    return ct_error_set(CT_ERR_UNSUPPORTED, "%s: no CUDA device: ctrain was %s", op, NOT_BUILT);
}

ct_status ct_cuda_device_props_get(int dev, ct_cuda_device_props *out)
{
    (void)dev;
    if (out) memset(out, 0, sizeof *out);
    return not_built("cuda_device_props_get");
}
ct_status ct_cuda_synchronize(int dev)
{
    (void)dev;
    return not_built("cuda_synchronize");
}
ct_cuda_stream *ct_cuda_stream_new(int dev)
{
    (void)dev;
    not_built("cuda_stream_new");
    return NULL;
}
void ct_cuda_stream_free(ct_cuda_stream *s) { (void)s; }
ct_cuda_stream *ct_cuda_stream_current(int dev)
{
    (void)dev;
    not_built("cuda_stream_current");
    return NULL;
}
ct_status ct_cuda_stream_set(ct_cuda_stream *s)
{
    (void)s;
    return not_built("cuda_stream_set");
}
void ct_cuda_stream_reset(int dev) { (void)dev; }
ct_status ct_cuda_stream_synchronize(ct_cuda_stream *s)
{
    (void)s;
    return not_built("cuda_stream_synchronize");
}
int ct_cuda_stream_device(const ct_cuda_stream *s)
{
    (void)s;
    return -1;
}
ct_cuda_event *ct_cuda_event_new(int dev, bool timing)
{
    (void)dev;
    (void)timing;
    not_built("cuda_event_new");
    return NULL;
}
void ct_cuda_event_free(ct_cuda_event *e) { (void)e; }
ct_status ct_cuda_event_record(ct_cuda_event *e, ct_cuda_stream *s)
{
    (void)e;
    (void)s;
    return not_built("cuda_event_record");
}
ct_status ct_cuda_event_wait(ct_cuda_event *e, ct_cuda_stream *s)
{
    (void)e;
    (void)s;
    return not_built("cuda_event_wait");
}
int ct_cuda_event_query(ct_cuda_event *e)
{
    (void)e;
    not_built("cuda_event_query");
    return -1;
}
ct_status ct_cuda_event_synchronize(ct_cuda_event *e)
{
    (void)e;
    return not_built("cuda_event_synchronize");
}
ct_status ct_cuda_event_elapsed(ct_cuda_event *start, ct_cuda_event *end, float *ms)
{
    (void)start;
    (void)end;
    (void)ms;
    return not_built("cuda_event_elapsed");
}

#endif
