/* ctrain benchmarks — what the allreduce programs (allreduce.c for ctrain,
 * allreduce_mpi.c for OpenMPI) share: the message sizes and the timing options, so
 * both measure the same way. Include after bench/args.h. */
#ifndef CT_BENCH_ALLREDUCE_OPTS_H
#define CT_BENCH_ALLREDUCE_OPTS_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 64
#define MAX_ITERS 200000

static const int64_t default_sizes[] = {1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10,
                                        1 << 20, 4 << 20, 16 << 20, 64 << 20};

typedef struct timing_opts {
    int64_t sizes[MAX_SIZES];
    int nsizes;
    double min_time;
    int min_iters, warmup;
} timing_opts;

/* The defaults: every size of default_sizes, >= 0.2 s and >= 5 calls, 5 warm-ups. */
static inline void timing_opts_init(timing_opts *t)
{
    *t = (timing_opts){.min_time = 0.2, .min_iters = 5, .warmup = 5};
    t->nsizes = (int)(sizeof default_sizes / sizeof *default_sizes);
    memcpy(t->sizes, default_sizes, sizeof default_sizes);
}

/* Parses flag a with value v when it is one of --sizes (each at most max_bytes),
 * --min-time, --min-iters, --warmup: 1 taken, 0 not one of them, -1 bad value
 * (message printed). */
static inline int timing_opts_parse(timing_opts *t, const char *a, const char *v, long long max_bytes)
{
    long long x;
    if (!strcmp(a, "--sizes")) return parse_sizes(v, max_bytes, t->sizes, MAX_SIZES, &t->nsizes) ? 1 : -1;
    if (!strcmp(a, "--min-time")) {
        char *end;
        errno = 0;
        double s = v ? strtod(v, &end) : -1;
        if (!v || errno || *end || end == v || !(s >= 0 && s <= 3600)) {
            fprintf(stderr, PROG ": --min-time %s: expected seconds in [0, 3600]\n", v ? v : "(missing)");
            return -1;
        }
        t->min_time = s;
        return 1;
    }
    if (!strcmp(a, "--min-iters")) {
        if (!parse_int(a, v, 1, MAX_ITERS, &x)) return -1;
        t->min_iters = (int)x;
        return 1;
    }
    if (!strcmp(a, "--warmup")) {
        if (!parse_int(a, v, 1, 1000000, &x)) return -1;
        t->warmup = (int)x;
        return 1;
    }
    return 0;
}

#endif
