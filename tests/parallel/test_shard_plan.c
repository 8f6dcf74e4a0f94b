/* Tests for parallel/shard_plan.c: units from the wrap policies on the GPT, the flat
 * layout, the padding to the world size and each rank's slice. Expected units are
 * written out from the GPT's structure (wte, wpe, h.{i}.*, ln_f) and its sizes
 * computed by hand from the config. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "parallel/shard_plan.h"
#include "nn/gpt.h"

/* vocab 64, block 16, 2 layers, width 24 (odd sizes on purpose: nothing divides). */
static ct_gpt *small_gpt(void)
{
    ct_set_seed(5);
    ct_gpt_config cfg = {.vocab_size = 61, .block_size = 13, .n_layer = 2, .n_head = 3, .n_embd = 24};
    ct_gpt *m = ct_gpt_new(&cfg);
    cr_assert_not_null(m, "%s", ct_last_error());
    return m;
}

/* Elements of one Block of width C: ln_1, ln_2 (2C each), c_attn (C x 3C + 3C),
 * attn.c_proj (C x C + C), c_fc (C x 4C + 4C), mlp.c_proj (4C x C + C). */
static int64_t block_numel(int64_t C) { return 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C); }

/* Checks what every plan must satisfy: offsets end to end, sizes add up, padding to
 * the world size, and the ranks' slices of each parameter tiling it in order. */
static void check_layout(const ct_shard_plan *p, const ct_module *root)
{
    int64_t total = 0;
    for (int u = 0; u < p->nunits; u++) {
        const ct_shard_unit *x = &p->units[u];
        int64_t off = 0;
        for (int i = 0; i < x->nparams; i++) {
            cr_expect_eq(x->params[i].offset, off, "unit %d param %s", u, x->params[i].name);
            cr_expect_eq(x->params[i].numel, ct_tensor_numel(x->params[i].param));
            off += x->params[i].numel;
            int64_t covered = 0;
            for (int r = 0; r < p->world; r++) {
                int64_t b, e;
                ct_shard_param_slice(x, &x->params[i], r, &b, &e);
                if (b == e) continue;
                cr_expect_eq(b, covered, "rank %d's part of %s starts where the last ended", r, x->params[i].name);
                cr_expect_eq(x->params[i].offset + b >= (int64_t)r * x->shard, true);
                cr_expect_eq(x->params[i].offset + e <= (int64_t)(r + 1) * x->shard, true);
                covered = e;
            }
            cr_expect_eq(covered, x->params[i].numel, "the ranks' parts cover %s", x->params[i].name);
        }
        cr_expect_eq(x->numel, off);
        cr_expect_eq(x->padded % p->world, 0);
        cr_expect(x->padded >= x->numel && x->padded - x->numel < p->world);
        cr_expect_eq(x->shard * p->world, x->padded);
        total += x->numel;
    }
    cr_expect_eq(total, p->numel);
    cr_expect_eq(total, ct_module_num_params(root), "every parameter in exactly one unit");
}

Test(parallel_shard_plan, transformer_wrap_one_unit_per_block_then_the_root)
{
    ct_gpt *m = small_gpt();
    const char *cls[] = {"Block"};
    ct_shard_plan p;
    cr_assert_eq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_TRANSFORMER, .classes = cls, .nclasses = 1},
                                     3, &p),
                 CT_OK, "%s", ct_last_error());
    cr_assert_eq(p.nunits, 3);
    cr_expect_str_eq(p.units[0].name, "h.0");
    cr_expect_str_eq(p.units[1].name, "h.1");
    cr_expect_str_eq(p.units[2].name, "", "the root unit is last");
    const int64_t C = 24;
    cr_expect_eq(p.units[0].numel, block_numel(C));
    cr_expect_eq(p.units[0].nparams, 12);
    cr_expect_str_eq(p.units[0].params[0].name, "h.0.ln_1.weight");
    cr_expect_str_eq(p.units[1].params[11].name, "h.1.mlp.c_proj.bias");
    /* the root: wte (61 x 24), wpe (13 x 24), ln_f (2 x 24) = 1464 + 312 + 48 */
    cr_expect_eq(p.units[2].nparams, 4);
    cr_expect_str_eq(p.units[2].params[0].name, "wte.weight");
    cr_expect_str_eq(p.units[2].params[1].name, "wpe.weight");
    cr_expect_str_eq(p.units[2].params[3].name, "ln_f.bias");
    cr_expect_eq(p.units[2].numel, 1824);
    cr_expect_eq(p.units[2].padded, 1824, "1824 = 3 x 608");
    cr_expect_eq(p.units[0].padded, (block_numel(C) + 2) / 3 * 3);
    check_layout(&p, &m->base);
    ct_shard_plan_free(&p);
    ct_module_free(&m->base);
}

