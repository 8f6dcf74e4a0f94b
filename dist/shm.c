/* The shared-memory transport's loop side: per peer, one ring to write (this rank ->
 * peer) and one to read (peer -> this rank), and the pair's TCP connection as the
 * doorbell that wakes a sleeping side and reports a dead peer. The segments and the
 * connections are made by dist/shm_setup.c; the ring protocol is in
 * dist/shm_internal.h.
 *
 * Sending. Messages queue per peer and are copied into the ring as space allows, in
 * pieces of at most PIECE bytes, head being published after each piece so that the
 * reader can start on a large message while the rest is written. A message is
 * complete (its callback runs, from the idle handle) once its last byte is in the
 * ring; one that fits when it is sent is written at once and needs no copy.
 *
 * Receiving. The ring holds the same byte stream as a TCP connection: a header, then
 * the payload, copied straight from the ring into the buffer the handler chose. A
 * doorbell wake-up, or the idle handle when a peer has more than RX_BUDGET bytes
 * waiting (so that one busy peer does not starve the others), drains the ring.
 *
 * A dead peer. The kernel closes a dead process's sockets: the doorbell reads EOF (or
 * a reset). What the peer wrote before is still delivered (its goodbye, say); then
 * the peer is reported gone, exactly as the TCP transport does.
 *
 * Peers without rings (on another node) are not this transport's: the composite
 * transport (dist/mux.c) sends to them over TCP. Only a transport with every rank
 * as its peer has the direct allreduce's slots.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dist/shm_direct_internal.h"
#include "dist/shm_internal.h"

#define PIECE (256u * 1024)   /* bytes copied between two publications of head or tail */
#define RX_BUDGET (4u << 20)  /* bytes one peer delivers per turn of the loop */

typedef struct shm_tp shm_tp;

typedef struct shm_send {
    struct shm_send *next;
    ct_transport_send_cb cb;
    void *arg;
    int status;
    const uint8_t *payload;
    uint32_t len;
    size_t off; /* bytes of header and payload already in the ring */
    uint8_t hdr[CT_MSG_HEADER];
    uint8_t copy[]; /* the payload, when the sender asked for a copy and it had to wait */
} shm_send;

typedef struct shm_peer {
    shm_tp *tp;
    int peer, fd;
    uv_poll_t poll;
    bool open;    /* the poll handle was initialised (and must be closed) */
    bool closing; /* nothing more is read or written */
    bool more;    /* the read ring had more than one turn's budget */
    ct_shm_ring *tx, *rx;
    uint8_t *txd, *rxd;
    uint64_t txcap, rxcap; /* read once at setup: the peer cannot change them later */
    shm_send *q, *q_tail;
    ct_msg_reader rd; /* the incoming stream */
} shm_peer;

struct shm_tp {
    ct_transport base;
    shm_peer *peers;
    ct_shm_ring **slots; /* per rank: the direct allreduce's segments */
    ct_shm_direct *direct;
    ct_transport_handler h;
    uv_idle_t idle;
    bool idle_open, idle_on;
    shm_send *done, *done_tail; /* complete sends whose callbacks have not run */
    int open_handles, npeers;
    bool closing;
    void (*closed)(ct_transport *t, void *arg);
    void *closed_arg;
    _Atomic int64_t sent; /* payload bytes queued to peers (the loop writes, any thread reads) */
};

static size_t min_sz(uint64_t a, uint64_t b) { return (size_t)(a < b ? a : b); }

static void ring_put(uint8_t *d, uint64_t cap, uint64_t at, const uint8_t *src, size_t n)
{
    size_t off = (size_t)(at % cap), first = min_sz(cap - off, n);
    memcpy(d + off, src, first);
    if (n > first) memcpy(d, src + first, n - first);
}

static void ring_get(const uint8_t *d, uint64_t cap, uint64_t at, uint8_t *dst, size_t n)
{
    size_t off = (size_t)(at % cap), first = min_sz(cap - off, n);
    memcpy(dst, d + off, first);
    if (n > first) memcpy(dst + first, d, n - first);
}

/* One byte on the connection. A full socket buffer already holds a wake-up, and a
 * broken connection is reported by the poll on it, so failures are ignored. */
