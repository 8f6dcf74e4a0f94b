/* ctrain — column- and row-parallel linears (nn/tp_layers.h); the vocabulary-
 * parallel layers are in nn/tp_vocab.c. */
#include "nn/tp_layers.h"

#include <string.h>

#include "autograd/ops.h"
#include "core/frame.h"
#include "nn/tp_internal.h"
#include "nn/tp_ops.h"

ct_tensor *cti_tp_take_slice(const ct_tensor *full, int dim, int64_t start, int64_t end)
{
    int64_t shape[CT_MAX_DIMS];
    for (int i = 0; i < full->ndim; i++) shape[i] = full->shape[i];
    shape[dim] = end - start;
    ct_tensor *out = ct_tensor_zeros(full->dtype, full->ndim, shape);
    int64_t real_end = end < full->shape[dim] ? end : full->shape[dim];
    if (out && real_end > start) {
        ct_tensor *src = ct_tensor_narrow((ct_tensor *)full, dim, start, real_end - start);
        ct_tensor *dst = ct_tensor_narrow(out, dim, 0, real_end - start);
        if (!src || !dst || ct_tensor_copy_(dst, src)) return NULL;
    }
    return out;
}

ct_status cti_tp_check_group(const char *op, ct_pg *g)
{
    if (!g) return ct_error_set(CT_ERR_INVALID, "%s: NULL tensor-parallel group", op);
    return CT_OK;
}

/* x (..., in) -> (..., out): x @ w (+ b), w (in, out); or x @ w^T with w (out, in) */
static ct_tensor *linear_local(ct_tensor *x, ct_tensor *w, ct_tensor *b, bool out_in)
{
    if (!out_in || !x) return ct_linear(x, w, b);
    int64_t in = x->ndim ? x->shape[x->ndim - 1] : 1, shape[CT_MAX_DIMS];
    if (x->ndim < 1 || in != w->shape[1]) {
        char a[160], c[160];
        ct_error_set(CT_ERR_INVALID, "tp linear: x %s does not fit weight %s (stored (out, in))",
                     ct_tensor_describe(x, a, sizeof a), ct_tensor_describe(w, c, sizeof c));
        return NULL;
    }
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = w->shape[0];
    ct_tensor *x2 = ct_reshape(x, 2, (const int64_t[]){ct_tensor_numel(x) / in, in});
    ct_tensor *y = ct_reshape(ct_matmul_t(x2, w, false, true), x->ndim, shape);
    return b ? ct_add(y, b) : y;
}

/* The full weight's (in, out) and the checks every linear shares. */
static ct_status check_full(const char *op, ct_pg *g, const ct_tensor *w, const ct_tensor *b, bool out_in,
                            int64_t *in, int64_t *out)
{
    char a[160], c[160];
    if (cti_tp_check_group(op, g)) return ct_last_status();
    if (!w) return ct_error_set(CT_ERR_INVALID, "%s: NULL weight", op);
    if (w->ndim != 2 || !ct_dtype_is_float(w->dtype))
        return ct_error_set(CT_ERR_INVALID, "%s: weight %s; want a 2-d float tensor (%s)", op,
                            ct_tensor_describe(w, a, sizeof a), out_in ? "out, in" : "in, out");
    *in = w->shape[out_in ? 1 : 0], *out = w->shape[out_in ? 0 : 1];
    if (b && (b->ndim != 1 || b->shape[0] != *out || b->dtype != w->dtype))
        return ct_error_set(CT_ERR_INVALID, "%s: bias %s does not fit weight %s; want %s[%lld]", op,
                            ct_tensor_describe(b, a, sizeof a), ct_tensor_describe(w, c, sizeof c),
                            ct_dtype_name(w->dtype), (long long)*out);
    return CT_OK;
}

/* Registers the slice as parameter `name`; NULL slice: the error is already set. */
static ct_tensor *add_param(ct_module *m, const char *name, ct_tensor *slice)
{
    if (!slice || ct_module_add_param(m, name, slice)) return NULL;
    return slice;
}

