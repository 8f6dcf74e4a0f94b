/* ctrain — the Accelerator (accel/accelerator.h). */
#include "accel/accelerator.h"
#include "accel/accelerator_internal.h"
#include "accel/fp8_sync_internal.h"
#include "accel/plugins.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autocast_cast.h"
#include "autograd/autograd.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/threads.h"
#include "dist/env.h"
#include "optim/clip.h"
#include "core/cuda.h"
#include "precision/autocast.h"
#include "precision/loss_scaler.h"


/* ---- settings ------------------------------------------------------------------ */

static ct_status settings(ct_accelerator *a, const ct_accelerator_config *cfg)
{
    a->cfg = cfg ? *cfg : (ct_accelerator_config){0};
    ct_status st;
    /* the sharding settings first: a ds_config may bring accumulation and precision */
    if (a->cfg.shard.strategy == CT_SHARD_NO_SHARD || a->cfg.deepspeed_plugin || a->cfg.fsdp_plugin) {
        if ((st = ct_sharding_settings_resolve(a->cfg.deepspeed_plugin, a->cfg.fsdp_plugin, a->env.rank == 0,
                                               &a->sharding)))
            return ct_error_prefix("accelerator: ");
        if (a->cfg.shard.strategy != CT_SHARD_NO_SHARD && a->sharding.source)
            return ct_error_set(CT_ERR_INVALID, "accelerator: shard.strategy %s and a %s were both given: choose one",
                                ct_shard_strategy_name(a->cfg.shard.strategy), a->sharding.source);
        if (a->sharding.source) a->cfg.shard = a->sharding.shard;
        if (!a->cfg.gradient_accumulation_steps) a->cfg.gradient_accumulation_steps = a->sharding.gradient_accumulation_steps;
        if ((!a->cfg.mixed_precision || !*a->cfg.mixed_precision) && !getenv("CTRAIN_MIXED_PRECISION"))
            a->cfg.mixed_precision = a->sharding.mixed_precision;
        if (a->sharding.scaler_set && !memcmp(&a->cfg.loss_scaler, &(ct_loss_scaler_config){0}, sizeof a->cfg.loss_scaler))
            a->cfg.loss_scaler = a->sharding.scaler;
        a->auto_clip = a->sharding.gradient_clipping;
    }
    if ((st = cti_accel_megatron_settings(a))) return st;
    if (a->cfg.gradient_accumulation_steps < 0)
        return ct_error_set(CT_ERR_INVALID, "accelerator: gradient_accumulation_steps = %d; expected >= 1 (0 = default)",
                            a->cfg.gradient_accumulation_steps);
    if (a->cfg.gradient_accumulation_steps > 0) a->K = a->cfg.gradient_accumulation_steps;
    else if ((st = ct_dist_env_int("CTRAIN_GRADIENT_ACCUMULATION_STEPS", 1, 1, &a->K)))
        return ct_error_prefix("accelerator: ");
    const char *mp = a->cfg.mixed_precision;
    bool from_env = !mp || !*mp;
    if (from_env) mp = getenv("CTRAIN_MIXED_PRECISION");
    a->mp = CT_DTYPE_F32;
    if (mp && *mp && strcmp(mp, "no") != 0) {
        if (!strcmp(mp, "bf16")) a->mp = CT_DTYPE_BF16;
        else if (!strcmp(mp, "fp16")) a->mp = CT_DTYPE_F16;
        else if (!strcmp(mp, "fp8")) {
            /* linears in fp8, every other low-precision op in bf16 */
            ct_fp8_recipe r;
            a->mp = CT_DTYPE_BF16;
            if ((st = cti_accel_fp8_recipe(&a->cfg.fp8, &r)) || !(a->fp8 = ct_fp8_state_new(&r)))
                return ct_error_prefix("accelerator: mixed_precision = 'fp8': ");
        } else
            return ct_error_set(CT_ERR_INVALID, "accelerator: mixed_precision = '%s'%s; allowed: no, fp16, bf16, fp8",
                                mp, from_env ? " (CTRAIN_MIXED_PRECISION)" : "");
    }
    if (a->mp == CT_DTYPE_F16) {
        if ((st = ct_loss_scaler_init(&a->scaler, &a->cfg.loss_scaler))) return ct_error_prefix("accelerator: ");
        a->scaling = true;
    }
    int threads = 0;
    if ((st = ct_dist_env_int("CTRAIN_NUM_THREADS", 0, 1, &threads))) return ct_error_prefix("accelerator: ");
    if (threads > 0) ct_set_num_threads(threads);
    if (a->cfg.project.total_limit < 0 || a->cfg.project.iteration < 0)
        return ct_error_set(CT_ERR_INVALID, "accelerator: project.%s = %lld; expected >= 0 (0 = default)",
                            a->cfg.project.total_limit < 0 ? "total_limit" : "iteration",
                            a->cfg.project.total_limit < 0 ? (long long)a->cfg.project.total_limit
                                                           : (long long)a->cfg.project.iteration);
    if (a->cfg.project.iteration > 0) a->iteration = a->cfg.project.iteration;
    a->cfg.project.project_dir = NULL; /* the handle's copy is a->project_dir */
    if (a->cfg.timeout_s < 0 || !isfinite(a->cfg.timeout_s))
        return ct_error_set(CT_ERR_INVALID, "accelerator: timeout_s = %g; expected > 0 (0 = default)", a->cfg.timeout_s);
    return CT_OK;
}

