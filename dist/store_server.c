/* The store's server: one libuv loop on a thread of its own, a hash table of keys,
 * and one connection state per client. The wire format is in dist/store_internal.h.
 *
 * Only the loop thread touches the table (dist/store_table.c) and the connections; the owning thread
 * talks to it through nothing but uv_async_send (stop) and uv_thread_join.
 *
 * A connection's unparsed bytes sit in c->buf[off, len). A client sends one request
 * at a time, so frames are handled in order and a get or wait on a missing key
 * "parks" the connection: its frame stays in the buffer, unconsumed, until a set
 * answers it or its timer fires; frames after it wait. Reading goes on while
 * parked so that a client that hangs up is noticed at once and its request dropped.
 * Anything that is not a well-formed frame closes that connection only.
 *
 * Admission. A connection's first frame must be a HELLO with the server's token;
 * until then nothing else is parsed. A stranger (bytes that are not a HELLO, a wrong
 * token) is logged with its address on stderr and closed, after an ERROR reply when
 * it spoke the protocol, so that a rank of another job learns why.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/error.h"
#include "dist/loop_thread_internal.h"
#include "dist/store_internal.h"

#define READ_CHUNK (64 * 1024)
/* a client that does not read its replies is dropped rather than buffered forever */
#define WRITE_QUEUE_LIMIT ((size_t)2 * CT_STORE_MAX_VALUE)
/* how long a stopping server keeps answering clients that have not hung up yet */
#define CT_STORE_DRAIN_MS 1000

/* ---- connections ------------------------------------------------------------ */

typedef struct span {
    uint32_t off, len; /* relative to the frame's body */
} span;

typedef struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the parked request's timeout */
    ct_store_server *srv;
    struct conn *prev, *next; /* every open connection */
    struct conn *resume_next; /* unparked, with frames possibly waiting behind */
    bool queued, closing;
    bool refused; /* a stranger (store.h, Tokens): its bytes are ignored until the connection closes */
    bool admitted; /* presented the token */
    int open_handles;
    uv_shutdown_t shutdown; /* a refused stranger: closed once the ERROR reply is sent */
    char peer[80];          /* "ip:port", for the log */

    uint8_t *buf;
    size_t off, len, cap;

    /* the frame being handled (the parked one while parked) */
    bool parked;
    uint8_t op;
    uint16_t nkeys, next_missing; /* keys before next_missing are known to exist */
    size_t frame_len;
    span *keys;
    size_t keys_cap;
} conn;

struct ct_store_server {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop;
    uv_timer_t drain; /* bounds how long a stopping server waits for its clients to hang up */
    bool draining;
    uv_thread_t thread;
    ct_store_table kv;
    conn *conns;
    conn *resume;
    int port;
    char token[CT_STORE_MAX_TOKEN + 1];
};

typedef struct wreq {
    uv_write_t req;
    size_t len;
    uint8_t data[]; /* header + body */
} wreq;

static const uint8_t *frame_body(const conn *c) { return c->buf + c->off + CT_WIRE_HEADER; }

static void on_handle_closed(uv_handle_t *h)
{
    conn *c = h->data;
    if (--c->open_handles) return;
    free(c->buf);
    free(c->keys);
    free(c);
}

static void conn_close(conn *c)
{
    if (c->closing) return;
    c->closing = true;
    if (c->prev) c->prev->next = c->next;
    else c->srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    /* closing the timer drops a parked request with it */
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    if (c->srv->draining && !c->srv->conns) uv_close((uv_handle_t *)&c->srv->drain, NULL);
}

static void on_write(uv_write_t *req, int status)
{
    wreq *w = (wreq *)req;
    /* ECANCELED: the connection is closing and may be gone */
    if (status < 0 && status != UV_ECANCELED) conn_close(req->handle->data);
    free(w);
}

