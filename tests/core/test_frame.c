/* Frames release their temporaries; ct_keep moves one out. Memory is measured
 * with ctrain's live-byte counter and the process's resident set. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"

#if defined(__SANITIZE_ADDRESS__)
#define CT_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CT_TEST_UNDER_ASAN 1
#endif
#endif
#include "core/tensor.h"

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) sscanf(line + 6, "%ld", &kib);
    if (f) fclose(f);
    return kib;
}

Test(frame, pop_releases_temporaries)
{
    int64_t before = ct_storage_live_bytes();
    CT_FRAME {
        ct_tensor *a = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(256));
        ct_tensor *v = ct_tensor_view(a, CT_SHAPE(16, 16));
        (void)v;
        cr_assert_eq(ct_frame_size(), 2);
        cr_assert_eq(ct_storage_live_bytes() - before, 1024);
    }
    cr_assert_eq(ct_storage_live_bytes(), before);
}

Test(frame, keep_moves_one_reference_out)
{
    int64_t before = ct_storage_live_bytes();
    ct_tensor *kept = NULL;
    CT_FRAME {
        CT_FRAME {
            ct_tensor *a = ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(8));
            kept = ct_keep(ct_tensor_view(a, CT_SHAPE(2, 4)));
            (void)ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(8));
        }
        cr_assert_eq(ct_frame_size(), 1);
        cr_assert_eq(ct_storage_live_bytes() - before, 64, "the kept view holds its base's storage");
        cr_assert_eq(ct_tensor_get(kept, (int64_t[]){1, 3}), 1.0);
    }
    cr_assert_eq(ct_storage_live_bytes(), before);
}

Test(frame, retained_tensor_outlives_frames)
{
    ct_tensor *owned = NULL;
    CT_FRAME { owned = ct_tensor_retain(ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(3), 5)); }
    cr_assert_eq(ct_tensor_get(owned, (int64_t[]){2}), 5.0);
    ct_tensor_release(owned);
}

Test(frame, ten_thousand_frames_keep_memory_flat)
{
    int64_t before = ct_storage_live_bytes();
    long rss0 = 0;
    for (int i = 0; i < 10000; i++) {
        CT_FRAME {
            ct_tensor *a = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(64, 64), 0, 1);
            ct_tensor *b = ct_tensor_transpose(a, 0, 1);
            ct_tensor *c = ct_tensor_contiguous(b);
            ct_tensor *d = ct_tensor_cast(c, CT_DTYPE_BF16);
            cr_assert_not_null(d);
        }
        cr_assert_eq(ct_storage_live_bytes(), before);
        if (i == 100) rss0 = rss_kib();
    }
    long rss1 = rss_kib();
#ifndef CT_TEST_UNDER_ASAN
    /* ASan and valgrind (make memcheck sets CT_MEMCHECK) hold freed blocks back,
     * so the resident set only means something without them */
    if (!getenv("CT_MEMCHECK"))
        cr_assert(rss1 - rss0 < 2048, "resident set grew from %ld to %ld KiB", rss0, rss1);
#else
    (void)rss0, (void)rss1;
#endif
}

Test(frame, nesting_depths)
{
    int d0 = ct_frame_depth();
    ct_frame_push();
    ct_frame_push();
    cr_assert_eq(ct_frame_depth(), d0 + 2);
    ct_frame_pop();
    ct_frame_pop();
    cr_assert_eq(ct_frame_depth(), d0);
    ct_frame_pop(); /* popping the root is harmless */
    cr_assert_eq(ct_frame_depth(), 0);
}

Test(storage, large_blocks_are_reused_and_cache_clears)
{
    if (getenv("CTRAIN_CPU_CACHE_BYTES")) cr_skip_test("cache size overridden");
    ct_storage_cache_clear();
    void *first = NULL;
    CT_FRAME {
        ct_tensor *a = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1 << 20));
        first = a->storage->data;
        cr_assert_geq(a->storage->capacity, a->storage->nbytes);
    }
#ifndef CT_TEST_UNDER_ASAN
    cr_assert_geq(ct_storage_cache_bytes(), (int64_t)4 << 20);
    CT_FRAME {
        /* a slightly smaller request of the same size class gets the same block back */
        ct_tensor *b = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE((1 << 20) - 100));
        cr_assert_eq(b->storage->data, first);
        cr_assert_eq(ct_storage_cache_bytes(), 0);
        /* and reuse never leaks old contents into zeros() */
        ct_tensor *z = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1 << 18));
        for (int i = 0; i < (1 << 18); i += 4099) cr_assert_eq(((float *)ct_tensor_data(z))[i], 0.0f);
    }
#else
    (void)first;
#endif
    ct_storage_cache_clear();
    cr_assert_eq(ct_storage_cache_bytes(), 0);
}
