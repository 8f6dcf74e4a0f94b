/* Tests for kernels/elementwise.c and kernels/cpu/{elementwise,binary,unary}.c.
 *
 * The fast kernels are compared with the *_ref kernels (one element at a time,
 * double math, their own index arithmetic) on random shapes with broadcasting
 * corners, strided, expanded and in-place operands. The references themselves
 * are checked against values worked out by hand, against libm called directly
 * here, and (backward) against central finite differences in f64. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/cuda.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/elementwise.h"
#include "tests/kernels/util.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* Uniform [lo, hi) values of dtype dt in the given logical shape and layout:
 * 0 contiguous, 1 transposed (last two dims), 2 every other row of dim 0,
 * 3 expanded (dim 0 broadcast from size 1). Integer dtypes truncate; bool is
 * true or false with probability 1/2 (lo, hi ignored). */
static ct_tensor *make(ct_dtype dt, int ndim, const int64_t *shape, int layout, double lo, double hi)
{
    int64_t s[CT_MAX_DIMS];
    memcpy(s, shape, sizeof(int64_t) * (size_t)ndim);
    if (layout == 1 && ndim >= 2) {
        s[ndim - 1] = shape[ndim - 2];
        s[ndim - 2] = shape[ndim - 1];
    } else if (layout == 2 && ndim >= 1) {
        s[0] = 2 * shape[0];
    } else if (layout == 3 && ndim >= 1) {
        s[0] = 1;
    }
    ct_tensor *base = dt == CT_DTYPE_BOOL /* half true, half false: truncate [0, 2) */
                          ? ct_tensor_cast(ct_tensor_cast(ct_tensor_rand(CT_DTYPE_F64, ndim, s, 0, 2), CT_DTYPE_I64), dt)
                          : ct_tensor_cast(ct_tensor_rand(CT_DTYPE_F64, ndim, s, lo, hi), dt);
    cr_assert_not_null(base, "%s", ct_last_error());
    ct_tensor *t = base;
    if (layout == 1 && ndim >= 2) t = ct_tensor_transpose(base, -1, -2);
    else if (layout == 2 && ndim >= 1) t = ct_tensor_slice(base, 0, 0, s[0], 2);
    else if (layout == 3 && ndim >= 1) t = ct_tensor_expand(base, ndim, shape);
    cr_assert_not_null(t, "%s", ct_last_error());
    return t;
}

static double get1(const ct_tensor *t, int64_t i) { return ct_tensor_get(t, (int64_t[]){i}); }

static void check_binary(ct_binary_op op, const ct_tensor *a, const ct_tensor *b, double tol)
{
    ct_tensor *fast = ct_kernel_binary(op, a, b);
    cr_assert_not_null(fast, "%s: %s", ct_binary_op_name(op), ct_last_error());
    ct_tensor *ref = ct_tensor_empty(fast->dtype, fast->ndim, fast->shape);
    cr_assert_eq(cti_cpu_binary_ref(op, ref, a, b), CT_OK);
    char da[200], db[200];
    double e = rel_err_nan(fast, ref);
    cr_assert(e <= tol, "%s %s %s: rel err %g > %g", ct_binary_op_name(op), ct_tensor_describe(a, da, sizeof da),
              ct_tensor_describe(b, db, sizeof db), e, tol);
}

/* Broadcasting corners: pairs of shapes (ndim -1 ends the list). */
typedef struct shape_pair {
    int na;
    int64_t a[4];
    int nb;
    int64_t b[4];
} shape_pair;

static const shape_pair pairs[] = {
    {3, {3, 1, 5}, 2, {4, 1}},   {0, {0}, 2, {2, 3}},     {2, {2, 3}, 0, {0}},     {2, {0, 3}, 1, {3}},
    {1, {1}, 1, {7}},            {2, {17, 127}, 1, {127}}, {2, {127, 1}, 2, {1, 17}}, {1, {5}, 1, {5}},
    {3, {2, 3, 4}, 3, {2, 3, 4}}, {2, {3, 17}, 2, {3, 1}},  {4, {2, 1, 3, 1}, 3, {4, 1, 5}},
    {1, {40000}, 1, {40000}},    {2, {300, 129}, 1, {129}},
};

/* ---- references against hand values and libm --------------------------------------------- */

