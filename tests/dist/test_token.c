/* The job's token (dist/store.h, "Tokens"; docs/launch.md, "Security model of the
 * store"): while a group of 2 forms and runs an allreduce, strangers connect to the
 * store's port and to rank 0's transport port, sending bytes that are not a handshake
 * and handshakes with a wrong token. Each is refused with a line on stderr naming its
 * address; the group is not disturbed. The wire bytes are written out by hand from
 * docs/maintainers/dist.md and docs/maintainers/comm.md. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/tensor.h"
#include "core/threads.h"
#include "ranks.h"

#define TOKEN "job-token-1234"

static void put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> 8 * i);
}

static int connect_to(const char *ip, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (fd < 0 || inet_pton(AF_INET, ip, &a.sin_addr) != 1 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* Sends n bytes, then reads until the peer closes (true) or 3 s pass (false);
 * *got = the first bytes it sent back, for the store's ERROR reply. */
static bool send_and_wait_close(int fd, const void *p, size_t n, uint8_t *got, size_t cap, size_t *ngot)
{
    if (fd < 0 || send(fd, p, n, MSG_NOSIGNAL) != (ssize_t)n) return false;
    double deadline = now_s() + 3;
    size_t have = 0;
    while (now_s() < deadline) {
        struct pollfd q = {fd, POLLIN, 0};
        if (poll(&q, 1, 100) <= 0) continue;
        uint8_t buf[512];
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) {
            if (ngot) *ngot = have;
            return r == 0 || errno == ECONNRESET;
        }
        size_t k = (size_t)r < cap - have ? (size_t)r : cap - have;
        if (got) memcpy(got + have, buf, k);
        have += k;
    }
    return false;
}

