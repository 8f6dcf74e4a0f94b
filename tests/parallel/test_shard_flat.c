/* Tests for parallel/shard_flat.c and core's ct_tensor_rebind: a unit's parameters moved
 * into one flat buffer keep their values and their identity, and a GPT whose
 * parameters were flattened trains exactly (bit for bit) like one that was not. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "core/philox.h"
#include "parallel/shard_flat.h"
#include "nn/gpt.h"
#include "optim/optimizer.h"

static ct_gpt *small_gpt(void)
{
    ct_set_seed(11);
    ct_gpt_config cfg = {.vocab_size = 61, .block_size = 13, .n_layer = 2, .n_head = 3, .n_embd = 24};
    ct_gpt *m = ct_gpt_new(&cfg);
    cr_assert_not_null(m, "%s", ct_last_error());
    return m;
}

/* The plan with one unit per Block, for world ranks. */
static void block_plan(ct_gpt *m, int world, ct_shard_plan *p)
{
    const char *cls[] = {"Block"};
    cr_assert_eq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_TRANSFORMER, .classes = cls, .nclasses = 1},
                                     world, p),
                 CT_OK, "%s", ct_last_error());
}

/* make(unit) for every unit of p, each result retained into out (at most 8 units). */
static void unit_buffers(const ct_shard_plan *p, ct_tensor *(*make)(const ct_shard_unit *), ct_tensor **out)
{
    cr_assert(p->nunits <= 8);
    for (int u = 0; u < p->nunits; u++) {
        CT_FRAME {
            ct_tensor *t = make(&p->units[u]);
            cr_assert_not_null(t, "%s", ct_last_error());
            out[u] = ct_tensor_retain(t);
        }
    }
}

Test(parallel_shard_flat, rebind_moves_values_and_keeps_the_tensor)
{
    CT_FRAME {
        ct_tensor *t = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(3, 4), 0, 1);
        ct_tensor *before = ct_tensor_clone(t);
        ct_tensor *base = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(20));
        cr_assert_eq(ct_tensor_rebind(t, base, 5), CT_OK, "%s", ct_last_error());
        cr_expect_eq(t->storage, base->storage);
        cr_expect_eq(t->offset, 5);
        cr_expect(ct_tensor_is_contiguous(t));
        cr_expect_eq(memcmp(ct_tensor_data(t), ct_tensor_data(before), 12 * sizeof(float)), 0);
        const float *b = ct_tensor_data(base);
        for (int i = 0; i < 20; i++) {
            float want = i >= 5 && i < 17 ? ((const float *)ct_tensor_data(before))[i - 5] : 0.0f;
            cr_expect_eq(b[i], want, "base[%d]", i);
        }
        /* a write through t is a write into the base */
        cr_assert_eq(ct_tensor_fill_(t, 2), CT_OK);
        cr_expect_eq(b[5], 2.0f);
        cr_expect_eq(b[4], 0.0f);
        /* a transposed (non-contiguous) source rebinds with its logical order */
        ct_tensor *src = ct_tensor_transpose(ct_tensor_clone(before), 0, 1); /* (4, 3) */
        ct_tensor *want = ct_tensor_contiguous(src);
        cr_assert_eq(ct_tensor_rebind(src, base, 0), CT_OK, "%s", ct_last_error());
        cr_expect_eq(memcmp(ct_tensor_data(src), ct_tensor_data(want), 12 * sizeof(float)), 0);
        /* errors: dtype, room, offset */
        ct_tensor *d = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(3));
        cr_expect_neq(ct_tensor_rebind(d, base, 0), CT_OK);
        cr_expect(strstr(ct_last_error(), "tensor_rebind") && strstr(ct_last_error(), "f64"), "%s", ct_last_error());
        cr_expect_neq(ct_tensor_rebind(t, base, 9), CT_OK, "12 elements do not fit at 9 of 20");
        cr_expect_neq(ct_tensor_rebind(t, base, -1), CT_OK);
        cr_expect_eq(t->offset, 5, "a refused rebind changes nothing");
    }
}