static void ring_bell(shm_peer *p)
{
    ssize_t k;
    do k = send(p->fd, "", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
}

static void on_idle(uv_idle_t *h);

static void kick(shm_tp *tp)
{
    if (tp->idle_on || !tp->idle_open || tp->closing) return;
    tp->idle_on = true;
    CT_ASSERT(uv_idle_start(&tp->idle, on_idle) == 0); /* fails only without a callback */
}

static void finish(shm_tp *tp, shm_send *s, int status)
{
    s->status = status;
    s->next = NULL;
    if (tp->done_tail) tp->done_tail->next = s;
    else tp->done = s;
    tp->done_tail = s;
    kick(tp);
}

static void run_done(shm_tp *tp)
{
    while (tp->done) {
        shm_send *s = tp->done;
        tp->done = s->next;
        if (!tp->done) tp->done_tail = NULL;
        s->cb(s->arg, s->status);
        free(s);
    }
}

static void handle_closed(shm_tp *tp)
{
    if (--tp->open_handles > 0 || !tp->closing) return;
    run_done(tp); /* cancelled and unreported sends, as libuv does for a closed stream */
    if (tp->closed) tp->closed(&tp->base, tp->closed_arg);
}

static void on_handle_closed(uv_handle_t *h)
{
    if (h->type == UV_POLL) {
        shm_peer *p = h->data;
        close(p->fd);
        p->fd = -1;
        handle_closed(p->tp);
    } else {
        handle_closed(h->data);
    }
}

/* Stops reading and writing to p; tells the handler unless the transport itself is
 * closing. Queued sends complete with UV_ECANCELED. */
static void conn_fail(shm_peer *p, ct_status st, bool report, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void conn_fail(shm_peer *p, ct_status st, bool report, const char *fmt, ...)
{
    if (p->closing) return;
    shm_tp *tp = p->tp;
    p->closing = true;
    p->more = false;
    if (p->open) {
        uv_close((uv_handle_t *)&p->poll, on_handle_closed); /* closes the socket */
    } else if (p->fd >= 0) {
        close(p->fd);
        p->fd = -1;
    }
    while (p->q) {
        shm_send *s = p->q;
        p->q = s->next;
        finish(tp, s, UV_ECANCELED);
    }
    p->q_tail = NULL;
    if (!report || tp->closing) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tp->h.on_peer_error(tp->h.ctx, p->peer, st, msg);
}

/* ---- sending ------------------------------------------------------------------------------ */

/* Bytes free in p's write ring, or -1 (reported) when the peer corrupted its tail. */
static int64_t tx_space(shm_peer *p, uint64_t head)
{
    uint64_t used = head - atomic_load_explicit(&p->tx->tail, memory_order_acquire);
    if (used > p->txcap) {
        conn_fail(p, CT_ERR_FORMAT, true, "corrupted its shared-memory ring (tail %llu bytes behind head)",
                  (unsigned long long)used);
        return -1;
    }
    return (int64_t)(p->txcap - used);
}

/* Copies queued messages into the ring until the queue is empty or the ring full; in
 * the latter case asks the reader for a wake-up (tx_sleep). */
static void tx_pump(shm_peer *p)
{
    ct_shm_ring *r = p->tx;
    while (p->q && !p->closing) {
        uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
        int64_t space = tx_space(p, head);
        if (space < 0) return;
        if (space == 0) {
            atomic_store_explicit(&r->tx_sleep, 1, memory_order_relaxed);
            atomic_thread_fence(memory_order_seq_cst);
            if (atomic_load_explicit(&r->tail, memory_order_relaxed) + p->txcap == head) return;
            atomic_store_explicit(&r->tx_sleep, 0, memory_order_relaxed);
            continue;
        }
        size_t budget = min_sz((uint64_t)space, PIECE), n = 0;
        while (p->q && n < budget) {
            shm_send *s = p->q;
            size_t total = CT_MSG_HEADER + (size_t)s->len;
            size_t k = min_sz(total - s->off, budget - n);
            if (s->off < CT_MSG_HEADER) {
                size_t h = min_sz(CT_MSG_HEADER - s->off, k);
                ring_put(p->txd, p->txcap, head + n, s->hdr + s->off, h);
                s->off += h;
                n += h;
                k -= h;
            }
            if (k) {
                ring_put(p->txd, p->txcap, head + n, s->payload + (s->off - CT_MSG_HEADER), k);
                s->off += k;
                n += k;
            }
            if (s->off == total) {
                p->q = s->next;
                if (!p->q) p->q_tail = NULL;
                finish(p->tp, s, 0);
            }
        }
        atomic_store_explicit(&r->head, head + n, memory_order_release);
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&r->rx_sleep, memory_order_relaxed) &&
            atomic_exchange_explicit(&r->rx_sleep, 0, memory_order_relaxed))
            ring_bell(p);
    }
}

