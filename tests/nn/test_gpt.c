/* The GPT module: HuggingFace GPT-2 names and shapes, GPT-2 initialisation,
 * the loss at initialisation (ln V for near-uniform logits), grad-ready hooks
 * on a real model, learning a fixed batch, save/load and sampling. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "core/philox.h"
#include "nn/gpt.h"
#include "optim/optimizer.h"

static const ct_gpt_config tiny = {.vocab_size = 32, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 16};

Test(gpt, hf_gpt2_names_and_shapes)
{
    ct_set_seed(1);
    ct_gpt *m = ct_gpt_new(&tiny);
    cr_assert_not_null(m, "%s", ct_last_error());
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, true, &l), CT_OK);
    /* GPT2Model's state dict, in HF's order */
    const char *per_block[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                               "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                               "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    cr_assert_eq(l.n, 2 + 2 * 12 + 2);
    cr_assert_str_eq(l.names[0], "wte.weight");
    cr_assert_str_eq(l.names[1], "wpe.weight");
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 12; i++) {
            char want[64];
            snprintf(want, sizeof want, "h.%d.%s", b, per_block[i]);
            cr_assert_str_eq(l.names[2 + 12 * b + i], want);
        }
    cr_assert_str_eq(l.names[26], "ln_f.weight");
    cr_assert_str_eq(l.names[27], "ln_f.bias");
    ct_param_list_free(&l);
    /* Conv1D layout: [in, out] */
    ct_tensor *w = ct_module_find(&m->base, "h.1.attn.c_attn.weight");
    cr_assert_eq(w->shape[0], 16);
    cr_assert_eq(w->shape[1], 48);
    cr_assert_eq(ct_module_find(&m->base, "h.0.mlp.c_proj.weight")->shape[0], 64);
    /* V*C + T*C + L*(12 C^2 + 13 C) + 2C */
    cr_assert_eq(ct_module_num_params(&m->base), 32 * 16 + 16 * 16 + 2 * (12 * 16 * 16 + 13 * 16) + 2 * 16);
    ct_module_free(&m->base);
}

static double std_of(const ct_tensor *t)
{
    double s = 0, s2 = 0;
    int64_t n = ct_tensor_numel(t);
    const float *p = ct_tensor_data(t);
    for (int64_t i = 0; i < n; i++) s += p[i], s2 += (double)p[i] * p[i];
    return sqrt(s2 / n - (s / n) * (s / n));
}

Test(gpt, gpt2_initialisation)
{
    ct_set_seed(2);
    ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 512, .block_size = 64, .n_layer = 8, .n_head = 4,
                                            .n_embd = 128});
    cr_assert_not_null(m);
    cr_assert_float_eq(std_of(ct_module_find(&m->base, "wte.weight")), 0.02, 0.001);
    cr_assert_float_eq(std_of(ct_module_find(&m->base, "h.3.mlp.c_fc.weight")), 0.02, 0.001);
    double proj = 0.02 / sqrt(2.0 * 8);
    cr_assert_float_eq(std_of(ct_module_find(&m->base, "h.3.attn.c_proj.weight")), proj, proj * 0.05);
    cr_assert_float_eq(std_of(ct_module_find(&m->base, "h.7.mlp.c_proj.weight")), proj, proj * 0.05);
    cr_assert_eq(ct_tensor_get(ct_module_find(&m->base, "ln_f.weight"), (int64_t[]){3}), 1.0);
    cr_assert_eq(ct_tensor_get(ct_module_find(&m->base, "h.0.attn.c_attn.bias"), (int64_t[]){5}), 0.0);
    ct_module_free(&m->base);
}

