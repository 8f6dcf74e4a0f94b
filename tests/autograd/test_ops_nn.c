/* Differentiable nn ops (autograd/ops_nn.c): every op against central finite
 * differences (ct_gradcheck, f64) on small random shapes, strided inputs
 * included; forward values bit-equal to the kernels'; a composed
 * transformer-like expression; f32 smoke runs; misuse messages; graph cleanup. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "autograd/ops_nn.h"
#include "autograd/ops_shape.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/storage.h"
#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "kernels/embedding.h"
#include "kernels/loss.h"
#include "kernels/norm.h"
#include "kernels/softmax.h"

#define IGNORE (-100)

/* ---- helpers --------------------------------------------------------------------- */

static ct_tensor *mark(ct_tensor *t)
{
    cr_assert_not_null(t, "%s", ct_last_error());
    cr_assert_eq(ct_tensor_set_requires_grad(t, true), CT_OK, "%s", ct_last_error());
    return t;
}

static ct_tensor *leaf(ct_dtype dt, int ndim, const int64_t *shape) { return mark(ct_tensor_randn(dt, ndim, shape, 0, 1)); }

/* A leaf that is the transpose (dims d0, d1) of a fresh random tensor of shape base. */
static ct_tensor *leaf_t(ct_dtype dt, int ndim, const int64_t *base, int d0, int d1)
{
    ct_tensor *t = ct_tensor_transpose(ct_tensor_randn(dt, ndim, base, 0, 1), d0, d1);
    /* a view over a size-1 dim may still count as contiguous */
    cr_assert(t && (base[d0] == 1 || base[d1] == 1 || !ct_tensor_is_contiguous(t)));
    return mark(t);
}

static ct_tensor *ids_of(ct_dtype dt, int ndim, const int64_t *shape, const int64_t *v)
{
    ct_tensor *t = ct_tensor_cast(ct_tensor_from_data(CT_DTYPE_I64, ndim, shape, v), dt);
    cr_assert_not_null(t, "%s", ct_last_error());
    return t;
}

static void gradcheck_ok(ct_gradcheck_fn fn, int n, ct_tensor *const *in, void *ctx, const char *what)
{
    ct_status st = ct_gradcheck(fn, n, in, ctx, NULL);
    cr_assert_eq(st, CT_OK, "%s: %s", what, ct_last_error());
}

/* Same shape, dtype and bits (the op must run exactly the kernel). */
static void same_bits(const ct_tensor *a, const ct_tensor *b, const char *what)
{
    cr_assert(a && b, "%s: %s", what, ct_last_error());
    cr_assert(ct_tensor_same_shape(a, b) && a->dtype == b->dtype, "%s: shape or dtype differs", what);
    CT_FRAME {
        ct_tensor *ac = ct_tensor_contiguous((ct_tensor *)a), *bc = ct_tensor_contiguous((ct_tensor *)b);
        cr_assert(memcmp(ct_tensor_data(ac), ct_tensor_data(bc), ct_tensor_nbytes(ac)) == 0, "%s: values differ",
                  what);
    }
}

static void grad_finite(const ct_tensor *t, const char *what)
{
    cr_assert_not_null(t->grad, "%s: no gradient", what);
    cr_assert(ct_tensor_same_shape(t->grad, t) && t->grad->dtype == t->dtype, "%s: gradient shape/dtype", what);
    CT_FRAME {
        ct_tensor *g = ct_tensor_cast(t->grad, CT_DTYPE_F64);
        const double *p = ct_tensor_data(g);
        double norm = 0;
        for (int64_t i = 0; i < ct_tensor_numel(g); i++) {
            cr_assert(isfinite(p[i]), "%s: gradient element %lld is %g", what, (long long)i, p[i]);
            norm += fabs(p[i]);
        }
        cr_assert(norm > 0, "%s: gradient is all zeros", what);
    }
}

/* Runs backward from y with a random upstream gradient of y's shape and dtype. */
static void backward_random(ct_tensor *y)
{
    cr_assert_not_null(y, "%s", ct_last_error());
    ct_tensor *g = ct_tensor_randn(y->dtype, y->ndim, y->shape, 0, 1);
    cr_assert_eq(ct_backward_with(y, g, NULL), CT_OK, "%s", ct_last_error());
}

static void error_names(const char *what, const char *a, const char *b, const char *c)
{
    const char *e = ct_last_error();
    cr_assert(strstr(e, a) && (!b || strstr(e, b)) && (!c || strstr(e, c)), "%s: message '%s' lacks '%s' / '%s' / '%s'",
              what, e, a, b ? b : "", c ? c : "");
}

/* Parameters of the gradcheck functions below. */
typedef struct {
    int dim;
    bool log;
    double eps;
    ct_tensor *ids;
    double p;
    uint64_t seed;
    int64_t ignore;
    bool causal;
    double scale;
} nn_case;

/* ---- softmax / log_softmax -------------------------------------------------------- */

static ct_tensor *softmax_fn(ct_tensor *const *in, void *ctx)
{
    const nn_case *c = ctx;
    return c->log ? ct_log_softmax(in[0], c->dim) : ct_softmax(in[0], c->dim);
}

