#include "core/threads_internal.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_int num_threads;  /* 0 = not yet resolved */
static atomic_int generation = 1;
static _Thread_local int synced_generation;

static int default_threads(void)
{
    const char *env = getenv("OMP_NUM_THREADS");
    if (env) {
        int n = atoi(env);
        if (n > 0) return n;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? (int)cores : 1;
}

void ct_set_num_threads(int n)
{
    atomic_store(&num_threads, n > 0 ? n : default_threads());
    atomic_fetch_add(&generation, 1);
    cti_threads_sync();
}

int ct_get_num_threads(void)
{
    int n = atomic_load(&num_threads);
    if (n == 0) {
        int expected = 0;
        n = default_threads();
        if (!atomic_compare_exchange_strong(&num_threads, &expected, n)) n = expected;
    }
    return n;
}

int cti_threads_generation(void) { return atomic_load(&generation); }

void cti_threads_sync(void)
{
    int g = atomic_load(&generation);
    if (synced_generation == g) return;
    omp_set_num_threads(ct_get_num_threads());
    synced_generation = g;
}