Test(gpt, forward_shapes_loss_at_init_and_errors)
{
    ct_set_seed(3);
    ct_gpt *m = ct_gpt_new(&tiny);
    CT_FRAME {
        ct_tensor *idx = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(3, 16));
        ct_tensor *tgt = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(3, 16));
        for (int i = 0; i < 48; i++) {
            ((int64_t *)ct_tensor_data(idx))[i] = (i * 7) % 32;
            ((int64_t *)ct_tensor_data(tgt))[i] = (i * 5 + 1) % 32;
        }
        ct_tensor *logits = ct_gpt_forward(m, idx);
        cr_assert_not_null(logits, "%s", ct_last_error());
        cr_assert_eq(logits->ndim, 3);
        cr_assert_eq(logits->shape[2], 32);
        /* small init: logits near 0, so the loss is near ln 32 */
        double loss = ct_tensor_item(ct_gpt_loss(m, idx, tgt));
        cr_assert_float_eq(loss, log(32.0), 0.05, "loss %f", loss);
        /* causality: changing the last token changes no earlier logits */
        ct_tensor *idx2 = ct_tensor_clone(idx);
        ((int64_t *)ct_tensor_data(idx2))[15] = 3;
        ct_tensor *l2 = ct_gpt_forward(m, idx2);
        for (int t = 0; t < 15; t++)
            cr_assert_eq(ct_tensor_get(logits, (int64_t[]){0, t, 4}), ct_tensor_get(l2, (int64_t[]){0, t, 4}));
        cr_assert_neq(ct_tensor_get(logits, (int64_t[]){0, 15, 4}), ct_tensor_get(l2, (int64_t[]){0, 15, 4}));
        cr_assert_null(ct_gpt_forward(m, ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(1, 17))));
        cr_assert(strstr(ct_last_error(), "block_size 16"), "%s", ct_last_error());
        ct_tensor *bad = ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(1, 4), 40);
        cr_assert_null(ct_gpt_forward(m, bad));
        cr_assert(strstr(ct_last_error(), "40"), "%s", ct_last_error());
    }
    cr_assert_null(ct_gpt_new(&(ct_gpt_config){.n_embd = 10, .n_head = 3}));
    cr_assert(strstr(ct_last_error(), "divisible"), "%s", ct_last_error());
    ct_module_free(&m->base);
}

typedef struct {
    ct_param_list *params;
    int calls[64];
    int order[64];
    int n;
} hook_log;

static ct_status record(ct_tensor *leaf, void *data)
{
    hook_log *h = data;
    for (int i = 0; i < h->params->n; i++)
        if (h->params->tensors[i] == leaf) {
            h->calls[i]++;
            h->order[h->n++] = i;
        }
    return leaf->grad ? CT_OK : ct_error_set(CT_ERR_INTERNAL, "hook without a gradient");
}

Test(gpt, grad_ready_hooks_fire_once_per_parameter_in_reverse_order)
{
    ct_set_seed(4);
    ct_gpt *m = ct_gpt_new(&tiny);
    ct_param_list l;
    ct_module_named_tensors(&m->base, false, &l);
    hook_log h = {.params = &l};
    for (int i = 0; i < l.n; i++) ct_tensor_on_grad_ready(l.tensors[i], record, &h);
    for (int round = 0; round < 2; round++) {
        memset(h.calls, 0, sizeof h.calls);
        h.n = 0;
        CT_FRAME {
            ct_tensor *idx = ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(2, 8), 5);
            cr_assert_eq(ct_backward(ct_gpt_loss(m, idx, idx)), CT_OK, "%s", ct_last_error());
        }
        for (int i = 0; i < l.n; i++) cr_assert_eq(h.calls[i], 1, "%s fired %d times", l.names[i], h.calls[i]);
        /* the final LayerNorm is ready first; the tied wte (used by the
         * embedding and the lm head) only once the embedding's backward ran,
         * after every block; block 1 is ready before block 0 */
        cr_assert(!strncmp(l.names[h.order[0]], "ln_f", 4), "first: %s", l.names[h.order[0]]);
        int pos_wte = -1, last_h0 = -1, first_h1 = 99;
        for (int k = 0; k < h.n; k++) {
            const char *nm = l.names[h.order[k]];
            if (!strcmp(nm, "wte.weight")) pos_wte = k;
            if (!strncmp(nm, "h.0.", 4)) last_h0 = k;
            if (!strncmp(nm, "h.1.", 4) && k < first_h1) first_h1 = k;
        }
        cr_assert_gt(pos_wte, last_h0);
        cr_assert_lt(first_h1, last_h0);
        ct_module_zero_grad(&m->base);
    }
    ct_param_list_free(&l);
    ct_module_free(&m->base);
}

Test(gpt, learns_a_fixed_batch)
{
    ct_set_seed(5);
    ct_gpt *m = ct_gpt_new(&tiny);
    ct_param_list l;
    ct_module_named_tensors(&m->base, false, &l);
    ct_optimizer *opt = ct_adamw_new(l.n, l.tensors, &(ct_adamw_config){.lr = 1e-2});
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) CT_FRAME {
            ct_tensor *idx = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(2, 16));
            ct_tensor *tgt = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(2, 16));
            for (int i = 0; i < 32; i++) {
                ((int64_t *)ct_tensor_data(idx))[i] = (i * 3) % 32;
                ((int64_t *)ct_tensor_data(tgt))[i] = (i * 3 + 3) % 32;
            }
            ct_tensor *loss = ct_gpt_loss(m, idx, tgt);
            cr_assert_eq(ct_backward(loss), CT_OK, "%s", ct_last_error());
            cr_assert_eq(ct_optimizer_step(opt), CT_OK, "%s", ct_last_error());
            ct_optimizer_zero_grad(opt);
            if (step == 0) first = ct_tensor_item(loss);
            last = ct_tensor_item(loss);
        }
    cr_assert_lt(last, 0.1 * first, "loss %f -> %f", first, last);
    ct_optimizer_free(opt);
    ct_param_list_free(&l);
    ct_module_free(&m->base);
}

