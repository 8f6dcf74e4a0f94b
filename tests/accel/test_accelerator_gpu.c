/* GPU conformance of the Accelerator (accel/accelerator.c): with one process and a
 * GPU, prepare places the model, the gradients, the optimizer state and the batches
 * on cuda:0 without a change to the loop; training there tracks the CPU; save_state /
 * load_state resume a GPU run bit for bit; the fp16 loss scaler finds an overflow in
 * GPU gradients and skips the step. Skipped, with the reason, without a GPU. */
#include <math.h>
#include <string.h>

#include "../gpu_conformance.h"
#include "tests/tmpdir.h"

#define N 512
#define IN 6

typedef struct pts {
    ct_dataset base;
    float x[N][IN], y[N];
} pts;

static int64_t pts_len(const ct_dataset *ds)
{
    (void)ds;
    return N;
}

static ct_status pts_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out, int64_t row)
{
    const pts *p = (const pts *)ds;
    memcpy(ct_dataset_row(out[0], row), p->x[i], sizeof p->x[i]);
    memcpy(ct_dataset_row(out[1], row), &p->y[i], sizeof p->y[i]);
    return CT_OK;
}

static void pts_free(ct_dataset *ds) { free(ds); }

static const ct_dataset_vtable pts_vt = {"points", pts_len, pts_get, pts_free};

static ct_dataset *pts_new(void)
{
    pts *p = calloc(1, sizeof *p);
    ct_rng r;
    ct_rng_init(&r, 3);
    ct_rng_uniform_f32(&r, &p->x[0][0], N * IN, -1, 1);
    for (int i = 0; i < N; i++) p->y[i] = sinf(2 * p->x[i][0]) - p->x[i][3] * p->x[i][5];
    ct_dataset_slot s[2] = {{CT_DTYPE_F32, 1, {IN}}, {CT_DTYPE_F32, 1, {1}}};
    cr_assert_eq(ct_dataset_init(&p->base, &pts_vt, 2, s), CT_OK);
    return &p->base;
}

typedef struct net {
    ct_module base;
    ct_linear_layer *a, *b;
} net;

static net *net_new(void)
{
    ct_set_seed(11);
    net *m = ct_module_alloc(sizeof *m, "Net", NULL);
    m->a = ct_linear_layer_new(IN, 33, true, 0.5);
    m->b = ct_linear_layer_new(33, 1, true, 0.2);
    cr_assert(m->a && m->b && !ct_module_add_child(&m->base, "a", &m->a->base) &&
              !ct_module_add_child(&m->base, "b", &m->b->base));
    return m;
}

static ct_tensor *net_loss(net *m, ct_tensor *x, ct_tensor *y)
{
    ct_tensor *d = ct_sub(ct_linear_layer_forward(m->b, ct_gelu(ct_linear_layer_forward(m->a, x))), y);
    return ct_mean_all(ct_mul(d, d));
}

/* A run: cfg, steps optimizer steps; losses[] (may be NULL) gets each step's loss;
 * with save_at > 0 the state is saved to dir after that step; with load, the run
 * starts by loading dir. Returns the final parameters flattened on the host. */
typedef struct run_opts {
    const ct_accelerator_config *cfg;
    int steps, save_at;
    const char *dir;
    bool load;
    double *losses;
    bool *skipped;
    int poison; /* > 0: an inf written into a gradient on the device before step poison */
} run_opts;

