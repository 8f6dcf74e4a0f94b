/* The data loader: batch plan, per-epoch shuffle and the prefetch worker. The
 * semantics (order, ranks, cursor) are in data/loader.h.
 *
 * Threads. The caller's thread owns the cursor. The worker owns nothing: it
 * fills one "job" (a batch for a given (epoch, position), into tensors the
 * caller's thread allocated) at a time. A job moves NONE -> PENDING (posted by
 * the caller) -> RUNNING (taken by the worker) -> DONE -> NONE (consumed or
 * discarded by the caller), all under the mutex. The caller fills a batch itself
 * only while no job is RUNNING, so the permutation cache is never touched by both
 * threads at once; the mutex orders their accesses to it.
 */
#include "data/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/error.h"
#include "core/frame.h"
#include "core/philox.h"

typedef enum { JOB_NONE, JOB_PENDING, JOB_RUNNING, JOB_DONE } job_state;

typedef struct job {
    job_state state;
    int64_t epoch, pos;
    ct_tensor *t[CT_DATASET_MAX_SLOTS]; /* loader-owned references while the job lives */
    ct_status st;
    char msg[1024]; /* the worker's error message (errors are per thread) */
} job;

struct ct_loader {
    ct_dataset *ds;
    ct_loader_config cfg;
    int64_t n;       /* dataset length */
    int64_t w, r;    /* world size, rank */
    int64_t per_rank; /* samples this rank takes per epoch */
    int64_t nb;      /* batches per epoch */
    int64_t epoch, pos; /* cursor */
    int64_t last_padding;

    int64_t *order; /* shuffled order of order_epoch; NULL without shuffle */
    int64_t order_epoch;

    ct_device device; /* where batches are handed out (ct_loader_set_device) */
    bool prefetch, quit;
    uv_thread_t thread;
    uv_mutex_t mu;
    uv_cond_t cv;
    job job;
};

/* ---- the plan ------------------------------------------------------------ */

/* This rank's share of an epoch: samples and batches. */
static void plan_ranks(ct_loader *l, int rank, int w)
{
    const ct_loader_config *cfg = &l->cfg;
    l->w = w, l->r = rank;
    l->cfg.rank = rank, l->cfg.world_size = w;
    if (cfg->uneven_batches) l->per_rank = l->n / w + (l->r < l->n % w);
    else l->per_rank = cfg->drop_last ? l->n / w : (l->n + w - 1) / w;
    l->nb = cfg->drop_last ? l->per_rank / cfg->batch_size : (l->per_rank + cfg->batch_size - 1) / cfg->batch_size;
}

/* An independent seed per (seed, epoch): one Philox block keyed by the user's seed,
 * counter = (epoch, "data"), so no two epochs (or the model's own streams, which
 * use counters with ctr[2] = 0) share words. */
