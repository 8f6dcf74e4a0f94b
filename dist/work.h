/* ctrain — requests: one asynchronous collective or point-to-point transfer.
 *
 * A ct_work is returned by every ct_pg_* submit function (dist/pg.h) and is owned by
 * the caller, who frees it with ct_work_free. It completes exactly once, with a
 * status; waiting again returns the same status (and sets the same message).
 *
 * A work is a request in libuv's sense: it does not run anything itself. Whoever
 * executes the operation — the communication thread, or the submitting thread for a
 * group of one and for the direct shared-memory allreduce (dist/pg.h) — completes it;
 * the functions below only wait for, look at or react to that completion, so they
 * never block on anything but the work and never move data.
 *
 * Thread-safety: any thread may wait on, test or free a work, also while another
 * thread waits on it, but ct_work_free must be the last call on it.
 */
#ifndef CT_DIST_WORK_H
#define CT_DIST_WORK_H

#include <stdbool.h>

#include "core/api.h"
#include "core/error.h"

typedef struct ct_work ct_work;

/* Blocks until the work completes and returns its status; on failure the message is
 * ct_last_error() of the calling thread. The wait is bounded: a collective that
 * cannot complete fails within the group timeout. NULL: CT_ERR_INVALID. */
CT_API ct_status ct_work_wait(ct_work *w);

/* The common blocking call: w is the result of submitting a collective (NULL when
 * the submit failed, its error set); waits for it and frees it. The status is
 * ct_work_wait's, or the submit's failure. */
CT_API ct_status ct_work_run(ct_work *w);

/* ct_work_run of each of w[0..n-1] (NULL entries, submits that failed, are skipped:
 * the caller noted their error), in order: every work is waited for and freed even
 * after a failure. Returns st when it is an error (the caller's, e.g. a failed
 * submit), else the first work's failure, else CT_OK. */
CT_API ct_status ct_work_run_all(ct_work **w, int n, ct_status st);

/* As ct_work_wait, but gives up after seconds (>= 0): CT_ERR_TIMEOUT if the work is
 * still running, which it keeps doing (wait again, test or free it later). */
CT_API ct_status ct_work_wait_timeout(ct_work *w, double seconds);

/* *done = whether the work has completed; returns its status when done, else CT_OK. */
CT_API ct_status ct_work_test(ct_work *w, bool *done);

/* When the work completed, in seconds of the monotonic clock libuv uses (uv_hrtime
 * / 1e9), or 0 while it runs: the DDP engine measures how much communication
 * backward hid with it. */
CT_API double ct_work_end_time(const ct_work *w);

/* Waits for completion if still running, then frees. NULL is a no-op. */
CT_API void ct_work_free(ct_work *w);

/* A completion callback: the work, its status, the argument given with it. */
typedef void (*ct_work_cb)(ct_work *w, ct_status status, void *arg);
/* Calls cb once when w completes, with its status (the message is ct_work_wait's).
 * It runs on the thread that completes the work — usually the communication thread —
 * before the waiters wake, so once ct_work_wait or ct_work_test reports completion
 * the callback has returned; it must be short, must not wait on, test or free w, and
 * must not submit to a group (on the comm thread that would stall every group).
 * When w has already completed (as a direct allreduce has once its submit returns),
 * cb runs at once on the calling thread. Setting another callback before completion
 * replaces the first; NULL removes it. NULL w: nothing. */
CT_API void ct_work_on_complete(ct_work *w, ct_work_cb cb, void *arg);

#endif
