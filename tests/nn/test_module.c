/* Module trees, dotted names and state dicts; the saved file is read back with
 * the safetensors reader, independently of ct_module_load. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/safetensors.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "tests/tmpdir.h"

typedef struct {
    ct_module base;
    int destroyed_marker;
} test_mod;

static int destroyed;
static void test_destroy(ct_module *m)
{
    (void)m;
    destroyed++;
}

static ct_module *leaf_mod(int64_t rows, int64_t cols, double v)
{
    test_mod *m = calloc(1, sizeof *m);
    ct_module_init(&m->base, "Leaf", test_destroy);
    CT_FRAME {
        ct_module_add_param(&m->base, "weight", ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(rows, cols), v));
        ct_module_add_param(&m->base, "bias", ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(cols), v + 0.5));
    }
    return &m->base;
}

/* root: wte (param), h.0 (Leaf), h.1 (Leaf), ln (buffer "step"); "head" shares wte */
static ct_module *make_tree(void)
{
    ct_module *root = calloc(1, sizeof(test_mod));
    ct_module_init(root, "Root", test_destroy);
    ct_module *h = calloc(1, sizeof(test_mod));
    ct_module_init(h, "List", test_destroy);
    CT_FRAME {
        ct_tensor *wte = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(5, 2), 1.0);
        ct_module_add_param(root, "wte", wte);
        ct_module_add_child(h, "0", leaf_mod(2, 3, 2.0));
        ct_module_add_child(h, "1", leaf_mod(3, 2, 3.0));
        ct_module_add_child(root, "h", h);
        ct_module_add_buffer(root, "step", ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(1), 7));
        ct_module_add_param(root, "head", wte); /* tied */
    }
    return root;
}

static void setup_dir(void) { make_tmpdir_with("/tmp/ct_module_"); }

Test(module, names_order_ties_and_counts)
{
    ct_module *root = make_tree();
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(root, true, &l), CT_OK);
    const char *want[] = {"wte", "h.0.weight", "h.0.bias", "h.1.weight", "h.1.bias", "step"};
    cr_assert_eq(l.n, 6, "tied 'head' is listed once, under its first name");
    for (int i = 0; i < 6; i++) cr_assert_str_eq(l.names[i], want[i]);
    cr_assert(l.tensors[1]->requires_grad);
    cr_assert(!l.tensors[5]->requires_grad, "buffers do not require grad");
    ct_param_list_free(&l);
    cr_assert_eq(ct_module_num_params(root), 10 + 6 + 3 + 6 + 2);
    cr_assert_eq(ct_tensor_get(ct_module_find(root, "h.1.bias"), (int64_t[]){0}), 3.5);
    cr_assert_null(ct_module_find(root, "h.2.bias"));
    cr_assert_null(ct_module_find(root, "h.0"));
    ct_module_train(root, false);
    cr_assert(!root->children[0].module->children[1].module->training);
    destroyed = 0;
    ct_module_free(root);
    cr_assert_eq(destroyed, 4);
}

Test(module, duplicate_and_bad_names_are_errors)
{
    ct_module *root = make_tree();
    CT_FRAME {
        ct_tensor *t = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1));
        cr_assert_neq(ct_module_add_param(root, "wte", t), CT_OK);
        cr_assert(strstr(ct_last_error(), "\"wte\""), "%s", ct_last_error());
        cr_assert_neq(ct_module_add_param(root, "a.b", t), CT_OK);
        cr_assert_neq(ct_module_add_buffer(root, "h", t), CT_OK);
        cr_assert_neq(ct_module_add_child(root, "wte", leaf_mod(1, 1, 0)), CT_OK, "child freed on failure");
    }
    ct_module_free(root);
}

Test(module, save_writes_dotted_names_and_values, .init = setup_dir, .fini = remove_tmpdir)
{
    ct_module *root = make_tree();
    const char *path = path_of("m.safetensors");
    cr_assert_eq(ct_module_save(root, path, 1, (const char *[]){"format"}, (const char *[]){"pt"}), CT_OK, "%s",
                 ct_last_error());
    ct_safetensors *f = ct_safetensors_open(path);
    cr_assert_not_null(f, "%s", ct_last_error());
    cr_assert_eq(ct_safetensors_count(f), 6);
    cr_assert_str_eq(ct_safetensors_metadata(f, "format"), "pt");
    CT_FRAME {
        ct_tensor *w = ct_safetensors_get(f, "h.1.weight");
        cr_assert_eq(w->shape[0], 3);
        cr_assert_eq(ct_tensor_get(w, (int64_t[]){2, 1}), 3.0);
        cr_assert_eq(ct_tensor_item(ct_safetensors_get(f, "step")), 7.0);
    }
    ct_safetensors_close(f);
    ct_module_free(root);
}

