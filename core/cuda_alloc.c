/* The device caching allocator (the rules are in core/cuda_alloc_internal.h).
 *
 * Bookkeeping: every block, live or cached, has a node. Live nodes sit in a hash
 * table keyed by address (free() gets only the pointer); cached nodes in a hash
 * table of free lists keyed by capacity, newest first, each node remembering its
 * stream and the event recorded when it was freed. Steady-state training asks for
 * the same sizes every step, so the lists stay short. */
#include "core/cuda_alloc_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMALL_LIMIT ((size_t)1 << 20)
#define SMALL_ROUND 512
#define LIVE_BUCKETS 4096
#define FREE_BUCKETS 256

typedef struct block {
    void *ptr;
    size_t cap;
    int dev;
    void *stream;
    void *event; /* cached blocks: recorded on stream when freed */
    struct block *next;
} block;

typedef struct dev_counters {
    int64_t allocated, reserved, peak_allocated, peak_reserved;
    int64_t num_allocs, num_device_allocs, num_frees_to_device, num_ooms;
} dev_counters;

struct cti_devmem {
    cti_devmem_backend b;
    pthread_mutex_t lock;
    block *live[LIVE_BUCKETS];
    block *cached[FREE_BUCKETS];
    block *spare_events; /* nodes holding only an idle event, for reuse */
    dev_counters c[CTI_DEVMEM_MAX_DEVICES];
};

size_t cti_devmem_round(size_t n)
{
    if (n <= SMALL_LIMIT) return n == 0 ? SMALL_ROUND : (n + SMALL_ROUND - 1) / SMALL_ROUND * SMALL_ROUND;
    /* 2^e * (4 + m) / 4, the smallest such value >= n */
    int e = 63 - __builtin_clzll((unsigned long long)n);
    for (;; e++) {
        size_t base = (size_t)1 << e;
        for (int m = 0; m < 4; m++) {
            size_t c = base + (base >> 2) * (size_t)m;
            if (c >= n) return c;
        }
    }
}

static size_t live_hash(const void *p) { return ((uintptr_t)p >> 9) % LIVE_BUCKETS; }
static size_t free_hash(size_t cap) { return (cap / SMALL_ROUND) % FREE_BUCKETS; }

cti_devmem *cti_devmem_new(const cti_devmem_backend *b)
{
    cti_devmem *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->b = *b;
    pthread_mutex_init(&a->lock, NULL);
    return a;
}

static void fmt_bytes(int64_t n, char *buf, size_t cap)
{
    if (n >= (int64_t)1 << 30) snprintf(buf, cap, "%.2f GiB", (double)n / (1 << 30));
    else if (n >= 1 << 20) snprintf(buf, cap, "%.2f MiB", (double)n / (1 << 20));
    else if (n >= 1 << 10) snprintf(buf, cap, "%.2f KiB", (double)n / (1 << 10));
    else snprintf(buf, cap, "%lld bytes", (long long)n);
}

/* An idle event for dev (from the spares, or a new one); NULL when none can be made. */
static void *take_event(cti_devmem *a, int dev)
{
    for (block **pp = &a->spare_events; *pp; pp = &(*pp)->next) {
        if ((*pp)->dev == dev) {
            block *n = *pp;
            *pp = n->next;
            void *ev = n->event;
            free(n);
            return ev;
        }
    }
    return a->b.event_create(a->b.ctx, dev);
}

static void give_event(cti_devmem *a, int dev, void *ev)
{
    if (!ev) return;
    block *n = calloc(1, sizeof *n);
    if (!n) {
        a->b.event_destroy(a->b.ctx, ev);
        return;
    }
    n->dev = dev;
    n->event = ev;
    n->next = a->spare_events;
    a->spare_events = n;
}

