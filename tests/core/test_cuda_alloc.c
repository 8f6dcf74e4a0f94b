/* Tests for the device caching allocator's rules (core/cuda_alloc.c), driven through
 * a fake device so that they run on every machine: size classes, reuse on the
 * freeing stream, reuse by another stream only after the freeing stream's event has
 * passed, the out-of-memory path (cache emptied, retried, then a message with the
 * counters), statistics and empty_cache. The same allocator over cudaMalloc is
 * checked on a GPU by tests/core/test_cuda_gpu.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda_alloc_internal.h"

/* A device with a byte budget; events complete when the test says so. */
typedef struct fake_event {
    bool done;
    bool recorded;
    void *stream;
} fake_event;

typedef struct fake_dev {
    int64_t capacity, used;
    int raw_allocs, raw_frees, events_made, syncs;
    fake_event events[64];
} fake_dev;

static ct_status f_alloc(void *ctx, int dev, size_t n, void **out)
{
    fake_dev *f = ctx;
    (void)dev;
    if (f->used + (int64_t)n > f->capacity) return CT_ERR_NOMEM;
    f->used += (int64_t)n;
    f->raw_allocs++;
    /* remember the size in front of the block so that free can give it back */
    size_t *p = malloc(n + 16);
    p[0] = n;
    *out = p + 2;
    return CT_OK;
}

static void f_free(void *ctx, int dev, void *p)
{
    fake_dev *f = ctx;
    (void)dev;
    size_t *h = (size_t *)p - 2;
    f->used -= (int64_t)h[0];
    f->raw_frees++;
    free(h);
}

static void *f_event_create(void *ctx, int dev)
{
    fake_dev *f = ctx;
    (void)dev;
    cr_assert_lt(f->events_made, 64);
    return &f->events[f->events_made++];
}

static ct_status f_event_record(void *ctx, void *ev, void *stream)
{
    (void)ctx;
    fake_event *e = ev;
    e->recorded = true;
    e->done = false;
    e->stream = stream;
    return CT_OK;
}

static int f_event_done(void *ctx, void *ev)
{
    (void)ctx;
    return ((fake_event *)ev)->done ? 1 : 0;
}

static void f_event_sync(void *ctx, void *ev)
{
    ((fake_dev *)ctx)->syncs++;
    ((fake_event *)ev)->done = true;
}

static void f_event_destroy(void *ctx, void *ev)
{
    (void)ctx;
    (void)ev;
}

static void f_mem_info(void *ctx, int dev, int64_t *fr, int64_t *tot)
{
    fake_dev *f = ctx;
    (void)dev;
    *fr = f->capacity - f->used;
    *tot = f->capacity;
}

static cti_devmem *fake_allocator(fake_dev *f, int64_t capacity)
{
    memset(f, 0, sizeof *f);
    f->capacity = capacity;
    cti_devmem_backend b = {f_alloc, f_free, f_event_create, f_event_record, f_event_done,
                            f_event_sync, f_event_destroy, f_mem_info, f};
    return cti_devmem_new(&b);
}

/* the fake event recorded for the block freed last (events are handed out in order) */
static void finish_all_events(fake_dev *f)
{
    for (int i = 0; i < f->events_made; i++) f->events[i].done = true;
}

#define S1 ((void *)0x1001)
#define S2 ((void *)0x1002)

Test(cuda_alloc, size_classes)
{
    cr_assert_eq(cti_devmem_round(0), 512u);
    cr_assert_eq(cti_devmem_round(1), 512u);
    cr_assert_eq(cti_devmem_round(512), 512u);
    cr_assert_eq(cti_devmem_round(513), 1024u);
    cr_assert_eq(cti_devmem_round(1 << 20), 1u << 20);
    /* above 1 MiB: 2^e * {1, 1.25, 1.5, 1.75} */
    cr_assert_eq(cti_devmem_round((1 << 20) + 1), (1u << 20) + (1u << 18));
    cr_assert_eq(cti_devmem_round(3u << 20), (3u << 20));
    cr_assert_eq(cti_devmem_round((7u << 20) + 1), 8u << 20);
    for (size_t n = 1; n < ((size_t)1 << 34); n = n * 3 + 7) {
        size_t c = cti_devmem_round(n);
        cr_assert_geq(c, n);
        cr_assert_leq((double)c, n <= (1 << 20) ? (double)n + 512 : (double)n * 1.25 + 1, "class of %zu is %zu", n, c);
    }
}

