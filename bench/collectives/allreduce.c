/* Allreduce bus bandwidth of ctrain's process group (dist/pg.h), one transport per run.
 *
 *   ctrain launch --num_processes 2 --main_process_port 0 --num_cpu_threads_per_process 1 \
 *       build/bench/collectives/allreduce --transport tcp|shm [--sizes B,B,...]
 *       [--min-time S] [--min-iters N] [--warmup W] [--unavailable-ok]
 *
 * Ranks come from the launcher's environment (ct_dist_env_detect: RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT, CTRAIN_TIMEOUT). For each message size B (bytes, a multiple
 * of 4; default 1 KiB, 4 KiB, ... 64 MiB in steps of 4x) every rank:
 *   1. checks the result once: a tensor of B/4 f32 holding rank+1, allreduced (sum),
 *      must hold n(n+1)/2 everywhere (exact in f32 for any small n);
 *   2. zeroes the tensor, so the timed calls below add zeros to zeros and the values
 *      never grow toward inf however many calls run;
 *   3. runs W warm-up calls (default 5), each timed; the group agrees (an allreduce
 *      MAX) on the largest over the ranks of each rank's fastest warm-up call, and from
 *      it on the iteration count iters = max(N, ceil(S / that time)) (default S = 0.2 s,
 *      N = 5; at most 200000), so every rank runs the same calls (the fastest call, not
 *      the median: a slow start must not cut the timed calls to a handful);
 *   4. times each of the iters calls alone (submit + ct_work_wait) and takes the median;
 *      the reported time is the largest median over the ranks (an allreduce MAX): a
 *      collective is done when its slowest rank is.
 * The calls are in place (ct_pg_allreduce), as DDP reduces its buckets. Bandwidths as
 * nccl-tests define them, in GB/s (1e9 bytes/s):
 *     algbw = B / time,   busbw = algbw * 2 (n-1) / n
 * (busbw is comparable across rank counts: a ring allreduce moves 2 (n-1)/n * B over
 * each rank's link.)
 *
 * Output, rank 0 only: one JSON line per size on stdout,
 *   {"impl":"ctrain-<transport>","transport":..,"ranks":n,"bytes":B,"iters":..,
 *    "warmup":W,"median_us":..,"algbw_gbs":..,"busbw_gbs":..}
 * "transport" is what the group reports using (ct_pg_transport); a group that runs
 * on another transport than the one asked for is an error.
 * When the group cannot be created (say "shm" is not built into this library),
 * --unavailable-ok makes every rank print {"impl":..,"transport":..,"unavailable":"<error>"}
 * and exit 0; without it that is an error. Errors (bad arguments, a failed call, a wrong
 * sum) print a message on stderr and exit with status 2.
 *
 * A rank dies with its parent (PR_SET_PDEATHSIG), so a launcher killed by a timeout
 * leaves no rank behind.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "bench/timing.h"
#include "ctrain.h"

#define PROG "allreduce"
#include "bench/args.h" /* after PROG: its messages name the program */
#include "bench/collectives/allreduce_opts.h"

typedef struct options {
    const char *transport;
    timing_opts t; /* sizes, min_time, min_iters, warmup */
    bool unavailable_ok;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --transport tcp|shm [--sizes B,B,...] [--min-time S] [--min-iters N] [--warmup W]\n"
            "                 [--unavailable-ok]\n"
            "  run under a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (ctrain launch)\n"
            "  --transport T     the process group's transport: tcp or shm\n"
            "  --sizes B,...     message sizes in bytes, multiples of 4 (default 1024,4096,...,67108864)\n"
            "  --min-time S      time each size for at least S seconds (default 0.2)\n"
            "  --min-iters N     and at least N calls (default 5)\n"
            "  --warmup W        untimed calls per size first, W >= 1 (default 5)\n"
            "  --unavailable-ok  a group that cannot be created prints an \"unavailable\" line, exit 0\n"
            "Rank 0 prints one JSON line per size.\n");
}

