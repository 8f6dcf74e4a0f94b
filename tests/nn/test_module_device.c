/* Tests for ct_module_to (nn/module_device.c): on every machine, moving to the device
 * a module is on changes nothing, and a move that cannot happen (no GPU) is an error
 * that leaves every tensor where it was; on a GPU, a GPT goes there and back with
 * its values bit for bit, its tensors keep their identity, tied weights stay tied,
 * and a forward on the GPU matches the CPU's. */
#include <string.h>

#include "../gpu_conformance.h"

static ct_gpt *small_gpt(void)
{
    ct_set_seed(5);
    return ct_gpt_new(&(ct_gpt_config){.vocab_size = 37, .block_size = 16, .n_layer = 2, .n_head = 3, .n_embd = 24});
}

Test(module_device, to_its_own_device_is_a_no_op)
{
    ct_gpt *m = small_gpt();
    cr_assert_not_null(m);
    ct_tensor *w = ct_module_find(&m->base, "h.0.attn.c_attn.weight");
    void *before = ct_tensor_data(w);
    cr_assert_eq(ct_module_to(&m->base, CT_CPU), CT_OK);
    cr_assert_eq(ct_tensor_data(w), before, "nothing moved");
    ct_module_free(&m->base);
}

Test(module_device, a_move_that_cannot_happen_changes_nothing)
{
    if (ct_cuda_is_available()) cr_skip_test("a GPU is present: the move would succeed");
    ct_gpt *m = small_gpt();
    ct_tensor *w = ct_module_find(&m->base, "wte.weight");
    void *before = ct_tensor_data(w);
    ct_error_clear();
    cr_assert_neq(ct_module_to(&m->base, CT_CUDA(0)), CT_OK);
    cr_assert(strstr(ct_last_error(), "module_to") && strstr(ct_last_error(), "cuda:0"), "%s", ct_last_error());
    cr_assert_eq(w->device.type, CT_DEVICE_CPU);
    cr_assert_eq(ct_tensor_data(w), before);
    cr_assert_eq(ct_module_to(NULL, CT_CPU), CT_ERR_INVALID);
    ct_module_free(&m->base);
}

Test(gpu_module_device, round_trip_keeps_identity_values_and_ties)
{
    GPU_REQUIRE();
    ct_gpt *m = small_gpt();
    ct_param_list l = {0};
    cr_assert_eq(ct_module_named_tensors(&m->base, true, &l), CT_OK);
    CT_FRAME {
        ct_tensor **before = calloc((size_t)l.n, sizeof *before);
        for (int i = 0; i < l.n; i++) before[i] = ct_tensor_clone(l.tensors[i]);
        ct_tensor *wte = ct_module_find(&m->base, "wte.weight");
        cr_assert_eq(ct_module_to(&m->base, CT_CUDA(0)), CT_OK, "%s", ct_last_error());
        for (int i = 0; i < l.n; i++) {
            cr_assert_eq(l.tensors[i]->device.type, CT_DEVICE_CUDA, "%s moved", l.names[i]);
            gpu_expect_equal(l.tensors[i], before[i], l.names[i]);
        }
        cr_assert_eq(ct_module_find(&m->base, "wte.weight"), wte, "the same tensor object");
        cr_assert_eq(ct_module_to(&m->base, CT_CPU), CT_OK, "%s", ct_last_error());
        for (int i = 0; i < l.n; i++) gpu_expect_equal(l.tensors[i], before[i], l.names[i]);
        free(before);
    }
    ct_param_list_free(&l);
    ct_module_free(&m->base);
}

Test(gpu_module_device, forward_matches_the_cpu)
{
    GPU_REQUIRE();
    ct_gpt *cpu = small_gpt(), *gpu = small_gpt();
    cr_assert_eq(ct_module_to(&gpu->base, CT_CUDA(0)), CT_OK, "%s", ct_last_error());
    CT_FRAME {
        int64_t tok[2 * 11];
        for (int i = 0; i < 22; i++) tok[i] = (i * 7 + 3) % 37;
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 11), tok);
        ct_tensor *lc = ct_gpt_forward(cpu, idx), *lg = ct_gpt_forward(gpu, ct_tensor_to(idx, CT_CUDA(0)));
        gpu_expect_close_tol(lg, lc, gpu_tolerance_chain(CT_DTYPE_F32, 4), "GPT logits (2 layers)");
    }
    ct_module_free(&cpu->base);
    ct_module_free(&gpu->base);
}
