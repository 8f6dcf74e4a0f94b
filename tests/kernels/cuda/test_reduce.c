/* GPU conformance tests for the reductions (kernels/reduce.c on cuda:0,
 * kernels/cuda/reduce.cu): sum, mean, max, min, var, argmax, sum_to_shape.
 *
 * Each reduction runs on the same random inputs on the CPU (the CPU entry point,
 * itself tested against a naive loop and the CPU references in
 * tests/kernels/test_reduce.c) and on the GPU, through the entry point (the fast
 * kernels) and through the CUDA reference kernels called directly, held to the
 * tolerance table of tests/gpu_conformance.h; integer results and argmax are
 * compared bit for bit. The shapes reach every path of the fast kernels: rows
 * reduced by a warp and by a block, rows cut into chunks combined by a second
 * kernel, column sums (the outer layout) with and without chunks, strided and
 * permuted views, 0-d and empty tensors. */
#include <string.h>

#include "core/frame.h"
#include "tests/gpu_conformance.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/reduce.h"
#endif

static const ct_dtype floats[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

typedef struct both {
    ct_tensor *cpu, *gpu;
} both;

/* Uniform [lo, hi) values (integers truncate, bool 0/1) of logical shape
 * (ndim, shape); layout 0 contiguous, 1 a permutation view (dims stored in
 * reverse order), 2 every other element of the last dim. The same view on both
 * devices. */
static both make(ct_dtype dt, int ndim, const int64_t *shape, int layout, uint64_t seed, double lo, double hi)
{
    int64_t s[CT_MAX_DIMS];
    int perm[CT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) s[d] = shape[d];
    if (layout == 1)
        for (int d = 0; d < ndim; d++) s[d] = shape[ndim - 1 - d], perm[d] = ndim - 1 - d;
    if (layout == 2 && ndim > 0) s[ndim - 1] *= 2;
    ct_tensor *base = dt == CT_DTYPE_BOOL
                          ? ct_tensor_cast(gpu_rand_cpu(CT_DTYPE_I64, ndim, s, seed, 0, 2), CT_DTYPE_BOOL)
                          : gpu_rand_cpu(dt, ndim, s, seed, lo, hi);
    cr_assert_not_null(base, "%s", ct_last_error());
    ct_tensor *g = gpu_of(base);
    cr_assert_not_null(g, "copy to the GPU: %s", ct_last_error());
    both b = {base, g};
    if (layout == 1) b.cpu = ct_tensor_permute(base, perm), b.gpu = ct_tensor_permute(g, perm);
    if (layout == 2 && ndim > 0)
        b.cpu = ct_tensor_slice(base, ndim - 1, 0, s[ndim - 1], 2), b.gpu = ct_tensor_slice(g, ndim - 1, 0, s[ndim - 1], 2);
    cr_assert(b.cpu && b.gpu, "%s", ct_last_error());
    return b;
}

/* Values from a list, cast to dt, on both devices. */
static both from_values(ct_dtype dt, int ndim, const int64_t *shape, const double *v)
{
    ct_tensor *c = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F64, ndim, shape, v), dt);
    cr_assert_not_null(c, "%s", ct_last_error());
    both b = {c, gpu_of(c)};
    cr_assert_not_null(b.gpu, "%s", ct_last_error());
    return b;
}

static void expect(const ct_tensor *gpu, const ct_tensor *ref, const char *what)
{
    if (ref && !ct_dtype_is_float(ref->dtype)) gpu_expect_equal(gpu, ref, what);
    else gpu_expect_close(gpu, ref, what);
}

#ifdef CT_HAVE_CUDA
/* The reduced-dims mask the entry point builds (dims distinct and in range). */
static uint32_t mask_of(const ct_tensor *x, const int *dims, int nd)
{
    if (x->ndim == 0) return 0;
    if (nd == 0) return (uint32_t)((1u << x->ndim) - 1);
    uint32_t m = 0;
    for (int i = 0; i < nd; i++) m |= 1u << (dims[i] < 0 ? dims[i] + x->ndim : dims[i]);
    return m;
}
#endif

static ct_tensor *reduce_op(ct_reduce_op op, const ct_tensor *x, const int *dims, int nd, bool keepdim)
{
    switch (op) {
    case CT_REDUCE_SUM: return ct_kernel_sum(x, dims, nd, keepdim);
    case CT_REDUCE_MEAN: return ct_kernel_mean(x, dims, nd, keepdim);
    case CT_REDUCE_MAX: return ct_kernel_max(x, dims, nd, keepdim);
    default: return ct_kernel_min(x, dims, nd, keepdim);
    }
}

