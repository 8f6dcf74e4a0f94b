/* cuBLASLt opened on first use (core/cublaslt_loader.c): a process that never runs a
 * GPU matmul never maps the library, and the first use finds every function ctrain
 * calls in the toolkit's library. Runs without a GPU. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "ctrain.h"
#include "core/cublaslt_loader.h"

/* Whether this process has a file whose path contains name mapped. */
static bool mapped(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert_not_null(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
    fclose(f);
    return found;
}

Test(cublaslt_loader, a_cpu_run_never_maps_cublaslt)
{
    /* what a CPU training step touches: device discovery and a matmul on the CPU */
    (void)ct_cuda_device_count();
    CT_FRAME {
        int64_t shape[2] = {3, 3};
        ct_tensor *a = ct_tensor_full(CT_DTYPE_F32, 2, shape, 1.0);
        ct_tensor *c = ct_matmul(a, a);
        cr_assert_not_null(c, "%s", ct_last_error());
    }
    cr_assert(!mapped("libcublasLt"), "libcublasLt is mapped by a process that ran no GPU matmul");
#ifdef CT_HAVE_CUDA
    cr_assert_eq(cti_cublaslt_loaded(), 0);
#endif
}

Test(cublaslt_loader, first_use_resolves_every_function)
{
#ifndef CT_HAVE_CUDA
    cr_skip_test("built without CUDA (CUDA=0 or no nvcc)");
#else
    /* a CUDA build has the toolkit's libraries; no GPU is needed to open them */
    const cti_cublaslt_api *lt = cti_cublaslt("test");
    cr_assert_not_null(lt, "%s", ct_last_error());
    cr_assert(mapped("libcublasLt"));
    cr_assert_eq(cti_cublaslt_loaded(), 1);
    /* every slot filled, and the library's own names for a status */
    const void *const *slot = (const void *const *)lt;
    for (size_t i = 0; i < sizeof *lt / sizeof(void *); i++) cr_assert_not_null(slot[i], "function %zu", i);
    cr_assert_str_eq(lt->GetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
    cr_assert_eq(cti_cublaslt("again"), lt);
#endif
}
