/* Tests for kernels/embedding.c and kernels/cpu/embedding.c: gathers against
 * index arithmetic, the backward against a naive scatter-add written here, a
 * double reference and finite differences. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/embedding.h"
#include "kernels/embedding.h"
#include "tests/kernels/util.h"

Test(embedding, hand_values)
{
    CT_FRAME {
        ct_tensor *w = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(3, 2), (float[]){0, 1, 2, 3, 4, 5});
        ct_tensor *ids = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 2), (int64_t[]){2, 0, 2, 1});
        ct_tensor *out = ct_kernel_embedding(w, ids);
        cr_assert_eq(out->ndim, 3);
        cr_assert_eq(out->shape[2], 2);
        const float expect[8] = {4, 5, 0, 1, 4, 5, 2, 3};
        for (int i = 0; i < 8; i++) cr_assert_eq(((float *)ct_tensor_data(out))[i], expect[i]);
        /* backward: id 2 twice, 0 and 1 once; dweight starts at 1 and accumulates */
        ct_tensor *dout = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(2, 2, 2), (float[]){1, 2, 3, 4, 5, 6, 7, 8});
        ct_tensor *dw = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3, 2));
        cr_assert_eq(ct_kernel_embedding_backward(dw, dout, ids), CT_OK);
        const float g[6] = {1 + 3, 1 + 4, 1 + 7, 1 + 8, 1 + 1 + 5, 1 + 2 + 6};
        for (int i = 0; i < 6; i++) cr_assert_eq(((float *)ct_tensor_data(dw))[i], g[i]);
        cr_assert_eq(ct_kernel_embedding_backward(dw, dout, ids), CT_OK);
        for (int i = 0; i < 6; i++) cr_assert_eq(((float *)ct_tensor_data(dw))[i], 2 * g[i] - 1);
        /* the ref agrees */
        ct_tensor *dr = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3, 2));
        cr_assert_eq(cti_cpu_embedding_backward_ref(dr, ct_tensor_reshape(dout, CT_SHAPE(4, 2)), ids), CT_OK);
        for (int i = 0; i < 6; i++) cr_assert_eq(((float *)ct_tensor_data(dr))[i], g[i]);
        /* 0-d ids: one row, shape (C) */
        ct_tensor *one = ct_kernel_embedding(w, ct_tensor_scalar(CT_DTYPE_I32, 1));
        cr_assert_eq(one->ndim, 1);
        cr_assert_eq(ct_tensor_get(one, (int64_t[]){1}), 3.0);
    }
}

Test(embedding, forward_matches_reference_any_dtype_and_layout)
{
    ct_set_seed(31);
    const ct_dtype dts[] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16, CT_DTYPE_I32, CT_DTYPE_U8};
    for (int d = 0; d < 6; d++) CT_FRAME {
            ct_tensor *w = ct_tensor_cast(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(257, 17), 0, 50), dts[d]);
            ct_tensor *ids = random_ids(d % 2 ? CT_DTYPE_I32 : CT_DTYPE_I64, CT_SHAPE(3, 33), 257, 0, 0, 0);
            ct_tensor *out = ct_kernel_embedding(w, ids);
            cr_assert_not_null(out, "%s", ct_last_error());
            ct_tensor *ref = ct_tensor_empty(dts[d], CT_SHAPE(99, 17));
            cr_assert_eq(cti_cpu_embedding_ref(w, ids, ref), CT_OK);
            cr_assert(same_bits(out, ref));
            /* index arithmetic directly */
            for (int64_t i = 0; i < 99; i += 7)
                for (int64_t c = 0; c < 17; c += 5)
                    cr_assert_eq(ct_tensor_get(out, (int64_t[]){i / 33, i % 33, c}),
                                 ct_tensor_get(w, (int64_t[]){id_at(ids, i), c}));
        }
    CT_FRAME {
        /* a transposed table and step-sliced ids */
        ct_tensor *wt = ct_tensor_transpose(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(5, 40), 0, 1), 0, 1);
        ct_tensor *ids = ct_tensor_slice(random_ids(CT_DTYPE_I64, CT_SHAPE(21), 40, 0, 0, 0), 0, 1, 21, 3);
        ct_tensor *out = ct_kernel_embedding(wt, ids);
        for (int64_t i = 0; i < 7; i++)
            for (int64_t c = 0; c < 5; c++)
                cr_assert_eq(ct_tensor_get(out, (int64_t[]){i, c}),
                             ct_tensor_get(wt, (int64_t[]){(int64_t)ct_tensor_get(ids, (int64_t[]){i}), c}));
    }
}