ct_column_linear *ct_column_linear_new(ct_pg *g, const ct_tensor *weight, const ct_tensor *bias,
                                       const ct_tp_linear_config *cfg)
{
    const char *op = "column_linear_new";
    ct_tp_linear_config c = cfg ? *cfg : (ct_tp_linear_config){0};
    int64_t in, out;
    if (check_full(op, g, weight, bias, c.weight_out_in, &in, &out)) return NULL;
    int n = ct_pg_size(g), r = ct_pg_rank(g);
    int64_t padded = c.pad_output ? (out + n - 1) / n * n : out;
    if (padded % n) {
        ct_error_set(CT_ERR_INVALID,
                     "%s: tp %d does not divide the output size %lld (set pad_output to pad it with zero columns)", op,
                     n, (long long)out);
        return NULL;
    }
    ct_column_linear *m = ct_module_alloc(sizeof *m, "ColumnParallelLinear", NULL);
    if (!m) return NULL;
    m->group = g, m->cfg = c, m->in = in, m->out = out, m->out_local = padded / n;
    int64_t start = r * m->out_local, end = start + m->out_local;
    int wdim = c.weight_out_in ? 0 : 1;
    m->weight_shard = (ct_tp_shard){.dim = wdim, .start = start, .end = end, .full = out};
    m->bias_shard = (ct_tp_shard){.dim = 0, .start = start, .end = end, .full = out};
    ct_frame_push();
    m->weight = add_param(&m->base, "weight", cti_tp_take_slice(weight, wdim, start, end));
    if (m->weight && bias) m->bias = add_param(&m->base, "bias", cti_tp_take_slice(bias, 0, start, end));
    ct_frame_pop();
    if (!m->weight || (bias && !m->bias)) {
        ct_error_prefix("%s (rank %d of %d): ", op, r, n);
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

ct_tensor *ct_column_linear_forward(ct_column_linear *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    const ct_tp_linear_config *c = &m->cfg;
    ct_tensor *xin = c->sequence_parallel ? ct_tp_gather_from_sequence(m->group, x, c->sequence_dim)
                                          : ct_tp_copy_to(m->group, x);
    ct_tensor *y = linear_local(xin, m->weight, m->bias, c->weight_out_in);
    if (y && c->gather_output) {
        y = ct_tp_gather(m->group, y, -1);
        int64_t padded = m->out_local * ct_pg_size(m->group);
        if (y && padded != m->out) y = ct_narrow(y, y->ndim - 1, 0, m->out);
    }
    if (!y) ct_error_prefix("column_linear (rank %d of %d): ", ct_pg_rank(m->group), ct_pg_size(m->group));
    return ct_module_forward_end(&m->base, y);
}

ct_row_linear *ct_row_linear_new(ct_pg *g, const ct_tensor *weight, const ct_tensor *bias,
                                 const ct_tp_linear_config *cfg)
{
    const char *op = "row_linear_new";
    ct_tp_linear_config c = cfg ? *cfg : (ct_tp_linear_config){0};
    int64_t in, out;
    if (check_full(op, g, weight, bias, c.weight_out_in, &in, &out)) return NULL;
    int n = ct_pg_size(g), r = ct_pg_rank(g);
    if (in % n) {
        ct_error_set(CT_ERR_INVALID, "%s: tp %d does not divide the input size %lld", op, n, (long long)in);
        return NULL;
    }
    ct_row_linear *m = ct_module_alloc(sizeof *m, "RowParallelLinear", NULL);
    if (!m) return NULL;
    m->group = g, m->cfg = c, m->in = in, m->out = out, m->in_local = in / n;
    int64_t start = r * m->in_local, end = start + m->in_local;
    int wdim = c.weight_out_in ? 1 : 0;
    m->weight_shard = (ct_tp_shard){.dim = wdim, .start = start, .end = end, .full = in};
    m->bias_shard = (ct_tp_shard){.dim = -1, .start = 0, .end = out, .full = out};
    ct_frame_push();
    m->weight = add_param(&m->base, "weight", cti_tp_take_slice(weight, wdim, start, end));
    if (m->weight && bias) m->bias = add_param(&m->base, "bias", ct_tensor_clone(bias));
    ct_frame_pop();
    if (!m->weight || (bias && !m->bias)) {
        ct_error_prefix("%s (rank %d of %d): ", op, r, n);
        ct_module_free(&m->base);
        return NULL;
    }
    return m;
}

ct_tensor *ct_row_linear_forward(ct_row_linear *m, ct_tensor *x)
{
    if (!m || !x || ct_module_forward_begin(&m->base)) return NULL;
    const ct_tp_linear_config *c = &m->cfg;
    ct_tensor *xin = c->input_is_parallel ? x : ct_tp_split(m->group, x, -1);
    /* the bias is added once, after the reduction, not on every rank's partial sum */
    ct_tensor *y = linear_local(xin, m->weight, NULL, c->weight_out_in);
    y = c->sequence_parallel ? ct_tp_reduce_scatter_to_sequence(m->group, y, c->sequence_dim)
                             : ct_tp_reduce_from(m->group, y);
    if (y && m->bias) y = ct_add(y, m->bias);
    if (!y) ct_error_prefix("row_linear (rank %d of %d): ", ct_pg_rank(m->group), ct_pg_size(m->group));
    return ct_module_forward_end(&m->base, y);
}

const ct_tp_shard *ct_tp_shard_of(const ct_module *m, const ct_tensor *param)
{
    if (!m || !param || !m->type) return NULL;
    if (!strcmp(m->type, "ColumnParallelLinear")) {
        const ct_column_linear *l = (const ct_column_linear *)m;
        return param == l->weight ? &l->weight_shard : param == l->bias ? &l->bias_shard : NULL;
    }
    if (!strcmp(m->type, "RowParallelLinear")) {
        const ct_row_linear *l = (const ct_row_linear *)m;
        return param == l->weight ? &l->weight_shard : param == l->bias ? &l->bias_shard : NULL;
    }
    if (!strcmp(m->type, "VocabParallelEmbedding")) {
        const ct_vocab_embedding *l = (const ct_vocab_embedding *)m;
        return param == l->weight ? &l->weight_shard : NULL;
    }
    return NULL;
}
