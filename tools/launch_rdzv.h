/* The elastic rendezvous of `ctrain launch` (--rdzv_backend c10d, --min_nodes,
 * --max_nodes): the launchers of a job agree, round after round, on which nodes take
 * part, as torchrun's c10d rendezvous does. User documentation: docs/launch.md,
 * "Elastic training".
 *
 * The launcher with --machine_rank 0 (the host) serves a store (dist/store.h) on
 * --main_process_ip:--main_process_port; every launcher, the host included, is a
 * client of it. Keys, all under "ctl/":
 *   round              the newest round opened (a counter; 0 at first)
 *   <k>/m/<r>          machine rank r joined round k (a counter; 2 = joined twice)
 *   <k>/joined         launchers that joined round k (a counter)
 *   <k>/closed         1 once the host published round k's result
 *   <k>/result         "ok PORT R0,R1,..." (the MASTER_PORT of the round's ranks and
 *                      the participants' machine ranks, ascending) or "fail MESSAGE"
 *   <k>/next           who leaves round k first opens round k+1 (a counter)
 *   <k>/done           launchers of round k whose ranks all exited 0
 *   <k>/done/<r>       1 once machine rank r's ranks of round k all exited 0
 *   <k>/failed/<r>     machine rank r's launcher ended round k with this status (its
 *                      ranks failed with no restart left, or it was interrupted)
 *   hb/<r>             machine rank r's heartbeat: a counter every launcher bumps about
 *                      once a second (CT_LAUNCH_HEARTBEAT_S) for as long as it runs
 * Every call is one request or a few, answered at once: the launcher's event loop
 * polls them on its monitor tick and keeps relaying output and signals meanwhile.
 *
 * These are the `ctrain` command's functions: they print nothing; errors are
 * returned with ct_last_error() set.
 */
#ifndef CT_TOOLS_LAUNCH_RDZV_H
#define CT_TOOLS_LAUNCH_RDZV_H

#include "tools/launch.h"

typedef struct ct_launch_rdzv ct_launch_rdzv;

/* Heartbeats: how often a launcher bumps hb/<r>, and how long the host waits for one
 * before it counts that launcher as gone (torchrun's keep-alive: 5 s, 3 attempts). */
#define CT_LAUNCH_HEARTBEAT_S 1.0
#define CT_LAUNCH_SILENT_S 15.0

/* One closed round, from this launcher's side. */
typedef struct ct_launch_round {
    int round;     /* k, from 0 */
    int nodes;     /* launchers in it (GROUP_WORLD_SIZE) */
    int node_rank; /* this launcher's place among them, by machine rank (GROUP_RANK) */
    int port;      /* MASTER_PORT of the round's ranks (the host picked a free one) */
    char machines[512]; /* the participants' machine ranks, "0,1,3" */
} ct_launch_round;

/* Serves the store (machine rank 0) and connects to it, retrying until
 * --rdzv_timeout. New handle owned by the caller (ct_launch_rdzv_free), or NULL
 * (ct_last_error names the address and port). Blocks; call before the loop runs. */
ct_launch_rdzv *ct_launch_rdzv_new(const ct_launch_opts *o);

/* Joins a round: the newest one opened, or, with leave (this launcher leaves the
 * round it was in: its ranks failed, or a round closed without it), at least the one
 * after it (opening it when no one has yet). */
ct_status ct_launch_rdzv_join(ct_launch_rdzv *z, bool leave);

/* One look at the round joined: 0 still open (the host may close it now), 1 closed
 * with this launcher in it (*out filled), -1 failed (too few nodes within
 * --rdzv_timeout, the host is gone, or the host failed the round; ct_last_error says
 * which, naming how many joined and the machine ranks missing). A round that closed
 * without this launcher, or that a newer round replaced, is left for the next. */
int ct_launch_rdzv_poll(ct_launch_rdzv *z, ct_launch_round *out);

/* While the ranks run: the number of a newer round that another launcher opened, 0
 * when none, -1 when the host cannot be asked (ct_last_error names it). */
int ct_launch_rdzv_newer(ct_launch_rdzv *z);

/* This launcher's ranks of the round all exited 0. */
ct_status ct_launch_rdzv_done(ct_launch_rdzv *z);

/* This launcher ends the round with a failure (status, non-zero): the host stops
 * waiting for it. Best effort: a host that cannot be asked is not reported to. */
void ct_launch_rdzv_failed(ct_launch_rdzv *z, int status);

/* Bumps this launcher's heartbeat when CT_LAUNCH_HEARTBEAT_S passed since the last;
 * called on every monitor tick. A failure is left to the next request to report. */
void ct_launch_rdzv_beat(ct_launch_rdzv *z);

/* The host, after its own ranks finished: 1 when every launcher of the round is done
 * (or a newer round was opened: nothing more will finish in this one), 2 when those not
 * done have all been silent for CT_LAUNCH_SILENT_S (killed, frozen or cut off: their
 * machine ranks in ct_launch_rdzv_gone), 0 not yet, -1 when one of them reported a
 * failure (ct_launch_rdzv_failed) or after --rdzv_timeout (ct_last_error names the
 * machine ranks). The host keeps serving until
 * then, so the others can still reach it. */
int ct_launch_rdzv_all_done(ct_launch_rdzv *z);

/* After ct_launch_rdzv_all_done returned 2: the silent launchers' machine ranks,
 * "1,3" (borrowed). */
const char *ct_launch_rdzv_gone(const ct_launch_rdzv *z);

/* The host's address as "ADDR:PORT" (borrowed). */
const char *ct_launch_rdzv_endpoint(const ct_launch_rdzv *z);

void ct_launch_rdzv_free(ct_launch_rdzv *z);

#endif
