/* Tests for the composite transport "shm+tcp" (dist/mux.c, the node choice in
 * dist/shm_setup.c), the link statistics (ct_pg_link_stats_get), the node named in a
 * lost peer's error, and CTRAIN_PORT_RANGE (dist/tcp_setup.c).
 *
 * Four fork()ed ranks play two nodes on this machine through CTRAIN_NODE_ID: ranks 0
 * and 1 are node "a", ranks 2 and 3 node "b". Every result is compared with a naive
 * f64 reference computed from the inputs' formula, never with another run of the
 * code under test. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "dist/pg.h"
#include "ranks.h"
#include "shm_names.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* ranks 0, 1 on node "a", 2, 3 on "b" */
static void play_node(int rank) { setenv("CTRAIN_NODE_ID", rank < 2 ? "a" : "b", 1); }

/* Input element i of world rank r: a small integer (exact in f64 and in any sum here). */
static double val(int r, int64_t i, int salt) { return (double)((r * 37 + i * 11 + salt * 5) % 101) - 50; }

static ct_tensor *vec(int64_t n, int r, int64_t i0, int salt)
{
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_F64, 1, (int64_t[]){n});
    double *p = ct_tensor_data(t);
    for (int64_t i = 0; i < n; i++) p[i] = val(r, i0 + i, salt);
    return t;
}

static ct_status wait_free(ct_work *w)
{
    ct_status st = w ? ct_work_wait(w) : ct_last_status();
    ct_work_free(w);
    return st;
}

/* Every collective on g (whose rank i is world rank members[i]), checked against
 * the naive f64 reference. */
static int collectives_ok(rank_ctx *c, ct_pg *g, const int *members, int salt)
{
    int n = ct_pg_size(g), me = ct_pg_rank(g);
    int64_t len = 3001, blk = 257;
    int rc = 0;
    CT_FRAME {
        ct_tensor *t = vec(len, members[me], 0, salt);
        if (wait_free(ct_pg_allreduce(g, t, CT_REDUCE_SUM))) {
            report(c, "rank %d: allreduce: %s", c->rank, ct_last_error());
            rc = 1;
        }
        const double *p = ct_tensor_data(t);
        double want_sum = 0;
        if (!rc) {
            for (int64_t i = 0; i < len; i++) {
                want_sum = 0;
                for (int k = 0; k < n; k++) want_sum += val(members[k], i, salt);
                if (p[i] != want_sum) {
                    report(c, "rank %d: allreduce: element %lld is %g, want %g", c->rank, (long long)i, p[i], want_sum);
                    rc = 2;
                    break;
                }
            }
        }
        /* reduce-scatter: block me of the sum */
        ct_tensor *in = vec(n * blk, members[me], 0, salt + 1), *out = ct_tensor_empty(CT_DTYPE_F64, 1, (int64_t[]){blk});
        if (!rc && wait_free(ct_pg_reduce_scatter(g, out, in, CT_REDUCE_SUM))) {
            report(c, "rank %d: reduce_scatter: %s", c->rank, ct_last_error());
            rc = 3;
        }
        const double *q = ct_tensor_data(out);
        for (int64_t i = 0; !rc && i < blk; i++) {
            double w = 0;
            for (int k = 0; k < n; k++) w += val(members[k], me * blk + i, salt + 1);
            if (q[i] != w) rc = 4, report(c, "rank %d: reduce_scatter[%lld] = %g, want %g", c->rank, (long long)i, q[i], w);
        }
        /* all-gather: block k is rank k's input */
        ct_tensor *mine = vec(blk, members[me], 0, salt + 2), *all = ct_tensor_empty(CT_DTYPE_F64, 1, (int64_t[]){n * blk});
        if (!rc && wait_free(ct_pg_allgather(g, all, mine))) {
            report(c, "rank %d: allgather: %s", c->rank, ct_last_error());
            rc = 5;
        }
        const double *a = ct_tensor_data(all);
        for (int64_t i = 0; !rc && i < n * blk; i++)
            if (a[i] != val(members[i / blk], i % blk, salt + 2))
                rc = 6, report(c, "rank %d: allgather[%lld] = %g", c->rank, (long long)i, a[i]);
        /* broadcast from the last rank */
        ct_tensor *b = vec(blk, members[me], 0, salt + 3);
        if (!rc && wait_free(ct_pg_broadcast(g, b, n - 1))) {
            report(c, "rank %d: broadcast: %s", c->rank, ct_last_error());
            rc = 7;
        }
        const double *bp = ct_tensor_data(b);
        for (int64_t i = 0; !rc && i < blk; i++)
            if (bp[i] != val(members[n - 1], i, salt + 3)) rc = 8, report(c, "rank %d: broadcast[%lld] = %g", c->rank, (long long)i, bp[i]);
        /* point to point around the ring: from me - 1, to me + 1 */
        ct_tensor *s = vec(blk, members[me], 0, salt + 4), *r = ct_tensor_empty(CT_DTYPE_F64, 1, (int64_t[]){blk});
        ct_work *ws = rc ? NULL : ct_pg_send(g, s, (me + 1) % n, 9);
        ct_work *wr = rc ? NULL : ct_pg_recv(g, r, (me + n - 1) % n, 9);
        if (!rc && (wait_free(ws) | wait_free(wr))) {
            report(c, "rank %d: send/recv: %s", c->rank, ct_last_error());
            rc = 9;
        } else if (rc) {
            ct_work_free(ws);
            ct_work_free(wr);
        }
        const double *rp = ct_tensor_data(r);
        int from = members[(me + n - 1) % n];
        for (int64_t i = 0; !rc && i < blk; i++)
            if (rp[i] != val(from, i, salt + 4)) rc = 10, report(c, "rank %d: recv[%lld] = %g", c->rank, (long long)i, rp[i]);
    }
    /* a collective that starts after a rank freed the group fails: free only once all are done */
    if (!rc && wait_free(ct_pg_barrier(g))) rc = 11, report(c, "rank %d: barrier: %s", c->rank, ct_last_error());
    return rc;
}