static wreq *reply_new(uint8_t status, size_t body_len)
{
    wreq *w = malloc(sizeof *w + CT_WIRE_HEADER + body_len);
    if (!w) return NULL;
    w->len = CT_WIRE_HEADER + body_len;
    cti_wire_header(w->data, status, 0, (uint32_t)body_len);
    return w;
}

static void reply_send(conn *c, wreq *w)
{
    if (!w || c->closing) {
        free(w);
        conn_close(c);
        return;
    }
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > WRITE_QUEUE_LIMIT ||
        uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write) < 0) {
        free(w);
        conn_close(c);
    }
}

static void reply_bytes(conn *c, uint8_t status, const void *body, size_t n)
{
    wreq *w = reply_new(status, n);
    if (w && n) memcpy(w->data + CT_WIRE_HEADER, body, n);
    reply_send(c, w);
}

static void reply_error(conn *c, const char *fmt, const uint8_t *key, uint32_t klen)
{
    char msg[CT_STORE_MAX_KEY + 256];
    int n = snprintf(msg, sizeof msg, fmt, (int)klen, (const char *)key);
    reply_bytes(c, CT_WIRE_ERROR, msg, n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
}

/* ---- admission ----------------------------------------------------------------- */

static void on_shutdown(uv_shutdown_t *req, int status)
{
    (void)status;
    conn_close(req->data);
}

/* A stranger: one line on stderr, an ERROR reply when reply is set, then the
 * connection is closed (after the reply is flushed); its further bytes are ignored. */
static void refuse(conn *c, const char *why, const char *reply)
{
    fprintf(stderr, "ctrain: store on port %d: refused a connection from %s: %s\n", c->srv->port, c->peer, why);
    c->refused = true;
    c->off = c->len;
    if (reply) reply_bytes(c, CT_WIRE_ERROR, reply, strlen(reply));
    if (c->closing) return;
    c->shutdown.data = c;
    if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown) < 0) conn_close(c);
}

/* The whole HELLO is in the buffer: admit the connection or refuse it. */
static void hello(conn *c, uint32_t body_len)
{
    if (!cti_token_equal(frame_body(c), body_len, c->srv->token)) {
        char msg[256];
        snprintf(msg, sizeof msg, "store: the master at port %d refused this rank's token (%s); is it another job's "
                 "store? CTRAIN_STORE_TOKEN must be the same on every rank", c->srv->port,
                 c->srv->token[0] ? (body_len ? "wrong token" : "no token given") : "this store takes no token");
        refuse(c, body_len ? "wrong token" : "no token", msg);
        return;
    }
    c->admitted = true;
    c->off += CT_WIRE_HEADER + (size_t)body_len;
    reply_bytes(c, CT_WIRE_OK, NULL, 0);
}

/* ---- requests ----------------------------------------------------------------- */

static void process(conn *c);

/* Frame handled: drop it from the buffer and let the frames behind it run. */
static void frame_done(conn *c)
{
    c->off += c->frame_len;
    if (c->parked) {
        c->parked = false;
        if (!c->queued) {
            c->queued = true;
            c->resume_next = c->srv->resume;
            c->srv->resume = c;
        }
    }
}

static void drain(ct_store_server *srv)
{
    while (srv->resume) {
        conn *c = srv->resume;
        srv->resume = c->resume_next;
        c->queued = false;
        process(c);
    }
}

/* Whether every key of the current frame exists (advances next_missing). */
static bool keys_present(conn *c)
{
    const uint8_t *body = frame_body(c);
    while (c->next_missing < c->nkeys) {
        span k = c->keys[c->next_missing];
        if (!cti_store_table_find(&c->srv->kv, body + k.off, k.len)) return false;
        c->next_missing++;
    }
    return true;
}

/* The current get or wait is satisfied: answer it. */
static void answer(conn *c)
{
    if (c->op == CT_WIRE_GET) {
        const ct_store_entry *e = cti_store_table_find(&c->srv->kv, frame_body(c) + c->keys[0].off, c->keys[0].len);
        reply_bytes(c, CT_WIRE_OK, e->val, e->vlen);
    } else {
        reply_bytes(c, CT_WIRE_OK, NULL, 0);
    }
    frame_done(c);
}

