/* Tests for core/atomic_file.c: a file appears whole or not at all; reads whole. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"

/* a fresh directory for one test (removed by the test) */
static void tmpdir(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/ct_atomic_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

/* entries of dir other than . and .. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void slurp(const char *path, char *buf, size_t cap, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s missing", path);
    *n = fread(buf, 1, cap, f);
    fclose(f);
}

Test(atomic_file, commit_replaces_the_file_and_leaves_no_temporary)
{
    char dir[64], path[128], got[64];
    tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/out.bin", dir);
    FILE *f = fopen(path, "w");
    fputs("old contents", f);
    fclose(f);

    cti_atomic_file w;
    cr_assert_eq(cti_atomic_open(&w, path, "test"), CT_OK);
    cr_assert_eq(cti_atomic_write(&w, "xxxxWORLD", 9), CT_OK);
    /* before the commit the old file is still whole */
    size_t n;
    slurp(path, got, sizeof got, &n);
    cr_assert_eq(n, 12);
    cr_assert_eq(cti_atomic_pwrite(&w, "HELO", 4, 0), CT_OK);
    cr_assert_eq(cti_atomic_commit(&w, CT_OK, 1), CT_OK);
    slurp(path, got, sizeof got, &n);
    cr_assert_eq(n, 9);
    cr_assert_eq(memcmp(got, "HELOWORLD", 9), 0);
    cr_assert_eq(entries(dir), 1, "the temporary file was left behind");
    unlink(path);
    rmdir(dir);
}

Test(atomic_file, a_failure_keeps_the_old_file_and_removes_the_temporary)
{
    char dir[64], path[128], got[64];
    tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/cfg.json", dir);
    cr_assert_eq(cti_file_write_atomic(path, "{}", 2, "test"), CT_OK);

    cti_atomic_file w;
    cr_assert_eq(cti_atomic_open(&w, path, "test"), CT_OK);
    cr_assert_eq(cti_atomic_write(&w, "{\"half", 6), CT_OK);
    ct_status earlier = ct_error_set(CT_ERR_INVALID, "the caller failed");
    cr_assert_eq(cti_atomic_commit(&w, earlier, 0), CT_ERR_INVALID, "the caller's failure is returned");
    size_t n;
    slurp(path, got, sizeof got, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(memcmp(got, "{}", 2), 0);
    cr_assert_eq(entries(dir), 1);
    unlink(path);
    rmdir(dir);
}

Test(atomic_file, errors_name_the_op_and_the_file)
{
    cti_atomic_file w;
    cr_assert_eq(cti_atomic_open(&w, "/nonexistent-dir/x.json", "save_config"), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), "save_config: cannot create '/nonexistent-dir/x.json.tmp."), "%s",
              ct_last_error());
    cr_assert_eq(cti_file_write_atomic("", "x", 1, "save_config"), CT_ERR_INVALID);
}

Test(atomic_file, read_text_whole_with_a_limit)
{
    char dir[64], path[128];
    tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/t.txt", dir);
    /* larger than the reader's first buffer, so it grows */
    enum { N = 10000 };
    char *text = malloc(N);
    for (int i = 0; i < N; i++) text[i] = (char)('a' + i % 26);
    cr_assert_eq(cti_file_write_atomic(path, text, N, "test"), CT_OK);
    size_t n = 0;
    char *got = cti_file_read_text(path, N, "test", &n);
    cr_assert_not_null(got, "%s", ct_last_error());
    cr_assert_eq(n, N);
    cr_assert_eq(memcmp(got, text, N), 0);
    cr_assert_eq(got[N], '\0');
    free(got);
    cr_assert_null(cti_file_read_text(path, N - 1, "config", &n));
    cr_assert_eq(ct_last_status(), CT_ERR_FORMAT);
    cr_assert(strstr(ct_last_error(), "larger than 9999 bytes"), "%s", ct_last_error());
    cr_assert_null(cti_file_read_text("/nonexistent-dir/t.txt", N, "config", &n));
    cr_assert_eq(ct_last_status(), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), "config: cannot open '/nonexistent-dir/t.txt': No such file"), "%s",
              ct_last_error());
    /* an empty file is an empty string */
    cr_assert_eq(cti_file_write_atomic(path, "", 0, "test"), CT_OK);
    got = cti_file_read_text(path, 10, "test", &n);
    cr_assert(got && n == 0 && got[0] == '\0');
    free(got);
    free(text);
    unlink(path);
    rmdir(dir);
}
