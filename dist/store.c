/* The store's client side and public API: one TCP connection per handle, blocking
 * request/reply under the handle's mutex, poll() for every deadline. The server is
 * in dist/store_server.c, the wire format in dist/store_internal.h.
 *
 * Deadlines. Connecting retries until timeout_s. A set or add waits up to timeout_s
 * for its reply. A get or wait sends its own timeout to the server, which answers
 * "timeout" when it expires; the client waits that long plus REPLY_GRACE_S, and
 * only a server that stays silent past it is reported as not answering.
 */
#include "dist/store.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "dist/env.h"
#include "dist/poll_internal.h"
#include "dist/store_internal.h"

#define REPLY_GRACE_S 5.0
#define LIST_MAX 16 /* missing keys or ranks named in a message */

typedef struct barrier_gen {
    char *name;
    uint64_t count; /* barriers of this name this handle has entered */
} barrier_gen;

struct ct_store {
    char host[256];
    char server[128]; /* "" = the master (rank 0); else ct_store_config.server */
    int port;
    int world_size, rank;
    double timeout_s;
    ct_store_server *srv; /* the serving handle's server, else NULL */
    char token[CT_STORE_MAX_TOKEN + 1];

    uv_mutex_t mu; /* guards everything below */
    int fd;
    ct_status broken; /* once the connection failed, every call repeats its error */
    char broken_msg[1024];
    barrier_gen *gens;
    int ngens;
};


static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

static double effective_timeout(const ct_store *s, double t) { return t > 0 ? t : s->timeout_s; }

/* Who serves the store, as errors name it. */
static const char *server_name(const ct_store *s)
{
    return s->server[0] ? s->server : "the master";
}



/* ---- connecting ------------------------------------------------------------------ */

/* One attempt at one address; the fd or -1 with the reason in why. */
static int try_connect(const struct addrinfo *ai, double deadline, char *why, size_t cap)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, cap, "socket: %s", strerror(errno));
        return -1;
    }
    int err = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            err = errno;
        } else {
            int r = cti_dist_wait_fd(fd, POLLOUT, deadline);
            socklen_t len = sizeof err;
            if (r == 0) err = ETIMEDOUT;
            else if (r < 0) err = errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
        }
    }
    int one = 1;
    if (!err && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) err = errno;
    if (err) {
        snprintf(why, cap, "%s", strerror(err));
        close(fd);
        return -1;
    }
    return fd;
}

static ct_status store_hello(ct_store *s, double deadline, char *why, size_t cap, bool *refused);

/* Ranks start in any order: refused or unreachable attempts are retried, with
 * backoff, until the timeout; so is a store that refuses the token, which may be a
 * previous job's still holding the port. */
static ct_status store_connect(ct_store *s)
{
    double start = cti_dist_now(), deadline = start + s->timeout_s, backoff = 0.01;
    char port[8], why[1024] = "no attempt", refusal[1024] = "";
    snprintf(port, sizeof port, "%d", s->port);
    for (;;) {
        bool refused = false;
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
        int rc = getaddrinfo(s->host, port, &hints, &res);
        if (rc) {
            snprintf(why, sizeof why, "cannot resolve the host: %s", gai_strerror(rc));
        } else {
            for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                s->fd = try_connect(ai, deadline, why, sizeof why);
                if (s->fd >= 0) break;
            }
            freeaddrinfo(res);
            if (s->fd >= 0) {
                /* a lost connection or a refusal may pass (a previous job's store going
                 * away); another service's bytes will not */
                ct_status st = store_hello(s, deadline, why, sizeof why, &refused);
                if (!st) return CT_OK;
                if (refused) snprintf(refusal, sizeof refusal, "%s", why);
                if (st != CT_ERR_PEER && st != CT_ERR_TIMEOUT) return ct_error_set(st, "%s", why);
            }
        }
        double left = deadline - cti_dist_now();
        if (left <= 0 && refusal[0])
            return ct_error_set(CT_ERR_PEER, "store: %s at %s:%d refused this %s for %g s: %s", server_name(s),
                                s->host, s->port, s->server[0] ? "client" : "rank", s->timeout_s, refusal);
        if (left <= 0 && s->server[0])
            return ct_error_set(CT_ERR_TIMEOUT,
                                "store: cannot reach %s at %s:%d within %g s (last attempt: %s); check that it is "
                                "running and the address and port",
                                s->server, s->host, s->port, s->timeout_s, why);
        if (left <= 0)
            return ct_error_set(CT_ERR_TIMEOUT,
                                "store: cannot reach the master at %s:%d within %g s (last attempt: %s); check "
                                "MASTER_ADDR/MASTER_PORT and that rank 0 is running, or set CTRAIN_TIMEOUT to wait "
                                "longer",
                                s->host, s->port, s->timeout_s, why);
        sleep_s(backoff < left ? backoff : left);
        backoff = backoff * 2 < 0.5 ? backoff * 2 : 0.5;
    }
}

