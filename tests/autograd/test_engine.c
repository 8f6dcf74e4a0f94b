/* The backward engine, tested through two small ops written in the test with
 * the node API (so the engine is checked independently of autograd/ops_*.c):
 *   mul(a, b) = a * b (same shapes): da = g b, db = g a
 *   sum(x)    = sum of all elements: dx = g broadcast. */
#include <criterion/criterion.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "core/frame.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

static ct_status mul_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    if (ct_node_input_needs_grad(n, 0)) gx[0] = ct_kernel_binary(CT_BINARY_MUL, gy, ct_node_saved(n, 1));
    if (ct_node_input_needs_grad(n, 1)) gx[1] = ct_kernel_binary(CT_BINARY_MUL, gy, ct_node_saved(n, 0));
    return CT_OK;
}

static ct_tensor *t_mul(ct_tensor *a, ct_tensor *b)
{
    ct_tensor *y = ct_kernel_binary(CT_BINARY_MUL, a, b);
    ct_tensor *in[2] = {a, b};
    if (y && ct_autograd_needed(2, (const ct_tensor *const *)in)) {
        ct_node *n = ct_node_new("mul", mul_backward, 2, in);
        if (!n || ct_node_save(n, a, false) || ct_node_save(n, b, false) || ct_node_attach(n, y)) return NULL;
    }
    return y;
}

static ct_status sum_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const ct_tensor *m = ct_node_input_meta(n, 0);
    gx[0] = ct_tensor_contiguous(ct_tensor_expand(gy, m->ndim, m->shape));
    return gx[0] ? CT_OK : ct_last_status();
}

static ct_tensor *t_sum(ct_tensor *x)
{
    ct_tensor *y = ct_kernel_sum(x, NULL, 0, false);
    if (y && ct_autograd_needed(1, (const ct_tensor *const *)&x)) {
        ct_node *n = ct_node_new("sum", sum_backward, 1, &x);
        if (ct_node_attach(n, y)) return NULL;
    }
    return y;
}

static ct_tensor *leaf(double v0, double v1)
{
    ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), (double[]){v0, v1});
    ct_tensor_set_requires_grad(t, true);
    return t;
}

static double g(const ct_tensor *t, int i) { return ct_tensor_get(t->grad, (int64_t[]){i}); }

Test(engine, chain_rule_and_accumulation)
{
    CT_FRAME {
        ct_tensor *a = leaf(2, 3), *b = leaf(5, 7);
        /* L = sum(a * b * a) -> dL/da = 2 a b, dL/db = a^2 */
        ct_tensor *L = t_sum(t_mul(t_mul(a, b), a));
        cr_assert_eq(ct_backward(L), CT_OK, "%s", ct_last_error());
        cr_assert_eq(g(a, 0), 20.0);
        cr_assert_eq(g(a, 1), 42.0);
        cr_assert_eq(g(b, 0), 4.0);
        cr_assert_eq(g(b, 1), 9.0);
        /* a second graph accumulates into .grad */
        cr_assert_eq(ct_backward(t_sum(t_mul(a, b))), CT_OK);
        cr_assert_eq(g(a, 0), 25.0);
        cr_assert_eq(g(b, 1), 12.0);
        ct_tensor_zero_grad(a);
        cr_assert_null(a->grad);
    }
}

Test(engine, saved_tensors_are_freed_and_second_backward_fails_clearly)
{
    CT_FRAME {
        ct_tensor *a = leaf(1, 2), *b = leaf(3, 4);
        ct_tensor *L = t_sum(t_mul(a, b));
        cr_assert_eq(ct_backward(L), CT_OK);
        cr_assert_neq(ct_backward(L), CT_OK);
        cr_assert(strstr(ct_last_error(), "mul") && strstr(ct_last_error(), "retain_graph"), "%s", ct_last_error());
        ct_tensor *L2 = t_sum(t_mul(a, b));
        ct_backward_config keep = {.retain_graph = true};
        cr_assert_eq(ct_backward_with(L2, NULL, &keep), CT_OK);
        cr_assert_eq(ct_backward(L2), CT_OK, "retained graph runs again: %s", ct_last_error());
        cr_assert_eq(g(a, 0), 3.0 * 3);
    }
}

Test(engine, misuse_gives_errors)
{
    CT_FRAME {
        ct_tensor *a = leaf(1, 2), *b = leaf(3, 4);
        ct_tensor *y = t_mul(a, b);
        cr_assert_neq(ct_backward(y), CT_OK);
        cr_assert(strstr(ct_last_error(), "f64[2]") && strstr(ct_last_error(), "one-element"), "%s", ct_last_error());
        ct_tensor *bad = ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(3));
        cr_assert_neq(ct_backward_with(y, bad, NULL), CT_OK);
        cr_assert(strstr(ct_last_error(), "f64[3]"), "%s", ct_last_error());
        cr_assert_eq(ct_backward_with(y, ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(2)), NULL), CT_OK);
        cr_assert_eq(g(a, 1), 4.0);
        ct_tensor *c = ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(1));
        cr_assert_neq(ct_backward(c), CT_OK, "nothing requires grad");
        cr_assert_neq(ct_tensor_set_requires_grad(y, true), CT_OK, "not a leaf");
        cr_assert_neq(ct_tensor_set_requires_grad(ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2)), true), CT_OK);
        cr_assert_neq(ct_backward(NULL), CT_OK);
    }
}

Test(engine, no_grad_and_detach_record_nothing)
{
    CT_FRAME {
        ct_tensor *a = leaf(1, 2), *b = leaf(3, 4);
        ct_tensor *y = NULL;
        CT_NO_GRAD { y = t_mul(a, b); }
        cr_assert(ct_grad_is_enabled());
        cr_assert_null(y->grad_fn);
        cr_assert(!y->requires_grad);
        ct_tensor *d = ct_detach(t_mul(a, b));
        cr_assert_null(d->grad_fn);
        cr_assert(!d->requires_grad);
        cr_assert(ct_tensor_is_leaf(d));
    }
}

