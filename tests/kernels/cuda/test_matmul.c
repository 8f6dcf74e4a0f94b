/* GPU conformance for matmul (kernels/cuda/matmul.cu through ct_kernel_matmul /
 * ct_kernel_matmul_out, and the plain CUDA reference kernel): every dtype, both
 * transposes, broadcast batches, strided views, alpha/beta, f32 results of 16-bit
 * inputs, K = 0, TF32 on and off, all against the CPU reference (cti_cpu_matmul_ref,
 * sums in double). */
#include <string.h>

#include "kernels/cpu/matmul.h"
#include "tests/gpu_conformance.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/matmul.h"
#endif

/* The bound for a GEMM result of dtype dt with K products per element. An f32 (or
 * f64) sum of K terms is rounded K times, where the reference rounds once (it sums in
 * double), so the f32 row is taken K times over. A 16-bit result is dominated by its
 * own final rounding: the f32 accumulation error is far below one ulp of bf16/f16,
 * so the table's row stands as is. */
static gpu_tolerance mm_tol(ct_dtype out_dt, int64_t K)
{
    if (out_dt == CT_DTYPE_F32 || out_dt == CT_DTYPE_F64) return gpu_tolerance_chain(out_dt, K > 1 ? (int)K : 1);
    return gpu_tolerance_of(out_dt);
}

/* TF32 keeps 10 of an f32 input's 23 mantissa bits (the tensor cores may simply drop
 * the rest: a relative error below 2^-10 per input), so a product is off by up to 2^-9
 * of itself and the sum by 2^-9 * sum_k |a_k b_k| <= 2^-9 K for inputs in [-1, 1]:
 * about 977 K times the f32 row's atol of 2e-6, taken as 1024 K steps of the f32 row.
 * Rigorous, hence loose; the test also runs inputs that TF32 holds exactly, which must
 * meet the plain f32 bound. */
static gpu_tolerance mm_tol_tf32(int64_t K) { return gpu_tolerance_chain(CT_DTYPE_F32, 1024 * (int)(K > 1 ? K : 1)); }

/* t (f32, contiguous) rounded to multiples of 1/64: 7 significant bits, exact in TF32. */
static ct_tensor *tf32_exact(ct_tensor *t)
{
    float *p = ct_tensor_data(t);
    for (int64_t i = 0; i < ct_tensor_numel(t); i++) p[i] = roundf(p[i] * 64.0f) / 64.0f;
    return t;
}

/* out = alpha op(a) op(b) + beta out0 on the GPU (entry point and CUDA reference) vs the CPU
 * reference; a and b are CPU tensors (any views) and ga, gb the same views built on GPU
 * copies of their bases (ct_tensor_to makes a contiguous copy, so a view is made again
 * on the GPU side); out of out_dt. */
static void mm_check_views(const ct_tensor *a, const ct_tensor *b, ct_tensor *ga, ct_tensor *gb, bool ta, bool tb,
                           double alpha, double beta, ct_dtype out_dt, gpu_tolerance tol, uint64_t seed,
                           const char *what)
{
    CT_FRAME {
        ct_tensor *probe = ct_kernel_matmul(a, b, ta, tb);
        cr_assert_not_null(probe, "%s: %s", what, ct_last_error());
        ct_tensor *out0 = gpu_rand_cpu(out_dt, probe->ndim, probe->shape, seed, -1, 1);
        ct_tensor *ref = ct_tensor_clone(out0);
        cr_assert_eq(cti_cpu_matmul_ref(ref, a, b, ta, tb, alpha, beta), CT_OK, "%s: %s", what, ct_last_error());

        cr_assert(ga && gb, "%s: %s", what, ct_last_error());
        cr_assert(ct_tensor_same_shape(a, ga) && ct_tensor_same_shape(b, gb), "%s: views differ", what);
        ct_tensor *gout = gpu_of(out0);
        cr_assert_eq(ct_kernel_matmul_out(gout, ga, gb, ta, tb, alpha, beta), CT_OK, "%s: %s", what,
                     ct_last_error());
        char w[300];
        snprintf(w, sizeof w, "%s (ta=%d tb=%d alpha=%g beta=%g) matmul_out", what, ta, tb, alpha, beta);
        gpu_expect_close_tol(gout, ref, tol, w);
        if (alpha == 1 && beta == 0 && out_dt == a->dtype) {
            snprintf(w, sizeof w, "%s (ta=%d tb=%d) matmul", what, ta, tb);
            gpu_expect_close_tol(ct_kernel_matmul(ga, gb, ta, tb), ref, tol, w);
        }
#ifdef CT_HAVE_CUDA
        ct_tensor *gref = gpu_of(out0);
        cr_assert_eq(cti_cuda_matmul_ref(gref, ga, gb, ta, tb, alpha, beta), CT_OK, "%s: %s", what, ct_last_error());
        snprintf(w, sizeof w, "%s (ta=%d tb=%d alpha=%g beta=%g) CUDA reference", what, ta, tb, alpha, beta);
        /* both sum in double and round once */
        gpu_expect_close(gref, ref, w);
#endif
    }
}

