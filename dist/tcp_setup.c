/* The TCP transport's setup, on the caller's thread with blocking sockets; every step
 * is bounded by the deadline (the group timeout). The loop side is in dist/tcp.c.
 *   1. pick the address of the interface that routes to the master (a UDP socket
 *      "connected" to it reports the local end) and listen on a port of every
 *      interface: an ephemeral one, or with CTRAIN_PORT_RANGE=LO-HI (firewalled
 *      clusters) the first free one of LO .. HI tried in order from
 *      LO + (rank * 7) % (HI - LO + 1), wrapping around (ranks of one node start
 *      apart, so they rarely try the same ports);
 *   2. rank 0 draws a 64-bit nonce and publishes <prefix>/nonce; each rank publishes
 *      "ip port" under <prefix>/addr/<rank>;
 *   3. each rank connects to every lower rank and sends a hello, 24 bytes and the
 *      job's token (the store's, dist/store.h):
 *        "CTHI" | version u8 | 0 | token_len u16 | rank u32 | size u32 | nonce u64 | token
 *      (little-endian), then accepts the higher ranks, keeping a connection only when
 *      its hello has the nonce, the size, the token and an expected, not yet connected
 *      rank. A stray client is dropped with a line on stderr and the wait goes on; it
 *      gets HELLO_WAIT_S to send its hello, so one that sends nothing delays the
 *      group by that much, not forever. Connecting before accepting cannot
 *      deadlock: the kernel completes a connection (and buffers its hello) before
 *      the listener accepts it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dist/poll_internal.h"
#include "dist/store_internal.h"
#include "dist/tcp_internal.h"

#define HELLO_BYTES 24
#define HELLO_MAGIC "CTHI"
#define HELLO_VERSION 2
#define HELLO_WAIT_S 5.0



/* Moves n bytes on a non-blocking socket. 0 done, else a message in why. */
static int io_full(int fd, void *buf, size_t n, bool out, double deadline, char *why, size_t cap)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) {
            snprintf(why, cap, "the connection was closed");
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(why, cap, "%s", strerror(errno));
            return -1;
        }
        int r = cti_dist_wait_fd(fd, out ? POLLOUT : POLLIN, deadline);
        if (r <= 0) {
            snprintf(why, cap, "%s", r == 0 ? "no answer in time" : strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* The address of this host's interface that routes to the master. */
static ct_status local_ip(const char *master, char *ip, size_t cap, int *family)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    int rc = getaddrinfo(master, "9", &hints, &res);
    if (rc)
        return ct_error_set(CT_ERR_IO, "tcp: cannot resolve the master address '%s': %s; check MASTER_ADDR", master,
                            gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
              getsockname(fd, (struct sockaddr *)&sa, &len) == 0;
    int err = errno;
    if (fd >= 0) close(fd);
    *family = res->ai_family;
    freeaddrinfo(res);
    if (!ok)
        return ct_error_set(CT_ERR_IO, "tcp: no route from this host to the master '%s': %s", master, strerror(err));
    const void *a = sa.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&sa)->sin6_addr
                                             : (const void *)&((struct sockaddr_in *)&sa)->sin_addr;
    if (!inet_ntop(sa.ss_family, a, ip, (socklen_t)cap))
        return ct_error_set(CT_ERR_INTERNAL, "tcp: inet_ntop: %s", strerror(errno));
    return CT_OK;
}

/* A listening socket on port (0: ephemeral) of every interface; -1 with errno. */
static int listen_any(int family, int backlog, int *port)
{
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_storage sa = {0};
    socklen_t len;
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&sa;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons((uint16_t)*port);
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&sa;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons((uint16_t)*port);
        len = sizeof *a;
    }
    int one = 1;
    /* a fixed port may still have connections of a previous job in TIME_WAIT */
    if ((*port && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one)) || bind(fd, (struct sockaddr *)&sa, len) ||
        listen(fd, backlog) || set_nonblock(fd) || getsockname(fd, (struct sockaddr *)&sa, &len)) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    *port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

ct_status cti_tcp_port_range(int *lo, int *hi)
{
    const char *v = getenv("CTRAIN_PORT_RANGE");
    *lo = *hi = 0;
    if (!v || !*v) return CT_OK;
    char *end;
    errno = 0;
    long a = strtol(v, &end, 10), b = -1;
    bool ok = !errno && v[0] >= '0' && v[0] <= '9' && *end == '-' && end[1] >= '0' && end[1] <= '9';
    if (ok) b = strtol(end + 1, &end, 10);
    if (!ok || errno || *end || a < 1 || b > 65535 || a > b)
        return ct_error_set(CT_ERR_INVALID,
                            "tcp: CTRAIN_PORT_RANGE='%s' is not LO-HI with 1 <= LO <= HI <= 65535 (e.g. 29600-29699)",
                            v);
    *lo = (int)a;
    *hi = (int)b;
    return CT_OK;
}

