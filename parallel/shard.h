/* ctrain — the sharding engine: ZeRO-1/2/3 and FSDP's strategies as settings of one
 * engine over the shard plan's flat buffers (parallel/shard_plan.h, parallel/shard_flat.h).
 *
 *     ct_shard *s = ct_shard_new(pg, &model->base, &(ct_shard_config){.strategy = CT_SHARD_FULL});
 *     ct_shard_prepare_optimizer(s, opt);       the optimizer now holds this rank's slices
 *     loss = ...; ct_backward(loss);            units reduce-scatter while backward runs
 *     ct_shard_finish(s);                       wait; every slice has its averaged gradient
 *     ct_optimizer_step(opt);                   steps the slices; then ct_shard_after_step(s)
 *
 * (The Accelerator does all of this from prepare, backward and the optimizer's hooks.)
 *
 * Units and slices. The plan groups the parameters into units by the wrap policy;
 * each unit's parameters live in one flat buffer of `padded` elements (a multiple of
 * the shard group's size S), and rank r of the shard group owns elements
 * [r*shard, (r+1)*shard). prepare_optimizer replaces each of the optimizer's
 * parameters by the part of it inside this rank's slices (a 1-d leaf, empty when the
 * slice misses it), so the optimizer's moments are sharded without the optimizer
 * knowing: AdamW works element by element, and the slices' updates are the full
 * tensors' updates.
 *
 * Strategies (parameters f32, Adam: 4 bytes of parameters, 4 of gradients, 8 of
 * moments per parameter; the f32 parameters are their own master copy; Psi
 * parameters, S ranks in the shard group):
 *
 *   strategy                    params   grads          optimizer   total per rank
 *   NO_SHARD (DDP: parallel/ddp.h)  4Psi     4Psi           8Psi        16Psi
 *   OPTIMIZER (ZeRO-1)          4Psi     4Psi + 4Psi/S  8Psi/S      8Psi + 12Psi/S
 *   GRAD_OP (ZeRO-2)            4Psi     4Psi/S         8Psi/S      4Psi + 12Psi/S
 *   FULL (ZeRO-3)               4Psi/S   4Psi/S         8Psi/S      16Psi/S
 *   FULL + offload_optimizer    4Psi/S   -              8Psi/S      20Psi/S (+ 8Psi/S master:
 *                                                                   the slices and their gradients)
 *   HYBRID                      FULL inside each group of S ranks, replicated across groups
 *
 * plus the padding of each unit to a multiple of S. ZeRO-1 keeps its full gradient
 * buffer (what it accumulates into) beside the reduced slice, as DeepSpeed's stage 1
 * keeps an fp32 gradient partition apart from its gradient buffers. These are the
 * bytes kept between steps; during a step come activations, the units gathered
 * (FULL: the root and at most two more), the gradients of the unit backward is
 * working on and at most two units' packed gradients in flight. With 16-bit
 * parameters (param_dtype) see "Mixed precision" below.
 *
 *   ZeRO-1: backward accumulates into one persistent flat gradient buffer per unit
 *   (the parameters' .grad are its views); when a unit's gradients are final, its
 *   buffer is reduce-scattered (mean) into the rank's gradient slice on the comm
 *   thread while backward goes on. After the step every unit's updated slice is
 *   all-gathered into the full parameters. Wire: Psi (reduce-scatter) + Psi
 *   (all-gather), x (S-1)/S elements, per step.
 *   ZeRO-2: the same, but a unit's gradients are packed into a temporary buffer that
 *   is freed once reduced, and the parameters' own gradients are dropped: only the
 *   slice stays. Wire 2Psi x (S-1)/S.
 *   ZeRO-3: the full parameters exist only while a unit computes: a unit's buffer is
 *   all-gathered before its forward (its module's forward hook), freed after it
 *   unless reshard_after_forward is off, gathered again before its backward (a
 *   pass-through node on the unit's output starts it), and freed again once its
 *   gradients are reduce-scattered. The root unit (the model itself) stays
 *   gathered from its forward to the end of its backward, as in FSDP. Prefetch:
 *   forward_prefetch issues the next unit's all-gather when a unit's forward
 *   starts; backward_prefetch BACKWARD_PRE when a unit's backward starts, POST when
 *   its gradients are final; at most two all-gathers are in flight. The optimizer
 *   steps the rank's slices in place; nothing is gathered after the step. Wire 3Psi
 *   x (S-1)/S (twice the parameters gathered, once the gradients scattered).
 *   HYBRID: ZeRO-3 inside shard groups of S consecutive ranks (default: the ranks of
 *   one machine, LOCAL_WORLD_SIZE); each reduced gradient slice is then averaged
 *   (all-reduce) over the N/S ranks that hold the same slice.
 *
 * CPU offload (ZeRO-Offload; offload_optimizer): the optimizer steps fp32 master
 * slices kept apart from the compute parameters, in host memory, with their own
 * gradient slices. After a unit's gradients are reduced they are copied there and
 * the compute side's reduced slice is freed; the optimizer (the fused CPU AdamW)
 * steps the masters; ct_shard_after_step copies each unit's master back into its
 * compute slice and (OPTIMIZER, GRAD_OP) starts that unit's all-gather before
 * copying the next unit, so copies and gathers overlap. On a CPU-only machine both
 * sides are host memory, but they are separate buffers and counted apart
 * (ct_shard_memory.master).
 *
 * Mixed precision (param_dtype bf16 or f16; FSDP's MixedPrecision, DeepSpeed's bf16 and
 * fp16 modes). Each unit's flat buffer, and so every parameter of the model, is 16-bit:
 * forward and backward compute with 16-bit weights, all-gathers move 2 bytes per
 * element and backward yields 16-bit gradients. The fp32 truth is a master slice per
 * unit (what the optimizer's slices are views of): finish widens each reduced
 * gradient slice into an f32 gradient for it (freed after the step), and after the
 * step the masters are rounded into the 16-bit slices (then gathered, ZeRO-1/2, or
 * at the next forward, ZeRO-3). With Adam this is DeepSpeed's mixed-precision table:
 *
 *   strategy     params   grads            optimizer (moments)  master   total
 *   OPTIMIZER    2Psi     2Psi + 2Psi/S    8Psi/S               4Psi/S   4Psi + 14Psi/S
 *   GRAD_OP      2Psi     2Psi/S           8Psi/S               4Psi/S   2Psi + 14Psi/S
 *   FULL         2Psi/S   2Psi/S           8Psi/S               4Psi/S   16Psi/S
 *
 * (ZeRO-1's extra 2Psi/S is its reduced slice beside its full gradient buffer, as
 * above.) ct_shard_gather_full gathers the masters into f32 parameters, so state
 * dicts, saved models and the unwrapped model are f32; the next forward goes back to
 * the 16-bit copies. Without param_dtype the parameters and their master copy stay
 * f32 (autocast casts per op) and reduce_dtype alone can put the gradients'
 * reduction in 16 bits (FSDP's MixedPrecision.reduce_dtype, DeepSpeed's
 * communication_data_type).
 *
 * What a model must do (nothing more than any plain C model does). Parameters may be
 * read in any way: through a unit's module forward (the hooks above: gathered just
 * before, freed just after, prefetch), or otherwise -- a layer's forward called
 * directly, a parameter passed to an op, a tied weight read by another unit, a backward
 * node. A freed unit's storage carries a residency (core/storage.h): the first read of
 * any of its parameters on the training thread all-gathers the unit, which then stays
 * gathered until its gradients are final (or ct_shard_finish); a read that cannot
 * gather (another thread, a broken group) is an error naming the parameter, its unit
 * and the strategy. Gradients are reduced when the grad-ready hooks say a unit's
 * parameters are final in the running backward (ct_backward_pass), whatever ran the
 * forward. The contract: every parameter the loss uses is one of the model's, and the
 * loop steps the optimizer given to ct_shard_prepare_optimizer.
 *
 * Gradient accumulation: with ct_shard_set_sync(s, false) gradients accumulate in the
 * parameters' .grad, unsharded (as FSDP's no_sync), and the next synchronised backward
 * reduces the sums.
 *
 * Every rank of pg must create the engine with the same model structure and the
 * same settings, and must run the same forwards and backwards and read the same
 * parameters (the collectives are issued from the hooks and the reads in program
 * order; a rank that does otherwise makes them fail with a desync error, not hang).
 *
 * Thread-safety: one training thread per handle.
 */
