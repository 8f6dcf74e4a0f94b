/* Tests for kernels/optim.c and kernels/cpu/optim.c: the fused updates against the
 * formulas of torch.optim.Adam/AdamW/SGD written out again here, in double. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/optim.h"
#include "kernels/optim.h"
#include "tests/kernels/util.h"

/* ---- the documented formulas, step by step, in double ---- */

static void adam_by_hand(double *p, const double *g, double *m, double *v, int64_t n, const ct_adamw_hparams *h)
{
    const double t = (double)h->step;
    for (int64_t i = 0; i < n; i++) {
        double grad = h->maximize ? -g[i] : g[i];
        if (h->decoupled) p[i] = p[i] - h->lr * h->weight_decay * p[i];
        else grad = grad + h->weight_decay * p[i];
        m[i] = h->beta1 * m[i] + (1 - h->beta1) * grad;
        v[i] = h->beta2 * v[i] + (1 - h->beta2) * grad * grad;
        const double mhat = m[i] / (1 - pow(h->beta1, t));
        const double vhat = v[i] / (1 - pow(h->beta2, t));
        p[i] = p[i] - h->lr * mhat / (sqrt(vhat) + h->eps);
    }
}

static void sgd_by_hand(double *p, const double *g, double *buf, int64_t n, const ct_sgd_hparams *h)
{
    for (int64_t i = 0; i < n; i++) {
        double grad = g[i] + h->weight_decay * p[i];
        if (h->momentum != 0) {
            buf[i] = h->first_step ? grad : h->momentum * buf[i] + (1 - h->dampening) * grad;
            grad = h->nesterov ? grad + h->momentum * buf[i] : buf[i];
        }
        p[i] = p[i] - h->lr * grad;
    }
}

/* nsteps from `start` with fresh gradients each step; the fast kernel on tensors of dt vs
 * the hand loop on doubles, compared on p, m and v after every step. */
static void check_adam(ct_dtype dt, int64_t n, ct_adamw_hparams h, int nsteps, double tol)
{
    CT_FRAME {
        ct_tensor *p = ct_tensor_randn(dt, CT_SHAPE(n), 0, 1);
        /* step 1 starts from zero state; a late step from a running one */
        ct_tensor *m = h.step > 1 ? ct_tensor_randn(dt, CT_SHAPE(n), 0, 0.1) : ct_tensor_zeros(dt, CT_SHAPE(n));
        ct_tensor *v = h.step > 1 ? ct_tensor_rand(dt, CT_SHAPE(n), 0, 0.01) : ct_tensor_zeros(dt, CT_SHAPE(n));
        double *hp = f64_data(p), *hm = f64_data(m), *hv = f64_data(v);
        for (int s = 0; s < nsteps; s++, h.step++) {
            ct_tensor *g = ct_tensor_randn(dt, CT_SHAPE(n), 0, 1);
            double *hg = f64_data(g);
            cr_assert_eq(ct_kernel_adamw(p, g, m, v, &h), CT_OK, "%s", ct_last_error());
            adam_by_hand(hp, hg, hm, hv, n, &h);
            double ep = rel_err_n(f64_data(p), hp, n, false), em = rel_err_n(f64_data(m), hm, n, false);
            double ev = rel_err_n(f64_data(v), hv, n, false);
            cr_assert(ep <= tol && em <= tol && ev <= tol,
                      "%s n=%ld step=%ld decoupled=%d maximize=%d wd=%g: p %.3g m %.3g v %.3g", ct_dtype_name(dt),
                      (long)n, (long)h.step, h.decoupled, h.maximize, h.weight_decay, ep, em, ev);
        }
    }
}

static const ct_adamw_hparams adamw_default = {
    .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .step = 1, .decoupled = true,
};

Test(optim, adamw_matches_formulas)
{
    ct_set_seed(11);
    const int64_t sizes[] = {1, 7, 17, 1000, 100003};
    for (int i = 0; i < 5; i++) {
        ct_adamw_hparams h = adamw_default;
        check_adam(CT_DTYPE_F32, sizes[i], h, 5, 1e-6);
        h.decoupled = false; /* Adam with L2 */
        check_adam(CT_DTYPE_F32, sizes[i], h, 5, 1e-6);
    }
    ct_adamw_hparams h = adamw_default;
    h.maximize = true, h.weight_decay = 0, h.lr = 0.1;
    check_adam(CT_DTYPE_F32, 1000, h, 3, 1e-6);
    h.step = 1000, h.weight_decay = 0.05, h.beta2 = 0.95; /* late-step bias correction with running state */
    check_adam(CT_DTYPE_F32, 1000, h, 3, 1e-6);
    check_adam(CT_DTYPE_F64, 1003, adamw_default, 5, 1e-13);
    h.decoupled = false;
    check_adam(CT_DTYPE_F64, 1003, h, 5, 1e-13);
}

