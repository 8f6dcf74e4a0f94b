/* GPU conformance tests for the elementwise ops (kernels/elementwise.c on cuda:0,
 * kernels/cuda/binary.cu and unary.cu).
 *
 * Every op runs on the same random inputs on the CPU (the CPU entry point, itself
 * tested against the CPU references in tests/kernels/test_elementwise.c) and on the
 * GPU, through the entry point (the fast kernels) and through the CUDA reference
 * kernels called directly; both GPU results are held to the one tolerance table
 * of tests/gpu_conformance.h (bit-exact for integer, bool and comparison results).
 * Inputs cover broadcasting corners, 0-d and empty tensors, odd sizes, sizes that
 * take many blocks, and transposed, sliced and expanded views (made the same way
 * on both devices). */
#include <string.h>

#include "core/frame.h"
#include "kernels/cpu/elementwise.h"
#include "tests/gpu_conformance.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/elementwise.h"
#endif

static const ct_dtype floats[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};
static const ct_dtype ints[3] = {CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8};

/* One input on both devices: the same values, the same view. */
typedef struct both {
    ct_tensor *cpu, *gpu;
} both;

/* Layouts: 0 contiguous, 1 transposed (last two dims), 2 every other row of dim 0,
 * 3 expanded (dim 0 broadcast from size 1). */
static ct_tensor *layout_view(ct_tensor *base, int layout, int ndim, const int64_t *shape)
{
    if (layout == 1 && ndim >= 2) return ct_tensor_transpose(base, -1, -2);
    if (layout == 2 && ndim >= 1) return ct_tensor_slice(base, 0, 0, base->shape[0], 2);
    if (layout == 3 && ndim >= 1) return ct_tensor_expand(base, ndim, shape);
    return base;
}

/* Uniform [lo, hi) values (integers truncate; bool is true or false with
 * probability 1/2) of logical shape `shape` in the given layout. */
static both make(ct_dtype dt, int ndim, const int64_t *shape, int layout, uint64_t seed, double lo, double hi)
{
    int64_t s[CT_MAX_DIMS];
    memcpy(s, shape, sizeof(int64_t) * (size_t)ndim);
    if (layout == 1 && ndim >= 2) s[ndim - 1] = shape[ndim - 2], s[ndim - 2] = shape[ndim - 1];
    else if (layout == 2 && ndim >= 1) s[0] = 2 * shape[0];
    else if (layout == 3 && ndim >= 1) s[0] = 1;
    ct_tensor *base = dt == CT_DTYPE_BOOL
                          ? ct_tensor_cast(gpu_rand_cpu(CT_DTYPE_I64, ndim, s, seed, 0, 2), CT_DTYPE_BOOL)
                          : gpu_rand_cpu(dt, ndim, s, seed, lo, hi);
    cr_assert_not_null(base, "%s", ct_last_error());
    ct_tensor *gbase = gpu_of(base);
    cr_assert_not_null(gbase, "copy to the GPU: %s", ct_last_error());
    both b = {layout_view(base, layout, ndim, shape), layout_view(gbase, layout, ndim, shape)};
    cr_assert(b.cpu && b.gpu, "%s", ct_last_error());
    return b;
}

/* Exact results (integers, bools, comparisons) compare bit for bit. */
static void expect(const ct_tensor *gpu, const ct_tensor *ref, const char *what)
{
    if (ref && !ct_dtype_is_float(ref->dtype)) gpu_expect_equal(gpu, ref, what);
    else gpu_expect_close(gpu, ref, what);
}

/* Broadcasting corners (ndim, shape) x (ndim, shape). */
typedef struct shape_pair {
    int na;
    int64_t a[4];
    int nb;
    int64_t b[4];
} shape_pair;

static const shape_pair pairs[] = {
    {3, {3, 1, 5}, 2, {4, 1}},       {0, {0}, 2, {2, 3}},         {2, {2, 3}, 0, {0}},
    {2, {0, 3}, 1, {3}},             {1, {1}, 1, {7}},            {2, {17, 127}, 1, {127}},
    {2, {127, 1}, 2, {1, 17}},       {3, {2, 3, 4}, 3, {2, 3, 4}}, {4, {2, 1, 3, 1}, 3, {4, 1, 5}},
    {1, {200003}, 1, {200003}},      {2, {300, 129}, 1, {129}},   {3, {33, 65, 7}, 3, {33, 1, 7}},
};
#define NPAIRS (sizeof pairs / sizeof pairs[0])

