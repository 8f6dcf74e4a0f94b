/* autograd/ops_math.h: every op against central finite differences in f64
 * (ct_gradcheck), forward values against the kernels or hand values, and
 * misuse. Shapes stay tiny: gradcheck runs two forward passes per element. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/ops_math.h"
#include "autograd/ops_shape.h"
#include "core/frame.h"
#include "core/philox.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"

#include "tests/autograd/util.h"

/* values in [lo, hi) */
static ct_tensor *uniform(int ndim, const int64_t *shape, double lo, double hi)
{
    return leaf(ct_tensor_rand(F64, ndim, shape, lo, hi));
}

/* |x| in [0.5, 2) with random sign: away from the poles of 1/x */
static ct_tensor *away_from_zero(int ndim, const int64_t *shape)
{
    ct_tensor *t = ct_tensor_rand(F64, ndim, shape, 0.5, 2.0);
    ct_tensor *s = ct_tensor_randn(F64, ndim, shape, 0, 1);
    double *p = ct_tensor_data(t), *q = ct_tensor_data(s);
    for (int64_t i = 0; i < ct_tensor_numel(t); i++)
        if (q[i] < 0) p[i] = -p[i];
    return leaf(t);
}

/* A non-contiguous leaf of the given 2-D+ shape: the transpose of a random
 * tensor with the last two dims swapped. */
static ct_tensor *transposed(int ndim, const int64_t *shape, double lo, double hi)
{
    int64_t s[CT_MAX_DIMS];
    memcpy(s, shape, (size_t)ndim * sizeof *s);
    s[ndim - 1] = shape[ndim - 2], s[ndim - 2] = shape[ndim - 1];
    ct_tensor *t = ct_tensor_transpose(ct_tensor_rand(F64, ndim, s, lo, hi), -1, -2);
    cr_assert(!ct_tensor_is_contiguous(t));
    return leaf(t);
}

/* A non-contiguous leaf: every other element of the last dim of a bigger tensor. */
static ct_tensor *strided(int ndim, const int64_t *shape, double lo, double hi)
{
    int64_t s[CT_MAX_DIMS];
    memcpy(s, shape, (size_t)ndim * sizeof *s);
    s[ndim - 1] = 2 * shape[ndim - 1];
    ct_tensor *t = ct_tensor_slice(ct_tensor_rand(F64, ndim, s, lo, hi), -1, 0, s[ndim - 1], 2);
    cr_assert(!ct_tensor_is_contiguous(t) || shape[ndim - 1] <= 1);
    return leaf(t);
}

#define GRADCHECK(fn, ctx, ...)                                                                              \
    do {                                                                                                     \
        ct_tensor *in_[] = {__VA_ARGS__};                                                                    \
        cr_assert_eq(ct_gradcheck(fn, (int)(sizeof in_ / sizeof in_[0]), in_, ctx, NULL), CT_OK, "%s:%d: %s", \
                     __FILE__, __LINE__, ct_last_error());                                                   \
    } while (0)

static double max_abs_diff(const ct_tensor *a, const ct_tensor *b)
{
    cr_assert(ct_tensor_same_shape(a, b));
    ct_tensor *d = ct_kernel_max(ct_kernel_unary(CT_UNARY_ABS, ct_kernel_binary(CT_BINARY_SUB, a, b)), NULL, 0, false);
    return ct_tensor_item(d);
}

static void expect_values(const ct_tensor *t, const double *want, int n)
{
    cr_assert_eq(ct_tensor_numel(t), n);
    ct_tensor *c = ct_tensor_contiguous(ct_tensor_cast(t, F64));
    const double *p = ct_tensor_data(c);
    for (int i = 0; i < n; i++) cr_assert(fabs(p[i] - want[i]) < 1e-12, "element %d: %g, want %g", i, p[i], want[i]);
}

/* ---- binary ------------------------------------------------------------------------ */

typedef ct_tensor *(*bin_fn)(ct_tensor *, ct_tensor *);

static ct_tensor *gc_binary(ct_tensor *const *in, void *ctx) { return (*(bin_fn *)ctx)(in[0], in[1]); }

static const struct {
    const char *name;
    bin_fn fn;
    ct_binary_op kop;
} binaries[] = {
    {"add", ct_add, CT_BINARY_ADD},         {"sub", ct_sub, CT_BINARY_SUB},
    {"mul", ct_mul, CT_BINARY_MUL},         {"div", ct_div, CT_BINARY_DIV},
    {"pow", ct_pow, CT_BINARY_POW},         {"maximum", ct_maximum, CT_BINARY_MAX},
    {"minimum", ct_minimum, CT_BINARY_MIN},
};