/* ---- two nodes in one group ------------------------------------------------------------------ */

static int two_nodes_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    play_node(c->rank);
    ct_pg *g = rank_pg(c, 15, NULL);
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!g) return 1;
    int rc = 0;
    if (strcmp(ct_pg_transport(g), "shm+tcp")) rc = 2, report(c, "rank %d: transport %s", c->rank, ct_pg_transport(g));
    /* one peer on this node: a ring each way, both names already gone */
    if (unlinked_maps() != 2) rc = 3, report(c, "rank %d: %d unlinked mappings, want 2", c->rank, unlinked_maps());
    ct_pg_link_stats before, after;
    if (ct_pg_link_stats_get(g, &before)) rc = 4, report(c, "stats: %s", ct_last_error());
    if (before.shm_peers != 1 || before.tcp_peers != 2)
        rc = 5, report(c, "rank %d: %d shm and %d tcp peers, want 1 and 2", c->rank, before.shm_peers, before.tcp_peers);
    int world[4] = {0, 1, 2, 3};
    if (!rc) rc = collectives_ok(c, g, world, 0);
    ct_pg_link_stats_get(g, &after);
    /* a 3001-element f64 allreduce alone sends more than 3001 * 8 / 2 bytes over each kind */
    if (!rc && (after.shm_bytes - before.shm_bytes < 12000 || after.tcp_bytes - before.tcp_bytes < 12000))
        rc = 6, report(c, "rank %d: sent %lld bytes over shm and %lld over tcp", c->rank,
                       (long long)(after.shm_bytes - before.shm_bytes), (long long)(after.tcp_bytes - before.tcp_bytes));
    report(c, "rank %d: shm peers %d bytes %lld; tcp peers %d bytes %lld", c->rank, after.shm_peers,
           (long long)after.shm_bytes, after.tcp_peers, (long long)after.tcp_bytes);
    /* sub-groups across the nodes, within one, and in another order */
    int across[2] = {1, 2}, within[2] = {3, 2}, mixed[3] = {3, 0, 1};
    const int *lists[3] = {across, within, mixed};
    int sizes[3] = {2, 2, 3};
    for (int k = 0; k < 3 && !rc; k++) {
        ct_pg *sub = ct_pg_new_subgroup(g, lists[k], sizes[k]);
        bool member = false;
        for (int i = 0; i < sizes[k]; i++) member |= lists[k][i] == c->rank;
        if (member && !sub) rc = 20 + k, report(c, "rank %d: sub-group %d: %s", c->rank, k, ct_last_error());
        if (sub && strcmp(ct_pg_transport(sub), "shm+tcp")) rc = 30 + k, report(c, "sub-group: %s", ct_pg_transport(sub));
        if (sub && !rc) rc = collectives_ok(c, sub, lists[k], 10 + k);
        ct_pg_free(sub);
    }
    ct_pg_free(g);
    return rc;
}