Test(embedding, backward_equals_naive_scatter_add)
{
    ct_set_seed(32);
    const int64_t cs[] = {1, 3, 17, 64};
    for (int k = 0; k < 4; k++) CT_FRAME {
            int64_t V = 37, C = cs[k], N = 300;
            ct_tensor *ids = random_ids(CT_DTYPE_I32, CT_SHAPE(N), V, 9, 0, 0); /* heavy repetition */
            ct_tensor *dout = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(N, C), 0, 1);
            ct_tensor *dw = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(V, C), 0, 1);
            ct_tensor *naive = ct_tensor_clone(dw);
            float *np = ct_tensor_data(naive), *dp = ct_tensor_data(dout);
            for (int64_t n = 0; n < N; n++)
                for (int64_t c = 0; c < C; c++) np[id_at(ids, n) * C + c] += dp[n * C + c];
            cr_assert_eq(ct_kernel_embedding_backward(dw, dout, ids), CT_OK);
            cr_assert_eq(memcmp(ct_tensor_data(dw), np, ct_tensor_nbytes(dw)), 0, "f32 is the naive loop bit for bit");
        }
}

Test(embedding, backward_matches_reference_all_dtypes)
{
    ct_set_seed(33);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) CT_FRAME {
                ct_dtype wdt = float_dtypes[a], ddt = float_dtypes[b];
                ct_tensor *ids = random_ids(CT_DTYPE_I64, CT_SHAPE(7, 11), 50, 13, 0, 0);
                ct_tensor *dout = ct_tensor_randn(ddt, CT_SHAPE(7, 11, 17), 0, 1);
                ct_tensor *dw = ct_tensor_randn(wdt, CT_SHAPE(50, 17), 0, 1), *dr = ct_tensor_clone(dw);
                cr_assert_eq(ct_kernel_embedding_backward(dw, dout, ids), CT_OK, "%s", ct_last_error());
                cr_assert_eq(cti_cpu_embedding_backward_ref(dr, ct_tensor_reshape(dout, CT_SHAPE(77, 17)), ids), CT_OK);
                double tol = wdt == CT_DTYPE_F64 && ddt == CT_DTYPE_F64 ? 1e-14
                             : wdt == CT_DTYPE_F32 || wdt == CT_DTYPE_F64 ? 1e-6
                                                                          : 1e-2;
                cr_assert_leq(rel_err(dw, dr), tol, "dweight %s dout %s: %g", ct_dtype_name(wdt), ct_dtype_name(ddt),
                              rel_err(dw, dr));
            }
}

Test(embedding, backward_matches_finite_differences)
{
    ct_set_seed(34);
    CT_FRAME {
        const double h = 1e-6;
        ct_tensor *w = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(6, 4), 0, 1);
        ct_tensor *ids = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 3), (int64_t[]){5, 1, 5, 0, 1, 5});
        ct_tensor *dout = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(2, 3, 4), 0, 1);
        ct_tensor *dw = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(6, 4));
        cr_assert_eq(ct_kernel_embedding_backward(dw, dout, ids), CT_OK);
        double *wp = ct_tensor_data(w), *dp = f64_data(dout);
        for (int64_t i = 0; i < 24; i++) {
            double keep = wp[i], l[2];
            for (int s = 0; s < 2; s++) CT_FRAME {
                    wp[i] = keep + (s ? -h : h);
                    double *o = f64_data(ct_kernel_embedding(w, ids));
                    l[s] = 0;
                    for (int j = 0; j < 24; j++) l[s] += dp[j] * o[j];
                }
            wp[i] = keep;
            double fd = (l[0] - l[1]) / (2 * h);
            cr_assert_float_eq(((double *)ct_tensor_data(dw))[i], fd, 1e-8, "[%ld] %g vs %g", (long)i,
                               ((double *)ct_tensor_data(dw))[i], fd);
        }
    }
}

