/* Tests for the shared-memory transport and the transport choice (dist/shm.c,
 * dist/shm_setup.c, the selection in dist/pg.c): "auto" picks shm on one host and tcp
 * when a rank runs under another host name; "shm" forced, bad names and ranks that
 * disagree fail on every rank; a 64 MiB allreduce; rings of odd sizes that wrap
 * inside headers and payloads; a killed peer; a rank killed in the middle of the
 * setup. Every test checks that no /dev/shm/ctrain-<job>-* name is left (the job id
 * is read from rank 0's entry in the store, ct/pg/<generation>/host/0). The
 * collectives and failure tests of test_collectives.c and test_pg.c also run over
 * shm with CTRAIN_TRANSPORT=shm. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "core/frame.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "ranks.h"
#include "shm_names.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static ct_tensor *f32_vec(int64_t n, int rank)
{
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_F32, 1, (int64_t[]){n});
    float *p = ct_tensor_data(t);
    for (int64_t i = 0; i < n; i++) p[i] = (float)((i * 7 + rank * 3) % 1024);
    return t;
}

/* The sum of f32_vec over the world ranks sub[0 .. nsub-1] (NULL: every rank), checked
 * element by element (exact: integers < 2^24). */
static bool f32_sum_ok(rank_ctx *c, const ct_tensor *t, int64_t n, const int *sub, int nsub)
{
    const float *p = ct_tensor_data((ct_tensor *)t);
    for (int64_t i = 0; i < n; i++) {
        double want = 0;
        for (int k = 0; k < (sub ? nsub : c->world); k++) want += (double)((i * 7 + (sub ? sub[k] : k) * 3) % 1024);
        if (p[i] != (float)want) {
            report(c, "rank %d: element %lld is %g, want %g", c->rank, (long long)i, p[i], want);
            return false;
        }
    }
    return true;
}

static bool allreduce_ok(rank_ctx *c, ct_pg *g, int64_t n, const int *sub, int nsub)
{
    bool ok = false;
    CT_FRAME {
        ct_tensor *t = f32_vec(n, c->rank);
        ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
        ct_status st = ct_work_wait(w);
        ct_work_free(w);
        if (st) report(c, "rank %d: allreduce of %lld: %s", c->rank, (long long)n, ct_last_error());
        ok = !st && f32_sum_ok(c, t, n, sub, nsub);
    }
    return ok;
}

/* ---- the choice --------------------------------------------------------------------------- */

/* arg: the transport asked for (NULL: unset, the environment says nothing either) and
 * the one expected. */
typedef struct choice {
    const char *ask, *env, *want;
} choice;

static int choice_main(rank_ctx *c)
{
    const choice *ch = c->arg;
    if (ch->env) setenv("CTRAIN_TRANSPORT", ch->env, 1);
    else unsetenv("CTRAIN_TRANSPORT");
    ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = ch->ask});
    char job[17] = "";
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!g) return 1;
    int rc = 0;
    const char *got = ct_pg_transport(g);
    if (strcmp(got, ch->want)) rc = 2, report(c, "rank %d: transport %s, want %s", c->rank, got, ch->want);
    /* with shm: one ring each way per peer and every rank's direct-allreduce slot,
     * mapped, their names already gone */
    int maps = unlinked_maps(), want_maps = strcmp(ch->want, "shm") ? 0 : 2 * (c->world - 1) + c->world;
    if (maps != want_maps)
        rc = 3, report(c, "rank %d: %d unlinked shared-memory mappings, want %d", c->rank, maps, want_maps);
    if (c->rank == 0 && (!job[0] || shm_names(job))) rc = 4, report(c, "rank 0: /dev/shm/ctrain-%s-* still named", job);
    /* a sub-group shares its parent's transport */
    int members[2] = {c->world - 1, 0};
    ct_pg *sub = ct_pg_new_subgroup(g, members, 2);
    if (sub && strcmp(ct_pg_transport(sub), got)) rc = 5, report(c, "sub-group: %s", ct_pg_transport(sub));
    if (!sub && (c->rank == 0 || c->rank == c->world - 1)) rc = 6, report(c, "sub-group: %s", ct_last_error());
    if (!allreduce_ok(c, g, 1021, NULL, 0) || (sub && !allreduce_ok(c, sub, 70000, members, 2))) rc = 7;
    ct_pg_free(sub);
    ct_pg_free(g);
    return rc;
}

static void run_choice(int n, const char *ask, const char *env, const char *want)
{
    choice ch = {ask, env, want};
    rank_result res[MAX_RANKS];
    run_ranks(n, choice_main, &ch, res, 20);
    expect_all_ok(res, n);
    expect_no_names(res);
}

