/* Tests for core/storage.c's resize (memory given back and taken again under the same
 * storage object), residencies (a released storage got back when read, or an error
 * naming it), and the live / reserved peaks. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/frame.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "kernels/reduce.h"

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

/* A residency that fills the memory back in (what the sharding engine's all-gather
 * does), or refuses. */
typedef struct fake_owner {
    ct_storage *s;
    int calls;
    bool refuse;
} fake_owner;

static ct_status fake_materialize(void *ctx)
{
    fake_owner *o = ctx;
    o->calls++;
    if (o->refuse) return ct_error_set(CT_ERR_PEER, "the group is broken");
    ct_status st = ct_storage_resize(o->s, 64);
    if (!st) memset(o->s->data, 0, 64), ((float *)o->s->data)[3] = 7.0f;
    return st;
}

static void fake_describe(void *ctx, const void *t, char *buf, int cap)
{
    (void)ctx, (void)t;
    snprintf(buf, (size_t)cap, "parameter 'fc.weight' of unit 'h.0' (FULL sharding)");
}

Test(storage, a_released_storage_with_a_residency_comes_back_when_read)
{
    CT_FRAME {
        ct_tensor *flat = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(16));
        ct_tensor *w = ct_tensor_from_storage(flat->storage, CT_DTYPE_F32, 2, (const int64_t[]){2, 2}, NULL, 2);
        fake_owner o = {.s = flat->storage};
        cr_assert_eq(ct_storage_resize(flat->storage, 0), CT_OK);
        /* without a residency: an error naming the op and the tensor, not a NULL read */
        cr_assert_null(ct_tensor_clone(w));
        cr_assert(strstr(ct_last_error(), "tensor_copy_") && strstr(ct_last_error(), "has no memory"), "%s",
                  ct_last_error());
        ct_storage_set_residency(flat->storage, &(ct_storage_residency){fake_materialize, fake_describe, &o});
        /* any read gathers it: a kernel, a copy, an element */
        ct_tensor *sum = ct_kernel_sum(w, NULL, 0, false);
        cr_assert_not_null(sum, "%s", ct_last_error());
        cr_assert_eq(o.calls, 1);
        cr_assert_eq(ct_tensor_item(sum), 7.0, "element 3 of the storage is w[0][1]");
        cr_assert_eq(ct_tensor_get(w, (const int64_t[]){0, 1}), 7.0);
        cr_assert_eq(o.calls, 1, "once there, nothing more to do");
        /* released again, and the owner cannot bring it back: the error names it */
        cr_assert_eq(ct_storage_resize(flat->storage, 0), CT_OK);
        o.refuse = true;
        cr_assert_null(ct_kernel_sum(w, NULL, 0, false));
        cr_assert(strstr(ct_last_error(), "sum: parameter 'fc.weight' of unit 'h.0' (FULL sharding)") &&
                      strstr(ct_last_error(), "could not be gathered") && strstr(ct_last_error(), "the group is broken"),
                  "%s", ct_last_error());
        cr_assert_null(ct_tensor_data(w), "a plain read gets NULL, no crash");
        ct_storage_set_residency(flat->storage, NULL);
    }
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
