/* Tests for nn/tp_ops.c on fork()ed ranks: each op's forward and its input
 * gradient against the values written out here from the definitions (sums and
 * concatenations over the ranks' deterministic inputs, made on every rank in f64),
 * on the world group of 2 and 4 ranks and on the tensor-parallel sub-groups of a
 * 4-rank dp 2 x tp 2 mesh; bf16 within a bf16 tolerance. */
#include <criterion/criterion.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "parallel/mesh.h"
#include "nn/tp_ops.h"
#include "tests/nn/tp_check.h"

typedef struct ops_arg {
    bool mesh; /* run in the tp groups of a dp 2 x tp 2 mesh instead of the world group */
    ct_dtype dt;
    double tol;
} ops_arg;

static ct_tensor *leaf(ct_tensor *t)
{
    ct_tensor_set_requires_grad(t, true);
    return t;
}

/* the values an op sees, in f64: det_tensor rounded to dt */
static ct_tensor *ref(ct_dtype dt, int ndim, const int64_t *shape, double salt)
{
    return ct_tensor_cast(det_tensor(dt, ndim, shape, salt, 1.0), CT_DTYPE_F64);
}

/* sum over ranks k < n of ref(salt0 + k) */
static ct_tensor *sum_over(int n, ct_dtype dt, int ndim, const int64_t *shape, double salt0)
{
    ct_tensor *s = ref(dt, ndim, shape, salt0);
    for (int k = 1; k < n; k++) s = ct_add(s, ref(dt, ndim, shape, salt0 + k));
    return s;
}

/* ref(salt0 + k) for k < n concatenated along dim */
static ct_tensor *cat_over(int n, ct_dtype dt, int ndim, const int64_t *shape, double salt0, int dim)
{
    ct_tensor *parts[MAX_RANKS];
    for (int k = 0; k < n; k++) parts[k] = ref(dt, ndim, shape, salt0 + k);
    return ct_concat(n, parts, dim);
}

static int backward(rank_ctx *c, const char *what, ct_tensor *y, ct_tensor *gy)
{
    if (y && !ct_backward_with(y, gy, NULL)) return 0;
    report(c, "rank %d: %s: %s", c->rank, what, ct_last_error());
    return 1;
}

