/* Tests for core/tensor.c, core/view.c, core/copy.c, core/print.c: layouts are
 * checked against index arithmetic written out by hand in the tests. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"

static double at(const ct_tensor *t, int64_t i, int64_t j) { return ct_tensor_get(t, (int64_t[]){i, j}); }

Test(tensor, create_and_metadata)
{
    CT_FRAME {
        ct_tensor *t = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 4));
        cr_assert_not_null(t);
        cr_assert_eq(t->ndim, 3);
        cr_assert_eq(ct_tensor_numel(t), 24);
        cr_assert_eq(t->strides[0], 12);
        cr_assert_eq(t->strides[1], 4);
        cr_assert_eq(t->strides[2], 1);
        cr_assert(ct_tensor_is_contiguous(t));
        cr_assert_eq((uintptr_t)ct_tensor_data(t) % 64, 0, "cpu storage is 64-byte aligned");
        for (int i = 0; i < 24; i++) cr_assert_eq(((float *)ct_tensor_data(t))[i], 0.0f);
        ct_tensor *o = ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(5), -7);
        for (int i = 0; i < 5; i++) cr_assert_eq(((int64_t *)ct_tensor_data(o))[i], -7);
        ct_tensor *s = ct_tensor_scalar(CT_DTYPE_F64, 2.5);
        cr_assert_eq(s->ndim, 0);
        cr_assert_eq(ct_tensor_item(s), 2.5);
        ct_tensor *e = ct_tensor_empty(CT_DTYPE_BF16, CT_SHAPE(0, 3));
        cr_assert_not_null(e);
        cr_assert_eq(ct_tensor_numel(e), 0);
    }
}

Test(tensor, arange_matches_formula)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_arange(CT_DTYPE_F64, 1.0, 2.0, 0.25);
        cr_assert_eq(a->shape[0], 4);
        for (int i = 0; i < 4; i++) cr_assert_eq(ct_tensor_get(a, (int64_t[]){i}), 1.0 + 0.25 * i);
        ct_tensor *b = ct_tensor_arange(CT_DTYPE_I32, 10, 0, -3);
        cr_assert_eq(b->shape[0], 4);
        cr_assert_eq(ct_tensor_get(b, (int64_t[]){3}), 1);
        cr_assert_null(ct_tensor_arange(CT_DTYPE_F32, 0, 1, 0));
        cr_assert(strstr(ct_last_error(), "arange") != NULL);
    }
}

Test(tensor, from_data_and_buffer)
{
    float data[6] = {1, 2, 3, 4, 5, 6};
    CT_FRAME {
        ct_tensor *c = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(2, 3), data);
        ct_tensor *w = ct_tensor_from_buffer(CT_DTYPE_F32, CT_SHAPE(3, 2), data, NULL, NULL);
        data[0] = 100;
        cr_assert_eq(at(c, 0, 0), 1.0, "from_data copies");
        cr_assert_eq(at(w, 0, 0), 100.0, "from_buffer shares");
        cr_assert_eq(at(w, 2, 1), 6.0);
    }
}

static int released;
static void on_release(void *ctx, void *data, size_t nbytes)
{
    (void)data;
    (void)nbytes;
    released += *(int *)ctx;
}

Test(tensor, wrapped_buffer_release_runs_after_last_view)
{
    float data[4] = {0};
    int one = 1;
    released = 0;
    CT_FRAME {
        ct_tensor *w = ct_tensor_from_buffer(CT_DTYPE_F32, CT_SHAPE(4), data, on_release, &one);
        ct_tensor *v = ct_keep(ct_tensor_view(w, CT_SHAPE(2, 2)));
        (void)v;
    }
    cr_assert_eq(released, 0, "a kept view keeps the buffer alive");
    ct_frame_reset_root();
    cr_assert_eq(released, 1);
}

Test(tensor, views_share_storage_and_index_correctly)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_arange(CT_DTYPE_F32, 0, 24, 1);
        ct_tensor *b = ct_tensor_view(a, CT_SHAPE(2, 3, 4));
        cr_assert_eq(b->storage, a->storage);
        /* permute (2,0,1): b'[k][i][j] = b[i][j][k] = 12i + 4j + k */
        ct_tensor *p = ct_tensor_permute(b, (int[]){2, 0, 1});
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                    cr_assert_eq(ct_tensor_get(p, (int64_t[]){k, i, j}), 12 * i + 4 * j + k);
        cr_assert(!ct_tensor_is_contiguous(p));
        ct_tensor *t = ct_tensor_transpose(b, 0, -1); /* [4,3,2]: t[k][j][i] */
        cr_assert_eq(ct_tensor_get(t, (int64_t[]){3, 1, 1}), 12 + 4 + 3);
        /* slice dim 2 from 1 step 2 -> k in {1,3} */
        ct_tensor *s = ct_tensor_slice(b, 2, 1, 100, 2);
        cr_assert_eq(s->shape[2], 2);
        cr_assert_eq(ct_tensor_get(s, (int64_t[]){1, 2, 1}), 12 + 8 + 3);
        ct_tensor *n = ct_tensor_narrow(b, 1, 1, 2);
        cr_assert_eq(ct_tensor_get(n, (int64_t[]){0, 0, 0}), 4);
        ct_tensor *sel = ct_tensor_select(b, 1, -1);
        cr_assert_eq(sel->ndim, 2);
        cr_assert_eq(ct_tensor_get(sel, (int64_t[]){1, 2}), 12 + 8 + 2);
        ct_tensor *u = ct_tensor_unsqueeze(b, 1);
        cr_assert_eq(u->ndim, 4);
        cr_assert_eq(u->shape[1], 1);
        ct_tensor *q = ct_tensor_squeeze(u, 1);
        cr_assert(ct_tensor_same_shape(q, b));
        /* writes through a view land in the base */
        ct_tensor_set(p, (int64_t[]){3, 1, 2}, -1);
        cr_assert_eq(ct_tensor_get(a, (int64_t[]){12 + 8 + 3}), -1);
    }
}

