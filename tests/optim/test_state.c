/* Tests for optim/state.c: save -> load into a fresh optimizer -> the run continues
 * bit for bit as if uninterrupted; the file's layout; every load error leaves the
 * optimizer as it was and says what does not match. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "optim/optimizer.h"
#include "tests/optim/util.h"
#include "tests/tmpdir.h"

/* Each test's files go in a fresh directory, removed by remove_tmpdir. */
static void tmp_setup(void) { make_tmpdir_with("/tmp/ct_optim_state_"); }

/* ---- the run: 4 parameters in two groups; parameter 3 never gets a gradient ---- */

#define NP 4
#define NSTEPS 6
static const int64_t shapes[NP][2] = {{3, 5}, {17, 1}, {1, 1}, {2, 2}};
static const ct_dtype dtypes[NP] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_F32, CT_DTYPE_F32};

enum { ADAM, ADAMW, SGD, SGD_NESTEROV, SGD_PLAIN, NKINDS };

/* cfg_variant 1 builds the optimizer with other hyper-parameters, which a load must
 * overwrite with the file's. */
static ct_optimizer *make(int kind, ct_tensor **p, int variant)
{
    ct_optimizer *o = NULL;
    const double lr = variant ? 0.5 : 0.01;
    switch (kind) {
    case ADAM: o = ct_adam_new(2, p, &(ct_adam_config){.lr = lr, .beta1 = variant ? 0.5 : 0.8, .weight_decay = 0.1}); break;
    case ADAMW: o = ct_adamw_new(2, p, &(ct_adamw_config){.lr = lr, .beta2 = variant ? 0.9 : 0.95, .eps = 1e-6}); break;
    case SGD: o = ct_sgd_new(2, p, &(ct_sgd_config){.lr = lr, .momentum = variant ? 0.1 : 0.9, .dampening = 0.2}); break;
    case SGD_NESTEROV:
        o = ct_sgd_new(2, p, &(ct_sgd_config){.lr = lr, .momentum = 0.9, .nesterov = !variant, .weight_decay = 1e-2});
        break;
    case SGD_PLAIN: o = ct_sgd_new(2, p, &(ct_sgd_config){.lr = lr}); break;
    }
    cr_assert_not_null(o, "%s", ct_last_error());
    cr_assert_eq(ct_optimizer_add_group(o, 2, p + 2,
                                        &(ct_param_group_config){.lr_scale = variant ? 3 : 0.5, .no_weight_decay = true}),
                 CT_OK);
    return o;
}

/* Steps [from, to) with gradients G[s][i] and a schedule-like lr per step. */
static void run(ct_optimizer *o, ct_tensor **p, ct_tensor *G[NSTEPS][NP], int from, int to)
{
    for (int s = from; s < to; s++) {
        cr_assert_eq(ct_optimizer_set_lr(o, 0.02 / (s + 1)), CT_OK);
        for (int i = 0; i < NP; i++) set_grad(p[i], i == 3 || (s == 0 && i == 1) ? NULL : G[s][i]);
        cr_assert_eq(ct_optimizer_step(o), CT_OK, "%s", ct_last_error());
    }
}

/* NP normal tensors with the parameters' dtypes and shapes: parameters, or one step's gradients. */
static void randn_set(ct_tensor **p)
{
    for (int i = 0; i < NP; i++) p[i] = ct_tensor_randn(dtypes[i], 2, shapes[i], 0, 1);
}

static void clone_params(ct_tensor **dst, ct_tensor *const *src)
{
    for (int i = 0; i < NP; i++) dst[i] = ct_tensor_clone(src[i]);
}

