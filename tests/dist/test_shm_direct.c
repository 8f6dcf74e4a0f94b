/* Tests for the direct allreduce over shared-memory slots (dist/shm_direct.c,
 * dist/pg_direct.c): it runs inside the submit, which returns the work complete with
 * the result written (waiting for a rank that comes late); a completion callback set
 * afterwards runs at once; a work waited for on another thread while the submitter
 * goes on; every rank must agree on the setting; bad settings; a rank that frees the
 * group instead of running it. Its results over every dtype, reduce op and size, in
 * 256-byte slots too, are checked by test_collectives.c; desyncs, a killed peer and
 * timeouts by test_pg.c. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "ranks.h"

static ct_tensor *filled(int64_t n, float v)
{
    return ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){n}, v);
}

/* Every element of t is v. */
static bool all_eq(const ct_tensor *t, float v)
{
    const float *p = ct_tensor_data(t);
    for (int64_t i = 0; i < ct_tensor_numel(t); i++)
        if (p[i] != v) return false;
    return true;
}

/* ---- when it runs ------------------------------------------------------------------------- */

static void count_calls(ct_work *w, ct_status st, void *arg)
{
    (void)w;
    int *calls = arg;
    calls[0]++;
    calls[1] = (int)st;
}

static int at_submit_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, &(ct_pg_config){.transport = "shm"});
    if (!g) return 1;
    int rc = 0;
    ct_frame_push();
    /* 1. both ranks submit at once: the submit returns with the sum written */
    ct_tensor *t = filled(1000, (float)(c->rank + 1));
    ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
    if (!all_eq(t, 3)) rc = 2, report(c, "rank %d: the sum is not there when the submit returns", c->rank);
    bool done = false;
    if (!w || ct_work_test(w, &done) || !done) rc = 3, report(c, "test: done %d: %s", done, ct_last_error());
    if (ct_work_wait_timeout(w, 0)) rc = 4, report(c, "wait_timeout(0): %s", ct_last_error());
    /* complete already: a callback set now runs at once, on this thread */
    int calls[2] = {0, -1};
    ct_work_on_complete(w, count_calls, calls);
    if (calls[0] != 1 || calls[1] != CT_OK) rc = 5, report(c, "callback: %d calls, status %d", calls[0], calls[1]);
    ct_work_free(w);

    /* 2. rank 1 comes late: rank 0's submit waits for it, then returns complete */
    ct_tensor *u = filled(1 << 18, (float)(c->rank + 1)); /* 1 MiB: several chunks */
    if (c->rank == 1) sleep_ms(400);
    double t0 = now_s();
    w = ct_pg_allreduce(g, u, CT_REDUCE_MAX);
    double took = now_s() - t0;
    if (c->rank == 0 && took < 0.3) rc = 6, report(c, "the submit returned after %.3f s, before rank 1 came", took);
    if (!w || ct_work_test(w, &done) || !done) rc = 7, report(c, "test: done %d: %s", done, ct_last_error());
    ct_work_free(w);
    if (!all_eq(u, 2)) rc = 8, report(c, "rank %d: wrong max", c->rank);
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_shm_direct, it_runs_inside_the_submit_and_waits_for_a_late_rank, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, at_submit_main, NULL, res, 25);
    expect_all_ok(res, 2);
}

/* ---- a waiter on another thread ------------------------------------------------------------ */

typedef struct waiter {
    ct_work *w;
    ct_status st;
} waiter;

static void *wait_thread(void *arg)
{
    waiter *x = arg;
    x->st = ct_work_wait(x->w);
    return NULL;
}

static int threads_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, &(ct_pg_config){.transport = "shm"});
    if (!g) return 1;
    int rc = 0;
    ct_frame_push();
    for (int it = 0; it < 50 && !rc; it++) {
        ct_tensor *a = filled(4099, (float)(c->rank + it)), *b = filled(17, (float)(c->rank * it));
        waiter x = {.w = ct_pg_allreduce(g, a, CT_REDUCE_SUM)};
        pthread_t th;
        if (pthread_create(&th, NULL, wait_thread, &x)) return report(c, "pthread_create"), 2;
        /* the submitter goes on to the next allreduce while the thread waits */
        ct_work *w = ct_pg_allreduce(g, b, CT_REDUCE_SUM);
        ct_status st = ct_work_wait(w);
        pthread_join(th, NULL);
        ct_work_free(w);
        ct_work_free(x.w);
        if (st || x.st) rc = 3, report(c, "iteration %d: %s", it, ct_last_error());
        else if (!all_eq(a, (float)(1 + 2 * it)) || !all_eq(b, (float)it))
            rc = 4, report(c, "iteration %d: wrong sums", it);
    }
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_shm_direct, a_work_waited_for_on_another_thread, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, threads_main, NULL, res, 25);
    expect_all_ok(res, 2);
}

