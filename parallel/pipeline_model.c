/* A model cut into pipeline stages: the part every model shares (the stage's layers
 * and parameters, the groups, a training step over micro-batches, the tied
 * embedding's gradient, the global gradient norm). See pipeline_model.h. */
#include "parallel/pipeline_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/ops_nn.h"
#include "core/frame.h"
#include "dist/work.h"
#include "optim/clip.h"
#include "parallel/pipeline_model_internal.h"

bool cti_pipeline_model_owns_layer(const ct_pipeline_model *pm, const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return false;
    char *end;
    long i = strtol(name + n, &end, 10);
    return end != name + n && *end == '.' && i >= pm->first && i < pm->first + pm->count;
}

/* The stage's forward for micro-batch micro: the model's part, then on the last
 * stage the mean cross-entropy against the micro-batch's targets. */
static ct_tensor *stage_forward(void *ctx, ct_tensor *x, int micro)
{
    ct_pipeline_model *pm = ctx;
    ct_tensor *y = pm->ops.forward(pm, x);
    if (y && pm->stage == pm->num_stages - 1) y = pm->ops.loss(pm, y, pm->targets[micro]);
    return y;
}

/* A parameter of another stage: its memory is released on this rank, and a read of it
 * (a forward of the whole model, a save) is an error naming it instead of a NULL
 * pointer. No context: the model may outlive the pipeline handle. */
static ct_status other_stage_materialize(void *ctx)
{
    (void)ctx;
    return ct_error_set(CT_ERR_INVALID, "this parameter belongs to another pipeline stage: its memory was released "
                                        "on this rank (ct_pipeline_gpt_new / ct_pipeline_llama_new)");
}

static void other_stage_describe(void *ctx, const void *tensor, char *buf, int cap)
{
    (void)ctx, (void)tensor;
    snprintf(buf, (size_t)cap, "a parameter of another pipeline stage (released on this rank)");
}

/* Frees the memory of t, a parameter this stage never uses (the tensor object stays in
 * the model, shapes and names intact). Storage shared with a parameter the stage uses
 * is kept. */
static void release_other_stage(ct_tensor *t, const ct_param_list *mine)
{
    for (int k = 0; k < mine->n; k++)
        if (mine->tensors[k]->storage == t->storage) return;
    if (!t->storage->owned || ct_storage_resize(t->storage, 0)) {
        ct_error_clear();
        return; /* wrapped (mapped) memory: kept */
    }
    ct_storage_set_residency(t->storage, &(ct_storage_residency){.materialize = other_stage_materialize,
                                                                 .describe = other_stage_describe});
}

/* This stage's parameters, in the whole model's order; the others' memory released. */
static ct_status collect_params(ct_pipeline_model *pm)
{
    ct_param_list all;
    if (ct_module_named_tensors(pm->ops.root, false, &all)) return ct_last_status();
    ct_param_list *l = &pm->params;
    l->tensors = malloc(sizeof *l->tensors * (size_t)(all.n ? all.n : 1));
    l->names = malloc(sizeof *l->names * (size_t)(all.n ? all.n : 1));
    ct_status st = l->tensors && l->names ? CT_OK : ct_error_set(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < all.n; i++) {
        if (!pm->ops.owns(pm, all.names[i])) continue;
        l->names[l->n] = strdup(all.names[i]);
        if (!l->names[l->n]) {
            st = ct_error_set(CT_ERR_NOMEM, "out of memory");
            break;
        }
        l->tensors[l->n++] = all.tensors[i];
        if (pm->ops.tied_name && !strcmp(all.names[i], pm->ops.tied_name) && pm->num_stages > 1 &&
            (pm->stage == 0 || pm->stage == pm->num_stages - 1))
            pm->tied = all.tensors[i];
    }
    if (!st && pm->num_stages > 1)
        for (int i = 0; i < all.n; i++)
            if (!pm->ops.owns(pm, all.names[i])) release_other_stage(all.tensors[i], l);
    ct_param_list_free(&all);
    return st;
}

