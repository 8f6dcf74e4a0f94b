/* Tests for the collectives (dist/ring.c, dist/collectives.c, dist/reduce_op.c through
 * dist/pg.h): every collective on 2, 3 and 4 fork()ed ranks, every dtype and reduce
 * op, sizes 0, 1, 7, 1021 and 65537, in place and out of place, both allreduce
 * algorithms (the default thresholds and a group forced onto the ring with small
 * chunks), many works in flight waited in reverse order; bf16/f16 rounded once; a
 * 64 MiB allreduce.
 *
 * Element i of rank r's input is a small integer f(r, i, salt), exactly representable
 * in every dtype, so each child computes the expected result of every rank's inputs
 * itself and compares bit for bit: for these inputs any summation order gives the
 * same sums, and AVG is the sum divided once, in f32 for bf16/f16 (the documented
 * rounding points). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "ranks.h"

static const ct_dtype DTYPES[] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16, CT_DTYPE_I32, CT_DTYPE_I64};
#define NDT (int)(sizeof DTYPES / sizeof DTYPES[0])
static const ct_reduce_op OPS[] = {CT_REDUCE_SUM, CT_REDUCE_MEAN, CT_REDUCE_MAX, CT_REDUCE_MIN};

static double f(int r, int64_t i, int salt) { return (double)((r * 131 + i * 31 + salt * 7) % 61) - 30; }

static ct_tensor *filled(ct_dtype dt, int64_t n, int r, int64_t i0, int salt)
{
    ct_tensor *t = ct_tensor_empty(dt, 1, (int64_t[]){n});
    uint8_t *p = ct_tensor_data(t);
    for (int64_t i = 0; i < n; i++) ct_scalar_store(dt, p + i * ct_dtype_size(dt), f(r, i0 + i, salt));
    return t;
}

/* The reduction of f(0..n-1, i, salt) by op, stored as dtype dt at p, following the
 * documented arithmetic: exact sums (the inputs are small integers), AVG divided once
 * in the accumulation dtype, bf16/f16 rounded once at the end. */
static void expected_reduce(ct_dtype dt, ct_reduce_op op, int n, int64_t i, int salt, void *p)
{
    double s = f(0, i, salt), m = s;
    for (int r = 1; r < n; r++) {
        double v = f(r, i, salt);
        s += v;
        if (op == CT_REDUCE_MAX) m = fmax(m, v);
        if (op == CT_REDUCE_MIN) m = fmin(m, v);
    }
    if (op == CT_REDUCE_MAX || op == CT_REDUCE_MIN) s = m;
    switch (dt) {
    case CT_DTYPE_I32: *(int32_t *)p = op == CT_REDUCE_MEAN ? (int32_t)s / n : (int32_t)s; break;
    case CT_DTYPE_I64: *(int64_t *)p = op == CT_REDUCE_MEAN ? (int64_t)s / n : (int64_t)s; break;
    case CT_DTYPE_F64: *(double *)p = op == CT_REDUCE_MEAN ? s / n : s; break;
    default: {
        float v = op == CT_REDUCE_MEAN ? (float)s / (float)n : (float)s;
        if (dt == CT_DTYPE_F32) *(float *)p = v;
        else *(uint16_t *)p = dt == CT_DTYPE_BF16 ? ct_f32_to_bf16(v) : ct_f32_to_f16(v);
    }
    }
}

/* Compares n elements at t (from element 0) with want(i); reports the first mismatch. */
typedef void (*want_fn)(void *ctx, int64_t i, void *p);

static bool check(rank_ctx *c, const char *what, const ct_tensor *t, int64_t n, want_fn want, void *ctx)
{
    size_t es = ct_dtype_size(t->dtype);
    const uint8_t *p = ct_tensor_data(t);
    uint8_t w[8];
    for (int64_t i = 0; i < n; i++) {
        want(ctx, i, w);
        if (memcmp(p + i * es, w, es)) {
            report(c, "rank %d: %s (%s, n=%lld): element %lld is %g, want %g", c->rank, what, ct_dtype_name(t->dtype),
                   (long long)n, (long long)i, ct_scalar_load(t->dtype, p + i * es), ct_scalar_load(t->dtype, w));
            return false;
        }
    }
    return true;
}

typedef struct red_ctx {
    ct_dtype dt;
    ct_reduce_op op;
    int n, salt;
    int64_t i0;
} red_ctx;

static void want_red(void *ctx, int64_t i, void *p)
{
    red_ctx *x = ctx;
    expected_reduce(x->dt, x->op, x->n, x->i0 + i, x->salt, p);
}

typedef struct val_ctx {
    ct_dtype dt;
    int salt;
    int64_t block; /* element i comes from rank (i / block), at index i0 + i % block (or r_fixed >= 0) */
    int r_fixed;
    int64_t i0;
    int64_t stride; /* added to the index per block */
} val_ctx;

