/* autograd/ops_shape.h: gradcheck (f64, central differences) of every view,
 * reshape, concat and cast; forward results share storage where they should;
 * misuse names the op and the shapes. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/ops_math.h"
#include "autograd/ops_shape.h"
#include "core/frame.h"
#include "core/philox.h"

#include "tests/autograd/util.h"

/* A non-contiguous leaf: the (0, 2, 1) permutation of a random (a, c, b) tensor. */
static ct_tensor *permuted(int64_t a, int64_t b, int64_t c)
{
    ct_tensor *t = ct_tensor_permute(ct_tensor_randn(F64, CT_SHAPE(a, c, b), 0, 1), (int[]){0, 2, 1});
    cr_assert(!ct_tensor_is_contiguous(t) || b == 1 || c == 1);
    return leaf(t);
}

/* One shape op per case, selected by the case's kind, so every op goes through
 * ct_gradcheck with the same driver. */
typedef struct {
    int kind;
    int64_t a[4];
    int nd;
    int dims[4];
} shape_case;

enum {
    K_VIEW, K_RESHAPE, K_FLATTEN, K_TRANSPOSE, K_PERMUTE, K_SLICE, K_NARROW, K_SELECT, K_EXPAND, K_SQUEEZE,
    K_UNSQUEEZE, K_CONTIGUOUS, K_CLONE, K_CAST, K_CHAIN,
};

static ct_tensor *gc_shape(ct_tensor *const *in, void *ctx)
{
    const shape_case *c = ctx;
    ct_tensor *x = in[0], *y = NULL;
    switch (c->kind) {
    case K_VIEW: y = ct_view(x, c->nd, c->a); break;
    case K_RESHAPE: y = ct_reshape(x, c->nd, c->a); break;
    case K_FLATTEN: y = ct_flatten(x); break;
    case K_TRANSPOSE: y = ct_transpose(x, c->dims[0], c->dims[1]); break;
    case K_PERMUTE: y = ct_permute(x, c->dims); break;
    case K_SLICE: y = ct_slice(x, c->dims[0], c->a[0], c->a[1], c->a[2]); break;
    case K_NARROW: y = ct_narrow(x, c->dims[0], c->a[0], c->a[1]); break;
    case K_SELECT: y = ct_select(x, c->dims[0], c->a[0]); break;
    case K_EXPAND: y = ct_expand(x, c->nd, c->a); break;
    case K_SQUEEZE: y = ct_squeeze(x, c->dims[0]); break;
    case K_UNSQUEEZE: y = ct_unsqueeze(x, c->dims[0]); break;
    case K_CONTIGUOUS: y = ct_contiguous(x); break;
    case K_CLONE: y = ct_clone(x); break;
    case K_CAST: y = ct_cast(x, F64); break;
    case K_CHAIN: /* permute, then reshape (a copy for a permuted layout), then slice with a step */
        y = ct_slice(ct_reshape(ct_permute(x, (int[]){2, 0, 1}), CT_SHAPE(4, -1)), 1, 1, 6, 2);
        break;
    }
    /* multiply so that a view's gradient is not all-equal: catches misplaced entries */
    return y ? ct_mul(y, ct_add_scalar(ct_contiguous(y), 0.5)) : NULL;
}

