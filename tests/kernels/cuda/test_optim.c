/* GPU conformance for the fused optimizers (kernels/cuda/optim.cu): AdamW/Adam and
 * SGD over several steps on the GPU against the same steps on the CPU (the fast
 * kernels, which the GPU's follow operation for operation), the list form against
 * per-tensor CPU steps, and the plain CUDA references against the CPU references. */
#include <string.h>

#include "kernels/cpu/optim.h"
#include "tests/gpu_conformance.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/optim.h"
#endif

static const ct_adamw_hparams adamw_h = {
    .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .step = 1, .decoupled = true,
};

/* nsteps of AdamW on CPU and GPU copies of p, m, v with the same fresh gradients;
 * compares p, m, v after each step (and the references, when ref). */
static void adam_steps(ct_dtype dt, int64_t n, ct_adamw_hparams h, int nsteps, uint64_t seed)
{
    CT_FRAME {
        ct_tensor *p = gpu_rand_cpu(dt, 1, &n, seed, -1, 1);
        ct_tensor *m = gpu_rand_cpu(dt, 1, &n, seed + 1, -0.1, 0.1);
        ct_tensor *v = gpu_rand_cpu(dt, 1, &n, seed + 2, 0, 0.01);
        ct_tensor *gp = gpu_of(p), *gm = gpu_of(m), *gv = gpu_of(v);
        /* the references start from the same state and run the same steps */
        ct_tensor *rp = ct_tensor_clone(p), *rm = ct_tensor_clone(m), *rv = ct_tensor_clone(v);
        ct_tensor *grp = gpu_of(p), *grm = gpu_of(m), *grv = gpu_of(v);
        for (int s = 0; s < nsteps; s++, h.step++) CT_FRAME {
                ct_tensor *g = gpu_rand_cpu(dt, 1, &n, seed + 10 + s, -1, 1), *gg = gpu_of(g);
                cr_assert_eq(ct_kernel_adamw(p, g, m, v, &h), CT_OK, "%s", ct_last_error());
                cr_assert_eq(ct_kernel_adamw(gp, gg, gm, gv, &h), CT_OK, "%s", ct_last_error());
                char w[160];
                snprintf(w, sizeof w, "adamw %s n=%lld step=%lld decoupled=%d maximize=%d wd=%g", ct_dtype_name(dt),
                         (long long)n, (long long)h.step, h.decoupled, h.maximize, h.weight_decay);
                gpu_expect_close(gp, p, w);
                gpu_expect_close(gm, m, w);
                gpu_expect_close(gv, v, w);
#ifdef CT_HAVE_CUDA
                if (dt == CT_DTYPE_F32) {
                    cti_cpu_adamw_f32_ref(ct_tensor_data(rp), ct_tensor_data(g), ct_tensor_data(rm),
                                          ct_tensor_data(rv), n, &h);
                    cr_assert_eq(cti_cuda_adamw_ref(grp, gg, grm, grv, &h), CT_OK, "%s", ct_last_error());
                    gpu_expect_close(grp, rp, "adamw reference p");
                    gpu_expect_close(grm, rm, "adamw reference m");
                    gpu_expect_close(grv, rv, "adamw reference v");
                }
#endif
            }
        (void)rp, (void)rm, (void)rv, (void)grp, (void)grm, (void)grv;
    }
}

Test(gpu_optim, adamw_and_adam_several_steps)
{
    GPU_REQUIRE();
    static const int64_t sizes[] = {1, 7, 1000, 100003};
    for (size_t i = 0; i < 4; i++) {
        ct_adamw_hparams h = adamw_h;
        adam_steps(CT_DTYPE_F32, sizes[i], h, 4, 10 * i);
        adam_steps(CT_DTYPE_F64, sizes[i], h, 3, 10 * i + 1);
        h.decoupled = false; /* Adam, L2 on the gradient */
        adam_steps(CT_DTYPE_F32, sizes[i], h, 4, 10 * i + 2);
        h.maximize = true;
        h.weight_decay = 0;
        h.step = 1000; /* bias corrections near 1 */
        adam_steps(CT_DTYPE_F32, sizes[i], h, 2, 10 * i + 3);
    }
}

Test(gpu_optim, adamw_list_one_launch_per_group)
{
    GPU_REQUIRE();
    /* 30 tensors (two groups), f32 and f64 mixed, sizes from 1 to 70000 */
    enum { NT = 30 };
    CT_FRAME {
        ct_tensor *p[NT], *g[NT], *m[NT], *v[NT], *gp[NT], *gg[NT], *gm[NT], *gv[NT];
        for (int i = 0; i < NT; i++) {
            const ct_dtype dt = i % 7 == 3 ? CT_DTYPE_F64 : CT_DTYPE_F32;
            const int64_t n = i == 5 ? 70000 : 1 + i * 37;
            p[i] = gpu_rand_cpu(dt, 1, &n, 100 + i, -1, 1);
            g[i] = gpu_rand_cpu(dt, 1, &n, 200 + i, -1, 1);
            m[i] = gpu_rand_cpu(dt, 1, &n, 300 + i, -0.1, 0.1);
            v[i] = gpu_rand_cpu(dt, 1, &n, 400 + i, 0, 0.01);
            gp[i] = gpu_of(p[i]), gg[i] = gpu_of(g[i]), gm[i] = gpu_of(m[i]), gv[i] = gpu_of(v[i]);
        }
        ct_adamw_hparams h = adamw_h;
        for (int s = 0; s < 3; s++, h.step++) {
            cr_assert_eq(ct_kernel_adamw_list(NT, p, (const ct_tensor *const *)g, m, v, &h), CT_OK, "%s",
                         ct_last_error());
            cr_assert_eq(ct_kernel_adamw_list(NT, gp, (const ct_tensor *const *)gg, gm, gv, &h), CT_OK, "%s",
                         ct_last_error());
            for (int i = 0; i < NT; i++) {
                char w[80];
                snprintf(w, sizeof w, "adamw_list step %d tensor %d", s + 1, i);
                gpu_expect_close(gp[i], p[i], w);
                gpu_expect_close(gm[i], m[i], w);
                gpu_expect_close(gv[i], v[i], w);
            }
        }
        /* a CPU tensor in a GPU list: an error naming both devices, nothing updated */
        ct_tensor *before = ct_tensor_to(gp[0], CT_CPU);
        ct_tensor *mixed[2] = {gp[0], p[1]};
        const ct_tensor *mg[2] = {gg[0], gg[1]};
        ct_tensor *mm[2] = {gm[0], gm[1]}, *mv[2] = {gv[0], gv[1]};
        cr_assert_neq(ct_kernel_adamw_list(2, mixed, mg, mm, mv, &h), CT_OK);
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
        gpu_expect_equal(gp[0], before, "list left untouched");
    }
}

