/* The caller's side of the direct allreduce (dist/shm_direct_internal.h): when it runs.
 *
 * An allreduce submitted on a group with direct slots is deferred: it runs on the
 * first thread that needs it to be done — a wait, test, timed wait or free of the
 * work, or the group's next collective (collectives of a group run in submission
 * order). Before it runs, the collectives handed to the loop before it must have
 * completed. A test or timed wait gives up while some rank has not called it yet
 * (nothing has moved, so it can run later); once every rank is there it runs to the
 * end.
 *
 * One process-wide mutex guards every group's deferred work: a waiter on another
 * thread finds the group through the work, and ct_pg_free clears that link under
 * the same mutex, so the group is never used after it was freed.
 */
#include <math.h>
#include <stdio.h>

#include "dist/comm_internal.h"

static uv_mutex_t direct_mu;
static uv_once_t direct_once = UV_ONCE_INIT;

static void direct_init(void) { CT_ASSERT(uv_mutex_init(&direct_mu) == 0); }

void cti_pg_direct_lock(void)
{
    uv_once(&direct_once, direct_init);
    uv_mutex_lock(&direct_mu);
}

void cti_pg_direct_unlock(void) { uv_mutex_unlock(&direct_mu); }

static double now_s(void) { return (double)uv_hrtime() * 1e-9; }

static void work_ref(ct_work *w) { __atomic_add_fetch(&w->refs, 1, __ATOMIC_RELAXED); }

/* Waits for the last collective handed to the loop, until by; false when it is
 * still running then. */
static bool last_done(ct_pg *g, double by)
{
    ct_work *l = g->last;
    if (!l) return true;
    uv_mutex_lock(&l->mu);
    while (!l->done) {
        double t = now_s();
        if (t >= by) break;
        if (isinf(by)) uv_cond_wait(&l->cv, &l->mu);
        else uv_cond_timedwait(&l->cv, &l->mu, (uint64_t)((by - t) * 1e9) + 1);
    }
    bool done = l->done;
    uv_mutex_unlock(&l->mu);
    if (!done) return false;
    g->last = NULL;
    cti_work_unref(l);
    return true;
}

/* Under the lock: runs g's deferred w. */
static ct_status run_locked(ct_pg *g, ct_work *w, double arrive_by)
{
    if (!last_done(g, arrive_by)) return CT_ERR_TIMEOUT;
    if (cti_shm_direct_allreduce(g->direct, g->grp, w, arrive_by)) return CT_ERR_TIMEOUT;
    g->deferred = NULL;
    w->deferred_on = NULL;
    cti_work_unref(w); /* the group's reference */
    return CT_OK;
}

ct_status cti_pg_run_deferred(ct_work *w, double arrive_by)
{
    cti_pg_direct_lock();
    ct_pg *g = w->deferred_on;
    ct_status st = g ? run_locked(g, w, arrive_by) : CT_OK;
    cti_pg_direct_unlock();
    return st;
}

bool cti_pg_direct_submit(ct_pg *g, ct_work *w)
{
    cti_pg_direct_lock();
    if (g->deferred) run_locked(g, g->deferred, INFINITY);
    bool direct = w->op == CT_OP_ALLREDUCE;
    cti_shm_direct_announce(g->direct, w, direct);
    if (direct) {
        w->grp = g->grp;
        w->deferred_on = g;
        w->deadline = now_s() + g->timeout_s;
        g->deferred = w; /* holds the engine's reference */
    } else {
        if (g->last) cti_work_unref(g->last);
        work_ref(w);
        g->last = w;
    }
    cti_pg_direct_unlock();
    return direct;
}

void cti_pg_direct_release(ct_pg *g)
{
    cti_pg_direct_lock();
    ct_work *w = g->deferred;
    if (w) {
        char title[256], text[CT_COMM_MSG];
        snprintf(text, sizeof text, "%s: the process group was freed before it ran",
                 cti_comm_work_title(title, sizeof title, w));
        g->deferred = NULL;
        w->deferred_on = NULL;
        cti_work_complete(w, CT_ERR_INVALID, text);
        cti_work_unref(w);
    }
    if (g->last) cti_work_unref(g->last);
    g->last = NULL;
    cti_pg_direct_unlock();
}
