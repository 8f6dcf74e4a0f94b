/* GPU conformance for the gradient-list kernels (kernels/cuda/foreach.cu): norm
 * partials of every kind against the CPU, the plain CUDA reference, scale, clamp and
 * the unscale flag; and clipping and the fp16 loss scaler working on GPU gradients. */
#include <math.h>

#include "../../gpu_conformance.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/foreach.h"
#endif

Test(gpu_foreach, norm_partials)
{
    GPU_REQUIRE();
    static const double ps[] = {2, 1, 3.5, INFINITY};
    static const int64_t sizes[] = {1, 255, 8192, 8193, 1000003};
    CT_FRAME {
        for (int d = 0; d < 2; d++)
            for (int s = 0; s < 5; s++)
                for (int k = 0; k < 4; k++) {
                    ct_dtype dt = d ? CT_DTYPE_F64 : CT_DTYPE_F32;
                    ct_tensor *x = gpu_rand_cpu(dt, 1, &sizes[s], 40 + s, -2, 2);
                    double cpu, gpu;
                    cr_assert_eq(ct_kernel_norm_partial(x, ps[k], &cpu), CT_OK);
                    cr_assert_eq(ct_kernel_norm_partial(gpu_of(x), ps[k], &gpu), CT_OK, "%s", ct_last_error());
                    /* both sum in double: only the order differs */
                    cr_assert(fabs(gpu - cpu) <= 1e-12 * fabs(cpu), "%s p %g n %lld: GPU %.17g CPU %.17g",
                              ct_dtype_name(dt), ps[k], (long long)sizes[s], gpu, cpu);
#ifdef CT_HAVE_CUDA
                    double ref;
                    cr_assert_eq(cti_cuda_norm_partial_ref(gpu_of(x), k, ps[k], &ref), CT_OK);
                    cr_assert(fabs(ref - cpu) <= 1e-12 * fabs(cpu), "CUDA ref %.17g CPU %.17g", ref, cpu);
#endif
                }
    }
}

Test(gpu_foreach, scale_clamp_unscale)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *h = gpu_rand_cpu(CT_DTYPE_F32, 1, (const int64_t[]){77777}, 9, -4, 4);
        ct_tensor *d = gpu_of(h);
        cr_assert_eq(ct_kernel_scale_(h, 0.3), CT_OK);
        cr_assert_eq(ct_kernel_scale_(d, 0.3), CT_OK);
        gpu_expect_equal(d, h, "scale_");
        cr_assert_eq(ct_kernel_clamp_abs_(h, 0.7), CT_OK);
        cr_assert_eq(ct_kernel_clamp_abs_(d, 0.7), CT_OK);
        gpu_expect_equal(d, h, "clamp_abs_");
        ct_tensor *gh[2] = {h, gpu_rand_cpu(CT_DTYPE_F32, 1, (const int64_t[]){3}, 2, -1, 1)};
        ct_tensor *gd[2] = {d, gpu_of(gh[1])};
        bool ih, id;
        cr_assert_eq(ct_kernel_unscale_(2, gh, 0.125f, &ih), CT_OK);
        cr_assert_eq(ct_kernel_unscale_(2, gd, 0.125f, &id), CT_OK, "%s", ct_last_error());
        cr_assert_eq(id, ih);
        cr_assert_not(id);
        gpu_expect_equal(gd[0], gh[0], "unscale_");
        cr_assert_eq(ct_tensor_set(gd[1], (const int64_t[]){2}, NAN), CT_OK);
        cr_assert_eq(ct_kernel_unscale_(2, gd, 1.0f, &id), CT_OK);
        cr_assert(id, "a NaN in the second gradient raises the flag");
        /* mixing devices is an error naming both */
        ct_tensor *mixed[2] = {gh[0], gd[1]};
        cr_assert_eq(ct_kernel_unscale_(2, mixed, 1.0f, &id), CT_ERR_INVALID);
        cr_assert(strstr(ct_last_error(), "cpu") && strstr(ct_last_error(), "cuda:0"), "%s", ct_last_error());
    }
}

/* clip_grad_norm on GPU gradients: the same total norm and the same scaled grads. */
Test(gpu_foreach, clip_grad_norm_on_the_gpu)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *ph[3], *pd[3];
        for (int i = 0; i < 3; i++) {
            int64_t n = 1000 * (i + 1) + 7;
            ph[i] = ct_tensor_zeros(CT_DTYPE_F32, 1, &n);
            pd[i] = gpu_of(ph[i]);
            ph[i]->grad = ct_tensor_retain(gpu_rand_cpu(CT_DTYPE_F32, 1, &n, 70 + i, -1, 1));
            pd[i]->grad = ct_tensor_retain(gpu_of(ph[i]->grad));
        }
        double nh = ct_clip_grad_norm(3, ph, 1.0, 2.0), nd = ct_clip_grad_norm(3, pd, 1.0, 2.0);
        cr_assert(fabs(nh - nd) <= 1e-12 * nh, "norm %.17g vs %.17g (%s)", nd, nh, ct_last_error());
        for (int i = 0; i < 3; i++) gpu_expect_close(pd[i]->grad, ph[i]->grad, "clipped gradient");
        for (int i = 0; i < 3; i++) {
            ct_tensor_release(ph[i]->grad);
            ct_tensor_release(pd[i]->grad);
            ph[i]->grad = pd[i]->grad = NULL;
        }
    }
}
