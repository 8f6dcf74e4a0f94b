/* Allreduce bus bandwidth of the MPI library (plain MPI_Allreduce), the twin of
 * allreduce.c.
 *
 *   mpicc -O3 -std=c11 -D_GNU_SOURCE -I. -o allreduce_mpi \
 *       bench/collectives/allreduce_mpi.c -lm
 *   mpirun -np 2 --mca pml ob1 --mca btl self,vader allreduce_mpi --label openmpi-shm
 *       [--sizes B,B,...] [--min-time S] [--min-iters N] [--warmup W]
 *
 * bench/collectives/run.sh builds and runs it. The method is allreduce.c's, step for
 * step: per size B (bytes, a multiple of 4) a check that B/4 f32 holding rank+1 sum to
 * n(n+1)/2, then zeros, W timed warm-up calls (default 5), the iteration count
 * max(N, ceil(S / the largest per-rank fastest warm-up call)) (default S = 0.2 s, N = 5,
 * at most 200000) agreed through an MPI_Allreduce MAX, each timed call alone, and the
 * largest per-rank median. Calls are in place (MPI_IN_PLACE), MPI_FLOAT, MPI_SUM on
 * MPI_COMM_WORLD. algbw = B / time, busbw = algbw * 2 (n-1) / n, in GB/s (1e9 B/s).
 *
 * Output, rank 0 only: one JSON line per size on stdout,
 *   {"impl":"<label>","ranks":n,"bytes":B,"iters":..,"warmup":W,"median_us":..,
 *    "algbw_gbs":..,"busbw_gbs":..}
 * Errors print a message on stderr and exit with status 2 (after MPI_Abort once MPI is
 * up, so that mpirun stops the other ranks). A rank dies with its parent
 * (PR_SET_PDEATHSIG), so an mpirun killed by a timeout leaves no rank behind.
 *
 * The Makefile's bench build leaves it out (cc does not know where mpi.h is);
 * bench/collectives/run.sh builds it with mpicc.
 */

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "bench/timing.h"

#define PROG "allreduce_mpi"
#include "bench/args.h" /* after PROG: its messages name the program */
#include "bench/collectives/allreduce_opts.h"

typedef struct options {
    const char *label;
    timing_opts t; /* sizes, min_time, min_iters, warmup */
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np N " PROG " [--label NAME] [--sizes B,B,...] [--min-time S] [--min-iters N]\n"
            "                     [--warmup W]\n"
            "  --label NAME   the \"impl\" of the JSON lines (default openmpi)\n"
            "  --sizes B,...  message sizes in bytes, multiples of 4 (default 1024,4096,...,67108864)\n"
            "  --min-time S   time each size for at least S seconds (default 0.2)\n"
            "  --min-iters N  and at least N calls (default 5)\n"
            "  --warmup W     untimed calls per size first, W >= 1 (default 5)\n"
            "Rank 0 prints one JSON line per size.\n");
}

/* 0 ok, 1 --help, -1 error (message printed) */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.label = "openmpi"};
    timing_opts_init(&o->t);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--label")) {
            if (!v || !*v || strpbrk(v, "\"\\")) {
                fprintf(stderr, PROG ": --label needs a name without quotes or backslashes\n");
                return -1;
            }
            o->label = v;
            i++;
        } else {
            int taken = timing_opts_parse(&o->t, a, v, 4LL * 2147483647LL);
            if (taken < 0) return -1;
            if (!taken) {
                fprintf(stderr, PROG ": unknown argument '%s' (see --help)\n", a);
                return -1;
            }
            i++;
        }
    }
    return 0;
}

/* Stops every rank: mpirun ends the job when one rank aborts. */
static void fail(int rank, const char *what, int err)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (err != MPI_SUCCESS) MPI_Error_string(err, msg, &len);
    fprintf(stderr, PROG ": rank %d: %s%s%s\n", rank, what, err != MPI_SUCCESS ? ": " : "", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2); /* not reached: MPI_Abort does not return */
}

/* The smallest of v[0..n): the warm-up's estimate of a call, which a slow start
 * (a peer still setting up, a descheduled rank) does not inflate. */
