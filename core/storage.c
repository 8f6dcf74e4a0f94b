/* CPU storage with a small caching allocator.
 *
 * Large blocks from malloc are fresh mmap'ed pages: every new output of a big
 * kernel would pay first-touch page faults (about 10% of a 1024^3 sgemm on the
 * machines we measured). A training step allocates the same sizes every
 * iteration, so freed blocks of at least CT_CACHE_MIN_BYTES are kept in free
 * lists by size class (4 classes per power of two, so at most 25% slack) and
 * handed out again. The cache holds at most a quarter of physical memory, and at
 * least CT_CACHE_MIN_CAP bytes (CTRAIN_CPU_CACHE_BYTES overrides; 0 disables it):
 * a step's churn (gradients freed by zero_grad, 16-bit weight copies, activations)
 * must fit, or the blocks that do not come back as fresh pages every step; the
 * GPT-2 124M step under bf16 frees ~1.1 GB per step, and a 1 GiB cap cost it 25k
 * page faults (about 4% of the step). ct_storage_cache_clear
 * returns everything to the system. Under AddressSanitizer the cache is off so
 * use-after-free stays visible. */
#include "core/storage.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cuda_internal.h"
#include "core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define CT_CACHE_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CT_CACHE_OFF 1
#endif
#endif

#define CT_CACHE_MIN_BYTES ((size_t)1 << 17)
#define CT_CACHE_MIN_CAP ((int64_t)1 << 30)
#define CT_CACHE_CLASSES 256

typedef struct cached_block {
    struct cached_block *next;
} cached_block;

static _Atomic int64_t live_bytes;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cached_block *cache_lists[CT_CACHE_CLASSES];
static _Atomic int64_t cache_bytes; /* written under cache_lock; read without it for the peak */
static int64_t cache_cap = -1;

int64_t ct_storage_live_bytes(void) { return atomic_load(&live_bytes); }

/* the high-water marks of live_bytes and of live_bytes + cache_bytes since the last
 * reset; only an allocation can raise either (a block moving between use and the cache
 * leaves the sum alone) */
static _Atomic int64_t peak_bytes, peak_reserved;

static void raise_to(_Atomic int64_t *peak, int64_t now)
{
    int64_t p = atomic_load(peak);
    while (now > p && !atomic_compare_exchange_weak(peak, &p, now)) {
    }
}

static void live_add(int64_t n)
{
    int64_t now = atomic_fetch_add(&live_bytes, n) + n;
    raise_to(&peak_bytes, now);
    raise_to(&peak_reserved, now + atomic_load(&cache_bytes));
}

int64_t ct_storage_peak_bytes(void) { return atomic_load(&peak_bytes); }
int64_t ct_storage_peak_reserved_bytes(void) { return atomic_load(&peak_reserved); }

void ct_storage_peak_reset(void)
{
    int64_t live = atomic_load(&live_bytes);
    atomic_store(&peak_bytes, live);
    atomic_store(&peak_reserved, live + atomic_load(&cache_bytes));
}

/* Size class of a request and the capacity every block of that class has:
 * 2^e * (4 + m) / 4 for m in 0..3, the smallest such value >= n. */
static int size_class(size_t n, size_t *cap)
{
    int e = 63 - __builtin_clzll((unsigned long long)n);
    for (;;) {
        size_t base = (size_t)1 << e;
        for (int m = 0; m < 4; m++) {
            size_t c = base + (base >> 2) * (size_t)m;
            if (e >= 2 && c >= n) {
                *cap = c;
                return e * 4 + m;
            }
        }
        e++;
    }
}

static int64_t cache_limit(void)
{
    if (cache_cap < 0) {
#ifdef CT_CACHE_OFF
        cache_cap = 0;
#else
        const char *env = getenv("CTRAIN_CPU_CACHE_BYTES");
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        const int64_t quarter = pages > 0 && page > 0 ? (int64_t)pages * page / 4 : 0;
        cache_cap = env ? strtoll(env, NULL, 10) : (quarter > CT_CACHE_MIN_CAP ? quarter : CT_CACHE_MIN_CAP);
        if (cache_cap < 0) cache_cap = 0;
#endif
    }
    return cache_cap;
}

static void *block_alloc(size_t nbytes, size_t *cap)
{
    *cap = (nbytes + CT_CPU_ALIGN - 1) / CT_CPU_ALIGN * CT_CPU_ALIGN;
    if (*cap == 0) *cap = CT_CPU_ALIGN;
    if (*cap < CT_CACHE_MIN_BYTES) return aligned_alloc(CT_CPU_ALIGN, *cap);
    int cls = size_class(*cap, cap);
    pthread_mutex_lock(&cache_lock);
    cached_block *b = cls < CT_CACHE_CLASSES ? cache_lists[cls] : NULL;
    if (b) {
        cache_lists[cls] = b->next;
        cache_bytes -= (int64_t)*cap;
    }
    pthread_mutex_unlock(&cache_lock);
    return b ? (void *)b : aligned_alloc(CT_CPU_ALIGN, *cap);
}

static void block_free(void *p, size_t cap)
{
    if (cap >= CT_CACHE_MIN_BYTES) {
        size_t c;
        int cls = size_class(cap, &c);
        pthread_mutex_lock(&cache_lock);
        if (cls < CT_CACHE_CLASSES && c == cap && cache_bytes + (int64_t)cap <= cache_limit()) {
            cached_block *b = p;
            b->next = cache_lists[cls];
            cache_lists[cls] = b;
            cache_bytes += (int64_t)cap;
            p = NULL;
        }
        pthread_mutex_unlock(&cache_lock);
    }
    free(p);
}