ct_pipeline_model *cti_pipeline_model_new(const cti_pp_model_ops *ops, void *model, ct_pg *stages, int stage,
                                          const ct_pipeline_config *cfg)
{
    int n = stages ? ct_pg_size(stages) : 1;
    if (stages ? stage != ct_pg_rank(stages) : stage != 0) {
        ct_error_set(CT_ERR_INVALID, "%s: stage %d given on group rank %d of %d: group rank i runs stage i", ops->op,
                     stage, stages ? ct_pg_rank(stages) : 0, n);
        return NULL;
    }
    int first, count;
    if (ct_pipeline_stage_layers(ops->num_layers, n, stage, &first, &count)) {
        ct_error_prefix("%s: cutting the model's %d layers into %d stages: ", ops->op, ops->num_layers, n);
        return NULL;
    }
    ct_pipeline_model *pm = calloc(1, sizeof *pm);
    if (!pm) {
        ct_error_set(CT_ERR_NOMEM, "%s: out of memory", ops->op);
        return NULL;
    }
    pm->ops = *ops;
    pm->model = model;
    pm->stage = stage;
    pm->num_stages = n;
    pm->first = first;
    pm->count = count;
    ct_status st = collect_params(pm);
    if (!st && n > 1) {
        /* groups of our own, made in the same order on every stage */
        int ranks[n];
        for (int i = 0; i < n; i++) ranks[i] = i;
        pm->all = ct_pg_new_subgroup(stages, ranks, n);
        if (!pm->all) st = ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
        if (!st && ops->tied_name) {
            pm->tied_group = ct_pg_new_subgroup(stages, (int[]){0, n - 1}, 2);
            if (!pm->tied_group && ct_last_status()) st = ct_last_status();
        }
    }
    if (!st) {
        pm->pp = ct_pipeline_new(stages, stage, stage_forward, pm, cfg);
        if (!pm->pp) st = ct_last_status();
    }
    if (st) {
        ct_error_prefix("%s stage %d of %d: ", ops->op, stage, n);
        ct_pipeline_model_free(pm);
        return NULL;
    }
    return pm;
}

const ct_param_list *ct_pipeline_model_params(const ct_pipeline_model *pm) { return pm ? &pm->params : NULL; }

void ct_pipeline_model_layers(const ct_pipeline_model *pm, int *first, int *count)
{
    if (first) *first = pm ? pm->first : 0;
    if (count) *count = pm ? pm->count : 0;
}

ct_pipeline *ct_pipeline_model_engine(const ct_pipeline_model *pm) { return pm ? pm->pp : NULL; }

double ct_pipeline_model_bytes_sent(const ct_pipeline_model *pm)
{
    if (!pm) return 0.0;
    return (double)ct_pipeline_stats_get(pm->pp).bytes_sent + ct_pg_bytes_sent(pm->all) +
           ct_pg_bytes_sent(pm->tied_group);
}

static ct_status check_batch(const ct_pipeline_model *pm, const ct_tensor *tokens, const ct_tensor *targets,
                             int num_micro)
{
    char d1[160], d2[160];
    const char *op = pm->ops.op;
    if (!tokens || !targets)
        return ct_error_set(CT_ERR_INVALID, "%s stage %d of %d: step needs the tokens and the targets (%s is NULL)", op,
                            pm->stage, pm->num_stages, tokens ? "targets" : "tokens");
    bool ok = tokens->ndim == 2 && targets->ndim == 2 && !ct_dtype_is_float(tokens->dtype) &&
              !ct_dtype_is_float(targets->dtype) && tokens->shape[0] == targets->shape[0] &&
              tokens->shape[1] == targets->shape[1] && tokens->shape[0] >= 1 && tokens->shape[1] >= 1;
    if (!ok)
        return ct_error_set(CT_ERR_INVALID,
                            "%s stage %d of %d: tokens %s and targets %s must be integer tensors of one shape (B, T)",
                            op, pm->stage, pm->num_stages, ct_tensor_describe(tokens, d1, sizeof d1),
                            ct_tensor_describe(targets, d2, sizeof d2));
    int64_t B = tokens->shape[0], T = tokens->shape[1];
    if (num_micro < 1 || B % num_micro != 0)
        return ct_error_set(CT_ERR_INVALID,
                            "%s stage %d of %d: a batch of %lld rows cannot be cut into %d micro-batches (the batch "
                            "size must be a multiple of the number of micro-batches, which is at least 1)",
                            op, pm->stage, pm->num_stages, (long long)B, num_micro);
    if (pm->ops.max_seq > 0 && T > pm->ops.max_seq)
        return ct_error_set(CT_ERR_INVALID, "%s stage %d of %d: sequences of %lld tokens exceed block_size %lld", op,
                            pm->stage, pm->num_stages, (long long)T, (long long)pm->ops.max_seq);
    return CT_OK;
}