/* ---- one request, one reply --------------------------------------------------------- */

/* Marks the handle broken (the stream is no longer in step) and records why. */
static ct_status break_handle(ct_store *s, ct_status st, const char *fmt, const char *detail)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    char what[256];
    snprintf(what, sizeof what, fmt, detail);
    const char *who = server_name(s);
    if (st == CT_ERR_TIMEOUT)
        snprintf(s->broken_msg, sizeof s->broken_msg,
                 "store: %s at %s:%d did not answer in time (%s); it may be stopped or overloaded; set "
                 "CTRAIN_TIMEOUT to wait longer",
                 who, s->host, s->port, what);
    else if (st == CT_ERR_PEER)
        snprintf(s->broken_msg, sizeof s->broken_msg,
                 "store: lost the connection to %s at %s:%d (%s); %s may have exited: see its output", who, s->host,
                 s->port, what, s->server[0] ? "it" : "rank 0");
    else if (st == CT_ERR_NOMEM)
        snprintf(s->broken_msg, sizeof s->broken_msg, "store: out of memory reading a reply from %s at %s:%d (%s)",
                 who, s->host, s->port, what);
    else
        snprintf(s->broken_msg, sizeof s->broken_msg, "store: %s at %s:%d sent %s; is %s another service's port?",
                 who, s->host, s->port, what, s->server[0] ? "the port" : "MASTER_PORT");
    s->broken = st;
    return ct_error_set(st, "%s", s->broken_msg);
}