/* a op b on both devices, and the CUDA reference, against the CPU. */
static void check_binary(ct_binary_op op, both a, both b, const char *ctx)
{
    char what[256];
    snprintf(what, sizeof what, "%s %s (%s)", ct_binary_op_name(op), ct_dtype_name(a.cpu->dtype), ctx);
    ct_tensor *ref = ct_kernel_binary(op, a.cpu, b.cpu);
    cr_assert_not_null(ref, "%s: CPU: %s", what, ct_last_error());
    expect(ct_kernel_binary(op, a.gpu, b.gpu), ref, what);
#ifdef CT_HAVE_CUDA
    ct_tensor *cref = ct_tensor_empty(ref->dtype, ref->ndim, ref->shape);
    ct_tensor *gref = ct_tensor_empty_on(CT_CUDA(0), ref->dtype, ref->ndim, ref->shape);
    cr_assert(cref && gref, "%s", ct_last_error());
    cr_assert_eq(cti_cpu_binary_ref(op, cref, a.cpu, b.cpu), CT_OK);
    cr_assert_eq(cti_cuda_binary_ref(op, gref, a.gpu, b.gpu), CT_OK, "%s: %s", what, ct_last_error());
    snprintf(what, sizeof what, "%s %s (%s, CUDA reference)", ct_binary_op_name(op), ct_dtype_name(a.cpu->dtype), ctx);
    expect(gref, cref, what);
#endif
}

/* Input ranges that keep op well defined: DIV away from 0, POW on positive bases. */
static void ranges(ct_binary_op op, double *alo, double *ahi, double *blo, double *bhi)
{
    *alo = -3, *ahi = 3, *blo = -3, *bhi = 3;
    if (op == CT_BINARY_DIV) *blo = 0.5, *bhi = 4;
    if (op == CT_BINARY_POW) *alo = 0.25, *ahi = 3, *blo = -2.5, *bhi = 2.5;
}

static const ct_binary_op float_ops[] = {CT_BINARY_ADD, CT_BINARY_SUB, CT_BINARY_MUL, CT_BINARY_DIV,
                                         CT_BINARY_POW, CT_BINARY_MAX, CT_BINARY_MIN};
static const ct_binary_op int_ops[] = {CT_BINARY_ADD, CT_BINARY_SUB, CT_BINARY_MUL, CT_BINARY_MAX, CT_BINARY_MIN};
static const ct_binary_op cmp_ops[] = {CT_BINARY_EQ, CT_BINARY_NE, CT_BINARY_LT,
                                       CT_BINARY_LE, CT_BINARY_GT, CT_BINARY_GE};

static void check_unary(ct_unary_op op, both x, const char *ctx);

/* ---- binary ---------------------------------------------------------------------------------- */

Test(gpu_elementwise, binary_float_broadcast)
{
    GPU_REQUIRE();
    for (int d = 0; d < 4; d++)
        for (size_t k = 0; k < sizeof float_ops / sizeof float_ops[0]; k++)
            for (size_t p = 0; p < NPAIRS; p++) CT_FRAME {
                    double alo, ahi, blo, bhi;
                    ranges(float_ops[k], &alo, &ahi, &blo, &bhi);
                    both a = make(floats[d], pairs[p].na, pairs[p].a, 0, 100 + p, alo, ahi);
                    both b = make(floats[d], pairs[p].nb, pairs[p].b, 0, 200 + p, blo, bhi);
                    char ctx[64];
                    snprintf(ctx, sizeof ctx, "pair %zu", p);
                    check_binary(float_ops[k], a, b, ctx);
                }
}

Test(gpu_elementwise, binary_float_strided)
{
    GPU_REQUIRE();
    const int64_t s3[3] = {6, 37, 45}, s2[2] = {37, 45};
    for (int d = 0; d < 4; d++)
        for (int la = 0; la < 4; la++)
            for (int lb = 0; lb < 4; lb++) CT_FRAME {
                    both a = make(floats[d], 3, s3, la, 10 + la, -3, 3);
                    both b = make(floats[d], lb == 2 ? 3 : 2, lb == 2 ? s3 : s2, lb, 20 + lb, 0.5, 4);
                    char ctx[48];
                    snprintf(ctx, sizeof ctx, "layouts %d, %d", la, lb);
                    check_binary(CT_BINARY_DIV, a, b, ctx);
                    check_binary(CT_BINARY_MAX, a, b, ctx);
                    check_binary(CT_BINARY_LT, a, b, ctx);
                }
}