Test(elementwise_ref, binary_hand_values)
{
    CT_FRAME {
        ct_tensor *a = from_f64(CT_DTYPE_F32, CT_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
        ct_tensor *b = from_f64(CT_DTYPE_F32, CT_SHAPE(3), (double[]){10, 20, 0.5});
        ct_tensor *o = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(2, 3));
        const double add[6] = {11, 22, 3.5, 14, 25, 6.5}, sub[6] = {-9, -18, 2.5, -6, -15, 5.5};
        const double div[6] = {0.1, 0.1, 6, 0.4, 0.25, 12}, pw[6] = {1, 1048576, 1.7320508075688772, 1048576,
                                                                     95367431640625.0, 2.449489742783178};
        cti_cpu_binary_ref(CT_BINARY_ADD, o, a, b);
        for (int i = 0; i < 6; i++) cr_assert_eq(ct_tensor_get(o, (int64_t[]){i / 3, i % 3}), add[i]);
        cti_cpu_binary_ref(CT_BINARY_SUB, o, a, b);
        for (int i = 0; i < 6; i++) cr_assert_eq(ct_tensor_get(o, (int64_t[]){i / 3, i % 3}), sub[i]);
        cti_cpu_binary_ref(CT_BINARY_DIV, o, a, b);
        for (int i = 0; i < 6; i++)
            cr_assert_eq(ct_tensor_get(o, (int64_t[]){i / 3, i % 3}), (double)(float)div[i]);
        cti_cpu_binary_ref(CT_BINARY_POW, o, a, b);
        for (int i = 0; i < 6; i++)
            cr_assert_eq(ct_tensor_get(o, (int64_t[]){i / 3, i % 3}), (double)(float)pw[i], "pow %d", i);
        /* comparisons, max/min with NaN (propagates from either side) */
        ct_tensor *x = from_f64(CT_DTYPE_F64, CT_SHAPE(4), (double[]){1, NAN, 3, -0.5});
        ct_tensor *y = from_f64(CT_DTYPE_F64, CT_SHAPE(4), (double[]){2, 1, NAN, -0.5});
        ct_tensor *m = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(4)), *c = ct_tensor_empty(CT_DTYPE_BOOL, CT_SHAPE(4));
        cti_cpu_binary_ref(CT_BINARY_MAX, m, x, y);
        cr_assert(get1(m, 0) == 2 && isnan(get1(m, 1)) && isnan(get1(m, 2)) && get1(m, 3) == -0.5);
        cti_cpu_binary_ref(CT_BINARY_MIN, m, x, y);
        cr_assert(get1(m, 0) == 1 && isnan(get1(m, 1)) && isnan(get1(m, 2)) && get1(m, 3) == -0.5);
        cti_cpu_binary_ref(CT_BINARY_LE, c, x, y);
        cr_assert(get1(c, 0) == 1 && get1(c, 1) == 0 && get1(c, 2) == 0 && get1(c, 3) == 1);
        cti_cpu_binary_ref(CT_BINARY_NE, c, x, y);
        cr_assert(get1(c, 0) == 1 && get1(c, 1) == 1 && get1(c, 2) == 1 && get1(c, 3) == 0);
        /* integers wrap like two's complement */
        ct_tensor *i = from_f64(CT_DTYPE_I32, CT_SHAPE(2), (double[]){2147483647, -2147483648.0});
        ct_tensor *j = from_f64(CT_DTYPE_I32, CT_SHAPE(2), (double[]){1, 1});
        ct_tensor *k = ct_tensor_empty(CT_DTYPE_I32, CT_SHAPE(2));
        cti_cpu_binary_ref(CT_BINARY_ADD, k, i, j);
        cr_assert(get1(k, 0) == -2147483648.0 && get1(k, 1) == -2147483647.0);
        cti_cpu_binary_ref(CT_BINARY_SUB, k, i, j);
        cr_assert(get1(k, 0) == 2147483646.0 && get1(k, 1) == 2147483647.0);
        ct_tensor *u = from_f64(CT_DTYPE_U8, CT_SHAPE(2), (double[]){250, 3});
        ct_tensor *v = from_f64(CT_DTYPE_U8, CT_SHAPE(2), (double[]){10, 100});
        ct_tensor *w = ct_tensor_empty(CT_DTYPE_U8, CT_SHAPE(2));
        cti_cpu_binary_ref(CT_BINARY_ADD, w, u, v);
        cr_assert(get1(w, 0) == 4 && get1(w, 1) == 103);
        cti_cpu_binary_ref(CT_BINARY_MUL, w, u, v);
        cr_assert(get1(w, 0) == (2500 % 256) && get1(w, 1) == (300 % 256));
        /* scalar forms */
        cti_cpu_binary_scalar_ref(CT_BINARY_SUB, o, a, 1.0, true);
        cr_assert(ct_tensor_get(o, (int64_t[]){1, 2}) == -5.0);
        cti_cpu_binary_scalar_ref(CT_BINARY_DIV, o, a, 1.0, true);
        cr_assert(ct_tensor_get(o, (int64_t[]){0, 1}) == 0.5);
        /* where, broadcast over all three */
        ct_tensor *cond = from_f64(CT_DTYPE_BOOL, CT_SHAPE(2, 1), (double[]){1, 0});
        ct_tensor *wa = from_f64(CT_DTYPE_F32, CT_SHAPE(3), (double[]){1, 2, 3});
        ct_tensor *wb = ct_tensor_scalar(CT_DTYPE_F32, -1);
        ct_tensor *wo = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(2, 3));
        cti_cpu_where_ref(wo, cond, wa, wb);
        const double want[6] = {1, 2, 3, -1, -1, -1};
        for (int q = 0; q < 6; q++) cr_assert_eq(ct_tensor_get(wo, (int64_t[]){q / 3, q % 3}), want[q]);
    }
}

