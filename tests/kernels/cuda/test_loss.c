/* GPU conformance: fused cross-entropy (kernels/cuda/loss.cu) against the CPU
 * reference kernels (kernels/cpu/loss.c): the loss, the saved lse and dlogits, every
 * float dtype, i64 and i32 targets, ignore_index, the warp-per-row and block-per-row
 * paths, and the out-of-range target error. */
#include "tests/gpu_conformance.h"

#include <string.h>

#include "kernels/cpu/loss.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/loss.h"
#endif

static const ct_dtype dtypes[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

/* The GPU's error message with every "cuda:0" read as "cpu" equals the CPU's. */
static void expect_same_error(const char *gpu_msg, const char *cpu_msg)
{
    char buf[1024];
    size_t o = 0;
    for (const char *p = gpu_msg; *p && o + 4 < sizeof buf;) {
        if (strncmp(p, "cuda:0", 6) == 0) {
            memcpy(buf + o, "cpu", 3), o += 3, p += 6;
        } else {
            buf[o++] = *p++;
        }
    }
    buf[o] = 0;
    cr_assert_str_eq(buf, cpu_msg, "GPU: %s\nCPU: %s", gpu_msg, cpu_msg);
}

/* Targets of shape (ndim, shape) in [0, V), every `every`-th one (when > 0) set to
 * ignore; dtype i64 or i32. */
static ct_tensor *make_targets(ct_dtype dt, int ndim, const int64_t *shape, int64_t V, uint64_t seed, int every,
                               int64_t ignore)
{
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_I64, ndim, shape);
    int64_t *p = ct_tensor_data(t);
    ct_rng r;
    ct_rng_init(&r, seed);
    for (int64_t i = 0; i < ct_tensor_numel(t); i++)
        p[i] = every > 0 && i % every == every - 1 ? ignore : (int64_t)ct_rng_below(&r, (uint64_t)V);
    return dt == CT_DTYPE_I64 ? t : ct_tensor_cast(t, dt);
}

/* logits (CPU, any layout), targets (CPU): forward and backward on the GPU (entry
 * point and CUDA reference) against the CPU reference. */
