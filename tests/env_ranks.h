/* Runs a function on fork()ed ranks that find each other the way a launched program
 * does: through RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
 * MASTER_PORT (the Accelerator's tests; tests/dist/ranks.h hands the ranks a store
 * instead). Every child exits with fn's result, bounded by an alarm, and dies with
 * the test process; under ASan it runs the leak check before it exits. */
#ifndef CT_TESTS_ENV_RANKS_H
#define CT_TESTS_ENV_RANKS_H

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "core/frame.h"

/* A port the kernel says is free now. */
static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len));
    close(fd);
    return ntohs(a.sin_port);
}

typedef int (*env_rank_fn)(int rank, int world, const char *dir, void *ctx);

/* Runs fn on world ranks (alarm after alarm_s seconds); asserts every one exited 0. */
static inline void run_env_ranks(int world, env_rank_fn fn, const char *dir, void *ctx, unsigned alarm_s)
{
    int port = free_port();
    pid_t pids[8];
    cr_assert(world >= 1 && world <= 8);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        cr_assert_neq(pids[r], -1);
        if (pids[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            alarm(alarm_s);
            char v[32];
            snprintf(v, sizeof v, "%d", r), setenv("RANK", v, 1), setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", world), setenv("WORLD_SIZE", v, 1), setenv("LOCAL_WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", port), setenv("MASTER_PORT", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("CTRAIN_TIMEOUT", "30", 1);
            int rc = fn(r, world, dir, ctx);
            fflush(NULL);
            ct_frame_reset_root();
#ifdef __SANITIZE_ADDRESS__
            /* _exit skips LeakSanitizer's check at exit: run it here */
            __lsan_do_leak_check();
#endif
            _exit(rc);
        }
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad = r + 1;
    }
    cr_assert_eq(bad, 0, "rank %d failed (see its stderr above)", bad - 1);
}

#endif