#ifndef CT_PARALLEL_SHARD_H
#define CT_PARALLEL_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "dist/pg.h"
#include "parallel/shard_plan.h"
#include "nn/module.h"
#include "optim/optimizer.h"

typedef struct ct_shard ct_shard;

typedef enum ct_shard_strategy {
    CT_SHARD_NO_SHARD,  /* replicated: the Accelerator uses DDP; ct_shard_new refuses it */
    CT_SHARD_OPTIMIZER, /* ZeRO-1 */
    CT_SHARD_GRAD_OP,   /* ZeRO-2, FSDP SHARD_GRAD_OP */
    CT_SHARD_FULL,      /* ZeRO-3, FSDP FULL_SHARD */
    CT_SHARD_HYBRID     /* FSDP HYBRID_SHARD */
} ct_shard_strategy;

typedef enum ct_backward_prefetch {
    CT_PREFETCH_BACKWARD_PRE, /* default: gather the next unit when a unit's backward starts */
    CT_PREFETCH_BACKWARD_POST,
    CT_PREFETCH_NONE
} ct_backward_prefetch;

/* Zero means default for every field. */
typedef struct ct_shard_config {
    ct_shard_strategy strategy;
    ct_wrap_config wrap;             /* default: no_wrap (one unit) */
    bool no_reshard_after_forward;   /* FULL/HYBRID: keep units gathered from forward to backward */
    bool forward_prefetch;
    ct_backward_prefetch backward_prefetch;
    int shard_group_size;            /* HYBRID: ranks per shard group; default LOCAL_WORLD_SIZE */
    bool offload_optimizer;          /* CPU offload: fp32 master slices and optimizer state apart
                                      * from the compute parameters (see "CPU offload") */
    ct_dtype param_dtype;            /* CT_DTYPE_BF16 or CT_DTYPE_F16: the parameters the model
                                      * computes with, gathers and gradients are 16-bit, beside
                                      * f32 master slices the optimizer steps (see "Mixed
                                      * precision"). 0 or CT_DTYPE_F32: the parameters stay f32 */
    ct_dtype reduce_dtype;           /* CT_DTYPE_BF16, CT_DTYPE_F16 or CT_DTYPE_F32: gradients
                                      * travel and are averaged in it (the comm engine sums in
                                      * f32, rounding once), then widen into the f32 gradients
                                      * the optimizer sees. 0: param_dtype (FSDP's default),
                                      * else the parameters' dtype */
    bool no_broadcast;               /* skip the broadcast of rank 0's parameters and buffers */
    /* DeepSpeed's communication settings (zero_optimization; 0/false: the defaults) */
    bool no_overlap_comm;            /* overlap_comm false: each reduction and each
                                      * after-step all-gather is waited for as soon as it is
                                      * issued, instead of running beside backward */
    int64_t allgather_bucket;        /* OPTIMIZER, GRAD_OP: elements of after-step all-gathers
                                      * in flight at most (at least one unit); 0: all units */
    int64_t prefetch_bucket;         /* FULL, HYBRID: elements of prefetched all-gathers in
                                      * flight at most (stage3_prefetch_bucket_size; at most two
                                      * units either way); 0: two units */
    int64_t persistence_threshold;   /* FULL, HYBRID: a unit of fewer elements is never freed
                                      * (stage3_param_persistence_threshold): it is all-gathered
                                      * after each step, as under GRAD_OP */
    const ct_param_list *params;     /* the model's parameters to shard (borrowed for the call;
                                      * NULL: all of them). The others are left alone: never
                                      * flattened, hooked, broadcast or read (a pipeline stage
                                      * shards its own, parallel/pipeline_model.h; the other
                                      * stages' are released). An optimizer parameter among them
                                      * stays in the optimizer as it is, a slice of its own with
                                      * no part (ct_shard_slice_part: *name NULL) */
} ct_shard_config;

