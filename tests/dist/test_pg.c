/* Tests for process groups and the comm engine (dist/pg.c, dist/pg_submit.c,
 * dist/comm.c, dist/comm_group.c, dist/work.c, dist/tcp*.c): a world of one without
 * sockets, argument errors, sub-groups running at once, desyncs reported on every
 * rank with both sides named, a killed peer, a peer that never calls (timeouts and
 * probes), a freed group with work pending and a peer that freed the group.
 * Malformed frames are in tests/dist/test_tcp.c. Multi-rank tests fork ranks
 * (tests/dist/ranks.h); every test has a timeout. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "ranks.h"

static void expect_error(ct_status st, ct_status want, const char *frag)
{
    cr_expect_eq(st, want, "status %d (%s), want %d", st, ct_last_error(), want);
    if (frag) cr_expect(strstr(ct_last_error(), frag), "'%s' not in: %s", frag, ct_last_error());
}

/* Checks a failed submit (NULL) and its message. */
static void expect_null(ct_work *w, ct_status want, const char *frag)
{
    cr_expect_null(w, "the submit should have failed");
    ct_work_free(w);
    expect_error(ct_last_status(), want, frag);
}

static int count_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    char path[300];
    struct stat st;
    while ((e = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) n++;
    }
    closedir(d);
    return n;
}

static ct_tensor *vec(ct_dtype dt, int64_t n, double base)
{
    ct_tensor *t = ct_tensor_empty(dt, 1, (int64_t[]){n});
    uint8_t *p = ct_tensor_data(t);
    for (int64_t i = 0; i < n; i++) ct_scalar_store(dt, p + i * ct_dtype_size(dt), base + (double)i);
    return t;
}

/* ---- one process ------------------------------------------------------------------------ */