/* The listening socket: ephemeral, or the first free port of CTRAIN_PORT_RANGE from
 * this rank's start. -1 with the error set. */
static int listen_port(int family, const ct_transport_setup *s, int *port)
{
    int lo, hi;
    if (cti_tcp_port_range(&lo, &hi)) return -1;
    if (!lo) {
        *port = 0;
        int fd = listen_any(family, s->size, port);
        if (fd < 0) ct_error_set(CT_ERR_IO, "tcp: cannot listen on a TCP port: %s", strerror(errno));
        return fd;
    }
    int span = hi - lo + 1, start = (int)(((int64_t)s->rank * 7) % span), err = 0;
    for (int i = 0; i < span; i++) {
        *port = lo + (start + i) % span;
        int fd = listen_any(family, s->size, port);
        if (fd >= 0) return fd;
        err = errno;
        if (err != EADDRINUSE && err != EACCES) break; /* not a matter of this port */
    }
    ct_error_set(CT_ERR_IO,
                 "tcp: rank %d found no free port in CTRAIN_PORT_RANGE=%d-%d (%d port(s); last error: %s); widen the "
                 "range or stop what holds those ports",
                 s->rank, lo, hi, span, strerror(err));
    return -1;
}

static void hello_encode(uint8_t *h, int rank, int size, uint64_t nonce, size_t token_len)
{
    memset(h, 0, HELLO_BYTES);
    memcpy(h, HELLO_MAGIC, 4);
    h[4] = HELLO_VERSION;
    cti_msg_put(h + 6, token_len, 2);
    cti_msg_put(h + 8, (uint32_t)rank, 4);
    cti_msg_put(h + 12, (uint32_t)size, 4);
    cti_msg_put(h + 16, nonce, 8);
}

/* Connects to peer q at "ip port" and sends the hello; retries refusals until the deadline. */
static int connect_peer(int q, const char *addr, const ct_transport_setup *s, uint64_t nonce, double deadline)
{
    char ip[128];
    int port;
    if (sscanf(addr, "%127s %d", ip, &port) != 2 || port <= 0 || port > 65535) {
        ct_error_set(CT_ERR_FORMAT, "tcp: rank %d published the address '%s', not 'ip port'", q, addr);
        return -1;
    }
    struct sockaddr_storage sa = {0};
    socklen_t len;
    if (inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)&sa)->sin6_addr) == 1) {
        ((struct sockaddr_in6 *)&sa)->sin6_family = AF_INET6;
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
        len = sizeof(struct sockaddr_in6);
    } else if (inet_pton(AF_INET, ip, &((struct sockaddr_in *)&sa)->sin_addr) == 1) {
        ((struct sockaddr_in *)&sa)->sin_family = AF_INET;
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);
        len = sizeof(struct sockaddr_in);
    } else {
        ct_error_set(CT_ERR_FORMAT, "tcp: rank %d published the address '%s', not an IP address", q, addr);
        return -1;
    }
    char why[256] = "no attempt";
    double backoff = 0.01;
    while (cti_dist_now() < deadline) {
        int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || set_nonblock(fd)) {
            snprintf(why, sizeof why, "socket: %s", strerror(errno));
            if (fd >= 0) close(fd);
            break;
        }
        int rc = connect(fd, (struct sockaddr *)&sa, len), err = rc ? errno : 0;
        if (rc && err == EINPROGRESS) {
            int r = cti_dist_wait_fd(fd, POLLOUT, deadline);
            socklen_t el = sizeof err;
            if (r <= 0) err = r == 0 ? ETIMEDOUT : errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el)) err = errno;
        }
        if (!err) {
            const char *token = cti_store_token(s->store);
            uint8_t h[HELLO_BYTES + CT_STORE_MAX_TOKEN];
            hello_encode(h, s->rank, s->size, nonce, strlen(token));
            memcpy(h + HELLO_BYTES, token, strlen(token));
            int one = 1;
            if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0 &&
                io_full(fd, h, HELLO_BYTES + strlen(token), true, deadline, why, sizeof why) == 0)
                return fd;
        } else {
            snprintf(why, sizeof why, "%s", strerror(err));
        }
        close(fd);
        if (err != ECONNREFUSED && err != EAGAIN && err != ETIMEDOUT && err != ECONNRESET) break;
        struct timespec ts = {0, (long)(backoff * 1e9)};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
    }
    ct_error_set(cti_dist_now() >= deadline ? CT_ERR_TIMEOUT : CT_ERR_PEER,
                 "tcp: cannot connect to rank %d at %s:%d (%s); is that host reachable from this one? set "
                 "CTRAIN_TIMEOUT to wait longer",
                 q, ip, port, why);
    return -1;
}