/* A training run (eval false) or a forward-only one over num_micro micro-batches. */
static ct_status model_run(ct_pipeline_model *pm, ct_tensor *tokens, ct_tensor *targets, int num_micro, double *loss,
                           bool eval)
{
    if (!pm) return ct_error_set(CT_ERR_INVALID, "pipeline model %s: NULL handle", eval ? "eval" : "step");
    ct_status st = check_batch(pm, tokens, targets, num_micro);
    if (st) return st;
    int64_t b = tokens->shape[0] / num_micro;
    ct_tensor **inputs = calloc((size_t)num_micro, sizeof *inputs);
    pm->targets = calloc((size_t)num_micro, sizeof *pm->targets);
    if (!inputs || !pm->targets) {
        free(inputs);
        free(pm->targets);
        pm->targets = NULL;
        return ct_error_set(CT_ERR_NOMEM, "%s: out of memory for %d micro-batches", pm->ops.op, num_micro);
    }
    CT_FRAME {
        /* micro-batch m: rows [m b, (m + 1) b), views of the caller's tensors */
        for (int m = 0; !st && m < num_micro; m++) {
            inputs[m] = ct_tensor_narrow(tokens, 0, m * b, b);
            pm->targets[m] = ct_tensor_narrow(targets, 0, m * b, b);
            if (!inputs[m] || !pm->targets[m]) st = ct_last_status();
        }
        if (!st) st = eval ? ct_pipeline_eval(pm->pp, num_micro, inputs, loss)
                           : ct_pipeline_run(pm->pp, num_micro, inputs, loss);
    }
    free(inputs);
    free(pm->targets);
    pm->targets = NULL;
    return st;
}

ct_status ct_pipeline_model_step(ct_pipeline_model *pm, ct_tensor *tokens, ct_tensor *targets, int num_micro,
                                 double *loss)
{
    return model_run(pm, tokens, targets, num_micro, loss, false);
}

ct_status ct_pipeline_model_eval(ct_pipeline_model *pm, ct_tensor *tokens, ct_tensor *targets, int num_micro,
                                 double *loss)
{
    return model_run(pm, tokens, targets, num_micro, loss, true);
}

int ct_pipeline_model_stage_of(const ct_pipeline_model *pm, const char *name)
{
    if (!pm || !name) return -1;
    for (int s = 0; s < pm->num_stages; s++) {
        ct_pipeline_model probe = *pm;
        probe.stage = s;
        if (ct_pipeline_stage_layers(pm->ops.num_layers, pm->num_stages, s, &probe.first, &probe.count)) return -1;
        if (pm->ops.owns(&probe, name)) return s;
    }
    return -1;
}

ct_status ct_pipeline_model_sync_grads(ct_pipeline_model *pm)
{
    if (!pm) return ct_error_set(CT_ERR_INVALID, "pipeline model: NULL handle");
    ct_status st = ct_pipeline_model_sync_tied_grads(pm);
    if (!st && pm->ops.tp && pm->ops.sync_tp(pm))
        st = ct_error_prefix("%s stage %d of %d: ", pm->ops.op, pm->stage, pm->num_stages);
    return st;
}