typedef struct {
    int calls[4];
    int order[8];
    int norder;
    ct_tensor *leaves[4];
    double grad_seen[4];
} hook_log;

static ct_status on_ready(ct_tensor *leaf_t, void *data)
{
    hook_log *log = data;
    for (int i = 0; i < 4; i++)
        if (log->leaves[i] == leaf_t) {
            log->calls[i]++;
            log->order[log->norder++] = i;
            log->grad_seen[i] = ct_tensor_get(leaf_t->grad, (int64_t[]){0});
        }
    return CT_OK;
}

Test(engine, grad_ready_hooks_fire_once_when_final)
{
    CT_FRAME {
        hook_log log = {0};
        ct_tensor *w = leaf(2, 2), *x = leaf(3, 3), *v = leaf(5, 5);
        log.leaves[0] = w, log.leaves[1] = x, log.leaves[2] = v;
        for (int i = 0; i < 3; i++) ct_tensor_on_grad_ready(log.leaves[i], on_ready, &log);
        /* w is used twice (like a tied embedding): early and at the very end.
         * L = sum(((w * x) * v) * w) */
        ct_tensor *L = t_sum(t_mul(t_mul(t_mul(w, x), v), w));
        cr_assert_eq(ct_backward(L), CT_OK, "%s", ct_last_error());
        cr_assert_eq(log.calls[0], 1);
        cr_assert_eq(log.calls[1], 1);
        cr_assert_eq(log.calls[2], 1);
        /* v's gradient is final first (its op is the latest but one); w's only
         * when its first use, the earliest op, has run, and then x (input 1 of
         * that op) */
        cr_assert_eq(log.order[0], 2);
        cr_assert_eq(log.order[1], 0);
        cr_assert_eq(log.order[2], 1);
        /* the hook saw the complete gradient: dL/dw = 2 w x v = 60 */
        cr_assert_eq(log.grad_seen[0], 60.0);
        cr_assert_eq(log.grad_seen[1], 2.0 * 5 * 2);
    }
}

static ct_status failing_hook(ct_tensor *leaf_t, void *data)
{
    (void)leaf_t;
    (void)data;
    return ct_error_set(CT_ERR_IO, "hook failed on purpose");
}

Test(engine, hook_error_stops_backward)
{
    CT_FRAME {
        ct_tensor *a = leaf(1, 2), *b = leaf(3, 4);
        ct_tensor_on_grad_ready(a, failing_hook, NULL);
        cr_assert_eq(ct_backward(t_sum(t_mul(a, b))), CT_ERR_IO);
        cr_assert(strstr(ct_last_error(), "on purpose"), "%s", ct_last_error());
        ct_tensor_clear_grad_hooks(a);
    }
}

Test(engine, graphs_are_freed_with_their_outputs)
{
    int64_t before = ct_storage_live_bytes();
    ct_tensor *a = NULL, *b = NULL;
    CT_FRAME {
        a = ct_tensor_retain(leaf(1, 2));
        b = ct_tensor_retain(leaf(3, 4));
    }
    for (int i = 0; i < 1000; i++) {
        CT_FRAME {
            ct_tensor *L = t_sum(t_mul(t_mul(a, b), a));
            if (i % 2) cr_assert_eq(ct_backward(L), CT_OK);
        }
    }
    ct_tensor_release(a);
    ct_tensor_release(b);
    cr_assert_eq(ct_storage_live_bytes(), before);
}

static ct_tensor *prod_fn(ct_tensor *const *in, void *ctx)
{
    (void)ctx;
    return t_mul(t_mul(in[0], in[1]), in[0]);
}

static ct_status wrong_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    (void)n;
    gx[0] = ct_kernel_binary_scalar(CT_BINARY_MUL, gy, 1.5); /* true derivative is 1 */
    return CT_OK;
}

static ct_tensor *wrong_fn(ct_tensor *const *in, void *ctx)
{
    (void)ctx;
    ct_tensor *x = in[0];
    ct_tensor *y = ct_kernel_binary_scalar(CT_BINARY_ADD, x, 0.0);
    if (y && ct_autograd_needed(1, (const ct_tensor *const *)&x)) ct_node_attach(ct_node_new("wrong", wrong_backward, 1, &x), y);
    return y;
}

Test(engine, gradcheck_passes_correct_and_catches_wrong_gradients)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(3, 4), 0, 1);
        ct_tensor *b = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(3, 4), 0, 1);
        ct_tensor_set_requires_grad(a, true);
        ct_tensor_set_requires_grad(b, true);
        cr_assert_eq(ct_gradcheck(prod_fn, 2, (ct_tensor *[]){a, b}, NULL, NULL), CT_OK, "%s", ct_last_error());
        cr_assert_null(a->grad, "gradcheck leaves .grad as it was");
        cr_assert_neq(ct_gradcheck(wrong_fn, 1, (ct_tensor *[]){a}, NULL, NULL), CT_OK);
        cr_assert(strstr(ct_last_error(), "wrong") && strstr(ct_last_error(), "finite differences"), "%s",
                  ct_last_error());
        /* non-contiguous input */
        ct_tensor *t = ct_tensor_transpose(ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(4, 3), 0, 1), 0, 1);
        ct_tensor_set_requires_grad(t, true);
        cr_assert_eq(ct_gradcheck(prod_fn, 2, (ct_tensor *[]){t, b}, NULL, NULL), CT_OK, "%s", ct_last_error());
    }
}
