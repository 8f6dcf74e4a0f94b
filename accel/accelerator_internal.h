/* ctrain — the Accelerator's handle, shared by accel/accelerator.c (prepare, the step,
 * collectives) and accel/checkpoint_*.c (save_state, load_state). Not installed. */
#ifndef CT_ACCEL_ACCELERATOR_INTERNAL_H
#define CT_ACCEL_ACCELERATOR_INTERNAL_H

#include "accel/accelerator.h"
#include "accel/checkpoint.h"
#include "dist/env.h"
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
};

#endif