Test(gpt, save_load_and_sampling)
{
    char dir[] = "/tmp/ct_gpt_XXXXXX", path[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ct_set_seed(6);
    ct_gpt *a = ct_gpt_new(&tiny);
    ct_set_seed(7);
    ct_gpt *b = ct_gpt_new(&tiny);
    cr_assert_eq(ct_module_save(&a->base, path, 0, NULL, NULL), CT_OK, "%s", ct_last_error());
    cr_assert_eq(ct_module_load(&b->base, path, true, NULL), CT_OK, "%s", ct_last_error());
    int64_t prompt[3] = {1, 2, 3}, out_a[23], out_b[23];
    ct_rng ra, rb;
    ct_rng_init(&ra, 9);
    ct_rng_init(&rb, 9);
    ct_generate_config g = {.max_new_tokens = 20, .temperature = 1.0, .top_k = 5};
    cr_assert_eq(ct_gpt_generate(a, prompt, 3, &g, &ra, out_a), CT_OK, "%s", ct_last_error());
    cr_assert_eq(ct_gpt_generate(b, prompt, 3, &g, &rb, out_b), CT_OK);
    cr_assert_eq(memcmp(out_a, out_b, sizeof out_a), 0, "same weights and seed: same sample");
    for (int i = 0; i < 23; i++) cr_assert(out_a[i] >= 0 && out_a[i] < 32);
    /* top_k = 1 is greedy: the argmax of the last position's logits */
    ct_generate_config greedy = {.max_new_tokens = 1, .temperature = 1.0, .top_k = 1};
    cr_assert_eq(ct_gpt_generate(a, prompt, 3, &greedy, &ra, out_a), CT_OK);
    CT_FRAME {
        ct_tensor *logits = ct_gpt_forward(a, ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, 3), prompt));
        int best = 0;
        for (int v = 1; v < 32; v++)
            if (ct_tensor_get(logits, (int64_t[]){0, 2, v}) > ct_tensor_get(logits, (int64_t[]){0, 2, best})) best = v;
        cr_assert_eq(out_a[3], best);
    }
    cr_assert(a->base.training, "training mode restored after sampling");
    cr_assert_neq(ct_gpt_generate(a, (int64_t[]){99}, 1, &g, NULL, out_a), CT_OK);
    cr_assert(strstr(ct_last_error(), "99"), "%s", ct_last_error());
    unlink(path);
    rmdir(dir);
    ct_module_free(&a->base);
    ct_module_free(&b->base);
}

/* The whole model's gradient, every parameter, against finite differences: a
 * tiny GPT in f64. */
typedef struct {
    ct_gpt *m;
    ct_tensor *idx, *tgt;
} gpt_ctx;

static ct_tensor *gpt_loss_fn(ct_tensor *const *in, void *ctx)
{
    (void)in; /* the inputs are the model's own parameters, perturbed in place */
    gpt_ctx *c = ctx;
    return ct_gpt_loss(c->m, c->idx, c->tgt);
}

Test(gpt, whole_model_gradcheck_f64, .timeout = 120)
{
    ct_set_seed(8);
    ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 7, .block_size = 5, .n_layer = 2, .n_head = 2, .n_embd = 4,
                                            .dtype = CT_DTYPE_F64});
    cr_assert_not_null(m, "%s", ct_last_error());
    /* larger weights than GPT-2's 0.02 so every path carries signal */
    ct_param_list l;
    ct_module_named_tensors(&m->base, false, &l);
    for (int i = 0; i < l.n; i++) ct_init_normal_(l.tensors[i], 0.5);
    CT_FRAME {
        gpt_ctx c = {m, ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 5), (int64_t[]){1, 3, 0, 6, 2, 5, 5, 4, 1, 0}),
                     ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 5), (int64_t[]){3, 0, 6, 2, 4, 5, 4, 1, 0, 2})};
        cr_assert_eq(ct_gradcheck(gpt_loss_fn, l.n, l.tensors, &c, NULL), CT_OK, "%s", ct_last_error());
    }
    ct_param_list_free(&l);
    ct_module_free(&m->base);
}