static ct_status shm_send_msg(ct_transport *t, int peer, const ct_msg *m, const void *payload, bool copy,
                              ct_transport_send_cb cb, void *arg)
{
    shm_tp *tp = (shm_tp *)t;
    CT_ASSERT(peer >= 0 && peer < t->size && peer != t->rank);
    shm_peer *p = &tp->peers[peer];
    if (p->closing || !p->open) return CT_ERR_PEER;
    /* A message that fits behind an empty queue is written before this returns: no copy. */
    size_t total = CT_MSG_HEADER + (size_t)m->len;
    int64_t space = p->q ? 0 : tx_space(p, atomic_load_explicit(&p->tx->head, memory_order_relaxed));
    if (space < 0) return CT_ERR_PEER;
    bool now = (uint64_t)space >= total;
    shm_send *s = malloc(sizeof *s + (copy && !now ? m->len : 0));
    if (!s) return CT_ERR_NOMEM;
    s->next = NULL;
    s->cb = cb;
    s->arg = arg;
    s->status = 0;
    s->len = m->len;
    s->off = 0;
    s->payload = payload;
    cti_msg_encode(s->hdr, m);
    if (copy && !now && m->len) {
        memcpy(s->copy, payload, m->len);
        s->payload = s->copy;
    }
    if (p->q_tail) p->q_tail->next = s;
    else p->q = s;
    p->q_tail = s;
    atomic_fetch_add_explicit(&tp->sent, m->len, memory_order_relaxed);
    tx_pump(p);
    /* the space only grows while this rank is the one writing */
    CT_ASSERT(!now || p->closing || s->off == total);
    return CT_OK;
}

/* ---- receiving ---------------------------------------------------------------------------- */

static void message_done(shm_peer *p) { cti_msg_reader_done(&p->rd, &p->tp->h, p->peer); }

static void header_done(shm_peer *p)
{
    char why[160];
    int rc = cti_msg_reader_header(&p->rd, &p->tp->h, p->peer, why, sizeof why);
    if (rc == -1) conn_fail(p, CT_ERR_FORMAT, true, "sent a malformed frame: %s", why);
    if (rc == -2) conn_fail(p, CT_ERR_FORMAT, false, "closed by the handler");
}

/* Parses n bytes of the stream starting at ring position at; returns how many were
 * used (fewer when the handler closed the connection). */
static uint64_t consume(shm_peer *p, uint64_t at, uint64_t n)
{
    uint64_t used = 0;
    while (used < n && !p->closing) {
        if (!p->rd.in_payload) {
            size_t k = min_sz(CT_MSG_HEADER - p->rd.hdr_got, n - used);
            ring_get(p->rxd, p->rxcap, at + used, p->rd.hdr + p->rd.hdr_got, k);
            p->rd.hdr_got += k;
            used += k;
            if (p->rd.hdr_got == CT_MSG_HEADER) header_done(p);
        } else {
            size_t k = min_sz(p->rd.m.len - p->rd.got, n - used);
            if (!p->rd.drop) ring_get(p->rxd, p->rxcap, at + used, p->rd.dest + p->rd.got, k);
            p->rd.got += k;
            used += k;
            if (p->rd.got == p->rd.m.len) message_done(p);
        }
    }
    return used;
}

/* Delivers what p's ring holds, up to budget bytes (the rest on the next turn), then
 * goes to sleep on it (rx_sleep). */