Test(gpu_elementwise, binary_compare_every_dtype)
{
    GPU_REQUIRE();
    const ct_dtype dts[8] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16,
                             CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8,  CT_DTYPE_BOOL};
    for (int d = 0; d < 8; d++)
        for (size_t k = 0; k < sizeof cmp_ops / sizeof cmp_ops[0]; k++)
            for (size_t p = 0; p < NPAIRS; p++) CT_FRAME {
                    /* few distinct values, so that equality happens */
                    both a = make(dts[d], pairs[p].na, pairs[p].a, 0, 300 + p, 0, 4);
                    both b = make(dts[d], pairs[p].nb, pairs[p].b, 0, 400 + p, 0, 4);
                    if (ct_dtype_is_float(dts[d])) { /* integral values in floats too */
                        a.cpu = ct_tensor_cast(ct_tensor_cast(a.cpu, CT_DTYPE_I64), dts[d]);
                        b.cpu = ct_tensor_cast(ct_tensor_cast(b.cpu, CT_DTYPE_I64), dts[d]);
                        a.gpu = gpu_of(a.cpu), b.gpu = gpu_of(b.cpu);
                    }
                    char ctx[64];
                    snprintf(ctx, sizeof ctx, "pair %zu", p);
                    check_binary(cmp_ops[k], a, b, ctx);
                }
}

Test(gpu_elementwise, binary_integer_wraps)
{
    GPU_REQUIRE();
    for (int d = 0; d < 3; d++) {
        /* ranges wide enough that ADD, SUB and MUL overflow */
        const double lo = ints[d] == CT_DTYPE_U8 ? 0 : ints[d] == CT_DTYPE_I32 ? -2.1e9 : -9.2e18;
        const double hi = ints[d] == CT_DTYPE_U8 ? 256 : ints[d] == CT_DTYPE_I32 ? 2.1e9 : 9.2e18;
        for (size_t k = 0; k < sizeof int_ops / sizeof int_ops[0]; k++)
            for (size_t p = 0; p < NPAIRS; p++) CT_FRAME {
                    both a = make(ints[d], pairs[p].na, pairs[p].a, 0, 500 + p, lo, hi);
                    both b = make(ints[d], pairs[p].nb, pairs[p].b, 0, 600 + p, lo, hi);
                    char ctx[64];
                    snprintf(ctx, sizeof ctx, "pair %zu", p);
                    check_binary(int_ops[k], a, b, ctx);
                }
    }
    CT_FRAME { /* strided integer operands */
        const int64_t s[2] = {33, 70};
        both a = make(CT_DTYPE_I32, 2, s, 1, 7, -1000, 1000), b = make(CT_DTYPE_I32, 2, s, 3, 8, -1000, 1000);
        check_binary(CT_BINARY_MUL, a, b, "transposed * expanded");
    }
}

Test(gpu_elementwise, binary_bool)
{
    GPU_REQUIRE();
    const int64_t s[2] = {65, 33}, r[1] = {33};
    CT_FRAME {
        both a = make(CT_DTYPE_BOOL, 2, s, 0, 1, 0, 2), b = make(CT_DTYPE_BOOL, 1, r, 0, 2, 0, 2);
        check_binary(CT_BINARY_MAX, a, b, "or");
        check_binary(CT_BINARY_MIN, a, b, "and");
        for (size_t k = 0; k < sizeof cmp_ops / sizeof cmp_ops[0]; k++) check_binary(cmp_ops[k], a, b, "bool");
    }
}

/* NaN and infinities: MAX/MIN propagate NaN, comparisons with NaN are false (NE true). */
Test(gpu_elementwise, binary_nan_inf)
{
    GPU_REQUIRE();
    const double va[8] = {NAN, 1, NAN, -INFINITY, INFINITY, 0, -0.0, 2};
    const double vb[8] = {1, NAN, NAN, INFINITY, INFINITY, -0.0, 0, -INFINITY};
    const int64_t n[1] = {8};
    for (int d = 0; d < 4; d++) CT_FRAME {
            ct_tensor *ca = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F64, 1, n, va), floats[d]);
            ct_tensor *cb = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F64, 1, n, vb), floats[d]);
            both a = {ca, gpu_of(ca)}, b = {cb, gpu_of(cb)};
            const ct_binary_op ops[] = {CT_BINARY_ADD, CT_BINARY_MUL, CT_BINARY_DIV, CT_BINARY_MAX, CT_BINARY_MIN,
                                        CT_BINARY_EQ,  CT_BINARY_NE,  CT_BINARY_LT,  CT_BINARY_GE};
            for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) check_binary(ops[k], a, b, "nan/inf");
        }
}

