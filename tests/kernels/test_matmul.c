/* Tests for kernels/matmul.c and kernels/cpu/matmul.c: every library path (OpenBLAS,
 * dnnl_sgemm, the oneDNN matmul primitive, bf16/f16 convert+sgemm) against the
 * double-accumulating reference, and the reference against products worked out by
 * hand. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/matmul.h"
#include "tests/kernels/util.h"

/* Which fast path a check runs. */
typedef enum { VIA_KERNEL, VIA_ONEDNN_PRIMITIVE } via;

/* out = alpha op(a) op(b) + beta out0 by the fast path vs the reference (in f64). */
static void check_case(via how, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, double alpha, double beta,
                       const char *what)
{
    CT_FRAME {
        int64_t shape[CT_MAX_DIMS];
        int nd = 0;
        ct_tensor *probe = ct_kernel_matmul(a, b, ta, tb); /* also gives the shape */
        cr_assert_not_null(probe, "%s: %s", what, ct_last_error());
        nd = probe->ndim;
        memcpy(shape, probe->shape, sizeof shape);
        ct_tensor *out0 = ct_tensor_randn(a->dtype, nd, shape, 0, 1);
        ct_tensor *out = ct_tensor_clone(out0);
        ct_tensor *ref = ct_tensor_cast(out0, CT_DTYPE_F64);
        cr_assert_eq(cti_cpu_matmul_ref(ref, a, b, ta, tb, alpha, beta), CT_OK);
        ct_status st = how == VIA_KERNEL ? ct_kernel_matmul_out(out, a, b, ta, tb, alpha, beta)
                                         : cti_cpu_matmul_onednn(out, a, b, ta, tb, alpha, beta);
        cr_assert_eq(st, CT_OK, "%s: %s", what, ct_last_error());
        double e = rel_err(out, ref), tol = tol_for(a->dtype);
        cr_assert(e <= tol, "%s (ta=%d tb=%d alpha=%g beta=%g): rel err %.3g > %.1g", what, ta, tb, alpha, beta, e, tol);
        if (how == VIA_KERNEL && alpha == 1 && beta == 0) {
            double e2 = rel_err(probe, ref);
            cr_assert(e2 <= tol, "%s via ct_kernel_matmul: rel err %.3g", what, e2);
        }
    }
}

/* A random operand whose op() is rows x cols: stored (batch..., cols, rows) when trans. */
static ct_tensor *operand(ct_dtype dt, int nb, const int64_t *batch, int64_t rows, int64_t cols, bool trans)
{
    int64_t shape[CT_MAX_DIMS];
    if (nb) memcpy(shape, batch, (size_t)nb * sizeof *shape);
    shape[nb] = trans ? cols : rows;
    shape[nb + 1] = trans ? rows : cols;
    return ct_tensor_randn(dt, nb + 2, shape, 0, 1);
}

/* (M, K, N): unit dims, odd primes, a vector-like K, and two sizes past the blocking */
static const int64_t shapes[][3] = {{1, 1, 1},  {17, 31, 13},  {127, 1, 65}, {3, 17, 1},
                                    {1, 40, 9}, {64, 64, 64}, {150, 70, 90}};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* Every shape x every trans_a/trans_b, 2-D and with a broadcast batch. */
static void check_all(via how, ct_dtype dt, const char *what)
{
    for (int s = 0; s < NSHAPES; s++) {
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
            CT_FRAME {
                ct_tensor *a = operand(dt, 0, NULL, M, K, ta), *b = operand(dt, 0, NULL, K, N, tb);
                check_case(how, a, b, ta, tb, 1, 0, what);
                if (M * K * N < 200000) {
                    ct_tensor *ab = operand(dt, 2, (int64_t[]){2, 1}, M, K, ta);
                    ct_tensor *bb = operand(dt, 1, (int64_t[]){3}, K, N, tb);
                    check_case(how, ab, bb, ta, tb, 1, 0, what);
                }
            }
        }
    }
}

/* ---- the reference against hand-computed values ------------------------------ */