static ct_tensor *run(const run_opts *o)
{
    ct_accelerator *acc = ct_accelerator_new(o->cfg);
    cr_assert_not_null(acc, "%s", ct_last_error());
    net *m = net_new();
    ct_dataset *ds = pts_new();
    ct_loader *ld = ct_loader_new(ds, &(ct_loader_config){.batch_size = 32, .shuffle = true, .seed = 5});
    ct_param_list l = {0};
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    ct_optimizer *opt = ct_adamw_new(l.n, l.tensors, &(ct_adamw_config){.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.99,
                                                                        .eps = 1e-8, .weight_decay = 0.01});
    cr_assert_eq(ct_accelerator_prepare(acc, &m->base, opt, ld, NULL), CT_OK, "%s", ct_last_error());
    if (o->load) cr_assert_eq(ct_accelerator_load_state(acc, o->dir), CT_OK, "%s", ct_last_error());
    ct_device dev = ct_accelerator_device(acc);
    for (int s = 0; s < o->steps; s++) CT_FRAME {
            ct_tensor *x, *y;
            ct_loader_result r = ct_loader_next(ld, &x, &y);
            if (r == CT_LOADER_END) r = ct_loader_next(ld, &x, &y);
            cr_assert_eq(r, CT_LOADER_BATCH, "%s", ct_last_error());
            cr_assert(ct_device_equal(x->device, dev), "the batch is where the model is");
            ct_tensor *loss = net_loss(m, x, y);
            cr_assert_not_null(loss, "%s", ct_last_error());
            cr_assert_eq(ct_accelerator_backward(acc, loss), CT_OK, "%s", ct_last_error());
            cr_assert(ct_device_equal(l.tensors[0]->grad->device, dev), "gradients on the device");
            if (o->poison == s + 1)
                cr_assert_eq(ct_tensor_set(l.tensors[0]->grad, (const int64_t[]){0, 0}, INFINITY), CT_OK);
            cr_assert_eq(ct_optimizer_step(opt), CT_OK, "%s", ct_last_error());
            ct_optimizer_zero_grad(opt);
            if (o->losses) o->losses[s] = ct_tensor_item(loss);
            if (o->skipped) o->skipped[s] = ct_accelerator_step_overflowed(acc);
            if (o->save_at == s + 1) cr_assert_eq(ct_accelerator_save_state(acc, o->dir), CT_OK, "%s", ct_last_error());
        }
    int64_t total = 0;
    for (int i = 0; i < l.n; i++) total += ct_tensor_numel(l.tensors[i]);
    ct_tensor *flat = ct_tensor_empty(CT_DTYPE_F32, 1, &total);
    int64_t at = 0;
    CT_FRAME {
        for (int i = 0; i < l.n; i++) {
            int64_t n = ct_tensor_numel(l.tensors[i]);
            ct_tensor *h = ct_tensor_contiguous(ct_tensor_to(l.tensors[i], CT_CPU));
            memcpy((float *)ct_tensor_data(flat) + at, ct_tensor_data(h), (size_t)n * sizeof(float));
            at += n;
        }
    }
    ct_param_list_free(&l);
    ct_accelerator_free(acc);
    ct_optimizer_free(opt);
    ct_loader_free(ld);
    ct_dataset_free(ds);
    ct_module_free(&m->base);
    return flat;
}

Test(gpu_accelerator, prepare_places_everything_and_tracks_the_cpu, .timeout = 120)
{
    GPU_REQUIRE();
    CT_FRAME {
        double lc[40], lg[40];
        ct_tensor *pc = run(&(run_opts){.cfg = &(ct_accelerator_config){.cpu = true}, .steps = 40, .losses = lc});
        ct_tensor *pg = run(&(run_opts){.steps = 40, .losses = lg});
        for (int s = 0; s < 40; s++)
            cr_expect(fabs(lg[s] - lc[s]) <= 1e-4 * fabs(lc[s]) + 1e-7, "step %d: GPU %.8g, CPU %.8g", s, lg[s], lc[s]);
        /* 40 AdamW steps of a small net: a few f32 roundings per step compound */
        gpu_expect_close_tol(pg, pc, gpu_tolerance_chain(CT_DTYPE_F32, 40), "parameters after 40 steps");
    }
}

Test(gpu_accelerator, save_and_load_state_resume_bit_for_bit, .timeout = 120)
{
    GPU_REQUIRE();
    make_tmpdir_with("/tmp/ct_gpu_ckpt_");
    CT_FRAME {
        const char *dir = path_of("ckpt");
        ct_tensor *whole = run(&(run_opts){.steps = 12, .save_at = 7, .dir = dir});
        ct_tensor *resumed = run(&(run_opts){.steps = 5, .dir = dir, .load = true});
        gpu_expect_equal(resumed, whole, "7 steps + save, load + 5 steps = 12 steps");
    }
    remove_tmpdir();
}

Test(gpu_accelerator, fp16_overflow_skips_the_step, .timeout = 120)
{
    GPU_REQUIRE();
    CT_FRAME {
        bool skipped[3] = {0};
        ct_accelerator_config cfg = {.mixed_precision = "fp16", .loss_scaler = {.init_scale = 1024}};
        run(&(run_opts){.cfg = &cfg, .steps = 3, .skipped = skipped, .poison = 2});
        cr_assert(!skipped[0] && skipped[1] && !skipped[2], "only the step with an inf in a GPU gradient was skipped: %d %d %d", skipped[0], skipped[1], skipped[2]);
    }
}
