/* ctrain — deadlines and blocking socket waits (dist/poll_internal.h). */
#include "dist/poll_internal.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <time.h>

double cti_dist_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cti_dist_wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - cti_dist_now();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        /* poll takes int milliseconds: wait at most ~11 days per call, then look again */
        int r = poll(&p, 1, left > 1e6 ? 1000000000 : (int)ceil(left * 1e3));
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}
