/* Tests for optim/optimizer.c, optim/sgd.c and optim/adam.c: whole optimizers (groups,
 * skipped parameters, per-parameter step counts, lr changes) against a re-implementation
 * of torch.optim.SGD / Adam / AdamW written out here in double. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "tests/optim/util.h"

/* ---- the reference: torch.optim's per-parameter loops, in double ---- */

enum { REF_SGD, REF_ADAM, REF_ADAMW };

typedef struct ref_hyper {
    int kind;
    double b1, b2, eps, momentum, dampening;
    bool nesterov;
} ref_hyper;

typedef struct ref_param {
    int64_t n;
    double *p, *m, *v, *buf;
    int64_t step;
} ref_param;

static void ref_update(const ref_hyper *h, ref_param *r, const double *g, double lr, double wd)
{
    r->step++;
    const double t = (double)r->step;
    for (int64_t i = 0; i < r->n; i++) {
        double grad = g[i];
        if (h->kind == REF_SGD) {
            grad += wd * r->p[i];
            if (h->momentum != 0) {
                r->buf[i] = r->step == 1 ? grad : h->momentum * r->buf[i] + (1 - h->dampening) * grad;
                grad = h->nesterov ? grad + h->momentum * r->buf[i] : r->buf[i];
            }
            r->p[i] -= lr * grad;
            continue;
        }
        if (h->kind == REF_ADAMW) r->p[i] *= 1 - lr * wd;
        else grad += wd * r->p[i];
        r->m[i] = h->b1 * r->m[i] + (1 - h->b1) * grad;
        r->v[i] = h->b2 * r->v[i] + (1 - h->b2) * grad * grad;
        const double mhat = r->m[i] / (1 - pow(h->b1, t)), vhat = r->v[i] / (1 - pow(h->b2, t));
        r->p[i] -= lr * mhat / (sqrt(vhat) + h->eps);
    }
}

static double *doubles_of(const ct_tensor *t)
{
    const int64_t n = ct_tensor_numel(t);
    double *d = calloc((size_t)n + 1, sizeof *d);
    CT_FRAME {
        ct_tensor *x = ct_tensor_cast(t, CT_DTYPE_F64);
        memcpy(d, ct_tensor_data(x), (size_t)n * sizeof *d);
    }
    return d;
}

