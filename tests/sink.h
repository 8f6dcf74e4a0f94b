/* Test helper: reading a child process's output pipe into a growing buffer. The
 * tests that run `ctrain` as a program (tests/tools/) collect its stdout and stderr
 * with it while they poll both pipes. */
#ifndef CT_TESTS_SINK_H
#define CT_TESTS_SINK_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *p; /* NUL-terminated, owned; free() it */
    size_t len, cap;
    int fd;  /* the pipe's read end; -1 once at EOF (closed) */
} sink;

/* One read() from s->fd appended to s->p (grown as needed; at least 64 KiB free before
 * each read); at EOF closes the fd and sets it to -1. EINTR is a no-op. */
static inline void sink_read(sink *s)
{
    if (s->cap - s->len < 65536 + 1) {
        s->cap = s->cap ? 2 * s->cap : 1 << 18;
        s->p = realloc(s->p, s->cap);
        cr_assert_not_null(s->p);
    }
    ssize_t k = read(s->fd, s->p + s->len, s->cap - s->len - 1);
    if (k < 0 && errno == EINTR) return;
    cr_assert_geq(k, 0, "read: %s", strerror(errno));
    if (k == 0) {
        close(s->fd);
        s->fd = -1;
    }
    s->len += (size_t)k;
    s->p[s->len] = 0;
}

/* Starts argv[0] (argv NULL-terminated) with its stdout into out and its stderr into
 * err (their fds set to the pipes' read ends, buffers untouched). The child gets
 * deathsig when the test process dies, so no run outlives its test. Returns its pid. */
static inline pid_t sink_spawn(const char *const *argv, int deathsig, sink *out, sink *err)
{
    int po[2], pe[2];
    cr_assert_eq(pipe2(po, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(pe, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, deathsig);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execv(argv[0], (char *const *)argv);
        _exit(125);
    }
    close(po[1]);
    close(pe[1]);
    out->fd = po[0];
    err->fd = pe[0];
    return pid;
}

#endif