/* a positive for pow; b away from zero for div */
static ct_tensor *operand(int which, ct_binary_op op, int ndim, const int64_t *shape)
{
    if (op == CT_BINARY_POW) return which == 0 ? uniform(ndim, shape, 0.5, 2.0) : uniform(ndim, shape, -2, 2);
    if (op == CT_BINARY_DIV && which == 1) return away_from_zero(ndim, shape);
    return randn(ndim, shape);
}

Test(ops_math, binary_gradcheck_with_broadcasting)
{
    ct_set_seed(11);
    static const struct {
        int na, nb;
        int64_t sa[3], sb[3];
    } cases[] = {
        {2, 2, {2, 3}, {2, 3}},    /* same shape */
        {3, 2, {3, 1, 4}, {2, 4}}, /* both broadcast */
        {2, 3, {2, 4}, {3, 1, 4}}, /* the other way round */
        {0, 2, {0}, {2, 3}},       /* 0-d with 2-D */
        {2, 0, {2, 3}, {0}},
        {0, 0, {0}, {0}},          /* 0-d with 0-d */
        {1, 2, {1}, {3, 1}},       /* (1) with (3,1) -> (3,1) */
    };
    for (size_t k = 0; k < sizeof binaries / sizeof binaries[0]; k++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            CT_FRAME {
                ct_tensor *a = operand(0, binaries[k].kop, cases[c].na, cases[c].sa);
                ct_tensor *b = operand(1, binaries[k].kop, cases[c].nb, cases[c].sb);
                cr_assert_eq(ct_gradcheck(gc_binary, 2, (ct_tensor *[]){a, b}, (void *)&binaries[k].fn, NULL), CT_OK,
                             "%s case %zu: %s", binaries[k].name, c, ct_last_error());
                /* forward equals the kernel's */
                ct_tensor *y = binaries[k].fn(a, b);
                cr_assert_eq(max_abs_diff(y, ct_kernel_binary(binaries[k].kop, a, b)), 0.0);
                cr_assert(y->requires_grad && y->grad_fn);
            }
        }
    }
}

Test(ops_math, binary_gradcheck_non_contiguous)
{
    ct_set_seed(12);
    for (size_t k = 0; k < sizeof binaries / sizeof binaries[0]; k++) {
        CT_FRAME {
            bool pow = binaries[k].kop == CT_BINARY_POW, div = binaries[k].kop == CT_BINARY_DIV;
            ct_tensor *a = transposed(CT_SHAPE(3, 4), pow ? 0.5 : -2, 2);
            ct_tensor *b = strided(CT_SHAPE(3, 4), div ? 0.5 : -2, 2);
            cr_assert_eq(ct_gradcheck(gc_binary, 2, (ct_tensor *[]){a, b}, (void *)&binaries[k].fn, NULL), CT_OK,
                         "%s: %s", binaries[k].name, ct_last_error());
            /* broadcast and strided at once: (4) row against a transposed (3, 4) */
            ct_tensor *r = strided(CT_SHAPE(4), div ? 0.5 : -2, 2);
            cr_assert_eq(ct_gradcheck(gc_binary, 2, (ct_tensor *[]){a, r}, (void *)&binaries[k].fn, NULL), CT_OK,
                         "%s: %s", binaries[k].name, ct_last_error());
        }
    }
}

Test(ops_math, only_inputs_that_require_grad_get_one)
{
    CT_FRAME {
        ct_tensor *a = randn(CT_SHAPE(2, 3));
        ct_tensor *b = ct_tensor_randn(F64, CT_SHAPE(2, 3), 0, 1); /* a constant */
        for (size_t k = 0; k < sizeof binaries / sizeof binaries[0]; k++) {
            if (binaries[k].kop == CT_BINARY_POW) continue;
            cr_assert_eq(ct_gradcheck(gc_binary, 2, (ct_tensor *[]){a, b}, (void *)&binaries[k].fn, NULL), CT_OK,
                         "%s: %s", binaries[k].name, ct_last_error());
            cr_assert_eq(ct_gradcheck(gc_binary, 2, (ct_tensor *[]){b, a}, (void *)&binaries[k].fn, NULL), CT_OK,
                         "%s: %s", binaries[k].name, ct_last_error());
        }
        cr_assert_null(b->grad);
    }
}