Test(cuda_alloc, same_stream_reuses_at_once_and_counts)
{
    fake_dev f;
    cti_devmem *a = fake_allocator(&f, 1 << 30);
    size_t cap = 0;
    void *p = cti_devmem_alloc(a, 0, 1000, S1, &cap, "test");
    cr_assert_not_null(p);
    cr_assert_eq(cap, 1024u);
    ct_cuda_memory_stats s;
    cti_devmem_stats(a, 0, &s);
    cr_assert_eq(s.allocated, 1024);
    cr_assert_eq(s.reserved, 1024);
    cr_assert_eq(s.num_device_allocs, 1);
    cti_devmem_free(a, 0, p);
    cti_devmem_stats(a, 0, &s);
    cr_assert_eq(s.allocated, 0);
    cr_assert_eq(s.reserved, 1024, "kept in the cache");
    cr_assert_eq(s.cached, 1024);
    /* the event of the free has not passed, yet the same stream takes the block */
    void *q = cti_devmem_alloc(a, 0, 900, S1, &cap, "test");
    cr_assert_eq(q, p, "same class, same stream: the cached block");
    cti_devmem_stats(a, 0, &s);
    cr_assert_eq(s.num_device_allocs, 1, "no new device allocation");
    cr_assert_eq(s.num_allocs, 2);
    cr_assert_eq(s.peak_allocated, 1024);
    cti_devmem_free(a, 0, q);
    cti_devmem_delete(a);
    cr_assert_eq(f.used, 0, "delete hands everything back");
}

Test(cuda_alloc, another_stream_waits_for_the_event)
{
    fake_dev f;
    cti_devmem *a = fake_allocator(&f, 1 << 30);
    size_t cap;
    void *p = cti_devmem_alloc(a, 0, 4096, S1, &cap, "test");
    cti_devmem_free(a, 0, p);
    cr_assert(f.events[0].recorded && f.events[0].stream == S1, "an event recorded on the freeing stream");
    void *q = cti_devmem_alloc(a, 0, 4096, S2, &cap, "test");
    cr_assert_neq(q, p, "S1's work may still use the block: S2 gets a new one");
    cti_devmem_free(a, 0, q); /* back to S2's list */
    finish_all_events(&f);
    void *r = cti_devmem_alloc(a, 0, 4096, (void *)0x1003, &cap, "test");
    cr_assert(r == p || r == q, "once the events passed, a third stream may take a cached block");
    ct_cuda_memory_stats s;
    cti_devmem_stats(a, 0, &s);
    cr_assert_eq(s.num_device_allocs, 2);
    cti_devmem_free(a, 0, r);
    cti_devmem_delete(a);
}

Test(cuda_alloc, classes_do_not_mix)
{
    fake_dev f;
    cti_devmem *a = fake_allocator(&f, 1 << 30);
    size_t cap;
    void *p = cti_devmem_alloc(a, 0, 512, S1, &cap, "test");
    cti_devmem_free(a, 0, p);
    void *q = cti_devmem_alloc(a, 0, 2048, S1, &cap, "test");
    cr_assert_neq(q, p, "a 512-byte block is not handed out for 2048 bytes");
    cr_assert_eq(cap, 2048u);
    cti_devmem_free(a, 0, q);
    /* devices are separate too */
    void *r = cti_devmem_alloc(a, 1, 512, S1, &cap, "test");
    cr_assert_neq(r, p);
    cti_devmem_free(a, 1, r);
    cti_devmem_delete(a);
}