Test(ops_shape, every_view_gradcheck_contiguous_and_strided)
{
    ct_set_seed(21);
    static const shape_case cases[] = {
        {K_VIEW, {6, 4}, 2, {0}},
        {K_VIEW, {-1}, 1, {0}},
        {K_RESHAPE, {3, 8}, 2, {0}},
        {K_RESHAPE, {2, 2, 6}, 3, {0}},
        {K_FLATTEN, {0}, 0, {0}},
        {K_TRANSPOSE, {0}, 0, {0, 2}},
        {K_TRANSPOSE, {0}, 0, {-1, 1}},
        {K_PERMUTE, {0}, 0, {2, 0, 1}},
        {K_PERMUTE, {0}, 0, {1, 2, 0}},
        {K_SLICE, {0, 4, 2}, 0, {2}},     /* step 2 on the last dim */
        {K_SLICE, {1, 100, 1}, 0, {1}},   /* end clamped */
        {K_SLICE, {-2, 3, 1}, 0, {-1}},   /* negative start */
        {K_NARROW, {1, 2}, 0, {1}},
        {K_NARROW, {0, 1}, 0, {0}},
        {K_SELECT, {1}, 0, {0}},
        {K_SELECT, {-1}, 0, {2}},
        {K_EXPAND, {3, 2, 3, 4}, 4, {0}}, /* new leading dim */
        {K_EXPAND, {-1, -1, -1}, 3, {0}},
        {K_UNSQUEEZE, {0}, 0, {0}},
        {K_UNSQUEEZE, {0}, 0, {-1}},
        {K_CONTIGUOUS, {0}, 0, {0}},
        {K_CLONE, {0}, 0, {0}},
        {K_CAST, {0}, 0, {0}},
        {K_CHAIN, {0}, 0, {0}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        CT_FRAME {
            ct_tensor *x = randn(CT_SHAPE(2, 3, 4));
            ct_tensor *xs = permuted(2, 3, 4); /* same shape, strided */
            bool view_needs_layout = cases[k].kind == K_VIEW;
            cr_assert_eq(ct_gradcheck(gc_shape, 1, &x, (void *)&cases[k], NULL), CT_OK, "case %zu: %s", k,
                         ct_last_error());
            if (!view_needs_layout)
                cr_assert_eq(ct_gradcheck(gc_shape, 1, &xs, (void *)&cases[k], NULL), CT_OK, "strided case %zu: %s",
                             k, ct_last_error());
        }
    }
    /* squeeze needs a size-1 dim; expand a size-1 dim to stretch */
    CT_FRAME {
        ct_tensor *x = randn(CT_SHAPE(2, 1, 3));
        shape_case sq = {K_SQUEEZE, {0}, 0, {1}};
        cr_assert_eq(ct_gradcheck(gc_shape, 1, &x, &sq, NULL), CT_OK, "%s", ct_last_error());
        shape_case ex = {K_EXPAND, {2, 4, 3}, 3, {0}};
        cr_assert_eq(ct_gradcheck(gc_shape, 1, &x, &ex, NULL), CT_OK, "%s", ct_last_error());
        ct_tensor *s = leaf(ct_tensor_scalar(F64, 2.0));
        shape_case ex0 = {K_EXPAND, {2, 3}, 2, {0}};
        cr_assert_eq(ct_gradcheck(gc_shape, 1, &s, &ex0, NULL), CT_OK, "%s", ct_last_error());
        shape_case un0 = {K_UNSQUEEZE, {0}, 0, {0}};
        cr_assert_eq(ct_gradcheck(gc_shape, 1, &s, &un0, NULL), CT_OK, "%s", ct_last_error());
    }
}

Test(ops_shape, views_share_storage_and_match_core)
{
    CT_FRAME {
        ct_tensor *x = randn(CT_SHAPE(2, 3, 4));
        ct_tensor *views[] = {ct_view(x, CT_SHAPE(6, 4)), ct_transpose(x, 0, 2), ct_permute(x, (int[]){1, 2, 0}),
                              ct_slice(x, 2, 1, 4, 2), ct_narrow(x, 1, 1, 2), ct_select(x, 0, 1),
                              ct_expand(ct_select(x, 2, 0), CT_SHAPE(5, 2, 3)), ct_unsqueeze(x, 1), ct_flatten(x),
                              ct_reshape(x, CT_SHAPE(4, 6))};
        for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
            cr_assert_not_null(views[i], "view %zu: %s", i, ct_last_error());
            cr_assert_eq(views[i]->storage, x->storage, "view %zu copies", i);
            cr_assert(views[i]->requires_grad && views[i]->grad_fn, "view %zu records no node", i);
        }
        ct_tensor *s = ct_slice(x, 2, 1, 4, 2);
        ct_tensor *ref = ct_tensor_slice(x, 2, 1, 4, 2);
        cr_assert(ct_tensor_same_shape(s, ref) && s->offset == ref->offset && s->strides[2] == ref->strides[2]);
        /* contiguous of a contiguous tensor is the tensor itself */
        cr_assert_eq(ct_contiguous(x), x);
        ct_tensor *t = ct_transpose(x, 0, 1);
        ct_tensor *c = ct_contiguous(t);
        cr_assert(c != t && ct_tensor_is_contiguous(c) && c->storage != x->storage);
        cr_assert_eq(ct_tensor_get(c, (int64_t[]){2, 1, 3}), ct_tensor_get(x, (int64_t[]){1, 2, 3}));
        /* the gradient of a slice lands in the sliced positions only */
        ct_tensor *v = leaf(ct_tensor_from_data(F64, CT_SHAPE(5), (double[]){1, 2, 3, 4, 5}));
        cr_assert_eq(ct_backward(ct_sum_all(ct_mul_scalar(ct_slice(v, 0, 1, 5, 2), 3))), CT_OK, "%s",
                     ct_last_error());
        const double want[5] = {0, 3, 0, 3, 0};
        for (int i = 0; i < 5; i++) cr_assert_eq(ct_tensor_get(v->grad, (int64_t[]){i}), want[i]);
    }
}

