/* GPU conformance: softmax and log-softmax (kernels/cuda/softmax.cu) against the CPU
 * reference kernels (kernels/cpu/softmax.c), forward and backward, every float
 * dtype, the warp-per-row, block-per-row and per-line paths. */
#include "tests/gpu_conformance.h"

#include "kernels/cpu/softmax.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/softmax.h"
#endif

static const ct_dtype dtypes[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

typedef ct_status (*fwd_fn)(const ct_tensor *x, ct_tensor *y, int dim);
typedef ct_status (*bwd_fn)(const ct_tensor *dy, const ct_tensor *y, ct_tensor *dx, int dim);

static int norm_dim(const ct_tensor *t, int dim) { return dim < 0 ? dim + (t->ndim ? t->ndim : 1) : dim; }

/* The CPU reference's forward of a CPU tensor (any layout). */
static ct_tensor *ref_forward(fwd_fn ref, ct_tensor *x, int dim)
{
    ct_tensor *xc = ct_tensor_contiguous(x);
    ct_tensor *y = ct_tensor_empty(x->dtype, x->ndim, x->shape);
    cr_assert_eq(ref(xc, y, norm_dim(x, dim)), CT_OK, "%s", ct_last_error());
    return y;
}

static ct_tensor *ref_backward(bwd_fn ref, ct_tensor *dy, ct_tensor *y, int dim)
{
    ct_tensor *dyc = ct_tensor_contiguous(dy), *yc = ct_tensor_contiguous(y);
    ct_tensor *dx = ct_tensor_empty(y->dtype, y->ndim, y->shape);
    cr_assert_eq(ref(dyc, yc, dx, norm_dim(y, dim)), CT_OK, "%s", ct_last_error());
    return dx;
}

/* Forward and backward of softmax (lg false) or log-softmax along dim of x (a CPU
 * tensor): the GPU entry point and the CUDA reference against the CPU reference. */
static void check(ct_tensor *x, int dim, bool lg, uint64_t seed, const char *what)
{
    char msg[160];
    ct_tensor *ref = ref_forward(lg ? cti_cpu_log_softmax_ref : cti_cpu_softmax_ref, x, dim);
    ct_tensor *gx = gpu_of(x);
    snprintf(msg, sizeof msg, "%s %s forward", what, lg ? "log_softmax" : "softmax");
    gpu_expect_close(lg ? ct_kernel_log_softmax(gx, dim) : ct_kernel_softmax(gx, dim), ref, msg);

    /* backward at the forward's own output (the CPU's), with a random dy */
    ct_tensor *dy = gpu_rand_cpu(x->dtype, x->ndim, x->shape, seed + 1, -1, 1);
    ct_tensor *dref = ref_backward(lg ? cti_cpu_log_softmax_backward_ref : cti_cpu_softmax_backward_ref, dy, ref, dim);
    ct_tensor *gdy = gpu_of(dy), *gy = gpu_of(ref);
    snprintf(msg, sizeof msg, "%s %s backward", what, lg ? "log_softmax" : "softmax");
    gpu_expect_close(lg ? ct_kernel_log_softmax_backward(gdy, gy, dim) : ct_kernel_softmax_backward(gdy, gy, dim),
                     dref, msg);
#ifdef CT_HAVE_CUDA
    ct_tensor *gxc = gpu_of(ct_tensor_contiguous(x));
    ct_tensor *out = ct_tensor_empty_on(CT_CUDA(0), x->dtype, x->ndim, x->shape);
    cr_assert_eq((lg ? cti_cuda_log_softmax_ref : cti_cuda_softmax_ref)(gxc, out, norm_dim(x, dim)), CT_OK, "%s",
                 ct_last_error());
    snprintf(msg, sizeof msg, "%s %s forward (CUDA reference)", what, lg ? "log_softmax" : "softmax");
    gpu_expect_close(out, ref, msg);
    ct_tensor *dout = ct_tensor_empty_on(CT_CUDA(0), x->dtype, x->ndim, x->shape);
    cr_assert_eq((lg ? cti_cuda_log_softmax_backward_ref : cti_cuda_softmax_backward_ref)(gpu_of(ct_tensor_contiguous(dy)),
                                                                                          gy, dout, norm_dim(x, dim)),
                 CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s %s backward (CUDA reference)", what, lg ? "log_softmax" : "softmax");
    gpu_expect_close(dout, dref, msg);
#endif
}

/* Every dtype, both ops, one shape and dim. */
static void check_all(int ndim, const int64_t *shape, int dim, uint64_t seed, double lo, double hi)
{
    for (int k = 0; k < 4; k++)
        for (int lg = 0; lg < 2; lg++) CT_FRAME {
                char what[120], s[64];
                snprintf(what, sizeof what, "%s %s dim %d", ct_dtype_name(dtypes[k]), ct_shape_str(ndim, shape, s, sizeof s),
                         dim);
                check(gpu_rand_cpu(dtypes[k], ndim, shape, seed + 10 * k, lo, hi), dim, lg, seed + 10 * k + 5, what);
            }
}

Test(gpu_softmax, short_rows_one_warp_each)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){1, 1}, -1, 100, -4, 4);
    check_all(2, (int64_t[]){3, 5}, 1, 110, -4, 4);
    check_all(2, (int64_t[]){7, 33}, -1, 120, -4, 4);
    check_all(3, (int64_t[]){2, 3, 1024}, -1, 130, -4, 4);
}