/* ||t - want|| / ||want|| */
static double rel_err(const ct_tensor *t, const double *want)
{
    double *a = doubles_of(t), num = 0, den = 0;
    for (int64_t i = 0; i < ct_tensor_numel(t); i++) num += (a[i] - want[i]) * (a[i] - want[i]), den += want[i] * want[i];
    free(a);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- the harness: NP parameters in up to three groups, NSTEPS steps ---- */

#define NP 5
static const int64_t shapes[NP][2] = {{3, 5}, {1, 1}, {17, 1}, {4, 33}, {127, 3}};

typedef struct group_spec {
    int first, n;
    ct_param_group_config cfg;
    double lr_scale, wd; /* what the reference uses */
} group_spec;

typedef struct run_spec {
    ct_dtype dt;
    ref_hyper h;
    double lr, wd;     /* the optimizer's */
    int ngroups;       /* 1..3; group 0 covers params [0, groups[1].first) */
    group_spec groups[3];
    double lr_change;  /* > 0: ct_optimizer_set_lr(lr_change) after step 2 */
    int nsteps;
    double tol;
} run_spec;

/* Param i gets no gradient at step s when (i + s) % 3 == 0: param 0 sits out the first
 * step, so its first update (bias correction 1, momentum buffer = g) comes later. */
static bool has_grad(int i, int s) { return (i + s) % 3 != 0; }

static ct_optimizer *make_opt(const run_spec *rs, ct_tensor **p)
{
    const int n0 = rs->ngroups > 1 ? rs->groups[1].first : NP;
    ct_optimizer *o = NULL;
    if (rs->h.kind == REF_SGD)
        o = ct_sgd_new(n0, p, &(ct_sgd_config){.lr = rs->lr, .momentum = rs->h.momentum, .dampening = rs->h.dampening,
                                                .weight_decay = rs->wd, .nesterov = rs->h.nesterov});
    else {
        ct_adam_config c = {.lr = rs->lr, .beta1 = rs->h.b1, .beta2 = rs->h.b2, .eps = rs->h.eps, .weight_decay = rs->wd};
        o = rs->h.kind == REF_ADAM ? ct_adam_new(n0, p, &c) : ct_adamw_new(n0, p, &c);
    }
    cr_assert_not_null(o, "%s", ct_last_error());
    for (int k = 1; k < rs->ngroups; k++)
        cr_assert_eq(ct_optimizer_add_group(o, rs->groups[k].n, p + rs->groups[k].first, &rs->groups[k].cfg), CT_OK, "%s",
                     ct_last_error());
    return o;
}

static void run_vs_reference(const run_spec *rs)
{
    ct_set_seed(1234);
    CT_FRAME {
        ct_tensor *p[NP];
        ref_param r[NP];
        int group_of[NP];
        for (int i = 0; i < NP; i++) {
            p[i] = ct_tensor_randn(rs->dt, 2, shapes[i], 0, 1);
            r[i] = (ref_param){.n = ct_tensor_numel(p[i]), .p = doubles_of(p[i])};
            r[i].m = calloc((size_t)r[i].n, sizeof(double));
            r[i].v = calloc((size_t)r[i].n, sizeof(double));
            r[i].buf = calloc((size_t)r[i].n, sizeof(double));
            group_of[i] = 0;
            for (int k = 1; k < rs->ngroups; k++)
                if (i >= rs->groups[k].first && i < rs->groups[k].first + rs->groups[k].n) group_of[i] = k;
        }
        ct_optimizer *o = make_opt(rs, p);
        double lr = ct_optimizer_lr(o);
        for (int s = 0; s < rs->nsteps; s++) {
            for (int i = 0; i < NP; i++) {
                ct_tensor *g = has_grad(i, s) ? ct_tensor_randn(rs->dt, 2, shapes[i], 0, 1) : NULL;
                set_grad(p[i], g);
                if (!g) continue;
                double *gd = doubles_of(g);
                const group_spec *gs = &rs->groups[group_of[i]];
                ref_update(&rs->h, &r[i], gd, lr * gs->lr_scale, gs->wd);
                free(gd);
            }
            cr_assert_eq(ct_optimizer_step(o), CT_OK, "%s", ct_last_error());
            cr_assert_eq(ct_optimizer_step_count(o), s + 1);
            for (int i = 0; i < NP; i++) {
                double e = rel_err(p[i], r[i].p);
                cr_assert(e <= rs->tol, "kind %d %s step %d param %d: rel err %.3g > %.3g", rs->h.kind,
                          ct_dtype_name(rs->dt), s, i, e, rs->tol);
                cr_assert_eq(ct_optimizer_param_step(o, i), r[i].step);
                if (rs->h.kind != REF_SGD && r[i].step) {
                    double em = rel_err(ct_optimizer_state(o, i, "exp_avg"), r[i].m);
                    double ev = rel_err(ct_optimizer_state(o, i, "exp_avg_sq"), r[i].v);
                    /* f32 moments: b1 m + (1 - b1) g cancels when g flips sign, and the kernel's f32
                     * constants (0.9f + 0.1f != 1) then show in a one-element tensor at ~1e-5 */
                    const double stol = rs->dt == CT_DTYPE_F32 ? 1e-4 : rs->tol;
                    cr_assert(em <= stol && ev <= stol, "kind %d %s step %d param %d: exp_avg %.3g exp_avg_sq %.3g",
                              rs->h.kind, ct_dtype_name(rs->dt), s, i, em, ev);
                }
                if (rs->h.kind == REF_SGD && rs->h.momentum != 0 && r[i].step)
                    cr_assert_leq(rel_err(ct_optimizer_state(o, i, "momentum_buffer"), r[i].buf),
                                  rs->dt == CT_DTYPE_F32 ? 1e-4 : rs->tol);
            }
            if (s == 1 && rs->lr_change > 0) {
                cr_assert_eq(ct_optimizer_set_lr(o, rs->lr_change), CT_OK);
                lr = rs->lr_change;
                for (int k = 0; k < rs->ngroups; k++)
                    cr_assert_float_eq(ct_optimizer_group_lr(o, k), lr * rs->groups[k].lr_scale, 1e-15);
            }
        }
        ct_optimizer_free(o);
        for (int i = 0; i < NP; i++) free(r[i].p), free(r[i].m), free(r[i].v), free(r[i].buf);
    }
}

static run_spec one_group(ct_dtype dt, ref_hyper h, double lr, double wd_ref, double wd_cfg)
{
    run_spec rs = {.dt = dt, .h = h, .lr = lr, .wd = wd_cfg, .ngroups = 1, .nsteps = 6};
    rs.groups[0] = (group_spec){.first = 0, .n = NP, .lr_scale = 1, .wd = wd_ref};
    rs.tol = dt == CT_DTYPE_F64 ? 1e-12 : 2e-6;
    return rs;
}

Test(optimizer, sgd_matches_reference)
{
    const ref_hyper hs[] = {
        {.kind = REF_SGD},
        {.kind = REF_SGD, .momentum = 0.9},
        {.kind = REF_SGD, .momentum = 0.8, .dampening = 0.3},
        {.kind = REF_SGD, .momentum = 0.9, .nesterov = true},
    };
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof hs / sizeof *hs; k++)
            for (int w = 0; w < 2; w++) {
                const double wd = w ? 0.05 : 0;
                run_spec rs = one_group(d ? CT_DTYPE_F64 : CT_DTYPE_F32, hs[k], 0.05, wd, wd);
                run_vs_reference(&rs);
            }
}