Test(parallel_shard_plan, no_wrap_is_one_unit_in_registration_order)
{
    ct_gpt *m = small_gpt();
    for (int world = 1; world <= 5; world++) {
        ct_shard_plan p;
        cr_assert_eq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_NONE}, world, &p), CT_OK);
        cr_assert_eq(p.nunits, 1);
        ct_param_list l;
        cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
        cr_assert_eq(p.units[0].nparams, l.n);
        for (int i = 0; i < l.n; i++) {
            cr_expect_str_eq(p.units[0].params[i].name, l.names[i]);
            cr_expect_eq(p.units[0].params[i].param, l.tensors[i]);
        }
        ct_param_list_free(&l);
        check_layout(&p, &m->base);
        ct_shard_plan_free(&p);
    }
    ct_module_free(&m->base);
}

/* A subset (a pipeline stage's parameters): only the listed ones, in registration
 * order; a wrapped module whose parameters are all left out makes no unit. */
Test(parallel_shard_plan, a_subset_plans_only_the_listed_parameters)
{
    ct_gpt *m = small_gpt();
    ct_param_list l, only = {0};
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    only.tensors = calloc((size_t)l.n, sizeof *only.tensors);
    cr_assert_not_null(only.tensors);
    for (int i = 0; i < l.n; i++) /* the first block's parameters */
        if (!strncmp(l.names[i], "h.0.", 4)) only.tensors[only.n++] = l.tensors[i];
    cr_assert_gt(only.n, 0);
    const char *cls[] = {"Block"};
    ct_shard_plan p;
    cr_assert_eq(ct_shard_plan_build_subset(&m->base,
                                            &(ct_wrap_config){.policy = CT_WRAP_TRANSFORMER, .classes = cls, .nclasses = 1},
                                            2, &only, &p),
                 CT_OK, "%s", ct_last_error());
    cr_assert_eq(p.nunits, 1, "%d units: the other blocks' must make none", p.nunits);
    cr_assert_eq(p.units[0].nparams, only.n);
    int64_t numel = 0;
    for (int i = 0; i < only.n; i++) {
        cr_expect_eq(p.units[0].params[i].param, only.tensors[i]);
        cr_expect_eq(p.units[0].params[i].offset, numel);
        numel += ct_tensor_numel(only.tensors[i]);
    }
    cr_expect_eq(p.numel, numel);
    ct_shard_plan_free(&p);
    free(only.tensors);
    ct_param_list_free(&l);
    ct_module_free(&m->base);
}

Test(parallel_shard_plan, size_wrap_takes_subtrees_that_reach_the_minimum)
{
    ct_gpt *m = small_gpt();
    const int64_t C = 24;
    ct_shard_plan p;
    /* min = one MLP (c_fc + c_proj = 8C^2 + 5C): each MLP is a unit; what is left of a
     * block (ln_1, attn, ln_2) is smaller than that, so the blocks are not; the root
     * unit takes every attention and norm and the embeddings */
    const int64_t mlp = 8 * C * C + 5 * C;
    cr_assert_eq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_SIZE, .min_num_params = mlp}, 2, &p),
                 CT_OK, "%s", ct_last_error());
    cr_assert_eq(p.nunits, 3);
    cr_expect_str_eq(p.units[0].name, "h.0.mlp");
    cr_expect_str_eq(p.units[1].name, "h.1.mlp");
    cr_expect_eq(p.units[0].numel, mlp);
    cr_expect_str_eq(p.units[2].name, "");
    check_layout(&p, &m->base);
    ct_shard_plan_free(&p);
    /* a minimum above the whole model: only the root */
    cr_assert_eq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_SIZE, .min_num_params = 1 << 30}, 2, &p),
                 CT_OK);
    cr_expect_eq(p.nunits, 1);
    ct_shard_plan_free(&p);
    ct_module_free(&m->base);
}

