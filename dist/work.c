/* Requests: completion, waiting, callbacks and reference counting (dist/work.h,
 * dist/work_internal.h). Everything here waits on the request's own mutex and
 * condition variable; the operation itself belongs to its executor, which completes
 * the work when it is done, so no call here can run, advance or block on a process
 * group, a transport or the comm engine. */
#include <math.h>
#include <stdio.h>

#include "dist/work_internal.h"

/* The request is the first member of every executor's struct ct_work (see the header). */
static ct_work_req *req(ct_work *w) { return (ct_work_req *)(void *)w; }

ct_status ct_work_req_init(ct_work *w, void (*release)(ct_work *w))
{
    ct_work_req *r = req(w);
    if (uv_mutex_init(&r->mu)) return ct_error_set(CT_ERR_INTERNAL, "work: uv_mutex_init failed");
    if (uv_cond_init(&r->cv)) {
        uv_mutex_destroy(&r->mu);
        return ct_error_set(CT_ERR_INTERNAL, "work: uv_cond_init failed");
    }
    r->refs = 2;
    r->release = release;
    return CT_OK;
}

void cti_work_complete(ct_work *w, ct_status st, const char *msg)
{
    ct_work_req *r = req(w);
    uv_mutex_lock(&r->mu);
    CT_ASSERT(!r->completing);
    r->status = st;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->t_end = (double)uv_hrtime() * 1e-9;
    r->completing = true; /* from here a setter runs its callback itself */
    ct_work_cb cb = r->cb;
    void *arg = r->cb_arg;
    uv_mutex_unlock(&r->mu);
    /* outside the lock (the callback may look at other works), before the waiters
     * wake: a waiter that frees its callback's state after the wait is safe */
    if (cb) cb(w, st, arg);
    uv_mutex_lock(&r->mu);
    r->done = true;
    uv_cond_broadcast(&r->cv);
    uv_mutex_unlock(&r->mu);
}

void ct_work_ref(ct_work *w) { __atomic_add_fetch(&req(w)->refs, 1, __ATOMIC_RELAXED); }

void cti_work_unref(ct_work *w)
{
    ct_work_req *r = req(w);
    if (__atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL)) return;
    uv_cond_destroy(&r->cv);
    uv_mutex_destroy(&r->mu);
    r->release(w);
}

void ct_work_await(ct_work *w)
{
    ct_work_req *r = req(w);
    uv_mutex_lock(&r->mu);
    while (!r->done) uv_cond_wait(&r->cv, &r->mu);
    uv_mutex_unlock(&r->mu);
}

/* Copies the outcome out under the lock; the caller sets its thread's error. */
static ct_status outcome(ct_work_req *r, char *msg, size_t cap)
{
    ct_status st = r->status;
    if (st) snprintf(msg, cap, "%s", r->msg);
    return st;
}

static ct_status report(ct_status st, const char *msg)
{
    return st ? ct_error_set(st, "%s", msg) : CT_OK;
}

ct_status ct_work_wait(ct_work *w)
{
    if (!w) return ct_error_set(CT_ERR_INVALID, "ct_work_wait: NULL work");
    ct_work_req *r = req(w);
    char msg[CT_WORK_MSG];
    uv_mutex_lock(&r->mu);
    while (!r->done) uv_cond_wait(&r->cv, &r->mu);
    ct_status st = outcome(r, msg, sizeof msg);
    uv_mutex_unlock(&r->mu);
    return report(st, msg);
}

ct_status ct_work_run(ct_work *w)
{
    ct_status st = w ? ct_work_wait(w) : ct_last_status();
    ct_work_free(w);
    return st;
}

ct_status ct_work_run_all(ct_work **w, int n, ct_status st)
{
    for (int i = 0; i < n; i++) {
        ct_status s = w[i] ? ct_work_run(w[i]) : CT_OK;
        if (!st) st = s;
    }
    return st;
}

ct_status ct_work_wait_timeout(ct_work *w, double seconds)
{
    if (!w) return ct_error_set(CT_ERR_INVALID, "ct_work_wait_timeout: NULL work");
    if (!(seconds >= 0)) return ct_error_set(CT_ERR_INVALID, "ct_work_wait_timeout: seconds = %g, want >= 0", seconds);
    ct_work_req *r = req(w);
    uint64_t deadline = uv_hrtime() + (uint64_t)fmin(seconds * 1e9, 1e18);
    char msg[CT_WORK_MSG];
    uv_mutex_lock(&r->mu);
    while (!r->done) {
        uint64_t now = uv_hrtime();
        if (now >= deadline) break;
        uv_cond_timedwait(&r->cv, &r->mu, deadline - now); /* wakes early or times out: the loop decides */
    }
    bool done = r->done;
    ct_status st = done ? outcome(r, msg, sizeof msg) : CT_OK;
    uv_mutex_unlock(&r->mu);
    if (!done)
        return ct_error_set(CT_ERR_TIMEOUT, "ct_work_wait_timeout: not complete after %g s (it keeps running)",
                            seconds);
    return report(st, msg);
}

ct_status ct_work_test(ct_work *w, bool *done)
{
    if (!w || !done) return ct_error_set(CT_ERR_INVALID, "ct_work_test: NULL %s", w ? "done" : "work");
    ct_work_req *r = req(w);
    char msg[CT_WORK_MSG];
    uv_mutex_lock(&r->mu);
    *done = r->done;
    ct_status st = r->done ? outcome(r, msg, sizeof msg) : CT_OK;
    uv_mutex_unlock(&r->mu);
    return report(st, msg);
}

void ct_work_free(ct_work *w)
{
    if (!w) return;
    ct_work_await(w);
    cti_work_unref(w);
}

void ct_work_on_complete(ct_work *w, ct_work_cb cb, void *arg)
{
    if (!w) return;
    ct_work_req *r = req(w);
    uv_mutex_lock(&r->mu);
    bool late = r->completing;
    if (!late) {
        r->cb = cb;
        r->cb_arg = arg;
    }
    uv_mutex_unlock(&r->mu);
    if (!late || !cb) return;
    /* the executor has passed the point where it takes the callback: run it here,
     * once the outcome is final (it is set before completing, so at most a moment) */
    ct_work_await(w);
    cb(w, r->status, arg);
}

double ct_work_end_time(const ct_work *w)
{
    if (!w) return 0;
    ct_work_req *r = req((ct_work *)w); /* the mutex, not the work, changes */
    uv_mutex_lock(&r->mu);
    double t = r->done ? r->t_end : 0;
    uv_mutex_unlock(&r->mu);
    return t;
}