static const char *const op_names[CT_REDUCE_OP_COUNT] = {"sum", "mean", "max", "min"};

static void check_reduce(ct_reduce_op op, both x, const int *dims, int nd, bool keepdim, const char *ctx)
{
    char what[200];
    snprintf(what, sizeof what, "%s %s (%s%s)", op_names[op], ct_dtype_name(x.cpu->dtype), ctx,
             keepdim ? ", keepdim" : "");
    ct_tensor *ref = reduce_op(op, x.cpu, dims, nd, keepdim);
    cr_assert_not_null(ref, "%s: CPU: %s", what, ct_last_error());
    expect(reduce_op(op, x.gpu, dims, nd, keepdim), ref, what);
#ifdef CT_HAVE_CUDA
    ct_tensor *gref = ct_tensor_empty_on(CT_CUDA(0), ref->dtype, ref->ndim, ref->shape);
    cr_assert_not_null(gref, "%s", ct_last_error());
    cr_assert_eq(cti_cuda_reduce_ref(op, gref, x.gpu, mask_of(x.cpu, dims, nd)), CT_OK, "%s: %s", what, ct_last_error());
    snprintf(what, sizeof what, "%s %s (%s, CUDA reference)", op_names[op], ct_dtype_name(x.cpu->dtype), ctx);
    expect(gref, ref, what);
#endif
}

static void check_var(both x, const int *dims, int nd, int64_t correction, bool keepdim, const char *ctx)
{
    char what[200];
    snprintf(what, sizeof what, "var %s (%s, correction %lld)", ct_dtype_name(x.cpu->dtype), ctx, (long long)correction);
    ct_tensor *ref = ct_kernel_var(x.cpu, dims, nd, correction, keepdim);
    cr_assert_not_null(ref, "%s: CPU: %s", what, ct_last_error());
    gpu_expect_close(ct_kernel_var(x.gpu, dims, nd, correction, keepdim), ref, what);
#ifdef CT_HAVE_CUDA
    ct_tensor *gref = ct_tensor_empty_on(CT_CUDA(0), ref->dtype, ref->ndim, ref->shape);
    cr_assert_not_null(gref, "%s", ct_last_error());
    cr_assert_eq(cti_cuda_var_ref(gref, x.gpu, mask_of(x.cpu, dims, nd), correction), CT_OK, "%s: %s", what,
                 ct_last_error());
    gpu_expect_close(gref, ref, what);
#endif
}

static void check_argmax(both x, int dim, bool keepdim, const char *ctx)
{
    char what[200];
    snprintf(what, sizeof what, "argmax %s (%s, dim %d)", ct_dtype_name(x.cpu->dtype), ctx, dim);
    ct_tensor *ref = ct_kernel_argmax(x.cpu, dim, keepdim);
    cr_assert_not_null(ref, "%s: CPU: %s", what, ct_last_error());
    gpu_expect_equal(ct_kernel_argmax(x.gpu, dim, keepdim), ref, what);
#ifdef CT_HAVE_CUDA
    ct_tensor *gref = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_I64, ref->ndim, ref->shape);
    cr_assert_not_null(gref, "%s", ct_last_error());
    const int d = x.cpu->ndim ? (dim < 0 ? dim + x.cpu->ndim : dim) : 0;
    cr_assert_eq(cti_cuda_argmax_ref(gref, x.gpu, d), CT_OK, "%s: %s", what, ct_last_error());
    gpu_expect_equal(gref, ref, what);
#endif
}

/* Shapes and dims that reach each path of kernels/cuda/reduce.cu. */
typedef struct red_case {
    int ndim;
    int64_t shape[3];
    int nd;
    int dims[3];
    const char *what;
} red_case;