/* nsteps of SGD on CPU and GPU copies (first_step on the first), compared after each. */
static void sgd_steps(ct_dtype dt, int64_t n, ct_sgd_hparams h, int nsteps, uint64_t seed)
{
    CT_FRAME {
        const bool mom = h.momentum != 0;
        ct_tensor *p = gpu_rand_cpu(dt, 1, &n, seed, -1, 1);
        ct_tensor *buf = mom ? gpu_rand_cpu(dt, 1, &n, seed + 1, -1, 1) : NULL; /* garbage: the first step sets it */
        ct_tensor *gp = gpu_of(p), *gbuf = mom ? gpu_of(buf) : NULL;
        ct_tensor *rp = ct_tensor_clone(p), *rbuf = mom ? ct_tensor_clone(buf) : NULL;
        ct_tensor *grp = gpu_of(p), *grbuf = mom ? gpu_of(buf) : NULL;
        for (int s = 0; s < nsteps; s++) CT_FRAME {
                h.first_step = s == 0;
                ct_tensor *g = gpu_rand_cpu(dt, 1, &n, seed + 10 + s, -1, 1), *gg = gpu_of(g);
                cr_assert_eq(ct_kernel_sgd(p, g, buf, &h), CT_OK, "%s", ct_last_error());
                cr_assert_eq(ct_kernel_sgd(gp, gg, gbuf, &h), CT_OK, "%s", ct_last_error());
                char w[200];
                snprintf(w, sizeof w, "sgd %s n=%lld step %d momentum=%g dampening=%g nesterov=%d wd=%g",
                         ct_dtype_name(dt), (long long)n, s + 1, h.momentum, h.dampening, h.nesterov, h.weight_decay);
                gpu_expect_close(gp, p, w);
                if (mom) gpu_expect_close(gbuf, buf, w);
#ifdef CT_HAVE_CUDA
                if (dt == CT_DTYPE_F32) {
                    cti_cpu_sgd_f32_ref(ct_tensor_data(rp), ct_tensor_data(g), mom ? ct_tensor_data(rbuf) : NULL, n,
                                        &h);
                    cr_assert_eq(cti_cuda_sgd_ref(grp, gg, grbuf, &h), CT_OK, "%s", ct_last_error());
                    gpu_expect_close(grp, rp, "sgd reference p");
                    if (mom) gpu_expect_close(grbuf, rbuf, "sgd reference buf");
                }
#endif
            }
        (void)rp, (void)rbuf, (void)grp, (void)grbuf;
    }
}

Test(gpu_optim, sgd_variants_several_steps)
{
    GPU_REQUIRE();
    static const ct_sgd_hparams hs[] = {
        {.lr = 0.1},
        {.lr = 0.05, .weight_decay = 0.01},
        {.lr = 0.05, .momentum = 0.9},
        {.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 1e-3},
        {.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-2},
    };
    static const int64_t sizes[] = {1, 33, 100003};
    for (size_t k = 0; k < sizeof hs / sizeof hs[0]; k++)
        for (size_t i = 0; i < 3; i++) {
            sgd_steps(CT_DTYPE_F32, sizes[i], hs[k], 3, 1000 + 10 * k + i);
            sgd_steps(CT_DTYPE_F64, sizes[i], hs[k], 3, 2000 + 10 * k + i);
        }
}

Test(gpu_optim, errors_and_empty)
{
    GPU_REQUIRE();
    CT_FRAME {
        const int64_t n = 8, z = 0;
        ct_tensor *p = gpu_of(gpu_rand_cpu(CT_DTYPE_F32, 1, &n, 1, -1, 1));
        ct_tensor *g = gpu_rand_cpu(CT_DTYPE_F32, 1, &n, 2, -1, 1);
        ct_tensor *m = gpu_of(g), *v = gpu_of(g);
        ct_adamw_hparams h = adamw_h;
        cr_assert_neq(ct_kernel_adamw(p, g, m, v, &h), CT_OK);
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
        h.step = 0;
        cr_assert_eq(ct_kernel_adamw(p, gpu_of(g), m, v, &h), CT_ERR_INVALID);
        cr_assert(strstr(ct_last_error(), "step must be >= 1"), "%s", ct_last_error());
        ct_tensor *e = gpu_of(ct_tensor_empty(CT_DTYPE_F32, 1, &z));
        h.step = 1;
        cr_assert_eq(ct_kernel_adamw(e, e, ct_tensor_clone(e), ct_tensor_clone(e), &h), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_kernel_sgd(e, e, NULL, &(ct_sgd_hparams){.lr = 0.1}), CT_OK, "%s", ct_last_error());
    }
}
