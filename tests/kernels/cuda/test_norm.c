/* GPU conformance: layernorm and rmsnorm (kernels/cuda/norm.cu) against the CPU
 * reference kernels (kernels/cpu/norm.c): y, mean, rstd, dx, dw, db, every float
 * dtype, with and without affine parameters (of x's dtype or another), the
 * warp-per-row and block-per-row paths and several row chunks for dw and db. */
#include "tests/gpu_conformance.h"

#include "kernels/cpu/norm.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/norm.h"
#endif

static const ct_dtype dtypes[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

static ct_tensor *gpu_or_null(const ct_tensor *t) { return t ? gpu_of(t) : NULL; }

static ct_tensor *empty_cpu(ct_dtype dt, int ndim, const int64_t *shape) { return ct_tensor_empty(dt, ndim, shape); }

/* x (CPU, any layout), w and b (CPU or NULL): the forward and backward of layernorm
 * (center) or rmsnorm on the GPU (entry point and CUDA reference) against the CPU
 * reference. */
static void check(ct_tensor *x, ct_tensor *w, ct_tensor *b, double eps, bool center, uint64_t seed, const char *what)
{
    char msg[200];
    const char *op = center ? "layernorm" : "rmsnorm";
    ct_dtype sd = x->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32;
    const int64_t C = x->shape[x->ndim - 1];
    ct_tensor *xc = ct_tensor_contiguous(x);
    ct_tensor *y = empty_cpu(x->dtype, x->ndim, x->shape), *mean = empty_cpu(sd, x->ndim - 1, x->shape);
    ct_tensor *rstd = empty_cpu(sd, x->ndim - 1, x->shape);
    ct_status st = center ? cti_cpu_layernorm_ref(xc, w, b, eps, y, mean, rstd) : cti_cpu_rmsnorm_ref(xc, w, eps, y, rstd);
    cr_assert_eq(st, CT_OK, "%s", ct_last_error());

    ct_tensor *gx = gpu_of(x), *gw = gpu_or_null(w), *gb = gpu_or_null(b), *gy = NULL, *gm = NULL, *gr = NULL;
    st = center ? ct_kernel_layernorm(gx, gw, gb, eps, &gy, &gm, &gr) : ct_kernel_rmsnorm(gx, gw, eps, &gy, &gr);
    cr_assert_eq(st, CT_OK, "%s %s: %s", what, op, ct_last_error());
    snprintf(msg, sizeof msg, "%s %s y", what, op);
    gpu_expect_close(gy, y, msg);
    snprintf(msg, sizeof msg, "%s %s rstd", what, op);
    gpu_expect_close(gr, rstd, msg);
    if (center) {
        snprintf(msg, sizeof msg, "%s %s mean", what, op);
        gpu_expect_close(gm, mean, msg);
    }

    /* backward at the reference's statistics */
    ct_tensor *dy = gpu_rand_cpu(x->dtype, x->ndim, x->shape, seed, -1, 1);
    ct_tensor *dx = empty_cpu(x->dtype, x->ndim, x->shape);
    ct_tensor *dw = w ? empty_cpu(w->dtype, 1, &C) : NULL;
    ct_tensor *db = center ? empty_cpu(w ? w->dtype : x->dtype, 1, &C) : NULL;
    st = center ? cti_cpu_layernorm_backward_ref(dy, xc, w, mean, rstd, dx, dw, db)
                : cti_cpu_rmsnorm_backward_ref(dy, xc, w, rstd, dx, dw);
    cr_assert_eq(st, CT_OK, "%s", ct_last_error());
    ct_tensor *gdy = gpu_of(dy), *gmean = gpu_of(mean), *grstd = gpu_of(rstd), *gdx = NULL, *gdw = NULL, *gdb = NULL;
    st = center ? ct_kernel_layernorm_backward(gdy, gx, gw, gmean, grstd, &gdx, &gdw, &gdb)
                : ct_kernel_rmsnorm_backward(gdy, gx, gw, grstd, &gdx, &gdw);
    cr_assert_eq(st, CT_OK, "%s %s backward: %s", what, op, ct_last_error());
    snprintf(msg, sizeof msg, "%s %s dx", what, op);
    gpu_expect_close(gdx, dx, msg);
    if (w) {
        snprintf(msg, sizeof msg, "%s %s dw", what, op);
        gpu_expect_close(gdw, dw, msg);
    }
    if (center) {
        snprintf(msg, sizeof msg, "%s %s db", what, op);
        gpu_expect_close(gdb, db, msg);
    }
#ifdef CT_HAVE_CUDA
    /* the CUDA reference kernels, called directly on contiguous GPU tensors */
    ct_tensor *gxc = gpu_of(xc);
    ct_tensor *ry = ct_tensor_empty_on(CT_CUDA(0), x->dtype, x->ndim, x->shape);
    ct_tensor *rm = ct_tensor_empty_on(CT_CUDA(0), sd, x->ndim - 1, x->shape);
    ct_tensor *rr = ct_tensor_empty_on(CT_CUDA(0), sd, x->ndim - 1, x->shape);
    st = center ? cti_cuda_layernorm_ref(gxc, gw, gb, eps, ry, rm, rr) : cti_cuda_rmsnorm_ref(gxc, gw, eps, ry, rr);
    cr_assert_eq(st, CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s %s y (CUDA reference)", what, op);
    gpu_expect_close(ry, y, msg);
    snprintf(msg, sizeof msg, "%s %s rstd (CUDA reference)", what, op);
    gpu_expect_close(rr, rstd, msg);
    ct_tensor *rdx = ct_tensor_empty_on(CT_CUDA(0), x->dtype, x->ndim, x->shape);
    ct_tensor *rdw = w ? ct_tensor_empty_on(CT_CUDA(0), w->dtype, 1, &C) : NULL;
    ct_tensor *rdb = center ? ct_tensor_empty_on(CT_CUDA(0), w ? w->dtype : x->dtype, 1, &C) : NULL;
    st = center ? cti_cuda_layernorm_backward_ref(gdy, gxc, gw, gmean, grstd, rdx, rdw, rdb)
                : cti_cuda_rmsnorm_backward_ref(gdy, gxc, gw, grstd, rdx, rdw);
    cr_assert_eq(st, CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s %s dx (CUDA reference)", what, op);
    gpu_expect_close(rdx, dx, msg);
    if (w) {
        snprintf(msg, sizeof msg, "%s %s dw (CUDA reference)", what, op);
        gpu_expect_close(rdw, dw, msg);
    }
    if (center) {
        snprintf(msg, sizeof msg, "%s %s db (CUDA reference)", what, op);
        gpu_expect_close(rdb, db, msg);
    }
#endif
}

/* Every dtype; layernorm with w and b, without them, rmsnorm with and without w;
 * parameters of x's dtype, or of pdt when pdt is valid. */
static void check_all(int ndim, const int64_t *shape, uint64_t seed, double eps, int pdt)
{
    const int64_t C = shape[ndim - 1];
    for (int k = 0; k < 4; k++)
        for (int variant = 0; variant < 4; variant++) CT_FRAME {
                ct_dtype dt = dtypes[k], wdt = pdt >= 0 ? (ct_dtype)pdt : dt;
                uint64_t s = seed + 100 * k + 10 * variant;
                ct_tensor *x = gpu_rand_cpu(dt, ndim, shape, s, -3, 5); /* a mean away from 0 */
                bool center = variant < 2, affine = variant % 2 == 0;
                ct_tensor *w = affine ? gpu_rand_cpu(wdt, 1, &C, s + 1, 0.5, 1.5) : NULL;
                ct_tensor *b = affine && center ? gpu_rand_cpu(wdt, 1, &C, s + 2, -1, 1) : NULL;
                char what[160], sh[64];
                snprintf(what, sizeof what, "%s%s, w %s", ct_dtype_name(dt), ct_shape_str(ndim, shape, sh, sizeof sh),
                         affine ? ct_dtype_name(wdt) : "none");
                check(x, w, b, eps, center, s + 3, what);
            }
}

Test(gpu_norm, short_rows_one_warp_each)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){1, 1}, 100, 1e-5, -1);
    check_all(2, (int64_t[]){3, 5}, 200, 1e-5, -1);
    check_all(3, (int64_t[]){2, 3, 33}, 300, 1e-6, -1);
    check_all(2, (int64_t[]){9, 1024}, 400, 1e-5, -1);
}