/* a op s and s op a; the scalar is rounded to f32 for f32/f16/bf16 (0.1 is not a bf16). */
Test(gpu_elementwise, binary_scalar)
{
    GPU_REQUIRE();
    const double scalars[4] = {0.1, 2.0, -1.5, 3.0};
    const int64_t shapes[3][3] = {{1, 1, 1}, {5, 7, 9}, {3, 211, 257}};
    const int nd[3] = {0, 3, 3};
    for (int d = 0; d < 4; d++)
        for (int sh = 0; sh < 3; sh++)
            for (size_t k = 0; k < sizeof float_ops / sizeof float_ops[0]; k++)
                for (int si = 0; si < 4; si++)
                    for (int rev = 0; rev < 2; rev++) CT_FRAME {
                            const ct_binary_op op = float_ops[k];
                            /* positive bases for POW, nonzero divisors for DIV */
                            const bool pos = op == CT_BINARY_POW || (op == CT_BINARY_DIV && rev);
                            both a = make(floats[d], nd[sh], shapes[sh], sh == 2 ? 1 : 0, 700 + sh, pos ? 0.25 : -3, 3);
                            const double s = op == CT_BINARY_POW && rev ? fabs(scalars[si]) : scalars[si];
                            char what[128];
                            snprintf(what, sizeof what, "%s %s %s %g (shape %d)", ct_dtype_name(floats[d]),
                                     rev ? "scalar" : "tensor", ct_binary_op_name(op), s, sh);
                            ct_tensor *ref = rev ? ct_kernel_rbinary_scalar(op, s, a.cpu) : ct_kernel_binary_scalar(op, a.cpu, s);
                            cr_assert_not_null(ref, "%s", ct_last_error());
                            expect(rev ? ct_kernel_rbinary_scalar(op, s, a.gpu) : ct_kernel_binary_scalar(op, a.gpu, s), ref, what);
#ifdef CT_HAVE_CUDA
                            ct_tensor *cref = ct_tensor_empty(ref->dtype, ref->ndim, ref->shape);
                            ct_tensor *gref = ct_tensor_empty_on(CT_CUDA(0), ref->dtype, ref->ndim, ref->shape);
                            cr_assert_eq(cti_cpu_binary_scalar_ref(op, cref, a.cpu, s, rev), CT_OK);
                            cr_assert_eq(cti_cuda_binary_scalar_ref(op, gref, a.gpu, s, rev), CT_OK, "%s", ct_last_error());
                            expect(gref, cref, what);
#endif
                        }
}

Test(gpu_elementwise, binary_scalar_integer_and_compare)
{
    GPU_REQUIRE();
    const int64_t s[2] = {31, 67};
    const ct_dtype dts[4] = {CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8, CT_DTYPE_F32};
    for (int d = 0; d < 4; d++)
        for (int rev = 0; rev < 2; rev++) CT_FRAME {
                both a = make(dts[d], 2, s, 1, 800 + d, 0, 9);
                const ct_binary_op ops[] = {CT_BINARY_ADD, CT_BINARY_SUB, CT_BINARY_MUL, CT_BINARY_MAX,
                                            CT_BINARY_MIN, CT_BINARY_EQ,  CT_BINARY_LT,  CT_BINARY_GE};
                for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
                    ct_tensor *ref = rev ? ct_kernel_rbinary_scalar(ops[k], 4, a.cpu) : ct_kernel_binary_scalar(ops[k], a.cpu, 4);
                    ct_tensor *gpu = rev ? ct_kernel_rbinary_scalar(ops[k], 4, a.gpu) : ct_kernel_binary_scalar(ops[k], a.gpu, 4);
                    char what[96];
                    snprintf(what, sizeof what, "%s %s 4 (%s)", ct_dtype_name(dts[d]), ct_binary_op_name(ops[k]),
                             rev ? "reversed" : "");
                    expect(gpu, ref, what);
                }
            }
}

