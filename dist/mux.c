/* The composite transport "shm+tcp": a world whose ranks are spread over several
 * nodes, some of them sharing one. Peers on this rank's node are served by the
 * shared-memory transport (dist/shm.c, rings only: no direct allreduce, which needs
 * every rank on one node), the others by the TCP transport (dist/tcp.c); each
 * sub-transport holds only its own peers' connections. Sends are routed by peer;
 * both sub-transports deliver to the one handler given to start, with the world's
 * peer numbers, so the engine does not know there are two. The setup that decides
 * which peer goes where is dist/shm_setup.c.
 */
#include <stdlib.h>
#include <string.h>

#include "dist/transport_internal.h"

typedef struct mux_tp {
    ct_transport base;
    ct_transport *sub[CT_LINK_KINDS]; /* CT_LINK_SHM, CT_LINK_TCP */
    uint8_t *route;                   /* per peer: CT_LINK_SHM or CT_LINK_TCP */
    int open_subs;                    /* sub-transports not closed yet */
    void (*closed)(ct_transport *t, void *arg);
    void *closed_arg;
} mux_tp;

static ct_status mux_start(ct_transport *t, uv_loop_t *loop, const ct_transport_handler *h)
{
    mux_tp *m = (mux_tp *)t;
    ct_status st = CT_OK;
    /* both run: a failed start (none today) still leaves every handle closeable */
    for (int k = 0; k < CT_LINK_KINDS; k++) {
        ct_status s = m->sub[k]->ops->start(m->sub[k], loop, h);
        if (!st) st = s;
    }
    return st;
}

static ct_status mux_send(ct_transport *t, int peer, const ct_msg *msg, const void *payload, bool copy,
                          ct_transport_send_cb cb, void *arg)
{
    mux_tp *m = (mux_tp *)t;
    CT_ASSERT(peer >= 0 && peer < t->size && peer != t->rank);
    ct_transport *s = m->sub[m->route[peer]];
    return s->ops->send(s, peer, msg, payload, copy, cb, arg);
}

static void on_sub_closed(ct_transport *sub, void *arg)
{
    (void)sub;
    mux_tp *m = arg;
    if (--m->open_subs == 0) m->closed(&m->base, m->closed_arg);
}

static void mux_close(ct_transport *t, void (*closed)(ct_transport *t, void *arg), void *arg)
{
    mux_tp *m = (mux_tp *)t;
    m->closed = closed;
    m->closed_arg = arg;
    m->open_subs = CT_LINK_KINDS;
    for (int k = 0; k < CT_LINK_KINDS; k++) m->sub[k]->ops->close(m->sub[k], on_sub_closed, m);
}

static void mux_free(ct_transport *t)
{
    mux_tp *m = (mux_tp *)t;
    if (!m) return;
    for (int k = 0; k < CT_LINK_KINDS; k++)
        if (m->sub[k]) m->sub[k]->ops->free(m->sub[k]);
    free(m->route);
    cti_transport_base_free(t);
    free(m);
}

static void mux_stats(const ct_transport *t, ct_link_count *out)
{
    const mux_tp *m = (const mux_tp *)t;
    for (int k = 0; k < CT_LINK_KINDS; k++) m->sub[k]->ops->stats(m->sub[k], out);
}

static const ct_transport_ops mux_ops = {.name = "shm+tcp",
                                         .start = mux_start,
                                         .send = mux_send,
                                         .close = mux_close,
                                         .free = mux_free,
                                         .stats = mux_stats};

ct_transport *cti_mux_transport_new(int rank, int size, ct_transport *shm, ct_transport *tcp, const bool *use_shm)
{
    mux_tp *m = shm && tcp ? calloc(1, sizeof *m) : NULL;
    if (m) m->route = calloc((size_t)size, 1);
    if (!m || !m->route) {
        if (m) free(m);
        if (shm) shm->ops->free(shm);
        if (tcp) tcp->ops->free(tcp);
        if (shm && tcp) ct_error_set(CT_ERR_NOMEM, "shm+tcp: out of memory setting up the transport for %d ranks", size);
        return NULL; /* a missing sub-transport's error is already set */
    }
    m->base.ops = &mux_ops;
    m->base.rank = rank;
    m->base.size = size;
    m->sub[CT_LINK_SHM] = shm;
    m->sub[CT_LINK_TCP] = tcp;
    for (int p = 0; p < size; p++) m->route[p] = use_shm[p] ? CT_LINK_SHM : CT_LINK_TCP;
    return &m->base;
}