static const red_case cases[] = {
    {1, {7}, 0, {0}, "tiny, all dims"},
    {2, {3, 37}, 1, {1}, "rows, warp"},
    {2, {3, 37}, 1, {-2}, "columns below the outer run"},
    {2, {64, 1000}, 1, {1}, "rows of 1000, warp"},
    {2, {64, 1000}, 1, {0}, "columns, outer"},
    {3, {5, 3, 129}, 2, {0, 2}, "two dims"},
    {3, {5, 3, 129}, 2, {0, 1}, "leading dims, outer"},
    {2, {2, 4099}, 1, {1}, "rows, block"},
    {2, {3, 70000}, 1, {1}, "rows, block, chunks"},
    {1, {300007}, 0, {0}, "all of 300007, chunks"},
    {2, {20000, 40}, 1, {0}, "columns, outer, chunks"},
    {3, {6, 300, 20}, 1, {1}, "middle dim, outer with kept dims outside"},
    {2, {1000, 5}, 1, {0}, "columns of a narrow matrix"},
    {3, {9, 17, 33}, 1, {1}, "middle dim, outer"},
    {2, {5000, 3}, 1, {1}, "short rows, a thread each"},
    {3, {40, 50, 3}, 2, {0, 2}, "two strided dims, a warp each"},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* ---- sum, mean, max, min ---------------------------------------------------------------------- */

Test(gpu_reduce, float_paths)
{
    GPU_REQUIRE();
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < CT_REDUCE_OP_COUNT; op++)
            for (size_t c = 0; c < NCASES; c++)
                for (int keep = 0; keep < 2; keep++) CT_FRAME {
                        both x = make(floats[d], cases[c].ndim, cases[c].shape, 0, 10 + c, -2, 3);
                        check_reduce((ct_reduce_op)op, x, cases[c].dims, cases[c].nd, keep, cases[c].what);
                    }
}

/* Every subset of the dims of a (2, 3, 5, 7) tensor, contiguous, permuted and sliced. */
Test(gpu_reduce, float_every_dim_subset_and_layout)
{
    GPU_REQUIRE();
    const int64_t shape[4] = {2, 3, 5, 7};
    for (int d = 0; d < 4; d++)
        for (int layout = 0; layout < 3; layout++)
            for (uint32_t m = 0; m < 16; m++)
                for (int op = 0; op < CT_REDUCE_OP_COUNT; op++) CT_FRAME {
                        both x = make(floats[d], 4, shape, layout, 30 + layout, -1, 1);
                        int dims[4], nd = 0;
                        for (int k = 0; k < 4; k++)
                            if ((m >> k) & 1) dims[nd++] = k;
                        if (nd == 0) continue; /* nd 0 means all dims: covered by m = 15 */
                        char ctx[48];
                        snprintf(ctx, sizeof ctx, "layout %d, mask %u", layout, m);
                        check_reduce((ct_reduce_op)op, x, dims, nd, m & 1, ctx);
                    }
}

Test(gpu_reduce, zero_d_and_empty)
{
    GPU_REQUIRE();
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < CT_REDUCE_OP_COUNT; op++) CT_FRAME {
                const int64_t one[1] = {1};
                both s = make(floats[d], 0, one, 0, 40, -1, 1);
                const int dim0[1] = {0}, dimm1[1] = {-1};
                check_reduce((ct_reduce_op)op, s, dim0, 1, false, "0-d, dim 0");
                check_reduce((ct_reduce_op)op, s, dimm1, 1, true, "0-d, dim -1");
                check_reduce((ct_reduce_op)op, s, NULL, 0, false, "0-d, all");
                if (op == CT_REDUCE_MAX || op == CT_REDUCE_MIN) continue; /* no identity */
                const int64_t e[2] = {0, 5}, f[2] = {4, 0};
                both x = make(floats[d], 2, e, 0, 41, -1, 1), y = make(floats[d], 2, f, 0, 42, -1, 1);
                check_reduce((ct_reduce_op)op, x, dim0, 1, false, "over an empty dim (sum 0, mean NaN)");
                check_reduce((ct_reduce_op)op, x, NULL, 0, true, "empty, all dims");
                const int dim1[1] = {1};
                check_reduce((ct_reduce_op)op, x, dim1, 1, false, "no outputs");
                check_reduce((ct_reduce_op)op, y, dim1, 1, true, "rows of length 0");
            }
}

