/* The backward pass.
 *
 * 1. From the root's node, a depth-first walk counts for every reachable node
 *    how many edges lead into it (its consumers) and for every leaf how many
 *    edges deliver to it.
 * 2. Nodes whose consumers have all run are ready; the ready node created last
 *    runs first (a max-heap on the creation sequence), which gives a fixed order
 *    that follows the forward pass backwards.
 * 3. A node's gradient is the sum of what its consumers sent. Its backward
 *    function returns one gradient per input: sent on to the input's node, or
 *    added (+=) into the leaf's .grad. When the last edge into a leaf has
 *    delivered, that leaf's grad-ready hooks run.
 * Each node runs inside its own frame, so its temporaries go as soon as it is
 * done, and frees its saved tensors unless retain_graph is set.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/node_internal.h"
#include "core/frame.h"
#include "kernels/elementwise.h"

static _Atomic uint64_t pass_counter;
/* the backward running on this thread (0: none), for grad-ready hooks */
static _Thread_local uint64_t current_pass;

uint64_t ct_backward_pass(void) { return current_pass; }

typedef struct {
    ct_tensor *leaf;
    int64_t remaining;
} leaf_count;

typedef struct {
    ct_node **nodes; /* every reachable node, for cleanup */
    int64_t nnodes, cap_nodes;
    ct_node **heap;
    int64_t nheap;
    leaf_count *leaves;
    int64_t nleaves, cap_leaves;
} pass_state;

static bool push_ptr(void ***v, int64_t *n, int64_t *cap, void *p)
{
    if (*n == *cap) {
        int64_t c = *cap ? *cap * 2 : 64;
        void **nv = realloc(*v, (size_t)c * sizeof *nv);
        if (!nv) return false;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = p;
    return true;
}

static void heap_push(pass_state *s, ct_node *n)
{
    int64_t i = s->nheap++;
    s->heap[i] = n;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (s->heap[p]->seq >= s->heap[i]->seq) break;
        ct_node *t = s->heap[p];
        s->heap[p] = s->heap[i];
        s->heap[i] = t;
        i = p;
    }
}

static ct_node *heap_pop(pass_state *s)
{
    ct_node *top = s->heap[0];
    s->heap[0] = s->heap[--s->nheap];
    int64_t i = 0;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->nheap && s->heap[l]->seq > s->heap[m]->seq) m = l;
        if (r < s->nheap && s->heap[r]->seq > s->heap[m]->seq) m = r;
        if (m == i) break;
        ct_node *t = s->heap[m];
        s->heap[m] = s->heap[i];
        s->heap[i] = t;
        i = m;
    }
    return top;
}

static int cmp_leaf(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const leaf_count *)a)->leaf, y = (uintptr_t)((const leaf_count *)b)->leaf;
    return x < y ? -1 : x > y;
}

static leaf_count *find_leaf(pass_state *s, ct_tensor *leaf)
{
    leaf_count key = {leaf, 0};
    return bsearch(&key, s->leaves, (size_t)s->nleaves, sizeof key, cmp_leaf);
}