Test(dist_pg, world_of_one_runs_in_place_without_sockets, .timeout = 10)
{
    const char *vars[] = {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                          "SLURM_NTASKS", "CTRAIN_TIMEOUT"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    int sockets = count_sockets();
    ct_pg *g = ct_pg_new(NULL); /* from the (empty) environment */
    cr_assert_not_null(g, "%s", ct_last_error());
    cr_expect_eq(ct_pg_rank(g), 0);
    cr_expect_eq(ct_pg_size(g), 1);
    CT_FRAME {
        ct_tensor *a = vec(CT_DTYPE_BF16, 5, 1.5), *b = ct_tensor_empty(CT_DTYPE_BF16, 1, (int64_t[]){5});
        ct_work *w = ct_pg_allreduce_out(g, b, a, CT_REDUCE_MEAN);
        bool done = false;
        cr_expect_eq(ct_work_test(w, &done), CT_OK);
        cr_expect(done, "a group of one completes at once");
        cr_expect_eq(ct_work_wait(w), CT_OK, "%s", ct_last_error());
        ct_work_free(w);
        cr_expect_eq(memcmp(ct_tensor_data(a), ct_tensor_data(b), 10), 0, "avg over one rank is the value");
        ct_tensor *o = ct_tensor_zeros(CT_DTYPE_I64, 1, (int64_t[]){3}), *in = vec(CT_DTYPE_I64, 3, -1);
        ct_work *ws[] = {ct_pg_allgather(g, o, in), ct_pg_barrier(g), ct_pg_broadcast(g, in, 0),
                         ct_pg_all_to_all(g, o, in), ct_pg_reduce(g, in, 0, CT_REDUCE_MAX)};
        for (int i = 0; i < 5; i++) {
            cr_expect_eq(ct_work_wait(ws[i]), CT_OK, "work %d: %s", i, ct_last_error());
            ct_work_free(ws[i]);
        }
        cr_expect_eq(((int64_t *)ct_tensor_data(o))[2], 1);
    }
    cr_expect_eq(count_sockets(), sockets, "a world of one opens no socket");
    ct_pg_free(g);
    ct_pg_free(NULL);
}

Test(dist_pg, bad_arguments_name_the_op_and_the_shapes, .timeout = 10)
{
    ct_pg *g = ct_pg_new(&(ct_pg_config){.world_size = 1});
    cr_assert_not_null(g, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *m = ct_tensor_zeros(CT_DTYPE_F32, 2, (int64_t[]){2, 3});
        ct_error_clear();
        expect_null(ct_pg_allreduce(g, NULL, CT_REDUCE_SUM), CT_ERR_INVALID, "allreduce: t is NULL");
        expect_null(ct_pg_allreduce(g, ct_tensor_transpose(m, 0, 1), CT_REDUCE_SUM), CT_ERR_INVALID,
                    "not contiguous");
        expect_null(ct_pg_allreduce(g, ct_tensor_zeros(CT_DTYPE_U8, 1, (int64_t[]){4}), CT_REDUCE_SUM),
                    CT_ERR_UNSUPPORTED, "u8[4]");
        expect_null(ct_pg_allreduce(g, m, (ct_reduce_op)7), CT_ERR_INVALID, "reduce op 7");
        expect_null(ct_pg_allreduce_out(g, ct_tensor_zeros(CT_DTYPE_F64, 1, (int64_t[]){6}), m, CT_REDUCE_SUM),
                    CT_ERR_INVALID, "f64[6]");
        cr_expect(strstr(ct_last_error(), "f32[2, 3]"), "%s", ct_last_error());
        expect_null(ct_pg_reduce_scatter(g, ct_tensor_zeros(CT_DTYPE_F32, 1, (int64_t[]){5}), m, CT_REDUCE_SUM),
                    CT_ERR_INVALID, "reduce_scatter: in is f32[2, 3] cpu and out is f32[5] cpu");
        expect_null(ct_pg_broadcast(g, m, 1), CT_ERR_INVALID, "root 1 is not a rank of the group (0 .. 0");
        expect_null(ct_pg_gather(g, NULL, m, -1), CT_ERR_INVALID, "root -1");
        expect_null(ct_pg_send(g, m, 0, 0), CT_ERR_INVALID, "cannot send to itself");
        expect_null(ct_pg_allreduce(NULL, m, CT_REDUCE_SUM), CT_ERR_INVALID, "NULL process group");
        expect_error(ct_work_wait(NULL), CT_ERR_INVALID, "NULL work");
        bool done;
        expect_error(ct_work_test(NULL, &done), CT_ERR_INVALID, NULL);
    }
    ct_pg_free(g);

    cr_expect_null(ct_pg_new(&(ct_pg_config){.rank = 2, .world_size = 2}));
    expect_error(ct_last_status(), CT_ERR_INVALID, "rank 2 of world size 2");
    cr_expect_null(ct_pg_new(&(ct_pg_config){.world_size = 2, .transport = "nccl"}));
    expect_error(ct_last_status(), CT_ERR_UNSUPPORTED, "'nccl' is not built yet");
    cr_expect_null(ct_pg_new(&(ct_pg_config){.transport = "carrier-pigeon"}));
    expect_error(ct_last_status(), CT_ERR_INVALID, "unknown");
    cr_expect_null(ct_pg_new(&(ct_pg_config){.chunk_bytes = 8}));
    expect_error(ct_last_status(), CT_ERR_INVALID, "chunk_bytes 8");
    setenv("CTRAIN_TIMEOUT", "soon", 1);
    cr_expect_null(ct_pg_new(&(ct_pg_config){0}));
    expect_error(ct_last_status(), CT_ERR_INVALID, "CTRAIN_TIMEOUT='soon'");
    unsetenv("CTRAIN_TIMEOUT");
    /* a sub-group's rank list is checked before anything is sent */
    g = ct_pg_new(&(ct_pg_config){0});
    cr_assert_not_null(g);
    cr_expect_null(ct_pg_new_subgroup(g, (int[]){0, 0}, 2));
    expect_error(ct_last_status(), CT_ERR_INVALID, "listed twice");
    cr_expect_null(ct_pg_new_subgroup(g, (int[]){1}, 1));
    expect_error(ct_last_status(), CT_ERR_INVALID, "ranks[0] = 1");
    ct_pg *self = ct_pg_new_subgroup(g, (int[]){0}, 1);
    cr_expect_not_null(self, "%s", ct_last_error());
    ct_pg_free(g); /* the parent first is fine */
    ct_pg_free(self);
}

Test(dist_pg, a_rank_that_never_starts_times_out_naming_it, .timeout = 15)
{
    ct_store *s = ct_store_new(&(ct_store_config){.serve = true, .world_size = 3, .timeout_s = 5});
    cr_assert_not_null(s, "%s", ct_last_error());
    double t0 = now_s();
    ct_pg *g = ct_pg_new(&(ct_pg_config){.rank = 0, .world_size = 3, .store = s, .timeout_s = 1});
    double took = now_s() - t0;
    cr_expect_null(g);
    expect_error(ct_last_status(), CT_ERR_TIMEOUT,
                 "ct_pg_new: rank 0 of 3: tcp: rank(s) 1, 2 did not connect within 1 s");
    cr_expect(took > 0.9 && took < 3, "gave up after %.2f s", took);
    ct_store_free(s);
}

/* ---- sub-groups ------------------------------------------------------------------------------ */

static bool wait_ok(rank_ctx *c, ct_work *w, const char *what)
{
    ct_status st = w ? ct_work_wait(w) : ct_last_status();
    if (st) report(c, "rank %d: %s: %s", c->rank, what, ct_last_error());
    ct_work_free(w);
    return st == CT_OK;
}

static int subgroups_main(rank_ctx *c)
{
    ct_pg *world = rank_pg(c, 20, NULL);
    if (!world) return 1;
    int r = c->rank, rc = 0;
    /* evens {0, 2} and odds listed as {3, 1}: group rank 0 of the odds is world rank 3 */
    ct_pg *even = ct_pg_new_subgroup(world, (int[]){0, 2}, 2);
    if (!even && (r % 2 == 0 || ct_last_status())) report(c, "rank %d: evens: %s", r, ct_last_error()), rc = 2;
    ct_pg *odd = ct_pg_new_subgroup(world, (int[]){3, 1}, 2);
    if (!odd && (r % 2 == 1 || ct_last_status())) report(c, "rank %d: odds: %s", r, ct_last_error()), rc = 3;
    ct_pg *solo = ct_pg_new_subgroup(world, (int[]){2}, 1);
    if ((solo != NULL) != (r == 2)) report(c, "rank %d: solo: %p %s", r, (void *)solo, ct_last_error()), rc = 4;
    if (rc) return rc;
    if ((r % 2 == 0 && (ct_pg_rank(even) != r / 2 || ct_pg_size(even) != 2)) ||
        (r % 2 == 1 && ct_pg_rank(odd) != (r == 3 ? 0 : 1)))
        return report(c, "rank %d: wrong sub-group rank", r), 5;
    ct_frame_push();
    int64_t n = 1021;
    ct_tensor *tw = vec(CT_DTYPE_F32, n, r), *ts = vec(r % 2 ? CT_DTYPE_I64 : CT_DTYPE_F64, n, 10 * r);
    ct_tensor *gathered = ct_tensor_zeros(CT_DTYPE_I64, 1, (int64_t[]){2 * n});
    /* a world collective and a sub-group's two, all in flight at once */
    ct_work *w1 = ct_pg_allreduce(world, tw, CT_REDUCE_SUM), *w2, *w3;
    if (r % 2 == 0) {
        w2 = ct_pg_allreduce(even, ts, CT_REDUCE_MAX);
        w3 = ct_pg_barrier(even);
    } else {
        w2 = ct_pg_allgather(odd, gathered, ts);
        w3 = ct_pg_broadcast(odd, ts, 0); /* from world rank 3 */
    }
    bool ok = wait_ok(c, w3, "sub-group second") & wait_ok(c, w2, "sub-group first") & wait_ok(c, w1, "world");
    for (int64_t i = 0; ok && i < n; i++) {
        double want_w = 4.0 * (double)i + 6; /* sum over r of r + i */
        double got_w = ((float *)ct_tensor_data(tw))[i];
        double want_s = r % 2 == 0 ? 20 + (double)i : 30 + (double)i; /* even: max(0, 20)+i; odd: rank 3's */
        double got_s = ct_scalar_load(ts->dtype, (uint8_t *)ct_tensor_data(ts) + i * 8);
        if (got_w != want_w || got_s != want_s) {
            report(c, "rank %d: element %lld: world %g (want %g), sub-group %g (want %g)", r, (long long)i, got_w,
                   want_w, got_s, want_s);
            ok = false;
        }
        if (r % 2 == 1) {
            int64_t *gv = ct_tensor_data(gathered);
            if (gv[i] != 30 + i || gv[n + i] != 10 + i) {
                report(c, "rank %d: allgather element %lld: %lld, %lld", r, (long long)i, (long long)gv[i],
                       (long long)gv[n + i]);
                ok = false;
            }
        }
    }
    ct_frame_pop();
    if (solo) ok &= wait_ok(c, ct_pg_barrier(solo), "solo barrier");
    ct_pg_free(solo);
    ct_pg_free(even);
    ct_pg_free(odd);
    /* after its sub-groups are gone the world still works, and new ones can be made */
    ct_pg *all = ct_pg_new_subgroup(world, (int[]){0, 1, 2, 3}, 4);
    if (!all) return report(c, "rank %d: again: %s", r, ct_last_error()), 6;
    ok &= wait_ok(c, ct_pg_barrier(all), "barrier of a new sub-group") & wait_ok(c, ct_pg_barrier(world), "world");
    /* a sub-group of that sub-group: its ranks 3 and 0 are world ranks 3 and 0 */
    ct_pg *nested = ct_pg_new_subgroup(all, (int[]){3, 0}, 2);
    if ((nested != NULL) != (r == 0 || r == 3)) return report(c, "rank %d: nested: %s", r, ct_last_error()), 8;
    if (nested) {
        ct_frame_push();
        ct_tensor *x = ct_tensor_full(CT_DTYPE_I32, 1, (int64_t[]){3}, r + 1);
        ok &= wait_ok(c, ct_pg_allreduce(nested, x, CT_REDUCE_SUM), "nested allreduce");
        if (((int32_t *)ct_tensor_data(x))[2] != 5) ok = false, report(c, "rank %d: nested sum %d", r,
                                                                         ((int32_t *)ct_tensor_data(x))[2]);
        ct_frame_pop();
        ct_pg_free(nested);
    }
    ct_pg_free(all);
    ct_pg_free(world);
    return ok ? 0 : 7;
}

Test(dist_pg, subgroups_run_collectives_at_once, .timeout = 30)
{
    rank_result res[4];
    run_ranks(4, subgroups_main, NULL, res, 25);
    expect_all_ok(res, 4);
}

/* A sub-group whose rank list differs between ranks is a desync on the parent. */
static int subgroup_mismatch_main(rank_ctx *c)
{
    ct_pg *world = rank_pg(c, 20, NULL);
    /* a slow rank may still be in its init when the others have found the desync and
     * failed the group: its init then reports that desync, which is the same outcome */
    if (!world) return ct_last_status() == CT_ERR_PEER && strstr(ct_last_error(), "new_subgroup #1") ? 0 : 1;
    ct_pg *s = ct_pg_new_subgroup(world, c->rank == 1 ? (int[]){0, 2} : (int[]){0, 1}, 2);
    int rc = 0;
    if (s || ct_last_status() != CT_ERR_PEER || !strstr(ct_last_error(), "new_subgroup #1"))
        rc = 2, report(c, "rank %d: %p %d %s", c->rank, (void *)s, ct_last_status(), ct_last_error());
    ct_pg_free(s);
    ct_pg_free(world);
    return rc;
}

Test(dist_pg, subgroup_lists_that_differ_are_a_desync, .timeout = 30)
{
    rank_result res[3];
    run_ranks(3, subgroup_mismatch_main, NULL, res, 25);
    expect_all_ok(res, 3);
}

/* ---- desync --------------------------------------------------------------------------------- */

typedef struct desync_case {
    const char *mine, *theirs; /* signatures the messages must contain */
} desync_case;

/* Each rank submits its collective (rank 2, or rank 1 with 2 ranks, the odd one out);
 * every rank must fail with CT_ERR_PEER naming both signatures, within a few seconds
 * (the timeout is 30 s), and later calls fail at once. */
static int desync_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 30, NULL);
    if (!g) return 1;
    int odd = c->world - 1, rc = 0;
    bool is_odd = c->rank == odd;
    const char *want_sig[2];
    ct_frame_push();
    ct_tensor *t = vec(CT_DTYPE_F32, is_odd && c->world == 3 ? 1024 : 1000, 1);
    ct_work *w;
    double t0 = now_s();
    if (c->world == 3) { /* counts differ */
        w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
        want_sig[0] = "allreduce(sum, f32, 1000)";
        want_sig[1] = "rank 2 called allreduce(sum, f32, 1024)";
    } else { /* ops differ */
        w = is_odd ? ct_pg_broadcast(g, t, 0) : ct_pg_allreduce(g, t, CT_REDUCE_SUM);
        want_sig[0] = "allreduce(sum, f32, 1000)";
        want_sig[1] = "broadcast(f32, 1000, root 0)";
    }
    ct_status st = ct_work_wait(w);
    ct_work_free(w);
    double took = now_s() - t0;
    report(c, "rank %d, after %.3f s: %s", c->rank, took, ct_last_error());
    if (st != CT_ERR_PEER || !strstr(ct_last_error(), "#1") || !strstr(ct_last_error(), want_sig[0]) ||
        !strstr(ct_last_error(), want_sig[1]) || took > 5)
        rc = 2, report(c, "rank %d: status %d after %.2f s: %s", c->rank, st, took, ct_last_error());
    t0 = now_s();
    w = ct_pg_barrier(g);
    st = ct_work_wait(w);
    ct_work_free(w);
    if (st != CT_ERR_PEER || !strstr(ct_last_error(), "barrier #2") || !strstr(ct_last_error(), want_sig[0]) ||
        now_s() - t0 > 1)
        rc = 3, report(c, "rank %d: later call: status %d: %s", c->rank, st, ct_last_error());
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_pg, different_counts_fail_every_rank_naming_both, .timeout = 30)
{
    rank_result res[3];
    run_ranks(3, desync_main, NULL, res, 25);
    expect_all_ok(res, 3);
}

