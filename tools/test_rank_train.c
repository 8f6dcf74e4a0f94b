/* `ctrain test`: a tiny model trained under the configured strategy against the same
 * model trained by one process (tools/test_rank.h).
 *
 * The model: x (B, 5) -> Linear(5, 11) -> GELU -> Linear(11, 3) -> pred (B, 3), loss
 * = mean((pred - y)^2) over B x 3, odd sizes so that shards and buckets end
 * mid-tensor. The data: sample n is x_k = sin(0.37 n + 1.1 k + 0.3),
 * y_j = cos(0.23 n (j + 1) + j) / 2, the same on every rank.
 *
 * Distributed: STEPS optimizer steps of AdamW through the Accelerator, which applies
 * whatever the launcher configured (DDP, ZeRO-1/2/3, FSDP, offload, mixed precision,
 * gradient accumulation K, gradient clipping), with a loader of b samples per batch
 * (BATCH, or a DeepSpeed config's micro batch) that prepare shares out: the ranks'
 * batches of micro-step j together are samples [j b W, (j + 1) b W). A rank's loss
 * at step s is the mean of its micro-steps' losses, averaged over the ranks.
 *
 * One process: every rank also trains a second copy of the model (same seed, same
 * initial weights) with the plain API, without the Accelerator: one step on the whole
 * global batch of step s (samples [s K W b, (s + 1) K W b)), in the same precision (an autocast
 * scope of the same dtype; fp8: a delayed-scaling state of its own with the same
 * recipe; fp16: the same loss scale; a sharded strategy under mixed precision: 16-bit
 * parameters rounded from f32 masters), clipped as the Accelerator clips, skipping the
 * steps the fp16 loss scaler skipped. The mean of per-sample losses over equal shares is the global mean, and
 * DDP's averaged gradient is the global batch's, so the two agree up to rounding:
 * f32 within 1e-5 relative. Low precision rounds activations and gradients (and,
 * when sharded, the 16-bit parameters the reference copies too) in a different
 * grouping on each side: a gradient rounded per micro-batch and averaged is not the
 * global batch's gradient rounded once. Measured on 2, 3 and 4 ranks under DDP,
 * ZeRO-1/2/3, FSDP SHARD_GRAD_OP, FSDP with offload, 2 accumulation steps and
 * clipping, the largest relative differences were 1e-7 (f32), 8.6e-5 (fp16), 2.3e-3
 * (bf16, with accumulation) and 6.1e-3 (fp8); the tolerances are about ten times
 * those: 1e-5, 2e-3, 2e-2 and 5e-2 (docs/launch.md, "ctrain test").
 *
 * The losses are compared on rank 0 (the others' reference runs are the same
 * computation); any rank's failure to train is reported.
 */
#include "tools/test_rank.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "nn/layers.h"
#include "optim/clip.h"
#include "precision/autocast.h"
#include "precision/fp8_state.h"

#define IN 5
#define HIDDEN 11
#define OUT 3
#define BATCH 3 /* samples per rank and micro-step */
#define STEPS 4
#define SEED 20240611

typedef struct tiny_mlp {
    ct_module base;
    ct_linear_layer *fc1, *fc2;
} tiny_mlp;

/* The module type the two layers carry: "Linear", or the first class the
 * configuration's transformer_based_wrap names (CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP,
 * e.g. "Block" or "GPT2Block,LlamaDecoderLayer"). A configuration written for the
 * user's transformer wraps its layer class; the tiny model has none, and the check
 * is of the configuration, so each layer stands for one such block and the policy
 * wraps the two as units instead of failing to find the class. */
static const char *layer_type(void)
{
    static char name[128];
    const char *cls = getenv("CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP");
    if (!cls) return "Linear";
    while (*cls == ' ' || *cls == ',') cls++;
    size_t n = strcspn(cls, ", ");
    if (!n || n >= sizeof name) return "Linear";
    memcpy(name, cls, n);
    name[n] = 0;
    return name;
}

