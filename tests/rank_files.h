/* Files that a test's fork()ed ranks write for the test process to compare after it has
 * reaped them (rank 0's parameters, losses, statistics): dir/name.ext, read back from
 * tmpdir (tests/tmpdir.h), and the two comparisons the sharding tests make of them. */
#ifndef CT_TESTS_RANK_FILES_H
#define CT_TESTS_RANK_FILES_H

#include <criterion/criterion.h>
#include <math.h>
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
    return read_all(path, n);
}

/* ||a - b|| / ||b|| over the parameters in files a.params and b.params (f32);
 * *max_abs = max |a - b| when asked. Relative in norm: with 3 or more ranks a
 * reduce-scatter adds the ranks' gradients in another order than DDP's all-reduce,
 * and where they nearly cancel the last-bit difference is a large part of a tiny
 * gradient, which Adam (dividing by sqrt(v)) turns into a step of up to lr for that
 * one element. */
static inline double rel_diff(const char *a, const char *b, double *max_abs)
{
    size_t na, nb;
    float *x = read_file(a, "params", &na), *y = read_file(b, "params", &nb);
    cr_assert_eq(na, nb);
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < na / sizeof(float); i++) {
        double d = (double)x[i] - y[i];
        num += d * d;
        den += (double)y[i] * y[i];
        mx = fmax(mx, fabs(d));
    }
    free(x), free(y);
    if (max_abs) *max_abs = mx;
    return sqrt(num / den);
}

/* The largest relative difference of the per-step values (f64) in files a.ext and b.ext. */
static inline double curve_diff(const char *a, const char *b, const char *ext)
{
    size_t na, nb;
    double *x = read_file(a, ext, &na), *y = read_file(b, ext, &nb), d = 0;
    cr_assert_eq(na, nb);
    for (size_t i = 0; i < na / sizeof(double); i++) d = fmax(d, fabs(x[i] - y[i]) / fmax(fabs(y[i]), 1e-30));
    free(x), free(y);
    return d;
}

#endif