Test(optimizer, adam_and_adamw_match_reference)
{
    const ref_hyper adam = {.kind = REF_ADAM, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8};
    ref_hyper adamw = adam, custom = {.kind = REF_ADAMW, .b1 = 0.8, .b2 = 0.95, .eps = 1e-6};
    adamw.kind = REF_ADAMW;
    for (int d = 0; d < 2; d++) {
        const ct_dtype dt = d ? CT_DTYPE_F64 : CT_DTYPE_F32;
        run_spec rs = one_group(dt, adam, 0.01, 0, 0); /* Adam: no decay by default */
        run_vs_reference(&rs);
        rs = one_group(dt, adam, 0.01, 0.1, 0.1); /* L2 in the gradient */
        run_vs_reference(&rs);
        rs = one_group(dt, adamw, 0.01, 0.01, 0); /* AdamW: decoupled, 0.01 by default */
        run_vs_reference(&rs);
        rs = one_group(dt, adamw, 0.01, 0.3, 0.3);
        run_vs_reference(&rs);
        rs = one_group(dt, custom, 3e-3, 0.1, 0.1);
        run_vs_reference(&rs);
    }
}

/* L2 (Adam) and decoupled (AdamW) decay give different parameters from equal inputs. */
Test(optimizer, adam_l2_differs_from_adamw)
{
    ct_set_seed(5);
    CT_FRAME {
        ct_tensor *p1 = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(64), 0, 1), *p2 = ct_tensor_clone(p1);
        ct_tensor *g = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(64), 0, 1);
        ct_optimizer *a = ct_adam_new(1, &p1, &(ct_adam_config){.lr = 0.1, .weight_decay = 0.5});
        ct_optimizer *w = ct_adamw_new(1, &p2, &(ct_adamw_config){.lr = 0.1, .weight_decay = 0.5});
        for (int s = 0; s < 3; s++) {
            set_grad(p1, g), set_grad(p2, g);
            cr_assert_eq(ct_optimizer_step(a), CT_OK);
            cr_assert_eq(ct_optimizer_step(w), CT_OK);
        }
        cr_assert_gt(rel_err(p1, ct_tensor_data(p2)), 1e-3);
        ct_optimizer_free(a), ct_optimizer_free(w);
    }
}

/* Step 1 from zero state: mhat = g and vhat = g^2, so p moves by lr * g / (|g| + eps);
 * AdamW first shrinks p by (1 - lr * wd). Values worked out by hand. */
