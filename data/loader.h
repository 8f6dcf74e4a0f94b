/* ctrain — the data loader: batches of a dataset, epoch by epoch.
 *
 *     ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 8, .shuffle = true,
 *                                                          .seed = 1337});
 *     for (int epoch = 0; epoch < 3; epoch++) {
 *         ct_tensor *x, *y;
 *         ct_loader_result r;
 *         while ((r = ct_loader_next(l, &x, &y)) == CT_LOADER_BATCH) CT_FRAME {
 *             ... x, y live until the enclosing frame pops ...
 *         }
 *         if (r == CT_LOADER_ERROR) fail(ct_last_error());
 *     }
 *     ct_loader_free(l);
 *
 * Order. The samples of epoch e are the dataset's indices 0 .. N-1, or with
 * .shuffle a Fisher-Yates permutation of them drawn from a ct_rng whose seed is
 * derived from (seed, e) by one Philox block (core/philox.h), so the same seed
 * and epoch give the same order on every machine, thread count and prefetch
 * setting, and every epoch has its own order.
 *
 * Ranks. With world_size W, rank r takes positions r, r + W, r + 2W, ... of the
 * epoch's order and cuts them into batches of batch_size. By default every rank
 * gets the same number of equally sized batches ("even batches"):
 *   - drop_last off: the order is padded to ceil(N / W) * W positions by wrapping
 *     around to its start, so up to W - 1 samples appear twice in an epoch; the
 *     padded rows are always the last rows of a rank's last batch
 *     (ct_loader_last_padding says how many, for gather_for_metrics to drop);
 *   - drop_last on: each rank takes floor(N / W) positions (no duplicates) and
 *     drops its final partial batch.
 * With .uneven_batches each rank takes only its own positions below N: no
 * sample is repeated but ranks may get different numbers of batches.
 * With W = 1 none of this changes anything: batches of the order, the last one
 * smaller unless drop_last.
 *
 * Cursor. (epoch, position) names the next batch ct_loader_next returns: position
 * counts batches already returned in that epoch. Saving the cursor and restoring
 * it with ct_loader_set_cursor in a fresh loader (same dataset and config) makes
 * the resumed run get exactly the batches the uninterrupted one would have.
 * After the last batch of an epoch, one more ct_loader_next returns CT_LOADER_END
 * and moves the cursor to (epoch + 1, 0); so a plain loop over epochs needs no
 * ct_loader_set_epoch (calling it at the start of each epoch, PyTorch style, with
 * the epoch the cursor is already at changes nothing).
 *
 * Prefetch (on unless .no_prefetch). A worker thread fills the next batch into
 * tensors of its own while the caller trains; ct_loader_next hands those tensors
 * over to the caller's frame (no copy) and queues the following batch. Results
 * are identical with prefetch on or off. Moving the cursor discards a batch
 * prepared for another position. The dataset's get then runs on the worker
 * thread (see data/dataset.h for what that asks of a custom dataset).
 *
 * The loader borrows the dataset: free the loader first.
 */
#ifndef CT_DATA_LOADER_H
#define CT_DATA_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"
#include "data/dataset.h"

typedef struct ct_loader ct_loader;

/* Zero means default for every field. */
typedef struct ct_loader_config {
    int64_t batch_size;  /* items per batch on this rank; required, >= 1 */
    bool shuffle;        /* a new permutation every epoch, from (seed, epoch) */
    uint64_t seed;
    bool drop_last;      /* drop a last batch smaller than batch_size */
    bool no_prefetch;    /* prefetch is on by default */
    int rank;            /* 0 .. world_size - 1; default 0 */
    int world_size;      /* ranks sharing the dataset; 0 = 1 */
    bool uneven_batches; /* default off: every rank gets the same batches (padding) */
} ct_loader_config;

/* What ct_loader_next did. END is not an error: ct_last_error() is untouched. */
typedef enum ct_loader_result {
    CT_LOADER_ERROR = -1, /* nothing returned, cursor unchanged; ct_last_error() says why */
    CT_LOADER_END = 0,    /* the epoch is over; the cursor moved to (epoch + 1, 0) */
    CT_LOADER_BATCH = 1,  /* a batch was returned and the cursor advanced */
} ct_loader_result;

/* A loader over ds (borrowed). NULL and an error naming the key and its value for
 * a bad config (batch_size <= 0, world_size < 0, rank outside [0, world_size)). */
CT_API ct_loader *ct_loader_new(ct_dataset *ds, const ct_loader_config *cfg);

/* The next batch: *x = slot 0 and *y = slot 1 (y may be NULL to skip it; a
 * one-slot dataset sets *y = NULL), each of shape (rows, *item shape), new
 * references owned by the current frame. On END and ERROR both are set to NULL.
 * A dataset with more than two slots needs ct_loader_next_slots. */
CT_API ct_loader_result ct_loader_next(ct_loader *l, ct_tensor **x, ct_tensor **y);
/* The same with one tensor per dataset slot into out[0 .. nslots - 1]. */
CT_API ct_loader_result ct_loader_next_slots(ct_loader *l, ct_tensor **out);

/* The cursor: the epoch and the index within it of the next batch. -1 for NULL. */
CT_API int64_t ct_loader_epoch(const ct_loader *l);
/* Hands batches out on dev (a GPU: each batch is built on the host and copied
 * over in ct_loader_next; ct_accelerator_prepare sets the Accelerator's device).
 * The default is the CPU. */
CT_API ct_status ct_loader_set_device(ct_loader *l, ct_device dev);
CT_API ct_device ct_loader_device(const ct_loader *l);
CT_API int64_t ct_loader_position(const ct_loader *l);
/* Moves the cursor; 0 <= position <= ct_loader_num_batches (== means the epoch's
 * END comes next). CT_ERR_INVALID naming the values otherwise. */
CT_API ct_status ct_loader_set_cursor(ct_loader *l, int64_t epoch, int64_t position);
/* ct_loader_set_cursor(l, epoch, 0). */
CT_API ct_status ct_loader_set_epoch(ct_loader *l, int64_t epoch);
/* Makes l rank `rank` of world_size ranks (the Accelerator's prepare does this) and
 * moves the cursor to the start of the current epoch; the batches then follow the
 * rules under "Ranks" above. Error (nothing changed) for a rank outside
 * [0, world_size). */
CT_API ct_status ct_loader_set_shard(ct_loader *l, int rank, int world_size);

/* The shuffle seed and whether the loader shuffles (its config); 0 / false for NULL. */
CT_API uint64_t ct_loader_seed(const ct_loader *l);
CT_API bool ct_loader_shuffles(const ct_loader *l);
/* Items per batch on this rank (the configured batch_size); 0 for NULL. */
CT_API int64_t ct_loader_batch_size(const ct_loader *l);
/* Batches per epoch on this rank (the same in every epoch). -1 for NULL. */
CT_API int64_t ct_loader_num_batches(const ct_loader *l);
/* Rows of the last returned batch that repeat earlier samples to even out the
 * ranks (always its trailing rows); 0 when none or before any batch. */
CT_API int64_t ct_loader_last_padding(const ct_loader *l);

/* Stops and joins the worker (even mid-epoch) and frees the loader. NULL is fine.
 * Tensors already returned stay valid: they belong to the caller's frames. */
CT_API void ct_loader_free(ct_loader *l);

#endif