static uint64_t epoch_seed(uint64_t seed, int64_t epoch)
{
    uint32_t ctr[4] = {(uint32_t)(uint64_t)epoch, (uint32_t)((uint64_t)epoch >> 32), 0x64617461u, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, out[4];
    ct_philox4x32_10(ctr, key, out);
    return (uint64_t)out[1] << 32 | out[0];
}

/* order = a uniform permutation of 0 .. n-1 (Fisher-Yates, high index down). */
static void make_order(ct_loader *l, int64_t epoch)
{
    if (!l->order || l->order_epoch == epoch) return;
    ct_rng rng;
    ct_rng_init(&rng, epoch_seed(l->cfg.seed, epoch));
    for (int64_t i = 0; i < l->n; i++) l->order[i] = i;
    for (int64_t i = l->n - 1; i > 0; i--) {
        int64_t j = (int64_t)ct_rng_below(&rng, (uint64_t)i + 1);
        int64_t t = l->order[i];
        l->order[i] = l->order[j];
        l->order[j] = t;
    }
    l->order_epoch = epoch;
}

static int64_t batch_rows(const ct_loader *l, int64_t pos)
{
    int64_t left = l->per_rank - pos * l->cfg.batch_size;
    return left < l->cfg.batch_size ? left : l->cfg.batch_size;
}

/* Position in the (wrapped) epoch order of row j of batch pos on this rank. */
static int64_t order_pos(const ct_loader *l, int64_t pos, int64_t j)
{
    return l->r + l->w * (pos * l->cfg.batch_size + j);
}

static int64_t batch_padding(const ct_loader *l, int64_t pos)
{
    int64_t pad = 0, rows = batch_rows(l, pos);
    for (int64_t j = 0; j < rows; j++) pad += order_pos(l, pos, j) >= l->n;
    return pad;
}

/* Fills batch (epoch, pos) into t[], item by item, each get in its own frame so a
 * custom dataset's temporaries go at once. */
static ct_status fill_batch(ct_loader *l, int64_t epoch, int64_t pos, ct_tensor *const *t)
{
    make_order(l, epoch);
    int64_t rows = batch_rows(l, pos);
    for (int64_t j = 0; j < rows; j++) {
        int64_t p = order_pos(l, pos, j) % l->n; /* wrap: the even-batches padding */
        int64_t idx = l->order ? l->order[p] : p;
        ct_frame_push();
        ct_status st = ct_dataset_get(l->ds, idx, t, j);
        ct_frame_pop();
        if (st)
            return ct_error_prefix("loader: epoch %lld batch %lld row %lld (item %lld): ", (long long)epoch,
                                   (long long)pos, (long long)j, (long long)idx);
    }
    return CT_OK;
}

/* New tensors for batch pos, in the current frame. */
static ct_status alloc_batch(ct_loader *l, int64_t pos, ct_tensor **t)
{
    for (int k = 0; k < l->ds->nslots; k++) {
        int64_t shape[CT_MAX_DIMS];
        int nd = ct_dataset_batch_shape(l->ds, k, batch_rows(l, pos), shape);
        t[k] = ct_tensor_empty(l->ds->slots[k].dtype, nd, shape);
        if (!t[k]) return ct_error_prefix("loader: batch %lld slot %d: ", (long long)pos, k);
    }
    return CT_OK;
}

/* ---- the worker ---------------------------------------------------------- */

static void worker_main(void *arg)
{
    ct_loader *l = arg;
    uv_mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && l->job.state != JOB_PENDING) uv_cond_wait(&l->cv, &l->mu);
        if (l->quit) break;
        l->job.state = JOB_RUNNING;
        int64_t epoch = l->job.epoch, pos = l->job.pos;
        uv_mutex_unlock(&l->mu);

        ct_status st = fill_batch(l, epoch, pos, l->job.t);

        uv_mutex_lock(&l->mu);
        l->job.st = st;
        if (st) snprintf(l->job.msg, sizeof l->job.msg, "%s", ct_last_error());
        l->job.state = JOB_DONE;
        uv_cond_broadcast(&l->cv);
    }
    uv_mutex_unlock(&l->mu);
}

static void job_release(job *jb, int nslots)
{
    for (int k = 0; k < nslots; k++) {
        ct_tensor_release(jb->t[k]);
        jb->t[k] = NULL;
    }
    jb->state = JOB_NONE;
}

/* With the mutex held: waits for a running job, then drops any job that is not for
 * (epoch, pos). Leaves the state NONE, or PENDING/DONE for (epoch, pos). */
static void job_settle(ct_loader *l, int64_t epoch, int64_t pos)
{
    if (l->job.state == JOB_PENDING && (l->job.epoch != epoch || l->job.pos != pos))
        job_release(&l->job, l->ds->nslots); /* the worker never saw it */
    while (l->job.state == JOB_RUNNING) uv_cond_wait(&l->cv, &l->mu);
    if (l->job.state == JOB_DONE && (l->job.epoch != epoch || l->job.pos != pos))
        job_release(&l->job, l->ds->nslots);
}

/* Queues the batch the cursor names next (the next epoch's first after the END
 * of this one) unless it is already queued or there is none. */
static void job_post_next(ct_loader *l)
{
    int64_t epoch = l->epoch, pos = l->pos;
    if (pos >= l->nb) epoch++, pos = 0;
    if (pos >= l->nb) return; /* empty epochs */
    uv_mutex_lock(&l->mu);
    job_settle(l, epoch, pos);
    if (l->job.state == JOB_NONE) {
        ct_tensor *t[CT_DATASET_MAX_SLOTS] = {0};
        ct_frame_push();
        ct_status st = alloc_batch(l, pos, t);
        for (int k = 0; k < l->ds->nslots && !st; k++) l->job.t[k] = ct_tensor_retain(t[k]);
        ct_frame_pop();
        /* out of memory now: next() fills this batch itself and says so if it fails */
        if (!st) {
            l->job.epoch = epoch;
            l->job.pos = pos;
            l->job.state = JOB_PENDING;
            uv_cond_broadcast(&l->cv);
        }
    }
    uv_mutex_unlock(&l->mu);
}

/* ---- public -------------------------------------------------------------- */

