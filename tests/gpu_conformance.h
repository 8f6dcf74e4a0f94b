/* ctrain tests — the GPU conformance suite's shared pieces.
 *
 * Every GPU test compares what an op computes on the GPU with what the CPU
 * reference (the *_ref kernel, or the CPU entry point) computes on the same
 * inputs. The tolerances are per dtype and live in this one table; a test
 * never loosens them on its own.
 *
 * Suites are named gpu_* so that `make test-gpu` runs exactly them. On a machine
 * without a GPU (or a build without CUDA) each test reports itself skipped, with
 * the reason, through GPU_REQUIRE() -- counted, never silently passed. */
#ifndef CT_TESTS_GPU_CONFORMANCE_H
#define CT_TESTS_GPU_CONFORMANCE_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "ctrain.h"

/* First statement of every GPU test. */
#define GPU_REQUIRE()                                                                    \
    do {                                                                                 \
        if (!ct_cuda_is_available()) cr_skip_test("skipped: %s", ct_cuda_unavailable_reason()); \
    } while (0)

/* |gpu - ref| <= atol + rtol * |ref|, elementwise, for results of a dtype. The
 * low-precision rows allow one rounding of the result (the GPU and the CPU sum in
 * different orders, so a value near a rounding boundary may land on either side)
 * plus the f32 accumulation difference. */
typedef struct gpu_tolerance {
    ct_dtype dtype;
    double rtol, atol;
} gpu_tolerance;

static const gpu_tolerance gpu_tolerances[] = {
    {CT_DTYPE_F64, 1e-12, 1e-12},
    {CT_DTYPE_F32, 2e-5, 2e-6},
    {CT_DTYPE_BF16, 1.6e-2, 1e-2},  /* 2 ulp of bf16 (2^-7 each) */
    {CT_DTYPE_F16, 2e-3, 1e-3},     /* 2 ulp of f16 (2^-10 each) */
    {CT_DTYPE_F8_E4M3, 1.3e-1, 2e-2}, /* 1 ulp of e4m3 (2^-3) */
    {CT_DTYPE_F8_E5M2, 2.6e-1, 2e-2}, /* 1 ulp of e5m2 (2^-2) */
    {CT_DTYPE_I64, 0, 0},
    {CT_DTYPE_I32, 0, 0},
    {CT_DTYPE_U8, 0, 0},
    {CT_DTYPE_BOOL, 0, 0},
};

static inline gpu_tolerance gpu_tolerance_of(ct_dtype dt)
{
    for (size_t i = 0; i < sizeof gpu_tolerances / sizeof gpu_tolerances[0]; i++)
        if (gpu_tolerances[i].dtype == dt) return gpu_tolerances[i];
    return (gpu_tolerance){dt, 0, 0};
}

/* The tolerance for results computed through a chain of ops in low precision
 * (a training step, a backward through several kernels): `steps` roundings. */
static inline gpu_tolerance gpu_tolerance_chain(ct_dtype dt, int steps)
{
    gpu_tolerance t = gpu_tolerance_of(dt);
    t.rtol *= steps;
    t.atol *= steps;
    return t;
}

/* Checks a GPU result against the CPU reference: same shape, dtype, every element
 * within the dtype's tolerance (NaN matches NaN, inf matches the same inf). Fails
 * the test naming `what`, the first bad index and both values. */
