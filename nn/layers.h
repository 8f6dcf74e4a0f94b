/* ctrain — basic layers. Each embeds ct_module first, so (ct_module *)layer
 * works with every function of nn/module.h. Constructors return NULL with a
 * message on bad sizes. Forward functions are differentiable (autograd/ops.h);
 * results are new references in the current frame.
 *
 * Parameters are f32 unless ct_nn_set_param_dtype says otherwise.
 * Initialisation follows GPT-2: weights normal(0, init_std) (0.02 unless
 * given), biases 0, norm weights 1 and biases 0.
 */
#ifndef CT_NN_LAYERS_H
#define CT_NN_LAYERS_H

#include "core/api.h"
#include "core/philox.h"
#include "nn/module.h"

/* y = x @ weight + bias, weight stored (in, out) as HuggingFace's Conv1D, so
 * GPT-2 checkpoints load unchanged. x (..., in) -> y (..., out). */
typedef struct ct_linear_layer {
    ct_module base;
    int64_t in, out;
    ct_tensor *weight; /* (in, out) */
    ct_tensor *bias;   /* (out) or NULL */
} ct_linear_layer;
/* A Linear layer in -> out (bias optional; init_std <= 0: 0.02); the caller owns it and frees
 * it with ct_module_free. */
CT_API ct_linear_layer *ct_linear_layer_new(int64_t in, int64_t out, bool bias, double init_std);
/* x (..., in) -> x @ weight + bias (..., out) (new reference, current frame). */
CT_API ct_tensor *ct_linear_layer_forward(ct_linear_layer *m, ct_tensor *x);

/* ids (...) integer -> (..., dim) rows of weight (num, dim). */
typedef struct ct_embedding_layer {
    ct_module base;
    int64_t num, dim;
    ct_tensor *weight;
} ct_embedding_layer;
/* An Embedding of num rows of width dim; the caller owns it and frees it with ct_module_free. */
CT_API ct_embedding_layer *ct_embedding_layer_new(int64_t num, int64_t dim, double init_std);
/* The rows of weight that ids select: (...) -> (..., dim) (new reference, current frame). */
CT_API ct_tensor *ct_embedding_layer_forward(ct_embedding_layer *m, ct_tensor *ids);

/* over the last dim: y = (x - mean) / sqrt(var + eps) * weight + bias */
typedef struct ct_layernorm_layer {
    ct_module base;
    int64_t dim;
    double eps;
    ct_tensor *weight, *bias; /* (dim) each; bias may be NULL */
} ct_layernorm_layer;
/* A LayerNorm over a last dim of size dim (bias optional); the caller owns it and frees it with
 * ct_module_free. */
CT_API ct_layernorm_layer *ct_layernorm_layer_new(int64_t dim, double eps, bool bias);
/* Layer normalisation of x over its last dim (new reference, current frame). */
CT_API ct_tensor *ct_layernorm_layer_forward(ct_layernorm_layer *m, ct_tensor *x);

/* over the last dim: y = x / sqrt(mean(x^2) + eps) * weight */
typedef struct ct_rmsnorm_layer {
    ct_module base;
    int64_t dim;
    double eps;
    ct_tensor *weight;
} ct_rmsnorm_layer;
/* An RMSNorm over a last dim of size dim; the caller owns it and frees it with ct_module_free. */
CT_API ct_rmsnorm_layer *ct_rmsnorm_layer_new(int64_t dim, double eps);
/* RMS normalisation of x over its last dim (new reference, current frame). */
CT_API ct_tensor *ct_rmsnorm_layer_forward(ct_rmsnorm_layer *m, ct_tensor *x);

/* Zeroes elements with probability p in training mode, scaling the rest by
 * 1/(1-p); identity in evaluation mode. Masks come from rng (NULL: the
 * process generator). */
typedef struct ct_dropout_layer {
    ct_module base;
    double p;
    ct_rng *rng;
} ct_dropout_layer;
/* A Dropout layer with probability p in [0, 1); the caller owns it and frees it with
 * ct_module_free. */
CT_API ct_dropout_layer *ct_dropout_layer_new(double p);
/* Dropout of x in training mode, x itself in evaluation mode (new reference, current frame). */
CT_API ct_tensor *ct_dropout_layer_forward(ct_dropout_layer *m, ct_tensor *x);

/* The dtype new parameters get on this thread (f32 by default; any float
 * dtype, e.g. f64 to gradcheck a whole model). Returns the previous one. */
CT_API ct_dtype ct_nn_set_param_dtype(ct_dtype dt);

/* Fills t with normal(0, std) from the process generator (no grad recorded). */
CT_API ct_status ct_init_normal_(ct_tensor *t, double std);

#endif