Test(dist_pg, different_ops_fail_every_rank_naming_both, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, desync_main, NULL, res, 25);
    expect_all_ok(res, 2);
}

/* ---- a killed peer ----------------------------------------------------------------------------- */

static int killed_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 60, NULL);
    if (!g) return 1;
    int rc = 4;
    ct_frame_push();
    ct_tensor *t = vec(CT_DTYPE_F32, 1 << 16, 0);
    double t_death = 0;
    for (int it = 0; it < 100000; it++) {
        if (c->rank == 2 && it == 3) raise(SIGKILL);
        /* rank 2 dies once it has finished iteration 2, which the others may still be in */
        if (it == 2) t_death = now_s();
        ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
        ct_status st = ct_work_wait(w);
        ct_work_free(w);
        if (!st) continue;
        double took = now_s() - t_death;
        rc = st == CT_ERR_PEER && strstr(ct_last_error(), "rank 2") && it >= 2 && took < 5 ? 0 : 2;
        report(c, "rank %d: iteration %d, %.2f s after iteration 2 began: %s", c->rank, it, took, ct_last_error());
        /* broken for good: the next call fails at once */
        double t0 = now_s();
        w = ct_pg_barrier(g);
        if (ct_work_wait(w) != CT_ERR_PEER || now_s() - t0 > 1) rc = 3, report(c, "later: %s", ct_last_error());
        ct_work_free(w);
        break;
    }
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_pg, a_killed_peer_fails_the_others_naming_it, .timeout = 30)
{
    rank_result res[3];
    run_ranks(3, killed_main, NULL, res, 25);
    cr_expect(WIFSIGNALED(res[2].status) && WTERMSIG(res[2].status) == SIGKILL, "rank 2: status 0x%x", res[2].status);
    expect_all_ok(res, 2);
}