static tiny_mlp *mlp_new(void)
{
    ct_set_seed(SEED);
    tiny_mlp *m = ct_module_alloc(sizeof *m, "TinyMLP", NULL);
    if (!m) return NULL;
    m->fc1 = ct_linear_layer_new(IN, HIDDEN, true, 0.5);
    m->fc2 = ct_linear_layer_new(HIDDEN, OUT, true, 0.3);
    if (!m->fc1 || !m->fc2 || ct_module_add_child(&m->base, "fc1", &m->fc1->base) ||
        ct_module_add_child(&m->base, "fc2", &m->fc2->base)) {
        ct_module_free(&m->base);
        return NULL;
    }
    m->fc1->base.type = m->fc2->base.type = layer_type();
    return m;
}

/* New tensors owned by the current frame. */
static ct_tensor *mlp_loss(tiny_mlp *m, ct_tensor *x, ct_tensor *y)
{
    ct_tensor *pred = ct_linear_layer_forward(m->fc2, ct_gelu(ct_linear_layer_forward(m->fc1, x)));
    ct_tensor *d = ct_sub(pred, y);
    return ct_mean_all(ct_mul(d, d));
}

/* Sample n of the data (the file's comment). */
static void sample(int64_t n, float *x, float *y)
{
    double s = (double)n;
    for (int k = 0; k < IN; k++) x[k] = (float)sin(0.37 * s + 1.1 * k + 0.3);
    for (int j = 0; j < OUT; j++) y[j] = (float)(0.5 * cos(0.23 * s * (j + 1) + j));
}

/* Samples [first, first + n) on dev, for the one-process run; owned by the current
 * frame. */
static ct_status batch(int64_t first, int64_t n, ct_device dev, ct_tensor **x, ct_tensor **y)
{
    *x = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(n, IN));
    *y = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(n, OUT));
    if (!*x || !*y) return ct_last_status();
    float *xs = ct_tensor_data(*x), *ys = ct_tensor_data(*y);
    for (int64_t i = 0; i < n; i++) sample(first + i, xs + i * IN, ys + i * OUT);
    if (dev.type != CT_DEVICE_CPU) {
        *x = ct_tensor_to(*x, dev);
        *y = ct_tensor_to(*y, dev);
        if (!*x || !*y) return ct_last_status();
    }
    return CT_OK;
}

/* The same samples as a dataset, for the Accelerator's loader. */
typedef struct synth {
    ct_dataset base; /* first: a (synth *) is a (ct_dataset *) */
    int64_t n;
} synth;

static int64_t synth_len(const ct_dataset *ds) { return ((const synth *)ds)->n; }

static ct_status synth_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out, int64_t row)
{
    (void)ds;
    sample(i, ct_dataset_row(out[0], row), ct_dataset_row(out[1], row));
    return CT_OK;
}

static void synth_free(ct_dataset *ds) { free(ds); }

static const ct_dataset_vtable SYNTH = {"ctrain test", synth_len, synth_get, synth_free};

