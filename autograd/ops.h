/* ctrain — the differentiable op API.
 *
 * Every op here runs its kernel (kernels/) and, when grad mode is on and an
 * input requires grad, records a node so ct_backward can differentiate it
 * (autograd/autograd.h). Results are new references owned by the current
 * frame; a NULL input gives NULL and keeps the earlier error message; a bad
 * call gives NULL with a message naming the op and the operands' shapes.
 *
 *   autograd/ops_math.h   elementwise with broadcasting, activations, matmul, reductions
 *   autograd/ops_shape.h  views, reshape, concat, casts
 *   autograd/ops_nn.h     softmax, norms, embedding, dropout, cross-entropy, attention
 *   autograd/ops_fp8.h    the fp8 linear (quantised operands, delayed scales)
 */
#ifndef CT_AUTOGRAD_OPS_H
#define CT_AUTOGRAD_OPS_H

#include "autograd/autograd.h"
#include "autograd/ops_fp8.h"
#include "autograd/ops_math.h"
#include "autograd/ops_nn.h"
#include "autograd/ops_shape.h"

#endif