static void rx_drain(shm_peer *p, uint64_t budget)
{
    ct_shm_ring *r = p->rx;
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed), moved = 0;
    while (!p->closing) {
        uint64_t avail = atomic_load_explicit(&r->head, memory_order_acquire) - tail;
        if (avail > p->rxcap) {
            conn_fail(p, CT_ERR_FORMAT, true, "corrupted its shared-memory ring (head %llu bytes ahead of tail)",
                      (unsigned long long)avail);
            return;
        }
        if (avail == 0) {
            atomic_store_explicit(&r->rx_sleep, 1, memory_order_relaxed);
            atomic_thread_fence(memory_order_seq_cst);
            if (atomic_load_explicit(&r->head, memory_order_relaxed) == tail) return;
            atomic_store_explicit(&r->rx_sleep, 0, memory_order_relaxed);
            continue;
        }
        if (moved >= budget) {
            p->more = true;
            kick(p->tp);
            return;
        }
        uint64_t n = consume(p, tail, avail < PIECE ? avail : PIECE);
        tail += n;
        moved += n;
        atomic_store_explicit(&r->tail, tail, memory_order_release);
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&r->tx_sleep, memory_order_relaxed) &&
            atomic_exchange_explicit(&r->tx_sleep, 0, memory_order_relaxed))
            ring_bell(p);
    }
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    shm_peer *p = h->data;
    if (p->closing) return;
    (void)events;
    int err = 0;
    bool eof = false;
    char buf[256];
    for (;;) {
        ssize_t k = recv(p->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k == (ssize_t)sizeof buf) continue;
        if (k > 0) break;
        if (k == 0) eof = true;
        else if (errno == EINTR) continue;
        else if (errno != EAGAIN && errno != EWOULDBLOCK) err = uv_translate_sys_error(errno);
        break;
    }
    if (status < 0 && !eof && !err) {
        /* libuv reports a socket error (POLLERR: a reset, say) as UV_EBADF: ask the socket */
        int so = 0;
        socklen_t len = sizeof so;
        err = getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &so, &len) == 0 && so ? uv_translate_sys_error(so) : status;
    }
    tx_pump(p);
    /* a peer that is gone writes no more: deliver everything it wrote before going */
    rx_drain(p, eof || err ? UINT64_MAX : RX_BUDGET);
    if (p->closing || !(eof || err)) return;
    const char *where = p->rd.in_payload || p->rd.hdr_got ? " in the middle of a message" : "";
    if (eof) conn_fail(p, CT_ERR_PEER, true, "closed its connection%s: did the process exit or crash?", where);
    else
        conn_fail(p, CT_ERR_PEER, true, "lost its connection%s (%s): did the process exit or crash?", where,
                  uv_strerror(err));
}

static void on_idle(uv_idle_t *h)
{
    shm_tp *tp = h->data;
    run_done(tp);
    bool more = false;
    for (int i = 0; i < tp->base.size; i++) {
        shm_peer *p = &tp->peers[i];
        if (!p->more || p->closing) continue;
        p->more = false;
        tx_pump(p);
        rx_drain(p, RX_BUDGET);
        more |= p->more;
    }
    if (!more && !tp->done) {
        tp->idle_on = false;
        uv_idle_stop(h);
    }
}

/* ---- the transport ------------------------------------------------------------------------ */

static ct_status shm_start(ct_transport *t, uv_loop_t *loop, const ct_transport_handler *h)
{
    shm_tp *tp = (shm_tp *)t;
    tp->h = *h;
    CT_ASSERT(uv_idle_init(loop, &tp->idle) == 0); /* only initialises a struct */
    tp->idle.data = tp;
    tp->idle_open = true;
    tp->open_handles++;
    for (int i = 0; i < t->size; i++) {
        shm_peer *p = &tp->peers[i];
        if (i == t->rank || !p->tx) continue; /* not a peer of this transport */
        int rc = uv_poll_init(loop, &p->poll, p->fd);
        if (rc < 0) {
            /* never watched: the peer is lost to this rank */
            conn_fail(p, CT_ERR_INTERNAL, true, "could not be attached to the comm loop (uv_poll_init: %s)",
                      uv_strerror(rc));
            continue;
        }
        p->poll.data = p;
        p->open = true;
        tp->open_handles++;
        rc = uv_poll_start(&p->poll, UV_READABLE, on_poll);
        if (rc < 0) {
            conn_fail(p, CT_ERR_INTERNAL, true, "could not be watched (uv_poll_start: %s)", uv_strerror(rc));
            continue;
        }
        p->more = true; /* what peers wrote before the loop watched their doorbells */
    }
    kick(tp);
    return CT_OK;
}