Test(elementwise_ref, unary_hand_values_and_libm)
{
    CT_FRAME {
        const double xs[6] = {-3.5, -1, -0.25, 0, 0.75, 2};
        ct_tensor *x = from_f64(CT_DTYPE_F64, CT_SHAPE(6), xs);
        ct_tensor *y = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(6));
        /* GELU values from the definitions, evaluated by hand to 16 digits */
        cr_assert_eq(cti_cpu_unary_ref(CT_UNARY_GELU_ERF, y, x), CT_OK);
        cr_assert(fabs(get1(y, 1) - -0.15865525393145707) < 1e-15);
        cr_assert(fabs(get1(y, 5) - 1.9544997361036416) < 1e-15);
        cti_cpu_unary_ref(CT_UNARY_GELU_TANH, y, x);
        cr_assert(fabs(get1(y, 1) - -0.15880800939172324) < 1e-15);
        cr_assert(fabs(get1(y, 5) - 1.954597694087775) < 1e-15);
        cti_cpu_unary_ref(CT_UNARY_SILU, y, x);
        cr_assert(fabs(get1(y, 1) - -0.2689414213699951) < 1e-15);
        cti_cpu_unary_ref(CT_UNARY_RELU, y, x);
        cr_assert(get1(y, 0) == 0 && get1(y, 4) == 0.75);
        for (int i = 0; i < 6; i++) {
            cti_cpu_unary_ref(CT_UNARY_EXP, y, x);
            cr_assert_eq(get1(y, i), exp(xs[i]));
            cti_cpu_unary_ref(CT_UNARY_TANH, y, x);
            cr_assert_eq(get1(y, i), tanh(xs[i]));
            cti_cpu_unary_ref(CT_UNARY_SIGMOID, y, x);
            cr_assert(fabs(get1(y, i) - 0.5 * (1 + tanh(xs[i] / 2))) < 4e-16, "sigmoid = (1 + tanh(x/2)) / 2");
            cti_cpu_unary_ref(CT_UNARY_ABS, y, x);
            cr_assert_eq(get1(y, i), fabs(xs[i]));
        }
        ct_tensor *p = from_f64(CT_DTYPE_F64, CT_SHAPE(3), (double[]){0.25, 4, 9});
        ct_tensor *q = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(3));
        cti_cpu_unary_ref(CT_UNARY_RSQRT, q, p);
        cr_assert(get1(q, 0) == 2 && get1(q, 1) == 0.5 && fabs(get1(q, 2) - 1.0 / 3) < 1e-16);
        cti_cpu_unary_ref(CT_UNARY_LOG, q, p);
        cr_assert(get1(q, 1) == log(4.0));
        /* integers: -INT_MIN wraps to INT_MIN, as in C on unsigned */
        ct_tensor *i = from_f64(CT_DTYPE_I32, CT_SHAPE(2), (double[]){-2147483648.0, -5});
        ct_tensor *o = ct_tensor_empty(CT_DTYPE_I32, CT_SHAPE(2));
        cti_cpu_unary_ref(CT_UNARY_ABS, o, i);
        cr_assert(get1(o, 0) == -2147483648.0 && get1(o, 1) == 5);
    }
}

/* ---- fast vs ref --------------------------------------------------------------------------- */

Test(elementwise, binary_float_broadcasting_layouts)
{
    ct_set_seed(1);
    const ct_dtype dts[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        for (int di = 0; di < 4; di++) {
            const ct_dtype dt = dts[di];
            if (pairs[p].a[0] == 40000 && dt != CT_DTYPE_F32) continue; /* the big one once is enough */
            CT_FRAME {
                for (int la = 0; la < 4; la++) {
                    const int lb = (la + (int)p) % 4;
                    ct_tensor *a = make(dt, pairs[p].na, pairs[p].a, la, -2, 2);
                    ct_tensor *b = make(dt, pairs[p].nb, pairs[p].b, lb, 0.5, 2);
                    for (int op = 0; op < CT_BINARY_OP_COUNT; op++)
                        check_binary(op, a, b, ct_binary_op_is_comparison(op) ? 0.0 : tol_for(dt));
                }
            }
        }
    }
}

Test(elementwise, binary_integer_and_bool)
{
    ct_set_seed(2);
    const ct_dtype dts[3] = {CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8};
    const ct_binary_op ops[10] = {CT_BINARY_ADD, CT_BINARY_SUB, CT_BINARY_MUL, CT_BINARY_MAX, CT_BINARY_MIN,
                                  CT_BINARY_EQ,  CT_BINARY_NE,  CT_BINARY_LT,  CT_BINARY_GE,  CT_BINARY_GT};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        CT_FRAME {
            for (int di = 0; di < 3; di++) {
                double lo = dts[di] == CT_DTYPE_U8 ? 0 : -1e4, hi = dts[di] == CT_DTYPE_U8 ? 256 : 1e4;
                ct_tensor *a = make(dts[di], pairs[p].na, pairs[p].a, (int)p % 4, lo, hi);
                ct_tensor *b = make(dts[di], pairs[p].nb, pairs[p].b, (int)(p + 1) % 4, lo, hi);
                for (int k = 0; k < 10; k++) check_binary(ops[k], a, b, 0.0);
            }
            ct_tensor *a = make(CT_DTYPE_BOOL, pairs[p].na, pairs[p].a, 0, 0, 2);
            ct_tensor *b = make(CT_DTYPE_BOOL, pairs[p].nb, pairs[p].b, 2, 0, 2);
            for (int k = 3; k < 10; k++) check_binary(ops[k], a, b, 0.0);
        }
    }
    CT_FRAME { /* the fast kernels wrap too */
        ct_tensor *i = from_f64(CT_DTYPE_I64, CT_SHAPE(1), (double[]){9223372036854775807.0});
        ct_tensor *r = ct_kernel_binary_scalar(CT_BINARY_ADD, i, 1);
        cr_assert_eq(((int64_t *)ct_tensor_data(r))[0], INT64_MIN);
        ct_tensor *u = from_f64(CT_DTYPE_U8, CT_SHAPE(1), (double[]){3});
        cr_assert_eq(get1(ct_kernel_unary(CT_UNARY_NEG, u), 0), 253);
    }
}