Test(gpu_norm, long_rows_one_block_each)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){3, 1025}, 500, 1e-5, -1);
    check_all(2, (int64_t[]){4, 4099}, 600, 1e-5, -1);
}

Test(gpu_norm, many_rows_several_chunks)
{
    GPU_REQUIRE();
    /* more rows than one chunk of the dw/db partial sums, columns not a multiple of 32 */
    check_all(2, (int64_t[]){1000, 45}, 700, 1e-5, -1);
    check_all(3, (int64_t[]){3, 200, 70}, 800, 1e-5, -1);
}

Test(gpu_norm, parameters_of_another_dtype)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){17, 40}, 900, 1e-5, CT_DTYPE_F32);
    check_all(2, (int64_t[]){17, 40}, 1000, 1e-5, CT_DTYPE_BF16);
    check_all(2, (int64_t[]){5, 1100}, 1100, 1e-5, CT_DTYPE_F64);
}

Test(gpu_norm, no_rows)
{
    GPU_REQUIRE();
    CT_FRAME {
        /* dw and db of no rows are zeros, like the CPU's */
        const int64_t C = 6;
        ct_tensor *x = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, 2, (int64_t[]){0, C}));
        ct_tensor *w = gpu_of(ct_tensor_ones(CT_DTYPE_F32, 1, &C));
        ct_tensor *y, *mean, *rstd, *dx, *dw, *db;
        cr_assert_eq(ct_kernel_layernorm(x, w, NULL, 1e-5, &y, &mean, &rstd), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_kernel_layernorm_backward(x, x, w, mean, rstd, &dx, &dw, &db), CT_OK, "%s", ct_last_error());
        gpu_expect_equal(dw, ct_tensor_zeros(CT_DTYPE_F32, 1, &C), "dw of no rows");
        gpu_expect_equal(db, ct_tensor_zeros(CT_DTYPE_F32, 1, &C), "db of no rows");
    }
}