Test(matmul, ref_matches_hand_computed)
{
    /* [1 2 3; 4 5 6] @ [7 8; 9 10; 11 12] = [58 64; 139 154] */
    const double av[] = {1, 2, 3, 4, 5, 6}, bv[] = {7, 8, 9, 10, 11, 12}, want[] = {58, 64, 139, 154};
    CT_FRAME {
        ct_tensor *a = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2, 3), av);
        ct_tensor *b = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(3, 2), bv);
        ct_tensor *out = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2, 2));
        cr_assert_eq(cti_cpu_matmul_ref(out, a, b, false, false, 1, 0), CT_OK);
        for (int i = 0; i < 4; i++) cr_assert_eq(((double *)ct_tensor_data(out))[i], want[i]);
        /* the same product from stored transposes: a^T is (3,2), b^T is (2,3) */
        ct_tensor *at = ct_tensor_contiguous(ct_tensor_transpose(a, 0, 1));
        ct_tensor *bt = ct_tensor_contiguous(ct_tensor_transpose(b, 0, 1));
        ct_tensor *out2 = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2, 2));
        cr_assert_eq(cti_cpu_matmul_ref(out2, at, bt, true, true, 1, 0), CT_OK);
        for (int i = 0; i < 4; i++) cr_assert_eq(((double *)ct_tensor_data(out2))[i], want[i]);
        /* alpha, beta: out = 2 * ab - 1 * [1 1; 1 1] */
        ct_tensor *out3 = ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(2, 2));
        cr_assert_eq(cti_cpu_matmul_ref(out3, a, b, false, false, 2, -1), CT_OK);
        for (int i = 0; i < 4; i++) cr_assert_eq(((double *)ct_tensor_data(out3))[i], 2 * want[i] - 1);
        /* batch broadcast both ways: a (2,1,2,3) with batch i = (+1, -1)[i] * a, b (1,3,3,2)
         * with batch k = (k+1) * b, so out (2,3,2,2)[i][k] = sign_i * (k+1) * want */
        ct_tensor *a4 = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(2, 1, 2, 3));
        ct_tensor *b4 = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(1, 3, 3, 2));
        for (int i = 0; i < 12; i++) ((double *)ct_tensor_data(a4))[i] = av[i % 6] * (i < 6 ? 1 : -1);
        for (int i = 0; i < 18; i++) ((double *)ct_tensor_data(b4))[i] = bv[i % 6] * (i / 6 + 1);
        for (int swap = 0; swap < 2; swap++) {
            /* and the same with the operands' roles swapped: b^T a^T = (a b)^T */
            ct_tensor *out4 = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(2, 3, 2, 2));
            if (!swap) {
                cr_assert_eq(cti_cpu_matmul_ref(out4, a4, b4, false, false, 1, 0), CT_OK);
            } else {
                ct_tensor *o4t = ct_tensor_transpose(out4, -1, -2);
                cr_assert_eq(cti_cpu_matmul_ref(o4t, b4, a4, true, true, 1, 0), CT_OK);
            }
            for (int i = 0; i < 24; i++) {
                double sign = i < 12 ? 1 : -1, k = (i / 4) % 3 + 1;
                cr_assert_eq(((double *)ct_tensor_data(out4))[i], sign * k * want[i % 4], "element %d swap %d", i, swap);
            }
        }
    }
}

Test(matmul, ref_identity_and_bf16_exact)
{
    ct_set_seed(1);
    CT_FRAME {
        /* A @ I = A exactly, for a strided out (the ref accepts any out layout) */
        ct_tensor *a = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(5, 7), 0, 1);
        ct_tensor *eye = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(7, 7));
        for (int i = 0; i < 7; i++) ct_tensor_set(eye, (int64_t[]){i, i}, 1);
        ct_tensor *outT = ct_tensor_transpose(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(7, 5)), 0, 1);
        cr_assert_eq(cti_cpu_matmul_ref(outT, a, eye, false, false, 1, 0), CT_OK);
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 7; j++)
                cr_assert_eq(ct_tensor_get(outT, (int64_t[]){i, j}), ct_tensor_get(a, (int64_t[]){i, j}));
        /* small integers are exact in bf16, so the bf16 product is exact too */
        const float x[] = {1, -2, 3, 4}, y[] = {5, 6, -7, 8}, want[] = {19, -10, -13, 50};
        ct_tensor *xb = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(2, 2), x), CT_DTYPE_BF16);
        ct_tensor *yb = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(2, 2), y), CT_DTYPE_BF16);
        ct_tensor *ob = ct_tensor_empty(CT_DTYPE_BF16, CT_SHAPE(2, 2));
        cr_assert_eq(cti_cpu_matmul_ref(ob, xb, yb, false, false, 1, 0), CT_OK);
        ct_tensor *fast = ct_kernel_matmul(xb, yb, false, false);
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(ct_tensor_get(ob, (int64_t[]){i / 2, i % 2}), want[i]);
            cr_assert_eq(ct_tensor_get(fast, (int64_t[]){i / 2, i % 2}), want[i]);
        }
    }
}

/* ---- fast paths against the reference ------------------------------------------- */

Test(matmul, f32_openblas_vs_ref)
{
    ct_set_seed(2);
    cr_assert_eq(cti_cpu_matmul_set_backend(CT_DTYPE_F32, CT_GEMM_OPENBLAS), CT_OK);
    CT_FRAME { check_all(VIA_KERNEL, CT_DTYPE_F32, "f32 openblas"); }
}