/* every op, forward and backward, in group g (n ranks, this one r) */
static int check_ops(rank_ctx *c, ct_pg *g, ct_dtype dt, double tol)
{
    int n = ct_pg_size(g), r = ct_pg_rank(g), rc = 0;
    const int64_t s2[] = {3, 5};                                  /* plain 2-d */
    const int64_t full3[] = {2, 2 * n, 3}, part3[] = {2, 2, 3};   /* split along dim 1 */
    const int64_t full2[] = {2 * n, 3}, part2[] = {2, 3};         /* split along dim 0 */

    /* f: identity forward; the gradients of all ranks summed */
    ct_tensor *x = leaf(det_tensor(dt, 2, s2, 1, 1.0));
    ct_tensor *y = ct_tp_copy_to(g, x);
    rc |= expect_close(c, "copy_to forward", y, ref(dt, 2, s2, 1), tol);
    rc |= backward(c, "copy_to backward", y, det_tensor(dt, 2, s2, 100 + r, 1.0));
    rc |= expect_close(c, "copy_to dx", x->grad, sum_over(n, dt, 2, s2, 100), tol);

    /* g: the sum forward; the gradient as it is */
    x = leaf(det_tensor(dt, 2, s2, 200 + r, 1.0));
    y = ct_tp_reduce_from(g, x);
    rc |= expect_close(c, "reduce_from forward", y, sum_over(n, dt, 2, s2, 200), tol);
    rc |= backward(c, "reduce_from backward", y, det_tensor(dt, 2, s2, 300, 1.0));
    rc |= expect_close(c, "reduce_from dx", x->grad, ref(dt, 2, s2, 300), tol);

    /* split along dim 1 (a middle dim) and dim 0 */
    x = leaf(det_tensor(dt, 3, full3, 400, 1.0));
    y = ct_tp_split(g, x, 1);
    rc |= expect_close(c, "split(1) forward", y, ct_narrow(ref(dt, 3, full3, 400), 1, 2 * r, 2), tol);
    rc |= backward(c, "split(1) backward", y, det_tensor(dt, 3, part3, 500 + r, 1.0));
    rc |= expect_close(c, "split(1) dx", x->grad, cat_over(n, dt, 3, part3, 500, 1), tol);
    x = leaf(det_tensor(dt, 2, full2, 450, 1.0));
    y = ct_tp_scatter_to_sequence(g, x, 0);
    rc |= expect_close(c, "scatter_to_sequence(0) forward", y, ct_narrow(ref(dt, 2, full2, 450), 0, 2 * r, 2), tol);
    rc |= backward(c, "scatter_to_sequence(0) backward", y, det_tensor(dt, 2, part2, 550 + r, 1.0));
    rc |= expect_close(c, "scatter_to_sequence(0) dx", x->grad, cat_over(n, dt, 2, part2, 550, 0), tol);

    /* gather along dim -2 (= 1): backward keeps this rank's chunk */
    x = leaf(det_tensor(dt, 3, part3, 600 + r, 1.0));
    y = ct_tp_gather(g, x, -2);
    rc |= expect_close(c, "gather(-2) forward", y, cat_over(n, dt, 3, part3, 600, 1), tol);
    rc |= backward(c, "gather(-2) backward", y, det_tensor(dt, 3, full3, 700, 1.0));
    rc |= expect_close(c, "gather(-2) dx", x->grad, ct_narrow(ref(dt, 3, full3, 700), 1, 2 * r, 2), tol);

    /* gather_from_sequence: backward reduce-scatters the ranks' gradients */
    x = leaf(det_tensor(dt, 3, part3, 800 + r, 1.0));
    y = ct_tp_gather_from_sequence(g, x, 1);
    rc |= expect_close(c, "gather_from_sequence(1) forward", y, cat_over(n, dt, 3, part3, 800, 1), tol);
    rc |= backward(c, "gather_from_sequence(1) backward", y, det_tensor(dt, 3, full3, 900 + r, 1.0));
    rc |= expect_close(c, "gather_from_sequence(1) dx", x->grad,
                       ct_narrow(sum_over(n, dt, 3, full3, 900), 1, 2 * r, 2), tol);

    /* reduce_scatter_to_sequence along dim 1 and dim 0: backward all-gathers */
    x = leaf(det_tensor(dt, 3, full3, 1000 + r, 1.0));
    y = ct_tp_reduce_scatter_to_sequence(g, x, 1);
    rc |= expect_close(c, "reduce_scatter_to_sequence(1) forward", y,
                       ct_narrow(sum_over(n, dt, 3, full3, 1000), 1, 2 * r, 2), tol);
    rc |= backward(c, "reduce_scatter_to_sequence(1) backward", y, det_tensor(dt, 3, part3, 1100 + r, 1.0));
    rc |= expect_close(c, "reduce_scatter_to_sequence(1) dx", x->grad, cat_over(n, dt, 3, part3, 1100, 1), tol);
    x = leaf(det_tensor(dt, 2, full2, 1200 + r, 1.0));
    y = ct_tp_reduce_scatter_to_sequence(g, x, 0);
    rc |= expect_close(c, "reduce_scatter_to_sequence(0) forward", y,
                       ct_narrow(sum_over(n, dt, 2, full2, 1200), 0, 2 * r, 2), tol);
    rc |= backward(c, "reduce_scatter_to_sequence(0) backward", y, det_tensor(dt, 2, part2, 1300 + r, 1.0));
    rc |= expect_close(c, "reduce_scatter_to_sequence(0) dx", x->grad, cat_over(n, dt, 2, part2, 1300, 0), tol);

    /* round trip: scatter then gather gives x back; every rank's loss sum(y * G) has
     * the same gradient G, so x's gradient over the n ranks' losses is n G */
    x = leaf(det_tensor(dt, 3, full3, 1400, 1.0));
    y = ct_tp_gather_from_sequence(g, ct_tp_scatter_to_sequence(g, x, 1), 1);
    rc |= expect_close(c, "scatter -> gather round trip", y, ref(dt, 3, full3, 1400), tol);
    rc |= backward(c, "round trip backward", y, det_tensor(dt, 3, full3, 1500, 1.0));
    rc |= expect_close(c, "round trip dx", x->grad, ct_mul_scalar(ref(dt, 3, full3, 1500), n), tol);
    return rc;
}