static void mm_check_tol(const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, double alpha, double beta,
                         ct_dtype out_dt, gpu_tolerance tol, uint64_t seed, const char *what)
{
    CT_FRAME {
        mm_check_views(a, b, gpu_of(a), gpu_of(b), ta, tb, alpha, beta, out_dt, tol, seed, what);
    }
}

static void mm_check(const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, double alpha, double beta,
                     ct_dtype out_dt, uint64_t seed, const char *what)
{
    const int64_t K = a->shape[a->ndim - (ta ? 2 : 1)];
    mm_check_tol(a, b, ta, tb, alpha, beta, out_dt, mm_tol(out_dt, K), seed, what);
}

/* mm_check for views: ga, gb the GPU views matching a, b. */
static void mm_check_v(const ct_tensor *a, const ct_tensor *b, ct_tensor *ga, ct_tensor *gb, ct_dtype out_dt,
                       uint64_t seed, const char *what)
{
    mm_check_views(a, b, ga, gb, false, false, 1, 0, out_dt, mm_tol(out_dt, a->shape[a->ndim - 1]), seed, what);
}

/* A random CPU operand whose op() is rows x cols: stored (batch..., cols, rows) when trans. */
static ct_tensor *operand(ct_dtype dt, int nb, const int64_t *batch, int64_t rows, int64_t cols, bool trans,
                          uint64_t seed)
{
    int64_t shape[CT_MAX_DIMS];
    if (nb) memcpy(shape, batch, (size_t)nb * sizeof *shape);
    shape[nb] = trans ? cols : rows;
    shape[nb + 1] = trans ? rows : cols;
    return gpu_rand_cpu(dt, nb + 2, shape, seed, -1, 1);
}

static const ct_dtype mm_dtypes[] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

Test(gpu_matmul, every_dtype_transposes_odd_sizes)
{
    GPU_REQUIRE();
    static const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {127, 129, 65}, {64, 32, 256}};
    for (size_t d = 0; d < 4; d++)
        for (size_t s = 0; s < 4; s++)
            for (int t = 0; t < 4; t++) CT_FRAME {
                    const bool ta = t & 1, tb = t >> 1;
                    const int64_t M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
                    ct_tensor *a = operand(mm_dtypes[d], 0, NULL, M, K, ta, 100 + s);
                    ct_tensor *b = operand(mm_dtypes[d], 0, NULL, K, N, tb, 200 + s);
                    char w[120];
                    snprintf(w, sizeof w, "%s %lldx%lldx%lld", ct_dtype_name(mm_dtypes[d]), (long long)M, (long long)N,
                             (long long)K);
                    mm_check(a, b, ta, tb, 1, 0, mm_dtypes[d], 300 + s, w);
                }
}

Test(gpu_matmul, broadcast_batches)
{
    GPU_REQUIRE();
    for (size_t d = 0; d < 4; d++) CT_FRAME {
            const ct_dtype dt = mm_dtypes[d];
            /* (2,1,M,K) @ (3,K,N) -> (2,3,M,N): a repeats over the inner dim, b over the outer */
            ct_tensor *a = operand(dt, 2, (int64_t[]){2, 1}, 5, 7, false, 1);
            ct_tensor *b = operand(dt, 1, (int64_t[]){3}, 7, 6, false, 2);
            mm_check(a, b, false, false, 1, 0, dt, 3, "(2,1,5,7) @ (3,7,6)");
            /* a batched, b a plain matrix (one stride of 0) */
            a = operand(dt, 1, (int64_t[]){4}, 9, 33, true, 4);
            b = operand(dt, 0, NULL, 33, 17, true, 5);
            mm_check(a, b, true, true, 1, 0, dt, 6, "(4,33,9)^T @ (17,33)^T");
            /* the same batch on both sides, three dims */
            a = operand(dt, 3, (int64_t[]){2, 3, 2}, 16, 8, false, 7);
            b = operand(dt, 3, (int64_t[]){2, 3, 2}, 8, 12, true, 8);
            mm_check(a, b, false, true, 1, 0, dt, 9, "(2,3,2,16,8) @ (2,3,2,12,8)^T");
        }
}