ct_loader *ct_loader_new(ct_dataset *ds, const ct_loader_config *cfg)
{
    if (!ds || !cfg) {
        ct_error_set(CT_ERR_INVALID, "loader_new: %s is NULL", !ds ? "dataset" : "config");
        return NULL;
    }
    if (cfg->batch_size <= 0) {
        ct_error_set(CT_ERR_INVALID, "loader_new: batch_size = %lld, must be >= 1", (long long)cfg->batch_size);
        return NULL;
    }
    if (cfg->world_size < 0) {
        ct_error_set(CT_ERR_INVALID, "loader_new: world_size = %d, must be >= 1 (0 = 1)", cfg->world_size);
        return NULL;
    }
    int w = cfg->world_size ? cfg->world_size : 1;
    if (cfg->rank < 0 || cfg->rank >= w) {
        ct_error_set(CT_ERR_INVALID, "loader_new: rank = %d is out of range for world_size = %d (0 .. %d)", cfg->rank,
                     w, w - 1);
        return NULL;
    }
    int64_t n = ct_dataset_len(ds);
    if (n < 0) {
        ct_error_prefix("loader_new: ");
        return NULL;
    }
    ct_loader *l = calloc(1, sizeof *l);
    if (!l) {
        ct_error_set(CT_ERR_NOMEM, "loader_new: out of memory");
        return NULL;
    }
    *l = (ct_loader){.ds = ds, .cfg = *cfg, .n = n, .order_epoch = -1};
    plan_ranks(l, cfg->rank, w);
    if (cfg->shuffle && n > 0) {
        l->order = malloc((size_t)n * sizeof *l->order);
        if (!l->order) {
            ct_error_set(CT_ERR_NOMEM, "loader_new: out of memory for the order of %lld samples", (long long)n);
            free(l);
            return NULL;
        }
    }
    l->prefetch = !cfg->no_prefetch;
    if (l->prefetch) {
        int e;
        if ((e = uv_mutex_init(&l->mu)) != 0) {
            ct_error_set(CT_ERR_INTERNAL, "loader_new: uv_mutex_init: %s", uv_strerror(e));
            goto fail;
        }
        if ((e = uv_cond_init(&l->cv)) != 0) {
            ct_error_set(CT_ERR_INTERNAL, "loader_new: uv_cond_init: %s", uv_strerror(e));
            uv_mutex_destroy(&l->mu);
            goto fail;
        }
        if ((e = uv_thread_create(&l->thread, worker_main, l)) != 0) {
            ct_error_set(CT_ERR_INTERNAL, "loader_new: cannot start the prefetch worker: uv_thread_create: %s",
                         uv_strerror(e));
            uv_cond_destroy(&l->cv);
            uv_mutex_destroy(&l->mu);
            goto fail;
        }
        job_post_next(l);
    }
    return l;
fail:
    free(l->order);
    free(l);
    return NULL;
}

void ct_loader_free(ct_loader *l)
{
    if (!l) return;
    if (l->prefetch) {
        uv_mutex_lock(&l->mu);
        l->quit = true;
        uv_cond_broadcast(&l->cv);
        uv_mutex_unlock(&l->mu);
        /* the worker finishes the batch it is filling, then returns */
        CT_ASSERT(uv_thread_join(&l->thread) == 0);
        if (l->job.state != JOB_NONE) job_release(&l->job, l->ds->nslots);
        uv_cond_destroy(&l->cv);
        uv_mutex_destroy(&l->mu);
    }
    free(l->order);
    free(l);
}

ct_loader_result ct_loader_next_slots(ct_loader *l, ct_tensor **out)
{
    if (!l || !out) {
        ct_error_set(CT_ERR_INVALID, "loader_next: %s is NULL", !l ? "loader" : "out");
        return CT_LOADER_ERROR;
    }
    int ns = l->ds->nslots;
    for (int k = 0; k < ns; k++) out[k] = NULL;
    int64_t epoch = l->epoch, pos = l->pos;
    if (pos >= l->nb) {
        l->epoch++;
        l->pos = 0;
        l->last_padding = 0;
        if (l->prefetch) job_post_next(l);
        return CT_LOADER_END;
    }
    ct_tensor *t[CT_DATASET_MAX_SLOTS] = {0};
    bool got = false;
    if (l->prefetch) {
        uv_mutex_lock(&l->mu);
        job_settle(l, epoch, pos);
        while (l->job.state == JOB_PENDING || l->job.state == JOB_RUNNING) uv_cond_wait(&l->cv, &l->mu);
        if (l->job.state == JOB_DONE) {
            got = true;
            ct_status st = l->job.st;
            if (st) {
                job_release(&l->job, ns);
                ct_error_set(st, "%s", l->job.msg);
            } else {
                /* hand the loader's references to the caller's frame: no copy */
                for (int k = 0; k < ns; k++) t[k] = ct_frame_adopt(l->job.t[k]), l->job.t[k] = NULL;
                l->job.state = JOB_NONE;
            }
            uv_mutex_unlock(&l->mu);
            if (st) return CT_LOADER_ERROR;
        } else {
            uv_mutex_unlock(&l->mu);
        }
    }
    if (!got && (alloc_batch(l, pos, t) || fill_batch(l, epoch, pos, t))) return CT_LOADER_ERROR;
    if (l->device.type != CT_DEVICE_CPU) {
        /* the batch is made on the host; one copy per slot puts it on the device */
        for (int k = 0; k < ns; k++) {
            if (t[k] && !(t[k] = ct_tensor_to(t[k], l->device))) {
                ct_error_prefix("loader_next: batch (%lld, %lld): ", (long long)epoch, (long long)pos);
                return CT_LOADER_ERROR;
            }
        }
    }
    for (int k = 0; k < ns; k++) out[k] = t[k];
    l->last_padding = batch_padding(l, pos);
    l->pos++;
    if (l->prefetch) job_post_next(l);
    return CT_LOADER_BATCH;
}