/* ---- timeouts ----------------------------------------------------------------------------------- */

static int silent_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 1, NULL);
    ct_pg *h = rank_pg(c, 1, NULL);
    if (!g || !h) return 1;
    int rc = 0;
    ct_frame_push();
    if (c->rank == 0) {
        ct_tensor *t = vec(CT_DTYPE_F32, 7, 0);
        /* timed from the submit: with shm (direct) the submit itself waits for rank 1 */
        double t0 = now_s();
        ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
        ct_status st = ct_work_wait(w);
        double took = now_s() - t0;
        ct_work_free(w);
        const char *e = ct_last_error();
        report(c, "after %.2f s: %s", took, e);
        if (st != CT_ERR_TIMEOUT || !strstr(e, "allreduce #1 (sum, f32, 7)") ||
            !strstr(e, "rank 1 (has not called it; its last collective is #0)") || took < 0.9 || took > 3)
            rc = 3, report(c, "after %.2f s, status %d: %s", took, st, e);
        /* a receive nobody sends to; a short wait gives up without harming it */
        w = ct_pg_recv(h, t, 1, 5);
        bool done = true;
        if (ct_work_wait_timeout(w, 0.2) != CT_ERR_TIMEOUT || ct_work_test(w, &done) || done)
            rc = 2, report(c, "wait_timeout: %s", ct_last_error());
        st = ct_work_wait(w);
        ct_work_free(w);
        if (st != CT_ERR_TIMEOUT || !strstr(ct_last_error(), "recv #1 from rank 1 (tag 5, f32, 7)"))
            rc = 4, report(c, "recv: status %d: %s", st, ct_last_error());
        ct_store_set(c->store, "test/done", "1", 1);
    } else {
        sleep_ms(1500); /* never calls; then finds its group broken by rank 0's timeout */
        ct_work *w = ct_pg_barrier(g);
        double t0 = now_s();
        ct_status st = ct_work_wait(w);
        ct_work_free(w);
        if (st != CT_ERR_TIMEOUT || !strstr(ct_last_error(), "allreduce #1") || now_s() - t0 > 1)
            rc = 5, report(c, "rank 1: status %d: %s", st, ct_last_error());
        /* stays (connected) until rank 0 is done with its receive */
        ct_store *s = ct_store_new(&(ct_store_config){.port = c->port, .world_size = 2, .rank = 1, .timeout_s = 10});
        void *v = NULL;
        size_t n;
        if (!s || ct_store_get(s, "test/done", 10, &v, &n)) rc = 6, report(c, "rank 1: store: %s", ct_last_error());
        free(v);
        ct_store_free(s);
    }
    ct_frame_pop();
    ct_pg_free(h);
    ct_pg_free(g);
    return rc;
}

