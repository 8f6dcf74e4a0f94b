/* ctrain — the sharding engine's handle, shared by parallel/shard.c (set-up, optimizer
 * slices, accounting), parallel/shard_params.c (gathering and freeing units, the forward
 * hooks, prefetch) and parallel/shard_grads.c (reductions, finish, clipping). Not
 * installed. */
#ifndef CT_PARALLEL_SHARD_INTERNAL_H
#define CT_PARALLEL_SHARD_INTERNAL_H

#include <pthread.h>

#include "parallel/shard.h"

/* One collective in flight, with what it holds and when it started. */
typedef struct shard_op {
    ct_work *work;
    ct_tensor *keep; /* an input it needs until it completes (owned), or NULL */
    double t_submit;
} shard_op;

typedef struct shard_unit {
    struct ct_shard *engine;
    ct_shard_unit *plan; /* borrowed from the engine's plan */
    int index;
    ct_tensor *flat;     /* owned: padded full buffer; the module's parameters are its views.
                          * FULL/HYBRID: its storage has memory only while gathered */
    ct_tensor *shard;    /* owned: this rank's slice; a view of flat (OPTIMIZER, GRAD_OP) or
                          * its own buffer, the only persistent copy (FULL, HYBRID) */
    ct_tensor *grad_shard; /* owned: this rank's averaged gradient slice */
    ct_tensor *flat_grad;  /* OPTIMIZER: owned persistent full gradient buffer (the
                            * parameters' .grad are its views) */
    ct_tensor *master;      /* CPU offload or param_dtype: owned fp32 master slice, what the
                             * optimizer steps */
    ct_tensor *master_grad; /* its gradient, owned: CPU offload keeps it (grad_shard then
                             * lives only from the reduction to the copy into this);
                             * param_dtype alone makes it in finish and frees it after
                             * the step */
    ct_tensor *full32;      /* param_dtype: the f32 parameters ct_shard_gather_full gathered
                             * from the masters (owned), while the model points at them */
    bool gathered;       /* the full parameters hold data */
    bool persistent;     /* FULL/HYBRID: below persistence_threshold, never freed */
    shard_op gather;     /* an all-gather into flat in flight (work NULL: none) */
    shard_op reduce;     /* the reduce-scatter of this step's gradients (work NULL: none) */
    shard_op replica;    /* HYBRID: the all-reduce of the reduced slice over the replicas */
    ct_tensor *reduced_low; /* reduce_dtype: owned, the step's reduced slice in 16 bits until
                             * finish widens it into grad_shard */
    int nreq;            /* parameters that require grad */
    int pending;         /* grad-ready hooks still to fire in this backward (reset, with
                          * grads_ready, by the first hook of each backward) */
    bool grads_ready;    /* this backward's gradients are final (or finish says so) */
} shard_unit;

/* What a collective's [submit, end] interval was, for the step's comm time. */
typedef struct shard_interval {
    double t0, t1;
} shard_interval;

struct ct_shard {
    ct_pg *pg;          /* borrowed: every rank */
    pthread_t thread;   /* the training thread: the only one that gathers */
    ct_pg *gather_pg;   /* owned: the shard group, for all-gathers */
    ct_pg *reduce_pg;   /* owned: the shard group again, for reduce-scatters (its own order) */
    ct_pg *replica_pg;  /* owned: HYBRID's ranks holding the same slice; NULL when one */
    int rank, world;    /* in pg */
    int srank, sworld;  /* in the shard group */
    int replicas;
    ct_shard_config cfg;
    ct_module *model;
    ct_shard_plan plan;
    shard_unit *units;
    int root;           /* index of the unit whose module is the model, or -1 */
    bool free_params;   /* FULL/HYBRID: units hold data only while needed */
    ct_dtype low;       /* param_dtype when it is 16-bit (the parameters then are); else 0 */
    bool full_f32;      /* param_dtype: the model points at the full32 buffers */
    bool sync;
    bool subset;        /* ct_shard_config.params: the plan holds some of the model's parameters */

    /* units in the order their forwards begin, learnt in the first step */
    int *order;
    int norder;
    bool order_known;
    int *reduce_order;  /* units in the order their reductions are issued */
    int next_reduce;