/* binary_out: in place (out is a), into a transposed view, and into a view that
 * overlaps an input without being it (through a temporary). */
Test(gpu_elementwise, binary_out_in_place_and_views)
{
    GPU_REQUIRE();
    const int64_t s[2] = {40, 50}, r[1] = {50};
    for (int d = 0; d < 4; d++) CT_FRAME {
            both a = make(floats[d], 2, s, 0, 900, -2, 2), b = make(floats[d], 1, r, 0, 901, -2, 2);
            ct_tensor *ref = ct_kernel_binary(CT_BINARY_SUB, a.cpu, b.cpu);
            cr_assert_eq(ct_kernel_binary_out(CT_BINARY_SUB, a.gpu, a.gpu, b.gpu), CT_OK, "%s", ct_last_error());
            gpu_expect_close(a.gpu, ref, "sub in place");

            const int64_t st[2] = {50, 40};
            ct_tensor *gt = ct_tensor_empty_on(CT_CUDA(0), floats[d], 2, st);
            cr_assert_not_null(gt, "%s", ct_last_error());
            ct_tensor *gview = ct_tensor_transpose(gt, 0, 1);
            both c = make(floats[d], 2, s, 0, 902, -2, 2);
            cr_assert_eq(ct_kernel_binary_out(CT_BINARY_MUL, gview, c.gpu, b.gpu), CT_OK, "%s", ct_last_error());
            gpu_expect_close(gview, ct_kernel_binary(CT_BINARY_MUL, c.cpu, b.cpu), "mul into a transposed view");

            /* out = rows 1.. of x, a = rows ..-1 of x: overlapping, shifted by one row */
            const int64_t sx[2] = {41, 50};
            both x = make(floats[d], 2, sx, 0, 903, -2, 2);
            ct_tensor *want = ct_kernel_binary(CT_BINARY_ADD, ct_tensor_narrow(x.cpu, 0, 0, 40), b.cpu);
            cr_assert_eq(ct_kernel_binary_out(CT_BINARY_ADD, ct_tensor_narrow(x.gpu, 0, 1, 40),
                                              ct_tensor_narrow(x.gpu, 0, 0, 40), b.gpu), CT_OK, "%s", ct_last_error());
            gpu_expect_close(ct_tensor_narrow(x.gpu, 0, 1, 40), want, "add into an overlapping view");
        }
}

/* Contiguous views that start one element into their storage: flat, but not
 * aligned for the vector path, so they go element by element; and lengths that
 * leave a tail after the vectors. */
Test(gpu_elementwise, contiguous_offsets_and_tails)
{
    GPU_REQUIRE();
    const ct_dtype dts[7] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16,
                             CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8};
    const int64_t lens[4] = {1, 15, 17, 4099};
    for (int d = 0; d < 7; d++)
        for (int l = 0; l < 4; l++)
            for (int shift = 0; shift < 3; shift++) CT_FRAME {
                    const int64_t n[1] = {lens[l] + 2};
                    both a = make(dts[d], 1, n, 0, 950 + l, 0.5, 4), b = make(dts[d], 1, n, 0, 960 + l, 0.5, 4);
                    /* shift 0: both aligned; 1: a one element in; 2: both */
                    both va = {ct_tensor_narrow(a.cpu, 0, shift ? 1 : 0, lens[l]), ct_tensor_narrow(a.gpu, 0, shift ? 1 : 0, lens[l])};
                    both vb = {ct_tensor_narrow(b.cpu, 0, shift == 2 ? 1 : 0, lens[l]), ct_tensor_narrow(b.gpu, 0, shift == 2 ? 1 : 0, lens[l])};
                    char ctx[48];
                    snprintf(ctx, sizeof ctx, "length %lld, shift %d", (long long)lens[l], shift);
                    check_binary(CT_BINARY_MUL, va, vb, ctx);
                    check_binary(CT_BINARY_GE, va, vb, ctx);
                    check_unary(CT_UNARY_NEG, va, ctx);
                    if (!ct_dtype_is_float(dts[d])) continue;
                    check_unary(CT_UNARY_SQRT, va, ctx);
                    char what[96];
                    snprintf(what, sizeof what, "silu backward %s (%s)", ct_dtype_name(dts[d]), ctx);
                    gpu_expect_close(ct_kernel_unary_backward(CT_UNARY_SILU, va.gpu, vb.gpu, NULL),
                                     ct_kernel_unary_backward(CT_UNARY_SILU, va.cpu, vb.cpu, NULL), what);
                }
}

