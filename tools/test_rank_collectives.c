/* `ctrain test`: every collective of the process group in every dtype it reduces,
 * checked element by element against closed forms (tools/test_rank.h).
 *
 * Rank r's input element i is
 *     f(r, i) = b(i) + s(i) r,   b(i) = B(i) + u m(i),   s(i) = u ((i mod 3) - 1),
 *     m(i) = (37 i mod 29) - 14  (-14 .. 14),
 *     u = 1/4 for the float dtypes, 1 for the integers,
 *     B(i) = 0 for floats, 1000 (i mod 7) for i32, 2^33 (i mod 5) for i64 (values
 *            that need 64 bits),
 * exact in every dtype (quarters of small integers fit bf16's 8 significant bits).
 * Over W ranks, in f64:
 *     sum = W b + s W (W - 1) / 2          avg = sum / W (integers: truncated, as C)
 *     max = b + max(s, 0) (W - 1)          min = b + min(s, 0) (W - 1)
 * reduce-scatter gives rank r the reduction at i = r n + j; all-gather's block k is
 * f(k, .); broadcast from root R leaves f(R, .) everywhere. The group accumulates
 * bf16 and f16 in f32 and rounds once, so a result is within one rounding of the
 * exact value: the tolerance is that rounding (relative 2^-8 for bf16, 2^-11 for
 * f16, 2^-24 for f32, 2^-53 for f64; doubled), integers exact.
 */
#include "tools/test_rank.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/convert.h"
#include "core/frame.h"
#include "dist/env.h"

typedef enum { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST } coll_kind;

static const struct {
    coll_kind kind;
    ct_reduce_op op;
} COLLECTIVES[] = {
    {C_ALLREDUCE, CT_REDUCE_SUM},      {C_ALLREDUCE, CT_REDUCE_MEAN}, {C_ALLREDUCE, CT_REDUCE_MAX},
    {C_ALLREDUCE, CT_REDUCE_MIN},      {C_REDUCE_SCATTER, CT_REDUCE_SUM}, {C_REDUCE_SCATTER, CT_REDUCE_MEAN},
    {C_ALLGATHER, CT_REDUCE_SUM},      {C_BROADCAST, CT_REDUCE_SUM},
};

static const ct_dtype DTYPES[] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16, CT_DTYPE_I32, CT_DTYPE_I64};

/* The transport's units: the comm engine's 512 KiB chunk (dist/pg.h) and the direct
 * allreduce's 1 MiB slot buffer (CTRAIN_SHM_SLOT_BYTES). */
#define CHUNK_BYTES ((int64_t)512 * 1024)
#define SLOT_BYTES ((int64_t)1024 * 1024)
#define SLOT_BYTES_MAX ((int64_t)64 * 1024 * 1024)

/* ---- the closed forms ---------------------------------------------------------------- */

static bool is_float(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16;
}

static double unit(ct_dtype dt) { return is_float(dt) ? 0.25 : 1.0; }

static double base(ct_dtype dt, int64_t i)
{
    double big = dt == CT_DTYPE_I64 ? (double)(i % 5) * 8589934592.0 : dt == CT_DTYPE_I32 ? (double)(i % 7) * 1000 : 0;
    return big + unit(dt) * (double)((i * 37) % 29 - 14);
}

static double slope(ct_dtype dt, int64_t i) { return unit(dt) * (double)(i % 3 - 1); }

static double f(ct_dtype dt, int r, int64_t i) { return base(dt, i) + slope(dt, i) * r; }

static double reduced(ct_dtype dt, ct_reduce_op op, int world, int64_t i)
{
    double b = base(dt, i), s = slope(dt, i), w = world;
    double sum = w * b + s * w * (w - 1) / 2;
    switch (op) {
    case CT_REDUCE_SUM: return sum;
    case CT_REDUCE_MEAN: return is_float(dt) ? sum / w : (double)((int64_t)sum / world);
    case CT_REDUCE_MAX: return b + (s > 0 ? s : 0) * (w - 1);
    case CT_REDUCE_MIN: return b + (s < 0 ? s : 0) * (w - 1);
    default: return NAN;
    }
}

static bool matches(ct_dtype dt, double want, double got)
{
    double rel;
    switch (dt) {
    case CT_DTYPE_F64: rel = 0x1p-52; break;
    case CT_DTYPE_F32: rel = 0x1p-23; break;
    case CT_DTYPE_F16: rel = 0x1p-10; break;
    case CT_DTYPE_BF16: rel = 0x1p-7; break;
    default: return got == want;
    }
    return fabs(got - want) <= rel * fmax(fabs(want), unit(dt)); /* false for NaN */
}

