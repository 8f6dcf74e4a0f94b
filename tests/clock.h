/* The tests' clock: seconds of CLOCK_MONOTONIC, for timing runs and bounding waits. */
#ifndef CT_TESTS_CLOCK_H
#define CT_TESTS_CLOCK_H

#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