    /* the optimizer's slices: one per optimizer parameter (owned references) */
    ct_tensor **slices;
    int nslices;
    int *slice_unit;       /* unit of slice i, -1 when empty */
    int64_t *slice_offset; /* first element of slice i in its unit's shard */
    const ct_shard_param **slice_param; /* the plan's parameter of slice i */
    int64_t *slice_range;  /* 2 per slice: elements [begin, end) of its flattened parameter */
    ct_optimizer *opt;     /* borrowed */

    bool pass_open;         /* a forward or a gradient came since the last finish */
    uint64_t pass;          /* the backward (ct_backward_pass) the units' counts are of */
    ct_shard_stats stats;   /* as of the last completed step */
    int64_t gathered_bytes; /* gathered units' bytes now */
    /* the running step's counters, moved into stats by ct_shard_after_step */
    int64_t run_sent, run_gathers;
    double run_exposed;
    shard_interval *iv;
    int niv, cap_iv;
    bool failed;            /* a collective failed: the group is broken */
    bool shard_ready;       /* every unit has its slices and the groups exist */
    bool detached;          /* ct_shard_detach: the model is plain again */
};

/* u's full parameters are kept between steps (all-gathered after each step). */
static inline bool cti_shard_keeps_full(const struct ct_shard *s, const shard_unit *u)
{
    return !s->free_params || u->persistent;
}

/* A unit's name for messages: the wrapped module's dotted name, "(root)" for the model. */
static inline const char *cti_shard_unit_label(const shard_unit *u)
{
    return u->plan->name[0] ? u->plan->name : "(root)";
}

double cti_shard_now(void);
/* Submits an all-gather of unit u into its flat buffer (giving the storage memory
 * first) unless it is gathered or one is in flight. */
ct_status cti_shard_gather_start(ct_shard *s, shard_unit *u);
/* Waits for u's gather in flight, if any: once it has landed, u is gathered. */
ct_status cti_shard_gather_land(ct_shard *s, shard_unit *u);
/* Waits for u's gather, starting it when needed. */
ct_status cti_shard_gather_wait(ct_shard *s, shard_unit *u);
/* Starts the gather of the unit that ran before u in the forward order (the next one
 * in backward), unless two are in flight already: a prefetch, its failure shows at
 * the wait. */
void cti_shard_prefetch_previous(ct_shard *s, const shard_unit *u);
/* The dtype of u's reduced gradient slice (grad_shard). */
ct_dtype cti_shard_grad_dtype(const ct_shard *s, const shard_unit *u);
/* Points every parameter of u at its place in buf (u's flat layout, any dtype: the
 * parameters take buf's), dropping their gradients. */
ct_status cti_shard_unit_point(shard_unit *u, ct_tensor *buf);
/* param_dtype: points every parameter back at its unit's 16-bit buffer and frees
 * the f32 ones ct_shard_gather_full made (no-op when it did not). */
void cti_shard_leave_full_f32(ct_shard *s);
/* Frees u's full parameters (FULL/HYBRID). */
void cti_shard_reshard(ct_shard *s, shard_unit *u);
/* Waits for op, notes its interval and the wait, frees it. */
ct_status cti_shard_op_wait(ct_shard *s, shard_op *op);
/* Adds the bytes a ring collective sends: factor 1 for reduce-scatter and
 * all-gather, 2 for all-reduce, of nbytes over g ranks. */
void cti_shard_count_sent(ct_shard *s, int64_t nbytes, int g, int factor);
/* Makes every freeable unit's storage gather itself when read (core/storage.h,
 * residency) / stops it. */
void ct_shard_residency_install(ct_shard *s);
void ct_shard_residency_remove(ct_shard *s);
/* Installs the forward hooks on every unit's module / removes them. */
void cti_shard_hooks_install(ct_shard *s);
void cti_shard_hooks_remove(ct_shard *s);
/* Installs the grad-ready hooks on every parameter / removes them. */
ct_status cti_shard_grad_hooks_install(ct_shard *s);
void cti_shard_grad_hooks_remove(ct_shard *s);
/* Waits for every collective in flight (frees them); the first failure's status. */
ct_status cti_shard_drain(ct_shard *s);
/* Ends the running step's accounting: moves the counters into stats. */
void cti_shard_step_done(ct_shard *s);

#endif
