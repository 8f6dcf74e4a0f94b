/* ctrain — tensors.
 *
 * A ct_tensor is a strided view of a refcounted storage:
 *   element (i0, ..., i{n-1}) lives at  data + (offset + sum_k i_k * strides[k]) * dtype_size
 * Strides and offset count elements, not bytes. Views (reshape of contiguous data,
 * transpose, permute, slice, narrow, expand, squeeze, unsqueeze) share the storage;
 * expand gives stride 0 on broadcast dimensions.
 *
 * Lifetime. Tensors are refcounted. Every function below that returns a tensor
 * returns a NEW REFERENCE OWNED BY THE CURRENT FRAME (see core/frame.h): the frame
 * releases it when it pops, so temporaries need no manual frees. To keep a result
 * beyond its frame, ct_keep() it into the enclosing frame, or ct_tensor_retain()
 * it and own it yourself (then ct_tensor_release() it once).
 *
 * Errors. A failing function returns NULL and records a message (core/error.h)
 * naming the op, shapes, dtypes and devices. A NULL tensor argument makes it return
 * NULL and keep the earlier message, so a caller may check once at the end.
 */
#ifndef CT_CORE_TENSOR_H
#define CT_CORE_TENSOR_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/api.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"

#define CT_MAX_DIMS 8

struct ct_node;      /* autograd graph node, defined by the autograd layer */
struct ct_grad_hook; /* grad-ready hook list, defined by the autograd layer */

typedef struct ct_tensor {
    int refcount; /* atomic */
    ct_dtype dtype;
    ct_device device;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t strides[CT_MAX_DIMS]; /* in elements */
    int64_t offset;               /* in elements */
    ct_storage *storage;

    /* fp8 scaling: real value = stored value / scale; amax is the largest |x|
     * seen when it was quantised. scale = 1 and amax = 0 for other tensors. */
    float scale;
    float amax;

    /* autograd fields, managed by the autograd layer */
    bool requires_grad;
    struct ct_tensor *grad;           /* owned reference or NULL */
    struct ct_node *grad_fn;          /* owned reference or NULL */
    struct ct_grad_hook *grad_hooks;  /* owned list or NULL (leaves' grad-ready hooks) */
    char *name;                       /* owned, may be NULL */
} ct_tensor;

/* ---- shape helpers -------------------------------------------------------- */

/* CT_SHAPE(2, 3) expands to `2, (const int64_t[]){2, 3}`: the (ndim, shape) pair. */
#define CT_SHAPE(...)                                                            \
    (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),              \
        (const int64_t[]) { __VA_ARGS__ }

/* Number of elements (the product of the shape; 1 for a 0-d tensor). */
CT_API int64_t ct_tensor_numel(const ct_tensor *t);
/* Bytes the elements take: numel times the dtype size. */
CT_API size_t ct_tensor_nbytes(const ct_tensor *t);
/* True when the strides are the row-major ones for the shape. */
CT_API bool ct_tensor_is_contiguous(const ct_tensor *t);
/* Pointer to element 0 of the view (storage data + offset). Borrowed. When the
 * storage's memory was released by its owner (a sharded parameter between uses:
 * core/storage.h, residency) and this is the thread that may get it back, it is got
 * back first; NULL when that fails (ct_tensor_require_data says why). */
CT_API void *ct_tensor_data(const ct_tensor *t);
/* CT_OK when t is NULL, has no elements or its data is there (after getting it
 * back as ct_tensor_data does); else records "op: <t's name and shape> has no memory:
 * <who released it and why it cannot be had>" and returns the status. What every
 * entry point that reads a tensor calls before computing. */
CT_API ct_status ct_tensor_require_data(const ct_tensor *t, const char *op);
/* "[2, 3]" into buf; returns buf. */
CT_API const char *ct_shape_str(int ndim, const int64_t *shape, char *buf, int cap);
/* "f32[2, 3] cpu" into buf; "NULL" for a NULL tensor; returns buf. */
CT_API const char *ct_tensor_describe(const ct_tensor *t, char *buf, int cap);
/* True when a and b have the same ndim and sizes (strides and dtype may differ). */
CT_API bool ct_tensor_same_shape(const ct_tensor *a, const ct_tensor *b);
/* Broadcast shape of a and b (numpy rules) into out; false (no error set) if incompatible. */
CT_API bool ct_broadcast_shape(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout,
                               int64_t *out);

/* ---- lifetime ------------------------------------------------------------- */

