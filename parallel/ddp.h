/* ctrain — DDP: data parallelism with replicated parameters.
 *
 *     ct_ddp *d = ct_ddp_new(pg, &model->base, NULL);   broadcasts rank 0's parameters
 *     loss = ...; ct_backward(loss);                     buckets reduce while backward runs
 *     ct_ddp_finish(d);                                  wait; every .grad = the mean over ranks
 *     ct_optimizer_step(opt);
 *
 * (The Accelerator does all of this from its prepare, backward and the optimizer's
 * hooks; most programs never call this header.)
 *
 * Buckets. Parameters that require grad are taken in reverse registration order
 * (roughly the order backward finishes them) and packed into flat buckets of at most
 * bucket_cap_mb (default 25 MiB); the first bucket is capped at first_bucket_cap_mb
 * (default 1 MiB) so the first reduction starts early. A parameter's grad-ready hook
 * (autograd/autograd.h) copies its final gradient into its bucket; when a bucket is
 * full its allreduce (average) is submitted to the comm thread while backward goes on.
 * Buckets are submitted strictly in bucket order (a full bucket waits for the ones
 * before it), so every rank issues the same collectives in the same order even when
 * backward finishes parameters in a different order on different ranks.
 *
 * ct_ddp_finish submits what is left (parameters whose hook did not fire, because
 * they took no part in this forward, count as zero gradients, on every rank that did
 * not use them), waits for every bucket and writes the averages back into each
 * parameter's .grad (creating it when absent). Only then may the optimizer step.
 *
 * no_sync: with ct_ddp_set_sync(d, false) the hooks do nothing and gradients only
 * accumulate locally; the next synchronised backward reduces the accumulated sums.
 *
 * Compression (compress = CT_DTYPE_BF16 or CT_DTYPE_F16): each bucket is rounded to
 * that dtype, reduced (the comm engine accumulates low precision in f32) and widened
 * back: half the bytes on the wire, ~3 significant digits per gradient.
 *
 * Overlap is measured: for each synchronised step, comm_s is the time reductions
 * were in flight (the union of each bucket's submission-to-completion interval), and
 * exposed_s the part of it the training thread waited for: after it reached
 * ct_ddp_finish, plus the time it spent inside a submit that reduced the bucket itself
 * (the direct shared-memory allreduce of the last bucket), i.e. not hidden under
 * backward. exposed_s / comm_s is the share of communication exposed.
 *
 * Thread-safety: one training thread per handle.
 */
#ifndef CT_PARALLEL_DDP_H
#define CT_PARALLEL_DDP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "nn/module.h"

typedef struct ct_ddp ct_ddp;

/* Zero means default for every field. */
typedef struct ct_ddp_config {
    double bucket_cap_mb;       /* default 25 */
    double first_bucket_cap_mb; /* default 1 */
    ct_dtype compress;          /* CT_DTYPE_BF16 or CT_DTYPE_F16; 0 (or the parameters' dtype): none */
    bool no_broadcast;          /* skip the broadcast of rank 0's parameters and buffers */
} ct_ddp_config;

/* What the last synchronised step cost. */
typedef struct ct_ddp_stats {
    int64_t steps;        /* synchronised steps so far */
    int buckets;          /* buckets per step */
    int64_t bytes;        /* bytes reduced per step (after compression) */
    double comm_s;        /* reductions in flight, last step */
    double exposed_s;     /* of which the training thread waited for (ct_ddp_finish, direct submits) */
    double total_comm_s;  /* sums over all steps */
    double total_exposed_s;
} ct_ddp_stats;

/* Wraps model (borrowed; it must outlive the handle) for the group pg (borrowed):
 * makes a sub-group of pg's ranks for its own collectives (so that bucket reductions
 * run on the comm thread during backward: dist/pg.h; only the last bucket, which
 * fills when backward is over, is reduced on pg, directly where it can), broadcasts
 * rank 0's parameters and buffers (unless cfg->no_broadcast), builds the
 * buckets and installs a grad-ready hook on every parameter that requires grad.
 * Every rank of pg must call it with the same model structure: a mismatch in the
 * parameter list is an error on every rank (the shapes are compared through the
 * group). New handle owned by the caller; NULL + error. */
CT_API ct_ddp *ct_ddp_new(ct_pg *pg, ct_module *model, const ct_ddp_config *cfg);

/* Turns gradient synchronisation on (default) or off (no_sync) for the backward
 * passes that follow. */
CT_API void ct_ddp_set_sync(ct_ddp *d, bool sync);
/* Whether gradient synchronisation is on. */
CT_API bool ct_ddp_sync(const ct_ddp *d);

/* After a synchronised backward: submits the remaining buckets, waits for all of
 * them and writes each parameter's averaged gradient into its .grad. A no-op when
 * nothing was reduced since the last call. Errors (a dead or desynchronised peer, a
 * timeout) come from the comm engine and name the rank. */
CT_API ct_status ct_ddp_finish(ct_ddp *d);

/* A copy of d's counters: steps, buckets, bytes reduced, time in and exposed by communication. */
CT_API ct_ddp_stats ct_ddp_stats_get(const ct_ddp *d);

/* Waits for pending reductions, removes the hooks, frees the buckets. NULL is fine. */
CT_API void ct_ddp_free(ct_ddp *d);

#endif