ct_loader_result ct_loader_next(ct_loader *l, ct_tensor **x, ct_tensor **y)
{
    if (x) *x = NULL;
    if (y) *y = NULL;
    if (!l || !x) {
        ct_error_set(CT_ERR_INVALID, "loader_next: %s is NULL", !l ? "loader" : "x");
        return CT_LOADER_ERROR;
    }
    if (l->ds->nslots > 2) {
        ct_error_set(CT_ERR_INVALID, "loader_next: the %s dataset has %d slots; use ct_loader_next_slots",
                     ct_dataset_name(l->ds), l->ds->nslots);
        return CT_LOADER_ERROR;
    }
    ct_tensor *out[CT_DATASET_MAX_SLOTS];
    ct_loader_result r = ct_loader_next_slots(l, out);
    if (r == CT_LOADER_BATCH) {
        *x = out[0];
        if (y) *y = l->ds->nslots > 1 ? out[1] : NULL;
    }
    return r;
}

int64_t ct_loader_epoch(const ct_loader *l) { return l ? l->epoch : -1; }

ct_status ct_loader_set_device(ct_loader *l, ct_device dev)
{
    if (!l) return ct_error_set(CT_ERR_INVALID, "loader_set_device: loader is NULL");
    if (dev.type != CT_DEVICE_CPU && dev.type != CT_DEVICE_CUDA) return ct_error_set(CT_ERR_INVALID, "loader_set_device: unknown device type %d", (int)dev.type);
    l->device = dev;
    return CT_OK;
}

ct_device ct_loader_device(const ct_loader *l) { return l ? l->device : CT_CPU; }

int64_t ct_loader_position(const ct_loader *l) { return l ? l->pos : -1; }

int64_t ct_loader_num_batches(const ct_loader *l) { return l ? l->nb : -1; }

int64_t ct_loader_batch_size(const ct_loader *l) { return l ? l->cfg.batch_size : 0; }

uint64_t ct_loader_seed(const ct_loader *l) { return l ? l->cfg.seed : 0; }

bool ct_loader_shuffles(const ct_loader *l) { return l && l->cfg.shuffle; }

int64_t ct_loader_last_padding(const ct_loader *l) { return l ? l->last_padding : 0; }

ct_status ct_loader_set_cursor(ct_loader *l, int64_t epoch, int64_t position)
{
    if (!l) return ct_error_set(CT_ERR_INVALID, "loader_set_cursor: loader is NULL");
    if (epoch < 0 || position < 0 || position > l->nb)
        return ct_error_set(CT_ERR_INVALID,
                            "loader_set_cursor: epoch = %lld, position = %lld; need epoch >= 0 and "
                            "0 <= position <= %lld (batches per epoch)",
                            (long long)epoch, (long long)position, (long long)l->nb);
    if (epoch == l->epoch && position == l->pos) return CT_OK;
    l->epoch = epoch;
    l->pos = position;
    l->last_padding = 0;
    if (l->prefetch) job_post_next(l);
    return CT_OK;
}

ct_status ct_loader_set_shard(ct_loader *l, int rank, int world_size)
{
    if (!l) return ct_error_set(CT_ERR_INVALID, "loader_set_shard: loader is NULL");
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return ct_error_set(CT_ERR_INVALID, "loader_set_shard: rank = %d, world_size = %d; need world_size >= 1 and "
                            "0 <= rank < world_size", rank, world_size);
    if (l->prefetch) { /* a batch prepared for the old share is stale */
        uv_mutex_lock(&l->mu);
        job_settle(l, -1, -1);
        uv_mutex_unlock(&l->mu);
    }
    plan_ranks(l, rank, world_size);
    l->pos = 0;
    l->last_padding = 0;
    if (l->prefetch) job_post_next(l);
    return CT_OK;
}

ct_status ct_loader_set_epoch(ct_loader *l, int64_t epoch)
{
    if (!l) return ct_error_set(CT_ERR_INVALID, "loader_set_epoch: loader is NULL");
    return ct_loader_set_cursor(l, epoch, 0);
}