ct_status ct_pipeline_model_sync_tied_grads(ct_pipeline_model *pm)
{
    if (!pm) return ct_error_set(CT_ERR_INVALID, "pipeline model: NULL handle");
    if (!pm->tied_group) return CT_OK;
    ct_tensor *w = pm->tied;
    if (!w->grad) {
        CT_FRAME {
            ct_tensor *z = ct_tensor_zeros(w->dtype, w->ndim, w->shape);
            if (z) w->grad = ct_tensor_retain(z);
        }
        if (!w->grad) return ct_error_prefix("%s stage %d of %d: tied gradient: ", pm->ops.op, pm->stage,
                                             pm->num_stages);
    }
    /* g_first + g_last on both: a sum of two, the same bits on either side */
    if (ct_work_run(ct_pg_allreduce(pm->tied_group, w->grad, CT_REDUCE_SUM)))
        return ct_error_prefix("%s stage %d of %d: summing the gradient of the tied %s over the first and the last "
                               "stage: ",
                               pm->ops.op, pm->stage, pm->num_stages, pm->ops.tied_name);
    return CT_OK;
}

/* sum over groups of x (f64), in place; NULL group: nothing to add */
static ct_status sum_over(ct_pg *g, double *x)
{
    if (!g || ct_pg_size(g) == 1) return CT_OK;
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *t = ct_tensor_full(CT_DTYPE_F64, 1, (int64_t[]){1}, *x);
        st = t ? ct_work_run(ct_pg_allreduce(g, t, CT_REDUCE_SUM)) : ct_last_status();
        if (!st) *x = ct_tensor_item(t);
    }
    return st;
}

double ct_pipeline_model_grad_norm(ct_pipeline_model *pm)
{
    if (!pm) {
        ct_error_set(CT_ERR_INVALID, "pipeline model: NULL handle");
        return NAN;
    }
    /* The squares this rank adds: the tied weight's second copy (on the last stage) is
     * left out (counted once); under tensor parallelism the shards' squares (summed over
     * tp) and the replicated parameters' on tp rank 0 only (the same on every rank). */
    const ct_param_list *l = &pm->params;
    ct_tensor **own = malloc(sizeof *own * (size_t)(l->n ? l->n : 1));
    if (!own) {
        ct_error_set(CT_ERR_NOMEM, "%s: out of memory", pm->ops.op);
        return NAN;
    }
    int n = 0;
    bool skip_tied = pm->tied && pm->stage != 0;
    bool tp_first = !pm->ops.tp || ct_pg_rank(pm->ops.tp) == 0;
    for (int i = 0; i < l->n; i++) {
        ct_tensor *t = l->tensors[i];
        if (skip_tied && t == pm->tied) continue;
        if (!tp_first && !pm->ops.sharded(pm, t)) continue;
        own[n++] = t;
    }
    ct_error_clear(); /* a NaN from NaN gradients sets no error: tell it from a failure */
    double sq = ct_grad_norm_sq(n, own);
    free(own);
    if (isnan(sq) && ct_last_status()) {
        ct_error_prefix("%s stage %d of %d: gradient norm: ", pm->ops.op, pm->stage, pm->num_stages);
        return NAN;
    }
    if (sum_over(pm->ops.tp, &sq) || sum_over(pm->all, &sq)) {
        ct_error_prefix("%s stage %d of %d: summing the squared gradient norms over tp and the stages: ", pm->ops.op,
                        pm->stage, pm->num_stages);
        return NAN;
    }
    return sqrt(sq);
}

double ct_pipeline_model_clip_grad_norm(ct_pipeline_model *pm, double max_norm)
{
    if (pm && !(max_norm >= 0)) {
        ct_error_set(CT_ERR_INVALID, "%s: max_norm %g must be >= 0", pm->ops.op, max_norm);
        return NAN;
    }
    ct_error_clear();
    double total = ct_pipeline_model_grad_norm(pm);
    if (isnan(total) && ct_last_status()) return NAN;
    if (ct_grad_scale(pm->params.n, pm->params.tensors, ct_clip_coef(total, max_norm))) {
        ct_error_prefix("%s stage %d of %d: clipping: ", pm->ops.op, pm->stage, pm->num_stages);
        return NAN;
    }
    return total;
}

void ct_pipeline_model_free(ct_pipeline_model *pm)
{
    if (!pm) return;
    ct_pipeline_free(pm->pp);
    ct_pg_free(pm->tied_group);
    ct_pg_free(pm->all);
    ct_param_list_free(&pm->params);
    free(pm);
}