Test(ops_nn, softmax_gradcheck_every_dim_and_strided)
{
    ct_set_seed(11);
    for (int log = 0; log <= 1; log++) {
        CT_FRAME {
            ct_tensor *x = leaf(CT_DTYPE_F64, CT_SHAPE(2, 3, 4));
            for (int dim = -3; dim < 3; dim++)
                gradcheck_ok(softmax_fn, 1, &x, &(nn_case){.dim = dim, .log = log}, log ? "log_softmax" : "softmax");
            /* (3, 5) transposed view of a (5, 3) tensor, over both dims */
            ct_tensor *xt = leaf_t(CT_DTYPE_F64, CT_SHAPE(5, 3), 0, 1);
            gradcheck_ok(softmax_fn, 1, &xt, &(nn_case){.dim = 0, .log = log}, "transposed, dim 0");
            gradcheck_ok(softmax_fn, 1, &xt, &(nn_case){.dim = -1, .log = log}, "transposed, dim -1");
            /* every second column of a (3, 8) tensor */
            ct_tensor *xs = mark(ct_tensor_slice(ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(3, 8), 0, 1), 1, 0, 8, 2));
            gradcheck_ok(softmax_fn, 1, &xs, &(nn_case){.dim = 1, .log = log}, "sliced with step");
            ct_tensor *x0 = mark(ct_tensor_scalar(CT_DTYPE_F64, 0.3));
            gradcheck_ok(softmax_fn, 1, &x0, &(nn_case){.dim = 0, .log = log}, "0-d");
        }
    }
}

Test(ops_nn, softmax_forward_is_the_kernel_and_records_only_when_needed)
{
    ct_set_seed(12);
    CT_FRAME {
        ct_tensor *x = leaf_t(CT_DTYPE_F32, CT_SHAPE(7, 5), 0, 1);
        ct_tensor *y = ct_softmax(x, 0), *z = ct_log_softmax(x, 1);
        same_bits(y, ct_kernel_softmax(x, 0), "softmax");
        same_bits(z, ct_kernel_log_softmax(x, 1), "log_softmax");
        cr_assert(y->grad_fn && y->requires_grad && !strcmp(ct_node_op(y->grad_fn), "softmax"));
        cr_assert(z->grad_fn && !strcmp(ct_node_op(z->grad_fn), "log_softmax"));
        ct_tensor *plain = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(2, 3), 0, 1);
        ct_tensor *a = ct_softmax(plain, -1), *b = NULL;
        CT_NO_GRAD { b = ct_softmax(x, -1); }
        cr_assert(!a->grad_fn && !a->requires_grad && !b->grad_fn && !b->requires_grad);
    }
}

/* ---- layernorm / rmsnorm ------------------------------------------------------------ */

/* in[0] = x, in[1] = w (or NULL), in[2] = b (or NULL); c->log selects rmsnorm. */
static ct_tensor *norm_fn(ct_tensor *const *in, void *ctx)
{
    const nn_case *c = ctx;
    return c->log ? ct_rmsnorm(in[0], in[1], c->eps) : ct_layernorm(in[0], in[1], in[2], c->eps);
}

/* gradcheck over the non-NULL entries only (it rejects NULL inputs). */
static ct_tensor *norm_fn_packed(ct_tensor *const *in, void *ctx)
{
    const nn_case *c = ctx;
    /* dim encodes which of w, b are present: bit 0 w, bit 1 b */
    ct_tensor *x = in[0], *w = NULL, *b = NULL;
    int k = 1;
    if (c->dim & 1) w = in[k++];
    if (c->dim & 2) b = in[k++];
    return norm_fn((ct_tensor *[]){x, w, b}, ctx);
}

static void norm_check(ct_tensor *x, int C, int which, bool rms, const char *what)
{
    ct_tensor *in[3] = {x};
    int n = 1;
    if (which & 1) in[n++] = leaf(CT_DTYPE_F64, CT_SHAPE(C));
    if (which & 2) in[n++] = leaf(CT_DTYPE_F64, CT_SHAPE(C));
    gradcheck_ok(norm_fn_packed, n, in, &(nn_case){.dim = which, .log = rms, .eps = 1e-5}, what);
}

Test(ops_nn, layernorm_gradcheck_with_and_without_affine)
{
    ct_set_seed(21);
    CT_FRAME {
        ct_tensor *x = leaf(CT_DTYPE_F64, CT_SHAPE(3, 5));
        norm_check(x, 5, 3, false, "layernorm w, b");
        norm_check(x, 5, 0, false, "layernorm no w, no b");
        norm_check(x, 5, 1, false, "layernorm w only");
        norm_check(x, 5, 2, false, "layernorm b only");
        norm_check(leaf(CT_DTYPE_F64, CT_SHAPE(2, 2, 4)), 4, 3, false, "layernorm 3-d");
        norm_check(leaf_t(CT_DTYPE_F64, CT_SHAPE(4, 3), 0, 1), 4, 3, false, "layernorm transposed x");
        norm_check(leaf(CT_DTYPE_F64, CT_SHAPE(6)), 6, 3, false, "layernorm 1-d");
        /* only w and b require grad; x is a constant */
        ct_tensor *xc = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(3, 5), 0, 1);
        norm_check(xc, 5, 3, false, "layernorm, x constant");
    }
}