/* ---- settings ------------------------------------------------------------------------------ */

static int modes_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = "shm", .async_collectives = c->rank == 1});
    int rc = 0;
    if (g) rc = 2, report(c, "rank %d: ct_pg_new succeeded", c->rank);
    else if (!strstr(ct_last_error(), "async_collectives") || !strstr(ct_last_error(), "rank 1"))
        rc = 3, report(c, "rank %d: %s", c->rank, ct_last_error());
    ct_pg_free(g);
    return rc;
}

Test(dist_shm_direct, every_rank_must_use_the_same_setting, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, modes_main, NULL, res, 25);
    expect_all_ok(res, 2);
}

/* Each rank sets CTRAIN_SHM_SLOT_BYTES to its value; creating the group must fail on
 * every rank, rank 1's message containing want. */
typedef struct slot_case {
    const char *value[2], *want;
} slot_case;

static int slot_main(rank_ctx *c)
{
    const slot_case *k = c->arg;
    setenv("CTRAIN_SHM_SLOT_BYTES", k->value[c->rank], 1);
    ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = "shm"});
    unsetenv("CTRAIN_SHM_SLOT_BYTES");
    int rc = 0;
    if (g) rc = 2, report(c, "rank %d: ct_pg_new succeeded", c->rank);
    else if (c->rank == 1 && !strstr(ct_last_error(), k->want)) rc = 3, report(c, "rank 1: %s", ct_last_error());
    ct_pg_free(g);
    return rc;
}

Test(dist_shm_direct, a_bad_slot_size_is_refused, .timeout = 30)
{
    /* rank 1's value is refused; rank 0 hears that rank 1 could not set up */
    slot_case k = {{"4096", "100"}, "CTRAIN_SHM_SLOT_BYTES='100' is not a multiple of 64 bytes"};
    rank_result res[2];
    run_ranks(2, slot_main, &k, res, 25);
    expect_all_ok(res, 2);
}

Test(dist_shm_direct, ranks_with_different_slot_sizes_fail_naming_the_setting, .timeout = 30)
{
    slot_case k = {{"4096", "8192"}, "every rank must use the same CTRAIN_SHM_SLOT_BYTES"};
    rank_result res[2];
    run_ranks(2, slot_main, &k, res, 25);
    expect_all_ok(res, 2);
}

Test(dist_shm_direct, a_bad_direct_setting_is_refused)
{
    setenv("CTRAIN_SHM_DIRECT", "yes", 1);
    ct_pg *g = ct_pg_new(&(ct_pg_config){0});
    unsetenv("CTRAIN_SHM_DIRECT");
    cr_expect_null(g);
    cr_expect(strstr(ct_last_error(), "CTRAIN_SHM_DIRECT='yes'") != NULL, "%s", ct_last_error());
    ct_pg_free(g);
}

/* ---- a rank that frees the group instead ----------------------------------------------------- */

static int freed_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, &(ct_pg_config){.transport = "shm"});
    if (!g) return 1;
    int rc = 0;
    ct_frame_push();
    if (c->rank == 0) {
        ct_pg_free(g); /* instead of its allreduce */
        g = NULL;
        sleep_ms(300); /* alive: rank 1 must see the goodbye, not a crash */
    } else {
        ct_tensor *t = filled(100, 1);
        double t0 = now_s();
        ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
        ct_status st = ct_work_wait(w);
        if (st != CT_ERR_PEER || !strstr(ct_last_error(), "rank 0 freed the group") || now_s() - t0 > 5)
            rc = 3, report(c, "rank 1: status %d: %s", st, ct_last_error());
        ct_work_free(w);
    }
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_shm_direct, a_rank_that_frees_the_group_fails_the_others_naming_it, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, freed_main, NULL, res, 25);
    expect_all_ok(res, 2);
}