Test(elementwise, binary_scalar_and_reversed)
{
    ct_set_seed(3);
    const ct_dtype dts[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_I32};
    const double ss[4] = {0.1, -3, 2, 7};
    for (int di = 0; di < 4; di++) {
        CT_FRAME {
            ct_dtype dt = dts[di];
            ct_tensor *a = make(dt, CT_SHAPE(33, 65), di % 3, 0.5, 40);
            for (int op = 0; op < CT_BINARY_OP_COUNT; op++) {
                if (dt == CT_DTYPE_I32 && (op == CT_BINARY_DIV || op == CT_BINARY_POW)) continue;
                for (int k = 0; k < 4; k++) {
                    if (dt == CT_DTYPE_I32 && ss[k] != floor(ss[k])) continue;
                    for (int rev = 0; rev < 2; rev++) {
                        ct_tensor *f = rev ? ct_kernel_rbinary_scalar(op, ss[k], a) : ct_kernel_binary_scalar(op, a, ss[k]);
                        cr_assert_not_null(f, "%s", ct_last_error());
                        ct_tensor *r = ct_tensor_empty(f->dtype, f->ndim, f->shape);
                        cti_cpu_binary_scalar_ref(op, r, a, ss[k], rev);
                        double tol = ct_binary_op_is_comparison(op) || dt == CT_DTYPE_I32 ? 0 : tol_for(dt);
                        double e = rel_err_nan(f, r);
                        cr_assert(e <= tol, "%s %s s=%g rev=%d: %g", ct_binary_op_name(op), ct_dtype_name(dt), ss[k], rev, e);
                    }
                }
            }
        }
    }
    CT_FRAME { /* 1 - x and 1 / x by hand */
        ct_tensor *x = from_f64(CT_DTYPE_F32, CT_SHAPE(3), (double[]){0.25, 2, -4});
        ct_tensor *a = ct_kernel_rbinary_scalar(CT_BINARY_SUB, 1, x), *b = ct_kernel_rbinary_scalar(CT_BINARY_DIV, 1, x);
        cr_assert(get1(a, 0) == 0.75 && get1(a, 1) == -1 && get1(a, 2) == 5);
        cr_assert(get1(b, 0) == 4 && get1(b, 1) == 0.5 && get1(b, 2) == -0.25);
        /* the scalar is not rounded to bf16: 1 + 2^-8 would round (tie, to even) to 1 and give
         * 258 * 1 = 258; in f32 it is kept and 258 * 1.00390625 = 259.0078 rounds to 260 */
        ct_tensor *h = from_f64(CT_DTYPE_BF16, CT_SHAPE(1), (double[]){258});
        cr_assert_eq(get1(ct_kernel_binary_scalar(CT_BINARY_MUL, h, 1.0 + 1.0 / 256), 0), 260);
    }
}

Test(elementwise, out_in_place_strided_and_overlapping)
{
    ct_set_seed(4);
    CT_FRAME {
        ct_tensor *a = make(CT_DTYPE_F32, CT_SHAPE(64, 300), 0, -2, 2);
        ct_tensor *b = make(CT_DTYPE_F32, CT_SHAPE(300), 0, 0.5, 2);
        ct_tensor *want = ct_kernel_binary(CT_BINARY_DIV, a, b);
        ct_tensor *a2 = ct_tensor_clone(a);
        cr_assert_eq(ct_kernel_binary_out(CT_BINARY_DIV, a2, a2, b), CT_OK, "%s", ct_last_error());
        cr_assert_eq(rel_err_nan(a2, want), 0.0, "in place out == a");
        ct_tensor *c = ct_tensor_clone(a);
        ct_tensor *bb = ct_tensor_expand(b, CT_SHAPE(64, 300));
        ct_tensor *want2 = ct_kernel_binary(CT_BINARY_SUB, a, c);
        cr_assert_eq(ct_kernel_binary_out(CT_BINARY_SUB, c, a, c), CT_OK, "in place out == b");
        cr_assert_eq(rel_err_nan(c, want2), 0.0);
        /* out == a == b */
        ct_tensor *d = ct_tensor_clone(a), *want3 = ct_kernel_binary(CT_BINARY_MUL, a, a);
        cr_assert_eq(ct_kernel_binary_out(CT_BINARY_MUL, d, d, d), CT_OK);
        cr_assert_eq(rel_err_nan(d, want3), 0.0);
        /* a transposed destination */
        ct_tensor *t = ct_tensor_transpose(ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(300, 64)), 0, 1);
        cr_assert_eq(ct_kernel_binary_out(CT_BINARY_DIV, t, a, bb), CT_OK);
        cr_assert_eq(rel_err_nan(t, want), 0.0);
        /* partial overlap: out is a shifted by one element; must read a before writing */
        ct_tensor *buf = make(CT_DTYPE_F32, CT_SHAPE(1001), 0, -2, 2);
        ct_tensor *src = ct_tensor_narrow(buf, 0, 0, 1000), *dst = ct_tensor_narrow(buf, 0, 1, 1000);
        ct_tensor *want4 = ct_kernel_unary(CT_UNARY_EXP, src);
        cr_assert_eq(ct_kernel_unary_out(CT_UNARY_EXP, dst, src), CT_OK, "%s", ct_last_error());
        cr_assert_eq(rel_err_nan(dst, want4), 0.0, "overlapping out goes through a temporary");
        ct_tensor *buf2 = make(CT_DTYPE_F32, CT_SHAPE(1001), 0, -2, 2);
        ct_tensor *s2 = ct_tensor_narrow(buf2, 0, 1, 1000), *d2 = ct_tensor_narrow(buf2, 0, 0, 1000);
        ct_tensor *want5 = ct_kernel_binary(CT_BINARY_ADD, s2, s2);
        cr_assert_eq(ct_kernel_binary_out(CT_BINARY_ADD, d2, s2, s2), CT_OK);
        cr_assert_eq(rel_err_nan(d2, want5), 0.0);
        /* unary in place, bf16, strided */
        ct_tensor *h = make(CT_DTYPE_BF16, CT_SHAPE(40, 30), 1, -3, 3);
        ct_tensor *wh = ct_kernel_unary(CT_UNARY_GELU_TANH, h);
        cr_assert_eq(ct_kernel_unary_out(CT_UNARY_GELU_TANH, h, h), CT_OK);
        cr_assert_eq(rel_err_nan(h, wh), 0.0);
    }
}