Test(matmul, f32_onednn_sgemm_vs_ref)
{
    ct_set_seed(3);
    cr_assert_eq(cti_cpu_matmul_set_backend(CT_DTYPE_F32, CT_GEMM_ONEDNN), CT_OK);
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_F32), CT_GEMM_ONEDNN);
    CT_FRAME { check_all(VIA_KERNEL, CT_DTYPE_F32, "f32 dnnl_sgemm"); }
}

Test(matmul, f64_vs_ref)
{
    ct_set_seed(4);
    CT_FRAME { check_all(VIA_KERNEL, CT_DTYPE_F64, "f64"); }
}

/* The oneDNN matmul primitive that serves bf16/f16 on AVX512-BF16/AMX machines,
 * run in f32 so its layouts, broadcasting, alpha/beta and cache work on any CPU. */
Test(matmul, onednn_primitive_f32_vs_ref)
{
    ct_set_seed(5);
    CT_FRAME {
        check_all(VIA_ONEDNN_PRIMITIVE, CT_DTYPE_F32, "onednn primitive f32");
        ct_tensor *a = operand(CT_DTYPE_F32, 2, (int64_t[]){2, 1}, 3, 4, false);
        ct_tensor *b = operand(CT_DTYPE_F32, 1, (int64_t[]){5}, 4, 6, true);
        check_case(VIA_ONEDNN_PRIMITIVE, a, b, false, true, 0.5, -1.25, "onednn primitive alpha/beta");
        check_case(VIA_ONEDNN_PRIMITIVE, a, b, false, true, 1, 1, "onednn primitive beta=1");
        /* a strided view: every other column of a wider matrix, and an expanded batch */
        ct_tensor *w = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(9, 22), 0, 1);
        ct_tensor *cols = ct_tensor_slice(w, 1, 0, 22, 2);
        ct_tensor *bx = ct_tensor_expand(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(1, 11, 4), 0, 1), CT_SHAPE(3, 11, 4));
        check_case(VIA_ONEDNN_PRIMITIVE, cols, bx, false, false, 1, 0, "onednn primitive strided");
    }
}

static void check_lowp(ct_dtype dt, ct_gemm_backend be, const char *what)
{
    cr_assert_eq(cti_cpu_matmul_set_backend(dt, be), CT_OK);
    CT_FRAME {
        ct_tensor *a = operand(dt, 0, NULL, 4, 4, false), *b = operand(dt, 0, NULL, 4, 4, false);
        ct_tensor *o = ct_kernel_matmul(a, b, false, false);
        if (!o && be == CT_GEMM_ONEDNN) {
            /* oneDNN 2.6 has bf16/f16 matmul only from AVX512 up: a forced choice fails
             * clearly rather than falling back */
            const char *msg = ct_last_error();
            cr_assert_eq(ct_last_status(), CT_ERR_UNSUPPORTED, "%s", msg);
            ERROR_HAS("matmul", "oneDNN", ct_dtype_name(dt),
                      dt == CT_DTYPE_BF16 ? "CTRAIN_BF16_GEMM" : "CTRAIN_F16_GEMM");
            if (dt == CT_DTYPE_BF16) cr_assert(!cti_cpu_has_bf16_gemm(), "CPU has bf16 GEMM but oneDNN refused: %s", msg);
            ct_tensor *o2 = ct_tensor_empty(dt, CT_SHAPE(4, 4));
            cr_assert_eq(cti_cpu_matmul_onednn(o2, a, b, false, false, 1, 0), CT_ERR_UNSUPPORTED);
            cr_skip_test("%s: oneDNN has no %s matmul on this CPU: %s", what, ct_dtype_name(dt), msg);
        }
        cr_assert_not_null(o, "%s: %s", what, ct_last_error());
        check_all(VIA_KERNEL, dt, what);
        ct_tensor *x = operand(dt, 1, (int64_t[]){3}, 20, 30, true), *y = operand(dt, 0, NULL, 30, 10, false);
        check_case(VIA_KERNEL, x, y, true, false, -0.5, 0.75, what);
    }
}

Test(matmul, bf16_convert_vs_ref) { ct_set_seed(6); check_lowp(CT_DTYPE_BF16, CT_GEMM_CONVERT, "bf16 convert"); }
Test(matmul, bf16_onednn_vs_ref) { ct_set_seed(7); check_lowp(CT_DTYPE_BF16, CT_GEMM_ONEDNN, "bf16 onednn"); }
Test(matmul, f16_convert_vs_ref) { ct_set_seed(8); check_lowp(CT_DTYPE_F16, CT_GEMM_CONVERT, "f16 convert"); }
Test(matmul, f16_onednn_vs_ref) { ct_set_seed(9); check_lowp(CT_DTYPE_F16, CT_GEMM_ONEDNN, "f16 onednn"); }