Test(tensor, view_needs_compatible_layout_reshape_copies)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_arange(CT_DTYPE_F64, 0, 12, 1);
        ct_tensor *m = ct_tensor_view(a, CT_SHAPE(3, -1));
        cr_assert_eq(m->shape[1], 4);
        ct_tensor *t = ct_tensor_transpose(m, 0, 1); /* [4,3], not contiguous */
        cr_assert_null(ct_tensor_view(t, CT_SHAPE(12)));
        cr_assert(strstr(ct_last_error(), "ct_tensor_reshape") != NULL, "%s", ct_last_error());
        ct_tensor *r = ct_tensor_reshape(t, CT_SHAPE(12));
        cr_assert_not_null(r);
        cr_assert_neq(r->storage, a->storage);
        /* r[i*3 + j] = t[i][j] = m[j][i] = 4j + i */
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) cr_assert_eq(ct_tensor_get(r, (int64_t[]){i * 3 + j}), 4 * j + i);
        /* splitting a transposed dim is still a view */
        ct_tensor *t2 = ct_tensor_view(t, CT_SHAPE(2, 2, 3));
        cr_assert_not_null(t2, "%s", ct_last_error());
        cr_assert_eq(t2->storage, a->storage);
        cr_assert_eq(ct_tensor_get(t2, (int64_t[]){1, 1, 2}), 4 * 2 + 3);
        cr_assert_null(ct_tensor_view(a, CT_SHAPE(5, -1)));
        cr_assert(strstr(ct_last_error(), "[5, -1]") != NULL, "%s", ct_last_error());
    }
}

Test(tensor, expand_broadcasts_with_zero_strides)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_arange(CT_DTYPE_F32, 0, 3, 1);
        ct_tensor *col = ct_tensor_view(a, CT_SHAPE(3, 1));
        ct_tensor *e = ct_tensor_expand(col, CT_SHAPE(2, 3, 4));
        cr_assert_not_null(e);
        cr_assert_eq(e->strides[0], 0);
        cr_assert_eq(e->strides[2], 0);
        cr_assert_eq(ct_tensor_get(e, (int64_t[]){1, 2, 3}), 2);
        cr_assert_null(ct_tensor_expand(col, CT_SHAPE(4, 4)));
        cr_assert(strstr(ct_last_error(), "f32[3, 1]") != NULL, "%s", ct_last_error());
        ct_tensor *c = ct_tensor_contiguous(e);
        cr_assert(ct_tensor_is_contiguous(c));
        cr_assert_eq(((float *)ct_tensor_data(c))[4 * 2 + 1], 2.0f);
    }
}