/* Hands a cached block back to the device (its event waited for first). */
static void release_cached(cti_devmem *a, block *n)
{
    if (n->event) {
        a->b.event_sync(a->b.ctx, n->event);
        give_event(a, n->dev, n->event);
    }
    a->b.raw_free(a->b.ctx, n->dev, n->ptr);
    dev_counters *c = &a->c[n->dev];
    c->reserved -= (int64_t)n->cap;
    c->num_frees_to_device++;
    free(n);
}

/* Returns every cached block of dev (every device when dev < 0). Under the lock. */
static void drop_cache(cti_devmem *a, int dev)
{
    for (int i = 0; i < FREE_BUCKETS; i++) {
        block **pp = &a->cached[i];
        while (*pp) {
            block *n = *pp;
            if (dev >= 0 && n->dev != dev) {
                pp = &n->next;
                continue;
            }
            *pp = n->next;
            release_cached(a, n);
        }
    }
}

/* A cached block of exactly cap on dev that stream may use now: first one of its
 * own stream, else one whose event has finished (a block without an event stays
 * with its stream). Unlinked; NULL when none. */
static block *take_cached(cti_devmem *a, int dev, size_t cap, void *stream)
{
    block **bucket = &a->cached[free_hash(cap)], **other = NULL;
    for (block **pp = bucket; *pp; pp = &(*pp)->next) {
        block *n = *pp;
        if (n->dev != dev || n->cap != cap) continue;
        if (n->stream == stream) {
            *pp = n->next;
            return n;
        }
        if (!other && n->event && a->b.event_done(a->b.ctx, n->event) == 1) other = pp;
    }
    if (!other) return NULL;
    block *n = *other;
    *other = n->next;
    return n;
}

void *cti_devmem_alloc(cti_devmem *a, int dev, size_t n, void *stream, size_t *cap_out, const char *op)
{
    if (dev < 0 || dev >= CTI_DEVMEM_MAX_DEVICES) {
        ct_error_set(CT_ERR_INVALID, "%s: device index %d out of range", op, dev);
        return NULL;
    }
    size_t cap = cti_devmem_round(n);
    pthread_mutex_lock(&a->lock);
    dev_counters *c = &a->c[dev];
    block *b = take_cached(a, dev, cap, stream);
    if (b) {
        if (b->event) give_event(a, dev, b->event);
        b->event = NULL;
    } else {
        void *p = NULL;
        ct_status st = a->b.raw_alloc(a->b.ctx, dev, cap, &p);
        if (st == CT_ERR_NOMEM) {
            /* the device is full: give back what the cache holds and try once more */
            drop_cache(a, -1);
            st = a->b.raw_alloc(a->b.ctx, dev, cap, &p);
        }
        if (st == CT_OK) b = calloc(1, sizeof *b);
        if (!b) {
            char req[32], al[32], rs[32], fr[32], tot[32];
            int64_t free_b = -1, total_b = -1;
            if (st == CT_OK) a->b.raw_free(a->b.ctx, dev, p);
            if (st == CT_OK || st == CT_ERR_NOMEM) {
                c->num_ooms++;
                a->b.mem_info(a->b.ctx, dev, &free_b, &total_b);
                fmt_bytes((int64_t)n, req, sizeof req);
                fmt_bytes(c->allocated, al, sizeof al);
                fmt_bytes(c->reserved, rs, sizeof rs);
                fmt_bytes(free_b, fr, sizeof fr);
                fmt_bytes(total_b, tot, sizeof tot);
                ct_error_set(CT_ERR_NOMEM,
                             "%s: cuda:%d out of memory: tried to allocate %s; ctrain has %s allocated in tensors and %s "
                             "reserved (its cache was emptied and the allocation retried); the device has %s free of %s. "
                             "Free tensors, use a smaller batch, or shard the model (ZeRO-3 / FSDP)",
                             op, dev, req, al, rs, free_b >= 0 ? fr : "?", total_b >= 0 ? tot : "?");
            } else {
                ct_error_prefix("%s: cuda:%d: allocating %zu bytes: ", op, dev, n);
            }
            pthread_mutex_unlock(&a->lock);
            return NULL;
        }
        b->ptr = p;
        b->cap = cap;
        b->dev = dev;
        c->reserved += (int64_t)cap;
        c->num_device_allocs++;
        if (c->reserved > c->peak_reserved) c->peak_reserved = c->reserved;
    }
    b->stream = stream;
    size_t h = live_hash(b->ptr);
    b->next = a->live[h];
    a->live[h] = b;
    c->allocated += (int64_t)cap;
    c->num_allocs++;
    if (c->allocated > c->peak_allocated) c->peak_allocated = c->allocated;
    pthread_mutex_unlock(&a->lock);
    *cap_out = cap;
    return b->ptr;
}