Test(embedding, backward_same_bits_for_any_thread_count)
{
    ct_set_seed(35);
    CT_FRAME {
        ct_tensor *ids = random_ids(CT_DTYPE_I64, CT_SHAPE(4096), 1000, 100, 0, 0);
        ct_tensor *dout = ct_tensor_randn(CT_DTYPE_BF16, CT_SHAPE(4096, 48), 0, 1);
        ct_tensor *base = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(1000, 48), 0, 1);
        ct_tensor *r[3];
        const int threads[3] = {1, 2, 4};
        for (int k = 0; k < 3; k++) {
            ct_set_num_threads(threads[k]);
            r[k] = ct_tensor_clone(base);
            cr_assert_eq(ct_kernel_embedding_backward(r[k], dout, ids), CT_OK);
        }
        ct_set_num_threads(0);
        for (int k = 1; k < 3; k++) cr_assert(same_bits(r[0], r[k]));
    }
}

Test(embedding, backward_into_strided_view)
{
    CT_FRAME {
        /* dweight = every other row of a (6, 2) buffer: the skipped rows stay untouched */
        ct_tensor *buf = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(6, 2));
        ct_tensor *dw = ct_tensor_slice(buf, 0, 0, 6, 2);
        cr_assert(!ct_tensor_is_contiguous(dw));
        ct_tensor *ids = ct_tensor_from_data(CT_DTYPE_I32, CT_SHAPE(3), (int32_t[]){2, 2, 0});
        ct_tensor *dout = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(3, 2), (float[]){1, 2, 3, 4, 5, 6});
        cr_assert_eq(ct_kernel_embedding_backward(dw, dout, ids), CT_OK);
        const float expect[12] = {5, 6, 0, 0, 0, 0, 0, 0, 4, 6, 0, 0};
        for (int i = 0; i < 12; i++) cr_assert_eq(((float *)ct_tensor_data(buf))[i], expect[i], "%d", i);
    }
}

Test(embedding, errors_name_op_position_and_value)
{
    CT_FRAME {
        ct_tensor *w = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(5, 3));
        ct_tensor *ids = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 2), (int64_t[]){0, 4, 5, 1});
        cr_assert_null(ct_kernel_embedding(w, ids));
        ERROR_HAS("embedding", "id 5", "position [1, 0]", "V = 5", "f32[5, 3]");
        ct_tensor *neg = ct_tensor_from_data(CT_DTYPE_I32, CT_SHAPE(2), (int32_t[]){-3, 0});
        cr_assert_null(ct_kernel_embedding(w, neg));
        ERROR_HAS("id -3", "position [0]");
        /* backward: error and dweight untouched */
        ct_tensor *dout = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 2, 3));
        cr_assert_neq(ct_kernel_embedding_backward(w, dout, ids), CT_OK);
        ERROR_HAS("embedding_backward", "id 5");
        for (int i = 0; i < 15; i++) cr_assert_eq(((float *)ct_tensor_data(w))[i], 0.0f);
        cr_assert_null(ct_kernel_embedding(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(5)), neg));
        ERROR_HAS("embedding", "f32[5]");
        cr_assert_null(ct_kernel_embedding(w, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2))));
        ERROR_HAS("ids f32[2]");
        ct_tensor *ok_ids = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2, 2));
        cr_assert_neq(ct_kernel_embedding_backward(w, ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 2, 4)), ok_ids), CT_OK);
        ERROR_HAS("embedding_backward", "f32[2, 2, 4]", "i64[2, 2]");
        cr_assert_neq(ct_kernel_embedding_backward(ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(5, 3)), dout, ok_ids), CT_OK);
        ERROR_HAS("dweight", "i32[5, 3]");
        /* NULL input: the earlier message is kept */
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_kernel_embedding(NULL, ids));
        cr_assert_neq(ct_kernel_embedding_backward(w, NULL, ids), CT_OK);
        cr_assert_str_eq(ct_last_error(), "earlier failure");
    }
}