Test(tensor, copy_broadcasts_and_casts)
{
    CT_FRAME {
        ct_tensor *dst = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(3, 4));
        ct_tensor *row = ct_tensor_arange(CT_DTYPE_I32, 0, 4, 1);
        cr_assert_eq(ct_tensor_copy_(dst, row), CT_OK);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) cr_assert_eq(at(dst, i, j), j);
        /* into a strided view: the transposed columns */
        ct_tensor *base = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4, 3));
        cr_assert_eq(ct_tensor_copy_(ct_tensor_transpose(base, 0, 1), dst), CT_OK);
        cr_assert_eq(at(base, 2, 1), 2.0);
        ct_tensor *bad = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(5));
        cr_assert_neq(ct_tensor_copy_(dst, bad), CT_OK);
        cr_assert(strstr(ct_last_error(), "f32[5]") && strstr(ct_last_error(), "f64[3, 4]"), "%s", ct_last_error());
        /* casts round to nearest even: 1 + 2^-8 is a bf16 tie between 1 and 1 + 2^-7 */
        ct_tensor *x = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(1), 1.0 + ldexp(1, -8));
        cr_assert_eq(ct_tensor_item(ct_tensor_cast(x, CT_DTYPE_BF16)), 1.0);
        ct_tensor *y = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(1), 1000.0);
        cr_assert(isnan(ct_tensor_item(ct_tensor_cast(y, CT_DTYPE_F8_E4M3))));
        cr_assert_eq(ct_tensor_item(ct_tensor_cast_saturate(y, CT_DTYPE_F8_E4M3)), 448.0);
        ct_tensor *z = ct_tensor_cast(ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(2), -2.7), CT_DTYPE_I64);
        cr_assert_eq(ct_tensor_get(z, (int64_t[]){1}), -2.0);
    }
}

Test(tensor, every_dtype_pair_casts)
{
    for (int a = 0; a < CT_DTYPE_COUNT; a++)
        for (int b = 0; b < CT_DTYPE_COUNT; b++) CT_FRAME {
                ct_tensor *x = ct_tensor_arange((ct_dtype)a, 0, 3, 1);
                ct_tensor *y = ct_tensor_cast(ct_tensor_transpose(ct_tensor_view(x, CT_SHAPE(1, 3)), 0, 1),
                                              (ct_dtype)b);
                cr_assert_not_null(y, "%s -> %s: %s", ct_dtype_name(a), ct_dtype_name(b), ct_last_error());
                double want = (a == CT_DTYPE_BOOL || b == CT_DTYPE_BOOL) ? 1.0 : 2.0;
                cr_assert_eq(ct_tensor_get(y, (int64_t[]){2, 0}), want, "%s -> %s", ct_dtype_name(a),
                             ct_dtype_name(b));
            }
}

Test(tensor, errors_name_the_op_and_shapes_and_null_propagates)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3));
        cr_assert_null(ct_tensor_transpose(a, 0, 2));
        cr_assert(strstr(ct_last_error(), "tensor_transpose") && strstr(ct_last_error(), "f32[2, 3] cpu"), "%s",
                  ct_last_error());
        ct_error_clear();
        cr_assert_null(ct_tensor_view(NULL, CT_SHAPE(3)));
        cr_assert_null(ct_tensor_transpose(ct_tensor_view(NULL, CT_SHAPE(3)), 0, 1));
        cr_assert_str_eq(ct_last_error(), "", "NULL input keeps the earlier message");
        cr_assert_null(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, -1)));
        cr_assert(strstr(ct_last_error(), "negative"), "%s", ct_last_error());
        cr_assert_null(ct_tensor_empty((ct_dtype)99, CT_SHAPE(1)));
        cr_assert_null(ct_tensor_empty(CT_DTYPE_F32, 9, (int64_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}));
        cr_assert_null(ct_tensor_rand(CT_DTYPE_I32, CT_SHAPE(2), 0, 1));
        cr_assert(isnan(ct_tensor_get(a, (int64_t[]){2, 0})));
        cr_assert(strstr(ct_last_error(), "index 2"), "%s", ct_last_error());
        cr_assert_null(ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_F32, CT_SHAPE(2)));
        cr_assert(strstr(ct_last_error(), "cuda:0"), "%s", ct_last_error());
        ct_storage *s = a->storage;
        cr_assert_null(ct_tensor_from_storage(s, CT_DTYPE_F32, CT_SHAPE(2, 3), NULL, 1));
        cr_assert(strstr(ct_last_error(), "outside"), "%s", ct_last_error());
    }
}