Test(ops_nn, rmsnorm_gradcheck)
{
    ct_set_seed(22);
    CT_FRAME {
        norm_check(leaf(CT_DTYPE_F64, CT_SHAPE(3, 5)), 5, 1, true, "rmsnorm w");
        norm_check(leaf(CT_DTYPE_F64, CT_SHAPE(3, 5)), 5, 0, true, "rmsnorm no w");
        norm_check(leaf_t(CT_DTYPE_F64, CT_SHAPE(4, 2, 3), 0, 2), 4, 1, true, "rmsnorm transposed x");
        norm_check(ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(3, 5), 0, 1), 5, 1, true, "rmsnorm, x constant");
    }
}

Test(ops_nn, norm_forward_is_the_kernel_and_bias_grad_keeps_its_dtype)
{
    ct_set_seed(23);
    CT_FRAME {
        ct_tensor *x = leaf(CT_DTYPE_F32, CT_SHAPE(4, 6)), *w = leaf(CT_DTYPE_F32, CT_SHAPE(6));
        ct_tensor *b = leaf(CT_DTYPE_F32, CT_SHAPE(6));
        ct_tensor *y = ct_layernorm(x, w, b, 1e-5), *yk = NULL;
        cr_assert_eq(ct_kernel_layernorm(x, w, b, 1e-5, &yk, NULL, NULL), CT_OK);
        same_bits(y, yk, "layernorm");
        ct_tensor *r = ct_rmsnorm(x, w, 1e-6), *rk = NULL;
        cr_assert_eq(ct_kernel_rmsnorm(x, w, 1e-6, &rk, NULL), CT_OK);
        same_bits(r, rk, "rmsnorm");

        /* f64 x without w, f32 b: db (sum of dy over rows) comes back as f32 */
        ct_tensor *x64 = leaf(CT_DTYPE_F64, CT_SHAPE(3, 4)), *b32 = leaf(CT_DTYPE_F32, CT_SHAPE(4));
        ct_tensor *gy = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(3, 4), 0, 1);
        cr_assert_eq(ct_backward_with(ct_layernorm(x64, NULL, b32, 1e-5), gy, NULL), CT_OK, "%s", ct_last_error());
        cr_assert_eq(b32->grad->dtype, CT_DTYPE_F32);
        for (int64_t c = 0; c < 4; c++) {
            double s = 0;
            for (int64_t r2 = 0; r2 < 3; r2++) s += ct_tensor_get(gy, (int64_t[]){r2, c});
            cr_assert(fabs(ct_tensor_get(b32->grad, (int64_t[]){c}) - s) <= 1e-6 * (1 + fabs(s)));
        }
        grad_finite(x64, "layernorm x with f32 b");
    }
}

/* ---- embedding ---------------------------------------------------------------------------- */

static ct_tensor *embedding_fn(ct_tensor *const *in, void *ctx) { return ct_embedding(in[0], ((nn_case *)ctx)->ids); }

Test(ops_nn, embedding_gradcheck_and_repeated_ids_sum)
{
    ct_set_seed(31);
    CT_FRAME {
        ct_tensor *W = leaf(CT_DTYPE_F64, CT_SHAPE(5, 3));
        ct_tensor *ids = ids_of(CT_DTYPE_I64, CT_SHAPE(2, 3), (int64_t[]){0, 2, 0, 4, 2, 2});
        gradcheck_ok(embedding_fn, 1, &W, &(nn_case){.ids = ids}, "embedding (2,3) ids");
        ct_tensor *ids32 = ids_of(CT_DTYPE_I32, CT_SHAPE(4), (int64_t[]){3, 3, 1, 3});
        gradcheck_ok(embedding_fn, 1, &W, &(nn_case){.ids = ids32}, "embedding i32 ids");
        ct_tensor *Wt = leaf_t(CT_DTYPE_F64, CT_SHAPE(3, 5), 0, 1);
        gradcheck_ok(embedding_fn, 1, &Wt, &(nn_case){.ids = ids}, "embedding transposed table");

        /* with upstream ones, row v of the gradient is (count of v in ids) * ones */
        ct_tensor *y = ct_embedding(W, ids);
        same_bits(y, ct_kernel_embedding(W, ids), "embedding");
        cr_assert_eq(ct_backward_with(y, ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(2, 3, 3)), NULL), CT_OK, "%s",
                     ct_last_error());
        const double count[5] = {2, 0, 3, 0, 1};
        for (int64_t v = 0; v < 5; v++)
            for (int64_t c = 0; c < 3; c++)
                cr_assert_eq(ct_tensor_get(W->grad, (int64_t[]){v, c}), count[v], "row %lld", (long long)v);
    }
}

/* ---- dropout --------------------------------------------------------------------------------- */

/* The rng is made here from a fixed seed, so every call of fn draws the same mask. */
static ct_tensor *dropout_fn(ct_tensor *const *in, void *ctx)
{
    const nn_case *c = ctx;
    ct_rng r;
    ct_rng_init(&r, c->seed);
    return ct_dropout(in[0], c->p, true, &r);
}

