/* Tests for parallel/mesh.c: the layout checks and, on fork()ed ranks, every rank's
 * coordinates, pipeline neighbours and axis groups. The expected members of each
 * group are written out here from the placement rule (tp innermost, then dp, then
 * pp; dp = replicate x shard with shard inner); each group's allgather of the world
 * ranks must list exactly them, in coordinate order, and an allreduce in the group
 * must sum them. */
#include <criterion/criterion.h>
#include <string.h>

#include "parallel/mesh.h"
#include "tests/dist/ranks.h"

typedef struct mesh_arg {
    ct_mesh_config cfg;
    int dp, tp, pp, rep, sh; /* the degrees the mesh must end up with */
} mesh_arg;

/* the world rank of (rep_i, sh_i, tp_i, pp_i), written independently of the library */
static int place(const mesh_arg *a, int rep_i, int sh_i, int tp_i, int pp_i)
{
    int dp_i = rep_i * a->sh + sh_i;
    return pp_i * a->dp * a->tp + dp_i * a->tp + tp_i;
}

/* checks group g against the world ranks want[0..n) and this rank's index in it */
static int check_group(rank_ctx *c, const char *axis, ct_pg *g, const int *want, int n, int my_index)
{
    if (!g) {
        report(c, "rank %d: no %s group", c->rank, axis);
        return 1;
    }
    if (ct_pg_size(g) != n || ct_pg_rank(g) != my_index) {
        report(c, "rank %d: %s group: size %d rank %d; want size %d rank %d", c->rank, axis, ct_pg_size(g),
               ct_pg_rank(g), n, my_index);
        return 1;
    }
    int rc = 0;
    CT_FRAME {
        ct_tensor *me = ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(1), c->rank);
        ct_tensor *all = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(n));
        ct_tensor *sum = ct_tensor_full(CT_DTYPE_F64, CT_SHAPE(1), c->rank);
        ct_work *w = ct_pg_allgather(g, all, me);
        ct_status st = w ? ct_work_wait(w) : ct_last_status();
        ct_work_free(w);
        w = st ? NULL : ct_pg_allreduce(g, sum, CT_REDUCE_SUM);
        if (!st) st = w ? ct_work_wait(w) : ct_last_status();
        ct_work_free(w);
        if (st) {
            report(c, "rank %d: %s group collective: %s", c->rank, axis, ct_last_error());
            rc = 1;
        } else {
            const int64_t *got = ct_tensor_data(all);
            double want_sum = 0;
            for (int i = 0; i < n; i++) {
                want_sum += want[i];
                if (got[i] != want[i]) {
                    report(c, "rank %d: %s group member %d is world rank %lld; want %d", c->rank, axis, i,
                           (long long)got[i], want[i]);
                    rc = 1;
                }
            }
            if (ct_tensor_item(sum) != want_sum) {
                report(c, "rank %d: %s group allreduce %g; want %g", c->rank, axis, ct_tensor_item(sum), want_sum);
                rc = 1;
            }
        }
    }
    return rc;
}