Test(dist_mux, two_nodes_use_rings_within_and_tcp_across, .timeout = 60)
{
    rank_result res[4];
    run_ranks(4, two_nodes_main, NULL, res, 45);
    expect_all_ok(res, 4);
    expect_no_names(&res[0]);
}

/* A node alone on its host name's machine still counts: three nodes, one pair. */
static int three_nodes_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    setenv("CTRAIN_NODE_ID", c->rank == 1 ? "solo" : "pair", 1); /* ranks 0 and 2 share a node */
    ct_pg *g = rank_pg(c, 15, NULL);
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!g) return 1;
    ct_pg_link_stats ls;
    ct_pg_link_stats_get(g, &ls);
    int want_shm = c->rank == 1 ? 0 : 1, rc = 0;
    if (strcmp(ct_pg_transport(g), "shm+tcp") || ls.shm_peers != want_shm || ls.tcp_peers != 2 - want_shm)
        rc = 2, report(c, "rank %d: %s, %d shm and %d tcp peers", c->rank, ct_pg_transport(g), ls.shm_peers, ls.tcp_peers);
    int world[3] = {0, 1, 2};
    if (!rc) rc = collectives_ok(c, g, world, 3);
    ct_pg_free(g);
    return rc;
}

Test(dist_mux, a_rank_alone_on_its_node_uses_tcp_only, .timeout = 60)
{
    rank_result res[3];
    run_ranks(3, three_nodes_main, NULL, res, 45);
    expect_all_ok(res, 3);
    expect_no_names(&res[0]);
}

/* Every rank on its own node: pure TCP, as before. */
static int apart_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    char id[16];
    snprintf(id, sizeof id, "n%d", c->rank);
    setenv("CTRAIN_NODE_ID", id, 1);
    ct_pg *g = rank_pg(c, 15, NULL);
    if (!g) return 1;
    ct_pg_link_stats ls;
    ct_pg_link_stats_get(g, &ls);
    int rc = 0;
    if (strcmp(ct_pg_transport(g), "tcp") || ls.shm_peers || ls.tcp_peers != 2)
        rc = 2, report(c, "rank %d: %s, %d shm and %d tcp peers", c->rank, ct_pg_transport(g), ls.shm_peers, ls.tcp_peers);
    ct_pg_free(g);
    return rc;
}

Test(dist_mux, ranks_on_separate_nodes_use_tcp, .timeout = 30)
{
    rank_result res[3];
    run_ranks(3, apart_main, NULL, res, 20);
    expect_all_ok(res, 3);
}

static int forced_shm_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    play_node(c->rank);
    ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = "shm"});
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (c->rank == 0) sleep_ms(500); /* its store serves the others' reads */
    if (g || ct_last_status() != CT_ERR_INVALID || !strstr(ct_last_error(), "rank(s) 2, 3 run on another node"))
        return report(c, "rank %d: %s", c->rank, g ? "shm across nodes worked" : ct_last_error()), 1;
    return 0;
}

Test(dist_mux, shm_forced_across_nodes_names_the_ranks, .timeout = 30)
{
    rank_result res[4];
    run_ranks(4, forced_shm_main, NULL, res, 20);
    expect_all_ok(res, 4);
    expect_no_names(&res[0]);
}

/* Rank 3 (node "b") dies after the group formed: the others' allreduce fails naming
 * it with its node. */
