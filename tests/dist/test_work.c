/* Tests for requests (dist/work.c): the completion callback — once, with the status,
 * on the thread that completes the work (the comm thread), before the waiters wake;
 * at once on the caller's thread for a work already complete; replaced or removed
 * before completion — and a failed work's status reaching it. Waiting, testing and
 * timed waits are exercised by every test of tests/dist. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#include "core/frame.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "ranks.h"

typedef struct calls {
    _Atomic int n;
    ct_status st;
    pthread_t thread;
} calls;

static void on_done(ct_work *w, ct_status st, void *arg)
{
    calls *c = arg;
    (void)w;
    c->st = st;
    c->thread = pthread_self();
    c->n++;
}

Test(dist_work, a_callback_on_a_complete_work_runs_at_once, .timeout = 10)
{
    ct_pg *g = ct_pg_new(&(ct_pg_config){.world_size = 1});
    cr_assert_not_null(g, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *t = ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){4}, 2.0f);
        ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM); /* a group of one: complete at submit */
        calls c = {0};
        ct_work_on_complete(w, on_done, &c);
        cr_expect_eq(c.n, 1);
        cr_expect_eq(c.st, CT_OK);
        cr_expect(pthread_equal(c.thread, pthread_self()), "on the caller's thread");
        ct_work_on_complete(w, NULL, NULL); /* late and NULL: nothing */
        cr_expect_eq(c.n, 1);
        ct_work_free(w);
    }
    ct_work_on_complete(NULL, on_done, NULL); /* NULL work: nothing */
    ct_pg_free(g);
}

/* Rank 1 comes late, so rank 0's callbacks are set while its works run on the comm
 * thread (tcp: nothing runs on the caller's thread). */
static int comm_thread_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 10, &(ct_pg_config){.transport = "tcp"});
    if (!g) return 1;
    int rc = 0;
    ct_frame_push();
    if (c->rank == 1) sleep_ms(200);
    ct_tensor *t = ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){1000}, (float)(c->rank + 1));
    ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
    calls a = {0}, b = {0};
    ct_work_on_complete(w, on_done, &a);
    ct_work_on_complete(w, on_done, &b); /* replaces the first */
    ct_status st = ct_work_wait(w);
    /* the callback has returned by the time the wait does */
    if (st || a.n != 0 || b.n != 1 || b.st != CT_OK)
        rc = 2, report(c, "rank %d: status %d, calls %d and %d: %s", c->rank, st, a.n, b.n, ct_last_error());
    if (c->rank == 0 && b.n == 1 && pthread_equal(b.thread, pthread_self()))
        rc = 3, report(c, "rank 0: the callback ran on the caller's thread, not the comm thread");
    ct_work_free(w);
    if (((const float *)ct_tensor_data(t))[999] != 3) rc = 4, report(c, "rank %d: wrong sum", c->rank);

    /* removed before completion: never called */
    w = ct_pg_barrier(g);
    ct_work_on_complete(w, on_done, &a);
    ct_work_on_complete(w, NULL, NULL);
    if (ct_work_wait(w) || a.n != 0) rc = 5, report(c, "rank %d: removed callback: %d calls", c->rank, a.n);
    ct_work_free(w);

    /* a failure reaches the callback: rank 1 calls with another count */
    ct_tensor *u = ct_tensor_zeros(CT_DTYPE_F32, 1, (int64_t[]){c->rank ? 8 : 7});
    calls f = {0};
    w = ct_pg_allreduce(g, u, CT_REDUCE_SUM);
    ct_work_on_complete(w, on_done, &f);
    st = ct_work_wait(w);
    if (st != CT_ERR_PEER || f.n != 1 || f.st != CT_ERR_PEER)
        rc = 6, report(c, "rank %d: desync: status %d, %d calls with %d: %s", c->rank, st, f.n, f.st, ct_last_error());
    ct_work_free(w);
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_work, a_callback_runs_once_on_the_comm_thread_before_the_wait_returns, .timeout = 30)
{
    rank_result res[2];
    run_ranks(2, comm_thread_main, NULL, res, 25);
    expect_all_ok(res, 2);
}

/* ct_work_run_all waits for and frees every work (LeakSanitizer would see one left),
 * skips NULL entries, and keeps the caller's error before the works' status. */
Test(dist_work, run_all_waits_for_every_work_and_keeps_the_first_error, .timeout = 10)
{
    ct_pg *g = ct_pg_new(&(ct_pg_config){.world_size = 1});
    cr_assert_not_null(g, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *t = ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){4}, 2.0f);
        ct_work *w[3] = {ct_pg_allreduce(g, t, CT_REDUCE_SUM), NULL, ct_pg_allreduce(g, t, CT_REDUCE_SUM)};
        cr_expect_eq(ct_work_run_all(w, 3, CT_OK), CT_OK, "%s", ct_last_error());
        ct_work *v[2] = {ct_pg_allreduce(g, t, CT_REDUCE_SUM), ct_pg_barrier(g)};
        cr_expect_eq(ct_work_run_all(v, 2, CT_ERR_INVALID), CT_ERR_INVALID);
        cr_expect_eq(((const float *)ct_tensor_data(t))[0], 2.0f); /* a sum over one rank */
    }
    ct_pg_free(g);
}
