/* ctrain — one thread-count setting for every parallel library in the process.
 *
 * ctrain's OpenMP loops, OpenBLAS and oneDNN all read this one number, so they
 * never oversubscribe the cores between them. The default is OMP_NUM_THREADS
 * when set, else the number of online cores.
 */
#ifndef CT_CORE_THREADS_H
#define CT_CORE_THREADS_H

/* n <= 0 restores the default. Applies to the calling thread at once and to
 * every other thread at its next kernel call (ct_threads_sync). */
void ct_set_num_threads(int n);
int ct_get_num_threads(void);
/* Brings the calling thread's OpenMP setting in line with ct_get_num_threads();
 * cheap when nothing changed. Kernel entry points call it. */
void ct_threads_sync(void);
/* Bumped on every ct_set_num_threads, so libraries with their own pools
 * (OpenBLAS) can re-apply lazily. */
int ct_threads_generation(void);

#endif
