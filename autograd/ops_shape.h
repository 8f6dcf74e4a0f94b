/* ctrain — differentiable views, reshapes, concatenation and casts.
 *
 * Every function returns a NEW REFERENCE OWNED BY THE CURRENT FRAME and records
 * a graph node when grad mode is on and an input requires grad. The views
 * (view, reshape when the layout allows, flatten, transpose, permute, slice,
 * narrow, select, expand, squeeze, unsqueeze) share x's storage, exactly as the
 * core functions of the same name in core/tensor.h, whose argument rules they
 * follow (negative dims count from the end). A NULL input gives NULL and keeps
 * the earlier error; a bad call gives NULL with a message naming the op and x.
 *
 * Gradients: view/reshape/flatten/squeeze/unsqueeze reshape the gradient back;
 * transpose/permute apply the inverse permutation (a strided view of the
 * gradient); slice/narrow/select put the gradient into a zero tensor of x's
 * shape; expand sums it over the broadcast dims; concat/stack hand each input
 * its part (a view); cast casts it back to x's dtype.
 */
#ifndef CT_AUTOGRAD_OPS_SHAPE_H
#define CT_AUTOGRAD_OPS_SHAPE_H

#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

/* Same elements, new shape (one entry may be -1). view fails when the layout
 * needs a copy; reshape copies then. */
CT_API ct_tensor *ct_view(ct_tensor *x, int ndim, const int64_t *shape);
CT_API ct_tensor *ct_reshape(ct_tensor *x, int ndim, const int64_t *shape);
/* x as a 1-D tensor (a view when possible). */
CT_API ct_tensor *ct_flatten(ct_tensor *x); /* 1-D */
/* x with dims d0 and d1 swapped (a view). */
CT_API ct_tensor *ct_transpose(ct_tensor *x, int d0, int d1);
/* x with its dims reordered as dims says (a view). */
CT_API ct_tensor *ct_permute(ct_tensor *x, const int *dims); /* dims has x->ndim entries */
/* Elements start, start+step, ... < end along dim (PyTorch clamping; step >= 1). */
CT_API ct_tensor *ct_slice(ct_tensor *x, int dim, int64_t start, int64_t end, int64_t step);
/* length elements of x from start along dim (a view). */
CT_API ct_tensor *ct_narrow(ct_tensor *x, int dim, int64_t start, int64_t length);
/* One index along dim, removing that dim. */
CT_API ct_tensor *ct_select(ct_tensor *x, int dim, int64_t index);
/* Broadcast to shape (numpy rules; -1 keeps a size). */
CT_API ct_tensor *ct_expand(ct_tensor *x, int ndim, const int64_t *shape);
/* x without dim, which must have size 1 (a view). */
CT_API ct_tensor *ct_squeeze(ct_tensor *x, int dim); /* dim must have size 1 */
/* x with a new dim of size 1 at position dim (a view). */
CT_API ct_tensor *ct_unsqueeze(ct_tensor *x, int dim);
/* x itself (a new reference, history kept) when already contiguous, else a
 * contiguous copy. */
CT_API ct_tensor *ct_contiguous(ct_tensor *x);
/* A contiguous copy. */
CT_API ct_tensor *ct_clone(ct_tensor *x);
/* A contiguous copy in dtype dt (round to nearest even). Casting to a
 * non-float dtype gives a result without gradient. */
CT_API ct_tensor *ct_cast(ct_tensor *x, ct_dtype dt);

/* Joins n tensors along dim: same ndim (>= 1), dtype and device, same sizes
 * outside dim. n may exceed the node input limit (8): with grad on, the inputs
 * are then joined in groups of 8 first, which costs one extra copy per level. */
CT_API ct_tensor *ct_concat(int n, ct_tensor *const *tensors, int dim);
/* Joins n tensors of one shape along a new dim (-ndim-1 <= dim <= ndim). */
CT_API ct_tensor *ct_stack(int n, ct_tensor *const *tensors, int dim);

#endif