/* Reads and checks a hello on fd: the peer's rank, or -1 with the reason in why. */
static int hello_check(int fd, const int *fds, const ct_transport_setup *s, uint64_t nonce, double deadline,
                       char *why, size_t cap)
{
    uint8_t h[HELLO_BYTES], token[CT_STORE_MAX_TOKEN];
    double until = cti_dist_now() + HELLO_WAIT_S < deadline ? cti_dist_now() + HELLO_WAIT_S : deadline;
    char io[128];
    if (io_full(fd, h, sizeof h, false, until, io, sizeof io)) {
        snprintf(why, cap, "no hello (%s)", io);
        return -1;
    }
    if (memcmp(h, HELLO_MAGIC, 4)) {
        snprintf(why, cap, "not a ctrain rank (bad magic bytes)");
        return -1;
    }
    if (h[4] != HELLO_VERSION) {
        snprintf(why, cap, "a hello of protocol version %d, not %d", h[4], HELLO_VERSION);
        return -1;
    }
    size_t tlen = (size_t)cti_msg_get(h + 6, 2);
    if (tlen > CT_STORE_MAX_TOKEN) {
        snprintf(why, cap, "a malformed hello (a token of %zu bytes)", tlen);
        return -1;
    }
    if (tlen && io_full(fd, token, tlen, false, until, io, sizeof io)) {
        snprintf(why, cap, "no token (%s)", io);
        return -1;
    }
    if (!cti_token_equal(token, tlen, cti_store_token(s->store))) {
        snprintf(why, cap, "wrong token");
        return -1;
    }
    uint64_t size = cti_msg_get(h + 12, 4), q = cti_msg_get(h + 8, 4);
    if (size != (uint64_t)s->size || cti_msg_get(h + 16, 8) != nonce) {
        snprintf(why, cap, "a rank of another group (size %llu, not %d, or another nonce)", (unsigned long long)size,
                 s->size);
        return -1;
    }
    if (q <= (uint64_t)s->rank || q >= (uint64_t)s->size || fds[q] >= 0) {
        snprintf(why, cap, "rank %llu, not one this rank waits for", (unsigned long long)q);
        return -1;
    }
    return (int)q;
}

static void peer_text(const struct sockaddr_storage *sa, char *out, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    bool v6 = sa->ss_family == AF_INET6;
    const void *a = v6 ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                       : (const void *)&((const struct sockaddr_in *)sa)->sin_addr;
    inet_ntop(sa->ss_family, a, ip, sizeof ip);
    int port = ntohs(v6 ? ((const struct sockaddr_in6 *)sa)->sin6_port : ((const struct sockaddr_in *)sa)->sin_port);
    snprintf(out, cap, v6 ? "[%s]:%d" : "%s:%d", ip, port);
}

/* Accepts the ranks above this one on lfd, which listens on port (named when they do
 * not come). */
static ct_status accept_peers(int *fds, int lfd, int port, const ct_transport_setup *s, uint64_t nonce,
                              double deadline)
{
    int need = s->size - 1 - s->rank;
    while (need > 0) {
        int r = cti_dist_wait_fd(lfd, POLLIN, deadline);
        if (r < 0) return ct_error_set(CT_ERR_IO, "tcp: poll on the listening socket: %s", strerror(errno));
        if (r == 0) {
            char list[256] = "";
            size_t n = 0;
            for (int q = s->rank + 1; q < s->size && n < sizeof list - 16; q++)
                if (fds[q] < 0) n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", n ? ", " : "", q);
            /* a firewall is the usual cause on a cluster: name the port it must let through */
            const char *range = getenv("CTRAIN_PORT_RANGE");
            return ct_error_set(CT_ERR_TIMEOUT,
                                "tcp: rank(s) %s did not connect within %.3g s; did they start, and can they reach "
                                "this host on port %d? (behind a firewall, export CTRAIN_PORT_RANGE=LO-HI with ports "
                                "it opens%s%s%s) set CTRAIN_TIMEOUT to wait longer",
                                list, s->timeout_s, port, range && *range ? "; it is " : "",
                                range && *range ? range : "", range && *range ? " here" : "");
        }
        struct sockaddr_storage sa = {0};
        socklen_t salen = sizeof sa;
        int fd = accept4(lfd, (struct sockaddr *)&sa, &salen, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED || errno == EWOULDBLOCK) continue;
            return ct_error_set(CT_ERR_IO, "tcp: accept: %s", strerror(errno));
        }
        char why[256], peer[INET6_ADDRSTRLEN + 16];
        int q = hello_check(fd, fds, s, nonce, deadline, why, sizeof why);
        int one = 1;
        if (q >= 0 && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) {
            snprintf(why, sizeof why, "setsockopt: %s", strerror(errno));
            q = -1;
        }
        if (q < 0) {
            /* a stranger, a stale job or a duplicate: not ours */
            peer_text(&sa, peer, sizeof peer);
            fprintf(stderr, "ctrain: tcp: rank %d dropped a connection from %s: %s\n", s->rank, peer, why);
            close(fd);
            continue;
        }
        fds[q] = fd;
        need--;
    }
    return CT_OK;
}

