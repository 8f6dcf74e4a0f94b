/* A temporary directory for tests that write files: created by a suite's or a
 * test's init, emptied and removed by its fini (also after a failed test). */
#ifndef CT_TESTS_TMPDIR_H
#define CT_TESTS_TMPDIR_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];

/* prefix: e.g. "/tmp/ct_tokds_" (six X's are appended) */
static inline void make_tmpdir_with(const char *prefix)
{
    snprintf(tmpdir, sizeof tmpdir, "%sXXXXXX", prefix);
    cr_assert_not_null(mkdtemp(tmpdir));
}

/* removes dir's files and subdirectories, then dir */
static inline void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue; /* too long: not ours */
        if (unlink(p) != 0) remove_tree(p);
    }
    closedir(d);
    rmdir(dir);
}

/* removes tmpdir and everything in it */
static inline void remove_tmpdir(void) { remove_tree(tmpdir); }

/* tmpdir/name; the last four results stay valid */
static inline const char *path_of(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

/* The whole file at path, malloc'ed with a NUL after its *n bytes (so text can be read
 * as a string); the caller frees it. A missing file fails the test. */
static inline uint8_t *read_all(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "%s", path);
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    cr_assert_not_null(b);
    cr_assert_eq(fread(b, 1, *n, fp), *n);
    b[*n] = 0;
    fclose(fp);
    return b;
}

/* tmpdir/text.txt: `lines` short lines ("line 7: the quick brown fox ..."), enough bytes
 * (400 lines: 21 KB) for a tiny GPT's train and validation split */
static inline void write_small_text(int lines)
{
    FILE *f = fopen(path_of("text.txt"), "w");
    cr_assert_not_null(f);
    for (int i = 0; i < lines; i++) fprintf(f, "line %d: the quick brown fox jumps over the lazy dog.\n", i);
    fclose(f);
}

#endif