/* ---- concat, stack -------------------------------------------------------------------------- */

typedef struct {
    int n, dim;
    bool stack;
} cat_case;

static ct_tensor *gc_cat(ct_tensor *const *in, void *ctx)
{
    const cat_case *c = ctx;
    ct_tensor *y = c->stack ? ct_stack(c->n, in, c->dim) : ct_concat(c->n, in, c->dim);
    return y ? ct_mul(y, ct_add_scalar(ct_contiguous(y), 0.5)) : NULL;
}

Test(ops_shape, concat_over_each_dim_and_stack)
{
    ct_set_seed(22);
    for (int dim = -3; dim < 3; dim++) {
        CT_FRAME {
            int d = dim < 0 ? dim + 3 : dim;
            int64_t s0[3] = {2, 3, 2}, s1[3] = {2, 3, 2}, s2[3] = {2, 3, 2};
            s0[d] = 2, s1[d] = 1, s2[d] = 3;
            ct_tensor *a = randn(3, s0), *b = permuted(s1[0], s1[1], s1[2]), *c = randn(3, s2);
            ct_tensor *k = ct_tensor_randn(F64, 3, s0, 0, 1); /* no grad: gets none */
            cat_case cc = {4, dim, false};
            cr_assert_eq(ct_gradcheck(gc_cat, 4, (ct_tensor *[]){a, b, k, c}, &cc, NULL), CT_OK, "dim %d: %s", dim,
                         ct_last_error());
            cr_assert_null(k->grad);
            ct_tensor *y = ct_concat(3, (ct_tensor *[]){a, b, c}, dim);
            cr_assert_eq(y->shape[d], 6);
            int64_t idx[3] = {1, 2, 1};
            idx[d] = 2; /* the first element of b's part */
            int64_t bi[3] = {1, 2, 1};
            bi[d] = 0;
            cr_assert_eq(ct_tensor_get(y, idx), ct_tensor_get(b, bi));
        }
    }
    for (int dim = -3; dim < 3; dim++) {
        CT_FRAME {
            ct_tensor *a = randn(CT_SHAPE(2, 3)), *c = randn(CT_SHAPE(2, 3));
            ct_tensor *bl = leaf(ct_tensor_transpose(ct_tensor_randn(F64, CT_SHAPE(3, 2), 0, 1), 0, 1));
            cat_case cc = {3, dim, true};
            cr_assert_eq(ct_gradcheck(gc_cat, 3, (ct_tensor *[]){a, bl, c}, &cc, NULL), CT_OK, "stack dim %d: %s",
                         dim, ct_last_error());
            ct_tensor *y = ct_stack(3, (ct_tensor *[]){a, bl, c}, dim);
            cr_assert_eq(y->ndim, 3);
            cr_assert_eq(y->shape[dim < 0 ? dim + 3 : dim], 3);
        }
    }
}

Test(ops_shape, concat_of_more_inputs_than_a_node_holds)
{
    ct_set_seed(23);
    CT_FRAME {
        ct_tensor *ts[19];
        for (int i = 0; i < 19; i++) ts[i] = randn(CT_SHAPE(i % 3 + 1, 2));
        cat_case cc = {19, 0, false};
        cr_assert_eq(ct_gradcheck(gc_cat, 19, ts, &cc, NULL), CT_OK, "%s", ct_last_error());
        ct_tensor *y = ct_concat(19, ts, 0);
        cr_assert_eq(y->shape[0], 7 * 1 + 6 * 2 + 6 * 3);
        cr_assert_eq(ct_tensor_get(y, (int64_t[]){36, 1}), ct_tensor_get(ts[18], (int64_t[]){0, 1}));
    }
}

/* ---- casts -------------------------------------------------------------------------------- */

Test(ops_shape, cast_sends_the_gradient_back_in_the_input_dtype)
{
    CT_FRAME {
        ct_tensor *x = leaf(ct_tensor_from_data(F64, CT_SHAPE(3), (double[]){1, 2, 3}));
        ct_tensor *y = ct_cast(x, CT_DTYPE_F32);
        cr_assert_eq(y->dtype, CT_DTYPE_F32);
        ct_tensor *L = ct_sum_all(ct_mul(y, y)); /* f32 */
        cr_assert_eq(ct_backward(L), CT_OK, "%s", ct_last_error());
        cr_assert_eq(x->grad->dtype, F64);
        for (int i = 0; i < 3; i++) cr_assert_eq(ct_tensor_get(x->grad, (int64_t[]){i}), 2.0 * (i + 1));
        /* bf16 round trip */
        ct_tensor *z = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(4), 0, 1));
        cr_assert_eq(ct_backward(ct_sum_all(ct_cast(ct_mul_scalar(ct_cast(z, CT_DTYPE_BF16), 2), CT_DTYPE_F32))),
                     CT_OK, "%s", ct_last_error());
        cr_assert_eq(z->grad->dtype, CT_DTYPE_F32);
        for (int i = 0; i < 4; i++) cr_assert_eq(ct_tensor_get(z->grad, (int64_t[]){i}), 2.0);
        /* to an integer dtype: no gradient recorded */
        ct_tensor *i = ct_cast(x, CT_DTYPE_I64);
        cr_assert(i && !i->requires_grad && !i->grad_fn);
    }
}

