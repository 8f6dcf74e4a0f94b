/* The TCP transport's loop side: one libuv stream per peer, framed messages in both
 * directions. The connections are made by dist/tcp_setup.c.
 *
 * Receiving. A connection reads frames: a CT_MSG_HEADER header, then the payload
 * into the buffer the handler chose. Small reads go through one staging buffer per
 * transport (everything in it is consumed inside the read callback, so the
 * connections can share it); once the rest of a payload is large, libuv reads
 * straight into its destination, so big transfers are never copied twice.
 *
 * Sending. Header and payload go out in one uv_write (two buffers); without a copy
 * the payload is read in place until the write callback. A failed write or read, an
 * EOF, or bytes that are not a frame close that connection and tell the handler once.
 *
 * Peers without a connection (fds[p] == -1 at wrap time) are not this transport's:
 * the composite transport (dist/mux.c) sends to them over shared memory.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/tcp_internal.h"

#define STAGE_BYTES (64 * 1024)
#define DIRECT_MIN (32 * 1024) /* payload left at which reads go straight to the destination */

typedef struct tcp_tp tcp_tp;

typedef struct tcp_conn {
    uv_tcp_t h;
    tcp_tp *tp;
    int peer;
    bool open;    /* the handle was initialised (and must be closed) */
    bool closing; /* uv_close called: nothing more is read or written */
    ct_msg_reader rd; /* the incoming stream */
} tcp_conn;

struct tcp_tp {
    ct_transport base;
    int *fds; /* per peer until start hands them to libuv; -1 when none */
    tcp_conn *conns;
    ct_transport_handler h;
    uint8_t *stage;
    int open_handles, npeers;
    bool closing;
    void (*closed)(ct_transport *t, void *arg);
    void *closed_arg;
    _Atomic int64_t sent; /* payload bytes queued to peers (the loop writes, any thread reads) */
};

typedef struct tcp_send {
    uv_write_t req;
    ct_transport_send_cb cb;
    void *arg;
    uint8_t hdr[CT_MSG_HEADER];
    uint8_t copy[]; /* the payload, when the sender asked for a copy */
} tcp_send;

/* ---- the loop side ---------------------------------------------------------------- */

static void on_conn_closed(uv_handle_t *h)
{
    tcp_conn *c = h->data;
    tcp_tp *tp = c->tp;
    if (--tp->open_handles == 0 && tp->closing && tp->closed) tp->closed(&tp->base, tp->closed_arg);
}

