/* ctrain — the Accelerator's handle, shared by accel/accelerator.c (prepare, the step,
 * collectives) and accel/checkpoint_*.c (save_state, load_state). Not installed. */
#ifndef CT_ACCEL_ACCELERATOR_INTERNAL_H
#define CT_ACCEL_ACCELERATOR_INTERNAL_H

#include "accel/accelerator.h"
#include "accel/checkpoint.h"
#include "dist/env.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_model.h"
#include "precision/fp8_state.h"

struct ct_accelerator {
    ct_dist_env env;
    ct_accelerator_config cfg;
    int K;
    ct_pg *pg;
    ct_ddp *ddp;
    ct_shard *shard;      /* the sharding engine, instead of DDP, for a sharded strategy */
    ct_module *model;
    ct_optimizer *opt;
    ct_loader *loader;
    ct_scheduler *sched;
    ct_param_list params; /* the model's (or the optimizer's) parameters, for clipping */
    int64_t micro;        /* micro-steps since the last synchronisation */
    bool sync;
    bool prepared;
    ct_device device;     /* where prepare places the model, its gradients and the batches */
    ct_dtype mp;          /* mixed precision: f32 (no), bf16, f16; bf16 under fp8 */
    ct_fp8_state *fp8;    /* fp8: the per-weight scaling state */
    bool scaling;         /* fp16: the loss scaler is on */
    ct_loss_scaler scaler;
    bool found_inf;       /* fp16: the current step's gradients, once unscaled */
    ct_sharding_settings sharding; /* from a plugin, a ds_config or the launcher */
    double auto_clip;     /* DeepSpeed's gradient_clipping: clip before every step; 0 none */
    bool overflow_skip;   /* the last optimizer step was skipped for an overflow */
    bool backward_ran;    /* accelerator_backward ran since the last optimizer step */
    /* training-state checkpoints (accel/checkpoint.h) */
    ct_checkpointable *objects; /* registered, names owned */
    int nobjects;
    char *project_dir;    /* owned copy of cfg.project.project_dir */
    int64_t iteration;    /* the next automatic checkpoint's number; -1 = not found yet */
    char *last_checkpoint; /* owned; NULL before a save or load */
    bool seeded;          /* ct_accelerator_set_seed ran: seed_base and seed_per_rank hold */
    uint64_t seed_base;
    bool seed_per_rank;
    /* Megatron-LM tensor parallelism (accel/megatron.c) */
    bool megatron;             /* a plugin or the launcher asked for it */
    ct_megatron_lm_plugin mlm; /* its settings, defaults filled in */
    ct_mesh *mesh;             /* dp x tp, once prepare sharded the model (tp_degree > 1) */
    bool tp_synced;            /* this step's tp gradient sync ran */
    ct_module *tp_full;        /* the last whole model gathered from the tp shards (owned) */
    /* Megatron-LM pipeline parallelism (accel/megatron_pp.c), pp_degree > 1 */
    ct_pipeline_model *pp;     /* this rank's stage (owned) */
    ct_param_list pp_all;      /* the model's tensors (buffers too) and names, whole-model order */
    int *pp_owner;             /* pp_all's stage of each (-1: every stage holds it) */
    bool pp_reduced;           /* this step's gradient reductions ran */
    const ct_tensor *pp_loss;  /* the runner's last loss (not a reference: only compared) */
    double pp_reduce_s;        /* seconds in cti_accel_megatron_pp_reduce so far */
    ct_pg *pp_stage;           /* the dp x tp ranks of this rank's stage (owned): fp8's amaxes */
};

/* accel/megatron.c. At ct_accelerator_new, after the other settings: the plugin's (or
 * the launcher's) Megatron-LM settings, checked against the world and the rest. */
ct_status cti_accel_megatron_settings(ct_accelerator *a);
/* At prepare with tp_degree > 1, instead of DDP or sharding: the mesh, the model
 * sharded over tp, the optimizer's parameters replaced by the shards, DDP over dp. */
ct_status cti_accel_megatron_prepare(ct_accelerator *a, ct_module *model, ct_optimizer *opt);
/* Once per optimizer step, after the gradient reductions (DDP's or the engine's; not
 * under a pipeline, whose reductions include it): the tp gradient sync. */
ct_status cti_accel_megatron_sync(ct_accelerator *a);
/* Under tensor parallelism: a new unsharded model of the prepared one's type holding
 * the whole of its current parameters, gathered over tp (a collective over the tp
 * group; every rank gets it). The Accelerator owns it, until the next call or
 * ct_accelerator_free. NULL + error. */
ct_module *cti_accel_megatron_full_model(ct_accelerator *a);
/* The global gradient norm over every axis, clipped to max_norm, once this step's
 * reductions and syncs have run (ct_accelerator_clip_grad_norm runs them first). NAN +
 * error. */
double cti_accel_megatron_clip(ct_accelerator *a, double max_norm, double norm_type);

/* accel/megatron_pp.c. At prepare with pp_degree > 1, after tensor parallelism sharded
 * the model: the stage cut over the mesh's pp axis, a->params its parameters, the
 * model's loss runner installed. */
ct_status cti_accel_megatron_pp_prepare(ct_accelerator *a, ct_module *model);
/* ct_accelerator_backward under pipeline parallelism: the runner ran backward; checks
 * that loss is its loss. */
ct_status cti_accel_megatron_pp_backward(ct_accelerator *a, const ct_tensor *loss);
/* Once per optimizer step: the stage's gradients averaged over dp, the tied embedding
 * summed over the first and the last stage, sequence parallelism's sums over tp. */
ct_status cti_accel_megatron_pp_reduce(ct_accelerator *a);
/* The stage holding p, a tensor of the prepared model (the tied embedding: 0), or -1
 * when every stage holds it (buffers); whether this rank's stage holds p. */
int cti_accel_megatron_pp_owner(const ct_accelerator *a, const ct_tensor *p);
bool cti_accel_megatron_pp_holds(const ct_accelerator *a, const ct_tensor *p);
/* Frees the stage and removes the loss runner. */
void cti_accel_megatron_pp_free(ct_accelerator *a);
/* The group fp8's amaxes are all-reduced over: the world, or under a pipeline the ranks
 * of this rank's stage (the others hold other weights). */
ct_pg *cti_accel_fp8_group(const ct_accelerator *a);

#endif
