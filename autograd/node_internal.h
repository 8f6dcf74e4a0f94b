/* ctrain — the node record shared by autograd/node.c and autograd/engine.c. */
#ifndef CT_AUTOGRAD_NODE_INTERNAL_H
#define CT_AUTOGRAD_NODE_INTERNAL_H

#include "autograd/node.h"

typedef struct ct_grad_hook {
    ct_grad_ready_fn fn;
    void *data;
    struct ct_grad_hook *next;
} ct_grad_hook;

/* Where the gradient of one input goes: that input's node, or the leaf itself. */
typedef struct ct_edge {
    ct_node *node;   /* owned reference, or NULL */
    ct_tensor *leaf; /* owned reference, or NULL */
} ct_edge;

struct ct_node {
    int refcount;
    const char *op;
    ct_backward_fn backward;
    uint64_t seq; /* creation order: the engine runs later nodes first */
    int ninputs, nsaved;
    bool saved_freed;
    bool needs_grad[CT_NODE_MAX_INPUTS];
    ct_edge edges[CT_NODE_MAX_INPUTS];
    ct_tensor meta[CT_NODE_MAX_INPUTS]; /* shape, dtype, device of each input; no storage */
    ct_tensor *saved[CT_NODE_MAX_SAVED];
    _Alignas(16) unsigned char ctx[CT_NODE_CTX_BYTES];

    /* engine scratch, valid during one backward */
    int64_t pending; /* edges from not-yet-run consumers */
    ct_tensor *grad; /* sum of incoming gradients (owned) */
    uint64_t visit;  /* backward pass that last counted this node */
};

void cti_node_release(ct_node *n);
void cti_node_free_saved(ct_node *n);

#endif