static int killed_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    play_node(c->rank);
    ct_pg *g = rank_pg(c, 10, NULL);
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!g) return 1;
    ct_status st = wait_free(ct_pg_barrier(g));
    if (c->rank == 3) {
        sleep_ms(50); /* its last barrier message leaves before it dies (a loaded machine may be slower) */
        raise(SIGKILL);
    }
    char host[256], want[400];
    if (gethostname(host, sizeof host)) return 3;
    host[sizeof host - 1] = '\0';
    for (char *h = host; *h; h++)
        if (*h == ' ' || *h == '\t') *h = '_';
    snprintf(want, sizeof want, "[at 127.0.0.1, host %s]", host);
    int rc = 0;
    CT_FRAME {
        if (!st) {
            sleep_ms(200);
            ct_tensor *t = vec(1000, c->rank, 0, 0);
            st = wait_free(ct_pg_allreduce(g, t, CT_REDUCE_SUM));
        }
        /* else the barrier itself already saw rank 3 go: its error must name it the same way */
        const char *e = ct_last_error();
        if (st != CT_ERR_PEER || !strstr(e, "rank 3") || !strstr(e, want))
            rc = 4, report(c, "rank %d: status %d, want %s: %s", c->rank, (int)st, want, e);
        else report(c, "rank %d: %s", c->rank, e);
    }
    ct_pg_free(g);
    return rc;
}

Test(dist_mux, a_killed_peer_is_named_with_its_node, .timeout = 30)
{
    rank_result res[4];
    run_ranks(4, killed_main, NULL, res, 25);
    cr_expect(WIFSIGNALED(res[3].status) && WTERMSIG(res[3].status) == SIGKILL, "rank 3: status 0x%x\n%s",
              res[3].status, res[3].msg);
    expect_all_ok(res, 3);
    expect_no_names(&res[0]);
}

/* ---- CTRAIN_PORT_RANGE ------------------------------------------------------------------------ */

/* A port range of 16 free ports (each bound and released just now). */
static int free_range(void)
{
    for (int tries = 0; tries < 50; tries++) {
        int lo = 20000 + (int)((getpid() * 7919u + (unsigned)tries * 104729u) % 30000u);
        bool ok = true;
        for (int p = lo; p < lo + 16 && ok; p++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
            ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
            if (fd >= 0) close(fd);
        }
        if (ok) return lo;
    }
    return -1;
}

static int range_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    int lo = *(int *)c->arg;
    char v[32];
    snprintf(v, sizeof v, "%d-%d", lo, lo + 15);
    setenv("CTRAIN_PORT_RANGE", v, 1);
    ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = "tcp"});
    if (!g) return 1;
    int rc = 0;
    for (int q = 0; c->rank == 0 && q < c->world; q++) {
        char key[64], ip[64];
        void *a = NULL;
        size_t n;
        int port = -1;
        snprintf(key, sizeof key, "ct/pg/1/addr/%d", q);
        if (ct_store_get(c->store, key, 5, &a, &n) || sscanf(a, "%63s %d", ip, &port) != 2 || port < lo ||
            port > lo + 15)
            rc = 2, report(c, "rank %d listens on port %d, outside %s", q, port, v);
        free(a);
    }
    if (wait_free(ct_pg_barrier(g))) rc = 3, report(c, "barrier: %s", ct_last_error());
    ct_pg_free(g);
    return rc;
}

Test(dist_mux, the_port_range_is_honoured, .timeout = 30)
{
    int lo = free_range();
    cr_assert(lo > 0, "no 16 free ports found");
    rank_result res[3];
    run_ranks(3, range_main, &lo, res, 20);
    expect_all_ok(res, 3);
}

Test(dist_mux, bad_port_ranges_are_refused, .timeout = 10)
{
    const char *bad[] = {"abc", "100", "100-", "-100", "200-100", "0-10", "1-70000", "10-20x", " 10-20"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("CTRAIN_PORT_RANGE", bad[i], 1);
        ct_pg *g = ct_pg_new(&(ct_pg_config){.world_size = 2, .rank = 1, .master_port = 1, .timeout_s = 1});
        char want[64];
        snprintf(want, sizeof want, "CTRAIN_PORT_RANGE='%s' is not LO-HI", bad[i]);
        cr_expect_null(g, "'%s' was accepted", bad[i]);
        cr_expect_eq(ct_last_status(), CT_ERR_INVALID, "'%s': %s", bad[i], ct_last_error());
        cr_expect(strstr(ct_last_error(), want), "'%s': %s", bad[i], ct_last_error());
        ct_pg_free(g);
    }
    unsetenv("CTRAIN_PORT_RANGE");
}