/* Bytes this rank holds, by what they are for (the engine's accounting). */
typedef struct ct_shard_memory {
    int64_t params;      /* parameter storage kept between steps (full or slices) */
    int64_t grads;       /* gradient storage kept between steps (full or slices) */
    int64_t optimizer;   /* the optimizer's state (moments; momentum buffers) */
    int64_t master;      /* CPU offload: the master slices and their gradients, kept apart */
    int64_t gathered_peak; /* most bytes of full (gathered) parameters alive at once: all
                            * of them but under FULL/HYBRID */
    int64_t step_peak;   /* ctrain's live bytes at their highest during the last step */
    int64_t step_peak_reserved; /* live + the allocator's cache at their highest then
                                 * (core/storage.h): what the process holds for ctrain */
    int64_t setup_peak_reserved; /* the same during ct_shard_new */
    int64_t activations; /* step_peak less the state above (params, grads, optimizer,
                          * master): the activations and everything else transient (the
                          * units gathered, gradients before they are reduced) */
} ct_shard_memory;

typedef struct ct_shard_stats {
    ct_shard_strategy strategy;
    int64_t steps;       /* synchronised steps so far */
    int units;
    int64_t numel;       /* parameters (Psi) */
    int64_t padded;      /* elements of all flat buffers, padding included */
    int shard_world;     /* S */
    int replicas;        /* N / S */
    int64_t bytes_sent;  /* by this rank during the last step, ring algorithms: a
                          * reduce-scatter or all-gather of P bytes over G ranks sends
                          * P (G-1)/G, an all-reduce twice that */
    int64_t gathers;     /* all-gathers during the last step */
    double comm_s;       /* collectives in flight during the last step (union of intervals) */
    double exposed_s;    /* of which the training thread waited for */
    ct_shard_memory memory;
} ct_shard_stats;