/* At step 1 from zero state, mhat = g and vhat = g^2: the step is lr * g / (|g| + eps). */
Test(optim, adamw_first_step_closed_form)
{
    float p[4] = {1, -2, 0.5f, 3}, g[4] = {0.25f, -4, 1e-3f, 0}, m[4] = {0}, v[4] = {0};
    ct_adamw_hparams h = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .step = 1, .decoupled = true};
    cti_cpu_adamw_f32(p, g, m, v, 4, &h);
    const double p0[4] = {1, -2, 0.5, 3}, g0[4] = {0.25, -4, 1e-3, 0};
    for (int i = 0; i < 4; i++) {
        double want = p0[i] - 0.1 * g0[i] / (fabs(g0[i]) + 1e-8);
        cr_assert_float_eq(p[i], want, 1e-6, "p[%d] = %.9g, want %.9g", i, p[i], want);
        cr_assert_float_eq(m[i], 0.1 * g0[i], 1e-7);
        cr_assert_float_eq(v[i], 0.001 * g0[i] * g0[i], 1e-7);
    }
}

Test(optim, adamw_ref_matches_fast)
{
    ct_set_seed(12);
    const int64_t n = 4099;
    CT_FRAME {
        ct_tensor *t[8];
        for (int i = 0; i < 8; i++) t[i] = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(n), 0, 1);
        float *d[8];
        for (int i = 0; i < 8; i++) d[i] = ct_tensor_data(t[i]);
        for (int64_t i = 0; i < n; i++) d[3][i] = d[7][i] = fabsf(d[3][i]); /* v >= 0 */
        memcpy(d[4], d[0], n * 4), memcpy(d[6], d[2], n * 4);
        ct_adamw_hparams h = adamw_default;
        h.step = 7;
        cti_cpu_adamw_f32(d[0], d[1], d[2], d[3], n, &h);
        cti_cpu_adamw_f32_ref(d[4], d[1], d[6], d[7], n, &h);
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; i++) num += pow(d[0][i] - d[4][i], 2), den += pow(d[4][i], 2);
        cr_assert_leq(sqrt(num / den), 1e-6);
    }
}

Test(optim, adamw_deterministic_across_threads)
{
    ct_set_seed(13);
    CT_FRAME {
        const int64_t n = 200001;
        ct_tensor *p0 = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(n), 0, 1), *g = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(n), 0, 1);
        ct_tensor *res[2];
        for (int r = 0; r < 2; r++) {
            ct_set_num_threads(r + 1);
            ct_tensor *p = ct_tensor_clone(p0), *m = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(n)), *v = ct_tensor_zeros_like(m);
            for (int s = 1; s <= 3; s++) {
                ct_adamw_hparams h = adamw_default;
                h.step = s;
                cr_assert_eq(ct_kernel_adamw(p, g, m, v, &h), CT_OK);
            }
            res[r] = p;
        }
        ct_set_num_threads(0);
        cr_assert(same_bits(res[0], res[1]));
    }
}