void cti_devmem_free(cti_devmem *a, int dev, void *p)
{
    if (!p) return;
    pthread_mutex_lock(&a->lock);
    block *b = NULL;
    for (block **pp = &a->live[live_hash(p)]; *pp; pp = &(*pp)->next) {
        if ((*pp)->ptr == p && (*pp)->dev == dev) {
            b = *pp;
            *pp = b->next;
            break;
        }
    }
    CT_ASSERT(b != NULL); /* a pointer this allocator did not hand out */
    a->c[dev].allocated -= (int64_t)b->cap;
    /* the event marks the end of the work queued on the block's stream so far:
     * another stream may take the block once it has passed */
    b->event = take_event(a, dev);
    if (b->event && a->b.event_record(a->b.ctx, b->event, b->stream) != CT_OK) {
        give_event(a, dev, b->event);
        b->event = NULL; /* no event: only its own stream may reuse it */
    }
    size_t h = free_hash(b->cap);
    b->next = a->cached[h];
    a->cached[h] = b;
    pthread_mutex_unlock(&a->lock);
}

ct_status cti_devmem_empty_cache(cti_devmem *a)
{
    pthread_mutex_lock(&a->lock);
    drop_cache(a, -1);
    while (a->spare_events) {
        block *n = a->spare_events;
        a->spare_events = n->next;
        a->b.event_destroy(a->b.ctx, n->event);
        free(n);
    }
    pthread_mutex_unlock(&a->lock);
    return CT_OK;
}

void cti_devmem_stats(cti_devmem *a, int dev, ct_cuda_memory_stats *out)
{
    memset(out, 0, sizeof *out);
    if (dev < 0 || dev >= CTI_DEVMEM_MAX_DEVICES) return;
    pthread_mutex_lock(&a->lock);
    const dev_counters *c = &a->c[dev];
    out->allocated = c->allocated;
    out->reserved = c->reserved;
    out->peak_allocated = c->peak_allocated;
    out->peak_reserved = c->peak_reserved;
    out->cached = c->reserved - c->allocated;
    out->num_allocs = c->num_allocs;
    out->num_device_allocs = c->num_device_allocs;
    out->num_frees_to_device = c->num_frees_to_device;
    out->num_ooms = c->num_ooms;
    pthread_mutex_unlock(&a->lock);
}

void cti_devmem_peak_reset(cti_devmem *a, int dev)
{
    if (dev < 0 || dev >= CTI_DEVMEM_MAX_DEVICES) return;
    pthread_mutex_lock(&a->lock);
    a->c[dev].peak_allocated = a->c[dev].allocated;
    a->c[dev].peak_reserved = a->c[dev].reserved;
    pthread_mutex_unlock(&a->lock);
}

void cti_devmem_delete(cti_devmem *a)
{
    if (!a) return;
    cti_devmem_empty_cache(a);
    for (int i = 0; i < LIVE_BUCKETS; i++) {
        while (a->live[i]) {
            block *n = a->live[i];
            a->live[i] = n->next;
            free(n);
        }
    }
    pthread_mutex_destroy(&a->lock);
    free(a);
}
