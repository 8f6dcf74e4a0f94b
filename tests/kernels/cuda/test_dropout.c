/* GPU conformance: dropout (kernels/cuda/dropout.cu) against the CPU kernels
 * (kernels/cpu/dropout.c). Both draw the same Philox words (core/philox_bits.h), so
 * for a seed and offset the GPU's mask and output are the CPU's bit for bit, and the
 * generator advances by the same number of words; checked for several seeds,
 * offsets (on and off a block boundary) and sizes that are not multiples of 4. */
#include "tests/gpu_conformance.h"

#include <string.h>

#include "kernels/cpu/dropout.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/dropout.h"
#endif

static const ct_dtype dtypes[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

/* x (CPU, any layout): forward on both devices from the same (seed, offset), then the
 * backward of both from the CPU's mask. */
static void check(ct_tensor *x, double p, uint64_t seed, uint64_t offset, const char *what)
{
    char msg[200];
    ct_rng rc = {seed, offset}, rg = {seed, offset}, rr = {seed, offset};
    ct_tensor *mc = NULL, *mg = NULL;
    ct_tensor *yc = ct_kernel_dropout(x, p, &rc, &mc);
    cr_assert_not_null(yc, "%s", ct_last_error());
    ct_tensor *yg = ct_kernel_dropout(gpu_of(x), p, &rg, &mg);
    snprintf(msg, sizeof msg, "%s mask", what);
    gpu_expect_equal(mg, mc, msg);
    snprintf(msg, sizeof msg, "%s y", what);
    gpu_expect_equal(yg, yc, msg);
    cr_assert_eq(rg.offset, rc.offset, "%s: the generator advanced to %llu on the GPU, %llu on the CPU", what,
                 (unsigned long long)rg.offset, (unsigned long long)rc.offset);
    /* the literal rule in double */
    ct_tensor *xc = ct_tensor_contiguous(x);
    ct_tensor *yr = ct_tensor_empty(x->dtype, x->ndim, x->shape), *mr = ct_tensor_empty(CT_DTYPE_U8, x->ndim, x->shape);
    cr_assert_eq(cti_cpu_dropout_ref(xc, p, &rr, yr, mr), CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s y against the reference", what);
    gpu_expect_close(yg, yr, msg);
    snprintf(msg, sizeof msg, "%s mask against the reference", what);
    gpu_expect_equal(mg, mr, msg);

    ct_tensor *dy = gpu_rand_cpu(x->dtype, x->ndim, x->shape, seed + 7, -2, 2);
    ct_tensor *dxc = ct_kernel_dropout_backward(dy, mc, p);
    cr_assert_not_null(dxc, "%s", ct_last_error());
    ct_tensor *dxr = ct_tensor_empty(x->dtype, x->ndim, x->shape);
    cr_assert_eq(cti_cpu_dropout_backward_ref(dy, mc, p, dxr), CT_OK, "%s", ct_last_error());
    ct_tensor *dxg = ct_kernel_dropout_backward(gpu_of(dy), gpu_of(mc), p);
    snprintf(msg, sizeof msg, "%s dx", what);
    gpu_expect_equal(dxg, dxc, msg);
    gpu_expect_close(dxg, dxr, msg);
#ifdef CT_HAVE_CUDA
    ct_rng rq = {seed, offset};
    ct_tensor *gy = ct_tensor_empty_on(CT_CUDA(0), x->dtype, x->ndim, x->shape);
    ct_tensor *gm = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_U8, x->ndim, x->shape);
    cr_assert_eq(cti_cuda_dropout_ref(gpu_of(xc), p, &rq, gy, gm), CT_OK, "%s", ct_last_error());
    cr_assert_eq(rq.offset, rc.offset, "%s: the CUDA reference advanced the generator differently", what);
    snprintf(msg, sizeof msg, "%s mask (CUDA reference)", what);
    gpu_expect_equal(gm, mc, msg);
    snprintf(msg, sizeof msg, "%s y (CUDA reference)", what);
    gpu_expect_close(gy, yr, msg);
    ct_tensor *gdx = ct_tensor_empty_on(CT_CUDA(0), x->dtype, x->ndim, x->shape);
    cr_assert_eq(cti_cuda_dropout_backward_ref(gpu_of(dy), gpu_of(mc), p, gdx), CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s dx (CUDA reference)", what);
    gpu_expect_close(gdx, dxr, msg);
#endif
}

Test(gpu_dropout, masks_equal_the_cpu_bit_for_bit)
{
    GPU_REQUIRE();
    const int64_t sizes[] = {1, 3, 4, 5, 7, 1023, 4097, 100003};
    const double ps[] = {0.1, 0.5, 0.9};
    const uint64_t seeds[] = {0, 42, 0xdeadbeefcafef00dull};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int k = 0; k < 4; k++) CT_FRAME {
                uint64_t seed = seeds[(si + k) % 3], offset = 4 * (uint64_t)(si * 5 + k);
                double p = ps[(si + k) % 3];
                ct_tensor *x = gpu_rand_cpu(dtypes[k], 1, &sizes[si], 100 + 10 * si + k, -3, 3);
                char what[120];
                snprintf(what, sizeof what, "%s n = %lld p = %g seed %llu offset %llu", ct_dtype_name(dtypes[k]),
                         (long long)sizes[si], p, (unsigned long long)seed, (unsigned long long)offset);
                check(x, p, seed, offset, what);
            }
}

Test(gpu_dropout, offsets_off_a_block_boundary)
{
    GPU_REQUIRE();
    /* an offset set by hand is rounded up to a whole block on both devices */
    const uint64_t offsets[] = {1, 2, 3, 6, 1001, 0xfffffffffffffff0ull};
    for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; i++) CT_FRAME {
            ct_tensor *x = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){13, 7}, 200 + i, -1, 1);
            char what[80];
            snprintf(what, sizeof what, "offset %llu", (unsigned long long)offsets[i]);
            check(x, 0.3, 99 + i, offsets[i], what);
        }
}

