/* `ctrain test`: a short built-in distributed sanity run under the current launch
 * configuration, as `accelerate test` (user documentation: docs/launch.md,
 * "ctrain test").
 *
 *     ctrain test --num_processes 2 --use_deepspeed --zero_stage 3
 *
 * runs `ctrain launch <those flags> <this binary> test --rank ...`: every rank runs
 * the checks of tools/test_rank.h (rendezvous, every collective in every dtype,
 * a tiny model trained under the configured strategy against one process), rank 0
 * prints one PASS/FAIL line per check, and `ctrain test` ends with the verdict.
 *
 * These are the `ctrain` command's functions: they print and return exit codes,
 * never exit().
 */
#ifndef CT_TOOLS_TEST_CMD_H
#define CT_TOOLS_TEST_CMD_H

/* Exit codes of `ctrain test`: 0 when every check passed; 1 when a check failed;
 * 2 for a usage error (launch's own, for a bad launch flag); otherwise the
 * launcher's code when the job stopped before the checks ended (a rank killed by
 * signal 9: 137). */
#define CT_TEST_EXIT_FAILED 1
#define CT_TEST_EXIT_USAGE 2

/* CTRAIN_TIMEOUT for the ranks when the user has not set one: a dead or stuck
 * peer then fails a collective within a minute, not five. */
#define CT_TEST_DEFAULT_TIMEOUT "60"

/* `ctrain test [launch flags]`; argv[0] is "test". `ctrain test --rank [--report
 * FILE]` is the hidden rank program the launcher starts (ct_test_rank_main). */
int ct_test_main(int argc, char **argv);

/* One rank's checks; argv[0] is "--rank". Rank 0 prints the PASS/FAIL lines and,
 * with --report FILE, records them there for `ctrain test`'s verdict. Returns 0
 * when every check passed on every rank, 1 otherwise, 2 for a bad argument or
 * a bad CTRAIN_TEST_INJECT. */
int ct_test_rank_main(int argc, char **argv);

#endif