/* A key was set: answer the parked requests it completes. */
static void wake_waiters(ct_store_server *srv)
{
    for (conn *c = srv->conns; c; c = c->next) {
        if (!c->parked || !keys_present(c)) continue;
        uv_timer_stop(&c->timer);
        answer(c);
    }
}

static void on_timeout(uv_timer_t *t)
{
    conn *c = t->data;
    if (!c->parked || c->closing) return;
    wreq *w;
    if (c->op == CT_WIRE_WAIT) {
        /* the indices of the keys still missing, for the caller's message */
        w = reply_new(CT_WIRE_TIMEOUT, 4u * c->nkeys);
        if (w) {
            uint32_t n = 0;
            const uint8_t *body = frame_body(c);
            for (uint32_t i = c->next_missing; i < c->nkeys; i++)
                if (!cti_store_table_find(&c->srv->kv, body + c->keys[i].off, c->keys[i].len))
                    cti_wire_put32(w->data + CT_WIRE_HEADER + 4 * n++, i);
            w->len = CT_WIRE_HEADER + 4u * n;
            cti_wire_put32(w->data + 8, 4u * n);
        }
    } else {
        w = reply_new(CT_WIRE_TIMEOUT, 0);
    }
    reply_send(c, w);
    frame_done(c);
    drain(c->srv);
}

static void op_set(conn *c, const uint8_t *key, uint32_t klen, const uint8_t *val, size_t vlen)
{
    uint8_t *copy = malloc(vlen ? vlen : 1);
    if (copy) memcpy(copy, val, vlen);
    if (!copy || !cti_store_table_put(&c->srv->kv, key, klen, copy, vlen)) {
        free(copy);
        reply_error(c, "store: the master ran out of memory storing a value under '%.*s'", key, klen);
        frame_done(c);
        return;
    }
    reply_bytes(c, CT_WIRE_OK, NULL, 0);
    frame_done(c);
    wake_waiters(c->srv);
}

static void op_add(conn *c, const uint8_t *key, uint32_t klen, int64_t delta)
{
    int64_t cur = 0;
    const ct_store_entry *e = cti_store_table_find(&c->srv->kv, key, klen);
    if (e) {
        char text[32], *end;
        bool ok = e->vlen > 0 && e->vlen < sizeof text;
        if (ok) {
            memcpy(text, e->val, e->vlen);
            text[e->vlen] = '\0';
            errno = 0;
            cur = strtoll(text, &end, 10);
            ok = !errno && *end == '\0' && (text[0] == '-' || (text[0] >= '0' && text[0] <= '9'));
        }
        if (!ok) {
            reply_error(c, "store: add: key '%.*s' holds a value that is not a decimal integer", key, klen);
            frame_done(c);
            return;
        }
    }
    int64_t sum;
    if (__builtin_add_overflow(cur, delta, &sum)) {
        reply_error(c, "store: add: the counter '%.*s' would overflow 64 bits", key, klen);
        frame_done(c);
        return;
    }
    char text[32];
    int n = snprintf(text, sizeof text, "%lld", (long long)sum);
    uint8_t *val = malloc((size_t)n);
    if (!val || !cti_store_table_put(&c->srv->kv, key, klen, val, (size_t)n)) {
        free(val);
        reply_error(c, "store: the master ran out of memory updating '%.*s'", key, klen);
        frame_done(c);
        return;
    }
    memcpy(val, text, (size_t)n);
    uint8_t out[8];
    cti_wire_put64(out, (uint64_t)sum);
    reply_bytes(c, CT_WIRE_OK, out, sizeof out);
    frame_done(c);
    wake_waiters(c->srv);
}

static void op_wait(conn *c, uint64_t timeout_ms)
{
    c->next_missing = 0;
    if (keys_present(c)) {
        answer(c);
        return;
    }
    c->parked = true;
    if (uv_timer_start(&c->timer, on_timeout, timeout_ms, 0) < 0) conn_close(c);
}

