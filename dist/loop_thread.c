/* ctrain — loop threads with signals blocked (dist/loop_thread_internal.h). */
#include "dist/loop_thread_internal.h"

#include <pthread.h>
#include <signal.h>

#include "core/error.h"

int cti_loop_thread_create(uv_thread_t *t, void (*fn)(void *), void *arg, const char **what)
{
    /* a thread inherits the mask it is created with: block, create, restore */
    sigset_t block, old;
    sigfillset(&block);
    sigdelset(&block, SIGSEGV); /* synchronous faults still reach their handlers */
    sigdelset(&block, SIGBUS);
    sigdelset(&block, SIGFPE);
    sigdelset(&block, SIGILL);
    *what = "pthread_sigmask";
    int rc = -pthread_sigmask(SIG_BLOCK, &block, &old);
    if (rc) return rc;
    *what = "uv_thread_create";
    rc = uv_thread_create(t, fn, arg);
    int rc2 = pthread_sigmask(SIG_SETMASK, &old, NULL);
    CT_ASSERT(rc2 == 0); /* restoring a mask that was valid a moment ago */
    return rc;
}
