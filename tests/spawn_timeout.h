/* Test helper: running a program (no shell) with a wall-clock limit, optionally with its
 * stdout and stderr into a log file, for the tests that drive Python oracles. */
#ifndef CT_TESTS_SPAWN_TIMEOUT_H
#define CT_TESTS_SPAWN_TIMEOUT_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

/* Runs argv (log NULL: output inherited); returns the exit status, or -1 when it could
 * not start, was killed by a signal or ran out of time (then it is killed). */
static inline int spawn_with_timeout(char *const argv[], const char *log, int timeout_s)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (log) {
        posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -1;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (r < 0 && errno != EINTR) return -1;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_log_error("%s: killed after %d s", argv[0], timeout_s);
            return -1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    }
}

#endif