Test(gpu_dropout, p_zero_and_one)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++) CT_FRAME {
            ct_tensor *x = gpu_rand_cpu(dtypes[k], 2, (int64_t[]){9, 11}, 300 + k, -3, 3);
            check(x, 0, 5, 8, "p = 0");
            check(x, 1, 5, 8, "p = 1");
        }
}

Test(gpu_dropout, shapes_and_layouts)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++) CT_FRAME {
            check(gpu_rand_cpu(dtypes[k], 0, NULL, 400 + k, -1, 1), 0.5, 3, 0, "0-d");
            check(gpu_rand_cpu(dtypes[k], 3, (int64_t[]){3, 5, 7}, 410 + k, -1, 1), 0.25, 4, 12, "(3, 5, 7)");
            /* a transposed x gets the mask of its contiguous copy (row-major order of its shape) */
            ct_tensor *base = gpu_rand_cpu(dtypes[k], 2, (int64_t[]){6, 11}, 420 + k, -1, 1);
            check(ct_tensor_transpose(base, 0, 1), 0.4, 6, 20, "transposed");
            check(gpu_rand_cpu(dtypes[k], 2, (int64_t[]){0, 5}, 430 + k, -1, 1), 0.5, 7, 0, "empty");
        }
}

Test(gpu_dropout, bool_mask_backward)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *dy = gpu_rand_cpu(CT_DTYPE_F32, 1, (int64_t[]){101}, 500, -1, 1);
        ct_tensor *m = ct_tensor_cast(gpu_rand_cpu(CT_DTYPE_F64, 1, (int64_t[]){101}, 501, 0, 2), CT_DTYPE_I64);
        ct_tensor *mask = ct_tensor_cast(m, CT_DTYPE_BOOL);
        ct_tensor *dx = ct_kernel_dropout_backward(dy, mask, 0.3);
        cr_assert_not_null(dx, "%s", ct_last_error());
        gpu_expect_equal(ct_kernel_dropout_backward(gpu_of(dy), gpu_of(mask), 0.3), dx, "bool mask");
    }
}

Test(gpu_dropout, argument_errors)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *x = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, 1, (int64_t[]){4}));
        ct_rng r = {1, 0};
        cr_assert_null(ct_kernel_dropout(x, 1.5, &r, NULL));
        cr_assert(strstr(ct_last_error(), "p = 1.5 must lie in [0, 1]"), "%s", ct_last_error());
        cr_assert_eq(r.offset, 0, "a failed call leaves the generator as it was");
        ct_tensor *mask = ct_tensor_ones(CT_DTYPE_U8, 1, (int64_t[]){4});
        cr_assert_null(ct_kernel_dropout_backward(x, mask, 0.5));
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
    }
}