Test(ops_nn, dropout_gradcheck_fixed_stream)
{
    ct_set_seed(41);
    CT_FRAME {
        ct_tensor *x = leaf(CT_DTYPE_F64, CT_SHAPE(4, 5));
        gradcheck_ok(dropout_fn, 1, &x, &(nn_case){.p = 0.3, .seed = 7}, "dropout p 0.3");
        gradcheck_ok(dropout_fn, 1, &x, &(nn_case){.p = 0.8, .seed = 8}, "dropout p 0.8");
        ct_tensor *xt = leaf_t(CT_DTYPE_F64, CT_SHAPE(5, 4), 0, 1);
        gradcheck_ok(dropout_fn, 1, &xt, &(nn_case){.p = 0.5, .seed = 9}, "dropout transposed");

        /* forward is the kernel on the same stream; the gradient is mask / (1 - p) */
        ct_rng r1, r2;
        ct_rng_init(&r1, 5);
        ct_rng_init(&r2, 5);
        ct_tensor *mask = NULL;
        ct_tensor *y = ct_dropout(x, 0.4, true, &r1);
        same_bits(y, ct_kernel_dropout(x, 0.4, &r2, &mask), "dropout");
        cr_assert_eq(r1.offset, r2.offset);
        cr_assert_eq(ct_backward_with(y, ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(4, 5)), NULL), CT_OK);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 5; j++) {
                int64_t ix[2] = {i, j};
                double want = ct_tensor_get(mask, ix) ? 1 / 0.6 : 0.0;
                cr_assert(fabs(ct_tensor_get(x->grad, ix) - want) < 1e-12);
            }
    }
}

static ct_tensor *dropout_eval_fn(ct_tensor *const *in, void *ctx)
{
    (void)ctx;
    return ct_layernorm(ct_dropout(in[0], 0.5, false, NULL), NULL, NULL, 1e-5);
}

Test(ops_nn, dropout_identity_in_eval_and_for_p0)
{
    ct_set_seed(42);
    CT_FRAME {
        ct_tensor *x = leaf(CT_DTYPE_F64, CT_SHAPE(3, 4));
        ct_rng r;
        ct_rng_init(&r, 3);
        int refs = x->refcount;
        ct_tensor *a = ct_dropout(x, 0.5, false, &r), *b = ct_dropout(x, 0.0, true, &r);
        cr_assert(a == x && b == x, "identity returns x itself");
        cr_assert_eq(x->refcount, refs + 2, "as new references");
        cr_assert_eq(r.offset, 0, "no draws");
        cr_assert_null(x->grad_fn);
        gradcheck_ok(dropout_eval_fn, 1, &x, NULL, "eval dropout then layernorm");
        /* p = 1 in training: all dropped, zero gradient */
        ct_tensor *z = ct_dropout(x, 1.0, true, &r);
        cr_assert_eq(ct_backward_with(z, ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(3, 4)), NULL), CT_OK, "%s",
                     ct_last_error());
        for (int64_t i = 0; i < 12; i++) cr_assert_eq(ct_tensor_get(x->grad, (int64_t[]){i / 4, i % 4}), 0.0);
    }
}

/* ---- cross-entropy -------------------------------------------------------------------------- */

static ct_tensor *ce_fn(ct_tensor *const *in, void *ctx)
{
    const nn_case *c = ctx;
    return ct_cross_entropy(in[0], c->ids, c->ignore);
}

Test(ops_nn, cross_entropy_gradcheck_ignore_and_btv)
{
    ct_set_seed(51);
    CT_FRAME {
        /* (B, T, V) logits, two ignored rows */
        ct_tensor *logits = leaf(CT_DTYPE_F64, CT_SHAPE(2, 3, 5));
        ct_tensor *t = ids_of(CT_DTYPE_I64, CT_SHAPE(2, 3), (int64_t[]){1, IGNORE, 4, 0, 4, IGNORE});
        gradcheck_ok(ce_fn, 1, &logits, &(nn_case){.ids = t, .ignore = IGNORE}, "cross_entropy (2,3,5)");
        /* (N, V), i32 targets, ignore_index that is also a class id */
        ct_tensor *l2 = leaf(CT_DTYPE_F64, CT_SHAPE(4, 6));
        ct_tensor *t2 = ids_of(CT_DTYPE_I32, CT_SHAPE(4), (int64_t[]){2, 5, 0, 2});
        gradcheck_ok(ce_fn, 1, &l2, &(nn_case){.ids = t2, .ignore = 2}, "cross_entropy ignore class 2");
        gradcheck_ok(ce_fn, 1, &l2, &(nn_case){.ids = t2, .ignore = -1}, "cross_entropy no ignore");
        /* logits as a transposed (V, N) tensor */
        ct_tensor *lt = leaf_t(CT_DTYPE_F64, CT_SHAPE(6, 4), 0, 1);
        gradcheck_ok(ce_fn, 1, &lt, &(nn_case){.ids = t2, .ignore = -1}, "cross_entropy transposed");
    }
}

