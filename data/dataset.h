/* ctrain — the dataset interface.
 *
 * A ct_dataset is a handle, in libuv's style: a small public struct whose first
 * field is a table of functions. A dataset has a fixed length and a fixed list of
 * "slots" (x, y, mask, ...), each with a dtype and a per-item shape. Item i is
 * written into row `row` of one caller-provided batch tensor per slot:
 *
 *     slot k of a batch of B items is a tensor of shape (B, *slots[k].shape)
 *
 * so a loader allocates the batch once and asks the dataset to fill it row by row,
 * with no per-item tensors. The token dataset (data/token_dataset.h) is one
 * implementation; ct_loader (data/loader.h) batches any of them.
 *
 * Writing your own dataset. Embed a ct_dataset as the FIRST member of your struct,
 * fill a static vtable, call ct_dataset_init, and cast back inside the callbacks:
 *
 *     typedef struct {
 *         ct_dataset base;            // first: a (my_ds *) is a (ct_dataset *)
 *         const float *pixels;        // n x 784
 *         const int64_t *labels;      // n
 *         int64_t n;
 *     } my_ds;
 *
 *     static int64_t my_len(const ct_dataset *ds) { return ((const my_ds *)ds)->n; }
 *
 *     // out[0]: (B, 784) f32, out[1]: (B,) i64, both checked by ct_dataset_get
 *     static ct_status my_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out,
 *                             int64_t row)
 *     {
 *         const my_ds *m = (const my_ds *)ds;
 *         memcpy(ct_dataset_row(out[0], row), m->pixels + i * 784, 784 * sizeof(float));
 *         *(int64_t *)ct_dataset_row(out[1], row) = m->labels[i];
 *         return CT_OK;
 *     }
 *
 *     static void my_free(ct_dataset *ds) { free(ds); }
 *
 *     static const ct_dataset_vtable my_vtable = {"mnist", my_len, my_get, my_free};
 *
 *     my_ds *m = calloc(1, sizeof *m);
 *     ... set m->pixels, m->labels, m->n ...
 *     ct_dataset_slot slots[2] = {{CT_DTYPE_F32, 1, {784}}, {CT_DTYPE_I64, 0, {0}}};
 *     if (ct_dataset_init(&m->base, &my_vtable, 2, slots) != CT_OK) { free(m); ... }
 *     ct_loader *l = ct_loader_new(&m->base, &(ct_loader_config){.batch_size = 64});
 *
 * Contract for the callbacks:
 *  - len is constant over the dataset's life.
 *  - get is only called through ct_dataset_get, which has already checked i, row
 *    and every slot tensor (CPU, dtype, shape, rows laid out contiguously), so the
 *    callback may write straight into ct_dataset_row(out[k], row). It returns CT_OK
 *    or a status with a message set by ct_error_set (name the dataset and item).
 *  - get may run on a loader's worker thread, concurrently with the caller's thread
 *    doing other things with the dataset (it is never called on two threads at once
 *    by one loader, but two loaders over one dataset may do so): do not mutate
 *    shared state without a lock. Tensors it creates as temporaries go in the
 *    frame the loader opens around each call.
 *  - free releases everything, including the struct itself (NULL: nothing to free).
 */
#ifndef CT_DATA_DATASET_H
#define CT_DATA_DATASET_H

#include <stdint.h>

#include "core/api.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

#define CT_DATASET_MAX_SLOTS 4

typedef struct ct_dataset ct_dataset;

/* One output of an item: dtype and the item's own shape (the batch adds a
 * leading dim). ndim 0 is a scalar per item (a batch of them is 1-D). */
typedef struct ct_dataset_slot {
    ct_dtype dtype;
    int ndim; /* 0 .. CT_MAX_DIMS - 1 */
    int64_t shape[CT_MAX_DIMS - 1];
} ct_dataset_slot;

typedef struct ct_dataset_vtable {
    const char *type_name; /* for messages: "token", "mnist", ... */
    int64_t (*len)(const ct_dataset *ds);
    ct_status (*get)(const ct_dataset *ds, int64_t i, ct_tensor *const *out_slots, int64_t row);
    void (*free)(ct_dataset *ds); /* may be NULL */
} ct_dataset_vtable;

struct ct_dataset {
    const ct_dataset_vtable *vt;
    int nslots;
    ct_dataset_slot slots[CT_DATASET_MAX_SLOTS];
};

/* Fills the handle after checking the table (len and get set) and the slots
 * (1 .. CT_DATASET_MAX_SLOTS of them, valid dtypes, 0 <= ndim < CT_MAX_DIMS,
 * sizes >= 0). Returns CT_OK or CT_ERR_INVALID with a message. */
CT_API ct_status ct_dataset_init(ct_dataset *ds, const ct_dataset_vtable *vt, int nslots,
                                 const ct_dataset_slot *slots);

/* Number of items; -1 (and an error) for a NULL dataset. */
CT_API int64_t ct_dataset_len(const ct_dataset *ds);

/* Writes item i into row `row` of out_slots[0 .. nslots-1]. Each out_slots[k] must be
 * a CPU tensor of slots[k].dtype with shape (B, *slots[k].shape), 0 <= row < B, and
 * its per-item dims laid out contiguously (any stride on the batch dim). Bad
 * arguments give CT_ERR_INVALID and a message naming the dataset, the slot and the
 * tensor; nothing is written then. */
CT_API ct_status ct_dataset_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out_slots,
                                int64_t row);

/* Shape (B, *slots[k].shape) of slot k's batch tensor into shape; returns its ndim. */
CT_API int ct_dataset_batch_shape(const ct_dataset *ds, int k, int64_t batch, int64_t *shape);

/* Start of row `row` of a batch tensor (borrowed pointer into its storage). */
CT_API void *ct_dataset_row(ct_tensor *t, int64_t row);

/* Type name for messages ("token", ...); "dataset" when unset. */
CT_API const char *ct_dataset_name(const ct_dataset *ds);

/* Calls the table's free; NULL is fine. */
CT_API void ct_dataset_free(ct_dataset *ds);

#endif