/* NaN propagates through max, min and sum, wherever it sits in a row or column. */
Test(gpu_reduce, nan_propagates)
{
    GPU_REQUIRE();
    enum { R = 40, C = 3000 };
    static double v[R * C];
    for (int i = 0; i < R * C; i++) v[i] = (double)((i * 7919) % 1001) / 100.0 - 5.0;
    v[0] = NAN, v[5 * C + C - 1] = NAN, v[17 * C + 1234] = NAN, v[39 * C + 2048] = NAN;
    v[20 * C + 7] = INFINITY, v[21 * C + 8] = -INFINITY;
    const int64_t shape[2] = {R, C};
    for (int d = 0; d < 4; d++) CT_FRAME {
            both x = from_values(floats[d], 2, shape, v);
            const int d0[1] = {0}, d1[1] = {1};
            for (int op = 0; op < CT_REDUCE_OP_COUNT; op++) {
                check_reduce((ct_reduce_op)op, x, d1, 1, false, "NaN in rows");
                check_reduce((ct_reduce_op)op, x, d0, 1, false, "NaN in columns");
                check_reduce((ct_reduce_op)op, x, NULL, 0, false, "NaN anywhere");
            }
        }
}

Test(gpu_reduce, integer_dtypes)
{
    GPU_REQUIRE();
    const ct_dtype dts[4] = {CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8, CT_DTYPE_BOOL};
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < CT_REDUCE_OP_COUNT; op++)
            for (size_t c = 0; c < NCASES; c++) CT_FRAME {
                    if (op == CT_REDUCE_MEAN) continue; /* floats only */
                    const double lo = dts[d] == CT_DTYPE_U8 ? 0 : -1e6, hi = dts[d] == CT_DTYPE_U8 ? 256 : 1e6;
                    both x = make(dts[d], cases[c].ndim, cases[c].shape, c % 3 == 2 ? 2 : 0, 50 + c, lo, hi);
                    check_reduce((ct_reduce_op)op, x, cases[c].dims, cases[c].nd, false, cases[c].what);
                }
    CT_FRAME { /* i64 sums wrap around */
        const int64_t s[2] = {7, 5000};
        both x = make(CT_DTYPE_I64, 2, s, 0, 60, -9.2e18, 9.2e18);
        const int d1[1] = {1};
        check_reduce(CT_REDUCE_SUM, x, d1, 1, false, "wrapping i64 sum");
        check_reduce(CT_REDUCE_SUM, x, NULL, 0, false, "wrapping i64 sum, all");
    }
}

/* ---- var ----------------------------------------------------------------------------------------- */

Test(gpu_reduce, var)
{
    GPU_REQUIRE();
    for (int d = 0; d < 4; d++)
        for (size_t c = 0; c < NCASES; c++)
            for (int corr = 0; corr < 3; corr++) CT_FRAME {
                    /* an offset mean, so the two passes matter */
                    both x = make(floats[d], cases[c].ndim, cases[c].shape, c % 3 == 1 ? 2 : 0, 70 + c, 9, 11);
                    check_var(x, cases[c].dims, cases[c].nd, corr, corr == 1, cases[c].what);
                }
    for (int d = 0; d < 4; d++) CT_FRAME {
            const int64_t s[2] = {3, 1}, e[2] = {0, 4};
            const int d1[1] = {1};
            both x = make(floats[d], 2, s, 0, 80, -1, 1), y = make(floats[d], 2, e, 0, 81, -1, 1);
            check_var(x, d1, 1, 1, false, "N = correction: NaN");
            check_var(x, d1, 1, 5, false, "N < correction: NaN");
            check_var(x, d1, 1, 0, false, "N = 1, population");
            check_var(y, NULL, 0, 1, false, "empty");
            const int64_t one[1] = {1};
            both z = make(floats[d], 0, one, 0, 82, -1, 1);
            check_var(z, NULL, 0, 0, false, "0-d");
        }
}

/* ---- argmax ----------------------------------------------------------------------------------------- */

Test(gpu_reduce, argmax_paths)
{
    GPU_REQUIRE();
    const ct_dtype dts[8] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16,
                             CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8,  CT_DTYPE_BOOL};
    typedef struct {
        int ndim;
        int64_t shape[3];
        int dim;
    } am_case;
    const am_case am[] = {
        {1, {7}, 0},           {2, {33, 1000}, 1},  {2, {33, 1000}, 0},  {2, {4, 5000}, 1},
        {2, {3000, 40}, 0},    {2, {50, 2048}, 0},  {3, {10, 2000, 3}, 1}, {3, {4, 5, 6}, -1},
        {2, {2, 262147}, 1},
    };
    for (int d = 0; d < 8; d++)
        for (size_t c = 0; c < sizeof am / sizeof am[0]; c++)
            for (int ties = 0; ties < 2; ties++) CT_FRAME {
                    /* ties: few distinct values, so the first maximum must win */
                    const double hi = ties ? 4 : dts[d] == CT_DTYPE_U8 ? 256 : 1000;
                    both x = make(dts[d], am[c].ndim, am[c].shape, c % 4 == 3 ? 1 : 0, 90 + c, dts[d] == CT_DTYPE_U8 ? 0 : -hi, hi);
                    if (ties && ct_dtype_is_float(dts[d])) {
                        x.cpu = ct_tensor_cast(ct_tensor_cast(x.cpu, CT_DTYPE_I64), dts[d]);
                        x.gpu = gpu_of(x.cpu);
                    }
                    char ctx[48];
                    snprintf(ctx, sizeof ctx, "case %zu%s", c, ties ? ", ties" : "");
                    check_argmax(x, am[c].dim, c % 2 == 1, ctx);
                }
}