static ct_status store_get_text(const ct_transport_setup *s, const char *key, double deadline, char *out, size_t cap)
{
    void *v = NULL;
    size_t n = 0;
    double left = deadline - cti_dist_now();
    if (left <= 0.001) left = 0.001;
    ct_status st = ct_store_get(s->store, key, left, &v, &n);
    if (st) return ct_error_prefix("tcp: ");
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), (const char *)v);
    free(v);
    return CT_OK;
}

int *cti_tcp_connect(const ct_transport_setup *s)
{
    double deadline = cti_dist_now() + s->timeout_s;
    int *fds = malloc((size_t)s->size * sizeof *fds);
    if (!fds) {
        ct_error_set(CT_ERR_NOMEM, "tcp: out of memory setting up the transport for %d ranks", s->size);
        return NULL;
    }
    for (int p = 0; p < s->size; p++) fds[p] = -1;

    char ip[INET6_ADDRSTRLEN], key[CT_STORE_MAX_KEY], val[256];
    int family = AF_INET, port, lfd = -1;
    uint64_t nonce = 0;
    if (local_ip(s->master_addr, ip, sizeof ip, &family)) goto fail;
    lfd = listen_port(family, s, &port);
    if (lfd < 0) goto fail;
    snprintf(key, sizeof key, "%s/nonce", s->prefix);
    if (s->rank == 0) {
        uint8_t b[8];
        if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
            nonce = (uint64_t)getpid() * 0x9e3779b97f4a7c15u ^ (uint64_t)(cti_dist_now() * 1e9);
        cti_msg_put(b, nonce, 8);
        if (ct_store_set(s->store, key, b, sizeof b)) {
            ct_error_prefix("tcp: ");
            goto fail;
        }
    } else {
        void *v = NULL;
        size_t n = 0;
        double left = deadline - cti_dist_now();
        if (ct_store_get(s->store, key, left > 0.001 ? left : 0.001, &v, &n)) {
            ct_error_prefix("tcp: ");
            goto fail;
        }
        if (n != 8) {
            free(v);
            ct_error_set(CT_ERR_FORMAT, "tcp: the group's nonce under '%s' is not 8 bytes", key);
            goto fail;
        }
        nonce = cti_msg_get(v, 8);
        free(v);
    }
    snprintf(key, sizeof key, "%s/addr/%d", s->prefix, s->rank);
    int n = snprintf(val, sizeof val, "%s %d", ip, port);
    if (ct_store_set(s->store, key, val, (size_t)n)) {
        ct_error_prefix("tcp: ");
        goto fail;
    }
    for (int q = 0; q < s->rank; q++) {
        snprintf(key, sizeof key, "%s/addr/%d", s->prefix, q);
        if (store_get_text(s, key, deadline, val, sizeof val)) goto fail;
        fds[q] = connect_peer(q, val, s, nonce, deadline);
        if (fds[q] < 0) goto fail;
    }
    if (accept_peers(fds, lfd, port, s, nonce, deadline)) goto fail;
    close(lfd);
    return fds;

fail:
    if (lfd >= 0) close(lfd);
    for (int p = 0; p < s->size; p++)
        if (fds[p] >= 0) close(fds[p]);
    free(fds);
    return NULL;
}

ct_transport *cti_tcp_transport_new(const ct_transport_setup *s)
{
    int *fds = cti_tcp_connect(s);
    return fds ? cti_tcp_transport_wrap(s->rank, s->size, fds) : NULL;
}