static void assert_same_state(const ct_optimizer *a, const ct_optimizer *b, int kind)
{
    const char *keys[2] = {kind <= ADAMW ? "exp_avg" : "momentum_buffer", "exp_avg_sq"};
    const int nkeys = kind <= ADAMW ? 2 : kind == SGD_PLAIN ? 0 : 1;
    cr_assert_eq(ct_optimizer_step_count(a), ct_optimizer_step_count(b));
    cr_assert_eq(ct_optimizer_lr(a), ct_optimizer_lr(b));
    for (int i = 0; i < NP; i++) {
        cr_assert(same_bits(ct_optimizer_param(a, i), ct_optimizer_param(b, i)), "kind %d param %d differs", kind, i);
        cr_assert_eq(ct_optimizer_param_step(a, i), ct_optimizer_param_step(b, i));
        for (int k = 0; k < nkeys; k++) {
            ct_tensor *sa = ct_optimizer_state(a, i, keys[k]), *sb = ct_optimizer_state(b, i, keys[k]);
            cr_assert((!sa && !sb) || same_bits(sa, sb), "kind %d param %d %s differs", kind, i, keys[k]);
        }
    }
    for (int g = 0; g < 2; g++) {
        cr_assert_eq(ct_optimizer_group_lr(a, g), ct_optimizer_group_lr(b, g));
        cr_assert_eq(ct_optimizer_group_weight_decay(a, g), ct_optimizer_group_weight_decay(b, g));
    }
}

/* 6 steps straight == 3 steps, save, load into a fresh optimizer (built with other
 * hyper-parameters) over copies of the parameters, 3 more steps: bit for bit. */
Test(optim_state, resume_is_bitwise, .init = tmp_setup, .fini = remove_tmpdir)
{
    for (int kind = 0; kind < NKINDS; kind++) {
        ct_set_seed(100 + (uint64_t)kind);
        CT_FRAME {
            ct_tensor *G[NSTEPS][NP];
            for (int s = 0; s < NSTEPS; s++) randn_set(G[s]);
            ct_tensor *pa[NP], *pb[NP], *pc[NP];
            randn_set(pa);
            clone_params(pb, pa);

            ct_optimizer *a = make(kind, pa, 0);
            run(a, pa, G, 0, NSTEPS);

            ct_optimizer *b = make(kind, pb, 0);
            run(b, pb, G, 0, 3);
            const char *path = path_of("opt.safetensors");
            cr_assert_eq(ct_optimizer_save(b, path), CT_OK, "%s", ct_last_error());
            clone_params(pc, pb);
            ct_optimizer *c = make(kind, pc, 1);
            cr_assert_eq(ct_optimizer_load(c, path), CT_OK, "%s", ct_last_error());
            assert_same_state(b, c, kind);
            run(c, pc, G, 3, NSTEPS);
            assert_same_state(a, c, kind);
            ct_optimizer_free(a), ct_optimizer_free(b), ct_optimizer_free(c);
            for (int i = 0; i < NP; i++) set_grad(pa[i], NULL), set_grad(pb[i], NULL), set_grad(pc[i], NULL);
        }
    }
}