Test(gpu_reduce, argmax_nan_and_0d)
{
    GPU_REQUIRE();
    enum { R = 6, C = 3000 };
    static double v[R * C];
    for (int i = 0; i < R * C; i++) v[i] = (double)((i * 104729) % 997);
    v[1 * C + 2999] = NAN;                        /* last */
    v[2 * C + 5] = NAN, v[2 * C + 2500] = NAN;    /* the first of two */
    v[3 * C + 0] = NAN;                           /* first */
    v[4 * C + 10] = INFINITY, v[4 * C + 11] = NAN; /* NaN beats inf */
    for (int j = 0; j < C; j++) v[5 * C + j] = -INFINITY; /* all -inf: index 0 */
    const int64_t shape[2] = {R, C};
    for (int d = 0; d < 4; d++) CT_FRAME {
            both x = from_values(floats[d], 2, shape, v);
            check_argmax(x, 1, false, "NaN in rows");
            check_argmax(x, 0, true, "NaN in columns");
            const int64_t one[1] = {1};
            both s = make(floats[d], 0, one, 0, 95, -1, 1);
            check_argmax(s, 0, false, "0-d");
        }
}

/* ---- sum_to_shape and errors ---------------------------------------------------------------------------- */

Test(gpu_reduce, sum_to_shape)
{
    GPU_REQUIRE();
    const int64_t s[3] = {8, 33, 40}, to1[2] = {33, 1}, to2[1] = {40}, to3[3] = {1, 33, 40};
    for (int d = 0; d < 4; d++) CT_FRAME {
            both x = make(floats[d], 3, s, 0, 96, -1, 1);
            gpu_expect_close(ct_kernel_sum_to_shape(x.gpu, 2, to1), ct_kernel_sum_to_shape(x.cpu, 2, to1), "to (33, 1)");
            gpu_expect_close(ct_kernel_sum_to_shape(x.gpu, 1, to2), ct_kernel_sum_to_shape(x.cpu, 1, to2), "to (40)");
            gpu_expect_close(ct_kernel_sum_to_shape(x.gpu, 3, to3), ct_kernel_sum_to_shape(x.cpu, 3, to3), "to (1, 33, 40)");
            gpu_expect_close(ct_kernel_sum_to_shape(x.gpu, 3, s), ct_kernel_sum_to_shape(x.cpu, 3, s), "to its own shape");
        }
}

Test(gpu_reduce, errors_match_the_cpu)
{
    GPU_REQUIRE();
    CT_FRAME {
        const int64_t e[2] = {0, 5}, s[2] = {3, 4};
        both x = make(CT_DTYPE_F32, 2, e, 0, 1, -1, 1), i = make(CT_DTYPE_I32, 2, s, 0, 2, -5, 5);
        const int d0[1] = {0}, d5[1] = {5}, dd[2] = {1, -1};
        cr_assert_null(ct_kernel_max(x.gpu, d0, 1, false));
        cr_assert(strstr(ct_last_error(), "no identity"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_argmax(x.gpu, 0, false));
        cr_assert(strstr(ct_last_error(), "no identity"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_mean(i.gpu, NULL, 0, false));
        cr_assert(strstr(ct_last_error(), "mean"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_var(i.gpu, NULL, 0, 1, false));
        cr_assert(strstr(ct_last_error(), "var"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_sum(i.gpu, d5, 1, false));
        cr_assert(strstr(ct_last_error(), "out of range"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_sum(i.gpu, dd, 2, false));
        cr_assert(strstr(ct_last_error(), "twice"), "%s", ct_last_error());
    }
}
