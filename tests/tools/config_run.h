/* What the configuration tests (test_config_file.c, test_config_cmd.c) share: running
 * `ctrain` (CTRAIN_BIN) under a time limit in a temporary directory, with
 * CTRAIN_CONFIG_FILE pointing into it so no user's default file is read, and writing
 * the files they read. */
#ifndef CT_TESTS_TOOLS_CONFIG_RUN_H
#define CT_TESTS_TOOLS_CONFIG_RUN_H

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/tmpdir.h"
#include "tests/shell.h"

static char out[1 << 16];

static inline const char *ctrain_bin(void)
{
    const char *v = getenv("CTRAIN_BIN");
    if (!v || !*v) cr_skip_test("CTRAIN_BIN is not set: run through `make test`, or set it to build/bin/ctrain");
    return v;
}

/* Runs `cd tmpdir && CTRAIN_CONFIG_FILE=tmpdir/default.yaml ctrain ARGS` (a shell line)
 * under a 60 s limit; stdout and stderr into out; returns the exit status. */
static inline int ctrain(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int ctrain(const char *fmt, ...)
{
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && env -u CTRAIN_MIXED_PRECISION -u CTRAIN_DEBUG -u CUDA_VISIBLE_DEVICES "
             "CTRAIN_CONFIG_FILE='%s/default.yaml' timeout 60 '%s' %s 2>&1 </dev/null",
             tmpdir, tmpdir, ctrain_bin(), args);
    return shell_capture(cmd, out, sizeof out);
}

static inline void write_file(const char *name, const char *text)
{
    FILE *f = fopen(path_of(name), "w");
    cr_assert_not_null(f, "cannot write %s", path_of(name));
    fputs(text, f);
    fclose(f);
}

/* The file's text; the buffer is static (one at a time). */
static inline const char *read_text(const char *name)
{
    static char buf[1 << 16];
    FILE *f = fopen(path_of(name), "r");
    cr_assert_not_null(f, "cannot read %s", path_of(name));
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static inline void assert_has(const char *needle)
{
    cr_assert(strstr(out, needle), "expected '%s' in:\n%s", needle, out);
}

static inline void assert_lacks(const char *needle)
{
    cr_assert(!strstr(out, needle), "did not expect '%s' in:\n%s", needle, out);
}

static inline void setup_dir(void)
{
    make_tmpdir_with("/tmp/ct_config_");
}

#endif
