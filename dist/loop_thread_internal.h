/* ctrain — starting the threads that run dist/'s libuv loops (the comm engine's and
 * the store server's). */
#ifndef CT_DIST_LOOP_THREAD_INTERNAL_H
#define CT_DIST_LOOP_THREAD_INTERNAL_H

#include <uv.h>

/* uv_thread_create(t, fn, arg) with every asynchronous signal and SIGPIPE blocked in
 * the new thread: signals belong to the application's threads, and libuv writes
 * without MSG_NOSIGNAL, so a peer that vanished must fail a write with EPIPE, not kill
 * the process. The caller's own mask is left as it was. Returns 0 or a libuv error code
 * (*what names the call that failed). */
int cti_loop_thread_create(uv_thread_t *t, void (*fn)(void *), void *arg, const char **what);

#endif