/* ---- the device ------------------------------------------------------------------ */

/* A GPU when one can be used, as Accelerate does: cuda:(local rank), unless the
 * config's cpu flag or the launcher's --cpu (CTRAIN_USE_CPU) says otherwise. Training
 * on GPUs with several processes needs the NCCL transport, and the sharding engine
 * keeps its flat buffers on the host, so those runs stay on the CPU for now: rank 0
 * says so once rather than fail. */
static void choose_device(ct_accelerator *a)
{
    const char *env = getenv("CTRAIN_USE_CPU");
    a->device = CT_CPU;
    if (a->cfg.cpu || (env && *env && strcmp(env, "0") != 0) || !ct_cuda_is_available()) return;
    int world = a->env.world_size > 0 ? a->env.world_size : 1;
    const char *why = world > 1 ? "training on GPUs with several processes (NCCL) is not available yet"
                      : a->cfg.shard.strategy != CT_SHARD_NO_SHARD ? "the sharding strategies run on the CPU so far"
                                                                    : NULL;
    if (why) {
        if (a->env.rank == 0)
            fprintf(stderr, "ctrain: %d GPU%s found, but %s: training on the CPU (--cpu silences this)\n",
                    ct_cuda_device_count(), ct_cuda_device_count() == 1 ? "" : "s", why);
        return;
    }
    a->device = CT_CUDA(a->env.local_rank % ct_cuda_device_count());
}

ct_device ct_accelerator_device(const ct_accelerator *acc) { return acc ? acc->device : CT_CPU; }

ct_accelerator *ct_accelerator_new(const ct_accelerator_config *cfg)
{
    ct_accelerator *a = calloc(1, sizeof *a);
    if (!a) {
        ct_error_set(CT_ERR_NOMEM, "accelerator_new: out of memory");
        return NULL;
    }
    a->sync = true;
    a->iteration = -1;
    if (cfg && cfg->project.project_dir && !(a->project_dir = strdup(cfg->project.project_dir))) {
        free(a);
        ct_error_set(CT_ERR_NOMEM, "accelerator_new: out of memory");
        return NULL;
    }
    /* where this process stands first: the settings' warnings are rank 0's to print */
    ct_status st = ct_dist_env_detect(&a->env);
    if (!st) st = settings(a, cfg);
    if (!st) choose_device(a);
    if (!st) {
        double timeout = a->cfg.timeout_s > 0 ? a->cfg.timeout_s : a->env.timeout_s;
        a->pg = ct_pg_new(&(ct_pg_config){.rank = a->env.rank,
                                          .world_size = a->env.world_size,
                                          .master_addr = a->env.master_addr,
                                          .master_port = a->env.master_port,
                                          .timeout_s = timeout});
        if (!a->pg) st = ct_last_status();
    }
    if (st) {
        ct_error_prefix("accelerator_new (rank %d of %d): ", a->env.rank, a->env.world_size ? a->env.world_size : 1);
        ct_accelerator_free(a);
        return NULL;
    }
    /* every op of the process autocasts from here on: the loop needs no scope */
    if (a->fp8) ct_autocast_set_default_fp8(a->fp8);
    else if (a->mp != CT_DTYPE_F32) ct_autocast_set_default(a->mp);
    return a;
}

