/* Tests for the framing of dist/tcp.c and its handling in dist/comm.c: a rogue rank 1
 * that speaks the documented protocol by hand (docs/maintainers/comm.md: the store
 * keys, the hello, the 56-byte header) joins rank 0's group and then sends bytes that
 * are not a frame, a frame of the wrong length for its step, and a frame claiming an
 * absurd length. Rank 0 must fail with CT_ERR_FORMAT naming rank 1 each time, never
 * crash or hang, and its later calls must fail at once. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "ranks.h"

static ct_tensor *vec(ct_dtype dt, int64_t n, double base)
{
    ct_tensor *t = ct_tensor_empty(dt, 1, (int64_t[]){n});
    uint8_t *p = ct_tensor_data(t);
    for (int64_t i = 0; i < n; i++) ct_scalar_store(dt, p + i * ct_dtype_size(dt), base + (double)i);
    return t;
}

/* The wire protocol as docs/maintainers/comm.md describes it, written out by hand. */
enum { KIND_COLL = 1, OP_INIT = 1, OP_ALLREDUCE = 3, ALGO_RD = 2, ALGO_DISSEMINATION = 5 };

static void put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> 8 * i);
}

static void frame(uint8_t h[56], int op, int dtype, int algo, uint64_t seq, int64_t count, uint32_t step,
                  uint32_t len)
{
    memset(h, 0, 56);
    memcpy(h, "CTCM", 4);
    h[4] = 1;        /* version */
    h[5] = KIND_COLL;
    h[6] = (uint8_t)op;
    h[8] = (uint8_t)dtype;
    h[9] = (uint8_t)algo;
    put(h + 16, 1, 8); /* the world group's id */
    put(h + 24, seq, 8);
    put(h + 32, (uint64_t)count, 8);
    put(h + 40, step, 4);
    put(h + 48, len, 4);
}

static bool send_all(int fd, const void *p, size_t n) { return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n; }

/* Plays rank 1 of 2 through the rendezvous of rank 0's next group; returns the socket. */
static int rogue_join(ct_store *s, int gen)
{
    char key[64], *addr = NULL;
    void *nonce = NULL;
    size_t n;
    int64_t got;
    if (ct_store_add(s, "ct/pg/gen/1", 1, &got) || got != gen) return -1;
    snprintf(key, sizeof key, "ct/pg/%d/nonce", gen);
    if (ct_store_get(s, key, 10, &nonce, &n) || n != 8) return -1;
    snprintf(key, sizeof key, "ct/pg/%d/addr/0", gen);
    if (ct_store_get(s, key, 10, (void **)&addr, &n)) return -1;
    char ip[64];
    int port;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    bool ok = sscanf(addr, "%63s %d", ip, &port) == 2 && inet_pton(AF_INET, ip, &a.sin_addr) == 1;
    a.sin_port = htons((uint16_t)port);
    uint8_t hello[24] = {'C', 'T', 'H', 'I', 2}; /* version 2, no token (none is set) */
    put(hello + 8, 1, 4);
    put(hello + 12, 2, 4);
    memcpy(hello + 16, nonce, 8);
    ok = ok && fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && send_all(fd, hello, sizeof hello);
    free(addr);
    free(nonce);
    if (!ok && fd >= 0) close(fd);
    return ok ? fd : -1;
}

static int rogue_main(rank_ctx *c)
{
    if (c->rank == 0) {
        int rc = 0;
        char key[32];
        /* 1: bytes that are not a frame, during the check at the end of ct_pg_new */
        ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = "tcp"});
        const char *e = ct_last_error();
        if (g || ct_last_status() != CT_ERR_FORMAT || !strstr(e, "rank 1 sent a malformed frame: bad magic 'GET '"))
            rc = 2, report(c, "garbage: %p %s", (void *)g, e);
        ct_pg_free(g);
        c->msg[0] = '\0';
        /* 2 and 3: a valid check, then a frame of the wrong length, then an absurd one */
        const char *want[] = {"rank 1 sent 12 bytes for step 1, chunk 0, where 16 were due",
                              "rank 1 sent a malformed frame: payload length 4294967295 exceeds the limit"};
        for (int k = 0; k < 2; k++) {
            g = rank_pg(c, 10, &(ct_pg_config){.transport = "tcp"});
            if (!g) return 3;
            snprintf(key, sizeof key, "test/ready/%d", k);
            ct_store_set(c->store, key, "1", 1);
            ct_frame_push();
            ct_work *w = ct_pg_allreduce(g, vec(CT_DTYPE_F32, 4, 0), CT_REDUCE_SUM);
            ct_status st = ct_work_wait(w);
            ct_work_free(w);
            if (st != CT_ERR_FORMAT || !strstr(ct_last_error(), want[k]))
                rc = 4 + k, report(c, "case %d: status %d: %s", k + 2, st, ct_last_error());
            w = ct_pg_barrier(g);
            if (ct_work_wait(w) != CT_ERR_FORMAT) rc = 6, report(c, "later: %s", ct_last_error());
            ct_work_free(w);
            ct_frame_pop();
            ct_pg_free(g);
        }
        return rc;
    }
    ct_store *s = ct_store_new(&(ct_store_config){.port = c->port, .world_size = 2, .rank = 1, .timeout_s = 10});
    if (!s) return report(c, "store: %s", ct_last_error()), 10;
    int rc = 0;
    int fd = rogue_join(s, 1);
    char http[56] = "GET / HTTP/1.1\r\nHost: rank0\r\n\r\n";
    if (fd < 0 || !send_all(fd, http, sizeof http)) rc = 11;
    for (int k = 0; k < 2 && !rc; k++) {
        char buf[256], key[32];
        while (fd >= 0 && recv(fd, buf, sizeof buf, 0) > 0) {} /* until rank 0 hangs up (see below) */
        if (fd >= 0) close(fd);
        fd = rogue_join(s, 2 + k);
        uint8_t h[56 + 12] = {0};
        frame(h, OP_INIT, CT_DTYPE_U8, ALGO_DISSEMINATION, 0, 2, 0, 0);
        if (fd < 0 || !send_all(fd, h, 56)) {
            rc = 12;
            break;
        }
        snprintf(key, sizeof key, "test/ready/%d", k);
        void *v;
        size_t n;
        if (ct_store_get(s, key, 10, &v, &n)) rc = 13;
        else free(v);
        /* allreduce #1 (sum, f32, 4) by recursive doubling expects 16 bytes at step 1 */
        frame(h, OP_ALLREDUCE, CT_DTYPE_F32, ALGO_RD, 1, 4, 1, k == 0 ? 12 : 0xffffffffu);
        if (!send_all(fd, h, k == 0 ? sizeof h : 56)) rc = 14;
    }
    /* closing with rank 0's messages unread would reset the connection, and rank 0
     * could see the reset before the frame: stay until rank 0 hangs up */
    char buf[256];
    while (fd >= 0 && recv(fd, buf, sizeof buf, 0) > 0) {}
    if (fd >= 0) close(fd);
    ct_store_free(s);
    return rc;
}

Test(dist_tcp, malformed_frames_fail_the_group, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, rogue_main, NULL, res, 25);
    expect_all_ok(res, 2);
}