Test(ops_nn, cross_entropy_forward_is_the_kernel_and_scales_by_upstream)
{
    ct_set_seed(52);
    CT_FRAME {
        ct_tensor *logits = leaf(CT_DTYPE_F64, CT_SHAPE(3, 4));
        ct_tensor *t = ids_of(CT_DTYPE_I64, CT_SHAPE(3), (int64_t[]){3, IGNORE, 0});
        ct_tensor *lse = NULL;
        ct_tensor *loss = ct_cross_entropy(logits, t, IGNORE);
        cr_assert_eq(loss->ndim, 0);
        same_bits(loss, ct_kernel_cross_entropy(logits, t, IGNORE, &lse), "cross_entropy");
        cr_assert_eq(ct_backward_with(loss, ct_tensor_scalar(CT_DTYPE_F64, 2.5), NULL), CT_OK, "%s", ct_last_error());
        ct_tensor *ref = ct_kernel_cross_entropy_backward(ct_tensor_scalar(CT_DTYPE_F64, 2.5), logits, t, lse, IGNORE);
        same_bits(logits->grad, ref, "dlogits = kernel backward with dloss 2.5");
        cr_assert_eq(ct_tensor_get(logits->grad, (int64_t[]){1, 2}), 0.0, "ignored row");
    }
}

/* ---- attention ----------------------------------------------------------------------------- */

static ct_tensor *attention_fn(ct_tensor *const *in, void *ctx)
{
    const nn_case *c = ctx;
    return ct_attention(in[0], in[1], in[2], c->causal, c->scale);
}

/* A (B,H,T,D) leaf that is the transposed view of a (B,T,H,D) projection. */
static ct_tensor *bhtd_leaf(ct_dtype dt, int64_t B, int64_t H, int64_t T, int64_t D)
{
    return leaf_t(dt, CT_SHAPE(B, T, H, D), 1, 2);
}

Test(ops_nn, attention_gradcheck_causal_and_not_strided_qkv)
{
    ct_set_seed(61);
    const int64_t Ts[2] = {1, 5};
    const int64_t BH[2][2] = {{1, 2}, {2, 1}};
    for (int ti = 0; ti < 2; ti++)
        for (int bh = 0; bh < 2; bh++)
            for (int causal = 0; causal <= 1; causal++) {
                CT_FRAME {
                    int64_t B = BH[bh][0], H = BH[bh][1], T = Ts[ti], D = 3;
                    ct_tensor *in[3] = {bhtd_leaf(CT_DTYPE_F64, B, H, T, D), bhtd_leaf(CT_DTYPE_F64, B, H, T, D),
                                        bhtd_leaf(CT_DTYPE_F64, B, H, T, D)};
                    char what[96];
                    snprintf(what, sizeof what, "attention B %lld H %lld T %lld causal %d", (long long)B,
                             (long long)H, (long long)T, causal);
                    gradcheck_ok(attention_fn, 3, in, &(nn_case){.causal = causal}, what);
                    gradcheck_ok(attention_fn, 3, in, &(nn_case){.causal = causal, .scale = 0.7}, what);
                }
            }
    CT_FRAME {
        /* T = 2 queries over S = 5 keys (causal: the last queries of the window),
         * contiguous q, Dv = 2 */
        ct_tensor *in[3] = {leaf(CT_DTYPE_F64, CT_SHAPE(1, 2, 2, 3)), bhtd_leaf(CT_DTYPE_F64, 1, 2, 5, 3),
                            leaf(CT_DTYPE_F64, CT_SHAPE(1, 2, 5, 2))};
        gradcheck_ok(attention_fn, 3, in, &(nn_case){.causal = true}, "attention T 2 S 5 causal");
        gradcheck_ok(attention_fn, 3, in, &(nn_case){.causal = false}, "attention T 2 S 5");
        /* only q requires grad */
        ct_tensor *kc = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(1, 2, 5, 3), 0, 1);
        ct_tensor *vc = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(1, 2, 5, 3), 0, 1);
        ct_tensor *q = bhtd_leaf(CT_DTYPE_F64, 1, 2, 5, 3);
        gradcheck_ok(attention_fn, 3, (ct_tensor *[]){q, kc, vc}, &(nn_case){.causal = true}, "attention q only");
        cr_assert_null(kc->grad);
    }
}

Test(ops_nn, attention_forward_is_the_kernel)
{
    ct_set_seed(62);
    CT_FRAME {
        ct_tensor *q = bhtd_leaf(CT_DTYPE_F32, 2, 2, 7, 4), *k = bhtd_leaf(CT_DTYPE_F32, 2, 2, 7, 4);
        ct_tensor *v = bhtd_leaf(CT_DTYPE_F32, 2, 2, 7, 4);
        ct_tensor *y = ct_attention(q, k, v, true, 0);
        same_bits(y, ct_kernel_attention(q, k, v, true, 0, NULL), "attention");
        cr_assert(y->grad_fn && !strcmp(ct_node_op(y->grad_fn), "attention"));
        cr_assert_eq(y->shape[0], 2);
        cr_assert_eq(y->shape[2], 7);
        cr_assert(ct_tensor_is_contiguous(y));
    }
}

/* ---- attention on a fused qkv ------------------------------------------------------------------ */

static ct_tensor *attention_qkv_fn(ct_tensor *const *in, void *ctx)
{
    const nn_case *c = ctx;
    return ct_attention_qkv(in[0], c->dim, c->causal, c->scale);
}

/* The composition ct_attention_qkv replaces: narrow, split heads, attention, merge. */
static ct_tensor *attention_split(ct_tensor *qkv, int64_t H, bool causal)
{
    const int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    ct_tensor *h[3];
    for (int i = 0; i < 3; i++) h[i] = ct_transpose(ct_view(ct_narrow(qkv, -1, i * C, C), CT_SHAPE(B, T, H, C / H)), 1, 2);
    return ct_reshape(ct_transpose(ct_attention(h[0], h[1], h[2], causal, 0), 1, 2), CT_SHAPE(B, T, C));
}