/* ---- one collective on one size -------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


static const char *coll_name(coll_kind k)
{
    switch (k) {
    case C_ALLREDUCE: return "allreduce";
    case C_REDUCE_SCATTER: return "reduce_scatter";
    case C_ALLGATHER: return "allgather";
    case C_BROADCAST: return "broadcast";
    }
    return "?";
}

static void fmt_value(ct_dtype dt, double v, char *buf, size_t cap)
{
    snprintf(buf, cap, is_float(dt) ? "%.9g" : "%.0f", v);
}

/* The fault injections that concern one collective run (tools/test_rank.h). */
static bool is_injected_run(coll_kind k, ct_reduce_op op, ct_dtype dt, int64_t n)
{
    return k == C_ALLREDUCE && op == CT_REDUCE_SUM && dt == CT_DTYPE_F32 && n == 1027;
}

static void run_size(ct_test_run *t, coll_kind k, ct_reduce_op op, ct_dtype dt, int64_t n)
{
    const int W = t->world, r = t->rank, root = W - 1;
    const int64_t nin = k == C_REDUCE_SCATTER ? W * n : n;
    const int64_t nout = k == C_ALLGATHER ? W * n : n;
    const size_t es = ct_dtype_size(dt);
    char what[64];
    snprintf(what, sizeof what, "size %lld", (long long)n);

    if (is_injected_run(k, op, dt, n) && ct_test_inject_here(t, "die")) {
        fprintf(stderr, "ctrain test: CTRAIN_TEST_INJECT=die: rank %d kills itself (SIGKILL) in %s\n", r, t->name);
        fflush(stderr);
        raise(SIGKILL);
    }
    if (is_injected_run(k, op, dt, n) && ct_test_inject_here(t, "hang")) {
        /* twice the group's timeout: the others' collective must fail first */
        ct_dist_env env;
        double s = ct_dist_env_detect(&env) ? CT_DIST_DEFAULT_TIMEOUT_S : env.timeout_s;
        fprintf(stderr, "ctrain test: CTRAIN_TEST_INJECT=hang: rank %d sleeps %.0f s before %s\n", r, 2 * s + 1,
                t->name);
        fflush(stderr);
        double until = now_s() + 2 * s + 1;
        for (double left; (left = until - now_s()) > 0;)
            nanosleep(&(struct timespec){(time_t)left, (long)((left - (double)(time_t)left) * 1e9)}, NULL);
    }
    ct_frame_push();
    ct_tensor *in = ct_tensor_empty(dt, CT_SHAPE(nin));
    ct_tensor *out = !in ? NULL : k == C_REDUCE_SCATTER || k == C_ALLGATHER ? ct_tensor_empty(dt, CT_SHAPE(nout)) : in;
    if (!out) {
        ct_test_check_error(t, what, ct_last_status());
        ct_frame_pop();
        return;
    }
    char *p = ct_tensor_data(in);
    for (int64_t i = 0; i < nin; i++) ct_scalar_store(dt, p + (size_t)i * es, f(dt, r, i));
    ct_work *w = NULL;
    switch (k) {
    case C_ALLREDUCE: w = ct_pg_allreduce(t->pg, in, op); break;
    case C_REDUCE_SCATTER: w = ct_pg_reduce_scatter(t->pg, out, in, op); break;
    case C_ALLGATHER: w = ct_pg_allgather(t->pg, out, in); break;
    case C_BROADCAST: w = ct_pg_broadcast(t->pg, in, root); break;
    }
    ct_status st = ct_work_run(w);
    if (st) {
        ct_test_check_error(t, what, st);
        ct_frame_pop();
        return;
    }
    const char *q = ct_tensor_data(out);
    if (is_injected_run(k, op, dt, n) && ct_test_inject_here(t, "collective")) {
        /* after the group's work: the result this rank reads is wrong */
        char *e = (char *)q + 5 * es;
        ct_scalar_store(dt, e, ct_scalar_load(dt, e) + 1);
    }
    int64_t wrong = 0, first = -1;
    double want_first = 0, got_first = 0;
    for (int64_t j = 0; j < nout; j++) {
        double want;
        switch (k) {
        case C_ALLREDUCE: want = reduced(dt, op, W, j); break;
        case C_REDUCE_SCATTER: want = reduced(dt, op, W, r * n + j); break;
        case C_ALLGATHER: want = f(dt, (int)(j / n), j % n); break;
        default: want = f(dt, root, j); break;
        }
        double got = ct_scalar_load(dt, q + (size_t)j * es);
        if (matches(dt, want, got)) continue;
        if (!wrong++) first = j, want_first = want, got_first = got;
    }
    if (wrong) {
        char a[40], b[40];
        fmt_value(dt, want_first, a, sizeof a);
        fmt_value(dt, got_first, b, sizeof b);
        ct_test_check_fail(t, "size %lld: %lld of %lld elements wrong, first element %lld: expected %s, got %s",
                           (long long)n, (long long)wrong, (long long)nout, (long long)first, a, b);
    }
    ct_frame_pop();
}