/* Inputs inside each op's domain. */
static void unary_domain(ct_unary_op op, double *lo, double *hi)
{
    *lo = -6, *hi = 6;
    if (op == CT_UNARY_LOG || op == CT_UNARY_SQRT || op == CT_UNARY_RSQRT) *lo = 0.01, *hi = 50;
}

Test(elementwise, unary_float_layouts)
{
    ct_set_seed(5);
    const ct_dtype dts[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};
    const int64_t shapes[5][3] = {{1, 1, 1}, {3, 17, 5}, {2, 127, 9}, {4, 1, 33}, {2, 64, 513}};
    for (int di = 0; di < 4; di++) {
        for (int s = 0; s < 5; s++) {
            CT_FRAME {
                for (int op = 0; op < CT_UNARY_OP_COUNT; op++) {
                    double lo, hi;
                    unary_domain(op, &lo, &hi);
                    ct_tensor *x = make(dts[di], 3, shapes[s], (s + op) % 4, lo, hi);
                    ct_tensor *f = ct_kernel_unary(op, x);
                    cr_assert_not_null(f, "%s", ct_last_error());
                    ct_tensor *r = ct_tensor_empty(f->dtype, f->ndim, f->shape);
                    cti_cpu_unary_ref(op, r, x);
                    double e = rel_err_nan(f, r);
                    cr_assert(e <= tol_for(dts[di]), "%s %s: %g", ct_unary_op_name(op), ct_dtype_name(dts[di]), e);
                }
                ct_tensor *z = ct_tensor_empty(dts[di], CT_SHAPE(0, 4)); /* empty */
                cr_assert_eq(ct_tensor_numel(ct_kernel_unary(CT_UNARY_EXP, z)), 0);
                ct_tensor *sc = ct_tensor_scalar(dts[di], -0.5); /* 0-d */
                ct_tensor *sr = ct_kernel_unary(CT_UNARY_SILU, sc);
                cr_assert_eq(sr->ndim, 0);
                cr_assert(fabs(ct_tensor_item(sr) - -0.5 / (1 + exp(0.5))) < tol_for(dts[di]));
            }
        }
    }
    CT_FRAME { /* integers */
        for (int op = 0; op < 3; op++) {
            const ct_unary_op uop = op == 0 ? CT_UNARY_NEG : op == 1 ? CT_UNARY_ABS : CT_UNARY_RELU;
            ct_tensor *x = make(CT_DTYPE_I64, CT_SHAPE(13, 7), op, -1000, 1000);
            ct_tensor *f = ct_kernel_unary(uop, x), *r = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(13, 7));
            cti_cpu_unary_ref(uop, r, x);
            cr_assert_eq(rel_err_nan(f, r), 0.0);
        }
    }
}

/* f32 exp, tanh, sigmoid are our own polynomials: check them against libm in
 * double across the whole range, and the stable forms at the extremes. */