Test(optimizer, adamw_first_step_by_hand)
{
    CT_FRAME {
        const double p0[4] = {1, -2, 0.5, 3}, g0[4] = {0.25, -4, 1e-3, 0};
        ct_tensor *p = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(4), p0);
        ct_optimizer *o = ct_adamw_new(1, &p, &(ct_adamw_config){.lr = 0.1, .weight_decay = 0.5});
        set_grad(p, ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(4), g0));
        cr_assert_eq(ct_optimizer_step(o), CT_OK);
        const double *q = ct_tensor_data(p);
        /* 1 * 0.95 - 0.1 * 0.25 / (0.25 + 1e-8), -2 * 0.95 + 0.1 * 4 / (4 + 1e-8), ... */
        const double want[4] = {0.95 - 0.1 * 0.25 / (0.25 + 1e-8), -1.9 + 0.1 * 4 / (4 + 1e-8),
                                0.475 - 0.1 * 1e-3 / (1e-3 + 1e-8), 2.85};
        for (int i = 0; i < 4; i++) cr_assert_float_eq(q[i], want[i], 1e-14, "p[%d] = %.17g, want %.17g", i, q[i], want[i]);
        ct_optimizer_free(o);
    }
}

Test(optimizer, defaults_as_pytorch)
{
    CT_FRAME {
        ct_tensor *p = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3));
        ct_optimizer *a = ct_adam_new(1, &p, NULL), *w = ct_adamw_new(1, &p, NULL), *s = ct_sgd_new(1, &p, NULL);
        cr_assert(a && w && s, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_lr(a), 1e-3);
        cr_assert_eq(ct_optimizer_lr(w), 1e-3);
        cr_assert_eq(ct_optimizer_lr(s), 1e-3);
        cr_assert_eq(ct_optimizer_group_weight_decay(a, 0), 0);
        cr_assert_eq(ct_optimizer_group_weight_decay(w, 0), 0.01);
        cr_assert_eq(ct_optimizer_group_weight_decay(s, 0), 0);
        cr_assert_str_eq(ct_optimizer_name(a), "adam");
        cr_assert_str_eq(ct_optimizer_name(w), "adamw");
        cr_assert_str_eq(ct_optimizer_name(s), "sgd");
        cr_assert_eq(ct_optimizer_param_count(w), 1);
        cr_assert_eq(ct_optimizer_param(w, 0), p);
        cr_assert_null(ct_optimizer_param(w, 1));
        ERROR_HAS("out of range");
        /* the same tensor in three optimizers: each holds its own reference */
        cr_assert_eq(p->refcount, 4);
        ct_optimizer_free(a), ct_optimizer_free(w), ct_optimizer_free(s);
        cr_assert_eq(p->refcount, 1);
    }
}

/* Three groups: the default one, one without decay at half the lr, one with its own
 * decay at twice the lr; the base lr changes after step 2 and the ratios stay. */
Test(optimizer, param_groups_with_own_lr_and_decay)
{
    const ref_hyper hs[3] = {
        {.kind = REF_ADAMW, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8},
        {.kind = REF_ADAM, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8},
        {.kind = REF_SGD, .momentum = 0.9, .nesterov = true},
    };
    for (int k = 0; k < 3; k++)
        for (int d = 0; d < 2; d++) {
            run_spec rs = {.dt = d ? CT_DTYPE_F64 : CT_DTYPE_F32, .h = hs[k], .lr = 0.02, .wd = 0.1, .ngroups = 3, .nsteps = 6,
                           .lr_change = 0.005, .tol = d ? 1e-12 : 2e-6};
            rs.groups[0] = (group_spec){.first = 0, .n = 2, .lr_scale = 1, .wd = 0.1};
            rs.groups[1] = (group_spec){.first = 2, .n = 2, .cfg = {.lr_scale = 0.5, .no_weight_decay = true}, .lr_scale = 0.5};
            rs.groups[2] = (group_spec){.first = 4, .n = 1, .cfg = {.lr_scale = 2, .weight_decay = 0.3}, .lr_scale = 2, .wd = 0.3};
            run_vs_reference(&rs);
        }
}