Test(optim, adamw_list_equals_single_calls)
{
    ct_set_seed(14);
    CT_FRAME {
        const int64_t shapes[3][2] = {{3, 5}, {1, 1}, {64, 33}};
        ct_tensor *p[3], *g[3], *m[3], *v[3], *p2[3], *m2[3], *v2[3];
        for (int i = 0; i < 3; i++) {
            p[i] = ct_tensor_randn(CT_DTYPE_F32, 2, shapes[i], 0, 1);
            g[i] = ct_tensor_randn(CT_DTYPE_F32, 2, shapes[i], 0, 1);
            m[i] = ct_tensor_zeros(CT_DTYPE_F32, 2, shapes[i]), v[i] = ct_tensor_zeros(CT_DTYPE_F32, 2, shapes[i]);
            p2[i] = ct_tensor_clone(p[i]), m2[i] = ct_tensor_clone(m[i]), v2[i] = ct_tensor_clone(v[i]);
        }
        ct_adamw_hparams h = adamw_default;
        cr_assert_eq(ct_kernel_adamw_list(3, p, (const ct_tensor *const *)g, m, v, &h), CT_OK, "%s", ct_last_error());
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(ct_kernel_adamw(p2[i], g[i], m2[i], v2[i], &h), CT_OK);
            cr_assert(same_bits(p[i], p2[i]));
            cr_assert(same_bits(v[i], v2[i]));
        }
        /* a bad third entry: error, and the first two stay untouched */
        ct_tensor *bad_v[3] = {v[0], v[1], ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(33, 64))};
        ct_tensor *before = ct_tensor_clone(p[0]);
        cr_assert_neq(ct_kernel_adamw_list(3, p, (const ct_tensor *const *)g, m, bad_v, &h), CT_OK);
        ERROR_HAS("adamw_list[2]", "[33, 64]");
        cr_assert(same_bits(before, p[0]));
        cr_assert_eq(ct_kernel_adamw_list(0, NULL, NULL, NULL, NULL, &h), CT_OK);
    }
}

static void check_sgd(ct_dtype dt, int64_t n, ct_sgd_hparams h, int nsteps, double tol)
{
    CT_FRAME {
        ct_tensor *p = ct_tensor_randn(dt, CT_SHAPE(n), 0, 1);
        ct_tensor *buf = h.momentum != 0 ? ct_tensor_full(dt, CT_SHAPE(n), 123.0) : NULL; /* garbage: first step overwrites */
        double *hp = f64_data(p), *hb = calloc((size_t)n, sizeof(double));
        for (int s = 0; s < nsteps; s++) {
            h.first_step = s == 0;
            ct_tensor *g = ct_tensor_randn(dt, CT_SHAPE(n), 0, 1);
            double *hg = f64_data(g);
            cr_assert_eq(ct_kernel_sgd(p, g, buf, &h), CT_OK, "%s", ct_last_error());
            sgd_by_hand(hp, hg, hb, n, &h);
            double ep = rel_err_n(f64_data(p), hp, n, false), eb = buf ? rel_err_n(f64_data(buf), hb, n, false) : 0;
            cr_assert(ep <= tol && eb <= tol, "%s n=%ld step %d momentum=%g dampening=%g nesterov=%d wd=%g: p %.3g buf %.3g",
                      ct_dtype_name(dt), (long)n, s, h.momentum, h.dampening, h.nesterov, h.weight_decay, ep, eb);
        }
        free(hb);
    }
}

Test(optim, sgd_matches_formulas)
{
    ct_set_seed(15);
    const int64_t sizes[] = {1, 9, 100003};
    for (int i = 0; i < 3; i++) {
        check_sgd(CT_DTYPE_F32, sizes[i], (ct_sgd_hparams){.lr = 0.1}, 3, 1e-6);
        check_sgd(CT_DTYPE_F32, sizes[i], (ct_sgd_hparams){.lr = 0.1, .weight_decay = 0.01}, 3, 1e-6);
        check_sgd(CT_DTYPE_F32, sizes[i], (ct_sgd_hparams){.lr = 0.05, .momentum = 0.9, .dampening = 0.1}, 4, 1e-6);
        check_sgd(CT_DTYPE_F32, sizes[i], (ct_sgd_hparams){.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3},
                  4, 1e-6);
    }
    check_sgd(CT_DTYPE_F64, 1001, (ct_sgd_hparams){.lr = 0.05, .momentum = 0.8, .dampening = 0.5, .weight_decay = 0.1}, 4, 1e-14);
    check_sgd(CT_DTYPE_F64, 1001, (ct_sgd_hparams){.lr = 0.05, .momentum = 0.8, .nesterov = true}, 4, 1e-14);
}