static int mesh_rank(rank_ctx *c)
{
    const mesh_arg *a = c->arg;
    ct_pg *world = rank_pg(c, 30, NULL);
    if (!world) return 1;
    ct_mesh *m = ct_mesh_new(world, &a->cfg);
    int rc = 0;
    if (!m) {
        report(c, "rank %d: ct_mesh_new: %s", c->rank, ct_last_error());
        ct_pg_free(world);
        return 1;
    }
    /* coordinates from the rule, by search over every coordinate tuple */
    int rep_i = -1, sh_i = -1, tp_i = -1, pp_i = -1;
    for (int p = 0; p < a->pp; p++)
        for (int r = 0; r < a->rep; r++)
            for (int s = 0; s < a->sh; s++)
                for (int t = 0; t < a->tp; t++)
                    if (place(a, r, s, t, p) == c->rank) rep_i = r, sh_i = s, tp_i = t, pp_i = p;
    int dp_i = rep_i * a->sh + sh_i;
    if (m->dp != a->dp || m->tp != a->tp || m->pp != a->pp || m->dp_replicate != a->rep || m->dp_shard != a->sh ||
        m->tp_rank != tp_i || m->dp_rank != dp_i || m->pp_rank != pp_i || m->dp_replicate_rank != rep_i ||
        m->dp_shard_rank != sh_i || m->rank != c->rank || m->world_size != c->world) {
        report(c,
               "rank %d: mesh dp %d tp %d pp %d rep %d shard %d, coords dp %d tp %d pp %d rep %d shard %d; "
               "want dp %d tp %d pp %d rep %d shard %d, coords dp %d tp %d pp %d rep %d shard %d",
               c->rank, m->dp, m->tp, m->pp, m->dp_replicate, m->dp_shard, m->dp_rank, m->tp_rank, m->pp_rank,
               m->dp_replicate_rank, m->dp_shard_rank, a->dp, a->tp, a->pp, a->rep, a->sh, dp_i, tp_i, pp_i, rep_i,
               sh_i);
        rc = 1;
    }
    int want_prev = pp_i > 0 ? place(a, rep_i, sh_i, tp_i, pp_i - 1) : -1;
    int want_next = pp_i < a->pp - 1 ? place(a, rep_i, sh_i, tp_i, pp_i + 1) : -1;
    if (m->pp_prev != want_prev || m->pp_next != want_next) {
        report(c, "rank %d: pipeline neighbours %d, %d; want %d, %d", c->rank, m->pp_prev, m->pp_next, want_prev,
               want_next);
        rc = 1;
    }
    if (ct_mesh_rank_at(m, dp_i, tp_i, pp_i) != c->rank || ct_mesh_rank_at(m, a->dp, 0, 0) != -1) {
        report(c, "rank %d: ct_mesh_rank_at disagrees with the placement", c->rank);
        rc = 1;
    }
    int want[MAX_RANKS];
    for (int t = 0; t < a->tp; t++) want[t] = place(a, rep_i, sh_i, t, pp_i);
    rc |= check_group(c, "tp", m->tp_group, want, a->tp, tp_i);
    for (int d = 0; d < a->dp; d++) want[d] = place(a, d / a->sh, d % a->sh, tp_i, pp_i);
    rc |= check_group(c, "dp", m->dp_group, want, a->dp, dp_i);
    for (int p = 0; p < a->pp; p++) want[p] = place(a, rep_i, sh_i, tp_i, p);
    rc |= check_group(c, "pp", m->pp_group, want, a->pp, pp_i);
    for (int s = 0; s < a->sh; s++) want[s] = place(a, rep_i, s, tp_i, pp_i);
    rc |= check_group(c, "dp_shard", m->dp_shard_group, want, a->sh, sh_i);
    for (int r = 0; r < a->rep; r++) want[r] = place(a, r, sh_i, tp_i, pp_i);
    rc |= check_group(c, "dp_replicate", m->dp_replicate_group, want, a->rep, rep_i);
    ct_mesh_free(m);
    ct_pg_free(world);
    return rc;
}

static void run_mesh(int world, mesh_arg a)
{
    rank_result res[MAX_RANKS];
    run_ranks(world, mesh_rank, &a, res, 60);
    expect_all_ok(res, world);
}

Test(parallel_mesh, eight_ranks_dp2_tp2_pp2, .timeout = 90)
{
    run_mesh(8, (mesh_arg){.cfg = {.dp = 2, .tp = 2, .pp = 2}, .dp = 2, .tp = 2, .pp = 2, .rep = 1, .sh = 2});
}

Test(parallel_mesh, four_ranks_dp2_tp2, .timeout = 60)
{
    run_mesh(4, (mesh_arg){.cfg = {.dp = 2, .tp = 2}, .dp = 2, .tp = 2, .pp = 1, .rep = 1, .sh = 2});
}

Test(parallel_mesh, four_ranks_tp2_pp2_dp_by_default, .timeout = 60)
{
    run_mesh(4, (mesh_arg){.cfg = {.tp = 2, .pp = 2}, .dp = 1, .tp = 2, .pp = 2, .rep = 1, .sh = 1});
}

Test(parallel_mesh, eight_ranks_hybrid_replicate2_shard2_tp2, .timeout = 90)
{
    run_mesh(8, (mesh_arg){.cfg = {.tp = 2, .dp_replicate = 2}, .dp = 4, .tp = 2, .pp = 1, .rep = 2, .sh = 2});
}