Test(optimizer, group_accessors)
{
    CT_FRAME {
        ct_tensor *p[3] = {ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2)), ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2)),
                           ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2))};
        ct_optimizer *o = ct_adamw_new(0, NULL, &(ct_adamw_config){.lr = 0.1, .weight_decay = 0.2});
        cr_assert_not_null(o, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_add_group(o, 2, p, NULL), CT_OK);
        cr_assert_eq(ct_optimizer_add_group(o, 1, p + 2, &(ct_param_group_config){.lr_scale = 0.25, .no_weight_decay = true}),
                     CT_OK);
        cr_assert_eq(ct_optimizer_group_count(o), 3);
        cr_assert_eq(ct_optimizer_group_weight_decay(o, 1), 0.2);
        cr_assert_eq(ct_optimizer_group_weight_decay(o, 2), 0);
        cr_assert_float_eq(ct_optimizer_group_lr(o, 2), 0.025, 1e-17);
        cr_assert_eq(ct_optimizer_set_lr(o, 1.0), CT_OK);
        cr_assert_eq(ct_optimizer_group_lr(o, 2), 0.25);
        cr_assert(isnan(ct_optimizer_group_lr(o, 3)));
        ERROR_HAS("group index 3");
        cr_assert_neq(ct_optimizer_set_lr(o, -1), CT_OK);
        ERROR_HAS("lr", "-1");
        cr_assert_neq(ct_optimizer_set_lr(o, NAN), CT_OK);
        cr_assert_eq(ct_optimizer_lr(o), 1.0);
        ct_optimizer_free(o);
    }
}

/* A parameter with no gradient is left alone, has no state and no steps; its first
 * update later is a first step (SGD: buffer = g; Adam: bias correction of step 1). */
Test(optimizer, params_without_grad_are_skipped)
{
    CT_FRAME {
        for (int k = 0; k < 2; k++) {
            const double p0[2] = {1, 2}, g0[2] = {0.5, -1};
            ct_tensor *p[2] = {ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), p0),
                               ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), p0)};
            ct_optimizer *o = k ? ct_adam_new(2, p, &(ct_adam_config){.lr = 0.1})
                                : ct_sgd_new(2, p, &(ct_sgd_config){.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
            ct_tensor *g = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(2), g0);
            for (int s = 0; s < 3; s++) {
                set_grad(p[0], g);
                cr_assert_eq(ct_optimizer_step(o), CT_OK, "%s", ct_last_error());
            }
            const double *q = ct_tensor_data(p[1]);
            cr_assert(q[0] == 1 && q[1] == 2);
            cr_assert_null(ct_optimizer_state(o, 1, k ? "exp_avg" : "momentum_buffer"));
            cr_assert_eq(ct_optimizer_param_step(o, 0), 3);
            cr_assert_eq(ct_optimizer_param_step(o, 1), 0);
            set_grad(p[0], NULL), set_grad(p[1], g);
            cr_assert_eq(ct_optimizer_step(o), CT_OK);
            cr_assert_eq(ct_optimizer_param_step(o, 1), 1);
            cr_assert_eq(ct_optimizer_step_count(o), 4);
            /* SGD first step: p - lr * g (buffer = g, no dampening); Adam: p - lr * sign(g) */
            const double want[2] = {k ? 1 - 0.1 * 0.5 / (0.5 + 1e-8) : 1 - 0.05, k ? 2 + 0.1 / (1 + 1e-8) : 2 + 0.1};
            cr_assert_float_eq(q[0], want[0], 1e-14);
            cr_assert_float_eq(q[1], want[1], 1e-14);
            ct_optimizer_free(o);
        }
    }
}

Test(optimizer, zero_grad_releases_grads)
{
    CT_FRAME {
        ct_tensor *p[2] = {ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3)), ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4))};
        ct_optimizer *o = ct_sgd_new(2, p, NULL);
        ct_tensor *g = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3));
        set_grad(p[0], g);
        cr_assert_eq(g->refcount, 2);
        ct_optimizer_zero_grad(o);
        cr_assert_null(p[0]->grad);
        cr_assert_null(p[1]->grad);
        cr_assert_eq(g->refcount, 1);
        cr_assert_eq(ct_optimizer_step(o), CT_OK); /* nothing to do */
        cr_assert_eq(ct_optimizer_step_count(o), 1);
        ct_optimizer_zero_grad(NULL);
        ct_optimizer_free(o);
    }
}

/* The optimizer keeps its parameters alive after the caller's frame is gone, and a
 * step adds nothing to the caller's frame. */
