/* The fp8 linear; the math is in autograd/ops_fp8.h. */
#include <string.h>

#include "autograd/node.h"
#include "autograd/ops_fp8.h"

#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "precision/autocast.h"

typedef struct {
    bool trans_w;
    ct_dtype g_dtype;
    float g_scale;
    int8_t ix, iw, icell; /* saved index of qx, qw and the gradient's amax cell; -1: not saved */
} fp8_linear_ctx;

static ct_tensor *as_f32(ct_tensor *t) { return t->dtype == CT_DTYPE_F32 ? t : ct_tensor_cast(t, CT_DTYPE_F32); }

static bool float_ok(ct_dtype dt) { return dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16; }

static ct_status fp8_linear_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    const fp8_linear_ctx *c = ct_node_ctx(n);
    const ct_tensor *mx = ct_node_input_meta(n, 0);
    int64_t out = gy->shape[gy->ndim - 1];
    ct_tensor *g2 = ct_tensor_reshape(gy, CT_SHAPE(-1, out));
    float amax = 0.0f;
    /* quantise widens a 16-bit gradient itself (exactly); no f32 copy */
    ct_tensor *qg = g2 ? ct_fp8_quantize(g2, c->g_dtype, c->g_scale, &amax) : NULL;
    if (!qg) return ct_last_status();
    ct_fp8_amax_cell_raise(ct_node_saved(n, c->icell), amax);
    if (ct_node_input_needs_grad(n, 0)) {
        ct_tensor *g = ct_fp8_matmul(qg, ct_node_saved(n, c->iw), false, !c->trans_w);
        if (g && g->dtype != mx->dtype) g = ct_tensor_cast(g, mx->dtype);
        if (!(gx[0] = g ? ct_tensor_reshape(g, mx->ndim, mx->shape) : NULL)) return ct_last_status();
    }
    if (ct_node_input_needs_grad(n, 1)) {
        ct_tensor *qx = ct_node_saved(n, c->ix);
        ct_tensor *dw = c->trans_w ? ct_fp8_matmul(qg, qx, true, false) : ct_fp8_matmul(qx, qg, true, false);
        /* f32 from the fp8 product; a 16-bit weight (sharded mixed precision) gets its own dtype */
        const ct_dtype wdt = ct_node_input_meta(n, 1)->dtype;
        if (dw && dw->dtype != wdt) dw = ct_tensor_cast(dw, wdt);
        if (!(gx[1] = dw)) return ct_last_status();
    }
    if (ct_node_input_needs_grad(n, 2)) { /* the bias gradient sums in f32, then takes b's dtype */
        ct_tensor *g32 = as_f32(g2);
        ct_tensor *db = g32 ? ct_kernel_sum(g32, (int[]){0}, 1, false) : NULL;
        const ct_dtype bdt = ct_node_input_meta(n, 2)->dtype;
        if (db && db->dtype != bdt) db = ct_tensor_cast(db, bdt);
        if (!(gx[2] = db)) return ct_last_status();
    }
    return CT_OK;
}

/* y (M, out) f32, contiguous: each row += b */
static void add_bias_rows(ct_tensor *y, const ct_tensor *b)
{
    int64_t M = y->shape[0], N = y->shape[1], bs = b->strides[0];
    float *py = ct_tensor_data(y);
    const float *pb = ct_tensor_data(b);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) py[i * N + j] += pb[j * bs];
}