Test(dist_shm, auto_picks_shm_on_one_host, .timeout = 30)
{
    run_choice(3, NULL, NULL, "shm");
    run_choice(2, "auto", "tcp", "shm"); /* the config wins over the environment */
}

Test(dist_shm, shm_and_tcp_can_be_forced, .timeout = 30)
{
    run_choice(2, "shm", NULL, "shm");
    run_choice(2, NULL, "shm", "shm");
    run_choice(3, "tcp", NULL, "tcp");
    run_choice(2, NULL, "tcp", "tcp");
}

Test(dist_shm, bad_transport_names_are_errors, .timeout = 10)
{
    cr_expect_null(ct_pg_new(&(ct_pg_config){.world_size = 2, .transport = "shmem"}));
    cr_expect_eq(ct_last_status(), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "transport 'shmem' is unknown; use \"auto\", \"tcp\" or \"shm\""), "%s",
              ct_last_error());
    setenv("CTRAIN_TRANSPORT", "infiniband", 1);
    cr_expect_null(ct_pg_new(&(ct_pg_config){.world_size = 2}));
    cr_expect_eq(ct_last_status(), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "'infiniband' (from CTRAIN_TRANSPORT) is unknown"), "%s", ct_last_error());
    /* a world of one checks the name too, and uses no transport */
    cr_expect_null(ct_pg_new(NULL));
    cr_expect(strstr(ct_last_error(), "infiniband"), "%s", ct_last_error());
    unsetenv("CTRAIN_TRANSPORT");
    ct_pg *g = ct_pg_new(&(ct_pg_config){.transport = "shm"});
    cr_expect_not_null(g, "%s", ct_last_error());
    cr_expect_str_eq(ct_pg_transport(g), "none");
    cr_expect_null(ct_pg_transport(NULL));
    ct_pg_free(g);
}

/* Rank 0 asks for shm, the others for tcp: every rank fails, naming them. */
static int disagree_main(rank_ctx *c)
{
    double t0 = now_s();
    ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = c->rank == 0 ? "shm" : "tcp"});
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (c->rank == 0) sleep_ms(500); /* its store serves the others' entries: stay until they read them */
    const char *want = c->world == 3 ? "rank(s) 1, 2 asked for \"tcp\"" : "rank(s) 1 asked for \"tcp\"";
    if (g || ct_last_status() != CT_ERR_INVALID || !strstr(ct_last_error(), want) || now_s() - t0 > 5)
        return report(c, "rank %d: %p after %.2f s: %s", c->rank, (void *)g, now_s() - t0, ct_last_error()), 1;
    return 0;
}

Test(dist_shm, ranks_that_disagree_all_fail, .timeout = 30)
{
    rank_result res[3];
    run_ranks(3, disagree_main, NULL, res, 20);
    expect_all_ok(res, 3);
    expect_no_names(res);
}

/* Rank 1 runs under another host name (a UTS namespace of its own, where the system
 * allows one): "auto" falls back to tcp, "shm" fails on both ranks naming rank 1. */
static int elsewhere_main(rank_ctx *c)
{
    const char *ask = c->arg;
    if (c->rank == 1) {
        const char *name = "ctrain-test-elsewhere";
        if (unshare(CLONE_NEWUSER | CLONE_NEWUTS) || sethostname(name, strlen(name))) {
            report(c, "skip: no UTS namespace here");
            _exit(0); /* rank 0 times out in ct_pg_new; the test is skipped */
        }
    }
    ct_pg *g = rank_pg(c, c->rank == 0 ? 5 : 10, &(ct_pg_config){.transport = ask});
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!strcmp(ask, "shm")) {
        if (c->rank == 0) sleep_ms(500); /* its store serves rank 1's reads */
        if (g || !strstr(ct_last_error(), "rank(s) 1 run on another host (rank 1 on 'ctrain-test-elsewhere'"))
            return report(c, "rank %d: %s", c->rank, g ? "shm across hosts worked" : ct_last_error()), 1;
        return 0;
    }
    if (!g) return 1;
    int rc = strcmp(ct_pg_transport(g), "tcp") ? 2 : 0;
    if (rc) report(c, "rank %d: transport %s", c->rank, ct_pg_transport(g));
    if (!allreduce_ok(c, g, 100000, NULL, 0)) rc = 3;
    ct_pg_free(g);
    return rc;
}

static void run_elsewhere(const char *ask)
{
    rank_result res[2];
    run_ranks(2, elsewhere_main, (void *)ask, res, 20);
    if (strstr(res[1].msg, "skip:")) cr_skip_test("unshare(CLONE_NEWUSER | CLONE_NEWUTS) is not allowed here");
    expect_all_ok(res, 2);
    expect_no_names(res);
}

Test(dist_shm, auto_uses_tcp_across_hosts, .timeout = 30) { run_elsewhere("auto"); }