static inline void gpu_expect_close_tol(const ct_tensor *gpu, const ct_tensor *ref, gpu_tolerance tol,
                                        const char *what)
{
    cr_assert_not_null(gpu, "%s: the GPU op failed: %s", what, ct_last_error());
    cr_assert_not_null(ref, "%s: the CPU reference failed: %s", what, ct_last_error());
    CT_FRAME {
        cr_assert(ct_tensor_same_shape(gpu, ref), "%s: shapes differ", what);
        cr_assert_eq(gpu->dtype, ref->dtype, "%s: dtypes differ (%s vs %s)", what, ct_dtype_name(gpu->dtype),
                     ct_dtype_name(ref->dtype));
        ct_tensor *g = ct_tensor_cast(ct_tensor_to(gpu, CT_CPU), CT_DTYPE_F64);
        ct_tensor *r = ct_tensor_cast(ref, CT_DTYPE_F64);
        cr_assert_not_null(g, "%s: copying the GPU result to the host failed: %s", what, ct_last_error());
        cr_assert_not_null(r, "%s: %s", what, ct_last_error());
        const double *gp = ct_tensor_data(g), *rp = ct_tensor_data(r);
        int64_t n = ct_tensor_numel(g);
        for (int64_t i = 0; i < n; i++) {
            double a = gp[i], b = rp[i];
            bool ok = (isnan(a) && isnan(b)) || (isinf(b) && a == b) ||
                      (isfinite(a) && isfinite(b) && fabs(a - b) <= tol.atol + tol.rtol * fabs(b));
            if (!ok)
                cr_assert_fail("%s: element %lld: GPU %.9g, CPU reference %.9g (%s: rtol %g, atol %g)", what,
                               (long long)i, a, b, ct_dtype_name(gpu->dtype), tol.rtol, tol.atol);
        }
    }
}

static inline void gpu_expect_close(const ct_tensor *gpu, const ct_tensor *ref, const char *what)
{
    gpu_expect_close_tol(gpu, ref, gpu_tolerance_of(ref ? ref->dtype : CT_DTYPE_F32), what);
}

/* Bit-for-bit equality (copies, conversions, dropout masks, integer ops). */
static inline void gpu_expect_equal(const ct_tensor *gpu, const ct_tensor *ref, const char *what)
{
    cr_assert_not_null(gpu, "%s: the GPU op failed: %s", what, ct_last_error());
    cr_assert_not_null(ref, "%s: the CPU reference failed: %s", what, ct_last_error());
    CT_FRAME {
        cr_assert(ct_tensor_same_shape(gpu, ref) && gpu->dtype == ref->dtype, "%s: shape or dtype differs", what);
        ct_tensor *g = ct_tensor_contiguous(ct_tensor_to(gpu, CT_CPU));
        ct_tensor *r = ct_tensor_contiguous((ct_tensor *)ref);
        cr_assert_not_null(g, "%s: copying the GPU result to the host failed: %s", what, ct_last_error());
        size_t es = ct_dtype_size(g->dtype);
        const unsigned char *gp = ct_tensor_data(g), *rp = ct_tensor_data(r);
        int64_t n = ct_tensor_numel(g);
        for (int64_t i = 0; i < n; i++)
            if (memcmp(gp + i * es, rp + i * es, es) != 0)
                cr_assert_fail("%s: element %lld differs: GPU %.9g, CPU %.9g", what, (long long)i,
                               ct_scalar_load(g->dtype, gp + i * es), ct_scalar_load(r->dtype, rp + i * es));
    }
}

/* A random CPU tensor (uniform in [lo, hi), rounded to dt) from its own seed, so a
 * test's inputs do not depend on the order tests run in. */
static inline ct_tensor *gpu_rand_cpu(ct_dtype dt, int ndim, const int64_t *shape, uint64_t seed, double lo,
                                      double hi)
{
    ct_rng r;
    ct_rng_init(&r, seed);
    ct_tensor *f = ct_tensor_empty(CT_DTYPE_F64, ndim, shape);
    if (!f) return NULL;
    ct_rng_uniform_f64(&r, ct_tensor_data(f), ct_tensor_numel(f), lo, hi);
    return dt == CT_DTYPE_F64 ? f : ct_tensor_cast(f, dt);
}

/* The GPU copy of a CPU tensor (cuda:0). */
static inline ct_tensor *gpu_of(const ct_tensor *cpu) { return ct_tensor_to(cpu, CT_CUDA(0)); }

#endif
