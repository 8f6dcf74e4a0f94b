/* ctrain — one thread-count setting for every parallel library in the process.
 *
 * ctrain's OpenMP loops, OpenBLAS and oneDNN all read this one number, so they
 * never oversubscribe the cores between them. The default is OMP_NUM_THREADS
 * when set, else the number of online cores.
 */
#ifndef CT_CORE_THREADS_H
#define CT_CORE_THREADS_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/api.h"

/* n <= 0 restores the default. Applies to the calling thread at once and to
 * every other thread at its next kernel call. */
CT_API void ct_set_num_threads(int n);
/* The thread count the kernels use now. */
CT_API int ct_get_num_threads(void);

#ifdef __cplusplus
}
#endif

#endif