Test(gpu_softmax, many_rows_many_blocks)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){1000, 77}, -1, 200, -8, 8);
}

Test(gpu_softmax, long_rows_one_block_each)
{
    GPU_REQUIRE();
    check_all(2, (int64_t[]){3, 1025}, -1, 300, -4, 4);
    check_all(2, (int64_t[]){5, 5003}, 1, 310, -8, 8);
}

Test(gpu_softmax, other_dims_per_line)
{
    GPU_REQUIRE();
    check_all(3, (int64_t[]){4, 37, 5}, 1, 400, -4, 4);
    check_all(3, (int64_t[]){4, 3, 300}, 0, 410, -4, 4);
    check_all(3, (int64_t[]){2, 9, 3}, -2, 420, -4, 4);
}

Test(gpu_softmax, zero_d_and_empty)
{
    GPU_REQUIRE();
    check_all(0, NULL, 0, 500, -4, 4);
    CT_FRAME {
        ct_tensor *x = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, 2, (int64_t[]){0, 7}));
        ct_tensor *y = ct_kernel_softmax(x, -1);
        cr_assert_not_null(y, "%s", ct_last_error());
        cr_assert_eq(ct_tensor_numel(y), 0);
    }
}

Test(gpu_softmax, large_logits_and_infinities)
{
    GPU_REQUIRE();
    /* logits of +-1e4 stay finite; -inf entries get probability 0 */
    check_all(2, (int64_t[]){6, 40}, -1, 600, -1e4, 1e4);
    CT_FRAME {
        /* rows: -inf first then finite values; all -inf; a +inf; a NaN (NaN everywhere on
         * both devices for the last three) */
        double v[4 * 5] = {-INFINITY, 1, 2, -INFINITY, 0, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                           1, INFINITY, 2, -INFINITY, 3, 0.5, 1, NAN, 2, -1};
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_F64, 2, (int64_t[]){4, 5}, v);
        for (int k = 0; k < 4; k++)
            for (int lg = 0; lg < 2; lg++) {
                ct_tensor *xd = ct_tensor_cast(x, dtypes[k]);
                ct_tensor *ref = ref_forward(lg ? cti_cpu_log_softmax_ref : cti_cpu_softmax_ref, xd, -1);
                ct_tensor *g = lg ? ct_kernel_log_softmax(gpu_of(xd), -1) : ct_kernel_softmax(gpu_of(xd), -1);
                gpu_expect_close(g, ref, "rows with -inf");
            }
    }
}

Test(gpu_softmax, non_contiguous_input)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++)
        for (int lg = 0; lg < 2; lg++) CT_FRAME {
                /* the transpose of a (33, 7) tensor: (7, 33) with strides (1, 7) */
                ct_tensor *base = gpu_rand_cpu(dtypes[k], 2, (int64_t[]){33, 7}, 700 + k, -4, 4);
                ct_tensor *x = ct_tensor_transpose(base, 0, 1);
                ct_tensor *ref = ref_forward(lg ? cti_cpu_log_softmax_ref : cti_cpu_softmax_ref, x, -1);
                ct_tensor *gx = ct_tensor_transpose(gpu_of(base), 0, 1);
                cr_assert(!ct_tensor_is_contiguous(gx));
                gpu_expect_close(lg ? ct_kernel_log_softmax(gx, -1) : ct_kernel_softmax(gx, -1), ref,
                                 "transposed input");
            }
}

Test(gpu_softmax, argument_errors)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *x = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, 2, (int64_t[]){2, 3}));
        cr_assert_null(ct_kernel_softmax(x, 2));
        cr_assert(strstr(ct_last_error(), "dim 2 is out of range"), "%s", ct_last_error());
        ct_tensor *xi = gpu_of(ct_tensor_zeros(CT_DTYPE_I64, 2, (int64_t[]){2, 3}));
        cr_assert_null(ct_kernel_log_softmax(xi, -1));
        cr_assert(strstr(ct_last_error(), "log_softmax"), "%s", ct_last_error());
        /* one tensor on each device: the message names both */
        ct_tensor *y = ct_tensor_zeros(CT_DTYPE_F32, 2, (int64_t[]){2, 3});
        cr_assert_null(ct_kernel_softmax_backward(x, y, -1));
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
    }
}