/* Step 1: count consumers of every node and deliveries to every leaf. */
static ct_status collect(pass_state *s, ct_node *root, uint64_t pass)
{
    ct_node **stack = NULL;
    int64_t nstack = 0, cap = 0;
    ct_status st = CT_OK;
    root->visit = pass;
    root->pending = 0;
    if (!push_ptr((void ***)&stack, &nstack, &cap, root) ||
        !push_ptr((void ***)&s->nodes, &s->nnodes, &s->cap_nodes, root))
        st = ct_error_set(CT_ERR_NOMEM, "backward: out of memory walking the graph");
    while (!st && nstack > 0) {
        ct_node *n = stack[--nstack];
        if (n->saved_freed) {
            st = ct_error_set(CT_ERR_INVALID,
                              "backward: the graph through %s was already freed by an earlier backward; pass "
                              "retain_graph = true to the first ct_backward_with to run backward twice",
                              n->op);
            break;
        }
        for (int i = 0; i < n->ninputs && !st; i++) {
            ct_node *c = n->edges[i].node;
            if (c) {
                if (c->visit != pass) {
                    c->visit = pass;
                    c->pending = 0;
                    c->grad = NULL;
                    if (!push_ptr((void ***)&stack, &nstack, &cap, c) ||
                        !push_ptr((void ***)&s->nodes, &s->nnodes, &s->cap_nodes, c))
                        st = ct_error_set(CT_ERR_NOMEM, "backward: out of memory walking the graph");
                }
                c->pending++;
            } else if (n->edges[i].leaf) {
                if (s->nleaves == s->cap_leaves) {
                    int64_t c2 = s->cap_leaves ? s->cap_leaves * 2 : 64;
                    leaf_count *nl = realloc(s->leaves, (size_t)c2 * sizeof *nl);
                    if (!nl) {
                        st = ct_error_set(CT_ERR_NOMEM, "backward: out of memory walking the graph");
                        break;
                    }
                    s->leaves = nl;
                    s->cap_leaves = c2;
                }
                s->leaves[s->nleaves++] = (leaf_count){n->edges[i].leaf, 1};
            }
        }
    }
    free(stack);
    if (st) return st;
    /* merge repeated leaves (a parameter used by several ops) into one count */
    qsort(s->leaves, (size_t)s->nleaves, sizeof *s->leaves, cmp_leaf);
    int64_t m = 0;
    for (int64_t i = 0; i < s->nleaves; i++) {
        if (m > 0 && s->leaves[m - 1].leaf == s->leaves[i].leaf) s->leaves[m - 1].remaining++;
        else s->leaves[m++] = s->leaves[i];
    }
    s->nleaves = m;
    s->heap = malloc((size_t)(s->nnodes ? s->nnodes : 1) * sizeof *s->heap);
    if (!s->heap) return ct_error_set(CT_ERR_NOMEM, "backward: out of memory");
    return CT_OK;
}

static ct_status run_hooks(ct_tensor *leaf)
{
    for (ct_grad_hook *h = leaf->grad_hooks; h; h = h->next) {
        ct_status st = h->fn(leaf, h->data);
        if (st) return st;
    }
    return CT_OK;
}

/* True when t has exactly `refs` references, nothing else views its storage and it is
 * dense: then whoever holds those references may keep t, or write into it, without
 * anyone else seeing the change. Backward functions return fresh tensors (one
 * reference, the node's frame) or borrowed/shared ones (more references, or a
 * shared storage), so this tells the two apart. */
static bool sole_owner(const ct_tensor *t, int refs)
{
    return __atomic_load_n(&t->refcount, __ATOMIC_ACQUIRE) == refs && t->storage &&
           __atomic_load_n(&t->storage->refcount, __ATOMIC_ACQUIRE) == 1 && ct_tensor_is_contiguous(t) &&
           !t->requires_grad;
}

/* leaf.grad += g. The first time, leaf.grad becomes g itself when g is a fresh
 * tensor nobody else holds and that goes nowhere else (exclusive), which saves a
 * copy of every parameter's gradient per step; else an owned copy. Either way the
 * leaf's .grad is its own, so later calls add into it in place. */
static ct_status accumulate_leaf(ct_tensor *leaf, ct_tensor *g, bool exclusive)
{
    if (!leaf->grad && exclusive && sole_owner(g, 1) && ct_device_equal(g->device, leaf->device)) {
        leaf->grad = ct_tensor_retain(g);
        return CT_OK;
    }
    if (!leaf->grad) {
        ct_tensor *c = ct_tensor_clone(g);
        if (!c) return ct_last_status();
        leaf->grad = ct_tensor_retain(c);
        return CT_OK;
    }
    return ct_kernel_binary_out(CT_BINARY_ADD, leaf->grad, leaf->grad, g);
}

/* exclusive: g is not also the gradient of another input of `from`. */
static ct_status deliver(pass_state *s, ct_node *from, int i, ct_tensor *g, bool exclusive)
{
    ct_edge *e = &from->edges[i];
    const ct_tensor *meta = &from->meta[i];
    char want[200], got[200];
    if (g && (!ct_tensor_same_shape(g, meta) || g->dtype != meta->dtype))
        return ct_error_set(CT_ERR_INTERNAL, "backward of %s: gradient for input %d is %s, the input was %s", from->op,
                            i, ct_tensor_describe(g, got, sizeof got), ct_tensor_describe(meta, want, sizeof want));
    if (e->node) {
        ct_node *c = e->node;
        if (g) {
            if (!c->grad) {
                c->grad = ct_tensor_retain(g);
            } else if (sole_owner(c->grad, 1)) { /* only the engine holds it: sum in place */
                ct_status st = ct_kernel_binary_out(CT_BINARY_ADD, c->grad, c->grad, g);
                if (st) return st;
            } else {
                ct_tensor *sum = ct_kernel_binary(CT_BINARY_ADD, c->grad, g);
                if (!sum) return ct_last_status();
                ct_tensor_release(c->grad);
                c->grad = ct_tensor_retain(sum);
            }
        }
        if (--c->pending == 0) heap_push(s, c);
        return CT_OK;
    }
    if (e->leaf) {
        if (g) {
            ct_status st = accumulate_leaf(e->leaf, g, exclusive);
            if (st) return st;
        }
        leaf_count *lc = find_leaf(s, e->leaf);
        CT_ASSERT(lc != NULL);
        if (--lc->remaining == 0) return run_hooks(e->leaf);
    }
    return CT_OK;
}