static ct_dataset *synth_new(int64_t n)
{
    synth *d = calloc(1, sizeof *d);
    if (!d) {
        ct_error_set(CT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    d->n = n;
    ct_dataset_slot slots[2] = {{CT_DTYPE_F32, 1, {IN}}, {CT_DTYPE_F32, 1, {OUT}}};
    if (ct_dataset_init(&d->base, &SYNTH, 2, slots)) {
        free(d);
        return NULL;
    }
    return &d->base;
}

/* Samples per rank and micro-step: a DeepSpeed config's train_micro_batch_size_per_gpu
 * (or its train_batch_size / (K W)) when it gives one, so that the Accelerator's check
 * of the config against the loader passes; else BATCH. */
static int64_t micro_batch(const ct_sharding_settings *sh, int K, int world)
{
    const ct_ds_config *c = &sh->ds;
    if (!sh->has_ds) return BATCH;
    if (c->from[CT_DS_MICRO_BATCH] == CT_DS_GIVEN && c->train_micro_batch_size_per_gpu >= 1)
        return c->train_micro_batch_size_per_gpu;
    int64_t per = (int64_t)K * world;
    if (c->from[CT_DS_TRAIN_BATCH] == CT_DS_GIVEN && c->train_batch_size >= per && c->train_batch_size % per == 0)
        return c->train_batch_size / per;
    return BATCH;
}

/* Relative tolerance of the distributed loss against one process's (the file's
 * comment says where the numbers come from). */
static double tolerance(const char *mp)
{
    if (!strcmp(mp, "fp16")) return 2e-3;
    if (!strcmp(mp, "bf16")) return 2e-2;
    if (!strcmp(mp, "fp8")) return 5e-2;
    return 1e-5;
}

/* eps 1e-4 rather than 1e-8: Adam's first step moves every weight by +-lr whatever
 * its gradient's size, so a gradient near zero that rounding leaves on the other side
 * of zero would move a weight by 2 lr; with eps above the rounding noise of small
 * gradients the update is continuous in the gradient again. */
static const ct_adamw_config ADAMW = {.lr = 3e-3, .eps = 1e-4, .weight_decay = 0.01};

/* What prepare was given: the Accelerator keeps pointers to them until it is freed,
 * so they outlive it (ct_test_training_free). */
struct ct_test_trained {
    tiny_mlp *m;
    ct_param_list params;
    ct_optimizer *opt;
    ct_dataset *data;
    ct_loader *loader;
};

/* The distributed run: losses[s] = this rank's mean loss of step s; skipped[s] =
 * whether the fp16 loss scaler skipped the step, scales[s] its scale then. The
 * prepared loader gives rank r positions r, r + W, ... of the dataset in order
 * (data/loader.h), so the W batches of one micro-step together hold samples
 * [j b W, (j + 1) b W) of micro-step j: the global batch the one process takes. */
static ct_status train_distributed(ct_test_run *t, ct_accelerator *acc, int64_t b, double *losses, bool *skipped,
                                   double *scales)
{
    struct ct_test_trained *d = t->trained = calloc(1, sizeof *t->trained);
    if (!d) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    const int K = ct_accelerator_gradient_accumulation_steps(acc);
    ct_status st = (d->m = mlp_new()) ? ct_module_named_tensors(&d->m->base, false, &d->params) : ct_last_status();
    if (!st && !(d->opt = ct_adamw_new(d->params.n, d->params.tensors, &ADAMW))) st = ct_last_status();
    if (!st && !(d->data = synth_new((int64_t)STEPS * K * t->world * b))) st = ct_last_status();
    if (!st && !(d->loader = ct_loader_new(d->data, &(ct_loader_config){.batch_size = b, .no_prefetch = true})))
        st = ct_last_status();
    if (!st) st = ct_accelerator_prepare(acc, &d->m->base, d->opt, d->loader, NULL);
    for (int s = 0; s < STEPS && !st; s++) {
        double sum = 0;
        scales[s] = ct_accelerator_loss_scale(acc);
        for (int k = 0; k < K && !st; k++) {
            ct_frame_push();
            ct_tensor *x, *y, *loss = NULL;
            ct_loader_result got = ct_loader_next(d->loader, &x, &y);
            if (got != CT_LOADER_BATCH)
                st = got == CT_LOADER_ERROR ? ct_last_status()
                                            : ct_error_set(CT_ERR_INTERNAL, "the loader ended at step %d", s + 1);
            ct_accelerator_accumulate_begin(acc);
            if (!st && !(loss = mlp_loss(d->m, x, y))) st = ct_last_status();
            if (!st) st = ct_accelerator_backward(acc, loss);
            if (!st) st = ct_optimizer_step(d->opt);
            if (!st) {
                ct_optimizer_zero_grad(d->opt);
                sum += ct_tensor_item(loss);
            }
            ct_frame_pop();
        }
        losses[s] = sum / K;
        skipped[s] = ct_accelerator_step_overflowed(acc);
    }
    if (st) ct_test_check_error(t, "training through the Accelerator", st);
    return st;
}

void ct_test_training_free(ct_test_run *t)
{
    struct ct_test_trained *d = t->trained;
    if (!d) return;
    ct_loader_free(d->loader);
    ct_dataset_free(d->data);
    ct_optimizer_free(d->opt);
    ct_param_list_free(&d->params);
    if (d->m) ct_module_free(&d->m->base);
    free(d);
    t->trained = NULL;
}

/* The dtype the strategy computes with: a sharded strategy under mixed precision
 * keeps 16-bit parameters beside f32 masters (accel/plugins.h: param_dtype); DDP and
 * one process keep f32 parameters and autocast each op. */
static ct_dtype compute_dtype(ct_accelerator *acc, const ct_sharding_settings *sharding, const char *mp)
{
    if (!ct_accelerator_shard(acc)) return CT_DTYPE_F32;
    if (sharding->shard.param_dtype) return sharding->shard.param_dtype;
    return !strcmp(mp, "fp16") ? CT_DTYPE_F16 : !strcmp(mp, "no") ? CT_DTYPE_F32 : CT_DTYPE_BF16;
}

/* The one-process run on the global batches; losses[s] as above. Under a 16-bit
 * compute dtype a second copy of the model holds the 16-bit parameters: before each
 * forward they are the masters rounded, after backward their gradients widen into
 * the masters', which the optimizer steps (the sharding engine's mixed precision).
 * fp16: the loss is multiplied by the Accelerator's scale of that step and the
 * gradients divided by it, so small gradients survive fp16 as they do there. */
static ct_status train_alone(ct_test_run *t, ct_accelerator *acc, int64_t b, const bool *skipped,
                             const double *scales, double *losses)
{
    const int K = ct_accelerator_gradient_accumulation_steps(acc);
    const ct_device dev = ct_accelerator_device(acc);
    const char *mp = ct_accelerator_mixed_precision(acc);
    ct_sharding_settings sharding;
    if (ct_sharding_settings_resolve(NULL, NULL, false, &sharding)) sharding = (ct_sharding_settings){0};
    const double clip = sharding.gradient_clipping;
    const ct_dtype cdt = compute_dtype(acc, &sharding, mp);

    tiny_mlp *m = mlp_new(), *c = NULL;
    ct_param_list params = {0}, cparams = {0};
    ct_optimizer *opt = NULL;
    ct_fp8_state *fp8 = NULL;
    ct_status st = m ? ct_module_named_tensors(&m->base, false, &params) : ct_last_status();
    if (!st && cdt != CT_DTYPE_F32) {
        ct_dtype was = ct_nn_set_param_dtype(cdt);
        c = mlp_new();
        ct_nn_set_param_dtype(was);
        st = c ? ct_module_named_tensors(&c->base, false, &cparams) : ct_last_status();
    }
    if (!st && dev.type != CT_DEVICE_CPU) st = ct_module_to(&m->base, dev);
    if (!st && c && dev.type != CT_DEVICE_CPU) st = ct_module_to(&c->base, dev);
    if (!st && !(opt = ct_adamw_new(params.n, params.tensors, &ADAMW))) st = ct_last_status();
    /* The same precision as the Accelerator's, in a scope of its own. */
    bool scoped = false;
    if (!st && !strcmp(mp, "fp8")) {
        const ct_fp8_state *theirs = ct_autocast_fp8_state();
        fp8 = theirs ? ct_fp8_state_new(ct_fp8_state_recipe(theirs)) : NULL;
        st = fp8 ? ct_autocast_begin_fp8(fp8) : ct_error_set(CT_ERR_INTERNAL, "fp8: no recipe in force to copy");
    } else if (!st) {
        st = ct_autocast_begin(!strcmp(mp, "bf16")   ? CT_DTYPE_BF16
                               : !strcmp(mp, "fp16") ? CT_DTYPE_F16
                                                     : CT_DTYPE_F32);
    }
    scoped = !st;
    const int64_t global = (int64_t)K * t->world * b;
    for (int s = 0; s < STEPS && !st; s++) {
        ct_frame_push();
        if (c) {
            for (int i = 0; i < params.n && !st; i++) st = ct_tensor_copy_(cparams.tensors[i], params.tensors[i]);
            ct_autocast_weights_changed();
        }
        ct_tensor *x, *y, *loss = NULL;
        if (!st) st = batch(s * global, global, dev, &x, &y);
        if (!st && !(loss = mlp_loss(c ? c : m, x, y))) st = ct_last_status();
        ct_tensor *scaled = st || scales[s] == 1 ? loss : ct_mul(loss, ct_tensor_scalar(CT_DTYPE_F32, scales[s]));
        if (!st) st = scaled ? ct_backward(scaled) : ct_last_status();
        for (int i = 0; c && i < params.n && !st; i++) {
            ct_tensor *g = cparams.tensors[i]->grad;
            ct_tensor *wide = g ? ct_tensor_cast(g, CT_DTYPE_F32) : NULL;
            st = wide ? ct_tensor_set_grad(params.tensors[i], wide) : ct_last_status();
        }
        if (!st && scales[s] != 1) st = ct_grad_scale(params.n, params.tensors, 1 / scales[s]);
        if (!st && clip > 0 && isnan(ct_clip_grad_norm(params.n, params.tensors, clip, 2.0))) st = ct_last_status();
        if (!st && fp8) ct_fp8_state_step(fp8);
        if (!st && !skipped[s]) st = ct_optimizer_step(opt);
        if (!st) {
            ct_optimizer_zero_grad(opt);
            if (c) ct_module_zero_grad(&c->base);
            losses[s] = ct_tensor_item(loss);
        }
        ct_frame_pop();
    }
    if (scoped) ct_autocast_end();
    if (st) ct_test_check_error(t, "training one process alone", st);
    ct_fp8_state_free(fp8);
    ct_optimizer_free(opt);
    ct_param_list_free(&params);
    ct_param_list_free(&cparams);
    if (m) ct_module_free(&m->base);
    if (c) ct_module_free(&c->base);
    return st;
}

void ct_test_training(ct_test_run *t, ct_accelerator *acc)
{
    double mine[STEPS] = {0}, alone[STEPS] = {0}, mean[STEPS] = {0};
    bool skipped[STEPS] = {0};
    double scales[STEPS] = {0};
    const char *mp = ct_accelerator_mixed_precision(acc);
    const double tol = tolerance(mp);

    /* Training is one check until the losses exist (a failure to train is reported
     * as that), then one per step. */
    ct_test_check_begin(t, "training");
    ct_sharding_settings sharding;
    if (ct_sharding_settings_resolve(NULL, NULL, false, &sharding)) sharding = (ct_sharding_settings){0};
    const int64_t b = micro_batch(&sharding, ct_accelerator_gradient_accumulation_steps(acc), t->world);
    ct_status st = train_distributed(t, acc, b, mine, skipped, scales);
    if (!st && ct_test_inject_here(t, "loss")) mine[2] *= 1.5;
    if (!st) {
        ct_frame_push();
        ct_tensor *l = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(STEPS), mine);
        st = l ? ct_work_run(ct_pg_allreduce(t->pg, l, CT_REDUCE_MEAN)) : ct_last_status();
        if (!st) memcpy(mean, ct_tensor_data(l), sizeof mean);
        else ct_test_check_error(t, "the mean loss over the ranks (allreduce)", st);
        ct_frame_pop();
    }
    if (!st) st = train_alone(t, acc, b, skipped, scales, alone);
    if (st || t->msg[0]) {
        ct_test_check_end(t, "-");
        return;
    }
    for (int s = 0; s < STEPS && !t->broken; s++) {
        ct_test_check_begin(t, "training step %d", s + 1);
        double diff = fabs(mean[s] - alone[s]) / fmax(fabs(alone[s]), 1e-12);
        if (t->rank == 0 && !(diff <= tol))
            ct_test_check_fail(t, "loss %.9g (mean over %d rank%s), one process %.9g: relative difference %.1e > %.0e",
                               mean[s], t->world, t->world == 1 ? "" : "s", alone[s], diff, tol);
        ct_test_check_end(t,
                          "loss %.7f (mean over %d rank%s) = %.7f in one process (relative difference %.1e <= %.0e)%s",
                          mean[s], t->world, t->world == 1 ? "" : "s", alone[s], diff, tol,
                          skipped[s] ? "; the fp16 loss scaler skipped this step" : "");
    }
}