Test(ops_nn, attention_qkv_gradcheck)
{
    ct_set_seed(63);
    for (int causal = 0; causal <= 1; causal++)
        CT_FRAME {
            /* (B, T, 3C) = (2, 5, 3*6), 2 heads of 3; and a transposed (non-contiguous) qkv */
            ct_tensor *x = leaf(CT_DTYPE_F64, CT_SHAPE(2, 5, 18));
            gradcheck_ok(attention_qkv_fn, 1, &x, &(nn_case){.dim = 2, .causal = causal}, "attention_qkv H 2");
            gradcheck_ok(attention_qkv_fn, 1, &x, &(nn_case){.dim = 3, .causal = causal, .scale = 0.6},
                         "attention_qkv H 3");
            ct_tensor *xt = leaf_t(CT_DTYPE_F64, CT_SHAPE(5, 2, 18), 0, 1);
            gradcheck_ok(attention_qkv_fn, 1, &xt, &(nn_case){.dim = 1, .causal = causal}, "attention_qkv strided");
        }
}

/* The fused op computes what the split composition computes, bit for bit, forward and
 * backward (every gradient element comes from the same kernel arithmetic; the split's
 * extra steps only add zeros). */
Test(ops_nn, attention_qkv_equals_split_heads)
{
    ct_set_seed(64);
    CT_FRAME {
        ct_tensor *a = leaf(CT_DTYPE_F32, CT_SHAPE(2, 70, 48)), *b = ct_tensor_clone(a);
        mark(b);
        ct_tensor *g = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(2, 70, 16), 0, 1);
        ct_tensor *ya = ct_attention_qkv(a, 4, true, 0), *yb = attention_split(b, 4, true);
        same_bits(ya, yb, "attention_qkv forward");
        cr_assert(ya->grad_fn && !strcmp(ct_node_op(ya->grad_fn), "attention_qkv"));
        cr_assert_eq(ct_backward_with(ya, g, NULL), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_backward_with(yb, g, NULL), CT_OK, "%s", ct_last_error());
        same_bits(a->grad, b->grad, "attention_qkv dqkv");
    }
}

Test(ops_nn, attention_qkv_errors)
{
    CT_FRAME {
        ct_tensor *x = leaf(CT_DTYPE_F32, CT_SHAPE(2, 5, 16));
        cr_assert_null(ct_attention_qkv(x, 2, true, 0));
        cr_assert(strstr(ct_last_error(), "attention_qkv") && strstr(ct_last_error(), "[2, 5, 16]") &&
                      strstr(ct_last_error(), "n_head = 2"),
                  "%s", ct_last_error());
        cr_assert_null(ct_attention_qkv(leaf(CT_DTYPE_F32, CT_SHAPE(5, 18)), 1, true, 0));
        cr_assert_null(ct_attention_qkv(leaf(CT_DTYPE_F32, CT_SHAPE(2, 5, 18)), 0, true, 0));
        cr_assert_null(ct_attention_qkv(NULL, 2, true, 0));
    }
}

/* ---- composed ------------------------------------------------------------------------------ */

/* A one-block transformer-like expression over (B, H, T, C) = (1, 2, 5, 4):
 *   e = embedding(W, ids); h = layernorm(e, w, b); k = rmsnorm(h, g);
 *   v = dropout(h, 0.25, fixed stream); a = attention(h, k, v, causal);
 *   loss = cross_entropy(log_softmax(a) + nothing, targets) */
typedef struct {
    ct_tensor *ids, *targets;
} block_ctx;

static ct_tensor *block_fn(ct_tensor *const *in, void *ctx)
{
    const block_ctx *c = ctx;
    ct_rng r;
    ct_rng_init(&r, 99);
    ct_tensor *e = ct_embedding(in[0], c->ids);
    ct_tensor *h = ct_layernorm(e, in[1], in[2], 1e-5);
    ct_tensor *k = ct_rmsnorm(h, in[3], 1e-6);
    ct_tensor *v = ct_dropout(h, 0.25, true, &r);
    ct_tensor *a = ct_attention(h, k, v, true, 0);
    return ct_cross_entropy(ct_log_softmax(a, -1), c->targets, IGNORE);
}

/* layernorm -> attention -> cross-entropy on a transposed (B,T,H,C) input. */
static ct_tensor *ln_attn_ce_fn(ct_tensor *const *in, void *ctx)
{
    const block_ctx *c = ctx;
    ct_tensor *h = ct_layernorm(in[0], in[1], in[2], 1e-5);
    ct_tensor *a = ct_attention(h, in[3], h, false, 0);
    return ct_cross_entropy(a, c->targets, IGNORE);
}