/* 16-bit inputs into an f32 out: the f32 accumulation is kept, not rounded to 16 bits */
static void check_f32_out(ct_dtype dt, ct_gemm_backend be, const char *what)
{
    cr_assert_eq(cti_cpu_matmul_set_backend(dt, be), CT_OK);
    CT_FRAME {
        /* [1, 2^-8] @ [1, 1]^T = 1 + 2^-8: a tie in bf16 (it would round to 1), exact in f32 */
        ct_tensor *a = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(1, 2), (float[]){1.0f, 0.00390625f}), dt);
        ct_tensor *b = ct_tensor_cast(ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 1)), dt);
        ct_tensor *o = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(1, 1));
        ct_status st = ct_kernel_matmul_out(o, a, b, false, false, 1, 0);
        if (st == CT_ERR_UNSUPPORTED && be == CT_GEMM_ONEDNN)
            cr_skip_test("%s: oneDNN has no %s matmul on this CPU: %s", what, ct_dtype_name(dt), ct_last_error());
        cr_assert_eq(st, CT_OK, "%s: %s", what, ct_last_error());
        cr_expect_eq(*(float *)ct_tensor_data(o), 1.00390625f, "%s: %.9g", what, (double)*(float *)ct_tensor_data(o));
        /* random, batched, transposed, alpha and beta: against the f64 reference */
        ct_tensor *x = operand(dt, 1, (int64_t[]){3}, 20, 30, true), *y = operand(dt, 0, NULL, 30, 10, false);
        ct_tensor *got = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(3, 20, 10), 0, 1);
        ct_tensor *ref = ct_tensor_contiguous(ct_tensor_clone(got));
        cr_assert_eq(ct_kernel_matmul_out(got, x, y, true, false, -0.5, 0.75), CT_OK, "%s", ct_last_error());
        cr_assert_eq(cti_cpu_matmul_ref(ref, x, y, true, false, -0.5, 0.75), CT_OK);
        const float *g = ct_tensor_data(got), *r = ct_tensor_data(ref);
        for (int i = 0; i < 600; i++)
            cr_expect(fabsf(g[i] - r[i]) <= 1e-5f * fmaxf(1.0f, fabsf(r[i])), "%s [%d]: %g, want %g", what, i,
                      (double)g[i], (double)r[i]);
    }
    cti_cpu_matmul_set_backend(dt, CT_GEMM_DEFAULT);
}

Test(matmul, bf16_into_f32_convert) { ct_set_seed(10); check_f32_out(CT_DTYPE_BF16, CT_GEMM_CONVERT, "bf16->f32 convert"); }
Test(matmul, bf16_into_f32_onednn) { ct_set_seed(11); check_f32_out(CT_DTYPE_BF16, CT_GEMM_ONEDNN, "bf16->f32 onednn"); }
Test(matmul, f16_into_f32_convert) { ct_set_seed(12); check_f32_out(CT_DTYPE_F16, CT_GEMM_CONVERT, "f16->f32 convert"); }

Test(matmul, default_backends_follow_cpu)
{
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_F64), CT_GEMM_OPENBLAS);
    ct_gemm_backend f32 = cti_cpu_matmul_backend(CT_DTYPE_F32);
    cr_assert(f32 == CT_GEMM_OPENBLAS || f32 == CT_GEMM_ONEDNN);
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_BF16), cti_cpu_has_bf16_gemm() ? CT_GEMM_ONEDNN : CT_GEMM_CONVERT);
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_F16), cti_cpu_has_f16_gemm() ? CT_GEMM_ONEDNN : CT_GEMM_CONVERT);
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_I32), CT_GEMM_DEFAULT);
    /* the default choice always works (falls back to convert if oneDNN lacks a kernel) */
    ct_set_seed(10);
    CT_FRAME {
        for (int dt = 0; dt < 4; dt++) {
            ct_tensor *a = operand((ct_dtype)dt, 0, NULL, 33, 20, false), *b = operand((ct_dtype)dt, 0, NULL, 20, 7, true);
            check_case(VIA_KERNEL, a, b, false, true, 1, 0, ct_dtype_name((ct_dtype)dt));
        }
    }
    cr_assert_neq(cti_cpu_matmul_set_backend(CT_DTYPE_F64, CT_GEMM_ONEDNN), CT_OK);
    cr_assert_neq(cti_cpu_matmul_set_backend(CT_DTYPE_BF16, CT_GEMM_OPENBLAS), CT_OK);
    cr_assert_neq(cti_cpu_matmul_set_backend(CT_DTYPE_F32, CT_GEMM_CONVERT), CT_OK);
    ERROR_HAS("convert", "f32");
}