Test(parallel_shard_flat, a_unit_becomes_one_padded_buffer)
{
    ct_gpt *m = small_gpt();
    ct_shard_plan p;
    block_plan(m, 4, &p);
    CT_FRAME {
        for (int u = 0; u < p.nunits; u++) {
            const ct_shard_unit *x = &p.units[u];
            ct_tensor *saved[32];
            cr_assert(x->nparams <= 32);
            for (int i = 0; i < x->nparams; i++) saved[i] = ct_tensor_clone(x->params[i].param);
            ct_tensor *flat = ct_shard_unit_flatten(x);
            cr_assert_not_null(flat, "%s", ct_last_error());
            cr_expect_eq(ct_tensor_numel(flat), x->padded);
            for (int i = 0; i < x->nparams; i++) {
                ct_tensor *q = x->params[i].param;
                cr_expect_eq(q->storage, flat->storage, "%s lives in the flat buffer", x->params[i].name);
                cr_expect_eq(q->offset, x->params[i].offset);
                cr_expect_eq(memcmp(ct_tensor_data(q), ct_tensor_data(saved[i]), ct_tensor_nbytes(q)), 0,
                             "%s kept its values", x->params[i].name);
                cr_expect(q->requires_grad);
            }
            const float *f = ct_tensor_data(flat);
            for (int64_t e = x->numel; e < x->padded; e++) cr_expect_eq(f[e], 0.0f, "padding element %lld", (long long)e);
            cr_expect_eq(ct_module_find(&m->base, x->params[0].name), x->params[0].param, "the module holds the same tensor");
        }
    }
    ct_shard_plan_free(&p);
    ct_module_free(&m->base);
}

/* Two steps of forward, backward and AdamW; the losses and the parameters after. */
static void train(ct_gpt *m, double loss[2], ct_tensor **params_out, int *n_out)
{
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    ct_optimizer *opt = ct_adamw_new(l.n, l.tensors, &(ct_adamw_config){.lr = 1e-2, .weight_decay = 0.1});
    cr_assert_not_null(opt, "%s", ct_last_error());
    for (int s = 0; s < 2; s++) {
        int64_t xd[26], yd[26];
        for (int i = 0; i < 26; i++) xd[i] = (i * 7 + s * 3) % 61, yd[i] = (i * 5 + s + 1) % 61;
        CT_FRAME {
            ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 13), xd);
            ct_tensor *y = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 13), yd);
            ct_tensor *lo = ct_gpt_loss(m, x, y);
            cr_assert_not_null(lo, "%s", ct_last_error());
            loss[s] = ct_tensor_item(lo);
            cr_assert_eq(ct_backward(lo), CT_OK, "%s", ct_last_error());
            cr_assert_eq(ct_optimizer_step(opt), CT_OK, "%s", ct_last_error());
            ct_optimizer_zero_grad(opt);
        }
    }
    for (int i = 0; i < l.n; i++) params_out[i] = ct_tensor_retain(ct_tensor_clone(l.tensors[i]));
    *n_out = l.n;
    ct_optimizer_free(opt);
    ct_param_list_free(&l);
}

Test(parallel_shard_flat, a_flattened_gpt_trains_bit_for_bit_like_the_original)
{
    ct_gpt *a = small_gpt(), *b = small_gpt();
    ct_shard_plan p;
    block_plan(b, 3, &p);
    ct_tensor *flats[8];
    unit_buffers(&p, ct_shard_unit_flatten, flats);
    double la[2], lb[2];
    ct_tensor *pa[64], *pb[64];
    int na, nb;
    train(a, la, pa, &na);
    train(b, lb, pb, &nb);
    cr_assert_eq(na, nb);
    for (int s = 0; s < 2; s++) cr_expect_eq(la[s], lb[s], "step %d loss %.17g vs %.17g", s, la[s], lb[s]);
    for (int i = 0; i < na; i++) {
        cr_expect_eq(memcmp(ct_tensor_data(pa[i]), ct_tensor_data(pb[i]), ct_tensor_nbytes(pa[i])), 0, "parameter %d", i);
        ct_tensor_release(pa[i]), ct_tensor_release(pb[i]);
    }
    /* the flat buffers saw the optimizer's updates: they are the parameters' storage */
    cr_expect_eq(p.units[0].params[0].param->storage, flats[0]->storage);
    for (int u = 0; u < p.nunits; u++) ct_tensor_release(flats[u]);
    ct_shard_plan_free(&p);
    ct_module_free(&a->base);
    ct_module_free(&b->base);
}

/* One forward and backward of the same batch. */
static void backward_once(ct_gpt *m)
{
    int64_t xd[26], yd[26];
    for (int i = 0; i < 26; i++) xd[i] = (i * 7 + 3) % 61, yd[i] = (i * 5 + 1) % 61;
    CT_FRAME {
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 13), xd);
        ct_tensor *y = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 13), yd);
        ct_tensor *lo = ct_gpt_loss(m, x, y);
        cr_assert_not_null(lo, "%s", ct_last_error());
        cr_assert_eq(ct_backward(lo), CT_OK, "%s", ct_last_error());
    }
}

/* Each parameter's grad in a equals factor x b's: exactly for factor 1, else to within
 * 1e-5 of the tensor's largest element (a second backward adds each contribution
 * again: ((g1 + g2) + g1) + g2 for the tied wte, which rounds unlike 2 (g1 + g2)). */