/* ---- prepare and the optimizer's hooks -------------------------------------------- */

/* The tensors whose .grad the optimizer steps with: the model's parameters, or this
 * rank's slices of them under a sharded strategy. */
static ct_tensor *const *stepped(const ct_accelerator *a, int *n)
{
    if (a->shard) return ct_shard_slices(a->shard, n);
    *n = a->params.n;
    return a->params.tensors;
}

/* fp16: unscales the (reduced) gradients once per step and notes an inf/NaN; with
 * sharded gradients each rank sees its slices only, so the ranks agree on it. */
static ct_status unscale_once(ct_accelerator *a)
{
    if (!a->scaling || a->scaler.unscaled) return CT_OK;
    int n = 0;
    ct_tensor *const *p = stepped(a, &n);
    ct_tensor **g = malloc((size_t)(n ? n : 1) * sizeof *g);
    if (!g) return ct_error_set(CT_ERR_NOMEM, "accelerator: out of memory unscaling");
    for (int i = 0; i < n; i++) g[i] = p[i]->grad;
    ct_status st = ct_loss_scaler_unscale(&a->scaler, n, g, &a->found_inf);
    free(g);
    /* sharded (or tensor-parallel) gradients: each rank sees its part, so the ranks agree */
    if (!st && (a->shard || a->mesh)) CT_FRAME {
        ct_tensor *f = ct_tensor_from_data(CT_DTYPE_I32, CT_SHAPE(1), (int32_t[]){a->found_inf});
        ct_work *w = f ? ct_pg_allreduce(a->pg, f, CT_REDUCE_MAX) : NULL;
        st = w ? ct_work_wait(w) : ct_last_status();
        ct_work_free(w);
        if (!st) a->found_inf = *(const int32_t *)ct_tensor_data(f) != 0;
    }
    return st ? ct_error_prefix("accelerator: ") : CT_OK;
}

/* Waits for the gradient reductions of this step (DDP, sharded, or a pipeline's, which
 * include its tensor-parallel sums), then tensor parallelism's sync of the partial
 * gradients; each runs once per step, whichever of the step and the clip comes first. */
static ct_status finish_reductions(ct_accelerator *a)
{
    if (a->pp) return cti_accel_megatron_pp_reduce(a);
    ct_status st = a->ddp ? ct_ddp_finish(a->ddp) : a->shard ? ct_shard_finish(a->shard) : CT_OK;
    return st ? st : cti_accel_megatron_sync(a);
}

/* The safety net under every strategy: backward ran, yet none of the tensors the
 * optimizer steps on this rank has a gradient, so the step would change nothing. A
 * run that trains nothing must say so. (A rank whose slices are all empty -- a model
 * smaller than the shard group -- has nothing to step and is fine.) */
static ct_status check_something_steps(ct_accelerator *a)
{
    if (!a->backward_ran) return CT_OK;
    int n = 0, nonempty = 0;
    ct_tensor *const *p = stepped(a, &n);
    for (int i = 0; i < n; i++) {
        if (!ct_tensor_numel(p[i]) || !p[i]->requires_grad) continue;
        if (p[i]->grad) return CT_OK;
        nonempty++;
    }
    if (!nonempty) return CT_OK;
    return ct_error_set(CT_ERR_INVALID,
                        "accelerator: optimizer step (rank %d of %d, %s): backward ran but none of the %d tensors the "
                        "optimizer steps has a gradient, so this step would change no parameter. Every parameter the "
                        "loss uses must be registered in the prepared model (ct_module_add_param) and be one of the "
                        "optimizer's; the loop must call ct_optimizer_step on the optimizer given to prepare",
                        a->env.rank, a->env.world_size ? a->env.world_size : 1,
                        a->shard ? ct_shard_strategy_name(ct_shard_stats_get(a->shard).strategy)
                                 : a->ddp ? "DDP" : "one process",
                        nonempty);
}

