/* Graph nodes, grad mode, leaves and hooks. The backward pass is in engine.c. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/node_internal.h"
#include "core/frame.h"
#include "core/tensor_internal.h"

static _Thread_local bool grad_disabled;
static _Atomic uint64_t node_seq;

bool ct_grad_set_enabled(bool enabled)
{
    bool prev = !grad_disabled;
    grad_disabled = !enabled;
    return prev;
}

bool ct_grad_is_enabled(void) { return !grad_disabled; }

bool ct_autograd_needed(int n, const ct_tensor *const *inputs)
{
    if (grad_disabled) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) return true;
    return false;
}

/* ---- lifetime ----------------------------------------------------------------- */

static void hooks_free(ct_grad_hook *h)
{
    while (h) {
        ct_grad_hook *next = h->next;
        free(h);
        h = next;
    }
}

void cti_node_release(ct_node *n)
{
    if (!n || __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    cti_node_free_saved(n);
    for (int i = 0; i < n->ninputs; i++) {
        cti_node_release(n->edges[i].node);
        ct_tensor_release(n->edges[i].leaf);
    }
    free(n);
}

void cti_node_free_saved(ct_node *n)
{
    for (int i = 0; i < n->nsaved; i++) {
        ct_tensor_release(n->saved[i]);
        n->saved[i] = NULL;
    }
    if (n->nsaved) n->saved_freed = true;
}

/* Called by core when a tensor's last reference goes. */
static void release_autograd(ct_tensor *t)
{
    cti_node_release(t->grad_fn);
    t->grad_fn = NULL;
    hooks_free(t->grad_hooks);
    t->grad_hooks = NULL;
}

static void install_release_hook(void)
{
    if (!cti_autograd_release_hook) cti_autograd_release_hook = release_autograd;
}

/* ---- nodes ------------------------------------------------------------------------ */

ct_node *ct_node_new(const char *op, ct_backward_fn backward, int ninputs, ct_tensor *const *inputs)
{
    if (ninputs < 0 || ninputs > CT_NODE_MAX_INPUTS || !backward) {
        ct_error_set(CT_ERR_INTERNAL, "%s: node with %d inputs (max %d)", op, ninputs, CT_NODE_MAX_INPUTS);
        return NULL;
    }
    install_release_hook();
    ct_node *n = calloc(1, sizeof *n);
    if (!n) {
        ct_error_set(CT_ERR_NOMEM, "%s: out of memory recording the graph", op);
        return NULL;
    }
    n->refcount = 1;
    n->op = op;
    n->backward = backward;
    n->ninputs = ninputs;
    n->seq = atomic_fetch_add(&node_seq, 1);
    for (int i = 0; i < ninputs; i++) {
        ct_tensor *x = inputs[i];
        if (!x) continue;
        /* shape/dtype of the input as recorded; no storage */
        ct_tensor *m = &n->meta[i];
        m->dtype = x->dtype;
        m->device = x->device;
        m->ndim = x->ndim;
        memcpy(m->shape, x->shape, sizeof m->shape);
        memcpy(m->strides, x->strides, sizeof m->strides);
        if (!x->requires_grad) continue;
        n->needs_grad[i] = true;
        if (x->grad_fn) {
            n->edges[i].node = x->grad_fn;
            __atomic_add_fetch(&x->grad_fn->refcount, 1, __ATOMIC_RELAXED);
        } else {
            n->edges[i].leaf = ct_tensor_retain(x);
        }
    }
    return n;
}

void ct_node_discard(ct_node *n) { cti_node_release(n); }

ct_status ct_node_save(ct_node *n, ct_tensor *t, bool is_output)
{
    if (!n || !t) return ct_error_set(CT_ERR_INTERNAL, "node_save: NULL %s", n ? "tensor" : "node");
    if (n->nsaved == CT_NODE_MAX_SAVED)
        return ct_error_set(CT_ERR_INTERNAL, "%s: more than %d saved tensors", n->op, CT_NODE_MAX_SAVED);
    ct_tensor *keep = t;
    if (is_output || t->grad_fn) {
        /* a header of its own without history: saving a tensor that points back
         * at this node (or any node) through grad_fn would keep the graph alive */
        keep = cti_tensor_alias(t, t->ndim, t->shape, t->strides, t->offset);
        if (!keep) return ct_last_status();
    }
    n->saved[n->nsaved++] = ct_tensor_retain(keep);
    return CT_OK;
}

ct_tensor *ct_node_saved(const ct_node *n, int i)
{
    return n && i >= 0 && i < n->nsaved ? n->saved[i] : NULL;
}

void *ct_node_ctx(ct_node *n) { return n ? n->ctx : NULL; }

const char *ct_node_op(const ct_node *n) { return n ? n->op : "?"; }

int ct_node_ninputs(const ct_node *n) { return n ? n->ninputs : 0; }

bool ct_node_input_needs_grad(const ct_node *n, int i)
{
    return n && i >= 0 && i < n->ninputs && n->needs_grad[i];
}

const ct_tensor *ct_node_input_meta(const ct_node *n, int i)
{
    return n && i >= 0 && i < n->ninputs ? &n->meta[i] : NULL;
}

ct_status ct_node_attach(ct_node *n, ct_tensor *out)
{
    if (!n) return ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    if (!out) {
        cti_node_release(n);
        return ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    }
    cti_node_release(out->grad_fn);
    out->grad_fn = n;
    out->requires_grad = true;
    return CT_OK;
}

/* ---- leaves --------------------------------------------------------------------- */

bool ct_tensor_is_leaf(const ct_tensor *t) { return t && !t->grad_fn; }

ct_status ct_tensor_set_requires_grad(ct_tensor *t, bool requires_grad)
{
    char d[200];
    if (!t) return ct_error_set(CT_ERR_INVALID, "set_requires_grad: tensor is NULL");
    if (t->grad_fn)
        return ct_error_set(CT_ERR_INVALID,
                            "set_requires_grad: %s is the output of %s, not a leaf; use ct_detach to make a leaf",
                            ct_tensor_describe(t, d, sizeof d), t->grad_fn->op);
    if (requires_grad && !ct_dtype_is_float(t->dtype))
        return ct_error_set(CT_ERR_INVALID, "set_requires_grad: %s: only floating tensors can require grad",
                            ct_tensor_describe(t, d, sizeof d));
    install_release_hook();
    t->requires_grad = requires_grad;
    return CT_OK;
}

void ct_tensor_zero_grad(ct_tensor *t)
{
    if (!t) return;
    ct_tensor_release(t->grad);
    t->grad = NULL;
}

ct_status ct_tensor_set_grad(ct_tensor *t, ct_tensor *grad)
{
    char a[200], b[200];
    if (!t || !grad) return ct_error_set(CT_ERR_INVALID, "tensor_set_grad: NULL tensor");
    if (!t->requires_grad || t->grad_fn)
        return ct_error_set(CT_ERR_INVALID, "tensor_set_grad: %s is not a leaf that requires grad",
                            ct_tensor_describe(t, a, sizeof a));
    if (!ct_tensor_same_shape(t, grad) || t->dtype != grad->dtype || !ct_device_equal(t->device, grad->device) ||
        grad->requires_grad || grad == t)
        return ct_error_set(CT_ERR_INVALID,
                            "tensor_set_grad: %s cannot be the gradient of %s (needs the same shape, dtype and device, "
                            "and no grad of its own)",
                            ct_tensor_describe(grad, b, sizeof b), ct_tensor_describe(t, a, sizeof a));
    ct_tensor_retain(grad);
    ct_tensor_release(t->grad);
    t->grad = grad;
    return CT_OK;
}

ct_tensor *ct_detach(ct_tensor *t)
{
    if (!t) return NULL;
    return cti_tensor_alias(t, t->ndim, t->shape, t->strides, t->offset);
}

ct_status ct_tensor_on_grad_ready(ct_tensor *leaf, ct_grad_ready_fn fn, void *data)
{
    char d[200];
    if (!leaf || !fn) return ct_error_set(CT_ERR_INVALID, "on_grad_ready: NULL %s", leaf ? "function" : "tensor");
    if (leaf->grad_fn)
        return ct_error_set(CT_ERR_INVALID, "on_grad_ready: %s is not a leaf (output of %s)",
                            ct_tensor_describe(leaf, d, sizeof d), leaf->grad_fn->op);
    install_release_hook();
    ct_grad_hook *h = calloc(1, sizeof *h);
    if (!h) return ct_error_set(CT_ERR_NOMEM, "on_grad_ready: out of memory");
    h->fn = fn;
    h->data = data;
    ct_grad_hook **tail = &leaf->grad_hooks;
    while (*tail) tail = &(*tail)->next;
    *tail = h;
    return CT_OK;
}

void ct_tensor_clear_grad_hooks(ct_tensor *leaf)
{
    if (!leaf) return;
    hooks_free(leaf->grad_hooks);
    leaf->grad_hooks = NULL;
}
