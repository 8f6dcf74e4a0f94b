/* Runs a function on n fork()ed ranks for the process-group tests.
 *
 * Rank 0 serves the store on a free port (chosen by the kernel: port 0) and tells
 * the other ranks the port through a pipe; every rank then runs fn, which reports a
 * result code and a message into memory shared with the test process. Children never
 * use cr_ assertions (the runner would take their reports for a stranger's); the test
 * checks the results after run_ranks has reaped every child; under ASan each child
 * runs the leak check before it exits. A child dies with the
 * test process (PR_SET_PDEATHSIG) and by its own alarm, so nothing outlives a test
 * that times out. CT_DEBUG_REPORTS=1 in the environment logs every rank's report,
 * also when it passed. CT_TEST_NODES=k spreads the ranks over k nodes (CTRAIN_NODE_ID
 * "node<r * k / n>"), so that a suite runs over the "shm+tcp" transport.
 */
#ifndef CT_TESTS_DIST_RANKS_H
#define CT_TESTS_DIST_RANKS_H

#include <criterion/criterion.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "core/frame.h"
#include "tests/clock.h"
#include "dist/pg.h"
#include "dist/store.h"

#define MAX_RANKS 8

typedef struct rank_ctx {
    int rank, world, port;
    ct_store *store; /* rank 0's serving handle, else NULL */
    void *arg;
    char *msg; /* the report, MSG_CAP bytes */
} rank_ctx;

#define MSG_CAP 4096

typedef struct rank_result {
    int rc;     /* fn's return value; -1 when the child did not report */
    int status; /* from waitpid */
    double seconds;
    char msg[MSG_CAP];
} rank_result;

typedef int (*rank_fn)(rank_ctx *c);

static inline void sleep_ms(int ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL);
}

/* Appends a line to the rank's report. */
static inline void report(rank_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void report(rank_ctx *c, const char *fmt, ...)
{
    size_t n = strlen(c->msg);
    if (n >= MSG_CAP - 2) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg + n, MSG_CAP - n - 1, fmt, ap);
    va_end(ap);
    n = strlen(c->msg);
    c->msg[n] = '\n';
    c->msg[n + 1] = '\0';
}

/* The group of all ranks; tuning may be NULL. */
static inline ct_pg *rank_pg(rank_ctx *c, double timeout_s, const ct_pg_config *tuning)
{
    ct_pg_config cfg = tuning ? *tuning : (ct_pg_config){0};
    cfg.rank = c->rank;
    cfg.world_size = c->world;
    cfg.master_port = c->port;
    cfg.timeout_s = timeout_s;
    cfg.store = c->store;
    ct_pg *g = ct_pg_new(&cfg);
    if (!g) report(c, "rank %d: %s", c->rank, ct_last_error());
    return g;
}

/* Forks n ranks running fn(arg) and reaps them; res[r] is rank r's outcome. */
static inline void run_ranks(int n, rank_fn fn, void *arg, rank_result *res, int alarm_s)
{
    cr_assert(n >= 1 && n <= MAX_RANKS);
    rank_result *shared = mmap(NULL, sizeof(rank_result) * MAX_RANKS, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(shared, MAP_FAILED);
    for (int r = 0; r < n; r++) shared[r].rc = -1;
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pids[MAX_RANKS];
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        cr_assert_geq(pids[r], 0);
        if (pids[r]) continue;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm((unsigned)alarm_s);
        const char *nodes = getenv("CT_TEST_NODES");
        if (nodes && atoi(nodes) > 0) {
            char id[32];
            snprintf(id, sizeof id, "node%d", r * atoi(nodes) / n);
            setenv("CTRAIN_NODE_ID", id, 1);
        }
        rank_ctx c = {.rank = r, .world = n, .arg = arg, .msg = shared[r].msg};
        c.msg[0] = '\0';
        if (r == 0) {
            close(fds[0]);
            c.store = ct_store_new(&(ct_store_config){.serve = true, .world_size = n, .timeout_s = alarm_s});
            c.port = c.store ? ct_store_port(c.store) : -1;
            for (int i = 1; i < n; i++)
                if (write(fds[1], &c.port, sizeof c.port) != sizeof c.port) _exit(90);
            close(fds[1]);
            if (!c.store) {
                report(&c, "rank 0: cannot serve the store: %s", ct_last_error());
                _exit(91);
            }
        } else {
            close(fds[1]);
            if (read(fds[0], &c.port, sizeof c.port) != sizeof c.port || c.port < 0) _exit(92);
            close(fds[0]);
        }
        double t0 = now_s();
        int rc = fn(&c);
        shared[r].seconds = now_s() - t0;
        shared[r].rc = rc;
        ct_frame_reset_root();
        ct_store_free(c.store);
#ifdef __SANITIZE_ADDRESS__
        /* _exit skips LeakSanitizer's check at exit: run it here (a leak fails the rank) */
        __lsan_do_leak_check();
#endif
        _exit(0);
    }
    close(fds[0]);
    close(fds[1]);
    for (int r = 0; r < n; r++) {
        int status = 0;
        cr_assert_eq(waitpid(pids[r], &status, 0), pids[r]);
        res[r] = shared[r];
        res[r].status = status;
    }
    munmap(shared, sizeof(rank_result) * MAX_RANKS);
}

/* Every rank exited normally with rc 0. */
static inline void expect_all_ok(const rank_result *res, int n)
{
    for (int r = 0; r < n; r++) {
        cr_expect(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0, "rank %d: exit status 0x%x\n%s", r,
                  res[r].status, res[r].msg);
        cr_expect_eq(res[r].rc, 0, "rank %d failed (rc %d):\n%s", r, res[r].rc, res[r].msg);
        if (getenv("CT_DEBUG_REPORTS")) cr_log_info("rank %d (%.2f s):\n%s", r, res[r].seconds, res[r].msg);
    }
}

#endif