/* The whole frame is in the buffer; false when it is malformed. */
static bool handle_frame(conn *c, uint32_t body_len)
{
    const uint8_t *body = frame_body(c);
    if (c->keys_cap < c->nkeys) {
        span *k = realloc(c->keys, c->nkeys * sizeof *k);
        if (!k) return false;
        c->keys = k;
        c->keys_cap = c->nkeys;
    }
    uint32_t p = 0;
    for (unsigned i = 0; i < c->nkeys; i++) {
        if (body_len - p < 4) return false;
        uint32_t klen = cti_wire_get32(body + p);
        p += 4;
        if (klen == 0 || klen > CT_STORE_MAX_KEY || klen > body_len - p) return false;
        c->keys[i] = (span){p, klen};
        p += klen;
    }
    const uint8_t *val = body + p, *key = body + c->keys[0].off;
    size_t vlen = body_len - p;
    if (c->op != CT_WIRE_SET && vlen != 8) return false;
    switch (c->op) {
    case CT_WIRE_SET: op_set(c, key, c->keys[0].len, val, vlen); break;
    case CT_WIRE_ADD: op_add(c, key, c->keys[0].len, (int64_t)cti_wire_get64(val)); break;
    default: op_wait(c, cti_wire_get64(val)); break;
    }
    return true;
}

/* Handles the complete frames in the buffer, in order, until one parks. */
static void process(conn *c)
{
    while (!c->parked && !c->closing && !c->refused) {
        size_t avail = c->len - c->off;
        const uint8_t *h = c->buf + c->off;
        if (memcmp(h, CT_WIRE_MAGIC, avail < 4 ? avail : 4)) {
            if (c->admitted) conn_close(c); /* a rank's stream out of step: its own error tells */
            else refuse(c, "not a store client (bad magic bytes)", NULL);
            return;
        }
        if (avail < CT_WIRE_HEADER) break;
        if (h[4] != CT_WIRE_VERSION) {
            char msg[128], why[64];
            snprintf(msg, sizeof msg, "store: the master speaks protocol version %d, this client %d",
                     CT_WIRE_VERSION, h[4]);
            snprintf(why, sizeof why, "protocol version %d, not %d", h[4], CT_WIRE_VERSION);
            refuse(c, why, msg);
            return;
        }
        uint8_t op = h[5];
        uint16_t nkeys = cti_wire_get16(h + 6);
        uint32_t body_len = cti_wire_get32(h + 8);
        if (!c->admitted) {
            if (op != CT_WIRE_HELLO || nkeys != 0 || body_len > CT_STORE_MAX_TOKEN) {
                refuse(c, "a malformed handshake (the first frame is not a token)", NULL);
                return;
            }
            if (avail - CT_WIRE_HEADER < body_len) break;
            hello(c, body_len);
            continue;
        }
        bool ok = op >= CT_WIRE_SET && op <= CT_WIRE_WAIT && nkeys >= 1 &&
                  (op == CT_WIRE_WAIT ? nkeys <= CT_STORE_MAX_WAIT_KEYS : nkeys == 1) &&
                  body_len <= cti_wire_body_limit(nkeys);
        if (!ok) {
            conn_close(c);
            return;
        }
        if (avail - CT_WIRE_HEADER < body_len) break;
        c->op = op;
        c->nkeys = nkeys;
        c->frame_len = CT_WIRE_HEADER + (size_t)body_len;
        if (!handle_frame(c, body_len)) {
            conn_close(c);
            return;
        }
    }
}