/* An odd count of elements more than one chunk and one slot buffer hold. */
static int64_t large_count(ct_dtype dt)
{
    int slot = 0;
    if (ct_dist_env_int("CTRAIN_SHM_SLOT_BYTES", 0, 0, &slot)) slot = 0;
    int64_t bytes = slot > 0 ? slot : SLOT_BYTES;
    if (bytes > SLOT_BYTES_MAX) bytes = SLOT_BYTES_MAX;
    if (bytes < CHUNK_BYTES) bytes = CHUNK_BYTES;
    int64_t n = bytes * 3 / 2 / (int64_t)ct_dtype_size(dt);
    return n | 1;
}

/* ---- barrier ------------------------------------------------------------------------ */

/* The last rank enters DELAY_S after the others: a barrier that let anyone out
 * before it arrived shows as a wait much shorter than that: under a quarter of it,
 * which leaves a busy machine 75 ms to schedule a rank late without a false alarm. */
#define DELAY_S 0.1

static void check_barrier(ct_test_run *t)
{
    ct_test_check_begin(t, "barrier");
    const int last = t->world - 1;
    double waited = 0;
    ct_status st = ct_work_run(ct_pg_barrier(t->pg));
    if (st) {
        ct_test_check_error(t, "barrier 1", st);
    } else {
        if (t->rank == last && last > 0) nanosleep(&(struct timespec){0, (long)(DELAY_S * 1e9)}, NULL);
        double t0 = now_s();
        st = ct_work_run(ct_pg_barrier(t->pg));
        waited = now_s() - t0;
        if (st) ct_test_check_error(t, "barrier 2", st);
        else if (t->rank != last && waited < DELAY_S / 4)
            ct_test_check_fail(t, "left barrier 2 after %.1f ms, before rank %d arrived (it entered %.0f ms late)",
                               waited * 1e3, last, DELAY_S * 1e3);
    }
    if (last == 0) ct_test_check_end(t, "one rank");
    else
        ct_test_check_end(t, "rank 0 waited %.0f ms for rank %d, which entered %.0f ms late", waited * 1e3, last,
                          DELAY_S * 1e3);
}

/* ---- the checks ------------------------------------------------------------------------ */

void ct_test_collectives(ct_test_run *t)
{
    for (size_t c = 0; c < sizeof COLLECTIVES / sizeof *COLLECTIVES && !t->broken; c++) {
        coll_kind k = COLLECTIVES[c].kind;
        ct_reduce_op op = COLLECTIVES[c].op;
        for (size_t d = 0; d < sizeof DTYPES / sizeof *DTYPES && !t->broken; d++) {
            ct_dtype dt = DTYPES[d];
            if (k == C_ALLREDUCE || k == C_REDUCE_SCATTER)
                ct_test_check_begin(t, "%s(%s) %s", coll_name(k), ct_reduce_op_name(op), ct_dtype_name(dt));
            else if (k == C_BROADCAST)
                ct_test_check_begin(t, "%s(root %d) %s", coll_name(k), t->world - 1, ct_dtype_name(dt));
            else
                ct_test_check_begin(t, "%s %s", coll_name(k), ct_dtype_name(dt));
            const int64_t sizes[3] = {1, 1027, large_count(dt)};
            for (int s = 0; s < 3 && !t->broken; s++) run_size(t, k, op, dt, sizes[s]);
            ct_test_check_end(t, "sizes %lld, %lld, %lld: every element as expected", (long long)sizes[0],
                              (long long)sizes[1], (long long)sizes[2]);
        }
    }
    if (!t->broken) check_barrier(t);
}
