/* Tests for the CUDA device layer as every machine sees it (core/cuda.h): a build
 * with CUDA on a machine without a GPU or a driver -- or a build without CUDA --
 * says why no GPU can be used, keeps working on the CPU, and turns every request
 * for a GPU into a clear error instead of a crash. Where a GPU is present these
 * tests check that the reason is absent and skip the no-GPU half. */
#include <criterion/criterion.h>
#include <string.h>

#include "ctrain.h"

Test(cuda_device, availability_and_reason_agree)
{
    int n = ct_cuda_device_count();
    cr_assert_geq(n, 0);
    cr_assert_eq(ct_cuda_is_available(), n > 0);
    const char *why = ct_cuda_unavailable_reason();
    if (n > 0) {
        cr_assert_null(why, "a GPU is usable, so there is no reason: %s", why);
    } else {
        cr_assert_not_null(why);
        cr_assert_gt(strlen(why), 10, "a reason a person can act on: '%s'", why);
        if (!ct_cuda_built()) cr_assert(strstr(why, "built without CUDA"), "%s", why);
    }
}

Test(cuda_device, no_gpu_requests_are_clear_errors)
{
    if (ct_cuda_is_available()) cr_skip_test("a GPU is present: this checks the no-GPU behaviour");
    CT_FRAME {
        ct_error_clear();
        ct_tensor *t = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_F32, CT_SHAPE(4, 4));
        cr_assert_null(t);
        cr_assert_eq(ct_last_status(), CT_ERR_UNSUPPORTED);
        cr_assert(strstr(ct_last_error(), "cuda:0"), "names the device: %s", ct_last_error());
        cr_assert(strstr(ct_last_error(), ct_cuda_unavailable_reason()), "and why: %s", ct_last_error());

        ct_tensor *c = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3));
        ct_error_clear();
        cr_assert_null(ct_tensor_to(c, CT_CUDA(0)));
        cr_assert(strstr(ct_last_error(), "tensor_to") && strstr(ct_last_error(), "cuda:0"), "%s", ct_last_error());
        /* the CPU tensor is untouched and usable */
        cr_assert_float_eq(ct_tensor_item(ct_kernel_sum(c, NULL, 0, false)), 3.0, 0);
        ct_tensor *same = ct_tensor_to(c, CT_CPU);
        cr_assert_eq(same, c, "to its own device: the tensor itself");
    }
    ct_cuda_memory_stats s;
    cr_assert_neq(ct_cuda_memory_stats_get(0, &s), CT_OK);
    cr_assert_eq(s.allocated, 0);
    cr_assert_null(ct_cuda_stream_new(0));
    cr_assert_null(ct_cuda_event_new(0, false));
    cr_assert_neq(ct_cuda_synchronize(0), CT_OK);
    cr_assert_eq(ct_cuda_empty_cache(), CT_OK, "nothing cached: nothing to do");
    ct_cuda_device_props p;
    cr_assert_neq(ct_cuda_device_props_get(0, &p), CT_OK);
}

Test(cuda_device, tf32_switch)
{
    bool was = ct_cuda_allow_tf32();
    cr_assert_not(was, "off by default, as PyTorch's matmul.allow_tf32");
    ct_cuda_set_allow_tf32(true);
    cr_assert_eq(ct_cuda_allow_tf32(), ct_cuda_built(), "a build without CUDA has no TF32 to turn on");
    ct_cuda_set_allow_tf32(false);
    cr_assert_not(ct_cuda_allow_tf32());
}

Test(cuda_device, error_status_has_a_name)
{
    cr_assert_str_eq(ct_status_str(CT_ERR_DEVICE), "device error");
}

/* Criterion's closing line counts passed, failed and crashed tests, not skipped ones:
 * this line after it says how many tests were skipped and why (on a machine without
 * a GPU, the whole GPU conformance suite), so that nothing skipped passes silently.
 * Tests left out by --filter are not counted. */
ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    size_t gpu = 0, other = 0;
    const char *gpu_why = NULL, *other_why = NULL;
    for (struct criterion_suite_stats *s = stats->suites; s; s = s->next) {
        for (struct criterion_test_stats *t = s->tests; t; t = t->next) {
            if (t->test_status != CR_STATUS_SKIPPED || !t->message || !strcmp(t->message, "Test is disabled"))
                continue;
            if (!strncmp(s->suite->name, "gpu_", 4)) {
                gpu++;
                gpu_why = t->message;
            } else {
                other++;
                other_why = t->message;
            }
        }
    }
    if (gpu)
        printf("[====] Skipped: %zu GPU conformance tests: %s\n", gpu,
               strncmp(gpu_why, "skipped: ", 9) ? gpu_why : gpu_why + 9);
    if (other)
        printf("[====] Skipped: %zu other tests (for example: %s)\n", other, other_why);
    fflush(stdout);
}