Test(tensor, print_is_readable)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_view(ct_tensor_arange(CT_DTYPE_F32, 0, 6, 1), CT_SHAPE(2, 3));
        char *s = ct_tensor_to_string(a);
        cr_assert_str_eq(s, "tensor([[0, 1, 2],\n        [3, 4, 5]], f32[2, 3] cpu)");
        free(s);
        ct_tensor *l = ct_tensor_arange(CT_DTYPE_I64, 0, 100, 1);
        s = ct_tensor_to_string(l);
        cr_assert_str_eq(s, "tensor([0, 1, 2, ..., 97, 98, 99], i64[100] cpu)");
        free(s);
    }
}

Test(tensor, rand_uses_the_seeded_generator)
{
    CT_FRAME {
        ct_set_seed(42);
        ct_tensor *a = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(1000), 0, 1);
        ct_set_seed(42);
        ct_tensor *b = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(1000), 0, 1);
        cr_assert_eq(memcmp(ct_tensor_data(a), ct_tensor_data(b), 4000), 0);
        ct_tensor *u = ct_tensor_rand(CT_DTYPE_F64, CT_SHAPE(1000), -2, 3);
        double lo = 1e9, hi = -1e9;
        for (int i = 0; i < 1000; i++) {
            double v = ((double *)ct_tensor_data(u))[i];
            lo = fmin(lo, v), hi = fmax(hi, v);
        }
        cr_assert(lo >= -2 && hi < 3 && lo < -1.9 && hi > 2.9);
        ct_tensor *h = ct_tensor_randn(CT_DTYPE_BF16, CT_SHAPE(8), 0, 1);
        cr_assert_not_null(h);
    }
}

Test(tensor, repoint_takes_the_base_dtype_and_values_without_copying)
{
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
        /* a bf16 base holding 0.5 * k at element k */
        ct_tensor *base = ct_tensor_empty(CT_DTYPE_BF16, CT_SHAPE(10));
        for (int64_t k = 0; k < 10; k++) ct_tensor_set(base, &k, 0.5 * (double)k);
        ct_storage *old = t->storage;
        cr_assert_eq(ct_tensor_repoint(t, base, 3), CT_OK, "%s", ct_last_error());
        cr_expect_eq(t->dtype, CT_DTYPE_BF16);
        cr_expect_eq(t->storage, base->storage);
        cr_expect_neq(t->storage, old);
        cr_expect_eq(t->offset, 3);
        cr_expect(ct_tensor_is_contiguous(t));
        cr_expect_eq(t->shape[0], 2);
        cr_expect_eq(at(t, 0, 0), 1.5, "element 3 of the base");
        cr_expect_eq(at(t, 1, 2), 4.0, "element 8 of the base");
        /* writes go to the base */
        cr_assert_eq(ct_tensor_set(t, (int64_t[]){0, 1}, -2.0), CT_OK);
        cr_expect_eq(ct_tensor_get(base, (int64_t[]){4}), -2.0);
        /* back to an f32 base, again without conversion of t's old values */
        ct_tensor *f = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(6));
        cr_assert_eq(ct_tensor_repoint(t, f, 0), CT_OK, "%s", ct_last_error());
        cr_expect_eq(t->dtype, CT_DTYPE_F32);
        cr_expect_eq(at(t, 0, 1), 0.0);
        /* errors: no room, negative offset, non-contiguous base; a refusal changes nothing */
        cr_expect_neq(ct_tensor_repoint(t, base, 5), CT_OK, "6 elements do not fit at 5 of 10");
        cr_expect(strstr(ct_last_error(), "tensor_repoint"), "%s", ct_last_error());
        cr_expect_neq(ct_tensor_repoint(t, base, -1), CT_OK);
        ct_tensor *strided = ct_tensor_slice(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(20)), 0, 0, 20, 2);
        cr_expect_neq(ct_tensor_repoint(t, strided, 0), CT_OK);
        cr_expect_eq(t->storage, f->storage);
        cr_expect_eq(t->dtype, CT_DTYPE_F32);
    }
}