Test(cuda_alloc, out_of_memory_empties_the_cache_and_retries)
{
    fake_dev f;
    cti_devmem *a = fake_allocator(&f, 8 << 20);
    size_t cap;
    void *p = cti_devmem_alloc(a, 0, 6 << 20, S1, &cap, "test");
    cr_assert_not_null(p);
    cti_devmem_free(a, 0, p); /* cached: the device is still "full" */
    void *q = cti_devmem_alloc(a, 0, 5 << 20, S2, &cap, "test");
    cr_assert_not_null(q, "the cached 6 MiB block went back to the device and the request was retried: %s",
                       ct_last_error());
    cr_assert_eq(f.raw_frees, 1);
    cr_assert_geq(f.syncs, 1, "the freed block's event was waited for before cudaFree");
    ct_cuda_memory_stats s;
    cti_devmem_stats(a, 0, &s);
    cr_assert_eq(s.num_frees_to_device, 1);
    cr_assert_eq(s.reserved, 5 << 20);
    cti_devmem_free(a, 0, q);
    cti_devmem_delete(a);
}

Test(cuda_alloc, out_of_memory_message_names_the_request_and_the_counters)
{
    fake_dev f;
    cti_devmem *a = fake_allocator(&f, 64 << 20);
    size_t cap;
    void *p = cti_devmem_alloc(a, 3, 40 << 20, S1, &cap, "test");
    cr_assert_not_null(p);
    ct_error_clear();
    void *q = cti_devmem_alloc(a, 3, 30 << 20, S1, &cap, "linear");
    cr_assert_null(q);
    cr_assert_eq(ct_last_status(), CT_ERR_NOMEM);
    const char *m = ct_last_error();
    cr_assert(strstr(m, "linear") && strstr(m, "cuda:3") && strstr(m, "out of memory"), "%s", m);
    cr_assert(strstr(m, "tried to allocate 30.00 MiB"), "the request: %s", m);
    cr_assert(strstr(m, "40.00 MiB allocated") && strstr(m, "40.00 MiB reserved"), "the counters: %s", m);
    cr_assert(strstr(m, "24.00 MiB free of 64.00 MiB"), "the device: %s", m);
    ct_cuda_memory_stats s;
    cti_devmem_stats(a, 3, &s);
    cr_assert_eq(s.num_ooms, 1);
    cr_assert_eq(s.allocated, 40 << 20, "nothing changed");
    cti_devmem_free(a, 3, p);
    cti_devmem_delete(a);
}

Test(cuda_alloc, empty_cache_and_peaks)
{
    fake_dev f;
    cti_devmem *a = fake_allocator(&f, 1 << 30);
    size_t cap;
    void *ps[10];
    for (int i = 0; i < 10; i++) ps[i] = cti_devmem_alloc(a, 0, (size_t)(i + 1) << 16, i % 2 ? S1 : S2, &cap, "test");
    ct_cuda_memory_stats s;
    cti_devmem_stats(a, 0, &s);
    int64_t peak = s.peak_allocated;
    cr_assert_eq(peak, s.allocated);
    for (int i = 0; i < 10; i++) cti_devmem_free(a, 0, ps[i]);
    cti_devmem_stats(a, 0, &s);
    cr_assert_eq(s.allocated, 0);
    cr_assert_eq(s.peak_allocated, peak, "the peak stays until reset");
    cti_devmem_peak_reset(a, 0);
    cti_devmem_stats(a, 0, &s);
    cr_assert_eq(s.peak_allocated, 0);
    cr_assert_eq(s.peak_reserved, s.reserved);
    cr_assert_eq(cti_devmem_empty_cache(a), CT_OK);
    cti_devmem_stats(a, 0, &s);
    cr_assert_eq(s.reserved, 0);
    cr_assert_eq(f.used, 0, "every cached block went back to the device");
    cr_assert_eq(f.raw_frees, 10);
    cti_devmem_delete(a);
}

/* Steady state: a step that allocates and frees the same sizes asks the device only
 * in the first step. */
Test(cuda_alloc, steady_state_steps_never_reach_the_device)
{
    fake_dev f;
    cti_devmem *a = fake_allocator(&f, 1 << 30);
    static const size_t sizes[] = {768, 3 << 20, 4096, 3 << 20, 100000, 17};
    for (int step = 0; step < 20; step++) {
        void *ps[6];
        size_t cap;
        for (int i = 0; i < 6; i++) ps[i] = cti_devmem_alloc(a, 0, sizes[i], S1, &cap, "step");
        for (int i = 5; i >= 0; i--) cti_devmem_free(a, 0, ps[i]);
    }
    cr_assert_eq(f.raw_allocs, 6);
    cti_devmem_delete(a);
}
