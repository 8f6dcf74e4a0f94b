/* The executor's side of a request (dist/work.h): how a work is made, completed and
 * released. Used by whoever executes operations — the comm engine (dist/comm*.c, the
 * algorithms) and the process group's caller-thread paths (dist/pg_submit.c for a
 * group of one, dist/pg_direct.c for the direct allreduce) — and by dist/work.c.
 *
 * A request is inert, as a libuv request is: it only records an outcome and wakes
 * whoever waits for it. Nothing in dist/work.c runs, advances or looks at the
 * operation, so waiting never calls into a group, a transport or the engine, and
 * this header knows nothing of them. The executor's own per-work state lives in its
 * struct ct_work (dist/comm_internal.h), whose first member is the ct_work_req below:
 * dist/work.c reaches the request through a pointer to the work, which C allows for
 * the first member of a struct (C11 6.7.2.1p15), the way libuv's requests share
 * their leading fields.
 *
 * References. A work starts with two: the caller's (dropped by ct_work_free) and
 * the executor's (dropped once the executor is done with the work's memory). The
 * executor holds its reference across cti_work_complete, so the work outlives the
 * completion callback and the wake-up of the waiters even when a waiter frees it.
 */
#ifndef CT_DIST_WORK_INTERNAL_H
#define CT_DIST_WORK_INTERNAL_H

#include <stdbool.h>
#include <uv.h>

#include "core/error.h"
#include "dist/work.h"

#define CT_WORK_MSG 1024 /* bytes of a work's error message */

typedef struct ct_work_req {
    uv_mutex_t mu; /* guards everything below but refs */
    uv_cond_t cv;  /* broadcast when done becomes true */
    bool completing; /* cti_work_complete has taken the callback: a late setter runs it itself */
    bool done;
    ct_status status;
    char msg[CT_WORK_MSG];
    double t_end; /* uv_hrtime seconds at completion */
    ct_work_cb cb;
    void *cb_arg;
    int refs; /* atomic */
    /* the executor's destructor, run by the last cti_work_unref after the request's
     * own resources are gone: frees what the executor attached, then the memory */
    void (*release)(ct_work *w);
} ct_work_req;

/* Initialises the request part of a new work (the first member of the executor's
 * struct, zeroed by the caller) with both references taken. CT_OK, or
 * CT_ERR_INTERNAL with the error set (nothing to undo then). */
ct_status ct_work_req_init(ct_work *w, void (*release)(ct_work *w));

/* Records the outcome (msg may be NULL for success), runs the completion callback
 * (if set) on this thread, then wakes the waiters. Exactly once per work; the
 * caller holds a reference. */
void cti_work_complete(ct_work *w, ct_status st, const char *msg);

/* Blocks until w completes, without reporting its status (for an executor that
 * orders one operation after another and learns about failures its own way). */
void ct_work_await(ct_work *w);

/* Takes one more reference (an executor that keeps a finished work around). */
void ct_work_ref(ct_work *w);
/* Drops one reference; the last destroys the request and calls release. */
void cti_work_unref(ct_work *w);

#endif