/* Adds one reference to t, which the caller then owns; returns t. */
CT_API ct_tensor *ct_tensor_retain(ct_tensor *t); /* returns t */
/* Drops one reference to t (NULL is fine); the last one frees it. */
CT_API void ct_tensor_release(ct_tensor *t);      /* NULL is fine */

/* ---- creation (new reference, owned by the current frame) ----------------- */

/* A new uninitialised CPU tensor of dtype dt and this shape (new reference, current frame). */
CT_API ct_tensor *ct_tensor_empty(ct_dtype dt, int ndim, const int64_t *shape);
/* ct_tensor_empty on device dev (new reference, current frame). */
CT_API ct_tensor *ct_tensor_empty_on(ct_device dev, ct_dtype dt, int ndim, const int64_t *shape);
/* An uninitialised contiguous tensor with t's dtype, device and shape (new reference, current
 * frame). */
CT_API ct_tensor *ct_tensor_empty_like(const ct_tensor *t); /* same dtype, device, shape; contiguous */
/* A new CPU tensor of zeros (new reference, current frame). */
CT_API ct_tensor *ct_tensor_zeros(ct_dtype dt, int ndim, const int64_t *shape);
/* A new CPU tensor of ones (new reference, current frame). */
CT_API ct_tensor *ct_tensor_ones(ct_dtype dt, int ndim, const int64_t *shape);
/* A new CPU tensor with every element value, rounded to dt (new reference, current frame). */
CT_API ct_tensor *ct_tensor_full(ct_dtype dt, int ndim, const int64_t *shape, double value);
/* A contiguous tensor of zeros with t's dtype, device and shape (new reference, current frame). */
CT_API ct_tensor *ct_tensor_zeros_like(const ct_tensor *t);
/* 1-D [start, start+step, ...) below end (above end for negative step). */
CT_API ct_tensor *ct_tensor_arange(ct_dtype dt, double start, double end, double step);
/* Uniform [lo, hi) and normal(mean, std) from the process generator (ct_set_seed);
 * float dtypes only; low-precision dtypes are drawn in f32 and rounded. */
CT_API ct_tensor *ct_tensor_rand(ct_dtype dt, int ndim, const int64_t *shape, double lo, double hi);
CT_API ct_tensor *ct_tensor_randn(ct_dtype dt, int ndim, const int64_t *shape, double mean, double std);
/* Copies n = prod(shape) elements from a caller's buffer. */
CT_API ct_tensor *ct_tensor_from_data(ct_dtype dt, int ndim, const int64_t *shape, const void *data);
/* Wraps a caller's buffer without copying; the caller keeps it alive until the
 * tensor (and every view of it) is released, then release(ctx, data, nbytes) runs
 * if given. */
CT_API ct_tensor *ct_tensor_from_buffer(ct_dtype dt, int ndim, const int64_t *shape, void *data,
                                        ct_storage_release_fn release, void *ctx);
/* A view of an existing storage: shape, strides (NULL = contiguous), offset. Checks bounds. */
CT_API ct_tensor *ct_tensor_from_storage(ct_storage *s, ct_dtype dt, int ndim, const int64_t *shape,
                                         const int64_t *strides, int64_t offset);
/* A 0-d tensor holding one value. */
CT_API ct_tensor *ct_tensor_scalar(ct_dtype dt, double value);

/* ---- views (share storage; new reference, owned by the current frame) ------ */

/* Same elements, new shape; one entry may be -1 (inferred). Fails unless the
 * layout allows a view (use ct_tensor_reshape to copy when needed). */
CT_API ct_tensor *ct_tensor_view(ct_tensor *t, int ndim, const int64_t *shape);
/* Moves t's elements into base's storage: t becomes a contiguous view of base at
 * element offset, holding the values it held, and lets go of its old storage; the
 * header (and so every pointer to t, its grad and autograd state) stays. Views made
 * of t before keep the old storage. base must be contiguous, with t's dtype and
 * device and room for t's elements at offset. For flat parameter buffers. */
CT_API ct_status ct_tensor_rebind(ct_tensor *t, ct_tensor *base, int64_t offset);
/* Points t at base's storage without copying: t becomes a contiguous view of base at
 * element offset, with base's dtype, holding whatever base holds there; the header
 * stays (pointers to t, its autograd state). A gradient t has must already have
 * base's dtype (drop it first otherwise). For switching parameters between flat
 * buffers of different dtypes (a 16-bit compute copy and an f32 one). base must be
 * contiguous, on t's device, with room for t's elements at offset. */