static void want_val(void *ctx, int64_t i, void *p)
{
    val_ctx *x = ctx;
    int r = x->r_fixed >= 0 ? x->r_fixed : (int)(i / x->block);
    int64_t idx = x->i0 + (x->block ? i % x->block : i) + (x->block ? i / x->block : 0) * x->stride;
    ct_scalar_store(x->dt, p, f(r, idx, x->salt));
}

static bool wait_ok(rank_ctx *c, ct_work *w, const char *what)
{
    if (!w) {
        report(c, "rank %d: %s: submit failed: %s", c->rank, what, ct_last_error());
        return false;
    }
    ct_status st = ct_work_wait(w);
    if (st) report(c, "rank %d: %s: %s", c->rank, what, ct_last_error());
    ct_work_free(w);
    return st == CT_OK;
}

#define MAXW 64

/* Every collective for one dtype and one per-rank size, all submitted before any
 * wait, waited in reverse order, then checked. */
static bool batch(rank_ctx *c, ct_pg *g, ct_dtype dt, int64_t m, int salt, bool reductions)
{
    int n = ct_pg_size(g), r = ct_pg_rank(g);
    ct_work *w[MAXW];
    const char *names[MAXW];
    int nw = 0;
    bool ok = true;
    ct_frame_push();
#define SUBMIT(name, expr) (names[nw] = (name), w[nw++] = (expr))
    ct_tensor *ar_in[4] = {0}, *ar_io[4] = {0}, *ar_out[4] = {0}, *rs_out[4] = {0}, *rd[4] = {0}, *rsc_out[4] = {0};
    int red_root = (int)((m + 1) % n);
    if (reductions) {
        for (int k = 0; k < 4; k++) {
            ar_io[k] = filled(dt, m, r, 0, salt + k);
            SUBMIT("allreduce", ct_pg_allreduce(g, ar_io[k], OPS[k]));
            ar_in[k] = filled(dt, m, r, 0, salt + 10 + k);
            ar_out[k] = ct_tensor_empty(dt, 1, (int64_t[]){m});
            SUBMIT("allreduce_out", ct_pg_allreduce_out(g, ar_out[k], ar_in[k], OPS[k]));
            rs_out[k] = ct_tensor_empty(dt, 1, (int64_t[]){m});
            ct_tensor *rs_in = filled(dt, n * m, r, 0, salt + 20 + k);
            SUBMIT("reduce_scatter", ct_pg_reduce_scatter(g, rs_out[k], rs_in, OPS[k]));
            /* the input given up: reduced in place, the same result */
            rsc_out[k] = ct_tensor_empty(dt, 1, (int64_t[]){m});
            SUBMIT("reduce_scatter_consume",
                   ct_pg_reduce_scatter_consume(g, rsc_out[k], filled(dt, n * m, r, 0, salt + 50 + k), OPS[k]));
            rd[k] = filled(dt, m, r, 0, salt + 30 + k);
            SUBMIT("reduce", ct_pg_reduce(g, rd[k], red_root, OPS[k]));
        }
    }
    ct_tensor *ag_out = ct_tensor_empty(dt, 1, (int64_t[]){n * m});
    SUBMIT("allgather", ct_pg_allgather(g, ag_out, filled(dt, m, r, 0, salt + 40)));
    int root = (int)(m % n);
    ct_tensor *bc = r == root ? filled(dt, m, r, 0, salt + 41) : ct_tensor_zeros(dt, 1, (int64_t[]){m});
    SUBMIT("broadcast", ct_pg_broadcast(g, bc, root));
    ct_tensor *ga_out = r == root ? ct_tensor_empty(dt, 1, (int64_t[]){n * m}) : NULL;
    SUBMIT("gather", ct_pg_gather(g, ga_out, filled(dt, m, r, 0, salt + 42), root));
    ct_tensor *sc_out = ct_tensor_empty(dt, 1, (int64_t[]){m});
    SUBMIT("scatter", ct_pg_scatter(g, sc_out, r == root ? filled(dt, n * m, r, 0, salt + 43) : NULL, root));
    ct_tensor *a2a_out = ct_tensor_empty(dt, 1, (int64_t[]){n * m});
    SUBMIT("all_to_all", ct_pg_all_to_all(g, a2a_out, filled(dt, n * m, r, 0, salt + 44)));
    SUBMIT("barrier", ct_pg_barrier(g));
    ct_tensor *p2p_in = ct_tensor_empty(dt, 1, (int64_t[]){m});
    SUBMIT("recv", ct_pg_recv(g, p2p_in, (r + n - 1) % n, (int)dt));
    SUBMIT("send", ct_pg_send(g, filled(dt, m, r, 0, salt + 45), (r + 1) % n, (int)dt));
#undef SUBMIT
    for (int k = nw - 1; k >= 0; k--) ok &= wait_ok(c, w[k], names[k]);
    if (!ok) goto out;

    if (reductions) {
        for (int k = 0; k < 4; k++) {
            red_ctx x = {dt, OPS[k], n, salt + k, 0};
            ok &= check(c, "allreduce", ar_io[k], m, want_red, &x);
            x.salt = salt + 10 + k;
            ok &= check(c, "allreduce_out", ar_out[k], m, want_red, &x);
            val_ctx v = {dt, salt + 10 + k, 0, r, 0, 0};
            ok &= check(c, "allreduce_out leaves in", ar_in[k], m, want_val, &v);
            x.salt = salt + 20 + k;
            x.i0 = r * m;
            ok &= check(c, "reduce_scatter", rs_out[k], m, want_red, &x);
            x.salt = salt + 50 + k;
            ok &= check(c, "reduce_scatter_consume", rsc_out[k], m, want_red, &x);
            x.salt = salt + 30 + k;
            x.i0 = 0;
            if (r == red_root) {
                ok &= check(c, "reduce (root)", rd[k], m, want_red, &x);
            } else {
                val_ctx u = {dt, salt + 30 + k, 0, r, 0, 0};
                ok &= check(c, "reduce leaves non-roots", rd[k], m, want_val, &u);
            }
        }
    }
    val_ctx v = {dt, salt + 40, m, -1, 0, 0};
    ok &= check(c, "allgather", ag_out, n * m, want_val, &v);
    v = (val_ctx){dt, salt + 41, 0, root, 0, 0};
    ok &= check(c, "broadcast", bc, m, want_val, &v);
    if (r == root) {
        v = (val_ctx){dt, salt + 42, m, -1, 0, 0};
        ok &= check(c, "gather", ga_out, n * m, want_val, &v);
    }
    v = (val_ctx){dt, salt + 43, 0, root, r * m, 0};
    ok &= check(c, "scatter", sc_out, m, want_val, &v);
    /* block j of rank r's output is block r of rank j's input */
    v = (val_ctx){dt, salt + 44, m, -1, r * m, 0};
    ok &= check(c, "all_to_all", a2a_out, n * m, want_val, &v);
    v = (val_ctx){dt, salt + 45, 0, (r + n - 1) % n, 0, 0};
    ok &= check(c, "recv", p2p_in, m, want_val, &v);
out:
    ct_frame_pop();
    return ok;
}