/* 0 ok, 1 --help, -1 error (message printed) */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){0};
    timing_opts_init(&o->t);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--unavailable-ok")) {
            o->unavailable_ok = true;
        } else if (!strcmp(a, "--transport")) {
            if (!v || (strcmp(v, "tcp") && strcmp(v, "shm"))) {
                fprintf(stderr, PROG ": --transport %s: expected tcp or shm\n", v ? v : "(missing)");
                return -1;
            }
            o->transport = v;
            i++;
        } else {
            int taken = timing_opts_parse(&o->t, a, v, 1LL << 34);
            if (taken < 0) return -1;
            if (!taken) {
                fprintf(stderr, PROG ": unknown argument '%s' (see --help)\n", a);
                return -1;
            }
            i++;
        }
    }
    if (!o->transport) {
        fprintf(stderr, PROG ": --transport tcp|shm is required (see --help)\n");
        return -1;
    }
    return 0;
}

/* s as the body of a JSON string (quotes, backslashes and control bytes escaped). */
static void print_json_string(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

/* One allreduce of t in place, waited for. */
static ct_status allreduce(ct_pg *g, ct_tensor *t, ct_reduce_op op)
{
    ct_work *w = ct_pg_allreduce(g, t, op);
    if (!w) return ct_last_status();
    ct_status st = ct_work_wait(w);
    ct_work_free(w);
    return st;
}

/* The largest v over the group's ranks. */
static ct_status max_over_ranks(ct_pg *g, double v, double *out)
{
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *t = ct_tensor_full(CT_DTYPE_F64, 1, (int64_t[]){1}, v);
        st = t ? allreduce(g, t, CT_REDUCE_MAX) : ct_last_status();
        if (!st) *out = *(const double *)ct_tensor_data(t);
    }
    return st;
}

/* The smallest of v[0..n): the warm-up's estimate of a call, which a slow start
 * (a peer still setting up, a descheduled rank) does not inflate. */