CT_API ct_status ct_tensor_repoint(ct_tensor *t, ct_tensor *base, int64_t offset);
/* A view when possible, else a contiguous copy. */
CT_API ct_tensor *ct_tensor_reshape(ct_tensor *t, int ndim, const int64_t *shape);
/* A 1-D view of t when its layout allows, else a contiguous 1-D copy (new reference, current frame). */
CT_API ct_tensor *ct_tensor_flatten(ct_tensor *t);
/* Negative dims count from the end, as in PyTorch. */
CT_API ct_tensor *ct_tensor_transpose(ct_tensor *t, int d0, int d1);
/* A view with the dims in the order dims gives, no copy (new reference, current frame). */
CT_API ct_tensor *ct_tensor_permute(ct_tensor *t, const int *dims); /* dims has t->ndim entries */
/* Elements start, start+step, ... < end along dim (PyTorch clamping of start/end; step >= 1). */
CT_API ct_tensor *ct_tensor_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
/* A view of length elements from start along dim (new reference, current frame). */
CT_API ct_tensor *ct_tensor_narrow(ct_tensor *t, int dim, int64_t start, int64_t length);
/* One index along dim, removing that dim. */
CT_API ct_tensor *ct_tensor_select(ct_tensor *t, int dim, int64_t index);
/* Broadcast to shape (numpy rules; -1 keeps a size); broadcast dims get stride 0. */
CT_API ct_tensor *ct_tensor_expand(ct_tensor *t, int ndim, const int64_t *shape);
/* A view without dim, which must have size 1 (new reference, current frame). */
CT_API ct_tensor *ct_tensor_squeeze(ct_tensor *t, int dim); /* dim must have size 1 */
/* A view with a new dim of size 1 at position dim (new reference, current frame). */
CT_API ct_tensor *ct_tensor_unsqueeze(ct_tensor *t, int dim);

/* ---- copies and casts ----------------------------------------------------- */

/* t itself (new reference) when already contiguous, else a contiguous copy. */
CT_API ct_tensor *ct_tensor_contiguous(ct_tensor *t);
/* A contiguous copy of t with its own storage (new reference, current frame). */
CT_API ct_tensor *ct_tensor_clone(const ct_tensor *t);
/* Copies src into dst elementwise, broadcasting src to dst's shape and converting
 * dtype (round to nearest even; fp8 non-saturating). dst may be any strided view;
 * the two may be on different devices. */
CT_API ct_status ct_tensor_copy_(ct_tensor *dst, const ct_tensor *src);
/* New contiguous tensor of dtype dt; a copy even when dt is t's dtype. */
CT_API ct_tensor *ct_tensor_cast(const ct_tensor *t, ct_dtype dt);
/* Casting to fp8 with saturation to the format's max instead of NaN/inf. */
CT_API ct_tensor *ct_tensor_cast_saturate(const ct_tensor *t, ct_dtype dt);
/* Sets every element of t to value, rounded to its dtype. */
CT_API ct_status ct_tensor_fill_(ct_tensor *t, double value);
/* t on device dev: t itself (new reference) when already there, else a contiguous
 * copy on dev with t's dtype and shape (new reference, current frame). Host memory
 * is staged through pinned buffers; a copy to the host returns once the values are
 * there. No autograd edge: a leaf's copy is a new leaf (requires_grad copied). */
CT_API ct_tensor *ct_tensor_to(const ct_tensor *t, ct_device dev);

/* ---- elements and debugging ---------------------------------------------- */

/* Element at a multi-index (ndim entries) as double; NAN and an error when out of range. */
CT_API double ct_tensor_get(const ct_tensor *t, const int64_t *index);
/* Writes value at a multi-index (ndim entries), rounded to the dtype; an error when out of range. */
CT_API ct_status ct_tensor_set(ct_tensor *t, const int64_t *index, double value);
/* The single value of a one-element tensor. */
CT_API double ct_tensor_item(const ct_tensor *t);
/* Readable dump, PyTorch style, eliding the middle of long dims; to f (stdout if NULL). */
CT_API void ct_tensor_print(const ct_tensor *t, FILE *f);
/* The same text into a new malloc'ed string the caller frees. */
CT_API char *ct_tensor_to_string(const ct_tensor *t);
/* Owned copy of name; NULL clears. */
CT_API ct_status ct_tensor_set_name(ct_tensor *t, const char *name);

#ifdef __cplusplus
}
#endif

#endif