static const int64_t SIZES[] = {0, 1, 7, 1021, 65537};

static int matrix_main(rank_ctx *c)
{
    ct_pg *a = rank_pg(c, 30, NULL);
    /* the ring for every allreduce, on the comm thread, in 256-byte chunks: pipelining
     * on small sizes */
    ct_pg *b = rank_pg(c, 30, &(ct_pg_config){.ring_min_bytes = 1, .chunk_bytes = 256, .async_collectives = true});
    /* with shm, direct allreduce through 256-byte slots: many chunks, ragged segments */
    setenv("CTRAIN_SHM_SLOT_BYTES", "256", 1);
    ct_pg *d3 = rank_pg(c, 30, NULL);
    unsetenv("CTRAIN_SHM_SLOT_BYTES");
    if (!a || !b || !d3) return 1;
    int rc = 0;
    for (int s = 0; s < 5 && !rc; s++)
        for (int d = 0; d < NDT && !rc; d++) {
            /* the largest size for fewer dtypes, to keep the test short */
            if (SIZES[s] > 10000 && DTYPES[d] != CT_DTYPE_F32 && DTYPES[d] != CT_DTYPE_BF16) continue;
            if (!batch(c, a, DTYPES[d], SIZES[s], s * 100 + d, true)) rc = 2;
            else if (SIZES[s] <= 10000 && !batch(c, b, DTYPES[d], SIZES[s], s * 100 + d + 50, true)) rc = 3;
            else if (SIZES[s] <= 10000 && !batch(c, d3, DTYPES[d], SIZES[s], s * 100 + d + 70, true)) rc = 4;
        }
    ct_pg_free(d3);
    ct_pg_free(b);
    ct_pg_free(a);
    return rc;
}

Test(dist_collectives, every_collective_on_2_ranks, .timeout = 60)
{
    rank_result res[2];
    run_ranks(2, matrix_main, NULL, res, 55);
    expect_all_ok(res, 2);
}

Test(dist_collectives, every_collective_on_3_ranks, .timeout = 60)
{
    rank_result res[3];
    run_ranks(3, matrix_main, NULL, res, 55);
    expect_all_ok(res, 3);
}

