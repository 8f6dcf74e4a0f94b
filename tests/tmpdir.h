/* A temporary directory for tests that write files: created by a suite's or a
 * test's init, emptied and removed by its fini (also after a failed test). */
#ifndef CT_TESTS_TMPDIR_H
#define CT_TESTS_TMPDIR_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];

/* prefix: e.g. "/tmp/ct_tokds_" (six X's are appended) */
static inline void make_tmpdir_with(const char *prefix)
{
    snprintf(tmpdir, sizeof tmpdir, "%sXXXXXX", prefix);
    cr_assert_not_null(mkdtemp(tmpdir));
}

/* removes the files and empty subdirectories in tmpdir, then tmpdir */
static inline void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        if (rmdir(p) != 0) unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
}

/* tmpdir/name; the last four results stay valid */
static inline const char *path_of(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

#endif