/* Two steps worked out by hand: momentum 0.5, dampening 0.5, lr 1. */
Test(optim, sgd_hand_case)
{
    float p[1] = {1}, g1[1] = {2}, g2[1] = {4}, buf[1] = {99};
    ct_sgd_hparams h = {.lr = 1, .momentum = 0.5, .dampening = 0.5, .first_step = true};
    cti_cpu_sgd_f32(p, g1, buf, 1, &h); /* buf = 2, p = 1 - 2 = -1 */
    cr_assert_eq(buf[0], 2.0f);
    cr_assert_eq(p[0], -1.0f);
    h.first_step = false;
    cti_cpu_sgd_f32(p, g2, buf, 1, &h); /* buf = 0.5*2 + 0.5*4 = 3, p = -1 - 3 = -4 */
    cr_assert_eq(buf[0], 3.0f);
    cr_assert_eq(p[0], -4.0f);
    float q[1] = {1}, qb[1] = {0};
    ct_sgd_hparams n = {.lr = 1, .momentum = 0.5, .nesterov = true, .first_step = true};
    cti_cpu_sgd_f32(q, g1, qb, 1, &n); /* buf = 2, step = 2 + 0.5*2 = 3 */
    cr_assert_eq(q[0], -2.0f);
    float r[1] = {1};
    cti_cpu_sgd_f32_ref(r, g1, qb, 1, &(ct_sgd_hparams){.lr = 0.5, .weight_decay = 1}); /* g = 2 + 1 */
    cr_assert_eq(r[0], -0.5f);
}

Test(optim, errors_name_op_and_shapes)
{
    CT_FRAME {
        ct_tensor *p = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4, 6)), *g = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4, 6));
        ct_tensor *m = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4, 6)), *v = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4, 6));
        ct_tensor *g_bad = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(6, 4)), *g64 = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(4, 6));
        ct_tensor *g_t = ct_tensor_transpose(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(6, 4)), 0, 1);
        ct_tensor *pi = ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(4, 6));
        ct_adamw_hparams h = adamw_default;
        cr_assert_neq(ct_kernel_adamw(p, g_bad, m, v, &h), CT_OK);
        ERROR_HAS("adamw", "[6, 4]");
        cr_assert_neq(ct_kernel_adamw(p, g64, m, v, &h), CT_OK);
        ERROR_HAS("adamw", "f64[4, 6]");
        cr_assert_neq(ct_kernel_adamw(p, g_t, m, v, &h), CT_OK);
        ERROR_HAS("adamw", "contiguous");
        cr_assert_neq(ct_kernel_adamw(pi, pi, pi, pi, &h), CT_OK);
        ERROR_HAS("adamw", "i32[4, 6]");
        cr_assert_neq(ct_kernel_adamw(p, NULL, m, v, &h), CT_OK);
        ERROR_HAS("adamw", "NULL");
        cr_assert_neq(ct_kernel_adamw(p, g, m, v, NULL), CT_OK);
        h.step = 0;
        cr_assert_neq(ct_kernel_adamw(p, g, m, v, &h), CT_OK);
        ERROR_HAS("adamw", "step");
        h = adamw_default, h.beta2 = 1;
        cr_assert_neq(ct_kernel_adamw(p, g, m, v, &h), CT_OK);
        ERROR_HAS("adamw", "beta");
        h = adamw_default, h.lr = NAN;
        cr_assert_neq(ct_kernel_adamw(p, g, m, v, &h), CT_OK);
        cr_assert_neq(ct_kernel_adamw_list(-1, NULL, NULL, NULL, NULL, &adamw_default), CT_OK);

        cr_assert_neq(ct_kernel_sgd(p, g_bad, NULL, &(ct_sgd_hparams){.lr = 0.1}), CT_OK);
        ERROR_HAS("sgd", "[6, 4]");
        cr_assert_neq(ct_kernel_sgd(p, g, NULL, &(ct_sgd_hparams){.lr = 0.1, .momentum = 0.9}), CT_OK);
        ERROR_HAS("sgd", "momentum_buf NULL");
        cr_assert_neq(ct_kernel_sgd(p, g, g_bad, &(ct_sgd_hparams){.lr = 0.1, .momentum = 0.9}), CT_OK);
        ERROR_HAS("sgd", "momentum_buf f32[6, 4]");
        cr_assert_neq(ct_kernel_sgd(p, g, m, &(ct_sgd_hparams){.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                      CT_OK);
        ERROR_HAS("sgd", "nesterov");
        cr_assert_neq(ct_kernel_sgd(p, g, NULL, &(ct_sgd_hparams){.lr = -1}), CT_OK);
        ERROR_HAS("sgd", "lr");
        /* momentum 0: the buffer is not needed and not checked */
        cr_assert_eq(ct_kernel_sgd(p, g, NULL, &(ct_sgd_hparams){.lr = 0.1}), CT_OK);
    }
}