Test(matmul, env_selects_backend)
{
    setenv("CTRAIN_SGEMM", "onednn", 1);
    setenv("CTRAIN_BF16_GEMM", "convert", 1);
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_F32), CT_GEMM_ONEDNN);
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_BF16), CT_GEMM_CONVERT);
    /* an override beats the env, DEFAULT restores it */
    cti_cpu_matmul_set_backend(CT_DTYPE_F32, CT_GEMM_OPENBLAS);
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_F32), CT_GEMM_OPENBLAS);
    cti_cpu_matmul_set_backend(CT_DTYPE_F32, CT_GEMM_DEFAULT);
    cr_assert_eq(cti_cpu_matmul_backend(CT_DTYPE_F32), CT_GEMM_ONEDNN);
}

Test(matmul, env_bad_value_is_an_error)
{
    setenv("CTRAIN_SGEMM", "mkl", 1);
    CT_FRAME {
        ct_tensor *a = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 2));
        cr_assert_null(ct_kernel_matmul(a, a, false, false));
        ERROR_HAS("CTRAIN_SGEMM", "mkl", "openblas");
    }
}

/* ---- layouts, batches, special sizes ----------------------------------------------- */

Test(matmul, broadcast_batch_shapes)
{
    ct_set_seed(11);
    CT_FRAME {
        ct_tensor *a = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(2, 1, 3, 4), 0, 1);
        ct_tensor *b = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(5, 4, 6), 0, 1);
        ct_tensor *o = ct_kernel_matmul(a, b, false, false);
        cr_assert_not_null(o, "%s", ct_last_error());
        int64_t want[] = {2, 5, 3, 6};
        cr_assert_eq(o->ndim, 4);
        for (int d = 0; d < 4; d++) cr_assert_eq(o->shape[d], want[d]);
        check_case(VIA_KERNEL, a, b, false, false, 1, 0, "(2,1,3,4)@(5,4,6)");
        /* 2-D against batched in both orders, and size-1 batches on both sides */
        check_case(VIA_KERNEL, ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(3, 4), 0, 1), b, false, false, 1, 0, "2-D @ 3-D");
        check_case(VIA_KERNEL, b, ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(6, 2), 0, 1), false, false, 1, 0, "3-D @ 2-D");
        check_case(VIA_KERNEL, ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(2, 1, 4, 3, 2), 0, 1),
                   ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(3, 1, 5, 3), 0, 1), true, true, 1, 0, "5-D");
    }
}

Test(matmul, small_batches_run_in_parallel)
{
    /* many GEMMs below the library's threading threshold: the OpenMP batch loop */
    ct_set_seed(12);
    ct_set_num_threads(2);
    CT_FRAME {
        for (int be = CT_GEMM_OPENBLAS; be <= CT_GEMM_ONEDNN; be++) {
            cti_cpu_matmul_set_backend(CT_DTYPE_F32, (ct_gemm_backend)be);
            ct_tensor *a = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(4, 16, 24, 20), 0, 1);
            ct_tensor *b = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(16, 24, 20), 0, 1);
            check_case(VIA_KERNEL, a, b, false, true, 1, 0, "small batched");
            check_case(VIA_KERNEL, a, b, true, false, 2, 0.5, "small batched alpha/beta");
            /* same inputs, same thread count: same bits */
            ct_tensor *o1 = ct_kernel_matmul(a, b, false, true), *o2 = ct_kernel_matmul(a, b, false, true);
            cr_assert(same_bits(o1, o2));
        }
        check_case(VIA_KERNEL, ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(32, 9, 5), 0, 1),
                   ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(32, 5, 11), 0, 1), false, false, 1, 0, "f64 small batched");
    }
}