/* ---- where ------------------------------------------------------------------------------------- */

Test(gpu_elementwise, where_every_dtype)
{
    GPU_REQUIRE();
    const ct_dtype dts[8] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16,
                             CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8,  CT_DTYPE_BOOL};
    const int64_t sc[3] = {7, 1, 129}, sa[2] = {33, 129}, sb[1] = {1}, big[2] = {513, 1031};
    for (int d = 0; d < 8; d++)
        for (int big_case = 0; big_case < 2; big_case++) CT_FRAME {
                both c = big_case ? make(CT_DTYPE_BOOL, 2, big, 1, 1000, 0, 2) : make(CT_DTYPE_BOOL, 3, sc, 0, 1000, 0, 2);
                both a = big_case ? make(dts[d], 2, big, 0, 1001, -50, 50) : make(dts[d], 2, sa, 0, 1001, -50, 50);
                both b = big_case ? make(dts[d], 2, big, 3, 1002, -50, 50) : make(dts[d], 1, sb, 0, 1002, -50, 50);
                char what[64];
                snprintf(what, sizeof what, "where %s (%s)", ct_dtype_name(dts[d]), big_case ? "large" : "broadcast");
                ct_tensor *ref = ct_kernel_where(c.cpu, a.cpu, b.cpu);
                cr_assert_not_null(ref, "%s", ct_last_error());
                gpu_expect_equal(ct_kernel_where(c.gpu, a.gpu, b.gpu), ref, what);
#ifdef CT_HAVE_CUDA
                ct_tensor *gref = ct_tensor_empty_on(CT_CUDA(0), ref->dtype, ref->ndim, ref->shape);
                cr_assert_eq(cti_cuda_where_ref(gref, c.gpu, a.gpu, b.gpu), CT_OK, "%s", ct_last_error());
                gpu_expect_equal(gref, ref, what);
#endif
            }
}

/* ---- unary ------------------------------------------------------------------------------------- */

/* Inputs where op is defined and interesting. */
static void unary_range(ct_unary_op op, double *lo, double *hi)
{
    *lo = -4, *hi = 4;
    if (op == CT_UNARY_LOG || op == CT_UNARY_SQRT || op == CT_UNARY_RSQRT) *lo = 0.05, *hi = 8;
    if (op == CT_UNARY_EXP) *lo = -10, *hi = 10;
    if (op == CT_UNARY_GELU_TANH || op == CT_UNARY_GELU_ERF || op == CT_UNARY_SILU || op == CT_UNARY_SIGMOID)
        *lo = -8, *hi = 8;
}

static void check_unary(ct_unary_op op, both x, const char *ctx)
{
    char what[128];
    snprintf(what, sizeof what, "%s %s (%s)", ct_unary_op_name(op), ct_dtype_name(x.cpu->dtype), ctx);
    ct_tensor *ref = ct_kernel_unary(op, x.cpu);
    cr_assert_not_null(ref, "%s: CPU: %s", what, ct_last_error());
    expect(ct_kernel_unary(op, x.gpu), ref, what);
#ifdef CT_HAVE_CUDA
    ct_tensor *cref = ct_tensor_empty(ref->dtype, ref->ndim, ref->shape);
    ct_tensor *gref = ct_tensor_empty_on(CT_CUDA(0), ref->dtype, ref->ndim, ref->shape);
    cr_assert(cref && gref, "%s", ct_last_error());
    cr_assert_eq(cti_cpu_unary_ref(op, cref, x.cpu), CT_OK);
    cr_assert_eq(cti_cuda_unary_ref(op, gref, x.gpu), CT_OK, "%s: %s", what, ct_last_error());
    snprintf(what, sizeof what, "%s %s (%s, CUDA reference)", ct_unary_op_name(op), ct_dtype_name(x.cpu->dtype), ctx);
    expect(gref, cref, what);
#endif
}

static const int64_t ushapes[5][3] = {{1, 1, 1}, {1, 0, 5}, {3, 5, 7}, {1, 1, 300007}, {9, 65, 129}};
static const int und[5] = {0, 2, 3, 1, 3};