Test(optimizer, retains_params_and_leaves_no_temporaries)
{
    ct_set_seed(3);
    ct_optimizer *o = NULL;
    ct_tensor *p0 = NULL;
    CT_FRAME {
        ct_tensor *p[2] = {ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(40, 40), 0, 1), ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(7), 0, 1)};
        o = ct_adamw_new(2, p, NULL);
        p0 = p[0];
    }
    cr_assert_eq(p0->refcount, 1);
    CT_FRAME {
        /* a strided gradient: the transpose of a contiguous one */
        ct_tensor *gt = ct_tensor_transpose(ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(40, 40), 0, 1), 0, 1);
        ct_tensor *gc = ct_tensor_contiguous(gt);
        ct_tensor *copy = ct_tensor_clone(p0);
        ct_optimizer *o2 = ct_adamw_new(1, &copy, NULL);
        set_grad(p0, gt), set_grad(copy, gc);
        const int64_t before = ct_frame_size();
        cr_assert_eq(ct_optimizer_step(o), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_frame_size(), before);
        cr_assert_eq(ct_optimizer_step(o2), CT_OK);
        cr_assert(same_bits(p0, copy), "a strided gradient must give the update of its contiguous copy");
        ct_optimizer_zero_grad(o), ct_optimizer_free(o2);
    }
    ct_optimizer_free(o);
}

/* A bad gradient anywhere: an error naming the parameter and both shapes, and no
 * parameter or state changes, not even the ones before it. */
Test(optimizer, bad_grad_changes_nothing)
{
    CT_FRAME {
        ct_tensor *p[2] = {ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 3)), ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 3))};
        ct_tensor_set_name(p[1], "h.0.mlp.weight");
        ct_optimizer *o = ct_sgd_new(2, p, &(ct_sgd_config){.lr = 0.1, .momentum = 0.9});
        set_grad(p[0], ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2, 3)));
        set_grad(p[1], ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3, 2)));
        cr_assert_neq(ct_optimizer_step(o), CT_OK);
        ERROR_HAS("optimizer_step", "parameter 1", "h.0.mlp.weight", "f32[2, 3]", "f32[3, 2]", "shape");
        set_grad(p[1], ct_tensor_ones(CT_DTYPE_F64, CT_SHAPE(2, 3)));
        cr_assert_neq(ct_optimizer_step(o), CT_OK);
        ERROR_HAS("parameter 1", "dtype", "f64[2, 3]");
        const float *q = ct_tensor_data(p[0]);
        for (int i = 0; i < 6; i++) cr_assert_eq(q[i], 1.0f);
        cr_assert_eq(ct_optimizer_step_count(o), 0);
        cr_assert_eq(ct_optimizer_param_step(o, 0), 0);
        cr_assert_null(ct_optimizer_state(o, 0, "momentum_buffer"));
        cr_assert_neq(ct_optimizer_step(NULL), CT_OK);
        ct_optimizer_free(o);
    }
}