/* A range of one port that something else holds: every rank fails naming the range. */
static int taken_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    int port = *(int *)c->arg;
    char v[32];
    snprintf(v, sizeof v, "%d-%d", port, port);
    setenv("CTRAIN_PORT_RANGE", v, 1);
    ct_pg *g = rank_pg(c, 5, &(ct_pg_config){.transport = "tcp"});
    char want[96];
    snprintf(want, sizeof want, "no free port in CTRAIN_PORT_RANGE=%s (1 port(s)", v);
    if (c->rank == 0) sleep_ms(500); /* its store serves the others' reads */
    if (g || !strstr(ct_last_error(), want)) return report(c, "rank %d: %s", c->rank, g ? "got a group" : ct_last_error()), 1;
    return 0;
}

Test(dist_mux, an_exhausted_port_range_is_an_error, .timeout = 30)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    int port = ntohs(a.sin_port);
    rank_result res[2];
    run_ranks(2, taken_main, &port, res, 20);
    close(fd);
    expect_all_ok(res, 2);
}

/* ---- a rank killed during the setup ----------------------------------------------------------- */

/* Ranks 0 and 1 on node "a", rank 2 on "b". Rank 1 plays the setup by hand
 * (docs/maintainers/comm.md): publishes its entry and address, connects to rank 0 with
 * the hello, creates its ring for rank 0 and is killed before it says so. Rank 0 fails
 * naming it and removes both directions' names; rank 2 (TCP only) fails too. */
static int midway_main(rank_ctx *c)
{
    if (c->rank != 1) {
        ct_set_num_threads(1);
        setenv("CTRAIN_NODE_ID", c->rank == 0 ? "a" : "b", 1);
        ct_pg *g = rank_pg(c, 5, NULL);
        char job[17];
        if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
        if (c->rank == 0) sleep_ms(300); /* its store serves rank 2's reads */
        if (g) return report(c, "rank %d: got a group", c->rank), 1;
        if (c->rank == 0 && (ct_last_status() != CT_ERR_PEER ||
                             !strstr(ct_last_error(), "rank 1 closed its connection during the shared-memory setup")))
            return report(c, "rank 0: %s", ct_last_error()), 2;
        return 0;
    }
    ct_store *s = ct_store_new(&(ct_store_config){.port = c->port, .world_size = 3, .rank = 1, .timeout_s = 10});
    if (!s) return report(c, "store: %s", ct_last_error()), 10;
    int64_t gen;
    char *addr = NULL, *entry = NULL, ip[64], job[17], host[256], mine[400];
    void *nonce = NULL;
    size_t n;
    int port, fd = -1, lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof me;
    bool ok = lfd >= 0 && bind(lfd, (struct sockaddr *)&me, sizeof me) == 0 && listen(lfd, 4) == 0 &&
              getsockname(lfd, (struct sockaddr *)&me, &len) == 0 && !ct_store_add(s, "ct/pg/gen/1", 1, &gen) &&
              gen == 1 && !ct_store_get(s, "ct/pg/1/host/0", 10, (void **)&entry, &n) &&
              sscanf(entry, "%*s %16s %*s %255s", job, host) == 2;
    if (ok) snprintf(mine, sizeof mine, "auto 0000000000000000 id=a %s", host);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1 %d", ntohs(me.sin_port));
    ok = ok && !ct_store_set(s, "ct/pg/1/host/1", mine, strlen(mine)) &&
         !ct_store_get(s, "ct/pg/1/nonce", 10, &nonce, &n) && n == 8 &&
         !ct_store_set(s, "ct/pg/1/addr/1", where, strlen(where)) &&
         !ct_store_get(s, "ct/pg/1/addr/0", 10, (void **)&addr, &n) && sscanf(addr, "%63s %d", ip, &port) == 2;
    ok = ok && (fd = hello_connect(ip, port, 1, 3, nonce)) >= 0;
    char name[96];
    snprintf(name, sizeof name, "/ctrain-%s-1-0", job);
    int sfd = ok ? shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600) : -1;
    free(addr);
    free(entry);
    free(nonce);
    if (sfd < 0 || ftruncate(sfd, 1 << 16)) return report(c, "rank 1: could not play its part"), 11;
    sleep_ms(150); /* rank 0 is in the first round by now (or soon); rank 2's connection waits in the backlog */
    raise(SIGKILL);
    return 12;
}