/* the message of a failing layout, or "" */
static const char *layout_error(int world, ct_mesh_config cfg)
{
    return ct_mesh_layout(world, &cfg, NULL) ? ct_last_error() : "";
}

static void expect_has(const char *msg, const char *part)
{
    cr_expect(strstr(msg, part) != NULL, "message \"%s\" does not name \"%s\"", msg, part);
}

Test(parallel_mesh, bad_layouts_name_the_numbers)
{
    expect_has(layout_error(8, (ct_mesh_config){.dp = 2, .tp = 3, .pp = 1}), "world size 8 != dp 2 x tp 3 x pp 1 = 6");
    expect_has(layout_error(8, (ct_mesh_config){.tp = 3}), "world size 8 is not a multiple of tp 3 x pp 1");
    expect_has(layout_error(4, (ct_mesh_config){.tp = -1}), "tp -1");
    expect_has(layout_error(4, (ct_mesh_config){.dp = 4, .dp_replicate = 3}), "dp 4 is not a multiple of dp_replicate 3");
    expect_has(layout_error(4, (ct_mesh_config){.dp = 4, .dp_replicate = 2, .dp_shard = 4}),
               "dp 4 != dp_replicate 2 x dp_shard 4");
    expect_has(layout_error(0, (ct_mesh_config){0}), "world size 0");
    expect_has(layout_error(8, (ct_mesh_config){.tp = 1 << 20, .pp = 1 << 20}), "tp 1048576 x pp 1048576 = 1099511627776");
    ct_mesh_config ok;
    cr_expect_eq(ct_mesh_layout(12, &(ct_mesh_config){.tp = 2, .pp = 3}, &ok), CT_OK, "%s", ct_last_error());
    cr_expect(ok.dp == 2 && ok.dp_shard == 2 && ok.dp_replicate == 1);

    cr_expect_neq(ct_mesh_check_model(&(ct_mesh_config){.tp = 4}, 6, 0, 2), CT_OK);
    expect_has(ct_last_error(), "tp 4 does not divide n_head 6");
    cr_expect_neq(ct_mesh_check_model(&(ct_mesh_config){.tp = 4}, 12, 6, 2), CT_OK);
    expect_has(ct_last_error(), "tp 4 and n_kv_head 6: neither divides the other");
    /* fewer key/value heads than tp: each replicated over tp / n_kv_head ranks */
    cr_expect_eq(ct_mesh_check_model(&(ct_mesh_config){.tp = 4}, 8, 2, 2), CT_OK, "%s", ct_last_error());
    cr_expect_eq(ct_mesh_check_model(&(ct_mesh_config){.tp = 8}, 8, 1, 2), CT_OK, "%s", ct_last_error());
    cr_expect_neq(ct_mesh_check_model(&(ct_mesh_config){.tp = 1, .pp = 4}, 8, 2, 3), CT_OK);
    expect_has(ct_last_error(), "pp 4 is larger than the layer count 3");
    cr_expect_eq(ct_mesh_check_model(&(ct_mesh_config){.tp = 2, .pp = 2}, 8, 2, 2), CT_OK, "%s", ct_last_error());
    cr_expect_null(ct_mesh_new(NULL, NULL));
}

/* a layout that does not fit the world fails on every rank before any group is made */
static int bad_mesh_rank(rank_ctx *c)
{
    ct_pg *world = rank_pg(c, 20, NULL);
    if (!world) return 1;
    ct_mesh *m = ct_mesh_new(world, &(ct_mesh_config){.tp = 3});
    int rc = 0;
    if (m || !strstr(ct_last_error(), "world size 2 is not a multiple of tp 3")) {
        report(c, "rank %d: mesh %p, error \"%s\"", c->rank, (void *)m, ct_last_error());
        rc = 1;
    }
    ct_mesh_free(m);
    ct_pg_free(world);
    return rc;
}

Test(parallel_mesh, a_bad_layout_fails_on_every_rank, .timeout = 30)
{
    rank_result res[MAX_RANKS];
    run_ranks(2, bad_mesh_rank, NULL, res, 20);
    expect_all_ok(res, 2);
}