Test(dist_pg, a_peer_that_never_calls_times_out_naming_it, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, silent_main, NULL, res, 25);
    expect_all_ok(res, 2);
}

/* Freeing a group fails its pending works: rank 0 frees a sub-group with a receive
 * pending (the world's connections stay up, so the failure is the free's own). Then
 * rank 1 frees the world group: rank 0's next collective fails at once, naming it. */
static int freed_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, NULL);
    if (!g) return 1;
    ct_pg *sub = ct_pg_new_subgroup(g, (int[]){1, 0}, 2);
    if (!sub) return report(c, "sub-group: %s", ct_last_error()), 2;
    int rc = 0;
    ct_frame_push();
    ct_tensor *t = vec(CT_DTYPE_F64, 3, 0);
    if (c->rank == 0) {
        ct_work *w = ct_pg_recv(sub, t, 0, 9); /* from world rank 1, who never sends */
        ct_pg_free(sub);
        if (ct_work_wait(w) != CT_ERR_INVALID || !strstr(ct_last_error(), "recv #1 from rank 0") ||
            !strstr(ct_last_error(), "freed"))
            rc = 3, report(c, "pending recv: %s", ct_last_error());
        ct_work_free(w);
    }
    ct_work *b = ct_pg_barrier(g);
    if (ct_work_wait(b)) rc = 4, report(c, "the world afterwards: %s", ct_last_error());
    ct_work_free(b);
    if (c->rank == 1) {
        ct_pg_free(sub);
        ct_pg_free(g);
        g = NULL;
        sleep_ms(300); /* stays alive a moment: rank 0 must see the goodbye, not a crash */
    } else {
        double t0 = now_s();
        ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
        ct_status st = ct_work_wait(w);
        ct_work_free(w);
        if (st != CT_ERR_PEER || !strstr(ct_last_error(), "rank 1") || !strstr(ct_last_error(), "freed the group") ||
            now_s() - t0 > 5)
            rc = 5, report(c, "after rank 1 left: status %d: %s", st, ct_last_error());
    }
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_pg, freeing_a_group_fails_its_pending_works, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, freed_main, NULL, res, 25);
    expect_all_ok(res, 2);
}

