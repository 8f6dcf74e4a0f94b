/* GPU conformance for ct_kernel_linear (kernels/cuda/matmul.cu: cuBLASLt's bias and
 * bias+GELU epilogues, and the plain CUDA reference): y = x @ w + bias [then GELU]
 * against the CPU's composition of the existing kernels (bias copied in, GEMM with
 * beta = 1, GELU kernel), in every dtype, with and without bias and GELU. */
#include <string.h>

#include "tests/gpu_conformance.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/matmul.h"
#endif

/* The bound for y of dtype dt, I products per element. f32/f64: the sum rounds I times
 * where the CPU's GEMM rounds its own I times in another order, and the GELU adds a
 * few ulps (expf), so the row is taken I + 4 times. bf16/f16: the CPU composition
 * rounds to the dtype up to three times (GEMM with the bias, GELU), the fused epilogue
 * once, and cuBLASLt's GELU is an approximation accurate to well under one 16-bit ulp:
 * three roundings' worth. */
static gpu_tolerance lin_tol(ct_dtype dt, int64_t IN)
{
    if (dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64) return gpu_tolerance_chain(dt, (int)IN + 4);
    return gpu_tolerance_chain(dt, 3);
}

static void lin_check(ct_dtype dt, int nd, const int64_t *xshape, int64_t O, bool bias, bool gelu, uint64_t seed)
{
    CT_FRAME {
        const int64_t IN = xshape[nd - 1];
        ct_tensor *x = gpu_rand_cpu(dt, nd, xshape, seed, -2, 2);
        ct_tensor *w = gpu_rand_cpu(dt, 2, (int64_t[]){IN, O}, seed + 1, -0.5, 0.5);
        ct_tensor *b = bias ? gpu_rand_cpu(dt, 1, (int64_t[]){O}, seed + 2, -1, 1) : NULL;
        ct_tensor *ref = ct_kernel_linear(x, w, b, gelu);
        cr_assert_not_null(ref, "CPU linear: %s", ct_last_error());
        char what[200];
        snprintf(what, sizeof what, "linear %s x[..., %lld] w[%lld, %lld] bias=%d gelu=%d", ct_dtype_name(dt),
                 (long long)IN, (long long)IN, (long long)O, bias, gelu);
        ct_tensor *gx = gpu_of(x), *gw = gpu_of(w), *gb = bias ? gpu_of(b) : NULL;
        ct_tensor *y = ct_kernel_linear(gx, gw, gb, gelu);
        gpu_expect_close_tol(y, ref, lin_tol(dt, IN), what);
#ifdef CT_HAVE_CUDA
        /* the plain reference: all in double, rounded once */
        ct_tensor *x2 = ct_tensor_reshape(gx, CT_SHAPE(-1, IN));
        ct_tensor *yr = ct_tensor_empty_on(CT_CUDA(0), dt, CT_SHAPE(x2->shape[0], O));
        cr_assert_eq(cti_cuda_linear_ref(yr, x2, gw, gb, gelu), CT_OK, "%s", ct_last_error());
        ct_tensor *ref2 = ct_tensor_reshape(ref, CT_SHAPE(-1, O));
        gpu_expect_close_tol(yr, ref2, lin_tol(dt, IN), "CUDA linear reference");
#endif
    }
}

static const ct_dtype lin_dtypes[] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

Test(gpu_linear, bias_and_gelu_every_dtype)
{
    GPU_REQUIRE();
    for (size_t d = 0; d < 4; d++)
        for (int f = 0; f < 4; f++) {
            const bool bias = f & 1, gelu = f >> 1;
            lin_check(lin_dtypes[d], 2, (int64_t[]){16, 64}, 48, bias, gelu, 10 + f);
            lin_check(lin_dtypes[d], 3, (int64_t[]){2, 7, 33}, 65, bias, gelu, 20 + f);
            lin_check(lin_dtypes[d], 1, (int64_t[]){5}, 3, bias, gelu, 30 + f);
        }
}

Test(gpu_linear, large_rows)
{
    GPU_REQUIRE();
    lin_check(CT_DTYPE_BF16, 2, (int64_t[]){1024, 256}, 768, true, true, 40);
    lin_check(CT_DTYPE_F32, 2, (int64_t[]){513, 96}, 200, true, true, 41);
}

Test(gpu_linear, errors)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *x = gpu_of(gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){4, 8}, 50, -1, 1));
        ct_tensor *w = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){8, 3}, 51, -1, 1);
        cr_assert_null(ct_kernel_linear(x, w, NULL, false));
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
        ct_tensor *gw = gpu_of(w);
        ct_tensor *bad = gpu_of(gpu_rand_cpu(CT_DTYPE_F32, 1, (int64_t[]){4}, 52, -1, 1));
        cr_assert_null(ct_kernel_linear(x, gw, bad, false));
        cr_assert(strstr(ct_last_error(), "bias"), "%s", ct_last_error());
    }
}