Test(dist_mux, a_rank_killed_during_the_setup_leaves_nothing, .timeout = 30)
{
    rank_result res[3];
    run_ranks(3, midway_main, NULL, res, 20);
    cr_expect(WIFSIGNALED(res[1].status) && WTERMSIG(res[1].status) == SIGKILL, "rank 1: status 0x%x\n%s",
              res[1].status, res[1].msg);
    expect_all_ok(res, 1);
    cr_expect(WIFEXITED(res[2].status) && res[2].rc == 0, "rank 2 (rc %d):\n%s", res[2].rc, res[2].msg);
    expect_no_names(&res[0]);
}

/* Node "a"'s segments cannot be made (a name rank 0 needs is taken): ranks 0 and 1 fall
 * back to TCP for every peer, node "b" keeps its rings, and every pair still agrees. */
static int fallback_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    play_node(c->rank);
    char job[17] = "", name[96] = "";
    if (c->rank == 1) {
        /* rank 0 published its entry and waits for rank 1's connection: plant the name first */
        ct_store *s = ct_store_new(&(ct_store_config){.port = c->port, .world_size = 4, .rank = 1, .timeout_s = 10});
        char *entry = NULL;
        size_t n;
        bool ok = s && !ct_store_get(s, "ct/pg/1/host/0", 10, (void **)&entry, &n) &&
                  sscanf(entry, "%*s %16s", job) == 1;
        free(entry);
        ct_store_free(s);
        snprintf(name, sizeof name, "/ctrain-%s-0-1", job);
        int fd = ok ? shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600) : -1;
        if (fd < 0) return report(c, "rank 1: could not plant %s", name), 1;
        close(fd);
    }
    ct_pg *g = rank_pg(c, 15, NULL);
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!g) return 2;
    const char *want = c->rank < 2 ? "tcp" : "shm+tcp";
    int rc = 0;
    if (strcmp(ct_pg_transport(g), want)) rc = 3, report(c, "rank %d: transport %s, want %s", c->rank, ct_pg_transport(g), want);
    int world[4] = {0, 1, 2, 3};
    if (!rc) rc = collectives_ok(c, g, world, 7);
    ct_pg_free(g);
    return rc;
}

Test(dist_mux, a_node_whose_segments_fail_falls_back_to_tcp, .timeout = 60)
{
    rank_result res[4];
    run_ranks(4, fallback_main, NULL, res, 45);
    expect_all_ok(res, 4);
    expect_no_names(&res[0]);
}

/* Without CTRAIN_NODE_ID a rank's node is its boot id and network namespace (and host
 * name): the entry rank 0 publishes carries both, as /proc says. */
static int identity_main(rank_ctx *c)
{
    ct_set_num_threads(1);
    unsetenv("CTRAIN_NODE_ID");
    ct_pg *g = rank_pg(c, 10, NULL);
    if (!g) return 1;
    int rc = 0;
    if (c->rank == 0) {
        char boot[64] = "", want[160], node[160] = "", host[256] = "", mine[256] = "";
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        if (!f || !fgets(boot, sizeof boot, f)) rc = 2;
        if (f) fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
        struct stat ns;
        if (stat("/proc/self/ns/net", &ns)) rc = 3;
        snprintf(want, sizeof want, "%s/%llx:%llx", boot, (unsigned long long)ns.st_dev, (unsigned long long)ns.st_ino);
        void *v = NULL;
        size_t n;
        if (ct_store_get(c->store, "ct/pg/1/host/0", 5, &v, &n) || sscanf(v, "%*s %*s %159s %255s", node, host) != 2)
            rc = 4;
        free(v);
        gethostname(mine, sizeof mine - 1);
        if (!rc && (strcmp(node, want) || strcmp(host, mine)))
            rc = 5, report(c, "rank 0 published node '%s' host '%s', want '%s' '%s'", node, host, want, mine);
        if (strcmp(ct_pg_transport(g), "shm")) rc = 6, report(c, "transport %s", ct_pg_transport(g));
    }
    if (wait_free(ct_pg_barrier(g))) rc = 7, report(c, "barrier: %s", ct_last_error());
    ct_pg_free(g);
    return rc;
}

Test(dist_mux, the_node_is_boot_id_and_network_namespace, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, identity_main, NULL, res, 20);
    expect_all_ok(res, 2);
}