Test(optim_state, file_layout, .init = tmp_setup, .fini = remove_tmpdir)
{
    ct_set_seed(7);
    CT_FRAME {
        ct_tensor *G[NSTEPS][NP];
        for (int s = 0; s < NSTEPS; s++) randn_set(G[s]);
        ct_tensor *p[NP];
        randn_set(p);
        ct_optimizer *o = make(ADAMW, p, 0);
        run(o, p, G, 0, 3);
        const char *path = path_of("layout.safetensors");
        cr_assert_eq(ct_optimizer_save(o, path), CT_OK, "%s", ct_last_error());
        ct_safetensors *f = ct_safetensors_open(path);
        cr_assert_not_null(f, "%s", ct_last_error());
        cr_assert_eq(ct_safetensors_count(f), 6, "3 stepped parameters x (exp_avg, exp_avg_sq)");
        cr_assert(same_bits(ct_safetensors_get(f, "state.1.exp_avg_sq"), ct_optimizer_state(o, 1, "exp_avg_sq")));
        cr_assert(same_bits(ct_safetensors_get(f, "state.0.exp_avg"), ct_optimizer_state(o, 0, "exp_avg")));
        cr_assert_null(ct_safetensors_get(f, "state.3.exp_avg"));
        cr_assert_str_eq(ct_safetensors_metadata(f, "format"), "ctrain-optimizer");
        cr_assert_str_eq(ct_safetensors_metadata(f, "optimizer"), "adamw");
        cr_assert_str_eq(ct_safetensors_metadata(f, "step"), "3");
        cr_assert_str_eq(ct_safetensors_metadata(f, "params"), "4");
        cr_assert_str_eq(ct_safetensors_metadata(f, "state.1.step"), "2");
        cr_assert_str_eq(ct_safetensors_metadata(f, "group.1.weight_decay"), "0");
        cr_assert_eq(strtod(ct_safetensors_metadata(f, "lr"), NULL), 0.02 / 3);
        cr_assert_eq(strtod(ct_safetensors_metadata(f, "beta2"), NULL), 0.95);
        cr_assert_null(ct_safetensors_metadata(f, "state.3.step"));
        ct_safetensors_close(f);
        /* a fresh optimizer's file has no tensors and loads */
        ct_tensor *q = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2));
        ct_optimizer *e = ct_sgd_new(1, &q, NULL), *e2 = ct_sgd_new(1, &q, &(ct_sgd_config){.lr = 5});
        cr_assert_eq(ct_optimizer_save(e, path_of("empty.safetensors")), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_load(e2, path_of("empty.safetensors")), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_lr(e2), 1e-3);
        cr_assert_neq(ct_optimizer_save(o, tmpdir), CT_OK); /* a directory: the writer's error */
        ERROR_HAS("optimizer_save");
        ct_optimizer_free(o), ct_optimizer_free(e), ct_optimizer_free(e2);
        for (int i = 0; i < NP; i++) set_grad(p[i], NULL);
    }
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* The saved file's tensors and metadata, re-saved with one extra tensor. */
static void resave_with_extra(const char *src, const char *dst, const char *extra_name, ct_tensor *extra)
{
    ct_safetensors *f = ct_safetensors_open(src);
    cr_assert_not_null(f);
    const int n = ct_safetensors_count(f), nm = ct_safetensors_metadata_count(f);
    const char *names[16];
    ct_tensor *ts[16];
    const char *keys[64], *vals[64];
    for (int i = 0; i < n; i++) names[i] = ct_safetensors_name(f, i), ts[i] = ct_safetensors_get(f, names[i]);
    names[n] = extra_name, ts[n] = extra;
    for (int i = 0; i < nm; i++) keys[i] = ct_safetensors_metadata_key(f, i), vals[i] = ct_safetensors_metadata(f, keys[i]);
    cr_assert_eq(ct_safetensors_save(dst, n + 1, names, ts, nm, keys, vals), CT_OK, "%s", ct_last_error());
    ct_safetensors_close(f);
}