/* Builds the plan of model (borrowed; it must outlive the handle) with cfg->wrap,
 * flattens every unit, broadcasts rank 0's parameters and buffers, makes the
 * sub-groups (shard, and replica for HYBRID), installs the forward and grad-ready
 * hooks, and under FULL/HYBRID frees every unit's full parameters. Collective over
 * pg (borrowed). New handle owned by the caller; NULL + error (a bad setting names
 * it; HYBRID with a shard group size that does not divide the world names both). */
CT_API ct_shard *ct_shard_new(ct_pg *pg, ct_module *model, const ct_shard_config *cfg);

/* Replaces each of opt's parameters (each must be one of the model's) by its part in
 * this rank's slices; before the first step. */
CT_API ct_status ct_shard_prepare_optimizer(ct_shard *s, ct_optimizer *opt);

/* Gradient synchronisation on (default) or off (no_sync) for the backwards that follow. */
CT_API void ct_shard_set_sync(ct_shard *s, bool sync);

/* After a synchronised backward: reduces what is left (units whose parameters took no
 * part in the forward count as zero gradients), waits, and points each optimizer
 * slice's .grad at its averaged gradient. A no-op when nothing was reduced since the
 * last call. Errors from the comm engine name the rank. */
CT_API ct_status ct_shard_finish(ct_shard *s);

/* After the optimizer stepped the slices: all-gathers the updated parameters
 * (OPTIMIZER, GRAD_OP; FULL and HYBRID gather at the next forward). */
CT_API ct_status ct_shard_after_step(ct_shard *s);

/* The optimizer's slices (borrowed; n of them) after prepare_optimizer: their .grad
 * after ct_shard_finish are this rank's part of the averaged gradients. */
CT_API ct_tensor *const *ct_shard_slices(const ct_shard *s, int *n);
/* What optimizer slice i holds: elements [*begin, *end) of the flattened parameter
 * *name (borrowed from the plan; *param is the model's parameter, its full shape);
 * begin == end when this rank's slices miss it. A parameter the engine leaves alone
 * (ct_shard_config.params): *name NULL, *param the parameter, begin == end == 0. Any
 * out pointer may be NULL. */
CT_API ct_status ct_shard_slice_part(const ct_shard *s, int i, const char **name, const ct_tensor **param,
                                     int64_t *begin, int64_t *end);
/* True on the ranks whose parts make up one copy of the state: every rank, except
 * under HYBRID, where only the first shard group's ranks (the others hold copies). */
CT_API bool ct_shard_writes_parts(const ct_shard *s);

/* The global norm_type-norm of the gradients over all slices (every rank of the
 * shard group takes part), and clips them to max_norm, as ct_clip_grad_norm does on
 * the whole model. After ct_shard_finish. NAN + error. */
CT_API double ct_shard_clip_grad_norm(ct_shard *s, double max_norm, double norm_type);

/* The full parameters, gathered: every rank calls it; each rank's model then holds
 * every parameter until ct_shard_release_full or the next forward (FULL/HYBRID, and
 * any strategy under param_dtype), or always (the others). Under param_dtype they are
 * the f32 masters, gathered into f32 parameters. */
CT_API ct_status ct_shard_gather_full(ct_shard *s);
/* FULL/HYBRID: frees the gathered parameters again; under param_dtype the parameters
 * go back to their 16-bit copies (no-op otherwise). */
CT_API void ct_shard_release_full(ct_shard *s);
/* Ends the engine's hold on the model: gathers every parameter back (collective),
 * removes the hooks; the model is a plain model again. Later finish / after_step
 * calls fail with an error saying so. */
CT_API ct_status ct_shard_detach(ct_shard *s);

/* A copy of s's counters: units, padding, bytes sent, gathers, communication time, memory per
 * rank. */
CT_API ct_shard_stats ct_shard_stats_get(const ct_shard *s);
/* The plan s was built with (units, flat sizes, padding); borrowed, valid until ct_shard_free. */
CT_API const ct_shard_plan *ct_shard_get_plan(const ct_shard *s);
/* "NO_SHARD", "OPTIMIZER", "GRAD_OP", "FULL", "HYBRID"; "invalid" otherwise. */
CT_API const char *ct_shard_strategy_name(ct_shard_strategy st);

/* Waits for pending collectives, removes the hooks, gathers the parameters back into
 * the model (FULL/HYBRID, so it keeps its values) unless a collective failed, frees
 * the buffers. NULL is fine. */
CT_API void ct_shard_free(ct_shard *s);

#endif