Test(gpu_elementwise, unary_float)
{
    GPU_REQUIRE();
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < CT_UNARY_OP_COUNT; op++)
            for (int sh = 0; sh < 5; sh++)
                for (int layout = 0; layout < 3; layout += 1) CT_FRAME {
                        if (layout && und[sh] < 2) continue;
                        double lo, hi;
                        unary_range((ct_unary_op)op, &lo, &hi);
                        /* 1-d shapes use the last entries of the row */
                        both x = make(floats[d], und[sh], ushapes[sh] + (3 - und[sh]), layout, 1100 + sh, lo, hi);
                        char ctx[64];
                        snprintf(ctx, sizeof ctx, "shape %d, layout %d", sh, layout);
                        check_unary((ct_unary_op)op, x, ctx);
                    }
}

/* Infinities, NaN, signed zeros, tiny and huge values through every op. */
Test(gpu_elementwise, unary_special_values)
{
    GPU_REQUIRE();
    const double v[14] = {-INFINITY, -100, -20, -1, -1e-30, -0.0, 0, 1e-30, 0.5, 1, 20, 100, INFINITY, NAN};
    const int64_t n[1] = {14};
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < CT_UNARY_OP_COUNT; op++) CT_FRAME {
                ct_tensor *c = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F64, 1, n, v), floats[d]);
                both x = {c, gpu_of(c)};
                check_unary((ct_unary_op)op, x, "special values");
            }
}

Test(gpu_elementwise, unary_integer)
{
    GPU_REQUIRE();
    const ct_unary_op ops[3] = {CT_UNARY_NEG, CT_UNARY_ABS, CT_UNARY_RELU};
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 3; k++) CT_FRAME {
                const int64_t s[2] = {37, 101};
                both x = make(ints[d], 2, s, 1, 1200 + d, ints[d] == CT_DTYPE_U8 ? 0 : -1000, 1000);
                check_unary(ops[k], x, "random");
                /* the most negative value wraps: -INT_MIN = INT_MIN */
                const double edge[4] = {ints[d] == CT_DTYPE_I32 ? -2147483648.0 : ints[d] == CT_DTYPE_I64 ? -9223372036854775808.0 : 0,
                                        -1, 0, ints[d] == CT_DTYPE_U8 ? 255 : 2147483647.0};
                const int64_t ne[1] = {4};
                ct_tensor *c = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_F64, 1, ne, edge), ints[d]);
                if (ints[d] == CT_DTYPE_U8) continue; /* -1 is not a u8 */
                both e = {c, gpu_of(c)};
                check_unary(ops[k], e, "edges");
            }
}

Test(gpu_elementwise, unary_out_in_place)
{
    GPU_REQUIRE();
    const int64_t s[2] = {50, 70};
    for (int d = 0; d < 4; d++) CT_FRAME {
            both x = make(floats[d], 2, s, 1, 1300, -3, 3);
            ct_tensor *ref = ct_kernel_unary(CT_UNARY_GELU_TANH, x.cpu);
            cr_assert_eq(ct_kernel_unary_out(CT_UNARY_GELU_TANH, x.gpu, x.gpu), CT_OK, "%s", ct_last_error());
            gpu_expect_close(x.gpu, ref, "gelu_tanh in place on a transposed view");
        }
}

/* ---- unary backward ------------------------------------------------------------------------------ */