Test(ops_nn, composed_block_gradcheck)
{
    ct_set_seed(71);
    CT_FRAME {
        block_ctx c = {
            .ids = ids_of(CT_DTYPE_I64, CT_SHAPE(1, 2, 5), (int64_t[]){0, 3, 3, 5, 1, 2, 2, 0, 4, 5}),
            .targets = ids_of(CT_DTYPE_I64, CT_SHAPE(1, 2, 5), (int64_t[]){1, 0, IGNORE, 3, 2, 2, 1, 0, 3, IGNORE}),
        };
        ct_tensor *in[4] = {leaf(CT_DTYPE_F64, CT_SHAPE(6, 4)), leaf(CT_DTYPE_F64, CT_SHAPE(4)),
                            leaf(CT_DTYPE_F64, CT_SHAPE(4)), leaf(CT_DTYPE_F64, CT_SHAPE(4))};
        gradcheck_ok(block_fn, 4, in, &c, "embedding-layernorm-rmsnorm-dropout-attention-cross_entropy");
        ct_tensor *in2[4] = {leaf_t(CT_DTYPE_F64, CT_SHAPE(1, 5, 2, 4), 1, 2), leaf(CT_DTYPE_F64, CT_SHAPE(4)),
                             leaf(CT_DTYPE_F64, CT_SHAPE(4)), bhtd_leaf(CT_DTYPE_F64, 1, 2, 5, 4)};
        gradcheck_ok(ln_attn_ce_fn, 4, in2, &c, "layernorm-attention-cross_entropy");
    }
}

/* ---- f32 smoke ---------------------------------------------------------------------------- */

Test(ops_nn, f32_backward_gives_finite_gradients)
{
    ct_set_seed(81);
    CT_FRAME {
        ct_tensor *x = leaf(CT_DTYPE_F32, CT_SHAPE(3, 8));
        backward_random(ct_softmax(x, 0));
        backward_random(ct_log_softmax(x, 1));
        grad_finite(x, "softmax f32");

        ct_tensor *w = leaf(CT_DTYPE_F32, CT_SHAPE(8)), *b = leaf(CT_DTYPE_F32, CT_SHAPE(8));
        ct_tensor *xn = leaf(CT_DTYPE_F32, CT_SHAPE(4, 8));
        backward_random(ct_layernorm(xn, w, b, 1e-5));
        backward_random(ct_rmsnorm(xn, w, 1e-6));
        grad_finite(xn, "norm x f32");
        grad_finite(w, "norm w f32");
        grad_finite(b, "layernorm b f32");

        ct_tensor *W = leaf(CT_DTYPE_F32, CT_SHAPE(10, 8));
        backward_random(ct_embedding(W, ids_of(CT_DTYPE_I64, CT_SHAPE(5), (int64_t[]){9, 0, 9, 3, 1})));
        grad_finite(W, "embedding f32");

        ct_tensor *xd = leaf(CT_DTYPE_F32, CT_SHAPE(6, 7));
        backward_random(ct_dropout(xd, 0.1, true, NULL));
        grad_finite(xd, "dropout f32");

        /* logits of +-1e4 stay finite */
        ct_tensor *logits = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(4, 9), 0, 1e4);
        mark(logits);
        ct_tensor *loss = ct_cross_entropy(logits, ids_of(CT_DTYPE_I64, CT_SHAPE(4), (int64_t[]){0, 8, 4, IGNORE}),
                                           IGNORE);
        cr_assert(isfinite(ct_tensor_item(loss)));
        cr_assert_eq(ct_backward(loss), CT_OK, "%s", ct_last_error());
        grad_finite(logits, "cross_entropy f32 +-1e4");

        ct_tensor *q = bhtd_leaf(CT_DTYPE_F32, 2, 3, 9, 4), *k = bhtd_leaf(CT_DTYPE_F32, 2, 3, 9, 4);
        ct_tensor *v = bhtd_leaf(CT_DTYPE_F32, 2, 3, 9, 4);
        backward_random(ct_attention(q, k, v, true, 0));
        grad_finite(q, "attention q f32");
        grad_finite(k, "attention k f32");
        grad_finite(v, "attention v f32");

        /* bf16 through the whole chain */
        ct_tensor *xb = leaf(CT_DTYPE_BF16, CT_SHAPE(1, 2, 4, 8));
        ct_tensor *h = ct_layernorm(xb, NULL, NULL, 1e-5);
        ct_tensor *l = ct_cross_entropy(ct_attention(h, h, h, true, 0),
                                        ids_of(CT_DTYPE_I64, CT_SHAPE(1, 2, 4), (int64_t[]){0, 1, 2, 3, 4, 5, 6, 7}),
                                        IGNORE);
        cr_assert_eq(ct_backward(l), CT_OK, "%s", ct_last_error());
        grad_finite(xb, "bf16 layernorm-attention-cross_entropy");
    }
}

/* ---- misuse --------------------------------------------------------------------------------- */