Test(matmul, non_contiguous_inputs)
{
    ct_set_seed(13);
    for (int i = 0; i < 4; i++) {
        ct_dtype dt = float_dtypes[i];
        CT_FRAME {
            /* transposed views: the GEMM reads them through the transpose flag */
            ct_tensor *at = ct_tensor_transpose(ct_tensor_randn(dt, CT_SHAPE(19, 23), 0, 1), 0, 1); /* (23, 19) */
            ct_tensor *bt = ct_tensor_transpose(ct_tensor_randn(dt, CT_SHAPE(2, 7, 19), 0, 1), -1, -2); /* (2,19,7) */
            check_case(VIA_KERNEL, at, bt, false, false, 1, 0, "transposed views");
            check_case(VIA_KERNEL, at, ct_tensor_transpose(bt, -1, -2), false, true, 1, 0, "transposed view, trans_b");
            /* rows with a step (leading dim > cols), columns with a step (needs a copy) */
            ct_tensor *w = ct_tensor_randn(dt, CT_SHAPE(40, 30), 0, 1);
            ct_tensor *rows = ct_tensor_slice(w, 0, 1, 40, 3);   /* (13, 30), row stride 90 */
            ct_tensor *cols = ct_tensor_slice(w, 1, 0, 30, 2);   /* (40, 15), col stride 2 */
            ct_tensor *sub = ct_tensor_narrow(ct_tensor_narrow(w, 0, 5, 15), 1, 3, 13); /* offset, ld 30 */
            check_case(VIA_KERNEL, rows, ct_tensor_randn(dt, CT_SHAPE(30, 8), 0, 1), false, false, 1, 0, "row step");
            check_case(VIA_KERNEL, cols, ct_tensor_randn(dt, CT_SHAPE(40, 6), 0, 1), true, false, 1, 0, "col step");
            check_case(VIA_KERNEL, sub, sub, false, true, 1, 0, "narrowed");
            /* a batch dim the caller expanded (stride 0) and a batch slice with a step */
            ct_tensor *ex = ct_tensor_expand(ct_tensor_randn(dt, CT_SHAPE(1, 5, 6), 0, 1), CT_SHAPE(4, 5, 6));
            ct_tensor *bs = ct_tensor_slice(ct_tensor_randn(dt, CT_SHAPE(8, 6, 3), 0, 1), 0, 0, 8, 2);
            check_case(VIA_KERNEL, ex, bs, false, false, 1, 0, "expanded and stepped batches");
        }
    }
}

Test(matmul, out_alpha_beta_and_k_zero)
{
    ct_set_seed(14);
    for (int i = 0; i < 4; i++) {
        ct_dtype dt = float_dtypes[i];
        CT_FRAME {
            ct_tensor *a = ct_tensor_randn(dt, CT_SHAPE(2, 9, 14), 0, 1), *b = ct_tensor_randn(dt, CT_SHAPE(14, 5), 0, 1);
            check_case(VIA_KERNEL, a, b, false, false, 0.5, -1.5, "alpha/beta");
            check_case(VIA_KERNEL, a, b, false, false, 1, 1, "accumulate");
            check_case(VIA_KERNEL, a, b, false, false, 0, 2, "alpha = 0");
            /* beta = 0 never reads out */
            ct_tensor *nan = ct_tensor_full(dt, CT_SHAPE(2, 9, 5), NAN);
            cr_assert_eq(ct_kernel_matmul_out(nan, a, b, false, false, 1, 0), CT_OK);
            ct_tensor *ref = ct_kernel_matmul(a, b, false, false);
            cr_assert(rel_err(nan, ref) == 0, "%s beta=0 read out", ct_dtype_name(dt));
            /* K = 0: the product is zero, out = beta * out */
            ct_tensor *a0 = ct_tensor_empty(dt, CT_SHAPE(3, 0)), *b0 = ct_tensor_empty(dt, CT_SHAPE(0, 4));
            ct_tensor *z = ct_kernel_matmul(a0, b0, false, false);
            cr_assert_not_null(z, "%s", ct_last_error());
            cr_assert_eq(z->shape[0], 3);
            cr_assert_eq(z->shape[1], 4);
            for (int j = 0; j < 12; j++) cr_assert_eq(ct_tensor_get(z, (int64_t[]){j / 4, j % 4}), 0.0);
            ct_tensor *o = ct_tensor_full(dt, CT_SHAPE(3, 4), 3);
            cr_assert_eq(ct_kernel_matmul_out(o, a0, b0, false, false, 1, 0.5), CT_OK);
            for (int j = 0; j < 12; j++) cr_assert_eq(ct_tensor_get(o, (int64_t[]){j / 4, j % 4}), 1.5);
            /* M = 0, N = 0: empty outputs */
            ct_tensor *e = ct_kernel_matmul(ct_tensor_empty(dt, CT_SHAPE(0, 5)), ct_tensor_empty(dt, CT_SHAPE(5, 2)),
                                            false, false);
            cr_assert(e && e->shape[0] == 0 && e->shape[1] == 2);
        }
    }
}

/* Callers on several threads at once: the convert path's workspace pool (4 slots,
 * so some calls fall back to the heap) and the oneDNN primitive cache are shared. */