static void expect_same_grads(ct_gpt *a, ct_gpt *b, double factor)
{
    ct_param_list la, lb;
    cr_assert_eq(ct_module_named_tensors(&a->base, false, &la), CT_OK);
    cr_assert_eq(ct_module_named_tensors(&b->base, false, &lb), CT_OK);
    for (int i = 0; i < la.n; i++) {
        cr_assert_not_null(la.tensors[i]->grad, "%s has a grad", la.names[i]);
        cr_assert_not_null(lb.tensors[i]->grad);
        CT_FRAME {
            ct_tensor *ga = ct_tensor_contiguous(la.tensors[i]->grad), *gb = ct_tensor_contiguous(lb.tensors[i]->grad);
            const float *x = ct_tensor_data(ga), *y = ct_tensor_data(gb);
            double big = 0;
            for (int64_t e = 0; e < ct_tensor_numel(gb); e++) big = fmax(big, fabs(factor * y[e]));
            for (int64_t e = 0; e < ct_tensor_numel(ga); e++)
                cr_assert(factor == 1 ? x[e] == y[e] : fabs(x[e] - factor * y[e]) <= 1e-5 * big, "%s[%lld]: %.9g vs %.9g", la.names[i],
                          (long long)e, x[e], factor * y[e]);
        }
    }
    ct_param_list_free(&la);
    ct_param_list_free(&lb);
}

Test(parallel_shard_flat, gradients_accumulate_in_the_flat_buffer)
{
    ct_gpt *a = small_gpt(), *b = small_gpt();
    ct_shard_plan p;
    block_plan(a, 2, &p);
    ct_tensor *grads[8];
    unit_buffers(&p, ct_shard_unit_flat_grads, grads);
    for (int u = 0; u < p.nunits; u++) {
        for (int i = 0; i < p.units[u].nparams; i++) {
            const ct_tensor *q = p.units[u].params[i].param;
            cr_expect(q->grad && q->grad->storage == grads[u]->storage && q->grad->offset == p.units[u].params[i].offset);
        }
    }
    backward_once(a);
    backward_once(b);
    expect_same_grads(a, b, 1.0);
    for (int u = 0; u < p.nunits; u++) {
        for (int i = 0; i < p.units[u].nparams; i++)
            cr_expect_eq(p.units[u].params[i].param->grad->storage, grads[u]->storage, "backward kept the view");
        const float *f = ct_tensor_data(grads[u]);
        for (int64_t e = p.units[u].numel; e < p.units[u].padded; e++) cr_expect_eq(f[e], 0.0f, "padding");
    }
    /* a second backward adds: twice the gradient */
    backward_once(a);
    expect_same_grads(a, b, 2.0);
    /* zeroing the buffers clears every gradient */
    for (int u = 0; u < p.nunits; u++) {
        cr_assert_eq(ct_tensor_fill_(grads[u], 0), CT_OK);
        cr_expect_eq(ct_tensor_item(ct_sum_all(ct_abs(p.units[u].params[0].param->grad))), 0.0);
        ct_tensor_release(grads[u]);
    }
    ct_shard_plan_free(&p);
    ct_module_free(&a->base);
    ct_module_free(&b->base);
}

Test(parallel_shard_flat, set_grad_checks_its_arguments)
{
    CT_FRAME {
        ct_tensor *w = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3));
        ct_tensor *g = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 3));
        cr_expect_neq(ct_tensor_set_grad(w, g), CT_OK, "w does not require grad");
        cr_expect(strstr(ct_last_error(), "not a leaf that requires grad"), "%s", ct_last_error());
        cr_assert_eq(ct_tensor_set_requires_grad(w, true), CT_OK);
        cr_expect_neq(ct_tensor_set_grad(w, ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3, 2))), CT_OK);
        cr_expect(strstr(ct_last_error(), "f32[3, 2]") && strstr(ct_last_error(), "same shape"), "%s", ct_last_error());
        cr_expect_neq(ct_tensor_set_grad(w, ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(2, 3))), CT_OK);
        cr_assert_eq(ct_tensor_set_grad(w, g), CT_OK, "%s", ct_last_error());
        cr_expect_eq(w->grad, g);
        /* backward adds into it */
        ct_tensor *loss = ct_sum_all(ct_mul(w, w));
        cr_assert_eq(ct_backward(loss), CT_OK, "%s", ct_last_error());
        cr_expect_eq(w->grad, g, "the same tensor");
        cr_expect_eq(((const float *)ct_tensor_data(g))[0], 1.0f, "1 + d(w^2)/dw at 0 = 1");
    }
}
