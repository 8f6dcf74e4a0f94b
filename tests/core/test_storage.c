/* Tests for core/storage.c's resize (memory given back and taken again under the same
 * storage object) and the live / reserved peaks. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/frame.h"
#include "core/storage.h"
#include "core/tensor.h"

Test(storage, resize_frees_and_regives_memory_under_the_same_views)
{
    const int64_t before = ct_storage_live_bytes();
    CT_FRAME {
        ct_tensor *flat = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1000));
        ct_tensor *view =
            ct_tensor_from_storage(flat->storage, CT_DTYPE_F32, 2, (const int64_t[]){10, 20}, NULL, 100);
        cr_assert_not_null(view);
        cr_assert_eq(ct_storage_live_bytes(), before + 4000);
        cr_assert_eq(ct_storage_resize(flat->storage, 0), CT_OK);
        cr_assert_null(ct_tensor_data(flat), "no memory: no data");
        cr_assert_null(ct_tensor_data(view));
        cr_assert_eq(ct_storage_live_bytes(), before, "the 4000 bytes are no longer live");
        cr_assert_eq(ct_storage_resize(flat->storage, 0), CT_OK, "twice is fine");
        cr_assert_eq(ct_storage_resize(flat->storage, 4000), CT_OK);
        cr_assert_eq(ct_storage_live_bytes(), before + 4000);
        float *d = ct_tensor_data(flat);
        cr_assert_not_null(d);
        for (int i = 0; i < 1000; i++) d[i] = (float)i;
        /* the view sees the new memory at its offset */
        cr_assert_eq(((float *)ct_tensor_data(view))[0], 100.0f);
        cr_assert_eq(((float *)ct_tensor_data(view))[199], 299.0f);
    }
    cr_assert_eq(ct_storage_live_bytes(), before, "released with the tensors");
}

Test(storage, resize_refuses_what_it_does_not_own)
{
    float buf[4];
    ct_storage *s = ct_storage_wrap(CT_CPU, buf, sizeof buf, NULL, NULL);
    cr_assert_eq(ct_storage_resize(s, 0), CT_ERR_INVALID);
    cr_assert(strstr(ct_last_error(), "does not own"), "%s", ct_last_error());
    cr_assert_eq(ct_storage_resize(NULL, 8), CT_ERR_INVALID);
    ct_storage_release(s);
}

Test(storage, peaks_follow_allocations_and_reset)
{
    ct_storage_peak_reset();
    const int64_t live0 = ct_storage_live_bytes(), base = ct_storage_peak_bytes();
    cr_assert_eq(base, live0, "a reset starts from the live bytes");
    CT_FRAME {
        ct_tensor *a = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(1 << 18)); /* 1 MiB */
        ct_tensor *b = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(1 << 17));
        (void)a, (void)b;
        cr_assert_geq(ct_storage_peak_bytes(), live0 + (3 << 19));
    }
    /* freed: live falls back, the peak stays; the reserved peak is at least the live one */
    cr_assert_eq(ct_storage_live_bytes(), live0);
    cr_assert_geq(ct_storage_peak_bytes(), live0 + (3 << 19));
    cr_assert_geq(ct_storage_peak_reserved_bytes(), ct_storage_peak_bytes());
    ct_storage_peak_reset();
    cr_assert_eq(ct_storage_peak_bytes(), live0);
    cr_assert_eq(ct_storage_peak_reserved_bytes(), live0 + ct_storage_cache_bytes());
}