static ct_status hook_before_step(ct_optimizer *o, void *data, bool *skip)
{
    (void)o;
    ct_accelerator *a = data;
    a->overflow_skip = false;
    if (!a->sync) {
        *skip = true;
        return CT_OK;
    }
    ct_status st = finish_reductions(a);
    if (!st) st = check_something_steps(a);
    a->backward_ran = false;
    if (!st && a->scaling) st = unscale_once(a);
    /* DeepSpeed's gradient_clipping: the loop does not call clip_grad_norm itself. It
     * runs before the scaler's update, which ends this step's unscale: after it, the
     * clip would unscale the gradients a second time. A step that overflowed is not
     * clipped (it is skipped). */
    if (!st && !a->found_inf && a->auto_clip > 0 && isnan(ct_accelerator_clip_grad_norm(a, a->auto_clip, 2.0)) &&
        ct_last_status())
        st = ct_last_status();
    if (!st && a->scaling) {
        /* every rank sees the same all-reduced gradients, so every rank skips alike */
        if (ct_loss_scaler_update(&a->scaler, a->found_inf)) *skip = a->overflow_skip = true;
        a->found_inf = false;
    }
    a->tp_synced = a->pp_reduced = false; /* the next step's gradients are reduced anew */
    /* the scales of the next step, from this step's amaxes on every rank */
    if (!st && a->fp8) st = cti_accel_fp8_sync(a->fp8, cti_accel_fp8_group(a));
    return st;
}

static ct_status hook_after_step(ct_optimizer *o, void *data)
{
    (void)o;
    ct_accelerator *a = data;
    /* the low-precision copies of the old weights would stay until the next cast
     * otherwise: 2 bytes per parameter between steps, more than a ZeRO-3 shard */
    if (a->mp != CT_DTYPE_F32) ct_autocast_clear_cache();
    return a->shard ? ct_shard_after_step(a->shard) : CT_OK;
}

static bool hook_skip_zero_grad(ct_optimizer *o, void *data)
{
    (void)o;
    return !((ct_accelerator *)data)->sync;
}

/* DDP averages the model's gradients only: a parameter the optimizer steps that the
 * model does not hold would drift apart on every rank without a word. */
static ct_status check_ddp_optimizer(const ct_accelerator *a, const ct_optimizer *opt)
{
    for (int i = 0; i < ct_optimizer_param_count(opt); i++) {
        const ct_tensor *p = ct_optimizer_param(opt, i);
        bool found = false;
        for (int k = 0; k < a->params.n && !found; k++) found = a->params.tensors[k] == p;
        if (found) continue;
        char d[200];
        return ct_error_set(CT_ERR_INVALID,
                            "optimizer parameter %d (%s%s%s%s) is not a parameter of the prepared model: DDP averages "
                            "only the model's gradients, so it would train apart on every rank; register it in the "
                            "model (ct_module_add_param) before prepare, or leave it out of this optimizer",
                            i, p->name ? "'" : "", p->name ? p->name : "", p->name ? "' " : "",
                            ct_tensor_describe(p, d, sizeof d));
    }
    return CT_OK;
}