/* ---- the loop's callbacks ------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn *c = h->data;
    if (c->off && !c->parked) {
        memmove(c->buf, c->buf + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    if (c->cap - c->len < READ_CHUNK) {
        size_t cap = c->cap * 2 > c->len + READ_CHUNK ? c->cap * 2 : c->len + READ_CHUNK;
        uint8_t *b = realloc(c->buf, cap);
        if (!b) {
            *buf = uv_buf_init(NULL, 0); /* read_cb gets UV_ENOBUFS */
            return;
        }
        c->buf = b;
        c->cap = cap;
    }
    *buf = uv_buf_init((char *)c->buf + c->len, READ_CHUNK);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    conn *c = s->data;
    if (nread < 0) {
        conn_close(c); /* hung up (EOF) or failed; a parked request goes with it */
        return;
    }
    c->len += (size_t)nread;
    if (c->refused) {
        c->off = c->len;
        return;
    }
    if (c->parked) {
        /* a client waits for its answer before sending more: at most one frame queued */
        if (c->len - c->off > c->frame_len + CT_WIRE_HEADER + cti_wire_body_limit(CT_STORE_MAX_WAIT_KEYS))
            conn_close(c);
        return;
    }
    process(c);
    drain(c->srv);
}

static void peer_name(conn *c)
{
    struct sockaddr_storage sa;
    int len = sizeof sa;
    char ip[48];
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len)) return;
    if (sa.ss_family == AF_INET6) {
        if (!uv_ip6_name((struct sockaddr_in6 *)&sa, ip, sizeof ip))
            snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, ntohs(((struct sockaddr_in6 *)&sa)->sin6_port));
    } else if (!uv_ip4_name((struct sockaddr_in *)&sa, ip, sizeof ip)) {
        snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(((struct sockaddr_in *)&sa)->sin_port));
    }
}

static void on_connection(uv_stream_t *listener, int status)
{
    ct_store_server *srv = listener->data;
    if (status < 0) return; /* a failed accept concerns that client only */
    /* without memory the connection cannot be taken: libuv holds it (and stops
     * accepting) rather than lose it, and the clients' connects time out */
    conn *c = calloc(1, sizeof *c);
    if (!c) return;
    c->srv = srv;
    if (uv_tcp_init(&srv->loop, &c->tcp) < 0) {
        free(c);
        return;
    }
    c->tcp.data = c;
    c->open_handles = 1;
    snprintf(c->peer, sizeof c->peer, "an unknown address");
    if (uv_timer_init(&srv->loop, &c->timer) < 0) {
        c->closing = true;
        uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
        return;
    }
    c->timer.data = c;
    c->open_handles = 2;
    c->next = srv->conns;
    if (srv->conns) srv->conns->prev = c;
    srv->conns = c;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) < 0 || uv_tcp_nodelay(&c->tcp, 1) < 0) {
        conn_close(c);
        return;
    }
    peer_name(c);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0) conn_close(c);
}

static void on_drain_timeout(uv_timer_t *t)
{
    ct_store_server *srv = t->data;
    /* the last conn_close closes the drain timer */
    while (srv->conns) conn_close(srv->conns);
}

/* Stopping does not cut clients off: after the last barrier of a job, rank 0 may
 * stop while a peer's request for that barrier's key is still on the wire, and
 * that peer would report a lost master. The server keeps answering until every
 * client has hung up (ct_store_free, or the process's exit), for at most
 * CT_STORE_DRAIN_MS; the listener closes at once, so nobody new joins. */
static void on_stop(uv_async_t *a)
{
    ct_store_server *srv = a->data;
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->stop, NULL);
    if (!srv->conns) {
        uv_close((uv_handle_t *)&srv->drain, NULL);
        return;
    }
    srv->draining = true;
    if (uv_timer_start(&srv->drain, on_drain_timeout, CT_STORE_DRAIN_MS, 0) < 0) on_drain_timeout(&srv->drain);
}

static void server_main(void *arg)
{
    ct_store_server *srv = arg;
    uv_run(&srv->loop, UV_RUN_DEFAULT);
}

/* ---- start and stop --------------------------------------------------------------- */

/* An IP address is bound as given; a host name means "this machine", and as name
 * resolution on the master often maps its own name to a loopback alias, every
 * interface is bound instead. */
