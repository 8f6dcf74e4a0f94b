/* ctrain — the thread setting as kernels see it (core/threads.h is the public side). */
#ifndef CT_CORE_THREADS_INTERNAL_H
#define CT_CORE_THREADS_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/threads.h"

/* Brings the calling thread's OpenMP setting in line with ct_get_num_threads();
 * cheap when nothing changed. Kernel entry points call it. */
void cti_threads_sync(void);
/* Bumped on every ct_set_num_threads, so libraries with their own pools
 * (OpenBLAS) can re-apply lazily. */
int cti_threads_generation(void);

#ifdef __cplusplus
}
#endif

#endif