/* Shuts the connection; tells the handler unless the transport itself is closing. */
static void conn_fail(tcp_conn *c, ct_status st, bool report, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void conn_fail(tcp_conn *c, ct_status st, bool report, const char *fmt, ...)
{
    if (c->closing) return;
    c->closing = true;
    uv_close((uv_handle_t *)&c->h, on_conn_closed);
    if (!report || c->tp->closing) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->tp->h.on_peer_error(c->tp->h.ctx, c->peer, st, msg);
}

static void on_written(uv_write_t *req, int status)
{
    tcp_send *s = (tcp_send *)req;
    tcp_conn *c = req->handle->data;
    s->cb(s->arg, status);
    free(s);
    if (status < 0 && status != UV_ECANCELED)
        conn_fail(c, CT_ERR_PEER, true, "failed a write (%s): did the process exit or crash?", uv_strerror(status));
}

static ct_status tcp_send_msg(ct_transport *t, int peer, const ct_msg *m, const void *payload, bool copy,
                              ct_transport_send_cb cb, void *arg)
{
    tcp_tp *tp = (tcp_tp *)t;
    CT_ASSERT(peer >= 0 && peer < t->size && peer != t->rank);
    tcp_conn *c = &tp->conns[peer];
    if (c->closing || !c->open) return CT_ERR_PEER;
    tcp_send *s = malloc(sizeof *s + (copy ? m->len : 0));
    if (!s) return CT_ERR_NOMEM;
    s->cb = cb;
    s->arg = arg;
    cti_msg_encode(s->hdr, m);
    const void *p = payload;
    if (copy && m->len) {
        memcpy(s->copy, payload, m->len);
        p = s->copy;
    }
    uv_buf_t b[2] = {uv_buf_init((char *)s->hdr, CT_MSG_HEADER), uv_buf_init((char *)p, m->len)};
    int rc = uv_write(&s->req, (uv_stream_t *)&c->h, b, m->len ? 2 : 1, on_written);
    if (rc < 0) {
        free(s);
        conn_fail(c, CT_ERR_PEER, true, "refused a write (%s)", uv_strerror(rc));
        return CT_ERR_PEER;
    }
    atomic_fetch_add_explicit(&tp->sent, m->len, memory_order_relaxed);
    return CT_OK;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    tcp_conn *c = h->data;
    size_t left = c->rd.in_payload ? c->rd.m.len - c->rd.got : 0;
    if (c->rd.in_payload && !c->rd.drop && left >= DIRECT_MIN)
        *buf = uv_buf_init((char *)c->rd.dest + c->rd.got, (unsigned)left);
    else
        *buf = uv_buf_init((char *)c->tp->stage, STAGE_BYTES);
}

/* The payload (or a header without one) is complete. */
static void message_done(tcp_conn *c) { cti_msg_reader_done(&c->rd, &c->tp->h, c->peer); }

/* A whole header is in c->rd.hdr: ask where its payload goes. false: stop reading. */
static bool header_done(tcp_conn *c)
{
    char why[160];
    int rc = cti_msg_reader_header(&c->rd, &c->tp->h, c->peer, why, sizeof why);
    if (rc == -1) conn_fail(c, CT_ERR_FORMAT, true, "sent a malformed frame: %s", why);
    if (rc == -2) conn_fail(c, CT_ERR_FORMAT, false, "closed by the handler");
    return !rc && !c->closing;
}

/* Consumes n staged bytes: headers, small payloads, the start of large ones. */
static void consume(tcp_conn *c, const uint8_t *p, size_t n)
{
    while (n && !c->closing) {
        if (!c->rd.in_payload) {
            size_t k = CT_MSG_HEADER - c->rd.hdr_got < n ? CT_MSG_HEADER - c->rd.hdr_got : n;
            memcpy(c->rd.hdr + c->rd.hdr_got, p, k);
            c->rd.hdr_got += k;
            p += k;
            n -= k;
            if (c->rd.hdr_got == CT_MSG_HEADER && !header_done(c)) return;
        } else {
            size_t k = c->rd.m.len - c->rd.got < n ? c->rd.m.len - c->rd.got : n;
            if (!c->rd.drop) memcpy(c->rd.dest + c->rd.got, p, k);
            c->rd.got += k;
            p += k;
            n -= k;
            if (c->rd.got == c->rd.m.len) message_done(c);
        }
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    tcp_conn *c = s->data;
    if (c->closing) return;
    if (nread < 0) {
        const char *where = c->rd.in_payload ? " in the middle of a message" : "";
        if (nread == UV_EOF)
            conn_fail(c, CT_ERR_PEER, true, "closed its connection%s: did the process exit or crash?", where);
        else
            conn_fail(c, CT_ERR_PEER, true, "lost its connection%s (%s): did the process exit or crash?", where,
                      uv_strerror((int)nread));
        return;
    }
    if ((uint8_t *)buf->base == c->tp->stage) {
        consume(c, c->tp->stage, (size_t)nread);
    } else {
        c->rd.got += (size_t)nread;
        if (c->rd.got == c->rd.m.len) message_done(c);
    }
}

static ct_status tcp_start(ct_transport *t, uv_loop_t *loop, const ct_transport_handler *h)
{
    tcp_tp *tp = (tcp_tp *)t;
    tp->h = *h;
    for (int p = 0; p < t->size; p++) {
        tcp_conn *c = &tp->conns[p];
        c->tp = tp;
        c->peer = p;
        if (p == t->rank || tp->fds[p] < 0) {
            c->closing = true; /* not a peer of this transport */
            continue;
        }
        int rc = uv_tcp_init(loop, &c->h);
        if (rc < 0) {
            /* never opened: the peer is lost to this rank */
            c->closing = true;
            close(tp->fds[p]);
            tp->fds[p] = -1;
            h->on_peer_error(h->ctx, p, CT_ERR_INTERNAL, "could not be attached to the comm loop (uv_tcp_init)");
            continue;
        }
        c->h.data = c;
        c->open = true;
        tp->open_handles++;
        rc = uv_tcp_open(&c->h, tp->fds[p]);
        if (rc < 0) {
            close(tp->fds[p]);
            tp->fds[p] = -1;
            conn_fail(c, CT_ERR_INTERNAL, true, "could not be attached to the comm loop (uv_tcp_open: %s)",
                      uv_strerror(rc));
            continue;
        }
        tp->fds[p] = -1; /* the handle owns it now */
        rc = uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read);
        if (rc < 0) conn_fail(c, CT_ERR_INTERNAL, true, "could not be read from (uv_read_start: %s)", uv_strerror(rc));
    }
    return CT_OK;
}

static void tcp_close(ct_transport *t, void (*closed)(ct_transport *t, void *arg), void *arg)
{
    tcp_tp *tp = (tcp_tp *)t;
    tp->closing = true;
    tp->closed = closed;
    tp->closed_arg = arg;
    for (int p = 0; p < t->size; p++)
        if (p != t->rank && tp->conns[p].open) conn_fail(&tp->conns[p], CT_ERR_PEER, false, "closing");
    if (tp->open_handles == 0) closed(t, arg);
}

static void tcp_free(ct_transport *t)
{
    tcp_tp *tp = (tcp_tp *)t;
    if (!tp) return;
    for (int p = 0; p < t->size; p++)
        if (tp->fds[p] >= 0) close(tp->fds[p]);
    free(tp->fds);
    free(tp->conns);
    free(tp->stage);
    cti_transport_base_free(t);
    free(tp);
}

static void tcp_stats(const ct_transport *t, ct_link_count *out)
{
    tcp_tp *tp = (tcp_tp *)t;
    out->peers[CT_LINK_TCP] += tp->npeers;
    out->bytes[CT_LINK_TCP] += atomic_load_explicit(&tp->sent, memory_order_relaxed);
}

static const ct_transport_ops tcp_ops = {.name = "tcp",
                                         .start = tcp_start,
                                         .send = tcp_send_msg,
                                         .close = tcp_close,
                                         .free = tcp_free,
                                         .stats = tcp_stats};

ct_transport *cti_tcp_transport_wrap(int rank, int size, int *fds)
{
    tcp_tp *tp = calloc(1, sizeof *tp);
    if (tp) {
        tp->conns = calloc((size_t)size, sizeof *tp->conns);
        tp->stage = malloc(STAGE_BYTES);
    }
    if (!tp || !tp->conns || !tp->stage) {
        if (tp) {
            free(tp->conns);
            free(tp);
        }
        for (int p = 0; p < size; p++)
            if (fds[p] >= 0) close(fds[p]);
        free(fds);
        ct_error_set(CT_ERR_NOMEM, "tcp: out of memory setting up the transport for %d ranks", size);
        return NULL;
    }
    tp->fds = fds;
    for (int p = 0; p < size; p++) tp->npeers += p != rank && fds[p] >= 0;
    tp->base.ops = &tcp_ops;
    tp->base.rank = rank;
    tp->base.size = size;
    return &tp->base;
}