Test(elementwise, unary_f32_accuracy_and_extremes)
{
    CT_FRAME {
        const int64_t n = 200001;
        ct_tensor *x = ct_tensor_cast(ct_tensor_arange(CT_DTYPE_F64, -103.0, 88.7, 191.7 / (double)(n - 1)), CT_DTYPE_F32);
        ct_tensor *e = ct_kernel_unary(CT_UNARY_EXP, x);
        ct_tensor *t = ct_kernel_unary(CT_UNARY_TANH, x);
        ct_tensor *s = ct_kernel_unary(CT_UNARY_SIGMOID, x);
        const float *px = ct_tensor_data(x), *pe = ct_tensor_data(e), *pt = ct_tensor_data(t), *ps = ct_tensor_data(s);
        double worst_e = 0, worst_t = 0, worst_s = 0;
        for (int64_t i = 0; i < ct_tensor_numel(x); i++) {
            double v = px[i], te = exp(v), tt = tanh(v), ts = 1 / (1 + exp(-v));
            if (te > 1.2e-38) worst_e = fmax(worst_e, fabs(pe[i] - te) / te);
            if (tt != 0) worst_t = fmax(worst_t, fabs(pt[i] - tt) / fabs(tt));
            if (ts > 1.2e-38) worst_s = fmax(worst_s, fabs(ps[i] - ts) / ts);
        }
        cr_assert(worst_e < 3.6e-7, "exp max rel err %g (3 ulp)", worst_e);
        cr_assert(worst_t < 3.6e-7, "tanh max rel err %g", worst_t);
        cr_assert(worst_s < 3.6e-7, "sigmoid max rel err %g", worst_s);

        const double ext[12] = {-1e4, -1e3, -104, -88.8, -20, -1e-30, 0, 1e-30, 20, 88.8, 1e3, 1e4};
        ct_tensor *xe = from_f64(CT_DTYPE_F32, CT_SHAPE(12), ext);
        for (int op = CT_UNARY_EXP; op < CT_UNARY_OP_COUNT; op++) {
            if (op == CT_UNARY_LOG || op == CT_UNARY_SQRT || op == CT_UNARY_RSQRT) continue;
            ct_tensor *f = ct_kernel_unary(op, xe), *r = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(12));
            cti_cpu_unary_ref(op, r, xe);
            for (int i = 0; i < 12; i++) {
                double fv = get1(f, i), rv = get1(r, i);
                /* below FLT_MIN (silu(-104) = -7e-44) only absolute accuracy is asked for */
                cr_assert(fv == rv || fabs(fv - rv) <= 1e-6 * fabs(rv) + 1.2e-38, "%s(%g): %.9g vs ref %.9g",
                          ct_unary_op_name(op), ext[i], fv, rv);
            }
        }
        /* NaN in, NaN out; exp of +-inf */
        ct_tensor *sp = from_f64(CT_DTYPE_F32, CT_SHAPE(3), (double[]){NAN, INFINITY, -INFINITY});
        for (int op = 0; op < CT_UNARY_OP_COUNT; op++) cr_assert(isnan(get1(ct_kernel_unary(op, sp), 0)), "%s(NaN)", ct_unary_op_name(op));
        ct_tensor *ei = ct_kernel_unary(CT_UNARY_EXP, sp);
        cr_assert(get1(ei, 1) == INFINITY && get1(ei, 2) == 0);
        ct_tensor *ti = ct_kernel_unary(CT_UNARY_TANH, sp);
        cr_assert(get1(ti, 1) == 1 && get1(ti, 2) == -1);
        ct_tensor *si = ct_kernel_unary(CT_UNARY_SIGMOID, sp);
        cr_assert(get1(si, 1) == 1 && get1(si, 2) == 0);
        /* maximum/minimum propagate NaN from either side, in the vector loops too */
        ct_tensor *a = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(37)), *b = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(37));
        ct_tensor_set(a, (int64_t[]){20}, NAN);
        ct_tensor_set(b, (int64_t[]){3}, NAN);
        ct_tensor *mx = ct_kernel_binary(CT_BINARY_MAX, a, b), *mn = ct_kernel_binary(CT_BINARY_MIN, b, a);
        for (int i = 0; i < 37; i++) {
            bool nan = i == 3 || i == 20;
            cr_assert(nan ? isnan(get1(mx, i)) && isnan(get1(mn, i)) : get1(mx, i) == 1 && get1(mn, i) == 0, "%d", i);
        }
    }
}

/* ---- backward ---------------------------------------------------------------------------- */

/* grad_in = g * f'(x) against g * (f(x + h) - f(x - h)) / 2h in f64. */
Test(elementwise, unary_backward_finite_differences)
{
    ct_set_seed(6);
    const double h = 1e-6;
    CT_FRAME {
        for (int op = 0; op < CT_UNARY_OP_COUNT; op++) {
            double lo, hi;
            unary_domain(op, &lo, &hi);
            if (lo > 0) lo = 0.2, hi = 5;
            ct_tensor *x = make(CT_DTYPE_F64, CT_SHAPE(7, 19), op % 3, lo, hi);
            ct_tensor *g = make(CT_DTYPE_F64, CT_SHAPE(7, 19), 0, -1, 1);
            ct_tensor *fp = ct_kernel_unary(op, ct_kernel_binary_scalar(CT_BINARY_ADD, x, h));
            ct_tensor *fm = ct_kernel_unary(op, ct_kernel_binary_scalar(CT_BINARY_SUB, x, h));
            ct_tensor *num = ct_kernel_binary(CT_BINARY_MUL, g,
                                              ct_kernel_binary_scalar(CT_BINARY_DIV, ct_kernel_binary(CT_BINARY_SUB, fp, fm), 2 * h));
            ct_tensor *fast = ct_kernel_unary_backward(op, g, x, NULL);
            ct_tensor *ref = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(7, 19));
            cti_cpu_unary_backward_ref(op, ref, g, x, NULL);
            double ef = rel_err_nan(fast, num), er = rel_err_nan(ref, num);
            cr_assert(ef < 1e-7 && er < 1e-7, "%s backward vs finite differences: fast %g ref %g", ct_unary_op_name(op), ef, er);
            if (op == CT_UNARY_EXP || op == CT_UNARY_TANH || op == CT_UNARY_SIGMOID) {
                ct_tensor *y = ct_kernel_unary(op, x);
                cr_assert(rel_err_nan(ct_kernel_unary_backward(op, g, NULL, y), num) < 1e-7, "%s from y",
                          ct_unary_op_name(op));
            }
        }
    }
}