Test(ops_math, maximum_minimum_ties_split_the_gradient)
{
    CT_FRAME {
        ct_tensor *a = leaf(ct_tensor_from_data(F64, CT_SHAPE(3), (double[]){1, 2, 3}));
        ct_tensor *b = leaf(ct_tensor_from_data(F64, CT_SHAPE(3), (double[]){1, 5, 0}));
        cr_assert_eq(ct_backward(ct_sum_all(ct_maximum(a, b))), CT_OK, "%s", ct_last_error());
        expect_values(a->grad, (double[]){0.5, 0, 1}, 3);
        expect_values(b->grad, (double[]){0.5, 1, 0}, 3);
        ct_tensor_zero_grad(a);
        ct_tensor_zero_grad(b);
        cr_assert_eq(ct_backward(ct_sum_all(ct_minimum(a, b))), CT_OK, "%s", ct_last_error());
        expect_values(a->grad, (double[]){0.5, 1, 0}, 3);
        expect_values(b->grad, (double[]){0.5, 0, 1}, 3);
    }
}

Test(ops_math, pow_edge_gradients)
{
    CT_FRAME {
        /* d/db of a^b at a = 0, b >= 0 is 0 (not NaN); d/da at b = 0 is 0 */
        ct_tensor *a = leaf(ct_tensor_from_data(F64, CT_SHAPE(3), (double[]){0, 0, 2}));
        ct_tensor *b = leaf(ct_tensor_from_data(F64, CT_SHAPE(3), (double[]){2, 0, 3}));
        ct_tensor *y = ct_pow(a, b);
        expect_values(y, (double[]){0, 1, 8}, 3);
        cr_assert_eq(ct_backward(ct_sum_all(y)), CT_OK, "%s", ct_last_error());
        expect_values(a->grad, (double[]){0, 0, 12}, 3);
        expect_values(b->grad, (double[]){0, 0, 8 * log(2.0)}, 3);
    }
}

/* ---- scalar forms ---------------------------------------------------------------------- */

typedef struct {
    int kind;
    double s;
} scalar_case;

static ct_tensor *gc_scalar(ct_tensor *const *in, void *ctx)
{
    const scalar_case *c = ctx;
    switch (c->kind) {
    case 0: return ct_add_scalar(in[0], c->s);
    case 1: return ct_mul_scalar(in[0], c->s);
    case 2: return ct_div_scalar(in[0], c->s);
    case 3: return ct_pow_scalar(in[0], c->s);
    case 4: return ct_rsub_scalar(c->s, in[0]);
    default: return ct_rdiv_scalar(c->s, in[0]);
    }
}