static double fastest(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

/* Index of the first element of x[0..n) that is not want, or -1. */
static int64_t first_mismatch(const float *x, int64_t n, float want)
{
    for (int64_t i = 0; i < n; i++)
        if (x[i] != want) return i;
    return -1;
}

/* Measures one size; rank 0 prints its JSON line. 0 ok, 2 error (message printed). */
static int bench_size(ct_pg *g, const options *o, int64_t bytes, double *times)
{
    int rank = ct_pg_rank(g), n = ct_pg_size(g);
    int64_t count = bytes / 4;
    int rc = 0;
    CT_FRAME {
        ct_tensor *t = ct_tensor_full(CT_DTYPE_F32, 1, (int64_t[]){count}, rank + 1);
        float *x = t ? ct_tensor_data(t) : NULL;
        float want = (float)n * (float)(n + 1) / 2;
        int64_t bad;
        double est = 0, med = 0;
        int iters = 0;
        if (!t) {
            fprintf(stderr, PROG ": rank %d: %lld bytes: %s\n", rank, (long long)bytes, ct_last_error());
            rc = 2;
        } else if (allreduce(g, t, CT_REDUCE_SUM)) {
            fprintf(stderr, PROG ": rank %d: allreduce of %lld bytes: %s\n", rank, (long long)bytes, ct_last_error());
            rc = 2;
        } else if ((bad = first_mismatch(x, count, want)) >= 0) {
            fprintf(stderr, PROG ": rank %d: allreduce of %lld bytes: element %lld is %g, expected %g\n", rank,
                    (long long)bytes, (long long)bad, (double)x[bad], (double)want);
            rc = 2;
        }
        if (!rc) {
            memset(x, 0, (size_t)bytes);
            for (int i = 0; i < o->t.warmup && !rc; i++) {
                double t0 = now();
                rc = allreduce(g, t, CT_REDUCE_SUM) ? 2 : 0;
                times[i] = now() - t0;
            }
            if (!rc) rc = max_over_ranks(g, fastest(times, o->t.warmup), &est) ? 2 : 0;
            if (rc) fprintf(stderr, PROG ": rank %d: warm-up, %lld bytes: %s\n", rank, (long long)bytes, ct_last_error());
        }
        if (!rc) {
            double want_iters = est > 0 ? ceil(o->t.min_time / est) : MAX_ITERS;
            iters = want_iters < o->t.min_iters ? o->t.min_iters : want_iters > MAX_ITERS ? MAX_ITERS : (int)want_iters;
            for (int i = 0; i < iters && !rc; i++) {
                double t0 = now();
                rc = allreduce(g, t, CT_REDUCE_SUM) ? 2 : 0;
                times[i] = now() - t0;
            }
            if (!rc) rc = max_over_ranks(g, median(times, iters), &med) ? 2 : 0;
            if (rc) fprintf(stderr, PROG ": rank %d: timed calls, %lld bytes: %s\n", rank, (long long)bytes, ct_last_error());
        }
        if (!rc && (bad = first_mismatch(x, count, 0.0f)) >= 0) {
            fprintf(stderr, PROG ": rank %d: after %d allreduces of zeros (%lld bytes) element %lld is %g\n", rank,
                    iters + o->t.warmup, (long long)bytes, (long long)bad, (double)x[bad]);
            rc = 2;
        }
        if (!rc && rank == 0) {
            double algbw = (double)bytes / med;
            printf("{\"impl\":\"ctrain-%s\",\"transport\":\"%s\",\"ranks\":%d,\"bytes\":%lld,\"iters\":%d,"
                   "\"warmup\":%d,\"median_us\":%.3f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f}\n",
                   o->transport, ct_pg_transport(g), n, (long long)bytes, iters, o->t.warmup, 1e6 * med, 1e-9 * algbw,
                   1e-9 * algbw * 2.0 * (n - 1) / n);
            fflush(stdout);
        }
    }
    return rc;
}

int main(int argc, char **argv)
{
    pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent) {
        fprintf(stderr, PROG ": the launcher is gone (or prctl failed: %s)\n", strerror(errno));
        return 2;
    }
    options o;
    int a = parse_args(argc, argv, &o);
    if (a) return a > 0 ? 0 : 2;

    ct_dist_env env;
    if (ct_dist_env_detect(&env)) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        return 2;
    }
    ct_pg *g = ct_pg_new(&(ct_pg_config){.rank = env.rank,
                                         .world_size = env.world_size,
                                         .master_addr = env.master_addr,
                                         .master_port = env.master_port,
                                         .timeout_s = env.timeout_s,
                                         .transport = o.transport});
    if (!g) {
        fprintf(stderr, PROG ": rank %d: ct_pg_new (transport %s): %s\n", env.rank, o.transport, ct_last_error());
        if (!o.unavailable_ok) return 2;
        printf("{\"impl\":\"ctrain-%s\",\"transport\":\"%s\",\"unavailable\":", o.transport, o.transport);
        print_json_string(ct_last_error());
        printf("}\n");
        return 0;
    }
    int rc = 0;
    if (ct_pg_size(g) < 2 || strcmp(ct_pg_transport(g), o.transport)) {
        fprintf(stderr, PROG ": rank %d: the group has %d rank(s) on transport '%s'; this benchmark needs >= 2 ranks "
                        "on '%s' (run it under ctrain launch --num_processes 2)\n",
                env.rank, ct_pg_size(g), ct_pg_transport(g), o.transport);
        rc = 2;
    }
    int64_t max_iters = MAX_ITERS > o.t.warmup ? MAX_ITERS : o.t.warmup;
    double *times = rc ? NULL : malloc((size_t)max_iters * sizeof *times);
    if (!rc && !times) {
        fprintf(stderr, PROG ": out of memory for %lld timings\n", (long long)max_iters);
        rc = 2;
    }
    for (int i = 0; i < o.t.nsizes && !rc; i++) rc = bench_size(g, &o, o.t.sizes[i], times);
    free(times);
    ct_pg_free(g);
    return rc;
}