static void check(ct_tensor *logits, ct_tensor *targets, int64_t ignore, double dl, const char *what)
{
    char msg[200];
    ct_dtype sd = logits->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32;
    ct_tensor *lc = ct_tensor_contiguous(logits);
    ct_tensor *loss = ct_tensor_empty(logits->dtype, 0, NULL);
    ct_tensor *lse = ct_tensor_empty(sd, targets->ndim, targets->shape);
    cr_assert_eq(cti_cpu_cross_entropy_ref(lc, targets, ignore, loss, lse), CT_OK, "%s", ct_last_error());
    ct_tensor *dloss = ct_tensor_scalar(logits->dtype, dl);
    ct_tensor *dx = ct_tensor_empty(logits->dtype, logits->ndim, logits->shape);
    cr_assert_eq(cti_cpu_cross_entropy_backward_ref(dloss, lc, targets, lse, ignore, dx), CT_OK, "%s", ct_last_error());

    ct_tensor *gl = gpu_of(logits), *gt = gpu_of(targets), *glse = NULL;
    ct_tensor *gloss = ct_kernel_cross_entropy(gl, gt, ignore, &glse);
    snprintf(msg, sizeof msg, "%s loss", what);
    gpu_expect_close(gloss, loss, msg);
    snprintf(msg, sizeof msg, "%s lse", what);
    gpu_expect_close(glse, lse, msg);
    /* backward from the CPU's lse, so that it is checked on its own */
    ct_tensor *gdl = gpu_of(dloss), *gsl = gpu_of(lse);
    snprintf(msg, sizeof msg, "%s dlogits", what);
    gpu_expect_close(ct_kernel_cross_entropy_backward(gdl, gl, gt, gsl, ignore), dx, msg);
#ifdef CT_HAVE_CUDA
    ct_tensor *glc = gpu_of(lc);
    ct_tensor *rloss = ct_tensor_empty_on(CT_CUDA(0), logits->dtype, 0, NULL);
    ct_tensor *rlse = ct_tensor_empty_on(CT_CUDA(0), sd, targets->ndim, targets->shape);
    cr_assert_eq(cti_cuda_cross_entropy_ref(glc, gt, ignore, rloss, rlse), CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s loss (CUDA reference)", what);
    gpu_expect_close(rloss, loss, msg);
    snprintf(msg, sizeof msg, "%s lse (CUDA reference)", what);
    gpu_expect_close(rlse, lse, msg);
    ct_tensor *rdx = ct_tensor_empty_on(CT_CUDA(0), logits->dtype, logits->ndim, logits->shape);
    cr_assert_eq(cti_cuda_cross_entropy_backward_ref(gdl, glc, gt, gsl, ignore, rdx), CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s dlogits (CUDA reference)", what);
    gpu_expect_close(rdx, dx, msg);
#endif
}

/* Every dtype, i64 and i32 targets; every 5th target ignored. */
static void check_all(int ndim, const int64_t *shape, uint64_t seed, double lo, double hi)
{
    const int64_t V = shape[ndim - 1];
    for (int k = 0; k < 4; k++)
        for (int i32 = 0; i32 < 2; i32++) CT_FRAME {
                uint64_t s = seed + 10 * k + i32;
                ct_tensor *logits = gpu_rand_cpu(dtypes[k], ndim, shape, s, lo, hi);
                ct_tensor *targets = make_targets(i32 ? CT_DTYPE_I32 : CT_DTYPE_I64, ndim - 1, shape, V, s + 1, 5, -100);
                char what[160], sh[64];
                snprintf(what, sizeof what, "%s%s, %s targets", ct_dtype_name(dtypes[k]),
                         ct_shape_str(ndim, shape, sh, sizeof sh), i32 ? "i32" : "i64");
                check(logits, targets, -100, 0.75, what);
            }
}

Test(gpu_loss, short_rows_one_warp_each)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){1, 1}, 100, -4, 4);
    check_all(2, (int64_t[]){5, 7}, 200, -4, 4);
    check_all(3, (int64_t[]){2, 3, 50}, 300, -4, 4);
    check_all(2, (int64_t[]){1000, 33}, 400, -6, 6);
    check_all(2, (int64_t[]){17, 1024}, 500, -4, 4);
}

Test(gpu_loss, long_rows_one_block_each)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){4, 1025}, 600, -4, 4);
    check_all(2, (int64_t[]){9, 5003}, 700, -8, 8);
}

Test(gpu_loss, large_logits)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){8, 100}, 800, -1e4, 1e4);
}

Test(gpu_loss, masked_logits)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++) CT_FRAME {
            /* -inf logits (a masked vocabulary) add nothing to lse and get zero gradient;
             * the rows are long enough for one block each */
            const int64_t shape[2] = {6, 1500};
            ct_tensor *logits = gpu_rand_cpu(CT_DTYPE_F64, 2, shape, 1300 + k, -3, 3);
            double *p = ct_tensor_data(logits);
            for (int64_t i = 0; i < 6 * 1500; i++)
                if (i % 1500 < 40 || i % 3 == 0) p[i] = -INFINITY;
            ct_tensor *targets = ct_tensor_empty(CT_DTYPE_I64, 1, shape);
            int64_t *t = ct_tensor_data(targets);
            for (int r = 0; r < 6; r++) t[r] = 40 + 3 * r + 1; /* finite logits */
            check(ct_tensor_cast(logits, dtypes[k]), targets, -100, 1.0, "masked logits");
        }
}

Test(gpu_loss, ignore_index_in_range_and_all_ignored)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++) CT_FRAME {
            const int64_t shape[2] = {12, 9};
            ct_tensor *logits = gpu_rand_cpu(dtypes[k], 2, shape, 900 + k, -3, 3);
            /* ignore_index 2 is also a class: rows whose target is 2 are ignored */
            check(logits, make_targets(CT_DTYPE_I64, 1, shape, 9, 910 + k, 0, 2), 2, 1.5, "ignore_index 2");
            /* every row ignored: the loss is NaN and dlogits zeros, on both devices */
            check(logits, make_targets(CT_DTYPE_I64, 1, shape, 9, 920 + k, 1, -1), -1, 1.0, "all ignored");
        }
}

