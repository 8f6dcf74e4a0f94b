/* ctrain — a unit's parameters in one flat buffer (the sharding engine's FlatParameter).
 *
 * ct_shard_unit_flatten allocates a contiguous buffer of the unit's padded size and
 * rebinds each parameter (ct_tensor_rebind) to its slice, at the offset the plan gave
 * it: the modules keep the same tensor objects, with the same values, now views of
 * one buffer. The padding is zero. A collective can then gather or scatter a whole
 * unit in one call, and rank r's slice is elements [r*shard, (r+1)*shard).
 */
#ifndef CT_PARALLEL_SHARD_FLAT_H
#define CT_PARALLEL_SHARD_FLAT_H

#include "core/api.h"
#include "core/tensor.h"
#include "parallel/shard_plan.h"

/* The flat buffer, 1-d of u->padded elements, in the current frame (retain it to keep
 * it). Every parameter of the unit must have one floating dtype and one device: the
 * error names the first that differs, and no parameter has moved. */
CT_API ct_tensor *ct_shard_unit_flatten(const ct_shard_unit *u);

/* A flat gradient buffer for the unit, laid out as its parameters (1-d, u->padded
 * elements, padding zero, in the current frame): each parameter's .grad becomes its
 * slice (ct_tensor_set_grad), holding the gradient it had or zeros, so backward
 * accumulates every gradient of the unit in place, ready for one reduce-scatter or
 * all-reduce. Filling the buffer with zeros clears them all; ct_tensor_zero_grad (an
 * optimizer's zero_grad) drops the views instead, and the next backward allocates
 * gradients of its own again. */
CT_API ct_tensor *ct_shard_unit_flat_grads(const ct_shard_unit *u);

#endif