Test(gpu_matmul, batch_dims_that_do_not_share_a_stride)
{
    GPU_REQUIRE();
    CT_FRAME {
        /* a (3,2,M,K) with its batch dims swapped: (2,3) whose strides are not one
         * stride per batch, so the outer dim is looped over */
        ct_tensor *base = operand(CT_DTYPE_F32, 2, (int64_t[]){3, 2}, 11, 13, false, 10);
        ct_tensor *a = ct_tensor_transpose(base, 0, 1);
        ct_tensor *b = operand(CT_DTYPE_F32, 2, (int64_t[]){2, 3}, 13, 7, false, 11);
        mm_check_v(a, b, ct_tensor_transpose(gpu_of(base), 0, 1), gpu_of(b), CT_DTYPE_F32, 12, "batch-transposed a");
        /* an expanded batch dim (stride 0) inside a real one */
        ct_tensor *c = operand(CT_DTYPE_BF16, 2, (int64_t[]){4, 1}, 6, 10, false, 13);
        ct_tensor *ce = ct_tensor_expand(c, 4, (int64_t[]){4, 5, 6, 10});
        ct_tensor *d = operand(CT_DTYPE_BF16, 2, (int64_t[]){4, 5}, 10, 3, false, 14);
        mm_check_v(ce, d, ct_tensor_expand(gpu_of(c), 4, (int64_t[]){4, 5, 6, 10}), gpu_of(d), CT_DTYPE_BF16, 15,
                   "expanded batch dim");
    }
}

Test(gpu_matmul, strided_views)
{
    GPU_REQUIRE();
    for (size_t d = 0; d < 4; d++) CT_FRAME {
            const ct_dtype dt = mm_dtypes[d];
            /* columns 1.. of a wider matrix: row stride K + 3, data starting one element in
             * (not aligned for vector loads) */
            ct_tensor *wide = gpu_rand_cpu(dt, 2, (int64_t[]){37, 43}, 20, -1, 1);
            ct_tensor *a = ct_tensor_narrow(wide, 1, 1, 40), *ga = ct_tensor_narrow(gpu_of(wide), 1, 1, 40);
            ct_tensor *b = operand(dt, 0, NULL, 40, 19, false, 21);
            mm_check_v(a, b, ga, gpu_of(b), dt, 22, "column-sliced a");
            /* a transposed view given without the flag */
            ct_tensor *bb = operand(dt, 0, NULL, 40, 19, true, 23);
            ct_tensor *bt = ct_tensor_transpose(bb, 0, 1), *gbt = ct_tensor_transpose(gpu_of(bb), 0, 1);
            mm_check_v(a, bt, ga, gbt, dt, 24, "transposed view b");
            /* every other column: neither unit-stride, so copied first */
            ct_tensor *base = gpu_rand_cpu(dt, 2, (int64_t[]){37, 80}, 25, -1, 1);
            ct_tensor *s = ct_tensor_slice(base, 1, 0, 80, 2), *gs = ct_tensor_slice(gpu_of(base), 1, 0, 80, 2);
            mm_check_v(s, b, gs, gpu_of(b), dt, 26, "step-2 columns");
            /* rows 2.. of a matrix, as b (offset data, row stride as is) */
            ct_tensor *tall = gpu_rand_cpu(dt, 2, (int64_t[]){45, 19}, 27, -1, 1);
            mm_check_v(a, ct_tensor_narrow(tall, 0, 2, 40), ga, ct_tensor_narrow(gpu_of(tall), 0, 2, 40), dt, 28,
                       "row-sliced b");
        }
}

Test(gpu_matmul, alpha_beta_and_f32_out)
{
    GPU_REQUIRE();
    static const double ab[][2] = {{0.5, -1.5}, {1, 1}, {-2, 0}};
    for (size_t d = 0; d < 4; d++)
        for (size_t k = 0; k < 3; k++) CT_FRAME {
                const ct_dtype dt = mm_dtypes[d];
                ct_tensor *a = operand(dt, 1, (int64_t[]){2}, 33, 65, false, 30);
                ct_tensor *b = operand(dt, 0, NULL, 65, 31, true, 31);
                mm_check(a, b, false, true, ab[k][0], ab[k][1], dt, 32, ct_dtype_name(dt));
                if (dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16) /* the f32 accumulator is the result */
                    mm_check(a, b, false, true, ab[k][0], ab[k][1], CT_DTYPE_F32, 33, "16-bit inputs, f32 out");
            }
}