Test(gpu_elementwise, unary_backward)
{
    GPU_REQUIRE();
    const int64_t shapes[4][3] = {{1, 1, 1}, {3, 5, 7}, {1, 1, 262147}, {0, 4, 4}};
    const int nd[4] = {0, 3, 1, 3};
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < CT_UNARY_OP_COUNT; op++)
            for (int sh = 0; sh < 4; sh++)
                for (int with_y = 0; with_y < 2; with_y++)
                    for (int layout = 0; layout < 2; layout++) CT_FRAME {
                            if (layout && nd[sh] < 2) continue;
                            double lo, hi;
                            unary_range((ct_unary_op)op, &lo, &hi);
                            const int64_t *shape = shapes[sh] + (3 - nd[sh]);
                            both x = make(floats[d], nd[sh], shape, layout, 1400 + sh, lo, hi);
                            both g = make(floats[d], nd[sh], shape, layout ? 2 : 0, 1500 + sh, -1, 1);
                            both y = {NULL, NULL};
                            if (with_y) {
                                y.cpu = ct_kernel_unary((ct_unary_op)op, x.cpu);
                                y.gpu = gpu_of(y.cpu);
                                cr_assert(y.cpu && y.gpu, "%s", ct_last_error());
                            }
                            char what[128];
                            snprintf(what, sizeof what, "%s backward %s (shape %d, %s, layout %d)",
                                     ct_unary_op_name((ct_unary_op)op), ct_dtype_name(floats[d]), sh,
                                     with_y ? "with y" : "x only", layout);
                            ct_tensor *ref = ct_kernel_unary_backward((ct_unary_op)op, g.cpu, x.cpu, y.cpu);
                            cr_assert_not_null(ref, "%s: CPU: %s", what, ct_last_error());
                            gpu_expect_close(ct_kernel_unary_backward((ct_unary_op)op, g.gpu, x.gpu, y.gpu), ref, what);
#ifdef CT_HAVE_CUDA
                            /* the references see the operands the entry point passes on */
                            const bool y_only = with_y && (op == CT_UNARY_EXP || op == CT_UNARY_TANH ||
                                                           op == CT_UNARY_SIGMOID);
                            ct_tensor *cref = ct_tensor_empty(ref->dtype, ref->ndim, ref->shape);
                            ct_tensor *gref = ct_tensor_empty_on(CT_CUDA(0), ref->dtype, ref->ndim, ref->shape);
                            cr_assert_eq(cti_cpu_unary_backward_ref((ct_unary_op)op, cref, g.cpu, y_only ? NULL : x.cpu, y.cpu), CT_OK);
                            cr_assert_eq(cti_cuda_unary_backward_ref((ct_unary_op)op, gref, g.gpu, y_only ? NULL : x.gpu, y.gpu),
                                         CT_OK, "%s", ct_last_error());
                            gpu_expect_close(gref, cref, what);
#endif
                        }
}

/* ---- errors ----------------------------------------------------------------------------------------- */

Test(gpu_elementwise, errors_match_the_cpu)
{
    GPU_REQUIRE();
    const int64_t s[2] = {3, 4}, t[2] = {3, 5};
    CT_FRAME {
        both a = make(CT_DTYPE_F32, 2, s, 0, 1, -1, 1), b64 = make(CT_DTYPE_F64, 2, s, 0, 2, -1, 1);
        both c = make(CT_DTYPE_F32, 2, t, 0, 3, -1, 1), i = make(CT_DTYPE_I32, 2, s, 0, 4, -5, 5);

        cr_assert_null(ct_kernel_binary(CT_BINARY_ADD, a.gpu, b64.gpu));
        cr_assert(strstr(ct_last_error(), "dtypes differ"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_binary(CT_BINARY_ADD, a.gpu, c.gpu));
        cr_assert(strstr(ct_last_error(), "cannot broadcast"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_binary(CT_BINARY_DIV, i.gpu, i.gpu));
        cr_assert(strstr(ct_last_error(), "div"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_unary(CT_UNARY_LOG, i.gpu));
        cr_assert(strstr(ct_last_error(), "log"), "%s", ct_last_error());
        cr_assert_null(ct_kernel_binary_scalar(CT_BINARY_ADD, i.gpu, 0.5));
        cr_assert(strstr(ct_last_error(), "scalar"), "%s", ct_last_error());

        /* a CPU and a GPU tensor in one op: the message names both devices */
        cr_assert_null(ct_kernel_binary(CT_BINARY_ADD, a.cpu, a.gpu));
        cr_assert(strstr(ct_last_error(), "different devices") && strstr(ct_last_error(), "cpu") &&
                      strstr(ct_last_error(), "cuda"),
                  "%s", ct_last_error());
        cr_assert_null(ct_kernel_unary_backward(CT_UNARY_RELU, a.gpu, a.cpu, NULL));
        cr_assert(strstr(ct_last_error(), "cpu") && strstr(ct_last_error(), "cuda"), "%s", ct_last_error());
        ct_tensor *cond = ct_kernel_binary(CT_BINARY_GT, a.gpu, a.gpu);
        cr_assert_null(ct_kernel_where(cond, a.gpu, a.cpu));
        cr_assert(strstr(ct_last_error(), "cpu") && strstr(ct_last_error(), "cuda"), "%s", ct_last_error());
        cr_assert_neq(ct_kernel_binary_out(CT_BINARY_ADD, a.cpu, a.gpu, a.gpu), CT_OK);
        cr_assert(strstr(ct_last_error(), "cpu") && strstr(ct_last_error(), "cuda"), "%s", ct_last_error());
    }
}
