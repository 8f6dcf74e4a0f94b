/* The caller's side of the direct allreduce (dist/shm_direct_internal.h): it runs on
 * the submitting thread, inside the submit, and its work is returned complete.
 *
 * Why at submit. A work is an inert request (dist/work_internal.h): waiting on it
 * must not run anything, so whoever owns the operation has to execute it. The
 * owners were weighed:
 *   - the comm thread: it would put back the thread hop and the two wake-ups the
 *     direct path exists to remove (tens of microseconds on a 1 KiB allreduce
 *     instead of one), and a reduction blocking the loop would also stall the
 *     dead-peer and goodbye handling the direct wait relies on;
 *   - the next submit or an explicit flush: a plain submit-then-wait (ct_work_run,
 *     every clip, found_inf and fp8 exchange) would never complete, since a wait may
 *     not flush;
 *   - the submitting thread, now: costs what running it at the first wait cost,
 *     because nothing moved before that wait anyway (the overlap the comm thread
 *     gives was never available on this path), and every caller waits at once — DDP
 *     sends only its last bucket here, which it waits for as backward ends.
 * So the submit blocks until every rank has submitted the allreduce and the result
 * is written, as MPI_Allreduce does; a rank that never comes is a timeout after the
 * group timeout, naming it, and every failure is the work's status with the same
 * message as before (the submit still returns the work, so callers learn it at the
 * wait). What changes for a program is that a rank must not make its peers wait,
 * before their allreduce, for something it submits only after its own; a group with
 * async_collectives (or a sub-group) keeps such allreduces on the comm thread.
 *
 * Order. Collectives of a group run in submission order: before a direct allreduce
 * runs, the group's last collective handed to the loop must have completed (it is
 * bounded by the group timeout like any collective). Only the submitting thread
 * touches the group handle (dist/pg.h: one thread at a time submits), so no lock is
 * needed here.
 */
#include "dist/comm_internal.h"

static double now_s(void) { return (double)uv_hrtime() * 1e-9; }

/* Waits for the group's last loop collective and forgets it; its outcome is not
 * ours to report (a failure broke the group, which the allreduce then reports). */
static void await_last(ct_pg *g)
{
    if (!g->last) return;
    ct_work_await(g->last);
    cti_work_unref(g->last);
    g->last = NULL;
}

bool cti_pg_direct_submit(ct_pg *g, ct_work *w)
{
    bool direct = w->op == CT_OP_ALLREDUCE;
    /* published at submit, as the loop's collectives are: the peers compare it */
    cti_shm_direct_announce(g->direct, w, direct);
    if (!direct) {
        if (g->last) cti_work_unref(g->last);
        ct_work_ref(w);
        g->last = w;
        return false;
    }
    await_last(g);
    w->grp = g->grp;
    /* the group timeout runs from when the collective can start, as on the loop */
    w->deadline = now_s() + g->timeout_s;
    cti_shm_direct_allreduce(g->direct, g->grp, w); /* completes w, success or failure */
    cti_work_unref(w);                              /* the engine's reference */
    return true;
}

void cti_pg_direct_release(ct_pg *g)
{
    if (g->last) cti_work_unref(g->last);
    g->last = NULL;
}