ct_status ct_accelerator_prepare(ct_accelerator *acc, ct_module *model, ct_optimizer *opt, ct_loader *loader,
                                 ct_scheduler *sched)
{
    if (!acc) return ct_error_set(CT_ERR_INVALID, "accelerator_prepare: accelerator is NULL");
    if (acc->prepared)
        return ct_error_set(CT_ERR_INVALID, "accelerator_prepare: already prepared (rank %d); prepare once", acc->env.rank);
    ct_status st = CT_OK;
    int rank = ct_pg_rank(acc->pg), world = ct_pg_size(acc->pg);
    if (model) {
        acc->model = model;
        /* "no .to('cuda') needed": the parameters move to the device in place, so the
         * optimizer's pointers stay valid and its state is made there */
        if (acc->device.type != CT_DEVICE_CPU) st = ct_module_to(model, acc->device);
        if (!st && acc->megatron && (acc->mlm.tp_degree > 1 || acc->mlm.pp_degree > 1)) {
            /* the mesh, the shards, the optimizer's new parameters, DDP over dp, the stage */
            st = cti_accel_megatron_prepare(acc, model, opt);
        } else if (!st && !(st = ct_module_named_tensors(model, false, &acc->params)) &&
                   acc->cfg.shard.strategy != CT_SHARD_NO_SHARD) {
            /* 16-bit parameters beside f32 masters under mixed precision, as FSDP under
             * Accelerate and DeepSpeed's bf16/fp16 modes, unless the config says otherwise */
            ct_shard_config sc = acc->cfg.shard;
            if (!sc.param_dtype) sc.param_dtype = acc->mp;
            acc->shard = ct_shard_new(acc->pg, model, &sc);
            if (!acc->shard) st = ct_last_status();
        } else if (!st && world > 1) {
            /* the optimizer is checked before DDP broadcasts anything: a rank that
             * refuses it then never leaves the others waiting in a collective */
            if (opt) st = check_ddp_optimizer(acc, opt);
            if (!st && !(acc->ddp = ct_ddp_new(acc->pg, model, &acc->cfg.ddp))) st = ct_last_status();
        }
    } else if (acc->megatron && (acc->mlm.tp_degree > 1 || acc->mlm.pp_degree > 1)) {
        st = cti_accel_megatron_prepare(acc, model, opt); /* refuses: no model */
    } else if (acc->cfg.shard.strategy != CT_SHARD_NO_SHARD) {
        st = ct_error_set(CT_ERR_INVALID, "strategy %s shards a model: prepare the model with the optimizer",
                          ct_shard_strategy_name(acc->cfg.shard.strategy));
    }
    if (!st && opt) {
        acc->opt = opt;
        if (acc->shard) {
            st = ct_shard_prepare_optimizer(acc->shard, opt);
        } else if (acc->ddp || acc->mesh) {
            /* checked above, before DDP was made (tensor parallelism: replaced by the shards) */
        } else if (!model) { /* clip what the optimizer holds */
            int n = ct_optimizer_param_count(opt);
            acc->params.tensors = calloc((size_t)(n ? n : 1), sizeof(ct_tensor *));
            acc->params.names = calloc((size_t)(n ? n : 1), sizeof(char *));
            if (!acc->params.tensors || !acc->params.names) st = ct_error_set(CT_ERR_NOMEM, "out of memory");
            for (int i = 0; i < n && !st; i++) {
                acc->params.tensors[i] = ct_optimizer_param(opt, i);
                acc->params.names[i] = strdup("param");
                acc->params.n++;
            }
        }
        ct_optimizer_set_hooks(opt, &(ct_optimizer_hooks){.before_step = hook_before_step,
                                                          .after_step = hook_after_step,
                                                          .skip_zero_grad = hook_skip_zero_grad,
                                                          .data = acc});
    }
    if (!st && loader) {
        acc->loader = loader;
        /* the tp ranks of one data-parallel index see the same batches */
        st = acc->mesh ? ct_loader_set_shard(loader, acc->mesh->dp_rank, acc->mesh->dp)
                       : ct_loader_set_shard(loader, rank, world);
        if (!st) st = ct_loader_set_device(loader, acc->device);
    }
    /* a ds_config's batch sizes count the data-parallel ranks (dp under tensor parallelism) */
    if (!st)
        st = ct_sharding_settings_check_ds(&acc->sharding, acc->mesh ? acc->mesh->dp : world, ct_loader_batch_size(loader),
                                           acc->K, acc->auto_clip, ct_accelerator_mixed_precision(acc));
    acc->sched = sched;
    if (st) return ct_error_prefix("accelerator_prepare (rank %d of %d): ", rank, world);
    acc->prepared = true;
    return CT_OK;
}

/* ---- the step ---------------------------------------------------------------- */