Test(ops_nn, misuse_names_the_op_and_shapes)
{
    CT_FRAME {
        ct_tensor *x = leaf(CT_DTYPE_F64, CT_SHAPE(2, 3));
        cr_assert_null(ct_softmax(x, 2));
        error_names("softmax dim", "softmax", "f64[2, 3]", "dim 2");
        cr_assert_null(ct_log_softmax(ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2)), 0));
        error_names("log_softmax dtype", "log_softmax", "i64[2]", NULL);

        cr_assert_null(ct_layernorm(x, leaf(CT_DTYPE_F64, CT_SHAPE(4)), NULL, 1e-5));
        error_names("layernorm w", "layernorm", "f64[4]", "f64[2, 3]");
        cr_assert_null(ct_layernorm(x, NULL, leaf(CT_DTYPE_F64, CT_SHAPE(2)), 1e-5));
        error_names("layernorm b", "layernorm", "f64[2]", "f64[2, 3]");
        cr_assert_null(ct_rmsnorm(x, leaf(CT_DTYPE_F64, CT_SHAPE(3, 1)), 1e-5));
        error_names("rmsnorm w", "rmsnorm", "f64[3, 1]", "f64[2, 3]");
        cr_assert_null(ct_layernorm(x, NULL, NULL, -1));
        error_names("layernorm eps", "layernorm", "eps", NULL);

        cr_assert_null(ct_embedding(leaf(CT_DTYPE_F64, CT_SHAPE(4)), ids_of(CT_DTYPE_I64, CT_SHAPE(2), (int64_t[]){0, 1})));
        error_names("embedding table", "embedding", "f64[4]", NULL);
        cr_assert_null(ct_embedding(leaf(CT_DTYPE_F64, CT_SHAPE(4, 2)), ids_of(CT_DTYPE_I64, CT_SHAPE(2), (int64_t[]){0, 4})));
        error_names("embedding id", "embedding", "4", NULL);
        cr_assert_null(ct_embedding(leaf(CT_DTYPE_F64, CT_SHAPE(4, 2)), x));
        error_names("embedding ids dtype", "embedding", "f64[2, 3]", "f64[4, 2]");

        cr_assert_null(ct_dropout(x, 1.5, true, NULL));
        error_names("dropout p", "dropout", "1.5", "f64[2, 3]");
        cr_assert_null(ct_dropout(x, NAN, false, NULL));
        error_names("dropout NaN p in eval", "dropout", "f64[2, 3]", NULL);

        cr_assert_null(ct_cross_entropy(x, ids_of(CT_DTYPE_I64, CT_SHAPE(3), (int64_t[]){0, 1, 2}), IGNORE));
        error_names("cross_entropy targets", "cross_entropy", "i64[3]", "f64[2, 3]");
        cr_assert_null(ct_cross_entropy(x, ids_of(CT_DTYPE_I64, CT_SHAPE(2), (int64_t[]){0, 3}), IGNORE));
        error_names("cross_entropy target value", "cross_entropy", "3", NULL);

        ct_tensor *q = leaf(CT_DTYPE_F64, CT_SHAPE(1, 2, 5, 3)), *k = leaf(CT_DTYPE_F64, CT_SHAPE(1, 2, 5, 4));
        cr_assert_null(ct_attention(q, k, k, false, 0));
        error_names("attention shapes", "attention", "f64[1, 2, 5, 3]", "f64[1, 2, 5, 4]");
        cr_assert_null(ct_attention(q, q, ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(1, 2, 5, 3), 0, 1), false, 0));
        error_names("attention dtypes", "attention", "f32[1, 2, 5, 3]", NULL);
        cr_assert_null(ct_attention(x, x, x, false, 0));
        error_names("attention rank", "attention", "f64[2, 3]", NULL);

        /* a NULL input keeps the earlier message */
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_softmax(NULL, 0));
        cr_assert_null(ct_layernorm(NULL, NULL, NULL, 1e-5));
        cr_assert_null(ct_rmsnorm(NULL, NULL, 1e-5));
        cr_assert_null(ct_embedding(NULL, x));
        cr_assert_null(ct_dropout(NULL, 0.5, true, NULL));
        cr_assert_null(ct_cross_entropy(x, NULL, IGNORE));
        cr_assert_null(ct_attention(q, NULL, q, true, 0));
        cr_assert_str_eq(ct_last_error(), "earlier failure");
        cr_assert_null(x->grad_fn, "nothing recorded on failure");
    }
}

/* ---- lifetime ------------------------------------------------------------------------------ */

Test(ops_nn, graphs_and_saved_tensors_are_freed)
{
    ct_set_seed(91);
    int64_t before = ct_storage_live_bytes();
    ct_tensor *W = NULL, *w = NULL;
    CT_FRAME {
        W = ct_tensor_retain(leaf(CT_DTYPE_F32, CT_SHAPE(6, 4)));
        w = ct_tensor_retain(leaf(CT_DTYPE_F32, CT_SHAPE(4)));
    }
    block_ctx c;
    for (int i = 0; i < 50; i++) {
        CT_FRAME {
            c.ids = ids_of(CT_DTYPE_I64, CT_SHAPE(1, 2, 5), (int64_t[]){0, 3, 3, 5, 1, 2, 2, 0, 4, 5});
            c.targets = ids_of(CT_DTYPE_I64, CT_SHAPE(1, 2, 5), (int64_t[]){1, 0, IGNORE, 3, 2, 2, 1, 0, 3, 1});
            ct_tensor *L = block_fn((ct_tensor *[]){W, w, w, w}, &c);
            cr_assert_not_null(L, "%s", ct_last_error());
            if (i % 2) cr_assert_eq(ct_backward(L), CT_OK, "%s", ct_last_error());
        }
    }
    grad_finite(W, "repeated block W");
    ct_tensor_release(W);
    ct_tensor_release(w);
    cr_assert_eq(ct_storage_live_bytes(), before);
}