static ct_status send_all(ct_store *s, struct iovec *iov, int n, double deadline)
{
    while (n > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(s->fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return break_handle(s, CT_ERR_PEER, "sending: %s", strerror(errno));
            int r = cti_dist_wait_fd(s->fd, POLLOUT, deadline);
            if (r == 0) return break_handle(s, CT_ERR_TIMEOUT, "%s", "a request could not be sent");
            if (r < 0) return break_handle(s, CT_ERR_PEER, "poll: %s", strerror(errno));
            continue;
        }
        size_t left = (size_t)w;
        for (; n > 0 && left >= iov->iov_len; n--, iov++) left -= iov->iov_len;
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return CT_OK;
}

static ct_status recv_all(ct_store *s, uint8_t *buf, size_t n, double deadline)
{
    while (n > 0) {
        ssize_t r = recv(s->fd, buf, n, 0);
        if (r > 0) {
            buf += r;
            n -= (size_t)r;
        } else if (r == 0) {
            return break_handle(s, CT_ERR_PEER, "%s", "it closed the connection");
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = cti_dist_wait_fd(s->fd, POLLIN, deadline);
            if (w == 0) return break_handle(s, CT_ERR_TIMEOUT, "%s", "no reply");
            if (w < 0) return break_handle(s, CT_ERR_PEER, "poll: %s", strerror(errno));
        } else if (errno != EINTR) {
            return break_handle(s, CT_ERR_PEER, "receiving: %s", strerror(errno));
        }
    }
    return CT_OK;
}

typedef struct reply {
    uint8_t status;
    uint8_t *body; /* malloc'd, NUL-terminated; owned by the caller */
    size_t len;
} reply;

static ct_status roundtrip_until(ct_store *s, uint8_t op, const char *const *keys, int nkeys, const void *val,
                                 size_t vlen, double deadline, reply *out);

/* Sends one request and reads its reply. wait_s >= 0: a get or wait the server may
 * hold for wait_s. The caller holds s->mu. */
static ct_status roundtrip(ct_store *s, uint8_t op, const char *const *keys, int nkeys, const void *val,
                           size_t vlen, double wait_s, reply *out)
{
    double deadline = cti_dist_now() + (wait_s >= 0 ? wait_s + REPLY_GRACE_S : s->timeout_s);
    return roundtrip_until(s, op, keys, nkeys, val, vlen, deadline, out);
}

/* Presents the token on the fresh connection s->fd. On failure the fd is closed,
 * why says what happened, and *refused tells a refusal from a broken connection. */
static ct_status store_hello(ct_store *s, double deadline, char *why, size_t cap, bool *refused)
{
    reply r = {0};
    ct_status st = roundtrip_until(s, CT_WIRE_HELLO, NULL, 0, s->token, strlen(s->token), deadline, &r);
    if (st) {
        /* a connection that broke during the handshake is retried like a refused connect */
        snprintf(why, cap, "%s", ct_last_error());
        s->broken = CT_OK;
        if (s->fd >= 0) close(s->fd);
        s->fd = -1;
        return st;
    }
    if (r.status == CT_WIRE_OK) {
        free(r.body);
        return CT_OK;
    }
    *refused = true;
    snprintf(why, cap, "%s", r.status == CT_WIRE_ERROR ? (const char *)r.body : "a malformed reply to the token");
    free(r.body);
    close(s->fd);
    s->fd = -1;
    return CT_ERR_PEER;
}

static ct_status roundtrip_until(ct_store *s, uint8_t op, const char *const *keys, int nkeys, const void *val,
                                 size_t vlen, double deadline, reply *out)
{
    if (s->broken) return ct_error_set(s->broken, "%s", s->broken_msg);
    size_t head = CT_WIRE_HEADER;
    for (int i = 0; i < nkeys; i++) head += 4 + strlen(keys[i]);
    uint8_t *h = malloc(head);
    if (!h) return ct_error_set(CT_ERR_NOMEM, "store: out of memory building a request of %zu bytes", head);
    cti_wire_header(h, op, (uint16_t)nkeys, (uint32_t)(head - CT_WIRE_HEADER + vlen));
    uint8_t *p = h + CT_WIRE_HEADER;
    for (int i = 0; i < nkeys; i++) {
        size_t k = strlen(keys[i]);
        cti_wire_put32(p, (uint32_t)k);
        memcpy(p + 4, keys[i], k);
        p += 4 + k;
    }
    struct iovec iov[2] = {{h, head}, {(void *)val, vlen}};
    ct_status st = send_all(s, iov, vlen ? 2 : 1, deadline);
    free(h);
    if (st) return st;

    uint8_t rh[CT_WIRE_HEADER];
    if ((st = recv_all(s, rh, sizeof rh, deadline))) return st;
    if (memcmp(rh, CT_WIRE_MAGIC, 4)) return break_handle(s, CT_ERR_FORMAT, "%s", "a reply that is not a store frame");
    if (rh[4] != CT_WIRE_VERSION) return break_handle(s, CT_ERR_FORMAT, "%s", "a reply of another protocol version");
    uint32_t len = cti_wire_get32(rh + 8);
    if (rh[5] > CT_WIRE_ERROR || len > CT_WIRE_REPLY_LIMIT)
        return break_handle(s, CT_ERR_FORMAT, "%s", "a malformed reply header");
    out->status = rh[5];
    out->len = len;
    out->body = malloc((size_t)len + 1);
    if (!out->body) {
        return break_handle(s, CT_ERR_NOMEM, "%s", "the reply cannot be skipped without reading it");
    }
    if ((st = recv_all(s, out->body, len, deadline))) {
        free(out->body);
        return st;
    }
    out->body[len] = '\0';
    return CT_OK;
}

static ct_status request(ct_store *s, uint8_t op, const char *const *keys, int nkeys, const void *val, size_t vlen,
                         double wait_s, reply *out)
{
    uv_mutex_lock(&s->mu);
    ct_status st = roundtrip(s, op, keys, nkeys, val, vlen, wait_s, out);
    uv_mutex_unlock(&s->mu);
    if (!st && out->status == CT_WIRE_ERROR) {
        ct_error_set(CT_ERR_INVALID, "%s", (const char *)out->body);
        free(out->body);
        return CT_ERR_INVALID;
    }
    return st;
}

/* ---- the API ------------------------------------------------------------------- */

static ct_status check_key(const char *op, const char *key)
{
    if (!key) return ct_error_set(CT_ERR_INVALID, "store %s: key is NULL", op);
    size_t n = strlen(key);
    if (n == 0 || n > CT_STORE_MAX_KEY)
        return ct_error_set(CT_ERR_INVALID, "store %s: a key of %zu bytes; keys are 1..%d bytes", op, n,
                            CT_STORE_MAX_KEY);
    return CT_OK;
}

static uint64_t wire_ms(double t)
{
    double ms = ceil(t * 1e3);
    return ms > 1e15 ? (uint64_t)1e15 : (uint64_t)ms;
}

static ct_status check_job(ct_store *s, const char *job);

ct_store *ct_store_new(const ct_store_config *cfg)
{
    if (!cfg) {
        ct_error_set(CT_ERR_INVALID, "ct_store_new: cfg is NULL");
        return NULL;
    }
    const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    int world = cfg->world_size ? cfg->world_size : 1;
    if (strlen(host) >= sizeof ((ct_store *)0)->host || cfg->port < 0 || cfg->port > 65535 ||
        (cfg->port == 0 && !cfg->serve) || world < 1 || cfg->rank < 0 || cfg->rank >= world) {
        ct_error_set(CT_ERR_INVALID,
                     "ct_store_new: bad config (host '%.64s', port %d, serve %d, rank %d of %d): hosts are under "
                     "256 characters, ports 0..65535 (0 only when serving), 0 <= rank < world_size",
                     host, cfg->port, cfg->serve, cfg->rank, world);
        return NULL;
    }
    ct_store *s = calloc(1, sizeof *s);
    if (!s) {
        ct_error_set(CT_ERR_NOMEM, "ct_store_new: out of memory");
        return NULL;
    }
    snprintf(s->host, sizeof s->host, "%s", host);
    if (cfg->server) snprintf(s->server, sizeof s->server, "%s", cfg->server);
    s->port = cfg->port;
    s->world_size = world;
    s->rank = cfg->rank;
    s->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : CT_STORE_DEFAULT_TIMEOUT_S;
    s->fd = -1;
    const char *token = cfg->token ? cfg->token : ct_dist_store_token();
    if (strlen(token) > CT_STORE_MAX_TOKEN) {
        ct_error_set(CT_ERR_INVALID, "ct_store_new: the store token (CTRAIN_STORE_TOKEN) is %zu bytes; at most %d",
                     strlen(token), CT_STORE_MAX_TOKEN);
        free(s);
        return NULL;
    }
    snprintf(s->token, sizeof s->token, "%s", token);
    if (uv_mutex_init(&s->mu)) {
        ct_error_set(CT_ERR_INTERNAL, "ct_store_new: uv_mutex_init failed");
        free(s);
        return NULL;
    }
    if (cfg->serve && !(s->srv = cti_store_server_start(cfg->host, cfg->port, s->token, &s->port))) {
        uv_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    if (store_connect(s)) {
        cti_store_server_stop(s->srv);
        uv_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    if (check_job(s, cfg->job ? cfg->job : ct_dist_job_id())) {
        ct_store_free(s);
        return NULL;
    }
    return s;
}

int ct_store_port(const ct_store *s) { return s ? s->port : -1; }

const char *cti_store_token(const ct_store *s) { return s->token; }

/* The serving handle records the job's id; every handle checks it (see store.h). */
static ct_status check_job(ct_store *s, const char *job)
{
    if (strlen(job) > 200) return ct_error_set(CT_ERR_INVALID, "ct_store_new: job id '%.40s...' is longer than 200 bytes", job);
    if (s->srv && ct_store_set(s, "ct/job", job, strlen(job))) return ct_last_status();
    void *val = NULL;
    size_t n = 0;
    ct_status st = ct_store_get(s, "ct/job", s->timeout_s, &val, &n);
    if (st) {
        ct_error_prefix("ct_store_new: reading the job id from the store at %s:%d: ", s->host, s->port);
    } else if ((*job || n) && (n != strlen(job) || memcmp(val, job, n))) {
        st = ct_error_set(CT_ERR_PEER,
                          "ct_store_new: the store at %s:%d belongs to another job (job '%s'; this rank's job is "
                          "'%s'): two jobs share MASTER_ADDR:MASTER_PORT; give each its own port (0 picks a free "
                          "one with ctrain launch)",
                          s->host, s->port, n ? (const char *)val : "", job);
    }
    free(val);
    return st;
}

ct_status ct_store_set(ct_store *s, const char *key, const void *val, size_t n)
{
    if (!s) return ct_error_set(CT_ERR_INVALID, "store set: the store is NULL");
    if (check_key("set", key)) return CT_ERR_INVALID;
    if (n > CT_STORE_MAX_VALUE || (!val && n))
        return ct_error_set(CT_ERR_INVALID, "store set '%s': a value of %zu bytes%s; values are at most %u bytes", key,
                            n, val ? "" : " at NULL", CT_STORE_MAX_VALUE);
    reply r = {0};
    ct_status st = request(s, CT_WIRE_SET, &key, 1, val, n, -1, &r);
    if (st) return ct_error_prefix("store set '%s': ", key);
    free(r.body);
    return CT_OK;
}

ct_status ct_store_get(ct_store *s, const char *key, double timeout_s, void **val, size_t *n)
{
    if (!s || !val || !n) return ct_error_set(CT_ERR_INVALID, "store get: the store, val or n is NULL");
    if (check_key("get", key)) return CT_ERR_INVALID;
    double t = effective_timeout(s, timeout_s);
    uint8_t ms[8];
    cti_wire_put64(ms, wire_ms(t));
    reply r = {0};
    ct_status st = request(s, CT_WIRE_GET, &key, 1, ms, sizeof ms, t, &r);
    if (st) return ct_error_prefix("store get '%s': ", key);
    if (r.status == CT_WIRE_TIMEOUT) {
        free(r.body);
        return ct_error_set(CT_ERR_TIMEOUT,
                            "store get '%s': the key was not set within %g s; is the rank that sets it running? set "
                            "CTRAIN_TIMEOUT to wait longer",
                            key, t);
    }
    *val = r.body;
    *n = r.len;
    return CT_OK;
}

ct_status ct_store_add(ct_store *s, const char *key, int64_t delta, int64_t *result)
{
    if (!s) return ct_error_set(CT_ERR_INVALID, "store add: the store is NULL");
    if (check_key("add", key)) return CT_ERR_INVALID;
    uint8_t d[8];
    cti_wire_put64(d, (uint64_t)delta);
    reply r = {0};
    ct_status st = request(s, CT_WIRE_ADD, &key, 1, d, sizeof d, -1, &r);
    if (st) return ct_error_prefix("store add '%s': ", key);
    bool ok = r.status == CT_WIRE_OK && r.len == 8;
    if (ok && result) *result = (int64_t)cti_wire_get64(r.body);
    free(r.body);
    if (!ok) return ct_error_set(CT_ERR_FORMAT, "store add '%s': the master sent a malformed reply", key);
    return CT_OK;
}

/* "'a', 'b' and 3 more" into buf */
static void list_keys(char *buf, size_t cap, const char *const *keys, const uint32_t *idx, uint32_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n && i < LIST_MAX && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s'%.100s'", i ? ", " : "", keys[idx[i]]);
    if (n > LIST_MAX && used < cap) snprintf(buf + used, cap - used, " and %u more", n - LIST_MAX);
}

/* Waits for keys; on a timeout *missing (malloc'd) holds the indices still missing. */
static ct_status wait_keys(ct_store *s, const char *const *keys, int nkeys, double t, uint32_t **missing,
                           uint32_t *nmissing)
{
    uint8_t ms[8];
    cti_wire_put64(ms, wire_ms(t));
    reply r = {0};
    ct_status st = request(s, CT_WIRE_WAIT, keys, nkeys, ms, sizeof ms, t, &r);
    if (st) return st;
    *missing = NULL;
    *nmissing = 0;
    if (r.status == CT_WIRE_OK) {
        free(r.body);
        return CT_OK;
    }
    uint32_t n = (uint32_t)(r.len / 4);
    uint32_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx) {
        free(r.body);
        return ct_error_set(CT_ERR_NOMEM, "store wait: out of memory");
    }
    for (uint32_t i = 0; i < n; i++) {
        idx[i] = cti_wire_get32(r.body + 4 * i);
        if (idx[i] >= (uint32_t)nkeys) {
            free(idx);
            free(r.body);
            return ct_error_set(CT_ERR_FORMAT, "store wait: the master sent a malformed reply");
        }
    }
    free(r.body);
    *missing = idx;
    *nmissing = n;
    return CT_ERR_TIMEOUT;
}

ct_status ct_store_wait(ct_store *s, const char *const *keys, int nkeys, double timeout_s)
{
    if (!s || (!keys && nkeys)) return ct_error_set(CT_ERR_INVALID, "store wait: the store or keys is NULL");
    if (nkeys < 0 || nkeys > CT_STORE_MAX_WAIT_KEYS)
        return ct_error_set(CT_ERR_INVALID, "store wait: %d keys; one wait takes 0..%d", nkeys, CT_STORE_MAX_WAIT_KEYS);
    if (nkeys == 0) return CT_OK;
    for (int i = 0; i < nkeys; i++)
        if (check_key("wait", keys[i])) return CT_ERR_INVALID;
    double t = effective_timeout(s, timeout_s);
    uint32_t *missing, n;
    ct_status st = wait_keys(s, keys, nkeys, t, &missing, &n);
    if (st != CT_ERR_TIMEOUT || !missing) return st ? ct_error_prefix("store wait: ") : CT_OK;
    char list[1024];
    list_keys(list, sizeof list, keys, missing, n);
    free(missing);
    return ct_error_set(CT_ERR_TIMEOUT, "store wait: %u of %d keys not set within %g s: %s; set CTRAIN_TIMEOUT to "
                                        "wait longer", n, nkeys, t, list);
}

/* How many barriers named name this handle entered before; counts this one. */
static ct_status barrier_enter(ct_store *s, const char *name, uint64_t *gen)
{
    ct_status st = CT_OK;
    uv_mutex_lock(&s->mu);
    int i = 0;
    while (i < s->ngens && strcmp(s->gens[i].name, name)) i++;
    if (i == s->ngens) {
        barrier_gen *g = realloc(s->gens, (size_t)(s->ngens + 1) * sizeof *g);
        char *copy = strdup(name);
        if (g) s->gens = g;
        if (!g || !copy) {
            free(copy);
            st = ct_error_set(CT_ERR_NOMEM, "store barrier '%s': out of memory", name);
            goto out;
        }
        s->gens[s->ngens++] = (barrier_gen){copy, 0};
    }
    *gen = s->gens[i].count++;
out:
    uv_mutex_unlock(&s->mu);
    return st;
}

/* After a barrier timed out: which ranks never set their arrival key. Looked up
 * with zero-timeout waits, CT_STORE_MAX_WAIT_KEYS ranks at a time. */
static ct_status barrier_report(ct_store *s, const char *name, const char *prefix, double t)
{
    char list[512] = "", *names = malloc((size_t)CT_STORE_MAX_WAIT_KEYS * 24 + strlen(prefix) * CT_STORE_MAX_WAIT_KEYS);
    const char **keys = malloc(CT_STORE_MAX_WAIT_KEYS * sizeof *keys);
    if (!names || !keys) {
        free(names);
        free(keys);
        return ct_error_set(CT_ERR_NOMEM, "store barrier '%s': timed out after %g s (out of memory naming the "
                                          "missing ranks)", name, t);
    }
    size_t used = 0;
    int nmissing = 0, first = -1;
    ct_status st = CT_OK;
    for (int base = 0; base < s->world_size && !st; base += CT_STORE_MAX_WAIT_KEYS) {
        int n = s->world_size - base < CT_STORE_MAX_WAIT_KEYS ? s->world_size - base : CT_STORE_MAX_WAIT_KEYS;
        char *p = names;
        for (int i = 0; i < n; i++) {
            keys[i] = p;
            p += sprintf(p, "%s/%d", prefix, base + i) + 1;
        }
        uint32_t *missing, nm;
        st = wait_keys(s, keys, n, 0, &missing, &nm);
        if (st != CT_ERR_TIMEOUT) continue;
        st = CT_OK;
        for (uint32_t i = 0; i < nm; i++, nmissing++) {
            if (first < 0) first = base + (int)missing[i];
            if (nmissing < LIST_MAX && used < sizeof list)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", nmissing ? ", " : "",
                                         base + (int)missing[i]);
        }
        free(missing);
    }
    free(names);
    free(keys);
    if (st)
        return ct_error_prefix("store barrier '%s': timed out after %g s; naming the missing ranks failed: ", name, t);
    if (nmissing == 0)
        return ct_error_set(CT_ERR_TIMEOUT, "barrier '%s': all %d ranks arrived, but not within %g s; set "
                                            "CTRAIN_TIMEOUT to wait longer", name, s->world_size, t);
    if (nmissing > LIST_MAX && used < sizeof list)
        snprintf(list + used, sizeof list - used, " and %d more", nmissing - LIST_MAX);
    return ct_error_set(CT_ERR_TIMEOUT, "barrier '%s': rank%s %s of %d did not arrive within %g s; did %s fail or "
                                        "take another path? set CTRAIN_TIMEOUT to wait longer",
                        name, nmissing > 1 ? "s" : "", list, s->world_size, t, nmissing > 1 ? "they" : "it");
}

/* The n-th barrier named x uses keys ct/barrier/x/n/...: each rank sets its own
 * arrival key /r and adds 1 to /count; the rank that brings the count to world_size
 * sets /done, which everyone waits for. The arrival keys are only read when the
 * barrier times out, to name who is missing. */
ct_status ct_store_barrier(ct_store *s, const char *name, double timeout_s)
{
    if (!s || !name) return ct_error_set(CT_ERR_INVALID, "store barrier: the store or name is NULL");
    if (!*name || strlen(name) > CT_STORE_MAX_KEY - 64)
        return ct_error_set(CT_ERR_INVALID, "store barrier: a name of %zu bytes; names are 1..%d bytes", strlen(name),
                            CT_STORE_MAX_KEY - 64);
    double t = effective_timeout(s, timeout_s), deadline = cti_dist_now() + t;
    uint64_t gen = 0;
    if (barrier_enter(s, name, &gen)) return CT_ERR_NOMEM;
    char prefix[CT_STORE_MAX_KEY - 16], key[CT_STORE_MAX_KEY + 32];
    snprintf(prefix, sizeof prefix, "ct/barrier/%s/%llu", name, (unsigned long long)gen);
    snprintf(key, sizeof key, "%s/%d", prefix, s->rank);
    int64_t arrived;
    if (ct_store_set(s, key, "1", 1)) return ct_error_prefix("barrier '%s': ", name);
    snprintf(key, sizeof key, "%s/count", prefix);
    if (ct_store_add(s, key, 1, &arrived)) return ct_error_prefix("barrier '%s': ", name);
    snprintf(key, sizeof key, "%s/done", prefix);
    if (arrived == s->world_size && ct_store_set(s, key, "", 0)) return ct_error_prefix("barrier '%s': ", name);

    double left = deadline - cti_dist_now();
    const char *done = key;
    uint32_t *missing, n;
    ct_status st = wait_keys(s, &done, 1, left > 0 ? left : 0, &missing, &n);
    if (st == CT_OK) return CT_OK;
    if (st != CT_ERR_TIMEOUT) return ct_error_prefix("barrier '%s': ", name);
    free(missing);
    return barrier_report(s, name, prefix, t);
}

void ct_store_free(ct_store *s)
{
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    cti_store_server_stop(s->srv);
    for (int i = 0; i < s->ngens; i++) free(s->gens[i].name);
    free(s->gens);
    uv_mutex_destroy(&s->mu);
    free(s);
}
