/* The rank program of `ctrain test` (tools/test_cmd.h): the checks one rank runs and
 * how a check's verdict is agreed on and reported.
 *
 *   tools/test_rank.c              the driver: rendezvous through the Accelerator, the
 *                                  check protocol below, rank 0's report, the summary;
 *   tools/test_rank_collectives.c  every collective in every dtype, against closed forms;
 *   tools/test_rank_train.c        a tiny model trained under the configured strategy
 *                                  against the same model trained by one process.
 *
 * A check. Every rank runs it (ct_test_check_begin), records what it found wrong
 * (ct_test_check_fail; every failure, not only the first, as far as the message
 * holds), and ends it (ct_test_check_end): the ranks' messages are all-gathered, so
 * every rank knows the verdict, and rank 0 prints one line, "PASS name: detail" or
 * "FAIL name: rank r: what; rank s: what". A collective that fails (a dead peer, a
 * timeout, a desync) breaks the group (dist/pg.h): the check fails with that error,
 * each rank prints its own line since nothing can be exchanged any more, and the
 * checks after it are not run.
 *
 * The report (--report FILE, written by rank 0 for `ctrain test`), one line each,
 * fields separated by tabs, flushed as they are written so that a job stopped half
 * way still tells how far it got:
 *   setup  WORLD  STRATEGY  PRECISION
 *   check  NAME                  (a check begins)
 *   pass   NAME
 *   fail   NAME  WHAT
 *   end    CHECKS  FAILED  complete|stopped   (stopped: the group failed, checks were skipped)
 *
 * Fault injection for ctrain's own tests (docs/maintainers/accel.md): CTRAIN_TEST_INJECT
 * =collective|loss|die|hang makes the last rank corrupt one element of one collective's
 * result, perturb its loss at one training step, kill itself with SIGKILL, or sleep
 * through twice the group's timeout before a collective.
 */
#ifndef CT_TOOLS_TEST_RANK_H
#define CT_TOOLS_TEST_RANK_H

#include <stdbool.h>
#include <stdio.h>

#include "accel/accelerator.h"
#include "dist/pg.h"

/* Bytes of one rank's failure text per check (what is exchanged). */
#define CT_TEST_MSG_MAX 400

typedef struct ct_test_run {
    ct_pg *pg; /* the Accelerator's world group (borrowed) */
    int rank, world;
    const char *inject; /* NULL, "collective", "loss", "die" or "hang" */
    FILE *report;       /* rank 0 with --report, else NULL */
    int checks, failed; /* checks ended so far, of them failed */
    bool broken;        /* a collective failed: no check runs after the current one */
    char name[128];     /* the current check */
    char msg[CT_TEST_MSG_MAX]; /* this rank's failures in the current check; "" = none */
    int nfail, nshown;  /* failures recorded in the current check, of them in msg */
    struct ct_test_trained *trained; /* the training's model and optimizer (test_rank_train.c) */
} ct_test_run;

/* Starts a check named by fmt (printf-style). */
void ct_test_check_begin(ct_test_run *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records one failure of the current check on this rank; later ones are appended
 * ("; ") while they fit, then counted ("and 3 more"). */
void ct_test_check_fail(ct_test_run *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records a failed collective (what: "allreduce(sum) f32 of 1027"): its error
 * (ct_last_error) as a failure, and the group as broken when the error came from the
 * group rather than from a refused argument. */
void ct_test_check_error(ct_test_run *t, const char *what, ct_status st);
/* Ends the check: exchanges the verdicts and prints rank 0's line (the detail,
 * printf-style, follows "PASS name: "). Returns whether every rank passed. */
bool ct_test_check_end(ct_test_run *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* True on the rank where the injection `kind` happens (the last rank). */
bool ct_test_inject_here(const ct_test_run *t, const char *kind);

/* The collective checks: allreduce (sum, avg, max, min), reduce-scatter (sum, avg),
 * all-gather and broadcast from the last rank, each in f32, f64, bf16, f16, i32 and
 * i64 on three sizes; then barrier. */
void ct_test_collectives(ct_test_run *t);

/* The training checks, one per optimizer step: the loss of the model trained under
 * acc's strategy (mean over ranks) against one process training alone. */
void ct_test_training(ct_test_run *t, ct_accelerator *acc);
/* Frees what ct_test_training gave the Accelerator; after ct_accelerator_free. */
void ct_test_training_free(ct_test_run *t);

#endif