static void shm_close(ct_transport *t, void (*closed)(ct_transport *t, void *arg), void *arg)
{
    shm_tp *tp = (shm_tp *)t;
    tp->closed = closed;
    tp->closed_arg = arg;
    for (int i = 0; i < t->size; i++)
        if (!tp->peers[i].closing) tx_pump(&tp->peers[i]); /* what fits still goes (the groups' goodbyes) */
    tp->closing = true;
    for (int i = 0; i < t->size; i++) conn_fail(&tp->peers[i], CT_ERR_PEER, false, "closing");
    if (tp->idle_open) {
        tp->idle_open = false;
        uv_close((uv_handle_t *)&tp->idle, on_handle_closed);
    }
    if (tp->open_handles == 0) {
        run_done(tp);
        closed(t, arg);
    }
}

static void unmap(ct_shm_ring *r, uint64_t cap)
{
    if (r) munmap(r, CT_SHM_CTL_BYTES + cap);
}

static void shm_free(ct_transport *t)
{
    shm_tp *tp = (shm_tp *)t;
    if (!tp) return;
    for (int i = 0; i < t->size; i++) {
        shm_peer *p = &tp->peers[i];
        if (p->fd >= 0) close(p->fd);
        unmap(p->tx, p->txcap);
        unmap(p->rx, p->rxcap);
        while (p->q) { /* only for a transport never started */
            shm_send *s = p->q;
            p->q = s->next;
            free(s);
        }
    }
    cti_shm_direct_free(tp->direct);
    for (int i = 0; tp->slots && i < t->size; i++) unmap(tp->slots[i], tp->slots[i] ? tp->slots[i]->capacity : 0);
    free(tp->slots);
    free(tp->peers);
    cti_transport_base_free(t);
    free(tp);
}

static void shm_stats(const ct_transport *t, ct_link_count *out)
{
    shm_tp *tp = (shm_tp *)t;
    out->peers[CT_LINK_SHM] += tp->npeers;
    out->bytes[CT_LINK_SHM] +=
        atomic_load_explicit(&tp->sent, memory_order_relaxed) + (tp->direct ? cti_shm_direct_bytes(tp->direct) : 0);
}

static const ct_transport_ops shm_ops = {.name = "shm",
                                         .start = shm_start,
                                         .send = shm_send_msg,
                                         .close = shm_close,
                                         .free = shm_free,
                                         .stats = shm_stats};

ct_shm_direct *cti_shm_transport_direct(ct_transport *t)
{
    return t && t->ops == &shm_ops ? ((shm_tp *)t)->direct : NULL;
}

ct_transport *cti_shm_transport_wrap(int rank, int size, int *fds, ct_shm_ring **tx, ct_shm_ring **rx,
                                     ct_shm_ring **slots, size_t slot, double spin_s)
{
    shm_tp *tp = calloc(1, sizeof *tp);
    if (tp) tp->peers = calloc((size_t)size, sizeof *tp->peers);
    if (tp && tp->peers && slots) tp->direct = cti_shm_direct_new(rank, size, (void *const *)slots, slot, spin_s);
    if (!tp || !tp->peers || (slots && !tp->direct)) {
        if (tp) free(tp->peers);
        free(tp);
        for (int p = 0; p < size; p++) {
            if (fds[p] >= 0) close(fds[p]);
            if (tx[p]) unmap(tx[p], tx[p]->capacity);
            if (rx[p]) unmap(rx[p], rx[p]->capacity);
            if (slots && slots[p]) unmap(slots[p], slots[p]->capacity);
        }
        free(fds);
        free(tx);
        free(rx);
        free(slots);
        ct_error_set(CT_ERR_NOMEM, "shm: out of memory setting up the transport for %d ranks", size);
        return NULL;
    }
    tp->slots = slots;
    tp->base.ops = &shm_ops;
    tp->base.rank = rank;
    tp->base.size = size;
    for (int i = 0; i < size; i++) {
        shm_peer *p = &tp->peers[i];
        p->tp = tp;
        p->peer = i;
        p->fd = fds[i];
        p->closing = i == rank || !tx[i];
        p->tx = tx[i];
        p->rx = rx[i];
        if (p->closing) continue;
        tp->npeers++;
        p->txcap = p->tx->capacity;
        p->rxcap = p->rx->capacity;
        p->txd = (uint8_t *)p->tx + CT_SHM_CTL_BYTES;
        p->rxd = (uint8_t *)p->rx + CT_SHM_CTL_BYTES;
    }
    free(fds);
    free(tx);
    free(rx);
    return &tp->base;
}