void ct_storage_cache_clear(void)
{
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < CT_CACHE_CLASSES; i++) {
        while (cache_lists[i]) {
            cached_block *b = cache_lists[i];
            cache_lists[i] = b->next;
            free(b);
        }
    }
    cache_bytes = 0;
    pthread_mutex_unlock(&cache_lock);
}

int64_t ct_storage_cache_bytes(void)
{
    pthread_mutex_lock(&cache_lock);
    int64_t n = cache_bytes;
    pthread_mutex_unlock(&cache_lock);
    return n;
}

/* GPU memory comes from the caching allocator (core/cuda_memory.c) for the
 * calling thread's current stream on that device. */
static void *device_alloc(ct_device dev, size_t nbytes, size_t *cap, const char *op)
{
#ifdef CT_HAVE_CUDA
    if (dev.type == CT_DEVICE_CUDA) return cti_cuda_malloc(dev.index, nbytes, NULL, cap, op);
#endif
    (void)nbytes;
    (void)cap;
    char buf[32];
    if (dev.type == CT_DEVICE_CUDA)
        ct_error_set(CT_ERR_UNSUPPORTED, "%s: %s is not available: %s", op, ct_device_str(dev, buf, sizeof buf),
                     ct_cuda_unavailable_reason());
    else
        ct_error_set(CT_ERR_UNSUPPORTED, "%s: device %s is not available in this build", op,
                     ct_device_str(dev, buf, sizeof buf));
    return NULL;
}

static void device_free(ct_device dev, void *p, size_t cap)
{
#ifdef CT_HAVE_CUDA
    if (dev.type == CT_DEVICE_CUDA) cti_cuda_free(dev.index, p, cap);
#else
    (void)dev;
    (void)p;
    (void)cap;
#endif
}

ct_storage *ct_storage_new(ct_device dev, size_t nbytes)
{
    if (dev.type != CT_DEVICE_CPU) {
        size_t cap = 0;
        ct_storage *s = calloc(1, sizeof *s);
        if (!s) {
            ct_error_set(CT_ERR_NOMEM, "storage_new: out of host memory");
            return NULL;
        }
        if (!(s->data = device_alloc(dev, nbytes, &cap, "storage_new"))) {
            free(s);
            return NULL;
        }
        s->refcount = 1;
        s->owned = true;
        s->nbytes = nbytes;
        s->capacity = cap;
        s->device = dev;
        return s;
    }
    ct_storage *s = calloc(1, sizeof *s);
    size_t cap = 0;
    void *data = s ? block_alloc(nbytes, &cap) : NULL;
    if (!data) {
        free(s);
        ct_error_set(CT_ERR_NOMEM, "storage_new: cannot allocate %zu bytes on cpu", nbytes);
        return NULL;
    }
    s->refcount = 1;
    s->owned = true;
    s->data = data;
    s->nbytes = nbytes;
    s->capacity = cap;
    s->device = dev;
    live_add((int64_t)nbytes);
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

ct_status ct_storage_resize(ct_storage *s, size_t nbytes)
{
    if (!s || !s->owned)
        return ct_error_set(CT_ERR_INVALID, "storage_resize: %s", !s ? "storage is NULL"
                                                                      : "the storage wraps memory it does not own");
    if (nbytes == s->nbytes && (s->data || !nbytes)) return CT_OK;
    if (s->device.type != CT_DEVICE_CPU) {
        size_t cap = 0;
        void *data = nbytes ? device_alloc(s->device, nbytes, &cap, "storage_resize") : NULL;
        if (nbytes && !data) return ct_last_status();
        if (s->data) device_free(s->device, s->data, s->capacity);
        s->data = data;
        s->capacity = cap;
        s->nbytes = nbytes;
        return CT_OK;
    }
    void *data = NULL;
    size_t cap = 0;
    if (nbytes && !(data = block_alloc(nbytes, &cap)))
        return ct_error_set(CT_ERR_NOMEM, "storage_resize: cannot allocate %zu bytes on cpu", nbytes);
    if (s->data) {
        block_free(s->data, s->capacity);
        atomic_fetch_sub(&live_bytes, (int64_t)s->nbytes);
    }
    s->data = data;
    s->capacity = cap;
    s->nbytes = nbytes;
    live_add((int64_t)nbytes);
    return CT_OK;
}

void ct_storage_set_residency(ct_storage *s, const ct_storage_residency *r)
{
    if (s) s->residency = r ? *r : (ct_storage_residency){0};
}

ct_status ct_storage_materialize(ct_storage *s)
{
    if (!s || s->data || !s->residency.materialize) return CT_OK; /* nothing it can do */
    if (s->materializing) return CT_ERR_INVALID;                   /* re-entered: the caller reports */
    s->materializing = true;
    ct_status st = s->residency.materialize(s->residency.ctx);
    s->materializing = false;
    return st;
}

void ct_storage_release(ct_storage *s)
{
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (s->release) {
        s->release(s->release_ctx, s->data, s->nbytes);
    } else if (s->owned && s->data && s->device.type != CT_DEVICE_CPU) {
        device_free(s->device, s->data, s->capacity);
    } else if (s->owned && s->data) {
        block_free(s->data, s->capacity);
        atomic_fetch_sub(&live_bytes, (int64_t)s->nbytes);
    }
    free(s);
}