Test(gpu_norm, non_contiguous_input)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++) CT_FRAME {
            ct_tensor *base = gpu_rand_cpu(dtypes[k], 2, (int64_t[]){40, 9}, 1200 + k, -2, 2);
            ct_tensor *x = ct_tensor_transpose(base, 0, 1); /* (9, 40) */
            ct_tensor *w = gpu_rand_cpu(dtypes[k], 1, (int64_t[]){40}, 1210 + k, 0.5, 1.5);
            ct_tensor *xc = ct_tensor_contiguous(x);
            ct_dtype sd = dtypes[k] == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32;
            ct_tensor *y = empty_cpu(dtypes[k], 2, x->shape), *m = empty_cpu(sd, 1, x->shape), *r = empty_cpu(sd, 1, x->shape);
            cr_assert_eq(cti_cpu_layernorm_ref(xc, w, NULL, 1e-5, y, m, r), CT_OK, "%s", ct_last_error());
            ct_tensor *gx = ct_tensor_transpose(gpu_of(base), 0, 1), *gy, *gm, *gr;
            cr_assert(!ct_tensor_is_contiguous(gx));
            cr_assert_eq(ct_kernel_layernorm(gx, gpu_of(w), NULL, 1e-5, &gy, &gm, &gr), CT_OK, "%s", ct_last_error());
            gpu_expect_close(gy, y, "layernorm of a transposed input");
        }
}

Test(gpu_norm, argument_errors)
{
    GPU_REQUIRE();
    CT_FRAME {
        const int64_t C = 4;
        ct_tensor *x = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, 2, (int64_t[]){2, C}));
        ct_tensor *y, *rstd;
        cr_assert_neq(ct_kernel_rmsnorm(x, NULL, -1, &y, &rstd), CT_OK);
        cr_assert(strstr(ct_last_error(), "eps"), "%s", ct_last_error());
        /* w on the CPU, x on the GPU: the message names both */
        ct_tensor *w = ct_tensor_ones(CT_DTYPE_F32, 1, &C);
        cr_assert_neq(ct_kernel_layernorm(x, w, NULL, 1e-5, &y, NULL, NULL), CT_OK);
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
        cr_assert_null(y);
    }
}