Test(module, load_round_trip_strict_and_reports, .init = setup_dir, .fini = remove_tmpdir)
{
    const char *path = path_of("m.safetensors"), *other = path_of("o.safetensors");
    ct_module *src = make_tree();
    CT_FRAME { ct_tensor_fill_(ct_module_find(src, "h.0.weight"), -4.0); }
    cr_assert_eq(ct_module_save(src, path, 0, NULL, NULL), CT_OK);
    ct_module *dst = make_tree();
    cr_assert_eq(ct_module_load(dst, path, true, NULL), CT_OK, "%s", ct_last_error());
    cr_assert_eq(ct_tensor_get(ct_module_find(dst, "h.0.weight"), (int64_t[]){1, 2}), -4.0);

    /* a file with one missing, one unexpected and one mis-shaped tensor */
    CT_FRAME {
        ct_tensor *ts[] = {ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(5, 2)), ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3, 2)),
                           ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(3), 9), ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2)),
                           ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(2), 8), ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(1))};
        const char *names[] = {"wte", "h.0.weight", "h.0.bias", "h.1.bias", "extra.weight", "step"};
        cr_assert_eq(ct_safetensors_save(other, 6, names, ts, 0, NULL, NULL), CT_OK);
    }
    cr_assert_neq(ct_module_load(dst, other, true, NULL), CT_OK);
    const char *msg = ct_last_error();
    cr_assert(strstr(msg, "h.1.weight") && strstr(msg, "extra.weight") && strstr(msg, "h.0.weight: file f32[3, 2], module f32[2, 3]"),
              "%s", msg);
    cr_assert_eq(ct_tensor_get(ct_module_find(dst, "h.0.bias"), (int64_t[]){0}), 2.5, "strict failure loads nothing");
    ct_load_report r;
    cr_assert_eq(ct_module_load(dst, other, false, &r), CT_OK, "%s", ct_last_error());
    cr_assert_eq(r.nmissing, 1);
    cr_assert_str_eq(r.missing[0], "h.1.weight");
    cr_assert_eq(r.nunexpected, 1);
    cr_assert_str_eq(r.unexpected[0], "extra.weight");
    cr_assert_eq(r.nmismatched, 1);
    cr_assert_eq(ct_tensor_get(ct_module_find(dst, "h.0.bias"), (int64_t[]){0}), 9.0, "non-strict loads the rest");
    cr_assert_eq(ct_tensor_get(ct_module_find(dst, "h.0.weight"), (int64_t[]){0, 0}), -4.0, "mismatch untouched");
    ct_load_report_free(&r);
    cr_assert_neq(ct_module_load(dst, "/nonexistent/file.safetensors", false, NULL), CT_OK);
    cr_assert(strstr(ct_last_error(), "/nonexistent/file.safetensors"), "%s", ct_last_error());
    ct_module_free(src);
    ct_module_free(dst);
}

/* ---- forward hooks ------------------------------------------------------------------ */

typedef struct hook_log {
    int pre, post;
    bool fail;
} hook_log;

static ct_status log_pre(ct_module *m, void *data)
{
    (void)m;
    hook_log *h = data;
    h->pre++;
    return h->fail ? ct_error_set(CT_ERR_INVALID, "pre hook refused") : CT_OK;
}

static ct_tensor *log_post(ct_module *m, ct_tensor *out, void *data)
{
    (void)m;
    ((hook_log *)data)->post++;
    return out ? ct_tensor_full(out->dtype, out->ndim, out->shape, 7.0) : NULL; /* stands for out */
}

Test(module, forward_hooks_run_around_a_layers_forward)
{
    ct_linear_layer *l = ct_linear_layer_new(3, 2, true, 0.1);
    hook_log h = {0};
    CT_FRAME {
        ct_tensor *x = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(4, 3));
        ct_tensor *y = ct_linear_layer_forward(l, x);
        cr_assert_not_null(y);
        cr_assert_eq(h.pre + h.post, 0, "no hooks, nothing runs");
        ct_module_set_hooks(&l->base, &(ct_module_hooks){.pre = log_pre, .post = log_post, .data = &h});
        y = ct_linear_layer_forward(l, x);
        cr_assert(h.pre == 1 && h.post == 1);
        cr_assert_eq(((float *)ct_tensor_data(y))[0], 7.0f, "post's tensor is what the forward returns");
        h.fail = true;
        cr_assert_null(ct_linear_layer_forward(l, x), "a failing pre hook fails the forward");
        cr_assert(strstr(ct_last_error(), "pre hook refused"));
        cr_assert_eq(h.post, 1, "and nothing ran after it");
        ct_module_set_hooks(&l->base, NULL);
        cr_assert_not_null(ct_linear_layer_forward(l, x));
        cr_assert_eq(h.pre, 2);
    }
    ct_module_free(&l->base);
}