static int ops_rank(rank_ctx *c)
{
    const ops_arg *a = c->arg;
    ct_pg *world = rank_pg(c, 30, NULL);
    if (!world) return 1;
    int rc = 0;
    ct_mesh *m = a->mesh ? ct_mesh_new(world, &(ct_mesh_config){.dp = 2, .tp = 2}) : NULL;
    if (a->mesh && !m) {
        report(c, "rank %d: mesh: %s", c->rank, ct_last_error());
        rc = 1;
    } else {
        CT_FRAME { rc = check_ops(c, m ? m->tp_group : world, a->dt, a->tol); }
    }
    ct_mesh_free(m);
    ct_pg_free(world);
    return rc;
}

static void run_ops(int world, ops_arg a)
{
    rank_result res[MAX_RANKS];
    run_ranks(world, ops_rank, &a, res, 60);
    expect_all_ok(res, world);
}

Test(tp_ops, f32_on_2_ranks, .timeout = 60) { run_ops(2, (ops_arg){.dt = CT_DTYPE_F32, .tol = 1e-6}); }
Test(tp_ops, f32_on_4_ranks, .timeout = 60) { run_ops(4, (ops_arg){.dt = CT_DTYPE_F32, .tol = 1e-6}); }
Test(tp_ops, f32_in_the_tp_groups_of_a_dp2_tp2_mesh, .timeout = 60)
{
    run_ops(4, (ops_arg){.mesh = true, .dt = CT_DTYPE_F32, .tol = 1e-6});
}
/* bf16: inputs exact, sums of up to 2 values rounded once to 8 bits */
Test(tp_ops, bf16_on_2_ranks, .timeout = 60) { run_ops(2, (ops_arg){.dt = CT_DTYPE_BF16, .tol = 8e-3}); }
/* f16: 11 bits; f64: the group sums in f64 */
Test(tp_ops, f16_and_f64_on_2_ranks, .timeout = 60)
{
    run_ops(2, (ops_arg){.dt = CT_DTYPE_F16, .tol = 1e-3});
    run_ops(2, (ops_arg){.dt = CT_DTYPE_F64, .tol = 1e-12});
}

/* bad calls fail on every rank, naming the op, the shape and the rank, before any
 * collective is sent (so nothing hangs) */
static int errors_rank(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, NULL);
    if (!g) return 1;
    int rc = 0;
    CT_FRAME {
        ct_tensor *x = det_tensor(CT_DTYPE_F32, CT_SHAPE(2, 3, 4), 1, 1.0);
        rc |= expect_error(c, "split of 3 over 2", !ct_tp_split(g, x, 1),
                           "tp_split (rank");
        rc |= expect_error(c, "split of 3 over 2", !ct_tp_split(g, x, 1), "not a multiple of the 2 ranks");
        rc |= expect_error(c, "split of 3 over 2", !ct_tp_split(g, x, 1), "[2, 3, 4]");
        rc |= expect_error(c, "reduce_scatter of 3 over 2", !ct_tp_reduce_scatter_to_sequence(g, x, -2),
                           "tp_reduce_scatter_to_sequence (rank");
        rc |= expect_error(c, "dim out of range", !ct_tp_gather(g, x, 3), "dim 3 is out of range");
        rc |= expect_error(c, "dim out of range", !ct_tp_gather_from_sequence(g, x, -4), "dim -4 is out of range");
        ct_tensor *ids = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(4));
        rc |= expect_error(c, "integer tensor", !ct_tp_copy_to(g, ids), "want f32, f64, bf16 or f16");
        rc |= expect_error(c, "NULL group", !ct_tp_reduce_from(NULL, x), "NULL process group");
        /* and the group still works after the refusals */
        ct_tensor *y = ct_tp_reduce_from(g, ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(2)));
        if (!y || ct_tensor_get(y, (const int64_t[]){1}) != 2) {
            report(c, "rank %d: reduce_from after the errors: %s", c->rank, y ? "wrong sum" : ct_last_error());
            rc = 1;
        }
    }
    ct_pg_free(g);
    return rc;
}

Test(tp_ops, bad_calls_name_op_shape_and_rank, .timeout = 30)
{
    rank_result res[MAX_RANKS];
    run_ranks(2, errors_rank, NULL, res, 20);
    expect_all_ok(res, 2);
}