Test(elementwise, unary_backward_fast_vs_ref)
{
    ct_set_seed(7);
    const ct_dtype dts[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};
    for (int di = 0; di < 4; di++) {
        CT_FRAME {
            for (int op = 0; op < CT_UNARY_OP_COUNT; op++) {
                double lo, hi;
                unary_domain(op, &lo, &hi);
                for (int lay = 0; lay < 3; lay++) {
                    ct_tensor *x = make(dts[di], CT_SHAPE(33, 130), lay, lo, hi);
                    ct_tensor *g = make(dts[di], CT_SHAPE(33, 130), 2 - lay, -1, 1);
                    ct_tensor *y = lay == 1 ? ct_kernel_unary(op, x) : NULL;
                    ct_tensor *f = ct_kernel_unary_backward(op, g, x, y);
                    cr_assert_not_null(f, "%s", ct_last_error());
                    ct_tensor *r = ct_tensor_empty(dts[di], CT_SHAPE(33, 130));
                    const bool uses_y = op == CT_UNARY_EXP || op == CT_UNARY_TANH || op == CT_UNARY_SIGMOID;
                    cti_cpu_unary_backward_ref(op, r, g, uses_y ? NULL : x, uses_y ? y : NULL);
                    if (uses_y && !y) cti_cpu_unary_backward_ref(op, r, g, x, NULL);
                    double e = rel_err_nan(f, r);
                    cr_assert(e <= tol_for(dts[di]) * (dts[di] == CT_DTYPE_F64 ? 1e2 : 1), "%s %s layout %d: %g",
                              ct_unary_op_name(op), ct_dtype_name(dts[di]), lay, e);
                }
            }
        }
    }
}

/* ---- where --------------------------------------------------------------------------------- */

Test(elementwise, where_fast_vs_ref)
{
    ct_set_seed(8);
    const ct_dtype dts[5] = {CT_DTYPE_F32, CT_DTYPE_I64, CT_DTYPE_BF16, CT_DTYPE_BOOL, CT_DTYPE_F64};
    const int64_t cs[3] = {3, 1, 5}, as[2] = {4, 1}, bs[1] = {5};
    for (int di = 0; di < 5; di++) {
        CT_FRAME {
            for (int lay = 0; lay < 4; lay++) {
                ct_tensor *c = make(CT_DTYPE_BOOL, 3, cs, lay, 0, 2);
                ct_tensor *a = make(dts[di], 2, as, (lay + 1) % 4, -50, 50);
                ct_tensor *b = lay == 3 ? ct_tensor_scalar(dts[di], 1) : make(dts[di], 1, bs, lay % 3, -50, 50);
                ct_tensor *f = ct_kernel_where(c, a, b);
                cr_assert_not_null(f, "%s", ct_last_error());
                cr_assert(f->ndim == 3 && f->shape[0] == 3 && f->shape[1] == 4 && f->shape[2] == 5);
                ct_tensor *r = ct_tensor_empty(dts[di], 3, f->shape);
                cti_cpu_where_ref(r, c, a, b);
                cr_assert_eq(rel_err_nan(f, r), 0.0, "where %s layout %d", ct_dtype_name(dts[di]), lay);
            }
            ct_tensor *same_c = make(CT_DTYPE_BOOL, CT_SHAPE(17, 33), 0, 0, 2); /* all contiguous */
            ct_tensor *same_a = make(dts[di], CT_SHAPE(17, 33), 0, -5, 5), *same_b = make(dts[di], CT_SHAPE(17, 33), 0, -5, 5);
            ct_tensor *sf = ct_kernel_where(same_c, same_a, same_b), *sr = ct_tensor_empty(dts[di], CT_SHAPE(17, 33));
            cti_cpu_where_ref(sr, same_c, same_a, same_b);
            cr_assert_eq(rel_err_nan(sf, sr), 0.0);
            ct_tensor *big_c = make(CT_DTYPE_BOOL, CT_SHAPE(300, 200), 0, 0, 2);
            ct_tensor *big_a = make(dts[di], CT_SHAPE(300, 200), 0, -5, 5), *big_b = make(dts[di], CT_SHAPE(200), 0, -5, 5);
            ct_tensor *f = ct_kernel_where(big_c, big_a, big_b), *r = ct_tensor_empty(dts[di], CT_SHAPE(300, 200));
            cti_cpu_where_ref(r, big_c, big_a, big_b);
            cr_assert_eq(rel_err_nan(f, r), 0.0);
        }
    }
}

/* ---- errors --------------------------------------------------------------------------------- */

