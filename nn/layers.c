#include "nn/layers.h"

#include <stdlib.h>

#include "autograd/ops.h"
#include "core/frame.h"

ct_status ct_init_normal_(ct_tensor *t, double std)
{
    if (!t) return ct_error_set(CT_ERR_INVALID, "init_normal_: tensor is NULL");
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *r = ct_tensor_randn(t->dtype, t->ndim, t->shape, 0.0, std);
        st = r ? ct_tensor_copy_(t, r) : ct_last_status();
    }
    return st;
}

static _Thread_local ct_dtype param_dtype = CT_DTYPE_F32;

ct_dtype ct_nn_set_param_dtype(ct_dtype dt)
{
    ct_dtype prev = param_dtype;
    if (ct_dtype_is_float(dt)) param_dtype = dt;
    return prev;
}


/* Registers a fresh parameter; returns the (module-owned) tensor or NULL. */
static ct_tensor *new_param(ct_module *m, const char *name, int ndim, const int64_t *shape, double fill,
                            double std)
{
    ct_tensor *t = NULL;
    CT_FRAME {
        ct_tensor *x = ct_tensor_full(param_dtype, ndim, shape, fill);
        if (x && std > 0 && ct_init_normal_(x, std)) x = NULL;
        if (x && !ct_module_add_param(m, name, x)) t = x;
    }
    return t;
}

static double std_or_default(double s) { return s > 0 ? s : 0.02; }

ct_linear_layer *ct_linear_layer_new(int64_t in, int64_t out, bool bias, double init_std)
{
    if (in <= 0 || out <= 0) {
        ct_error_set(CT_ERR_INVALID, "linear_new: in %lld and out %lld must be positive", (long long)in,
                     (long long)out);
        return NULL;
    }
    ct_linear_layer *m = ct_module_alloc(sizeof *m, "Linear", NULL);
    if (!m) return NULL;
    m->in = in, m->out = out;
    m->weight = new_param(&m->base, "weight", CT_SHAPE(in, out), 0, std_or_default(init_std));
    if (m->weight && bias) m->bias = new_param(&m->base, "bias", CT_SHAPE(out), 0, 0);
    if (!m->weight || (bias && !m->bias)) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

ct_tensor *ct_linear_layer_forward(ct_linear_layer *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    return ct_module_forward_end(&m->base, ct_linear(x, m->weight, m->bias));
}

ct_embedding_layer *ct_embedding_layer_new(int64_t num, int64_t dim, double init_std)
{
    if (num <= 0 || dim <= 0) {
        ct_error_set(CT_ERR_INVALID, "embedding_new: num %lld and dim %lld must be positive", (long long)num,
                     (long long)dim);
        return NULL;
    }
    ct_embedding_layer *m = ct_module_alloc(sizeof *m, "Embedding", NULL);
    if (!m) return NULL;
    m->num = num, m->dim = dim;
    m->weight = new_param(&m->base, "weight", CT_SHAPE(num, dim), 0, std_or_default(init_std));
    if (!m->weight) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

ct_tensor *ct_embedding_layer_forward(ct_embedding_layer *m, ct_tensor *ids)
{
    if (!m || !ids || ct_module_forward_begin(&m->base)) return NULL;
    return ct_module_forward_end(&m->base, ct_embedding(m->weight, ids));
}

ct_layernorm_layer *ct_layernorm_layer_new(int64_t dim, double eps, bool bias)
{
    if (dim <= 0) {
        ct_error_set(CT_ERR_INVALID, "layernorm_new: dim %lld must be positive", (long long)dim);
        return NULL;
    }
    ct_layernorm_layer *m = ct_module_alloc(sizeof *m, "LayerNorm", NULL);
    if (!m) return NULL;
    m->dim = dim;
    m->eps = eps > 0 ? eps : 1e-5;
    m->weight = new_param(&m->base, "weight", CT_SHAPE(dim), 1, 0);
    if (m->weight && bias) m->bias = new_param(&m->base, "bias", CT_SHAPE(dim), 0, 0);
    if (!m->weight || (bias && !m->bias)) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

ct_tensor *ct_layernorm_layer_forward(ct_layernorm_layer *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    return ct_module_forward_end(&m->base, ct_layernorm(x, m->weight, m->bias, m->eps));
}

ct_rmsnorm_layer *ct_rmsnorm_layer_new(int64_t dim, double eps)
{
    if (dim <= 0) {
        ct_error_set(CT_ERR_INVALID, "rmsnorm_new: dim %lld must be positive", (long long)dim);
        return NULL;
    }
    ct_rmsnorm_layer *m = ct_module_alloc(sizeof *m, "RMSNorm", NULL);
    if (!m) return NULL;
    m->dim = dim;
    m->eps = eps > 0 ? eps : 1e-6;
    m->weight = new_param(&m->base, "weight", CT_SHAPE(dim), 1, 0);
    if (!m->weight) {
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

ct_tensor *ct_rmsnorm_layer_forward(ct_rmsnorm_layer *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    return ct_module_forward_end(&m->base, ct_rmsnorm(x, m->weight, m->eps));
}

ct_dropout_layer *ct_dropout_layer_new(double p)
{
    if (!(p >= 0 && p < 1)) {
        ct_error_set(CT_ERR_INVALID, "dropout_new: p = %g must be in [0, 1)", p);
        return NULL;
    }
    ct_dropout_layer *m = ct_module_alloc(sizeof *m, "Dropout", NULL);
    if (m) m->p = p;
    return m;
}

ct_tensor *ct_dropout_layer_forward(ct_dropout_layer *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    return ct_module_forward_end(&m->base, ct_dropout(x, m->p, m->base.training, m->rng));
}