Test(dist_shm, shm_across_hosts_is_an_error, .timeout = 30) { run_elsewhere("shm"); }

/* ---- data ------------------------------------------------------------------------------------ */

static int big_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 30, &(ct_pg_config){.transport = "shm"});
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!g) return 1;
    double t0 = now_s();
    int rc = allreduce_ok(c, g, 16 << 20, NULL, 0) ? 0 : 2;
    report(c, "rank %d: 64 MiB allreduce in %.3f s (checked)", c->rank, now_s() - t0);
    ct_pg_free(g);
    return rc;
}

Test(dist_shm, allreduce_of_64_mib, .timeout = 60)
{
    rank_result res[2];
    run_ranks(2, big_main, NULL, res, 55);
    expect_all_ok(res, 2);
    expect_no_names(res);
}

/* Rings of odd sizes (67 bytes: smaller than one header and its payload; 4099: a
 * prime number of bytes) with odd chunk and message sizes, so that headers and
 * payloads are cut by the ring's edge at ever different places; messages in both
 * directions at once, all in flight together. */
static const int64_t odd_sizes[] = {1, 3, 55, 57, 1021, 4097, 8191, 65537, 300007};
#define NODD ((int)(sizeof odd_sizes / sizeof odd_sizes[0]))

static uint8_t pattern(int src, int k, int64_t i) { return (uint8_t)(i * 31 + k * 17 + src * 101 + (i >> 8)); }

static int wrap_main(rank_ctx *c)
{
    setenv("CTRAIN_SHM_RING_BYTES", c->arg, 1);
    ct_pg *g = rank_pg(c, 20, &(ct_pg_config){.transport = "shm", .chunk_bytes = 1001, .ring_min_bytes = 1});
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!g) return 1;
    int rc = 0, other = 1 - c->rank;
    CT_FRAME {
        ct_work *w[2 * NODD + 1];
        ct_tensor *in[NODD], *out[NODD];
        for (int k = 0; k < NODD; k++) {
            in[k] = ct_tensor_empty(CT_DTYPE_U8, 1, (int64_t[]){odd_sizes[k]});
            out[k] = ct_tensor_zeros(CT_DTYPE_U8, 1, (int64_t[]){odd_sizes[k]});
            uint8_t *p = ct_tensor_data(in[k]);
            for (int64_t i = 0; i < odd_sizes[k]; i++) p[i] = pattern(c->rank, k, i);
        }
        /* half the receives before the sends, half after */
        for (int k = 0; k < NODD; k += 2) w[k] = ct_pg_recv(g, out[k], other, k);
        for (int k = 0; k < NODD; k++) w[NODD + k] = ct_pg_send(g, in[k], other, k);
        for (int k = 1; k < NODD; k += 2) w[k] = ct_pg_recv(g, out[k], other, k);
        ct_tensor *t = f32_vec(65537, c->rank); /* the ring algorithm, in 1001-byte chunks */
        w[2 * NODD] = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
        for (int k = 0; k < 2 * NODD + 1; k++) {
            if (ct_work_wait(w[k])) rc = 2, report(c, "rank %d: work %d: %s", c->rank, k, ct_last_error());
            ct_work_free(w[k]);
        }
        for (int k = 0; k < NODD && !rc; k++) {
            const uint8_t *p = ct_tensor_data(out[k]);
            for (int64_t i = 0; i < odd_sizes[k]; i++)
                if (p[i] != pattern(other, k, i)) {
                    rc = 3, report(c, "rank %d: message %d (%lld bytes): byte %lld is %d, want %d", c->rank, k,
                                   (long long)odd_sizes[k], (long long)i, p[i], pattern(other, k, i));
                    break;
                }
        }
        if (!rc && !f32_sum_ok(c, t, 65537, NULL, 0)) rc = 4;
    }
    ct_pg_free(g);
    return rc;
}

Test(dist_shm, rings_wrap_inside_headers_and_payloads, .timeout = 60)
{
    const char *rings[] = {"67", "4099"};
    for (int i = 0; i < 2; i++) {
        rank_result res[2];
        run_ranks(2, wrap_main, (void *)rings[i], res, 50);
        expect_all_ok(res, 2);
        expect_no_names(res);
    }
}

Test(dist_shm, a_bad_ring_size_is_an_error, .timeout = 10)
{
    rank_result res[2];
    run_ranks(2, wrap_main, "12", res, 8);
    /* rank 0 (it serves the store) always reports its own bad value; rank 1 does too,
     * unless rank 0 had already failed and closed the store, which it then names */
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(res[r].rc, 1, "rank %d:\n%s", r, res[r].msg);
        bool own = strstr(res[r].msg, "CTRAIN_SHM_RING_BYTES='12' is not a number of bytes in 64 ..") != NULL;
        bool master_gone = r == 1 && strstr(res[r].msg, "lost the connection to the master") != NULL;
        cr_expect(own || master_gone, "rank %d:\n%s", r, res[r].msg);
    }
    expect_no_names(res);
}