Test(ops_math, scalar_forms_gradcheck_and_values)
{
    ct_set_seed(13);
    static const scalar_case cases[] = {{0, 0.7}, {1, -1.3}, {2, 2.5}, {3, 3.0}, {3, 0.5},
                                        {3, -1.5}, {3, 0.0}, {3, 1.0}, {4, 2.0}, {5, 3.0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        CT_FRAME {
            bool positive = cases[k].kind == 3; /* non-integer powers need x > 0 */
            ct_tensor *x = positive ? uniform(CT_SHAPE(3, 4), 0.5, 2) : away_from_zero(CT_SHAPE(3, 4));
            cr_assert_eq(ct_gradcheck(gc_scalar, 1, &x, (void *)&cases[k], NULL), CT_OK, "case %zu: %s", k,
                         ct_last_error());
            ct_tensor *xt = positive ? transposed(CT_SHAPE(2, 3), 0.5, 2) : strided(CT_SHAPE(2, 3), 0.5, 2);
            cr_assert_eq(ct_gradcheck(gc_scalar, 1, &xt, (void *)&cases[k], NULL), CT_OK, "case %zu: %s", k,
                         ct_last_error());
        }
    }
    CT_FRAME {
        ct_tensor *x = leaf(ct_tensor_from_data(F64, CT_SHAPE(2), (double[]){2, 4}));
        expect_values(ct_add_scalar(x, 1), (double[]){3, 5}, 2);
        expect_values(ct_mul_scalar(x, 3), (double[]){6, 12}, 2);
        expect_values(ct_div_scalar(x, 2), (double[]){1, 2}, 2);
        expect_values(ct_pow_scalar(x, 2), (double[]){4, 16}, 2);
        expect_values(ct_rsub_scalar(1, x), (double[]){-1, -3}, 2);
        expect_values(ct_rdiv_scalar(8, x), (double[]){4, 2}, 2);
        /* 0-d */
        ct_tensor *s = leaf(ct_tensor_scalar(F64, 3));
        scalar_case c = {5, 2.0};
        cr_assert_eq(ct_gradcheck(gc_scalar, 1, &s, &c, NULL), CT_OK, "%s", ct_last_error());
    }
}

/* ---- unary ---------------------------------------------------------------------------- */

typedef ct_tensor *(*un_fn)(ct_tensor *);

static const struct {
    const char *name;
    un_fn fn;
    ct_unary_op kop;
    double lo, hi;
} unaries[] = {
    {"neg", ct_neg, CT_UNARY_NEG, -2, 2},           {"exp", ct_exp, CT_UNARY_EXP, -2, 2},
    {"log", ct_log, CT_UNARY_LOG, 0.5, 3},          {"sqrt", ct_sqrt, CT_UNARY_SQRT, 0.5, 3},
    {"rsqrt", ct_rsqrt, CT_UNARY_RSQRT, 0.5, 3},    {"tanh", ct_tanh, CT_UNARY_TANH, -2, 2},
    {"sigmoid", ct_sigmoid, CT_UNARY_SIGMOID, -4, 4}, {"relu", ct_relu, CT_UNARY_RELU, -2, 2},
    {"gelu", ct_gelu, CT_UNARY_GELU_TANH, -3, 3},   {"gelu_erf", ct_gelu_erf, CT_UNARY_GELU_ERF, -3, 3},
    {"silu", ct_silu, CT_UNARY_SILU, -3, 3},        {"abs", ct_abs, CT_UNARY_ABS, -2, 2},
};

static ct_tensor *gc_unary(ct_tensor *const *in, void *ctx) { return (*(un_fn *)ctx)(in[0]); }

Test(ops_math, unary_gradcheck_and_values)
{
    ct_set_seed(14);
    for (size_t k = 0; k < sizeof unaries / sizeof unaries[0]; k++) {
        CT_FRAME {
            double lo = unaries[k].lo, hi = unaries[k].hi;
            ct_tensor *ins[3] = {uniform(CT_SHAPE(3, 5), lo, hi), transposed(CT_SHAPE(2, 3, 2), lo, hi),
                                 leaf(ct_tensor_scalar(F64, 0.5 * (lo + hi) + 0.3))};
            for (int i = 0; i < 3; i++) {
                cr_assert_eq(ct_gradcheck(gc_unary, 1, &ins[i], (void *)&unaries[k].fn, NULL), CT_OK, "%s input %d: %s",
                             unaries[k].name, i, ct_last_error());
                ct_tensor *y = unaries[k].fn(ins[i]);
                cr_assert_eq(max_abs_diff(y, ct_kernel_unary(unaries[k].kop, ins[i])), 0.0, "%s", unaries[k].name);
            }
        }
    }
    CT_FRAME {
        ct_tensor *x = leaf(ct_tensor_from_data(F64, CT_SHAPE(3), (double[]){-1, 0, 4}));
        expect_values(ct_relu(x), (double[]){0, 0, 4}, 3);
        expect_values(ct_abs(x), (double[]){1, 0, 4}, 3);
        expect_values(ct_neg(x), (double[]){1, 0, -4}, 3);
        /* kinks: relu'(0) = abs'(0) = 0 */
        cr_assert_eq(ct_backward(ct_sum_all(ct_add(ct_relu(x), ct_abs(x)))), CT_OK, "%s", ct_last_error());
        expect_values(x->grad, (double[]){-1, 0, 2}, 3);
    }
}

/* ---- a parameter used twice ---------------------------------------------------------------- */

Test(ops_math, parameter_used_twice_gets_the_summed_gradient)
{
    CT_FRAME {
        ct_tensor *x = leaf(ct_tensor_from_data(F64, CT_SHAPE(3), (double[]){1, -2, 3}));
        /* L = sum(x * x + tanh(x) * x) -> dL/dx = 2x + tanh(x) + x (1 - tanh^2 x) */
        ct_tensor *L = ct_sum_all(ct_add(ct_mul(x, x), ct_mul(ct_tanh(x), x)));
        cr_assert_eq(ct_backward(L), CT_OK, "%s", ct_last_error());
        double want[3];
        const double v[3] = {1, -2, 3};
        for (int i = 0; i < 3; i++) want[i] = 2 * v[i] + tanh(v[i]) + v[i] * (1 - tanh(v[i]) * tanh(v[i]));
        for (int i = 0; i < 3; i++)
            cr_assert(fabs(ct_tensor_get(x->grad, (int64_t[]){i}) - want[i]) < 1e-12, "element %d", i);
    }
}

/* ---- matmul, linear ---------------------------------------------------------------------- */

typedef struct {
    bool ta, tb;
} trans_case;

static ct_tensor *gc_matmul(ct_tensor *const *in, void *ctx)
{
    const trans_case *c = ctx;
    return ct_matmul_t(in[0], in[1], c->ta, c->tb);
}

/* The shape of a (M, K) / b (K, N) operand with batch dims, transposed when asked. */
static void mat_shape(int nb, const int64_t *batch, int64_t r, int64_t c, bool t, int *nd, int64_t *out)
{
    for (int i = 0; i < nb; i++) out[i] = batch[i];
    out[nb] = t ? c : r;
    out[nb + 1] = t ? r : c;
    *nd = nb + 2;
}

Test(ops_math, matmul_every_transpose_and_batch_broadcast)
{
    ct_set_seed(15);
    const int64_t M = 2, K = 3, N = 2;
    static const struct {
        int na, nb;
        int64_t ba[2], bb[2];
    } batches[] = {
        {0, 0, {0}, {0}},       /* plain 2-D */
        {1, 1, {2}, {2}},       /* same batch */
        {2, 1, {2, 1}, {3}},    /* both broadcast: (2,1) x (3) -> (2,3) */
        {0, 2, {0}, {2, 2}},    /* 2-D a against a batched b */
        {2, 0, {2, 2}, {0}},    /* batched a against a 2-D b */
        {2, 2, {1, 2}, {1, 2}}, /* leading ones */
        {1, 2, {1}, {2, 2}},    /* a's batch of 1 broadcast */
    };
    for (int t = 0; t < 4; t++) {
        trans_case tc = {t & 1, (t >> 1) & 1};
        for (size_t k = 0; k < sizeof batches / sizeof batches[0]; k++) {
            CT_FRAME {
                int nda, ndb;
                int64_t sa[4], sb[4];
                mat_shape(batches[k].na, batches[k].ba, M, K, tc.ta, &nda, sa);
                mat_shape(batches[k].nb, batches[k].bb, K, N, tc.tb, &ndb, sb);
                ct_tensor *a = randn(nda, sa), *b = randn(ndb, sb);
                cr_assert_eq(ct_gradcheck(gc_matmul, 2, (ct_tensor *[]){a, b}, &tc, NULL), CT_OK,
                             "ta %d tb %d batch case %zu: %s", tc.ta, tc.tb, k, ct_last_error());
                ct_tensor *y = ct_matmul_t(a, b, tc.ta, tc.tb);
                cr_assert_eq(max_abs_diff(y, ct_kernel_matmul(a, b, tc.ta, tc.tb)), 0.0);
                /* only one side requiring grad */
                ct_tensor *bc = ct_tensor_randn(F64, ndb, sb, 0, 1);
                cr_assert_eq(ct_gradcheck(gc_matmul, 2, (ct_tensor *[]){a, bc}, &tc, NULL), CT_OK, "%s",
                             ct_last_error());
                cr_assert_eq(ct_gradcheck(gc_matmul, 2, (ct_tensor *[]){bc, a}, &(trans_case){tc.tb, tc.ta}, NULL),
                             CT_OK, "%s", ct_last_error());
            }
        }
    }
}

Test(ops_math, matmul_values_and_non_contiguous)
{
    ct_set_seed(16);
    CT_FRAME {
        ct_tensor *a = leaf(ct_tensor_from_data(F64, CT_SHAPE(2, 2), (double[]){1, 2, 3, 4}));
        ct_tensor *b = leaf(ct_tensor_from_data(F64, CT_SHAPE(2, 2), (double[]){5, 6, 7, 8}));
        expect_values(ct_matmul(a, b), (double[]){19, 22, 43, 50}, 4);
        expect_values(ct_matmul_t(a, b, true, false), (double[]){26, 30, 38, 44}, 4);
        /* d sum(a @ b) / da = rows of b summed: [[11, 15], [11, 15]]; / db = columns of a summed */
        cr_assert_eq(ct_backward(ct_sum_all(ct_matmul(a, b))), CT_OK, "%s", ct_last_error());
        expect_values(a->grad, (double[]){11, 15, 11, 15}, 4);
        expect_values(b->grad, (double[]){4, 4, 6, 6}, 4);
        /* strided operands: a transposed view and a column-strided view */
        trans_case tc = {false, false};
        ct_tensor *ta = transposed(CT_SHAPE(2, 3, 4), -1, 1);
        ct_tensor *sb = strided(CT_SHAPE(4, 3), -1, 1);
        cr_assert_eq(ct_gradcheck(gc_matmul, 2, (ct_tensor *[]){ta, sb}, &tc, NULL), CT_OK, "%s", ct_last_error());
        /* the same tensor on both sides: x @ x */
        ct_tensor *x = randn(CT_SHAPE(3, 3));
        cr_assert_eq(ct_gradcheck(gc_matmul, 2, (ct_tensor *[]){x, x}, &tc, NULL), CT_OK, "%s", ct_last_error());
    }
}

static ct_tensor *gc_linear(ct_tensor *const *in, void *ctx)
{
    return ct_linear(in[0], in[1], ctx ? in[2] : NULL);
}

Test(ops_math, linear_with_and_without_bias)
{
    ct_set_seed(17);
    CT_FRAME {
        ct_tensor *x = randn(CT_SHAPE(2, 3, 4)), *w = randn(CT_SHAPE(4, 5)), *b = randn(CT_SHAPE(5));
        GRADCHECK(gc_linear, (void *)1, x, w, b);
        GRADCHECK(gc_linear, NULL, x, w);
        ct_tensor *y = ct_linear(x, w, b);
        cr_assert_eq(y->ndim, 3);
        cr_assert_eq(y->shape[2], 5);
        ct_tensor *ref = ct_kernel_binary(CT_BINARY_ADD, ct_kernel_matmul(x, w, false, false), b);
        cr_assert(max_abs_diff(y, ref) < 1e-13);
        cr_assert(max_abs_diff(ct_linear(x, w, NULL), ct_kernel_matmul(x, w, false, false)) < 1e-13);
        /* 1-D x, a transposed x and a constant bias */
        ct_tensor *x1 = randn(CT_SHAPE(4));
        GRADCHECK(gc_linear, (void *)1, x1, w, b);
        ct_tensor *xt = transposed(CT_SHAPE(3, 4), -1, 1);
        ct_tensor *bc = ct_tensor_randn(F64, CT_SHAPE(5), 0, 1);
        GRADCHECK(gc_linear, (void *)1, xt, w, bc);
    }
}

/* ---- reductions ------------------------------------------------------------------------------ */

typedef struct {
    int which; /* 0 sum, 1 mean, 2 max, 3 min, 4 var (correction 1), 5 var (correction 0) */
    int dims[3];
    int ndims;
    bool keepdim;
} reduce_case;

static ct_tensor *gc_reduce(ct_tensor *const *in, void *ctx)
{
    const reduce_case *c = ctx;
    switch (c->which) {
    case 0: return ct_sum(in[0], c->dims, c->ndims, c->keepdim);
    case 1: return ct_mean(in[0], c->dims, c->ndims, c->keepdim);
    case 2: return ct_max(in[0], c->dims, c->ndims, c->keepdim);
    case 3: return ct_min(in[0], c->dims, c->ndims, c->keepdim);
    case 4: return ct_var(in[0], c->dims, c->ndims, 1, c->keepdim);
    default: return ct_var(in[0], c->dims, c->ndims, 0, c->keepdim);
    }
}

static ct_tensor *kernel_reduce(const reduce_case *c, const ct_tensor *x)
{
    switch (c->which) {
    case 0: return ct_kernel_sum(x, c->dims, c->ndims, c->keepdim);
    case 1: return ct_kernel_mean(x, c->dims, c->ndims, c->keepdim);
    case 2: return ct_kernel_max(x, c->dims, c->ndims, c->keepdim);
    case 3: return ct_kernel_min(x, c->dims, c->ndims, c->keepdim);
    case 4: return ct_kernel_var(x, c->dims, c->ndims, 1, c->keepdim);
    default: return ct_kernel_var(x, c->dims, c->ndims, 0, c->keepdim);
    }
}

Test(ops_math, reductions_over_dim_subsets)
{
    ct_set_seed(18);
    static const struct {
        int dims[3], ndims;
    } subsets[] = {{{0}, 0}, {{0}, 1}, {{1}, 1}, {{-1}, 1}, {{0, 2}, 2}, {{2, 1}, 2}, {{0, 1, 2}, 3}};
    for (int which = 0; which < 6; which++) {
        CT_FRAME {
            ct_tensor *x = randn(CT_SHAPE(2, 3, 4));
            ct_tensor *xs = transposed(CT_SHAPE(3, 2, 4), -1, 1);
            for (size_t s = 0; s < sizeof subsets / sizeof subsets[0]; s++) {
                for (int keep = 0; keep < 2; keep++) {
                    reduce_case c = {which, {0}, subsets[s].ndims, keep};
                    memcpy(c.dims, subsets[s].dims, sizeof c.dims);
                    cr_assert_eq(ct_gradcheck(gc_reduce, 1, &x, &c, NULL), CT_OK, "op %d subset %zu keep %d: %s",
                                 which, s, keep, ct_last_error());
                    cr_assert_eq(ct_gradcheck(gc_reduce, 1, &xs, &c, NULL), CT_OK, "strided op %d subset %zu: %s",
                                 which, s, ct_last_error());
                    ct_tensor *y = gc_reduce(&x, &c);
                    cr_assert_eq(max_abs_diff(y, kernel_reduce(&c, x)), 0.0);
                }
            }
            /* 0-d input */
            ct_tensor *z = leaf(ct_tensor_scalar(F64, 1.5));
            reduce_case c0 = {which == 4 ? 5 : which, {0}, 0, false};
            cr_assert_eq(ct_gradcheck(gc_reduce, 1, &z, &c0, NULL), CT_OK, "0-d op %d: %s", which, ct_last_error());
        }
    }
    CT_FRAME {
        ct_tensor *x = leaf(ct_tensor_from_data(F64, CT_SHAPE(2, 2), (double[]){1, 2, 3, 6}));
        expect_values(ct_sum_all(x), (double[]){12}, 1);
        expect_values(ct_mean_all(x), (double[]){3}, 1);
        expect_values(ct_var(x, (int[]){1}, 1, 1, false), (double[]){0.5, 4.5}, 2);
        cr_assert_eq(ct_sum_all(x)->ndim, 0);
        cr_assert_eq(ct_backward(ct_mean_all(x)), CT_OK);
        expect_values(x->grad, (double[]){0.25, 0.25, 0.25, 0.25}, 4);
    }
}

Test(ops_math, max_min_ties_send_the_gradient_to_the_first)
{
    CT_FRAME {
        ct_tensor *x = leaf(ct_tensor_from_data(F64, CT_SHAPE(2, 3), (double[]){1, 3, 3, 2, 2, 1}));
        ct_tensor *y = ct_max(x, (int[]){1}, 1, false);
        expect_values(y, (double[]){3, 2}, 2);
        cr_assert_eq(ct_backward(ct_sum_all(y)), CT_OK, "%s", ct_last_error());
        expect_values(x->grad, (double[]){0, 1, 0, 1, 0, 0}, 6);
        ct_tensor_zero_grad(x);
        /* over dim 0: column 1 ties (3 vs 2 no), column 0 (1 vs 2), ... */
        ct_tensor *x2 = leaf(ct_tensor_from_data(F64, CT_SHAPE(2, 3), (double[]){5, 1, 4, 5, 1, 7}));
        cr_assert_eq(ct_backward(ct_sum_all(ct_max(x2, (int[]){0}, 1, true))), CT_OK, "%s", ct_last_error());
        expect_values(x2->grad, (double[]){1, 1, 0, 0, 0, 1}, 6);
        /* over everything: the first of the two 3s in row-major order */
        cr_assert_eq(ct_backward(ct_max(x, NULL, 0, false)), CT_OK, "%s", ct_last_error());
        expect_values(x->grad, (double[]){0, 1, 0, 0, 0, 0}, 6);
        ct_tensor_zero_grad(x);
        /* over dims {0, 1} of a transposed view: order follows the view's indices */
        ct_tensor *xt = ct_transpose(x, 0, 1); /* (3, 2): [[1,2],[3,2],[3,1]] */
        cr_assert_eq(ct_backward(ct_max(xt, (int[]){0, 1}, 2, false)), CT_OK, "%s", ct_last_error());
        expect_values(x->grad, (double[]){0, 1, 0, 0, 0, 0}, 6);
        ct_tensor_zero_grad(x);
        /* min: the first 1 along each row */
        ct_tensor *x3 = leaf(ct_tensor_from_data(F64, CT_SHAPE(2, 3), (double[]){1, 0, 0, 2, 2, 2}));
        cr_assert_eq(ct_backward(ct_sum_all(ct_min(x3, (int[]){-1}, 1, false))), CT_OK, "%s", ct_last_error());
        expect_values(x3->grad, (double[]){0, 1, 0, 1, 0, 0}, 6);
    }
}

/* ---- f32: backward runs and gives finite values -------------------------------------------- */

static bool all_finite(const ct_tensor *t)
{
    ct_tensor *c = ct_tensor_cast(t, F64);
    const double *p = ct_tensor_data(c);
    for (int64_t i = 0; i < ct_tensor_numel(c); i++)
        if (!isfinite(p[i])) return false;
    return true;
}

Test(ops_math, f32_backward_is_finite)
{
    ct_set_seed(19);
    CT_FRAME {
        ct_tensor *x = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(4, 8), 0, 1));
        ct_tensor *w = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(8, 6), 0, 0.3));
        ct_tensor *b = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(6), 0, 1));
        ct_tensor *h = ct_gelu(ct_linear(x, w, b));
        h = ct_add(ct_mul(ct_sigmoid(h), ct_tanh(h)), ct_exp(ct_neg(ct_abs(h))));
        h = ct_div(ct_silu(h), ct_add_scalar(ct_pow_scalar(h, 2), 1));
        h = ct_matmul_t(h, ct_rsqrt(ct_add_scalar(ct_abs(w), 1)), false, true);
        ct_tensor *L = ct_add(ct_mean_all(ct_max(h, (int[]){1}, 1, false)), ct_var(h, NULL, 0, 1, false));
        L = ct_add(L, ct_sum_all(ct_log(ct_add_scalar(ct_relu(ct_maximum(h, ct_minimum(h, x))), 1))));
        cr_assert_eq(ct_backward(L), CT_OK, "%s", ct_last_error());
        ct_tensor *ps[3] = {x, w, b};
        for (int i = 0; i < 3; i++) {
            cr_assert_not_null(ps[i]->grad);
            cr_assert_eq(ps[i]->grad->dtype, CT_DTYPE_F32);
            cr_assert(ct_tensor_same_shape(ps[i]->grad, ps[i]));
            cr_assert(all_finite(ps[i]->grad), "parameter %d", i);
        }
    }
}