/* ct_pg_bytes_sent, worked out by hand for 2 ranks from what a ring sends: an allreduce
 * of 1000 f32 sends 2 (2-1)/2 x 4000 = 4000 bytes, a reduce-scatter of 200 f32 half of
 * its 800, an all-gather of 100 f32 the other rank's 400, a send of 10 i64 its 80 bytes
 * (the receiver sends nothing), a barrier nothing. */
static int bytes_sent_main(rank_ctx *c)
{
    ct_pg *world = rank_pg(c, 20, NULL);
    if (!world) return 1;
    const int r = c->rank;
    const double before = ct_pg_bytes_sent(world);
    ct_frame_push();
    ct_tensor *a = ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){1000}, 1.0);
    ct_tensor *in = ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){200}, 1.0);
    ct_tensor *half = ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){100}, 1.0);
    ct_tensor *whole = ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){200}, 0.0);
    ct_tensor *p = ct_tensor_full(CT_DTYPE_I64, 1, (int64_t[]){10}, 7.0);
    bool ok = wait_ok(c, ct_pg_allreduce(world, a, CT_REDUCE_SUM), "allreduce") &&
              wait_ok(c, ct_pg_reduce_scatter(world, half, in, CT_REDUCE_SUM), "reduce_scatter") &&
              wait_ok(c, ct_pg_allgather(world, whole, half), "allgather") &&
              wait_ok(c, r == 0 ? ct_pg_send(world, p, 1, 5) : ct_pg_recv(world, p, 0, 5), "send/recv") &&
              wait_ok(c, ct_pg_barrier(world), "barrier");
    ct_frame_pop();
    const double got = ct_pg_bytes_sent(world) - before, want = 4000 + 400 + 400 + (r == 0 ? 80 : 0);
    if (ok && got != want) ok = false, report(c, "rank %d: %g bytes sent, by hand %g", r, got, want);
    if (ct_pg_bytes_sent(NULL) != 0) ok = false, report(c, "rank %d: NULL group sent bytes", r);
    ct_pg_free(world);
    return ok ? 0 : 2;
}

Test(dist_pg, bytes_sent_counts_what_a_ring_sends, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, bytes_sent_main, NULL, res, 25);
    expect_all_ok(res, 2);
}