Test(ops_shape, f32_view_chain_backward_is_finite)
{
    ct_set_seed(24);
    CT_FRAME {
        ct_tensor *x = leaf(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(2, 3, 4), 0, 1));
        ct_tensor *h = ct_transpose(ct_reshape(ct_permute(x, (int[]){2, 0, 1}), CT_SHAPE(4, 6)), 0, 1);
        h = ct_concat(3, (ct_tensor *[]){ct_slice(h, 0, 0, 6, 2), ct_narrow(h, 0, 1, 2), ct_unsqueeze(ct_select(h, 0, 5), 0)}, 0);
        h = ct_expand(ct_unsqueeze(h, 0), CT_SHAPE(2, -1, -1));
        cr_assert_eq(ct_backward(ct_sum_all(ct_mul(h, ct_clone(h)))), CT_OK, "%s", ct_last_error());
        cr_assert_eq(x->grad->dtype, CT_DTYPE_F32);
        cr_assert(ct_tensor_same_shape(x->grad, x));
        for (int64_t i = 0; i < 24; i++) {
            int64_t idx[3] = {i / 12, i / 4 % 3, i % 4};
            cr_assert(isfinite(ct_tensor_get(x->grad, idx)));
        }
    }
}

/* ---- misuse -------------------------------------------------------------------------------- */

Test(ops_shape, misuse_names_the_op_and_shapes)
{
    CT_FRAME {
        ct_tensor *x = randn(CT_SHAPE(2, 3)), *y = randn(CT_SHAPE(3, 3));
        EXPECT_ERROR(ct_view(ct_transpose(x, 0, 1), CT_SHAPE(6)), "view", "f64[3, 2]");
        EXPECT_ERROR(ct_reshape(x, CT_SHAPE(4, 2)), "reshape", "f64[2, 3]");
        EXPECT_ERROR(ct_transpose(x, 0, 2), "transpose", "f64[2, 3]");
        EXPECT_ERROR(ct_permute(x, (int[]){0, 0}), "permute", "f64[2, 3]");
        EXPECT_ERROR(ct_slice(x, 1, 0, 3, 0), "slice", "f64[2, 3]");
        EXPECT_ERROR(ct_narrow(x, 1, 2, 2), "narrow", "f64[2, 3]");
        EXPECT_ERROR(ct_select(x, 0, 2), "select", "f64[2, 3]");
        EXPECT_ERROR(ct_expand(x, CT_SHAPE(2, 4)), "expand", "f64[2, 3]");
        EXPECT_ERROR(ct_squeeze(x, 0), "squeeze", "f64[2, 3]");
        EXPECT_ERROR(ct_concat(2, (ct_tensor *[]){x, y}, 1), "concat", "f64[2, 3]", "f64[3, 3]");
        EXPECT_ERROR(ct_concat(2, (ct_tensor *[]){x, ct_cast(x, CT_DTYPE_F32)}, 0), "concat", "f32[2, 3]");
        EXPECT_ERROR(ct_concat(1, (ct_tensor *[]){x}, 2), "concat", "f64[2, 3]");
        EXPECT_ERROR(ct_concat(1, (ct_tensor *[]){ct_tensor_scalar(F64, 1)}, 0), "concat", "f64[]");
        EXPECT_ERROR(ct_stack(2, (ct_tensor *[]){x, y}, 0), "stack", "f64[2, 3]", "f64[3, 3]");
        EXPECT_ERROR(ct_stack(1, (ct_tensor *[]){x}, 3), "stack", "f64[2, 3]");
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_view(NULL, CT_SHAPE(1)));
        cr_assert_null(ct_concat(2, (ct_tensor *[]){x, NULL}, 0));
        cr_assert_null(ct_stack(2, (ct_tensor *[]){NULL, x}, 0));
        cr_assert_null(ct_cast(NULL, F64));
        cr_assert_null(ct_contiguous(NULL));
        cr_assert_str_eq(ct_last_error(), "earlier failure");
    }
}
