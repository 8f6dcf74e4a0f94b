/* ctrain — deadlines and blocking waits on sockets, for the setup code that runs on
 * the caller's thread (the store client, the TCP and shared-memory setup); the comm
 * thread itself waits in its libuv loop. */
#ifndef CT_DIST_POLL_INTERNAL_H
#define CT_DIST_POLL_INTERNAL_H

/* Seconds on the monotonic clock: deadlines are now + timeout. */
double cti_dist_now(void);

/* Waits until fd is ready for events (POLLIN, POLLOUT) or the deadline passes,
 * retrying on EINTR. 1 ready, 0 deadline passed, -1 poll failed (errno set). */
int cti_dist_wait_fd(int fd, short events, double deadline);

#endif
