/* A person at a terminal, for tests of interactive commands: a child process runs
 * on the slave side of a pseudo-terminal (canonical mode with echo, as a shell leaves
 * it) and the test, on the master side, waits for each expected text before typing
 * its answer. Every wait has a deadline; on a miss the child is killed and the test
 * fails showing what the terminal showed. One session per test process. */
#ifndef CT_TESTS_PTY_SESSION_H
#define CT_TESTS_PTY_SESSION_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define PTY_STEP_SECONDS 10 /* the machine is shared: an answer may take a while to come */

typedef struct {
    int master;
    pid_t pid;
    bool exited; /* reaped: status holds its wait status */
    int status;
    char buf[1 << 17]; /* everything the terminal showed, '\r' removed */
    size_t len, pos;   /* pos: where the next expected text is looked for */
} pty_session;

static pty_session S;

/* Runs in the child with the slave's path; does not return. */
typedef void (*pty_child_fn)(const char *slave, void *arg);

/* Makes the slave the child's controlling terminal and its stdin, stdout and stderr. */
static inline void pty_child_attach(const char *slave)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setsid();
    int fd = open(slave, O_RDWR);
    if (fd < 0) _exit(120);
    for (int k = 0; k < 3; k++)
        if (dup2(fd, k) < 0) _exit(121);
    if (fd > 2) close(fd);
}

static inline void pty_stop(void)
{
    if (S.pid > 0 && !S.exited) {
        kill(S.pid, SIGKILL);
        waitpid(S.pid, NULL, 0);
    }
    S.pid = 0;
}

static inline void pty_start(pty_child_fn fn, void *arg)
{
    S.master = posix_openpt(O_RDWR | O_NOCTTY);
    cr_assert_geq(S.master, 0, "posix_openpt: %s", strerror(errno));
    cr_assert_eq(grantpt(S.master), 0);
    cr_assert_eq(unlockpt(S.master), 0);
    char slave[128];
    cr_assert_eq(ptsname_r(S.master, slave, sizeof slave), 0);
    int sfd = open(slave, O_RDWR | O_NOCTTY);
    cr_assert_geq(sfd, 0);
    struct termios t;
    cr_assert_eq(tcgetattr(sfd, &t), 0);
    t.c_lflag |= ICANON | ECHO; /* shown \n arrives as \r\n: pty_pump drops the \r */
    cr_assert_eq(tcsetattr(sfd, TCSANOW, &t), 0);
    close(sfd);
    S.len = S.pos = 0;
    S.buf[0] = 0;
    S.exited = false;
    fflush(NULL);
    S.pid = fork();
    cr_assert_geq(S.pid, 0);
    if (S.pid == 0) {
        close(S.master);
        fn(slave, arg);
        _exit(122);
    }
}

/* Reads what the terminal shows for up to ms; false once the child has ended and
 * everything it wrote was read. */
static inline bool pty_pump(int ms)
{
    struct pollfd p = {.fd = S.master, .events = POLLIN};
    int k = poll(&p, 1, ms);
    if (k < 0 || (k == 1 && !(p.revents & POLLIN))) {
        /* POLLHUP: no process holds the slave, before the child opens it or after it
         * ended; a read would fail at once with EIO */
        if (!S.exited && waitpid(S.pid, &S.status, WNOHANG) == S.pid) S.exited = true;
        if (S.exited) return false;
        usleep(10000);
        return true;
    }
    if (k == 0) return true;
    char tmp[4096];
    ssize_t n = read(S.master, tmp, sizeof tmp);
    for (ssize_t i = 0; i < n && S.len + 1 < sizeof S.buf; i++)
        if (tmp[i] != '\r') S.buf[S.len++] = tmp[i];
    S.buf[S.len] = 0;
    return true;
}

static inline double pty_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits for text to appear after the previous match, or fails the test. */
static inline void pty_expect(const char *text)
{
    double end = pty_now() + PTY_STEP_SECONDS;
    for (;;) {
        const char *hit = strstr(S.buf + S.pos, text);
        if (hit) {
            S.pos = (size_t)(hit - S.buf) + strlen(text);
            return;
        }
        double left = end - pty_now();
        if (left <= 0 || !pty_pump((int)(left * 1000) + 1)) {
            bool timed_out = left <= 0;
            pty_stop();
            cr_assert_fail("%s waiting for \"%s\"; the terminal showed:\n%s", timed_out ? "timed out" : "the child ended",
                           text, S.buf);
        }
    }
}

/* Types answer and Enter; NULL is end of input (Ctrl-D at the start of a line). */
static inline void pty_type(const char *answer)
{
    if (!answer) {
        cr_assert_eq(write(S.master, "\x04", 1), 1);
        return;
    }
    char line[1200];
    int n = snprintf(line, sizeof line, "%s\n", answer);
    cr_assert(n > 0 && n < (int)sizeof line);
    cr_assert_eq(write(S.master, line, (size_t)n), n);
}

/* One question (text that shows it is being asked) and the answer typed to it. */
typedef struct {
    const char *question, *answer;
} pty_step;

static inline void pty_play(const pty_step *steps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        pty_expect(steps[i].question);
        pty_type(steps[i].answer);
    }
}

/* Reads until the child has ended (within the deadline); returns its wait status. */
static inline int pty_wait_exit(void)
{
    double end = pty_now() + PTY_STEP_SECONDS;
    while (pty_pump(50))
        if (pty_now() > end) {
            pty_stop();
            cr_assert_fail("the child did not end; the terminal showed:\n%s", S.buf);
        }
    close(S.master);
    S.pid = 0;
    return S.status;
}

static inline int pty_count(const char *needle)
{
    int n = 0;
    for (const char *p = S.buf; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

#endif
