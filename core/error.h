/* ctrain — errors.
 *
 * Library code never exits or aborts on a caller's mistake. A failing function
 * returns NULL (tensor results) or a non-zero ct_status, and records a message in
 * a thread-local buffer that names the op and its operands (shapes, dtypes,
 * devices, file, key). ct_last_error() reads it. Ops given a NULL input return
 * NULL without overwriting the first message, so a caller may check once per
 * step and still see the original cause.
 */
#ifndef CT_CORE_ERROR_H
#define CT_CORE_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdio.h>
#include <stdlib.h>

#include "core/api.h"

typedef enum ct_status {
    CT_OK = 0,
    CT_ERR_INVALID,     /* bad argument: shape, dtype, device, value */
    CT_ERR_NOMEM,       /* allocation failed */
    CT_ERR_IO,          /* a system call on a file or socket failed */
    CT_ERR_FORMAT,      /* a file or message does not follow its format */
    CT_ERR_UNSUPPORTED, /* valid request this build or machine cannot do */
    CT_ERR_INTERNAL,    /* a library call failed unexpectedly */
    CT_ERR_TIMEOUT,     /* a peer, the store or a collective did not answer in time */
    CT_ERR_PEER,        /* another rank failed, disconnected or disagreed (desync) */
    CT_ERR_DEVICE,      /* a GPU, its driver or a GPU library reported a failure */
} ct_status;

/* The message of the last failure on this thread; "" when none. Borrowed. */
CT_API const char *ct_last_error(void);
/* The status of the last failure on this thread (CT_OK when none). */
CT_API ct_status ct_last_status(void);
/* Forgets this thread's last failure (message and status). */
CT_API void ct_error_clear(void);
/* Human name of a status ("invalid argument", ...). */
CT_API const char *ct_status_str(ct_status st);

/* Records a failure and returns st, so `return ct_error_set(CT_ERR_INVALID, ...)`
 * reads naturally. printf-style. */
CT_API ct_status ct_error_set(ct_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends context to the current message ("save_model: " + old message). */
CT_API ct_status ct_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Internal invariant, always on. Never used for a caller's mistake. */
#define CT_ASSERT(cond)                                                                   \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "ctrain: internal error at %s:%d: %s\n", __FILE__, __LINE__, \
                    #cond);                                                               \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