ct_status ct_accelerator_backward(ct_accelerator *acc, ct_tensor *loss)
{
    if (!acc) return ct_error_set(CT_ERR_INVALID, "accelerator_backward: accelerator is NULL");
    if (!loss) return ct_last_status() ? ct_last_status() : ct_error_set(CT_ERR_INVALID, "accelerator_backward: loss is NULL");
    if (acc->pp) {
        ct_status pst = cti_accel_megatron_pp_backward(acc, loss);
        if (!pst) acc->backward_ran = true;
        return pst;
    }
    ct_status st = CT_OK;
    /* fp16: the loss scaled up so that small gradients survive f16's range */
    double factor = (acc->scaling ? ct_loss_scaler_scale(&acc->scaler) : 1.0) / acc->K;
    CT_FRAME {
        ct_tensor *l = factor != 1.0 ? ct_mul_scalar(loss, factor) : loss;
        st = l ? ct_backward(l) : ct_last_status();
    }
    if (!st) acc->backward_ran = true;
    return st;
}

void ct_accelerator_accumulate_begin(ct_accelerator *acc)
{
    if (!acc) return;
    bool end_of_loader = acc->loader && ct_loader_num_batches(acc->loader) > 0 &&
                         ct_loader_position(acc->loader) >= ct_loader_num_batches(acc->loader);
    acc->micro++;
    acc->sync = acc->micro % acc->K == 0 || end_of_loader;
    if (acc->sync) acc->micro = 0;
    if (acc->ddp) ct_ddp_set_sync(acc->ddp, acc->sync);
    if (acc->shard) ct_shard_set_sync(acc->shard, acc->sync);
}

bool ct_accelerator_sync_gradients(const ct_accelerator *acc) { return acc && acc->sync; }

bool ct_accelerator_step_was_skipped(const ct_accelerator *acc)
{
    return acc && acc->opt && ct_optimizer_step_was_skipped(acc->opt);
}

bool ct_accelerator_step_overflowed(const ct_accelerator *acc) { return acc && acc->overflow_skip; }

double ct_accelerator_loss_scale(const ct_accelerator *acc)
{
    return acc && acc->scaling ? ct_loss_scaler_scale(&acc->scaler) : 1.0;
}

const char *ct_accelerator_mixed_precision(const ct_accelerator *acc)
{
    if (!acc || acc->mp == CT_DTYPE_F32) return "no";
    if (acc->fp8) return "fp8";
    return acc->mp == CT_DTYPE_BF16 ? "bf16" : "fp16";
}

double ct_accelerator_clip_grad_norm(ct_accelerator *acc, double max_norm, double norm_type)
{
    if (!acc || !acc->prepared) {
        ct_error_set(CT_ERR_INVALID, "accelerator_clip_grad_norm: %s", !acc ? "accelerator is NULL" : "call prepare first");
        return NAN;
    }
    if (!acc->sync) return 0.0;
    if (finish_reductions(acc)) return NAN;
    /* fp16: the norm and the clip are of the true gradients: unscale first, once */
    if (unscale_once(acc)) return NAN;
    if (acc->found_inf) return INFINITY; /* the step will be skipped; nothing to clip */
    if (acc->mesh) return cti_accel_megatron_clip(acc, max_norm, norm_type);
    if (acc->shard) return ct_shard_clip_grad_norm(acc->shard, max_norm, norm_type);
    /* DDP leaves the same averaged gradients on every rank, so the local norm is the
     * global one */
    return ct_clip_grad_norm(acc->params.n, acc->params.tensors, max_norm, norm_type);
}

/* ---- collectives on tensors ---------------------------------------------------------- */


ct_tensor *ct_accelerator_gather(ct_accelerator *acc, const ct_tensor *t)
{
    if (!acc || !t) {
        if (!ct_last_status()) ct_error_set(CT_ERR_INVALID, "accelerator_gather: NULL argument");
        return NULL;
    }
    ct_tensor *in = ct_tensor_contiguous((ct_tensor *)t);
    if (!in) return NULL;
    int64_t shape[CT_MAX_DIMS];
    int nd = in->ndim ? in->ndim : 1;
    for (int i = 0; i < nd; i++) shape[i] = in->ndim ? in->shape[i] : 1;
    shape[0] *= ct_pg_size(acc->pg);
    ct_tensor *out = ct_tensor_empty_on(in->device, in->dtype, nd, shape);
    if (!out || ct_work_run(ct_pg_allgather(acc->pg, out, in))) {
        ct_error_prefix("accelerator_gather: ");
        return NULL;
    }
    return out;
}