static ct_status run_node(pass_state *s, ct_node *n, bool retain_graph)
{
    ct_status st = CT_OK;
    ct_frame_push();
    ct_tensor *gx[CT_NODE_MAX_INPUTS] = {0};
    ct_tensor *gy = n->grad;
    if (gy) {
        st = n->backward(n, gy, gx);
        if (st && !ct_last_error()[0]) ct_error_set(st, "backward of %s failed", n->op);
    }
    for (int i = 0; i < n->ninputs && !st; i++) {
        if (!n->needs_grad[i]) continue;
        bool exclusive = true;
        for (int j = 0; j < n->ninputs; j++)
            if (j != i && gx[j] == gx[i]) exclusive = false;
        st = deliver(s, n, i, gx[i], exclusive);
    }
    ct_tensor_release(n->grad);
    n->grad = NULL;
    if (!retain_graph) cti_node_free_saved(n);
    ct_frame_pop();
    return st;
}

ct_status ct_backward(ct_tensor *loss) { return ct_backward_with(loss, NULL, NULL); }

ct_status ct_backward_with(ct_tensor *root, const ct_tensor *grad, const ct_backward_config *cfg)
{
    char d[200], g[200];
    if (!root) return ct_last_status() ? ct_last_status() : ct_error_set(CT_ERR_INVALID, "backward: root is NULL");
    if (!root->requires_grad)
        return ct_error_set(CT_ERR_INVALID, "backward: %s does not require grad (no parameter it depends on requires "
                            "grad, or it was computed under CT_NO_GRAD)", ct_tensor_describe(root, d, sizeof d));
    bool retain = cfg && cfg->retain_graph;
    ct_status st = CT_OK;
    const uint64_t outer = current_pass;
    uint64_t pass = atomic_fetch_add(&pass_counter, 1) + 1;
    current_pass = pass;
    bool prev = ct_grad_set_enabled(false);
    ct_frame_push();
    ct_tensor *seed;
    if (!grad) {
        if (ct_tensor_numel(root) != 1) {
            st = ct_error_set(CT_ERR_INVALID, "backward: %s has %lld elements; backward without an upstream gradient "
                              "needs a one-element loss (use ct_backward_with)",
                              ct_tensor_describe(root, d, sizeof d), (long long)ct_tensor_numel(root));
            goto out;
        }
        seed = ct_tensor_full_on(root->device, root->dtype, root->ndim, root->shape, 1.0);
    } else {
        if (!ct_tensor_same_shape(grad, root) || grad->dtype != root->dtype) {
            st = ct_error_set(CT_ERR_INVALID, "backward: upstream gradient %s does not match the root %s",
                              ct_tensor_describe(grad, g, sizeof g), ct_tensor_describe(root, d, sizeof d));
            goto out;
        }
        seed = ct_tensor_contiguous((ct_tensor *)grad);
    }
    if (!seed) {
        st = ct_last_status();
        goto out;
    }
    if (!root->grad_fn) { /* backward on a leaf itself */
        st = accumulate_leaf(root, seed, true);
        if (!st) st = run_hooks(root);
        goto out;
    }
    pass_state s = {0};
    st = collect(&s, root->grad_fn, pass);
    if (!st) {
        root->grad_fn->grad = ct_tensor_retain(seed);
        heap_push(&s, root->grad_fn);
        while (!st && s.nheap > 0) st = run_node(&s, heap_pop(&s), retain);
    }
    for (int64_t i = 0; i < s.nnodes; i++) { /* after an error, drop partial sums */
        ct_tensor_release(s.nodes[i]->grad);
        s.nodes[i]->grad = NULL;
    }
    free(s.nodes);
    free(s.heap);
    free(s.leaves);
out:
    ct_frame_pop();
    ct_grad_set_enabled(prev);
    current_pass = outer;
    if (st && strncmp(ct_last_error(), "backward", 8) != 0) ct_error_prefix("backward: ");
    return st;
}