Test(dist_collectives, every_collective_on_4_ranks, .timeout = 60)
{
    rank_result res[4];
    run_ranks(4, matrix_main, NULL, res, 55);
    expect_all_ok(res, 4);
}

/* 256 + 1 + 1 + 1 = 259 lies halfway between the bf16 neighbours 258 and 260 (the
 * spacing is 2 there) and rounds to the even 260; rounding after every addition would
 * give 256 + 1 -> 256 three times. f16 has the same tie at 2048 + 3 -> 2052 (not 2048).
 * Both allreduce algorithms, reduce_scatter and reduce must round once. */
static int rounding_main(rank_ctx *c)
{
    int rc = 0;
    /* allreduce: direct (with shm), recursive doubling and the ring (on the comm thread) */
    ct_pg *g[3] = {rank_pg(c, 20, NULL), rank_pg(c, 20, &(ct_pg_config){.async_collectives = true}),
                   rank_pg(c, 20, &(ct_pg_config){.ring_min_bytes = 1, .chunk_bytes = 64, .async_collectives = true})};
    if (!g[0] || !g[1] || !g[2]) return 1;
    const struct {
        ct_dtype dt;
        double big, want;
    } cases[] = {{CT_DTYPE_BF16, 256, 260}, {CT_DTYPE_F16, 2048, 2052}};
    for (int k = 0; k < 2; k++)
        for (int a = 0; a < 3; a++) {
            ct_frame_push();
            int64_t n = 4 * 33; /* 4 blocks for reduce_scatter */
            ct_tensor *t = ct_tensor_full(cases[k].dt, 1, (int64_t[]){n}, c->rank ? 1 : cases[k].big);
            ct_tensor *in = ct_tensor_clone(t), *rs = ct_tensor_empty(cases[k].dt, 1, (int64_t[]){n / 4});
            ct_tensor *rd = ct_tensor_clone(t);
            ct_work *w[3] = {ct_pg_allreduce(g[a], t, CT_REDUCE_SUM), ct_pg_reduce_scatter(g[a], rs, in, CT_REDUCE_SUM),
                             ct_pg_reduce(g[a], rd, 3, CT_REDUCE_SUM)};
            for (int i = 0; i < 3; i++) {
                if (ct_work_wait(w[i])) rc = 2, report(c, "work %d: %s", i, ct_last_error());
                ct_work_free(w[i]);
            }
            ct_tensor *outs[3] = {t, rs, c->rank == 3 ? rd : NULL};
            for (int i = 0; i < 3 && !rc; i++)
                for (int64_t j = 0; outs[i] && j < ct_tensor_numel(outs[i]); j++) {
                    double v = ct_scalar_load(cases[k].dt, (uint8_t *)ct_tensor_data(outs[i]) + 2 * j);
                    if (v != cases[k].want) {
                        rc = 3;
                        report(c, "rank %d, %s, %s, output %d, element %lld: %g, want %g", c->rank,
                               ct_dtype_name(cases[k].dt), a == 2 ? "ring" : a ? "async" : "default", i, (long long)j, v, cases[k].want);
                        break;
                    }
                }
            ct_frame_pop();
        }
    ct_pg_free(g[2]);
    ct_pg_free(g[1]);
    ct_pg_free(g[0]);
    return rc;
}

Test(dist_collectives, bf16_and_f16_are_rounded_once, .timeout = 30)
{
    rank_result res[4];
    run_ranks(4, rounding_main, NULL, res, 25);
    expect_all_ok(res, 4);
}

/* 64 MiB of f32 through the pipelined ring, every element checked. */
static int big_main(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 60, NULL);
    if (!g) return 1;
    int rc = 0;
    ct_frame_push();
    int64_t n = (int64_t)16 << 20;
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_F32, 1, (int64_t[]){n});
    float *p = ct_tensor_data(t);
    for (int64_t i = 0; i < n; i++) p[i] = (float)((i % 4099) * (c->rank + 1));
    double t0 = now_s();
    ct_work *w = ct_pg_allreduce(g, t, CT_REDUCE_SUM);
    if (ct_work_wait(w)) rc = 2, report(c, "allreduce: %s", ct_last_error());
    ct_work_free(w);
    report(c, "rank %d: 64 MiB allreduce in %.3f s", c->rank, now_s() - t0);
    for (int64_t i = 0; i < n && !rc; i++)
        if (p[i] != (float)((i % 4099) * 3)) rc = 3, report(c, "element %lld: %g", (long long)i, p[i]);
    ct_frame_pop();
    ct_pg_free(g);
    return rc;
}

Test(dist_collectives, allreduce_of_64_mib, .timeout = 60)
{
    rank_result res[2];
    run_ranks(2, big_main, NULL, res, 55);
    expect_all_ok(res, 2);
}
