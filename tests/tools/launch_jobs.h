/* Test helper for the restart and elastic tests of `ctrain launch`
 * (tests/tools/test_launch_resume.c, tests/tools/test_launch_elastic.c): launchers
 * started as `sh -c` command lines with their output in a file, waited for with a
 * deadline, and killed with every descendant (the ranks run in sessions of their own,
 * so a process-group signal would miss them). A job dies with its test
 * (PR_SET_PDEATHSIG), and a job that misses its deadline is killed and fails the test
 * with its output. */
#ifndef CT_TESTS_TOOLS_LAUNCH_JOBS_H
#define CT_TESTS_TOOLS_LAUNCH_JOBS_H

#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/clock.h"
#include "tests/proc_tree.h"
#include "tests/shell.h"

typedef struct {
    pid_t pid;
    char log[1024]; /* its stdout and stderr */
    int status;    /* once reaped: the exit status, or 128 + signal */
    bool reaped;
} job;

/* Starts `sh -c "exec CMD"` with stdout and stderr into log. */
static inline void job_start(job *j, const char *cmd, const char *log)
{
    *j = (job){0};
    snprintf(j->log, sizeof j->log, "%s", log);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0, "%s: %s", log, strerror(errno));
    char *full = NULL;
    cr_assert_geq(asprintf(&full, "exec %s", cmd), 0);
    j->pid = fork();
    cr_assert_geq(j->pid, 0, "fork: %s", strerror(errno));
    if (j->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(125);
    }
    free(full);
    close(fd);
}

/* The whole file, NUL-terminated ("" when missing). Caller frees. */
static inline char *job_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        buf = malloc((size_t)(len > 0 ? len : 0) + 1);
        cr_assert_not_null(buf);
        n = fread(buf, 1, (size_t)(len > 0 ? len : 0), f);
        fclose(f);
    } else {
        buf = malloc(1);
        cr_assert_not_null(buf);
    }
    buf[n] = '\0';
    return buf;
}

/* SIGKILLs the job and every descendant (tests/proc_tree.h): a machine that is gone. */
static inline void job_kill_tree(job *j) { proc_kill_tree(j->pid); }

/* Reaps the job within timeout_s (else kills it and fails, showing its output);
 * returns its status. */
static inline int job_wait(job *j, double timeout_s)
{
    if (j->reaped) return j->status;
    double end = now_s() + timeout_s;
    for (;;) {
        int st;
        pid_t p = waitpid(j->pid, &st, WNOHANG);
        cr_assert_geq(p, 0, "waitpid: %s", strerror(errno));
        if (p == j->pid) {
            j->reaped = true;
            j->status = shell_status(st);
            return j->status;
        }
        if (now_s() > end) {
            job_kill_tree(j);
            waitpid(j->pid, NULL, 0);
            j->reaped = true;
            char *out = job_slurp(j->log);
            cr_assert_fail("%s: still running after %.0f s; output:\n%s", j->log, timeout_s, out);
        }
        usleep(20000);
    }
}

/* Waits until dir holds an entry named prefix<digits> (a complete automatic
 * checkpoint's name: an interrupted save's ".tmp-<id>" does not count). */
static inline void job_wait_entry(job *j, const char *dir, const char *prefix, double timeout_s)
{
    double end = now_s() + timeout_s;
    size_t np = strlen(prefix);
    for (;;) {
        DIR *d = opendir(dir);
        for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
            const char *c = e->d_name;
            if (strncmp(c, prefix, np) || !c[np]) continue;
            for (c += np; isdigit((unsigned char)*c); c++) {}
            if (!*c) {
                closedir(d);
                return;
            }
        }
        if (d) closedir(d);
        int st;
        if (!j->reaped && waitpid(j->pid, &st, WNOHANG) == j->pid) j->reaped = true, j->status = shell_status(st);
        if (j->reaped || now_s() > end) {
            if (!j->reaped) job_kill_tree(j), waitpid(j->pid, NULL, 0);
            char *out = job_slurp(j->log);
            cr_assert_fail("no %s<i> in %s %s; output of %s:\n%s", prefix, dir,
                           j->reaped ? "before the job ended" : "in time", j->log, out);
        }
        usleep(5000);
    }
}

/* Whether two files hold the same bytes. */
static inline bool job_same_file(const char *a, const char *b)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

#endif