Test(elementwise, errors_name_op_and_operands)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3)), *b = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4));
        EXPECT_ERROR(!ct_kernel_binary(CT_BINARY_ADD, a, b), "add", "f32[2, 3]", "f32[4]", "broadcast");
        ct_tensor *d = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(3));
        EXPECT_ERROR(!ct_kernel_binary(CT_BINARY_MUL, a, d), "mul", "f32[2, 3]", "f64[3]");
        ct_tensor *i = ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(5));
        EXPECT_ERROR(!ct_kernel_binary(CT_BINARY_DIV, i, i), "div", "i32[5]", "ct_tensor_cast");
        EXPECT_ERROR(!ct_kernel_binary_scalar(CT_BINARY_POW, i, 2), "pow", "i32[5]", "ct_tensor_cast");
        EXPECT_ERROR(!ct_kernel_binary_scalar(CT_BINARY_ADD, i, 0.5), "add", "0.5", "i32[5]");
        EXPECT_ERROR(!ct_kernel_unary(CT_UNARY_EXP, i), "exp", "i32[5]", "ct_tensor_cast");
        ct_tensor *q = ct_tensor_zeros(CT_DTYPE_F8_E4M3, CT_SHAPE(2));
        EXPECT_ERROR(!ct_kernel_unary(CT_UNARY_RELU, q), "relu", "f8_e4m3[2]", "cast");
        EXPECT_ERROR(!ct_kernel_binary(CT_BINARY_ADD, q, q), "add", "f8_e4m3[2]", "cast");
        ct_tensor *bl = ct_tensor_zeros(CT_DTYPE_BOOL, CT_SHAPE(2));
        EXPECT_ERROR(!ct_kernel_binary(CT_BINARY_ADD, bl, bl), "add", "bool[2]");
        /* _out: wrong shape, wrong dtype, expanded destination */
        ct_tensor *o = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3, 2));
        EXPECT_ERROR(ct_kernel_binary_out(CT_BINARY_ADD, o, a, a) != CT_OK, "add", "f32[3, 2]", "[2, 3]");
        EXPECT_ERROR(ct_kernel_binary_out(CT_BINARY_LT, a, a, a) != CT_OK, "lt", "bool[2, 3]");
        ct_tensor *e = ct_tensor_expand(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 3)), CT_SHAPE(2, 3));
        EXPECT_ERROR(ct_kernel_binary_out(CT_BINARY_ADD, e, a, a) != CT_OK, "add", "expanded");
        EXPECT_ERROR(ct_kernel_unary_out(CT_UNARY_EXP, o, a) != CT_OK, "exp", "f32[3, 2]");
        /* backward and where */
        EXPECT_ERROR(!ct_kernel_unary_backward(CT_UNARY_TANH, a, o, NULL), "tanh backward", "f32[2, 3]", "f32[3, 2]");
        EXPECT_ERROR(!ct_kernel_unary_backward(CT_UNARY_RELU, i, i, NULL), "relu backward", "i32[5]");
        EXPECT_ERROR(!ct_kernel_where(a, a, a), "where", "cond f32[2, 3]");
        ct_tensor *c = ct_tensor_zeros(CT_DTYPE_BOOL, CT_SHAPE(4));
        EXPECT_ERROR(!ct_kernel_where(c, a, a), "where", "bool[4]", "f32[2, 3]");
        EXPECT_ERROR(!ct_kernel_where(ct_tensor_zeros(CT_DTYPE_BOOL, CT_SHAPE(3)), a, d), "where", "f64[3]");
        EXPECT_ERROR(!ct_kernel_binary((ct_binary_op)99, a, a), "invalid op");
        /* dispatch: mixed devices; no CUDA kernels in a build without CUDA. A header
         * copy relabelled as cuda:0 stands in for a device tensor (never
         * dereferenced: with CUDA built, a kernel would run on it, so only the
         * mixed-device checks, which fail before any kernel, run there). */
        ct_tensor fake = *a;
        fake.device = CT_CUDA(0);
        if (!ct_cuda_built()) {
            EXPECT_ERROR(!ct_kernel_binary(CT_BINARY_ADD, &fake, &fake), "add", "cuda:0");
            EXPECT_ERROR(!ct_kernel_unary(CT_UNARY_TANH, &fake), "tanh", "cuda:0");
        }
        EXPECT_ERROR(!ct_kernel_binary(CT_BINARY_ADD, a, &fake), "add", "cpu", "cuda:0");
        EXPECT_ERROR(!ct_kernel_where(ct_tensor_zeros(CT_DTYPE_BOOL, CT_SHAPE(2, 3)), a, &fake), "where", "cuda:0");
        /* NULL input: NULL out, earlier message kept */
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_kernel_binary(CT_BINARY_ADD, NULL, a));
        cr_assert_null(ct_kernel_unary(CT_UNARY_EXP, NULL));
        cr_assert_null(ct_kernel_where(c, NULL, a));
        cr_assert_null(ct_kernel_unary_backward(CT_UNARY_LOG, a, NULL, NULL));
        cr_assert_eq(ct_kernel_binary_out(CT_BINARY_ADD, a, NULL, a), CT_ERR_INVALID);
        cr_assert_eq(ct_kernel_unary_out(CT_UNARY_EXP, a, NULL), CT_ERR_INVALID);
        cr_assert_str_eq(ct_last_error(), "earlier failure");
        ct_error_clear();
        cr_assert_neq(ct_kernel_unary_out(CT_UNARY_EXP, a, NULL), CT_OK, "a NULL input never reads as success");
        EXPECT_ERROR(ct_kernel_binary_out(CT_BINARY_ADD, NULL, a, a) != CT_OK, "out is NULL");
        cr_assert_str_eq(ct_binary_op_name(CT_BINARY_GE), "ge");
        cr_assert_str_eq(ct_unary_op_name(CT_UNARY_GELU_TANH), "gelu_tanh");
        cr_assert_str_eq(ct_unary_op_name((ct_unary_op)-1), "invalid");
    }
}