/* ---- misuse -------------------------------------------------------------------------------------- */

Test(ops_math, misuse_names_the_op_and_shapes)
{
    CT_FRAME {
        ct_tensor *a = randn(CT_SHAPE(3)), *b = randn(CT_SHAPE(4)), *m = randn(CT_SHAPE(2, 3));
        EXPECT_ERROR(ct_add(a, b), "add", "f64[3]", "f64[4]");
        EXPECT_ERROR(ct_maximum(m, b), "maximum", "f64[2, 3]", "f64[4]");
        EXPECT_ERROR(ct_mul(a, ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3))), "mul", "f64[3]", "f32[3]");
        EXPECT_ERROR(ct_matmul(m, m), "matmul", "f64[2, 3]");
        EXPECT_ERROR(ct_matmul(a, m), "matmul", "f64[3]", "f64[2, 3]");
        EXPECT_ERROR(ct_linear(randn(CT_SHAPE(2, 3, 4)), randn(CT_SHAPE(3, 5)), NULL), "linear", "f64[2, 3, 4]",
                     "f64[3, 5]");
        EXPECT_ERROR(ct_linear(randn(CT_SHAPE(2, 4)), randn(CT_SHAPE(4, 5)), b), "linear", "f64[4]", "f64[4, 5]");
        EXPECT_ERROR(ct_sum(m, (int[]){2}, 1, false), "sum", "f64[2, 3]");
        EXPECT_ERROR(ct_max(m, (int[]){0, -2}, 2, false), "max", "twice");
        EXPECT_ERROR(ct_var(m, (int[]){5}, 1, 1, false), "var", "f64[2, 3]");
        EXPECT_ERROR(ct_log(ct_tensor_ones(CT_DTYPE_I32, CT_SHAPE(2))), "log", "i32[2]");
        /* a NULL input keeps the earlier message */
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_exp(ct_add(NULL, a)));
        cr_assert_null(ct_matmul(NULL, m));
        cr_assert_null(ct_sum_all(NULL));
        cr_assert_null(ct_linear(NULL, m, NULL));
        cr_assert_str_eq(ct_last_error(), "earlier failure");
        /* under CT_NO_GRAD nothing is recorded */
        ct_tensor *y = NULL;
        CT_NO_GRAD { y = ct_mul(a, a); }
        cr_assert_null(y->grad_fn);
        cr_assert(!y->requires_grad);
    }
}
