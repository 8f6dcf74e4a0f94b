/* Test helper: running a shell command line and reading how it ended, for the tests
 * that run `ctrain` or the examples as programs. */
#ifndef CT_TESTS_SHELL_H
#define CT_TESTS_SHELL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <sys/wait.h>

/* A wait status as a shell reports it: the exit status, or 128 + the signal. */
static inline int shell_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

/* Runs cmd with sh -c; its stdout (add 2>&1 to cmd for stderr too) into out, at most
 * cap - 1 bytes, NUL-terminated; returns shell_status of its end. */
static inline int shell_capture(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen: %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    return shell_status(pclose(p));
}

#endif