ct_tensor *ct_accelerator_gather_for_metrics(ct_accelerator *acc, const ct_tensor *t)
{
    ct_tensor *all = ct_accelerator_gather(acc, t);
    if (!all || !acc->loader) return all;
    const int world = ct_pg_size(acc->pg);
    ct_tensor *pads = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(world));
    ct_tensor *mine = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), (int64_t[]){ct_loader_last_padding(acc->loader)});
    if (!pads || !mine || ct_work_run(ct_pg_allgather(acc->pg, pads, mine))) {
        ct_error_prefix("accelerator_gather_for_metrics: ");
        return NULL;
    }
    const int64_t *pad = ct_tensor_data(pads), rows = all->shape[0] / world;
    int64_t keep = 0;
    for (int r = 0; r < world; r++) {
        if (pad[r] < 0 || pad[r] > rows) {
            ct_error_set(CT_ERR_INVALID,
                         "accelerator_gather_for_metrics: rank %d reports %lld padding rows in a batch of %lld; gather "
                         "the prepared loader's current batch", r, (long long)pad[r], (long long)rows);
            return NULL;
        }
        keep += rows - pad[r];
    }
    if (keep == all->shape[0]) return all;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, all->shape, sizeof shape);
    shape[0] = keep;
    ct_tensor *out = ct_tensor_empty_on(all->device, all->dtype, all->ndim, shape);
    if (!out) return NULL;
    int64_t at = 0;
    for (int r = 0; r < world; r++) {
        int64_t n = rows - pad[r];
        if (n && ct_tensor_copy_(ct_tensor_narrow(out, 0, at, n), ct_tensor_narrow(all, 0, r * rows, n))) return NULL;
        at += n;
    }
    return out;
}

ct_tensor *ct_accelerator_reduce(ct_accelerator *acc, const ct_tensor *t, bool mean)
{
    if (!acc || !t) {
        if (!ct_last_status()) ct_error_set(CT_ERR_INVALID, "accelerator_reduce: NULL argument");
        return NULL;
    }
    ct_tensor *in = ct_tensor_contiguous((ct_tensor *)t);
    ct_tensor *out = in ? ct_tensor_empty_like(in) : NULL;
    if (!out || ct_work_run(ct_pg_allreduce_out(acc->pg, out, in, mean ? CT_REDUCE_MEAN : CT_REDUCE_SUM))) {
        ct_error_prefix("accelerator_reduce: ");
        return NULL;
    }
    return out;
}

ct_tensor *ct_accelerator_pad_across_processes(ct_accelerator *acc, const ct_tensor *t, int dim, double pad_value,
                                               bool pad_first)
{
    if (!acc || !t) {
        if (!ct_last_status()) ct_error_set(CT_ERR_INVALID, "accelerator_pad_across_processes: NULL argument");
        return NULL;
    }
    char d[200];
    int nd = t->ndim;
    if (dim < 0) dim += nd;
    if (dim < 0 || dim >= nd) {
        ct_error_set(CT_ERR_INVALID, "accelerator_pad_across_processes: dim %d is out of range for %s", dim,
                     ct_tensor_describe(t, d, sizeof d));
        return NULL;
    }
    ct_tensor *size = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), (int64_t[]){t->shape[dim]});
    if (!size || ct_work_run(ct_pg_allreduce(acc->pg, size, CT_REDUCE_MAX))) {
        ct_error_prefix("accelerator_pad_across_processes: ");
        return NULL;
    }
    int64_t target = *(const int64_t *)ct_tensor_data(size);
    if (target == t->shape[dim]) return ct_tensor_contiguous((ct_tensor *)t);
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[dim] = target;
    ct_tensor *out = ct_tensor_full(t->dtype, nd, shape, pad_value);
    if (!out) return NULL;
    int64_t at = pad_first ? target - t->shape[dim] : 0;
    if (ct_tensor_copy_(ct_tensor_narrow(out, dim, at, t->shape[dim]), t)) return NULL;
    return out;
}

