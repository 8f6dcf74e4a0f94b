/* f32 allreduce (sum) over ranks on this host: the TCP transport against shared memory.
 *
 *     make build/bench/dist/allreduce && build/bench/dist/allreduce [ranks (2)] [batches (7)]
 *
 * The program forks the ranks (rank 0 serves the store on a free port and tells the
 * others through a pipe); every rank creates one group
 * over each transport, and for each size, 1 KiB .. 64 MiB, runs batches of
 * back-to-back allreduces on the two groups in turn (a barrier before each batch).
 * Rank 0 prints, per size, the median over batches of the time per allreduce and the
 * algorithm bandwidth (bytes / time). Not a test: nothing is checked but the status.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "dist/store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int wait_ok(ct_work *w)
{
    ct_status st = ct_work_wait(w);
    ct_work_free(w);
    if (st) fprintf(stderr, "allreduce bench: %s\n", ct_last_error());
    return st ? 1 : 0;
}

/* Seconds per allreduce of t on g: one batch of iters after a barrier. */
static double batch(ct_pg *g, ct_tensor *t, int iters, int *failed)
{
    *failed |= wait_ok(ct_pg_barrier(g));
    double t0 = now_s();
    for (int i = 0; i < iters; i++) *failed |= wait_ok(ct_pg_allreduce(g, t, CT_REDUCE_SUM));
    return (now_s() - t0) / iters;
}

static int rank_main(int rank, int world, int port, ct_store *store, int batches)
{
    const char *names[2] = {"tcp", "shm"};
    ct_pg *g[2];
    for (int k = 0; k < 2; k++) {
        g[k] = ct_pg_new(&(ct_pg_config){.rank = rank, .world_size = world, .master_port = port,
                                          .timeout_s = 60, .store = store, .transport = names[k]});
        if (!g[k]) {
            fprintf(stderr, "rank %d: %s\n", rank, ct_last_error());
            return 1;
        }
    }
    if (rank == 0) {
        printf("%d ranks, f32 allreduce (sum), median of %d batches\n\n", world, batches);
        printf("| bytes | tcp (us) | shm (us) | tcp / shm | shm algbw (GB/s) |\n|---:|---:|---:|---:|---:|\n");
    }
    int failed = 0;
    double *sec[2] = {malloc(sizeof(double) * (size_t)batches), malloc(sizeof(double) * (size_t)batches)};
    for (size_t bytes = 1024; bytes <= (64u << 20) && !failed; bytes *= 4) {
        int iters = (int)((256u << 20) / bytes);
        iters = iters < 3 ? 3 : iters > 200 ? 200 : iters;
        ct_frame_push();
        ct_tensor *t = ct_tensor_ones(CT_DTYPE_F32, 1, (int64_t[]){(int64_t)(bytes / 4)});
        for (int k = 0; k < 2; k++) batch(g[k], t, 2, &failed); /* warm-up */
        for (int b = 0; b < batches; b++)
            for (int k = 0; k < 2; k++) sec[k][b] = batch(g[k], t, iters, &failed);
        ct_frame_pop();
        for (int k = 0; k < 2; k++) qsort(sec[k], (size_t)batches, sizeof(double), cmp_double);
        double tcp = sec[0][batches / 2], shm = sec[1][batches / 2];
        if (rank == 0) {
            char size[32];
            if (bytes >= (1u << 20)) snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
            else snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
            printf("| %s | %.1f | %.1f | %.2f | %.2f |\n", size, tcp * 1e6, shm * 1e6, tcp / shm,
                   (double)bytes / shm / 1e9);
            fflush(stdout);
        }
    }
    free(sec[0]);
    free(sec[1]);
    ct_pg_free(g[1]);
    ct_pg_free(g[0]);
    return failed;
}

int main(int argc, char **argv)
{
    int world = argc > 1 ? atoi(argv[1]) : 2, batches = argc > 2 ? atoi(argv[2]) : 7;
    if (world < 2 || world > 64 || batches < 1) {
        fprintf(stderr, "usage: %s [ranks (2..64)] [batches]\n", argv[0]);
        return 2;
    }
    int fds[2];
    if (pipe(fds)) {
        perror("pipe");
        return 1;
    }
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid) continue;
        int port = -1;
        ct_store *s = NULL;
        if (r == 0) {
            s = ct_store_new(&(ct_store_config){.serve = true, .world_size = world, .timeout_s = 60});
            if (s) port = ct_store_port(s);
            else fprintf(stderr, "allreduce bench: %s\n", ct_last_error());
            for (int i = 1; i < world; i++)
                if (write(fds[1], &port, sizeof port) != sizeof port) _exit(1);
        } else if (read(fds[0], &port, sizeof port) != sizeof port) {
            _exit(1);
        }
        int rc = port < 0 ? 1 : rank_main(r, world, port, s, batches);
        ct_store_free(s);
        _exit(rc);
    }
    int rc = 0;
    for (int r = 0; r < world; r++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) rc = 1;
    }
    return rc;
}