Test(gpu_loss, non_contiguous_logits)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++) CT_FRAME {
            ct_tensor *base = gpu_rand_cpu(dtypes[k], 2, (int64_t[]){40, 6}, 1000 + k, -3, 3);
            ct_tensor *logits = ct_tensor_transpose(base, 0, 1); /* (6, 40), strides (1, 6) */
            ct_tensor *targets = make_targets(CT_DTYPE_I64, 1, logits->shape, 40, 1010 + k, 4, -100);
            check(logits, targets, -100, 1.0, "transposed logits");
        }
}

Test(gpu_loss, deterministic)
{
    GPU_REQUIRE();
    CT_FRAME {
        /* many rows: the loss is summed by one block in a fixed order, so the same bits every time */
        const int64_t shape[2] = {4099, 300};
        ct_tensor *gl = gpu_of(gpu_rand_cpu(CT_DTYPE_F32, 2, shape, 1100, -5, 5));
        ct_tensor *gt = gpu_of(make_targets(CT_DTYPE_I64, 1, shape, 300, 1101, 7, -100));
        ct_tensor *a = ct_kernel_cross_entropy(gl, gt, -100, NULL), *b = ct_kernel_cross_entropy(gl, gt, -100, NULL);
        gpu_expect_equal(a, ct_tensor_to(b, CT_CPU), "two runs of one loss");
    }
}

Test(gpu_loss, target_out_of_range)
{
    GPU_REQUIRE();
    CT_FRAME {
        int64_t t[4] = {1, 9, 2, -100};
        ct_tensor *targets = ct_tensor_from_data(CT_DTYPE_I64, 1, (int64_t[]){4}, t);
        ct_tensor *logits = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){4, 5}, 1200, -1, 1);
        ct_tensor *lse = NULL;
        cr_assert_null(ct_kernel_cross_entropy(gpu_of(logits), gpu_of(targets), -100, &lse));
        const char *e = ct_last_error();
        cr_assert(strstr(e, "cross_entropy: target 9 at position [1] of targets") && strstr(e, "V = 5 classes") &&
                      strstr(e, "cuda:0"),
                  "%s", e);
        cr_assert_null(lse);
        char gpu_msg[1024];
        snprintf(gpu_msg, sizeof gpu_msg, "%s", e);
        cr_assert_null(ct_kernel_cross_entropy(logits, targets, -100, NULL));
        expect_same_error(gpu_msg, ct_last_error());
        ct_tensor *dl = gpu_of(ct_tensor_scalar(CT_DTYPE_F32, 1));
        ct_tensor *glse = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, 1, (int64_t[]){4}));
        cr_assert_null(ct_kernel_cross_entropy_backward(dl, gpu_of(logits), gpu_of(targets), glse, -100));
        cr_assert(strstr(ct_last_error(), "cross_entropy_backward: target 9 at position [1]"), "%s", ct_last_error());
        /* a negative target that is not ignore_index */
        t[1] = -3;
        targets = ct_tensor_from_data(CT_DTYPE_I64, 1, (int64_t[]){4}, t);
        cr_assert_null(ct_kernel_cross_entropy(gpu_of(logits), gpu_of(targets), -100, NULL));
        cr_assert(strstr(ct_last_error(), "target -3 at position [1]"), "%s", ct_last_error());
    }
}

Test(gpu_loss, mixed_devices)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *logits = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, 2, (int64_t[]){2, 3}));
        ct_tensor *targets = ct_tensor_zeros(CT_DTYPE_I64, 1, (int64_t[]){2});
        cr_assert_null(ct_kernel_cross_entropy(logits, targets, -100, NULL));
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
    }
}