/* Each bad file: an error naming what does not match, and the optimizer unchanged. */
Test(optim_state, load_errors_change_nothing, .init = tmp_setup, .fini = remove_tmpdir)
{
    ct_set_seed(9);
    CT_FRAME {
        ct_tensor *G[NSTEPS][NP];
        for (int s = 0; s < NSTEPS; s++) randn_set(G[s]);
        ct_tensor *p[NP];
        randn_set(p);
        ct_optimizer *o = make(ADAM, p, 0);
        run(o, p, G, 0, 3);
        const char *good = path_of("good.safetensors");
        cr_assert_eq(ct_optimizer_save(o, good), CT_OK, "%s", ct_last_error());

        /* the target: stepped once, so there is state to keep intact */
        ct_tensor *q[NP];
        clone_params(q, p);
        ct_optimizer *t = make(ADAM, q, 0);
        run(t, q, G, 0, 1);
        ct_tensor *m0 = ct_tensor_clone(ct_optimizer_state(t, 0, "exp_avg"));
        const double lr0 = ct_optimizer_lr(t);
#define EXPECT_UNCHANGED()                                                             \
    do {                                                                               \
        cr_assert_eq(ct_optimizer_step_count(t), 1);                                   \
        cr_assert_eq(ct_optimizer_lr(t), lr0);                                         \
        cr_assert(same_bits(ct_optimizer_state(t, 0, "exp_avg"), m0));                 \
        cr_assert_null(ct_optimizer_state(t, 1, "exp_avg"));                           \
    } while (0)

        /* wrong parameter count */
        ct_tensor *three[3] = {p[0], p[1], p[2]};
        ct_optimizer *o3 = ct_adam_new(3, three, NULL);
        cr_assert_neq(ct_optimizer_load(o3, good), CT_OK);
        ERROR_HAS("optimizer_load", good, "state for 4 parameters, this optimizer has 3");
        ct_optimizer_free(o3);

        /* wrong group layout */
        ct_optimizer *o1 = ct_adam_new(NP, p, NULL);
        cr_assert_neq(ct_optimizer_load(o1, good), CT_OK);
        ERROR_HAS("2 parameter groups, this optimizer has 1");
        ct_optimizer_free(o1);

        /* wrong kind */
        ct_optimizer *s = make(SGD, p, 0);
        cr_assert_neq(ct_optimizer_load(s, good), CT_OK);
        ERROR_HAS("this optimizer is sgd", "'adam'");
        ct_optimizer_free(s);

        /* wrong shape and wrong dtype of parameter 1 */
        ct_tensor *r[NP] = {ct_tensor_clone(p[0]), ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(1, 17)), ct_tensor_clone(p[2]),
                            ct_tensor_clone(p[3])};
        ct_tensor_set_name(r[1], "h.0.ln_1.bias");
        ct_optimizer *ws = make(ADAM, r, 0);
        cr_assert_neq(ct_optimizer_load(ws, good), CT_OK);
        ERROR_HAS("'state.1.exp_avg' is f64[17, 1]", "parameter 1 'h.0.ln_1.bias'", "needs f64[1, 17]");
        ct_optimizer_free(ws);
        r[1] = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(17, 1));
        ct_optimizer *wd = make(ADAM, r, 0);
        cr_assert_neq(ct_optimizer_load(wd, good), CT_OK);
        ERROR_HAS("'state.1.exp_avg' is f64[17, 1]", "needs f32[17, 1]");
        ct_optimizer_free(wd);

        /* missing, corrupt and truncated files, and a safetensors file that is not optimizer state */
        cr_assert_neq(ct_optimizer_load(t, path_of("missing.safetensors")), CT_OK);
        ERROR_HAS("optimizer_load", "missing.safetensors");
        EXPECT_UNCHANGED();
        const char *bad = path_of("bad.safetensors");
        write_bytes(bad, "this is not a safetensors file at all", 37);
        cr_assert_neq(ct_optimizer_load(t, bad), CT_OK);
        ERROR_HAS("optimizer_load", "bad.safetensors");
        EXPECT_UNCHANGED();
        FILE *f = fopen(good, "rb");
        char buf[8192];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        cr_assert_lt(n, sizeof buf);
        write_bytes(bad, buf, n - 40);
        cr_assert_neq(ct_optimizer_load(t, bad), CT_OK);
        ERROR_HAS("bad.safetensors");
        EXPECT_UNCHANGED();
        ct_tensor *w = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2));
        const char *wname = "weight";
        cr_assert_eq(ct_safetensors_save(bad, 1, &wname, &w, 0, NULL, NULL), CT_OK);
        cr_assert_neq(ct_optimizer_load(t, bad), CT_OK);
        ERROR_HAS("__metadata__ has no 'format'");
        EXPECT_UNCHANGED();

        /* files with a tensor that does not belong */
        resave_with_extra(good, bad, "state.9.exp_avg", w);
        cr_assert_neq(ct_optimizer_load(t, bad), CT_OK);
        ERROR_HAS("'state.9.exp_avg' names parameter 9, this optimizer has 4");
        EXPECT_UNCHANGED();
        resave_with_extra(good, bad, "state.3.exp_avg", ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 2)));
        cr_assert_neq(ct_optimizer_load(t, bad), CT_OK);
        ERROR_HAS("'state.3.exp_avg'", "no steps");
        EXPECT_UNCHANGED();
        resave_with_extra(good, bad, "state.0.momentum_buffer", ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3, 5)));
        cr_assert_neq(ct_optimizer_load(t, bad), CT_OK);
        ERROR_HAS("'state.0.momentum_buffer' is not a state tensor");
        EXPECT_UNCHANGED();

        /* and the good file still loads into it */
        cr_assert_eq(ct_optimizer_load(t, good), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_optimizer_step_count(t), 3);
        cr_assert_neq(ct_optimizer_load(NULL, good), CT_OK);
        cr_assert_neq(ct_optimizer_load(t, NULL), CT_OK);
        ct_optimizer_free(o), ct_optimizer_free(t);
        for (int i = 0; i < NP; i++) set_grad(p[i], NULL), set_grad(q[i], NULL);
    }
}
