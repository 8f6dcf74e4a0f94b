/* ctrain quickstart: a plain C training loop made distributed with four calls.
 *
 *   ./quickstart                                   one process
 *   ctrain launch --num_processes 2 ./quickstart   two ranks, DDP, same program
 *
 * The model is a small MLP fitting y = sin(3 x0) + x1 x2 - x3 on a synthetic dataset
 * of 4096 points. The four Accelerator calls are marked (1) to (4); remove them (and
 * use ct_backward) and it is an ordinary single-process loop.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain.h"

#define N_POINTS 4096
#define N_IN 4

/* ---- a dataset held in memory: (x (4,), y (1,)) per item ---------------------- */

typedef struct points {
    ct_dataset base; /* first: a (points *) is a (ct_dataset *) */
    float x[N_POINTS][N_IN], y[N_POINTS];
} points;

static int64_t points_len(const ct_dataset *ds)
{
    (void)ds;
    return N_POINTS;
}

static ct_status points_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out, int64_t row)
{
    const points *p = (const points *)ds;
    memcpy(ct_dataset_row(out[0], row), p->x[i], sizeof p->x[i]);
    memcpy(ct_dataset_row(out[1], row), &p->y[i], sizeof p->y[i]);
    return CT_OK;
}

static void points_free(ct_dataset *ds) { free(ds); }

static const ct_dataset_vtable points_vtable = {"points", points_len, points_get, points_free};

static ct_dataset *points_new(void)
{
    points *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    ct_rng rng;
    ct_rng_init(&rng, 7); /* the same data on every rank */
    ct_rng_uniform_f32(&rng, &p->x[0][0], N_POINTS * N_IN, -1.0f, 1.0f);
    for (int i = 0; i < N_POINTS; i++) p->y[i] = sinf(3 * p->x[i][0]) + p->x[i][1] * p->x[i][2] - p->x[i][3];
    ct_dataset_slot slots[2] = {{CT_DTYPE_F32, 1, {N_IN}}, {CT_DTYPE_F32, 1, {1}}};
    if (ct_dataset_init(&p->base, &points_vtable, 2, slots)) {
        free(p);
        return NULL;
    }
    return &p->base;
}

/* ---- the model: Linear(4, 64) -> GELU -> Linear(64, 1) -------------------------- */

typedef struct mlp {
    ct_module base;
    ct_linear_layer *fc1, *fc2;
} mlp;

static mlp *mlp_new(void)
{
    mlp *m = ct_module_alloc(sizeof *m, "MLP", NULL);
    if (!m) return NULL;
    m->fc1 = ct_linear_layer_new(N_IN, 64, true, 0.5);
    m->fc2 = ct_linear_layer_new(64, 1, true, 0.1);
    if (!m->fc1 || !m->fc2 || ct_module_add_child(&m->base, "fc1", &m->fc1->base) ||
        ct_module_add_child(&m->base, "fc2", &m->fc2->base)) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

static ct_tensor *mlp_loss(mlp *m, ct_tensor *x, ct_tensor *y)
{
    ct_tensor *pred = ct_linear_layer_forward(m->fc2, ct_gelu(ct_linear_layer_forward(m->fc1, x)));
    ct_tensor *d = ct_sub(pred, y);
    return ct_mean_all(ct_mul(d, d)); /* mean squared error */
}

int main(void)
{
    ct_set_seed(1234); /* the same initial weights everywhere (prepare broadcasts rank 0's anyway) */
    ct_dataset *ds = points_new();
    mlp *model = mlp_new();
    ct_param_list params = {0};
    if (!ds || !model || ct_module_named_tensors(&model->base, false, &params)) {
        fprintf(stderr, "quickstart: %s\n", ct_last_error());
        return 1;
    }
    ct_optimizer *opt = ct_adamw_new(params.n, params.tensors, &(ct_adamw_config){.lr = 1e-2, .weight_decay = 0.01});
    ct_loader *loader = ct_loader_new(ds, &(ct_loader_config){.batch_size = 64, .shuffle = true, .seed = 1});
    ct_accelerator *acc = ct_accelerator_new(NULL);                                   /* (1) */
    if (!opt || !loader || !acc || ct_accelerator_prepare(acc, &model->base, opt, loader, NULL)) { /* (2) */
        fprintf(stderr, "quickstart: %s\n", ct_last_error());
        return 1;
    }
    /* after prepare the loader holds this rank's share: size the schedule from it */
    const int epochs = 10;
    ct_scheduler *sched = ct_scheduler_new(opt, &(ct_lr_schedule){.decay = CT_LR_COSINE, .warmup_steps = 20,
                                                                  .total_steps = epochs * ct_loader_num_batches(loader),
                                                                  .min_lr = 1e-3});
    if (!sched) {
        fprintf(stderr, "quickstart: %s\n", ct_last_error());
        return 1;
    }
    char dev[32];
    ct_accelerator_print(acc, "quickstart: %d process(es) on %s, %lld batches per epoch each\n",
                         ct_accelerator_num_processes(acc), ct_device_str(ct_accelerator_device(acc), dev, sizeof dev),
                         (long long)ct_loader_num_batches(loader));
    int status = 0;
    for (int epoch = 0; epoch < epochs && !status; epoch++) {
        double sum = 0;
        int64_t n = 0;
        ct_tensor *x, *y;
        ct_loader_result r;
        while ((r = ct_loader_next(loader, &x, &y)) == CT_LOADER_BATCH) CT_FRAME {
            ct_tensor *loss = mlp_loss(model, x, y);
            if (!loss || ct_accelerator_backward(acc, loss) ||                   /* (3) */
                ct_optimizer_step(opt) || ct_scheduler_step(sched)) {            /* (4) steered by prepare */
                status = 1;
                break;
            }
            ct_optimizer_zero_grad(opt);
            sum += ct_tensor_item(loss);
            n++;
        }
        if (r == CT_LOADER_ERROR) status = 1;
        if (status) break;
        CT_FRAME { /* the mean training loss over all ranks */
            ct_tensor *mean = ct_accelerator_reduce(acc, ct_tensor_scalar(CT_DTYPE_F64, n ? sum / n : 0), true);
            if (!mean) status = 1;
            else ct_accelerator_print(acc, "epoch %d: train mse %.5f, lr %.2e\n", epoch, ct_tensor_item(mean),
                                      ct_optimizer_lr(opt));
        }
    }
    if (status) fprintf(stderr, "quickstart (rank %d): %s\n", ct_accelerator_process_index(acc), ct_last_error());
    ct_accelerator_free(acc);
    ct_scheduler_free(sched);
    ct_loader_free(loader);
    ct_optimizer_free(opt);
    ct_param_list_free(&params);
    ct_module_free(&model->base);
    ct_dataset_free(ds);
    return status;
}