Test(matmul, concurrent_callers)
{
    ct_set_seed(16);
    ct_set_num_threads(1);
    int bad = 0;
    #pragma omp parallel num_threads(4) reduction(+ : bad)
    {
        CT_FRAME {
            for (int it = 0; it < 6; it++) {
                int64_t m = 5 + 7 * it + omp_get_thread_num(), k = 9 + it, n = 11;
                ct_tensor *a = ct_tensor_randn(CT_DTYPE_BF16, CT_SHAPE(m, k), 0, 1);
                ct_tensor *b = ct_tensor_randn(CT_DTYPE_BF16, CT_SHAPE(k, n), 0, 1);
                ct_tensor *o = ct_kernel_matmul(a, b, false, false);
                ct_tensor *a32 = ct_tensor_cast(a, CT_DTYPE_F32), *b32 = ct_tensor_cast(b, CT_DTYPE_F32);
                ct_tensor *o32 = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(m, n));
                ct_tensor *ref = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(m, n));
                cti_cpu_matmul_ref(ref, a, b, false, false, 1, 0);
                if (!o || cti_cpu_matmul_onednn(o32, a32, b32, false, false, 1, 0)) {
                    bad++;
                    continue;
                }
                bad += rel_err(o, ref) > 1e-2;
                bad += rel_err(o32, ref) > 1e-6;
            }
        }
    }
    cr_assert_eq(bad, 0);
}

/* OpenBLAS stays single-threaded (its pthread pool would fight ctrain's OpenMP
 * pool); ctrain splits a large GEMM into panels on ct_get_num_threads() threads.
 * The same thread count gives the same bits; another count may round differently
 * (OpenBLAS picks its blocking by panel size). */
Test(matmul, panels_use_ctrain_threads_and_openblas_stays_single)
{
    ct_set_seed(15);
    cr_assert_eq(cti_cpu_matmul_set_backend(CT_DTYPE_F32, CT_GEMM_OPENBLAS), CT_OK);
    CT_FRAME {
        ct_tensor *a = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(203, 96), 0, 1);
        ct_tensor *b = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(96, 77), 0, 1);
        ct_tensor *ref = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(203, 77));
        cr_assert_eq(cti_cpu_matmul_ref(ref, a, b, false, false, 1, 0), CT_OK);
        for (int n = 1; n <= 3; n++) {
            ct_set_num_threads(n);
            openblas_set_num_threads(2); /* a program changing it must not matter */
            ct_tensor *c = ct_kernel_matmul(a, b, false, false);
            ct_tensor *ct = ct_kernel_matmul(b, a, true, true); /* (a b)^T: columns split */
            cr_assert_not_null(c);
            cr_assert_eq(openblas_get_num_threads(), 1);
            cr_assert_leq(rel_err(c, ref), 1e-6);
            cr_assert_leq(rel_err(ct_tensor_transpose(ct, 0, 1), ref), 1e-6);
            ct_tensor *again = ct_kernel_matmul(a, b, false, false);
            cr_assert(same_bits(again, c), "threads %d", n);
        }
        ct_set_num_threads(0);
    }
}

/* ---- bad input ----------------------------------------------------------------------- */

Test(matmul, errors_name_op_and_shapes)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 3)), *b = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(4, 2));
        cr_assert_null(ct_kernel_matmul(a, b, false, false));
        ERROR_HAS("matmul", "inner", "f32[2, 3]", "f32[4, 2]", "K=3", "K=4");
        cr_assert_null(ct_kernel_matmul(a, a, false, false));
        cr_assert_not_null(ct_kernel_matmul(a, a, false, true), "(2,3) @ (2,3)^T is fine");

        ct_tensor *d = ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(3, 2));
        cr_assert_null(ct_kernel_matmul(a, d, false, false));
        ERROR_HAS("matmul", "dtype", "f32[2, 3]", "f64[3, 2]");

        ct_tensor *v = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3));
        cr_assert_null(ct_kernel_matmul(a, v, false, false));
        ERROR_HAS("matmul", "2 dims", "f32[3]");

        ct_tensor *i = ct_tensor_ones(CT_DTYPE_I32, CT_SHAPE(2, 2));
        cr_assert_null(ct_kernel_matmul(i, i, false, false));
        ERROR_HAS("matmul", "i32");

        ct_tensor *x = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 3, 4)), *y = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3, 4, 5));
        cr_assert_null(ct_kernel_matmul(x, y, false, false));
        ERROR_HAS("matmul", "broadcast", "f32[2, 3, 4]", "f32[3, 4, 5]");

        ct_tensor *m = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3, 2));
        ct_tensor *bad = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3));
        cr_assert_neq(ct_kernel_matmul_out(bad, a, m, false, false, 1, 0), CT_OK);
        ERROR_HAS("matmul_out", "f32[2, 3]", "[2, 2]", "f32[3, 2]");
        ct_tensor *badt = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2, 2));
        cr_assert_neq(ct_kernel_matmul_out(badt, a, m, false, false, 1, 0), CT_OK);
        ERROR_HAS("matmul_out", "f64[2, 2]", "f32");
        ct_tensor *nc = ct_tensor_transpose(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 2)), 0, 1);
        ct_tensor *nc3 = ct_tensor_slice(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 4)), 1, 0, 4, 2);
        cr_assert_eq(ct_kernel_matmul_out(nc, a, m, false, false, 1, 0), CT_ERR_INVALID, "a transposed out works? no");
        cr_assert_eq(ct_kernel_matmul_out(nc3, a, m, false, false, 1, 0), CT_ERR_INVALID);
        ERROR_HAS("matmul_out", "contiguous");
        ct_tensor *sq = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 2));
        cr_assert_eq(ct_kernel_matmul_out(sq, sq, sq, false, false, 1, 0), CT_ERR_INVALID);
        ERROR_HAS("matmul_out", "shares storage");

        /* NULL inputs return NULL and keep the first message */
        cr_assert_null(ct_kernel_matmul(a, b, false, false));
        cr_assert_null(ct_kernel_matmul(NULL, b, false, false));
        cr_assert_null(ct_kernel_matmul(a, NULL, false, false));
        ERROR_HAS("inner");
        cr_assert_neq(ct_kernel_matmul_out(NULL, a, b, false, false, 1, 0), CT_OK);
        ERROR_HAS("inner");
        ct_error_clear();
        cr_assert_eq(ct_kernel_matmul_out(sq, NULL, sq, false, false, 1, 0), CT_ERR_INVALID);
        ERROR_HAS("matmul_out", "NULL");
    }
}

