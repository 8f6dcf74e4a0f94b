/* Files that a test's fork()ed ranks write for the test process to compare after it has
 * reaped them (rank 0's parameters, losses, statistics): dir/name.ext, read back from
 * tmpdir (tests/tmpdir.h). */
#ifndef CT_TESTS_RANK_FILES_H
#define CT_TESTS_RANK_FILES_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/tmpdir.h"

/* In a child: no cr_ assertion (the runner would take its report for a stranger's). */
static inline void write_file(const char *dir, const char *name, const char *ext, const void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(p, 1, n, f);
        fclose(f);
    }
}

/* In the test process: tmpdir/name.ext, whole (malloc'ed; the caller frees it). */
static inline void *read_file(const char *name, const char *ext, size_t *n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%s", tmpdir, name, ext);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s is missing", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*n ? *n : 1);
    cr_assert_eq(fread(p, 1, *n, f), *n);
    fclose(f);
    return p;
}

#endif