/* ---- failures --------------------------------------------------------------------------------- */

/* Rank 2 dies in the middle of 1 MiB allreduces; the others fail within seconds, naming it. */
static int killed_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 60, &(ct_pg_config){.transport = "shm"});
    char job[17];
    if (c->rank == 0 && job_of(c, 1, job)) report(c, "job %s", job);
    if (!g) return 1;
    int rc = 4;
    double t_death = 0;
    CT_FRAME {
        ct_tensor *t = f32_vec(1 << 18, c->rank);
        for (int it = 0; it < 100000; it++) {
            if (c->rank == 2 && it == 3) raise(SIGKILL);
            if (it == 2) t_death = now_s();
            ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
            ct_status st = ct_work_wait(w);
            ct_work_free(w);
            if (!st) continue;
            double took = now_s() - t_death;
            const char *e = ct_last_error();
            rc = st == CT_ERR_PEER && strstr(e, "rank 2") && strstr(e, "did the process exit or crash?") && it >= 2 &&
                         took < 5
                     ? 0
                     : 2;
            report(c, "rank %d: iteration %d, %.2f s after iteration 2 began: %s", c->rank, it, took,
                   ct_last_error());
            break;
        }
    }
    ct_pg_free(g);
    return rc;
}

Test(dist_shm, a_killed_peer_is_detected, .timeout = 30)
{
    rank_result res[3];
    run_ranks(3, killed_main, NULL, res, 25);
    cr_expect(WIFSIGNALED(res[2].status) && WTERMSIG(res[2].status) == SIGKILL, "rank 2: status 0x%x", res[2].status);
    expect_all_ok(res, 2);
    expect_no_names(res);
}

/* Rank 1 plays the setup by hand (docs/maintainers/comm.md): publishes its entry,
 * connects with the TCP hello, creates its segment for rank 0, and is killed before
 * it says so. Rank 0 must fail naming it, and remove both directions' names. */
static int midway_main(rank_ctx *c)
{
    if (c->rank == 0) {
        ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = "shm"});
        char job[17];
        if (job_of(c, 1, job)) report(c, "job %s", job);
        if (g || ct_last_status() != CT_ERR_PEER ||
            !strstr(ct_last_error(), "rank 1 closed its connection during the shared-memory setup"))
            return report(c, "rank 0: %p: %s", (void *)g, ct_last_error()), 1;
        return 0;
    }
    ct_store *s = ct_store_new(&(ct_store_config){.port = c->port, .world_size = 2, .rank = 1, .timeout_s = 10});
    if (!s) return report(c, "store: %s", ct_last_error()), 10;
    int64_t gen;
    char *addr = NULL, *entry = NULL, ip[64], job[17];
    void *nonce = NULL;
    size_t n;
    int port, fd = -1;
    char boot[64], host[256], mine[400];
    /* the same host as rank 0: its boot id and host name */
    bool ok = !ct_store_add(s, "ct/pg/gen/1", 1, &gen) && gen == 1 &&
              !ct_store_get(s, "ct/pg/1/host/0", 10, (void **)&entry, &n) &&
              sscanf(entry, "%*s %16s %63s %255s", job, boot, host) == 3;
    if (ok) snprintf(mine, sizeof mine, "shm 0000000000000000 %s %s", boot, host);
    ok = ok && !ct_store_set(s, "ct/pg/1/host/1", mine, strlen(mine)) &&
         !ct_store_get(s, "ct/pg/1/nonce", 10, &nonce, &n) && n == 8 &&
         !ct_store_get(s, "ct/pg/1/addr/0", 10, (void **)&addr, &n) && sscanf(addr, "%63s %d", ip, &port) == 2;
    ok = ok && (fd = hello_connect(ip, port, 1, 2, nonce)) >= 0;
    char name[96];
    snprintf(name, sizeof name, "/ctrain-%s-1-0", job);
    int sfd = ok ? shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600) : -1;
    free(addr);
    free(entry);
    free(nonce);
    if (sfd < 0 || ftruncate(sfd, 1 << 16)) return report(c, "rank 1: could not play its part"), 11;
    sleep_ms(100); /* rank 0 is in the first round by now (or soon) */
    raise(SIGKILL);
    return 12;
}

Test(dist_shm, a_rank_killed_during_the_setup_leaves_nothing, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, midway_main, NULL, res, 20);
    cr_expect(WIFSIGNALED(res[1].status) && WTERMSIG(res[1].status) == SIGKILL, "rank 1: status 0x%x\n%s",
              res[1].status, res[1].msg);
    expect_all_ok(res, 1);
    expect_no_names(res);
}
