/* ctrain — helpers shared by the core's tensor files; not part of the public API. */
#ifndef CT_CORE_TENSOR_INTERNAL_H
#define CT_CORE_TENSOR_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/tensor.h"

/* Set by the autograd layer so that core can drop a tensor's graph node and
 * hooks when the tensor is freed (core cannot call up into autograd). */
extern void (*cti_autograd_release_hook)(ct_tensor *t);

/* Checks 0 <= ndim <= CT_MAX_DIMS and sizes >= 0; sets an error naming op. */
ct_status cti_check_shape(const char *op, int ndim, const int64_t *shape);
/* New contiguous header over s, consuming the caller's reference to s; in the current frame. */
ct_tensor *cti_tensor_wrap_storage(ct_storage *s, ct_dtype dt, int ndim, const int64_t *shape);
/* A header sharing t's storage with the given layout (a view), in the current frame. */
ct_tensor *cti_tensor_alias(const ct_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                            int64_t offset);
/* Normalises a possibly negative dim for an ndim-d tensor; false if out of range. */
bool cti_dim_normalize(int *dim, int ndim);

#ifdef __cplusplus
}
#endif

#endif