ct_tensor *ct_fp8_linear(ct_fp8_state *st, ct_tensor *x, ct_tensor *w, ct_tensor *b, bool trans_w)
{
    char dx[200], dw[200], db[200];
    if (!st || !x || !w) {
        ct_error_set(CT_ERR_INVALID, "fp8_linear: the state, x or w is NULL");
        return NULL;
    }
    int64_t in = w->ndim == 2 ? w->shape[trans_w ? 1 : 0] : -1, out = w->ndim == 2 ? w->shape[trans_w ? 0 : 1] : -1;
    const bool x_ok = x->ndim >= 1 && float_ok(x->dtype);
    if (!x_ok || w->ndim != 2 || !float_ok(w->dtype) || x->shape[x->ndim - 1] != in ||
        (b && (b->ndim != 1 || b->shape[0] != out || !float_ok(b->dtype))) ||
        !ct_device_equal(x->device, w->device) || (b && !ct_device_equal(b->device, w->device))) {
        ct_error_set(CT_ERR_INVALID,
                     "fp8_linear: x %s, w %s%s, b %s: need x (..., in), w %s and b (out) or NULL, each "
                     "f32/bf16/f16, all on one device",
                     ct_tensor_describe(x, dx, sizeof dx), ct_tensor_describe(w, dw, sizeof dw),
                     trans_w ? " (transposed)" : "", b ? ct_tensor_describe(b, db, sizeof db) : "NULL",
                     trans_w ? "(out, in)" : "(in, out)");
        return NULL;
    }
    ct_fp8_use u;
    if (ct_fp8_state_use(st, w, &u)) {
        ct_error_prefix("fp8_linear: ");
        return NULL;
    }
    ct_tensor *x2 = ct_tensor_reshape(x, CT_SHAPE(-1, in));
    float amax = 0.0f;
    ct_tensor *qx = x2 ? ct_fp8_quantize(x2, u.x_dtype, u.x_scale, &amax) : NULL;
    if (!qx) {
        ct_error_prefix("fp8_linear: x %s: ", ct_tensor_describe(x, dx, sizeof dx));
        return NULL;
    }
    ct_fp8_state_observe_input(st, u.slot, amax);
    ct_tensor *y2 = ct_fp8_matmul(qx, u.wq, false, trans_w);
    if (!y2) {
        ct_error_prefix("fp8_linear: ");
        return NULL;
    }
    if (b) {
        ct_tensor *b32 = as_f32(b);
        if (!b32) return NULL;
        /* on a GPU the broadcasting add kernel does the same f32 additions */
        if (y2->device.type == CT_DEVICE_CPU) add_bias_rows(y2, b32);
        else if (!(y2 = ct_kernel_binary(CT_BINARY_ADD, y2, b32))) return NULL;
    }
    ct_dtype odt = ct_autocast_enabled() ? ct_autocast_dtype() : CT_DTYPE_F32;
    if (odt != CT_DTYPE_F32 && !(y2 = ct_tensor_cast(y2, odt))) return NULL;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = out;
    ct_tensor *y = ct_tensor_view(y2, x->ndim, shape);
    ct_tensor *inputs[3] = {x, w, b};
    if (!y || !ct_autograd_needed(3, (const ct_tensor *const *)inputs)) return y;
    ct_node *n = ct_node_new("fp8_linear", fp8_linear_backward, 3, inputs);
    if (!n) return NULL;
    fp8_linear_ctx *c = ct_node_ctx(n);
    *c = (fp8_linear_ctx){trans_w, u.g_dtype, u.g_scale, -1, -1, -1};
    int k = 0;
    ct_status s = ct_node_save(n, u.g_amax, false);
    if (!s) c->icell = (int8_t)k++;
    if (!s && ct_node_input_needs_grad(n, 1) && !(s = ct_node_save(n, qx, false))) c->ix = (int8_t)k++;
    if (!s && ct_node_input_needs_grad(n, 0) && !(s = ct_node_save(n, u.wq, false))) c->iw = (int8_t)k++;
    if (s) {
        ct_node_discard(n);
        return NULL;
    }
    return ct_node_attach(n, y) ? NULL : y;
}

ct_fp8_state *ct_fp8_linear_state(const ct_tensor *x, const ct_tensor *w)
{
    if (!x || !w || ct_autocast_rule_of(CT_AC_LINEAR) != CT_AC_FP8 || !ct_autocast_enabled()) return NULL;
    /* f64 never goes fp8; the weight may be 16-bit: the sharded strategies' parameters
     * are under mixed precision, and they must get fp8 as DDP's f32 ones do */
    bool x_ok = x->dtype == CT_DTYPE_F32 || x->dtype == CT_DTYPE_BF16 || x->dtype == CT_DTYPE_F16;
    bool w_ok = w->dtype == CT_DTYPE_F32 || w->dtype == CT_DTYPE_BF16 || w->dtype == CT_DTYPE_F16;
    return x_ok && w_ok && w->requires_grad && !w->grad_fn ? ct_autocast_fp8_state() : NULL;
}