Test(cpu_features, agrees_with_compiler_builtin)
{
    const ct_cpu_features *f = cti_cpu_features_get();
    __builtin_cpu_init();
    cr_assert_eq(f->avx2, !!__builtin_cpu_supports("avx2"));
    cr_assert_eq(f->fma, !!__builtin_cpu_supports("fma"));
    cr_assert_eq(f->avx512f, !!__builtin_cpu_supports("avx512f"));
    cr_assert_eq(f->avx512_vnni, !!__builtin_cpu_supports("avx512vnni"));
    char buf[256];
    cti_cpu_features_str(buf, sizeof buf);
    cr_assert(!f->avx2 || strstr(buf, "avx2"), "%s", buf);
    cr_assert(cti_cpu_has_bf16_gemm() == (f->avx512_bf16 || (f->amx_tile && f->amx_bf16)));
}

/* ct_kernel_linear on the CPU (the composition of copy, GEMM and GELU) against the
 * formula in double: y = gelu?(x @ w + bias), w stored (in, out). */
static void linear_case(ct_dtype dt, int nd, const int64_t *xshape, int64_t O, bool bias, bool gelu, double tol)
{
    CT_FRAME {
        const int64_t IN = xshape[nd - 1];
        ct_tensor *x = ct_tensor_randn(dt, nd, xshape, 0, 1);
        ct_tensor *w = ct_tensor_randn(dt, CT_SHAPE(IN, O), 0, 0.3);
        ct_tensor *b = bias ? ct_tensor_randn(dt, CT_SHAPE(O), 0, 1) : NULL;
        ct_tensor *y = ct_kernel_linear(x, w, b, gelu);
        cr_assert_not_null(y, "%s", ct_last_error());
        cr_assert_eq(y->ndim, nd);
        cr_assert_eq(y->shape[nd - 1], O);
        const double *xp = f64_data(x), *wp = f64_data(w), *bp = bias ? f64_data(b) : NULL;
        const int64_t R = ct_tensor_numel(x) / IN;
        double *want = malloc((size_t)(R * O) * sizeof *want);
        for (int64_t r = 0; r < R; r++)
            for (int64_t o = 0; o < O; o++) {
                double v = bp ? bp[o] : 0;
                for (int64_t k = 0; k < IN; k++) v += xp[r * IN + k] * wp[k * O + o];
                if (gelu) v = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
                want[r * O + o] = v;
            }
        double e = rel_err_n(f64_data(y), want, R * O, false);
        free(want);
        cr_assert(e <= tol, "linear %s bias=%d gelu=%d: rel err %.3g > %.1g", ct_dtype_name(dt), bias, gelu, e, tol);
    }
}

Test(matmul, linear_bias_gelu_composition)
{
    for (int f = 0; f < 4; f++) {
        const bool bias = f & 1, gelu = f >> 1;
        linear_case(CT_DTYPE_F32, 2, (int64_t[]){9, 17}, 11, bias, gelu, 1e-5);
        linear_case(CT_DTYPE_F64, 3, (int64_t[]){2, 3, 8}, 5, bias, gelu, 1e-12);
        linear_case(CT_DTYPE_BF16, 1, (int64_t[]){13}, 4, bias, gelu, 3e-2);
    }
    CT_FRAME {
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(3, 4), 0, 1);
        ct_tensor *w = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(5, 2), 0, 1);
        cr_assert_null(ct_kernel_linear(x, w, NULL, false));
        cr_assert(strstr(ct_last_error(), "need x (..., in), w (in, out)"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_linear(NULL, w, NULL, false));
    }
}