static double fastest(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static int64_t first_mismatch(const float *x, int64_t n, float want)
{
    for (int64_t i = 0; i < n; i++)
        if (x[i] != want) return i;
    return -1;
}

static double max_over_ranks(int rank, double v)
{
    double out = 0;
    int err = MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (err != MPI_SUCCESS) fail(rank, "MPI_Allreduce(MAX) of the timings", err);
    return out;
}

static void sum_in_place(int rank, float *x, int64_t count)
{
    int err = MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (err != MPI_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "MPI_Allreduce of %lld floats", (long long)count);
        fail(rank, what, err);
    }
}

static void bench_size(const options *o, int rank, int n, int64_t bytes, double *times)
{
    int64_t count = bytes / 4, bad;
    /* 64-byte aligned as ctrain's CPU tensors are; size rounded up as aligned_alloc wants */
    float *x = aligned_alloc(64, ((size_t)bytes + 63) / 64 * 64);
    if (!x) {
        char what[96];
        snprintf(what, sizeof what, "out of memory for %lld bytes", (long long)bytes);
        fail(rank, what, MPI_SUCCESS);
    }
    float want = (float)n * (float)(n + 1) / 2;
    for (int64_t i = 0; i < count; i++) x[i] = (float)(rank + 1);
    sum_in_place(rank, x, count);
    if ((bad = first_mismatch(x, count, want)) >= 0) {
        char what[160];
        snprintf(what, sizeof what, "allreduce of %lld bytes: element %lld is %g, expected %g", (long long)bytes,
                 (long long)bad, (double)x[bad], (double)want);
        fail(rank, what, MPI_SUCCESS);
    }
    memset(x, 0, (size_t)bytes);
    for (int i = 0; i < o->t.warmup; i++) {
        double t0 = now();
        sum_in_place(rank, x, count);
        times[i] = now() - t0;
    }
    double est = max_over_ranks(rank, fastest(times, o->t.warmup));
    double want_iters = est > 0 ? ceil(o->t.min_time / est) : MAX_ITERS;
    int iters = want_iters < o->t.min_iters ? o->t.min_iters : want_iters > MAX_ITERS ? MAX_ITERS : (int)want_iters;
    for (int i = 0; i < iters; i++) {
        double t0 = now();
        sum_in_place(rank, x, count);
        times[i] = now() - t0;
    }
    double med = max_over_ranks(rank, median(times, iters));
    if ((bad = first_mismatch(x, count, 0.0f)) >= 0) {
        char what[160];
        snprintf(what, sizeof what, "after allreduces of zeros (%lld bytes) element %lld is %g", (long long)bytes,
                 (long long)bad, (double)x[bad]);
        fail(rank, what, MPI_SUCCESS);
    }
    free(x);
    if (rank == 0) {
        double algbw = (double)bytes / med;
        printf("{\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%lld,\"iters\":%d,\"warmup\":%d,\"median_us\":%.3f,"
               "\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f}\n",
               o->label, n, (long long)bytes, iters, o->t.warmup, 1e6 * med, 1e-9 * algbw,
               1e-9 * algbw * 2.0 * (n - 1) / n);
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent) {
        fprintf(stderr, PROG ": mpirun is gone (or prctl failed: %s)\n", strerror(errno));
        return 2;
    }
    options o;
    int a = parse_args(argc, argv, &o);
    if (a) return a > 0 ? 0 : 2;

    int err = MPI_Init(&argc, &argv);
    if (err != MPI_SUCCESS) {
        fprintf(stderr, PROG ": MPI_Init failed (error %d); run it under mpirun\n", err);
        return 2;
    }
    /* errors come back as codes, so the message can say which call failed */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n < 2) fail(rank, "needs at least 2 ranks (mpirun -np 2)", MPI_SUCCESS);
    double *times = malloc((size_t)(MAX_ITERS > o.t.warmup ? MAX_ITERS : o.t.warmup) * sizeof *times);
    if (!times) fail(rank, "out of memory for the timings", MPI_SUCCESS);
    for (int i = 0; i < o.t.nsizes; i++) bench_size(&o, rank, n, o.t.sizes[i], times);
    free(times);
    MPI_Finalize();
    return 0;
}