Test(optimizer, constructors_reject_bad_input)
{
    CT_FRAME {
        ct_tensor *good = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3));
        ct_tensor *half = ct_tensor_zeros(CT_DTYPE_F16, CT_SHAPE(4));
        ct_tensor *strided = ct_tensor_transpose(good, 0, 1);
        ct_tensor_set_name(half, "ln.weight");

        ct_tensor *l1[2] = {good, half};
        cr_assert_null(ct_adamw_new(2, l1, NULL));
        ERROR_HAS("adamw_new", "parameter 1", "ln.weight", "f16[4]", "f32 or f64");
        ct_tensor *l2[1] = {strided};
        cr_assert_null(ct_sgd_new(1, l2, NULL));
        ERROR_HAS("sgd_new", "parameter 0", "contiguous");
        ct_tensor *l3[2] = {good, good};
        cr_assert_null(ct_adam_new(2, l3, NULL));
        ERROR_HAS("adam_new", "twice");
        ct_tensor *l4[2] = {good, NULL};
        cr_assert_null(ct_adam_new(2, l4, NULL));
        ERROR_HAS("parameter 1 is NULL");
        cr_assert_null(ct_adam_new(-1, NULL, NULL));
        cr_assert_null(ct_adam_new(2, NULL, NULL));
        cr_assert_eq(good->refcount, 1, "a failed constructor must release what it retained");

        cr_assert_null(ct_sgd_new(1, &good, &(ct_sgd_config){.lr = -1}));
        ERROR_HAS("sgd_new", "lr", "-1");
        cr_assert_null(ct_sgd_new(1, &good, &(ct_sgd_config){.nesterov = true}));
        ERROR_HAS("nesterov", "momentum");
        cr_assert_null(ct_sgd_new(1, &good, &(ct_sgd_config){.nesterov = true, .momentum = 0.9, .dampening = 0.1}));
        ERROR_HAS("dampening 0.1");
        cr_assert_null(ct_adam_new(1, &good, &(ct_adam_config){.beta1 = 1}));
        ERROR_HAS("betas", "(1, 0.999)");
        cr_assert_null(ct_adamw_new(1, &good, &(ct_adamw_config){.eps = NAN}));
        ERROR_HAS("eps");
        cr_assert_null(ct_adamw_new(1, &good, &(ct_adamw_config){.weight_decay = INFINITY}));
        ERROR_HAS("weight_decay");

        ct_optimizer *o = ct_adamw_new(1, &good, NULL);
        ct_tensor *other = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(5));
        cr_assert_neq(ct_optimizer_add_group(o, 1, &other, &(ct_param_group_config){.weight_decay = 0.1, .no_weight_decay = true}), CT_OK);
        ERROR_HAS("optimizer_add_group", "no_weight_decay");
        cr_assert_neq(ct_optimizer_add_group(o, 1, &other, &(ct_param_group_config){.lr_scale = -2}), CT_OK);
        ERROR_HAS("lr_scale", "-2");
        cr_assert_neq(ct_optimizer_add_group(o, 1, &good, NULL), CT_OK);
        ERROR_HAS("already parameter 0");
        cr_assert_eq(ct_optimizer_group_count(o), 1);
        cr_assert_eq(ct_optimizer_param_count(o), 1);
        cr_assert_eq(other->refcount, 1);
        cr_assert_null(ct_optimizer_state(o, 0, "momentum_buffer"));
        ERROR_HAS("adamw keeps no state 'momentum_buffer'");
        cr_assert_neq(ct_optimizer_add_group(NULL, 0, NULL, NULL), CT_OK);
        ct_optimizer_free(o);
        ct_optimizer_free(NULL);
    }
}

/* ---- hooks: what the Accelerator installs around a prepared optimizer ------------- */

typedef struct {
    int before, after, zero_asked;
    bool skip, skip_zero;
    ct_status fail;
} hook_log;

static ct_status hook_before(ct_optimizer *o, void *data, bool *skip)
{
    (void)o;
    hook_log *h = data;
    h->before++;
    *skip = h->skip;
    return h->fail ? ct_error_set(h->fail, "hook: refused") : CT_OK;
}

static ct_status hook_after(ct_optimizer *o, void *data)
{
    (void)o;
    ((hook_log *)data)->after++;
    return CT_OK;
}

static bool hook_skip_zero(ct_optimizer *o, void *data)
{
    (void)o;
    hook_log *h = data;
    h->zero_asked++;
    return h->skip_zero;
}