static ct_status bind_addr(const char *host, int port, struct sockaddr_storage *sa)
{
    if (!host || !*host || !strcmp(host, "localhost")) host = "127.0.0.1";
    if (!uv_ip4_addr(host, port, (struct sockaddr_in *)sa) || !uv_ip6_addr(host, port, (struct sockaddr_in6 *)sa))
        return CT_OK;
    int rc = uv_ip4_addr("0.0.0.0", port, (struct sockaddr_in *)sa);
    if (rc) return ct_error_set(CT_ERR_INTERNAL, "store: uv_ip4_addr: %s", uv_strerror(rc));
    return CT_OK;
}

static void close_quietly(uv_loop_t *loop)
{
    uv_run(loop, UV_RUN_DEFAULT); /* runs the close callbacks */
    uv_loop_close(loop);
}

ct_store_server *cti_store_server_start(const char *host, int port, const char *token, int *bound_port)
{
    const char *shown = host && *host ? host : "127.0.0.1";
    struct sockaddr_storage sa;
    if (bind_addr(host, port, &sa)) return NULL;
    ct_store_server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        ct_error_set(CT_ERR_NOMEM, "store: out of memory starting the server");
        return NULL;
    }
    int rc = uv_loop_init(&srv->loop);
    if (rc) {
        ct_error_set(CT_ERR_INTERNAL, "store: uv_loop_init: %s", uv_strerror(rc));
        free(srv);
        return NULL;
    }
    const char *what = "uv_tcp_init";
    if ((rc = uv_tcp_init(&srv->loop, &srv->listener))) goto fail_loop;
    srv->listener.data = srv;
    what = "bind";
    if ((rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&sa, 0))) goto fail_listener;
    what = "listen";
    if ((rc = uv_listen((uv_stream_t *)&srv->listener, 1024, on_connection))) goto fail_listener;
    int len = sizeof sa;
    what = "getsockname";
    if ((rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&sa, &len))) goto fail_listener;
    *bound_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
    srv->port = *bound_port;
    snprintf(srv->token, sizeof srv->token, "%s", token);
    what = "uv_timer_init";
    if ((rc = uv_timer_init(&srv->loop, &srv->drain))) goto fail_listener;
    srv->drain.data = srv;
    what = "uv_async_init";
    if ((rc = uv_async_init(&srv->loop, &srv->stop, on_stop))) goto fail_timer;
    srv->stop.data = srv;
    /* a client that vanishes mid-reply must fail a write, not kill the process */
    if ((rc = cti_loop_thread_create(&srv->thread, server_main, srv, &what))) goto fail_async;
    return srv;

fail_async:
    uv_close((uv_handle_t *)&srv->stop, NULL);
fail_timer:
    uv_close((uv_handle_t *)&srv->drain, NULL);
fail_listener:
    uv_close((uv_handle_t *)&srv->listener, NULL);
fail_loop:
    close_quietly(&srv->loop);
    free(srv);
    if (rc == UV_EADDRINUSE)
        ct_error_set(CT_ERR_IO,
                     "store: cannot serve on %s:%d: the port is in use (another job?); choose another MASTER_PORT, "
                     "or 0 for any free port",
                     shown, port);
    else if (rc == UV_EADDRNOTAVAIL)
        ct_error_set(CT_ERR_IO, "store: cannot serve on %s:%d: the address is not one of this machine's; set "
                                "MASTER_ADDR to rank 0's host", shown, port);
    else
        ct_error_set(CT_ERR_IO, "store: cannot serve on %s:%d: %s: %s", shown, port, what, uv_strerror(rc));
    return NULL;
}

void cti_store_server_stop(ct_store_server *srv)
{
    if (!srv) return;
    /* uv_async_send only fails on a handle that is not an async one */
    CT_ASSERT(uv_async_send(&srv->stop) == 0);
    uv_thread_join(&srv->thread);
    /* every handle was closed by on_stop and the loop has run their callbacks */
    CT_ASSERT(uv_loop_close(&srv->loop) == 0);
    cti_store_table_free(&srv->kv);
    free(srv);
}