Test(gpu_matmul, beta_zero_never_reads_out)
{
    GPU_REQUIRE();
    for (size_t d = 0; d < 4; d++) CT_FRAME {
            const ct_dtype dt = mm_dtypes[d];
            ct_tensor *a = operand(dt, 0, NULL, 9, 17, false, 40), *b = operand(dt, 0, NULL, 17, 5, false, 41);
            ct_tensor *ref = ct_tensor_empty(dt, CT_SHAPE(9, 5));
            cr_assert_eq(cti_cpu_matmul_ref(ref, a, b, false, false, 1, 0), CT_OK);
            ct_tensor *out = ct_tensor_empty(dt, CT_SHAPE(9, 5));
            ct_tensor_fill_(out, NAN);
            ct_tensor *gout = gpu_of(out);
            cr_assert_eq(ct_kernel_matmul_out(gout, gpu_of(a), gpu_of(b), false, false, 1, 0), CT_OK, "%s",
                         ct_last_error());
            gpu_expect_close_tol(gout, ref, mm_tol(dt, 17), "NaN-filled out, beta 0");
        }
}

Test(gpu_matmul, k_zero_and_empty)
{
    GPU_REQUIRE();
    for (size_t d = 0; d < 4; d++) CT_FRAME {
            const ct_dtype dt = mm_dtypes[d];
            ct_tensor *a = gpu_rand_cpu(dt, 2, (int64_t[]){4, 0}, 50, -1, 1);
            ct_tensor *b = gpu_rand_cpu(dt, 2, (int64_t[]){0, 3}, 51, -1, 1);
            mm_check(a, b, false, false, 1, 0, dt, 52, "K = 0, beta 0");
            mm_check(a, b, false, false, 1, 2.5, dt, 53, "K = 0, beta 2.5");
            ct_tensor *e = gpu_rand_cpu(dt, 3, (int64_t[]){0, 4, 5}, 54, -1, 1);
            ct_tensor *f = gpu_rand_cpu(dt, 2, (int64_t[]){5, 3}, 55, -1, 1);
            ct_tensor *g = ct_kernel_matmul(gpu_of(e), gpu_of(f), false, false);
            cr_assert_not_null(g, "%s", ct_last_error());
            cr_assert_eq(ct_tensor_numel(g), 0);
        }
}

Test(gpu_matmul, tf32_off_and_on)
{
    GPU_REQUIRE();
    const bool was = ct_cuda_allow_tf32();
    CT_FRAME {
        ct_tensor *a = operand(CT_DTYPE_F32, 1, (int64_t[]){3}, 96, 200, false, 60);
        ct_tensor *b = operand(CT_DTYPE_F32, 0, NULL, 200, 80, false, 61);
        ct_cuda_set_allow_tf32(false);
        mm_check(a, b, false, false, 1, 0, CT_DTYPE_F32, 62, "f32, TF32 off");
        ct_cuda_set_allow_tf32(true);
        mm_check_tol(a, b, false, false, 1, 0, CT_DTYPE_F32, mm_tol_tf32(200), 62, "f32, TF32 on");
        /* inputs TF32 holds exactly: only the f32 accumulation is left, as with TF32 off */
        ct_tensor *ae = tf32_exact(operand(CT_DTYPE_F32, 1, (int64_t[]){3}, 96, 200, false, 65));
        ct_tensor *be = tf32_exact(operand(CT_DTYPE_F32, 0, NULL, 200, 80, true, 66));
        mm_check(ae, be, false, true, 1, 0, CT_DTYPE_F32, 67, "f32, TF32 on, TF32-exact inputs");
        ct_tensor *at = operand(CT_DTYPE_F32, 1, (int64_t[]){3}, 96, 200, true, 63);
        mm_check_tol(at, b, true, false, 0.5, 1, CT_DTYPE_F32, mm_tol_tf32(200), 64, "f32, TF32 on, transposed a, beta 1");
    }
    ct_cuda_set_allow_tf32(was);
}

Test(gpu_matmul, errors_on_gpu_tensors)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *a = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){3, 4}, 70, -1, 1);
        ct_tensor *b = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){4, 5}, 71, -1, 1);
        ct_tensor *ga = gpu_of(a), *gb = gpu_of(b);
        /* a CPU and a GPU operand: an error naming both devices */
        cr_assert_null(ct_kernel_matmul(ga, b, false, false));
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
        /* the CPU's shape and dtype errors, on the GPU */
        cr_assert_null(ct_kernel_matmul(ga, ga, false, false));
        cr_assert(strstr(ct_last_error(), "inner dimensions differ"), "%s", ct_last_error());
        ct_tensor *h = gpu_of(gpu_rand_cpu(CT_DTYPE_BF16, 2, (int64_t[]){4, 5}, 72, -1, 1));
        cr_assert_null(ct_kernel_matmul(ga, h, false, false));
        cr_assert(strstr(ct_last_error(), "dtype mismatch"), "%s", ct_last_error());
        ct_tensor *out_cpu = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(3, 5));
        cr_assert_neq(ct_kernel_matmul_out(out_cpu, ga, gb, false, false, 1, 0), CT_OK);
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
    }
}