Test(optimizer, hooks_skip_steps_and_zero_grad_and_hold_the_scheduler)
{
    CT_FRAME {
        ct_tensor *p = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(3), 1.0);
        ct_optimizer *o = ct_sgd_new(1, &p, &(ct_sgd_config){.lr = 0.5});
        ct_scheduler *sch = ct_scheduler_new(o, &(ct_lr_schedule){.decay = CT_LR_LINEAR, .max_lr = 0.5,
                                                                  .min_lr = 0.1, .total_steps = 4});
        cr_assert(o && sch, "%s", ct_last_error());
        hook_log h = {.skip = true, .skip_zero = true};
        ct_optimizer_set_hooks(o, &(ct_optimizer_hooks){hook_before, hook_after, hook_skip_zero, &h});
        set_grad(p, ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(3), 2.0));

        /* a skipped step changes nothing, counts nothing, holds the scheduler */
        cr_assert_eq(ct_optimizer_step(o), CT_OK);
        cr_assert(ct_optimizer_step_was_skipped(o));
        cr_assert_eq(ct_tensor_get(p, (int64_t[]){0}), 1.0);
        cr_assert_eq(ct_optimizer_step_count(o), 0);
        cr_assert_eq(ct_scheduler_step(sch), CT_OK);
        cr_assert_eq(ct_scheduler_position(sch), 0);
        cr_assert_float_eq(ct_optimizer_lr(o), 0.5, 1e-15);
        ct_optimizer_zero_grad(o);
        cr_assert_not_null(p->grad, "zero_grad was to be skipped");

        /* a real step: p = 1 - 0.5 * 2 = 0; after_step once; the scheduler moves */
        h.skip = false;
        cr_assert_eq(ct_optimizer_step(o), CT_OK);
        cr_assert(!ct_optimizer_step_was_skipped(o));
        cr_assert_eq(ct_tensor_get(p, (int64_t[]){2}), 0.0);
        cr_assert_eq(ct_scheduler_step(sch), CT_OK);
        cr_assert_eq(ct_scheduler_position(sch), 1);
        cr_assert_float_eq(ct_optimizer_lr(o), 0.4, 1e-12); /* 0.5 - (1/4) * 0.4 */
        cr_assert_eq(h.before, 2);
        cr_assert_eq(h.after, 1);

        /* a failing hook fails the step and changes nothing */
        h.fail = CT_ERR_PEER;
        cr_assert_eq(ct_optimizer_step(o), CT_ERR_PEER);
        ERROR_HAS("hook: refused");
        cr_assert_eq(ct_tensor_get(p, (int64_t[]){2}), 0.0);
        cr_assert_eq(ct_optimizer_step_count(o), 1);

        h.skip_zero = false;
        ct_optimizer_zero_grad(o);
        cr_assert_null(p->grad);
        cr_assert_eq(h.zero_asked, 2);

        /* removed hooks: plain behaviour again */
        ct_optimizer_set_hooks(o, NULL);
        h.fail = CT_OK;
        set_grad(p, ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(3), 1.0));
        cr_assert_eq(ct_optimizer_step(o), CT_OK);
        cr_assert_eq(h.before, 3);
        cr_assert_float_eq(ct_tensor_get(p, (int64_t[]){0}), -0.4, 1e-7);
        ct_scheduler_free(sch);
        ct_optimizer_free(o);
    }
}

Test(optimizer, replace_params_swaps_each_parameter_before_the_first_step)
{
    CT_FRAME {
        ct_tensor *a = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(4), 1.0), *b = ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(2), 2.0);
        ct_optimizer *o = ct_sgd_new(1, &a, &(ct_sgd_config){.lr = 0.5});
        cr_assert_not_null(o);
        ct_optimizer_add_group(o, 1, &b, &(ct_param_group_config){.lr_scale = 2});
        /* slices: a's first two elements, b's last one */
        ct_tensor *sa = ct_tensor_narrow(a, 0, 0, 2), *sb = ct_tensor_narrow(b, 0, 1, 1);
        cr_assert_eq(ct_optimizer_replace_params(o, 1, (ct_tensor *[]){sa}), CT_ERR_INVALID, "the count must match");
        cr_assert_eq(ct_optimizer_replace_params(o, 2, (ct_tensor *[]){sa, sa}), CT_ERR_INVALID, "twice");
        cr_assert_eq(ct_optimizer_replace_params(o, 2, (ct_tensor *[]){sa, sb}), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_param(o, 1), sb);
        sa->grad = ct_tensor_retain(ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(2), 1.0));
        sb->grad = ct_tensor_retain(ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(1), 1.0));
        cr_assert_eq(ct_optimizer_step(o), CT_OK);
        /* a: 1 - 0.5 on the slice only; b: 2 - 2 * 0.5 on its last element (group lr x2) */
        const float *pa = ct_tensor_data(a), *pb = ct_tensor_data(b);
        cr_assert(pa[0] == 0.5f && pa[1] == 0.5f && pa[2] == 1.0f && pa[3] == 1.0f);
        cr_assert(pb[0] == 2.0f && pb[1] == 1.0f);
        cr_assert_eq(ct_optimizer_replace_params(o, 2, (ct_tensor *[]){a, b}), CT_ERR_INVALID, "after a step");
        ct_optimizer *m = ct_adamw_new(1, &a, NULL);
        a->grad = ct_tensor_retain(ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(4), 1.0));
        cr_assert_eq(ct_optimizer_step(m), CT_OK);
        cr_assert_eq(ct_optimizer_replace_params(m, 1, &sa), CT_ERR_INVALID, "after a step");
        cr_assert(strstr(ct_last_error(), "before the first step"), "%s", ct_last_error());
        ct_optimizer_free(m);
        ct_optimizer_free(o);
    }
}