static ct_module *leaf_module(const char *type, ct_tensor *w)
{
    ct_module *m = ct_module_alloc(sizeof(ct_module), type, NULL);
    cr_assert_not_null(m);
    cr_assert_eq(ct_module_add_param(m, "weight", w), CT_OK);
    return m;
}

Test(parallel_shard_plan, a_tied_weight_belongs_to_the_first_unit_that_registers_it)
{
    CT_FRAME {
        ct_tensor *shared = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(5, 3));
        ct_tensor *other = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(7));
        ct_module *root = ct_module_alloc(sizeof(ct_module), "Model", NULL);
        cr_assert_eq(ct_module_add_child(root, "a", leaf_module("Layer", shared)), CT_OK);
        ct_module *b = leaf_module("Layer", other);
        cr_assert_eq(ct_module_add_param(b, "tied", shared), CT_OK);
        cr_assert_eq(ct_module_add_child(root, "b", b), CT_OK);
        const char *cls[] = {"Layer"};
        ct_shard_plan p;
        cr_assert_eq(ct_shard_plan_build(root, &(ct_wrap_config){.policy = CT_WRAP_TRANSFORMER, .classes = cls, .nclasses = 1},
                                         4, &p),
                     CT_OK, "%s", ct_last_error());
        cr_assert_eq(p.nunits, 2, "the root unit has nothing of its own and is dropped");
        cr_expect(p.units[0].nparams == 1 && p.units[0].params[0].param == shared);
        cr_expect(p.units[1].nparams == 1 && p.units[1].params[0].param == other);
        cr_expect_eq(p.units[1].padded, 8);
        cr_expect_eq(p.units[1].shard, 2);
        /* rank 3 owns elements 6..8 of a 7-element unit: element 6 and one of padding */
        int64_t lo, hi;
        ct_shard_param_slice(&p.units[1], &p.units[1].params[0], 3, &lo, &hi);
        cr_expect(lo == 6 && hi == 7);
        check_layout(&p, root);
        ct_shard_plan_free(&p);
        ct_module_free(root);
    }
}

Test(parallel_shard_plan, bad_settings_are_errors)
{
    ct_gpt *m = small_gpt();
    ct_shard_plan p;
    const char *typo[] = {"GPT2Block"};
    cr_expect_neq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_TRANSFORMER, .classes = typo, .nclasses = 1},
                                      2, &p),
                  CT_OK);
    cr_expect(strstr(ct_last_error(), "names class 'GPT2Block', but the model has no module of that type"), "%s",
              ct_last_error());
    cr_expect_neq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_TRANSFORMER}, 2, &p), CT_OK);
    cr_expect(strstr(ct_last_error(), "needs the module classes"), "%s", ct_last_error());
    cr_expect_neq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_SIZE}, 2, &p), CT_OK);
    cr_expect(strstr(ct_last_error(), "min_num_params 0 is not >= 1"), "%s", ct_last_error());
    cr_expect_neq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = CT_WRAP_NONE}, 0, &p), CT_OK);
    cr_expect(strstr(ct_last_error(), "world size 0"), "%s", ct_last_error());
    cr_expect_neq(ct_shard_plan_build(&m->base, &(ct_wrap_config){.policy = (ct_wrap_policy)7}, 2, &p), CT_OK);
    ct_module *empty = ct_module_alloc(sizeof(ct_module), "Empty", NULL);
    cr_expect_neq(ct_shard_plan_build(empty, &(ct_wrap_config){.policy = CT_WRAP_NONE}, 2, &p), CT_OK);
    cr_expect(strstr(ct_last_error(), "no parameters"), "%s", ct_last_error());
    cr_expect_eq(p.nunits, 0);
    ct_module_free(empty);
    ct_module_free(&m->base);
}