/* Whether log has a line that starts with head, holds mid and ends with tail. */
static bool has_line(const char *log, const char *head, const char *mid, const char *tail)
{
    for (const char *p = log; *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p), h = strlen(head), t = strlen(tail);
        const char *m = strstr(p, mid);
        if (n >= h + t && !strncmp(p, head, h) && !strncmp(p + n - t, tail, t) && m && m < p + n) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

static const char http[] = "GET / HTTP/1.1\r\nHost: rank0\r\n\r\n";

/* Store strangers: garbage, a HELLO (op 5, no keys) with a wrong token, and a rank of
 * another job whose handle gives up. 0 when each was refused as documented. */
static int store_strangers(rank_ctx *c)
{
    int fd = connect_to("127.0.0.1", c->port);
    if (!send_and_wait_close(fd, http, sizeof http - 1, NULL, 0, NULL)) return report(c, "garbage kept"), 1;
    close(fd);

    uint8_t f[64] = {'C', 'T', 'K', 'V', 1, 5}, rep[512];
    put(f + 8, 5, 4);
    memcpy(f + 12, "wrong", 5);
    size_t n = 0;
    fd = connect_to("127.0.0.1", c->port);
    bool closed = send_and_wait_close(fd, f, 17, rep, sizeof rep - 1, &n);
    close(fd);
    rep[n] = '\0';
    if (!closed || n < 12 || memcmp(rep, "CTKV", 4) || rep[5] != 2 || !strstr((char *)rep + 12, "token"))
        return report(c, "wrong token: closed %d, %zu bytes back: '%s'", closed, n, n > 12 ? (char *)rep + 12 : ""),
               2;

    ct_store *other = ct_store_new(&(ct_store_config){.port = c->port, .world_size = 2, .rank = 1, .timeout_s = 0.3,
                                                      .token = "another-job"});
    if (other || ct_last_status() != CT_ERR_PEER || !strstr(ct_last_error(), "refused this rank's token")) {
        report(c, "another job's handle: %p, %s", (void *)other, ct_last_error());
        ct_store_free(other);
        return 3;
    }
    return 0;
}

/* Transport strangers at rank 0's listening port, found in the store as rank 1 would
 * (ct/pg/1/addr/0, ct/pg/1/nonce): garbage, then a hello of rank 1 with the right
 * nonce but a wrong token. Rank 0 must drop both and still take the real rank 1. */
static int transport_strangers(rank_ctx *c)
{
    ct_store *s = ct_store_new(&(ct_store_config){.port = c->port, .world_size = 2, .rank = 1, .timeout_s = 10});
    if (!s) return report(c, "store: %s", ct_last_error()), 10;
    void *addr = NULL, *nonce = NULL;
    size_t n, nn;
    int rc = 0;
    char ip[64];
    int port;
    if (ct_store_get(s, "ct/pg/1/addr/0", 10, &addr, &n) || ct_store_get(s, "ct/pg/1/nonce", 10, &nonce, &nn) ||
        nn != 8 || sscanf(addr, "%63s %d", ip, &port) != 2) {
        report(c, "rendezvous keys: %s", ct_last_error());
        rc = 11;
        goto out;
    }
    int fd = connect_to(ip, port);
    if (!send_and_wait_close(fd, http, sizeof http - 1, NULL, 0, NULL)) rc = 12, report(c, "tcp garbage kept");
    if (fd >= 0) close(fd);
    uint8_t h[24 + 5] = {'C', 'T', 'H', 'I', 2};
    put(h + 6, 5, 2);
    put(h + 8, 1, 4);
    put(h + 12, 2, 4);
    memcpy(h + 16, nonce, 8);
    memcpy(h + 24, "wrong", 5);
    fd = connect_to(ip, port);
    if (!send_and_wait_close(fd, h, sizeof h, NULL, 0, NULL)) rc = 13, report(c, "tcp wrong token kept");
    if (fd >= 0) close(fd);
out:
    free(addr);
    free(nonce);
    ct_store_free(s);
    return rc;
}

static int token_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    int rc = 0;
    if (c->rank == 1 && ((rc = store_strangers(c)) || (rc = transport_strangers(c)))) return rc;
    ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = "tcp"});
    if (!g) return 20;
    /* x_r[i] = (r + 1) * (i + 1); the sum over 2 ranks is 3 * (i + 1) */
    ct_frame_push();
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_F32, 1, (int64_t[]){8});
    float *x = ct_tensor_data(t);
    for (int i = 0; i < 8; i++) x[i] = (float)((c->rank + 1) * (i + 1));
    ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
    if (ct_work_wait(w)) rc = 21, report(c, "allreduce: %s", ct_last_error());
    ct_work_free(w);
    for (int i = 0; i < 8 && !rc; i++)
        if (x[i] != (float)(3 * (i + 1))) rc = 22, report(c, "x[%d] = %g, want %d", i, (double)x[i], 3 * (i + 1));
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_token, strangers_are_refused_while_a_group_forms, .timeout = 30)
{
    /* the ranks' stderr, where the refusals are logged, goes to a file */
    char path[] = "/tmp/ct_token_log_XXXXXX";
    int logfd = mkstemp(path);
    cr_assert_geq(logfd, 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    cr_assert_geq(saved, 0);
    dup2(logfd, 2);
    setenv("CTRAIN_STORE_TOKEN", TOKEN, 1);
    rank_result res[2];
    run_ranks(2, token_main, NULL, res, 25);
    unsetenv("CTRAIN_STORE_TOKEN");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char log[16384];
    ssize_t n = pread(logfd, log, sizeof log - 1, 0);
    close(logfd);
    log[n > 0 ? n : 0] = '\0';
    expect_all_ok(res, 2);
    const char *store = "ctrain: store on port ", *tcp = "ctrain: tcp: rank 0 dropped a connection from 127.0.0.1:";
    const char *from = ": refused a connection from 127.0.0.1:";
    cr_expect(has_line(log, store, from, ": not a store client (bad magic bytes)"), "store garbage not logged:\n%s",
              log);
    cr_expect(has_line(log, store, from, ": wrong token"), "store wrong token not logged:\n%s", log);
    cr_expect(has_line(log, tcp, "", ": not a ctrain rank (bad magic bytes)"), "tcp garbage not logged:\n%s", log);
    cr_expect(has_line(log, tcp, "", ": wrong token"), "tcp wrong token not logged:\n%s", log);
}