ct_status ct_accelerator_wait_for_everyone(ct_accelerator *acc)
{
    if (!acc) return ct_error_set(CT_ERR_INVALID, "accelerator_wait_for_everyone: accelerator is NULL");
    ct_status st = ct_work_run(ct_pg_barrier(acc->pg));
    return st ? ct_error_prefix("accelerator_wait_for_everyone: ") : CT_OK;
}

ct_status ct_accelerator_main_first_begin(ct_accelerator *acc)
{
    if (!acc) return ct_error_set(CT_ERR_INVALID, "accelerator main_process_first: accelerator is NULL");
    return ct_accelerator_is_main_process(acc) ? CT_OK : ct_accelerator_wait_for_everyone(acc);
}

ct_status ct_accelerator_main_first_end(ct_accelerator *acc)
{
    if (!acc) return ct_error_set(CT_ERR_INVALID, "accelerator main_process_first: accelerator is NULL");
    return ct_accelerator_is_main_process(acc) ? ct_accelerator_wait_for_everyone(acc) : CT_OK;
}

/* ---- who am I ------------------------------------------------------------------ */

int ct_accelerator_print(const ct_accelerator *acc, const char *fmt, ...)
{
    if (!ct_accelerator_is_main_process(acc)) return 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    return n;
}

int ct_accelerator_process_index(const ct_accelerator *acc) { return acc ? ct_pg_rank(acc->pg) : 0; }
int ct_accelerator_num_processes(const ct_accelerator *acc) { return acc ? ct_pg_size(acc->pg) : 1; }
int ct_accelerator_local_process_index(const ct_accelerator *acc) { return acc ? acc->env.local_rank : 0; }
bool ct_accelerator_is_main_process(const ct_accelerator *acc) { return !acc || ct_pg_rank(acc->pg) == 0; }
bool ct_accelerator_is_local_main_process(const ct_accelerator *acc) { return !acc || acc->env.local_rank == 0; }
int ct_accelerator_gradient_accumulation_steps(const ct_accelerator *acc) { return acc ? acc->K : 1; }

void ct_accelerator_set_seed(ct_accelerator *acc, uint64_t seed, bool device_specific)
{
    if (acc) acc->seeded = true, acc->seed_base = seed, acc->seed_per_rank = device_specific;
    ct_set_seed(seed + (acc && device_specific ? (uint64_t)ct_pg_rank(acc->pg) : 0));
}

ct_pg *ct_accelerator_pg(const ct_accelerator *acc) { return acc ? acc->pg : NULL; }
ct_ddp *ct_accelerator_ddp(const ct_accelerator *acc) { return acc ? acc->ddp : NULL; }
ct_shard *ct_accelerator_shard(const ct_accelerator *acc) { return acc ? acc->shard : NULL; }
const ct_mesh *ct_accelerator_mesh(const ct_accelerator *acc) { return acc ? acc->mesh : NULL; }

bool ct_accelerator_forward_needs_all_ranks(const ct_accelerator *acc)
{
    return acc && (acc->shard || acc->mesh);
}
bool ct_accelerator_sharded_state_dict(const ct_accelerator *acc) { return acc && acc->sharding.sharded_state_dict; }

void ct_accelerator_free(ct_accelerator *acc)
{
    if (!acc) return;
    if (acc->mp != CT_DTYPE_F32) ct_autocast_set_default(CT_DTYPE_F32);
    ct_autocast_clear_cache();
    ct_fp8_state_free(acc->fp8);
    if (acc->opt) ct_optimizer_set_hooks(acc->opt, NULL);
    ct_ddp_free(acc->ddp);
    ct_shard_free(acc->shard);
    ct_module_free(acc->tp_full);
    cti_accel_megatron_pp_free(acc);
    ct_mesh_free(acc->mesh);
    ct_param_list_free(&acc->params);
    ct_pg_free(acc->pg);
    for (int i = 0; i < acc->nobjects; i++) free((char *)acc->objects[i].name);
    free(acc->objects);
    free(acc->project_dir);
    free(acc->last_checkpoint);
    free(acc);
}
