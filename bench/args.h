/* ctrain benchmarks — the argument parsing the bench programs share. Each program
 * defines PROG (its name, for messages) before including this file. */
#ifndef CT_BENCH_ARGS_H
#define CT_BENCH_ARGS_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef PROG
#error "define PROG before including bench/args.h"
#endif

/* *out = the integer s in [lo, hi]; false with a message naming flag and value otherwise. */
static inline bool parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s %s: expected an integer in [%lld, %lld]\n", flag, s ? s : "(missing)", lo, hi);
        return false;
    }
    *out = v;
    return true;
}

/* sizes[0..*n) = the comma-separated byte counts of s, each a multiple of 4 in
 * [4, max_bytes], at most cap of them; false with a message otherwise. */
static inline bool parse_sizes(const char *s, long long max_bytes, int64_t *sizes, int cap, int *n)
{
    *n = 0;
    if (!s || !*s) {
        fprintf(stderr, PROG ": --sizes needs a comma-separated list of byte counts\n");
        return false;
    }
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || (*end && *end != ',') || v < 4 || v % 4 || v > max_bytes) {
            fprintf(stderr, PROG ": --sizes %s: each size must be a multiple of 4 bytes in [4, %lld]\n", s, max_bytes);
            return false;
        }
        if (*n == cap) {
            fprintf(stderr, PROG ": --sizes %s: at most %d sizes\n", s, cap);
            return false;
        }
        sizes[(*n)++] = v;
        if (!*end) return true;
        p = end + 1;
    }
}

#endif
