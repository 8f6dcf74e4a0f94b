/* Tests for kernels/reduce.c and kernels/cpu/reduce.c.
 *
 * Every reduction is compared with a naive f64 loop written here (one pass over
 * all elements with ct_tensor_get, scattering into per-output accumulators), on
 * (2,3,5,7)-shaped inputs over every subset of dims, with and without keepdim,
 * contiguous, permuted and sliced; larger shapes exercise the blocked and
 * column-wise paths against the *_ref kernels; hand values pin the references. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/cuda.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/reduce.h"
#include "kernels/reduce.h"
#include "tests/kernels/util.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* Uniform values of dtype dt, logical shape (ndim, shape), layout 0 contiguous,
 * 1 a permutation view (dims stored in reverse order), 2 every other element of
 * the last dim. Integers truncate. */
static ct_tensor *make(ct_dtype dt, int ndim, const int64_t *shape, int layout, double lo, double hi)
{
    int64_t s[CT_MAX_DIMS];
    int perm[CT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) s[d] = shape[d];
    if (layout == 1)
        for (int d = 0; d < ndim; d++) s[d] = shape[ndim - 1 - d], perm[d] = ndim - 1 - d;
    if (layout == 2 && ndim > 0) s[ndim - 1] *= 2;
    ct_tensor *base = ct_tensor_cast(ct_tensor_rand(CT_DTYPE_F64, ndim, s, lo, hi), dt);
    cr_assert_not_null(base, "%s", ct_last_error());
    if (layout == 1) return ct_tensor_permute(base, perm);
    if (layout == 2 && ndim > 0) return ct_tensor_slice(base, ndim - 1, 0, s[ndim - 1], 2);
    return base;
}

enum { N_SUM, N_MEAN, N_MAX, N_MIN, N_VAR0, N_VAR1, N_OPS };

/* The naive f64 reference: res[op][o] for the outputs o of x's kept dims (mask
 * bit clear), in row-major order of those dims. */
static void naive(const ct_tensor *x, uint32_t mask, double res[N_OPS][256])
{
    const int64_t n = ct_tensor_numel(x);
    int64_t nout = 1, nred = 1;
    for (int d = 0; d < x->ndim; d++) {
        if ((mask >> d) & 1) nred *= x->shape[d];
        else nout *= x->shape[d];
    }
    cr_assert(nout <= 256);
    double sum[256] = {0}, mx[256], mn[256], sq[256] = {0};
    for (int o = 0; o < nout; o++) mx[o] = -INFINITY, mn[o] = INFINITY;
    int64_t idx[CT_MAX_DIMS];
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < n; i++) {
            int64_t r = i, o = 0, scale = 1;
            for (int d = x->ndim - 1; d >= 0; d--) {
                idx[d] = r % x->shape[d];
                r /= x->shape[d];
                if (!((mask >> d) & 1)) o += idx[d] * scale, scale *= x->shape[d];
            }
            double v = ct_tensor_get(x, idx);
            if (pass == 0) {
                sum[o] += v;
                mx[o] = isnan(v) || isnan(mx[o]) ? NAN : fmax(mx[o], v);
                mn[o] = isnan(v) || isnan(mn[o]) ? NAN : fmin(mn[o], v);
            } else {
                double dv = v - sum[o] / (double)nred;
                sq[o] += dv * dv;
            }
        }
    }
    for (int o = 0; o < nout; o++) {
        res[N_SUM][o] = sum[o];
        res[N_MEAN][o] = sum[o] / (double)nred;
        res[N_MAX][o] = mx[o];
        res[N_MIN][o] = mn[o];
        res[N_VAR0][o] = nred > 0 ? sq[o] / (double)nred : NAN;
        res[N_VAR1][o] = nred > 1 ? sq[o] / (double)(nred - 1) : NAN;
    }
}

static ct_tensor *run_op(int op, const ct_tensor *x, const int *dims, int ndims, bool keepdim)
{
    switch (op) {
    case N_SUM: return ct_kernel_sum(x, dims, ndims, keepdim);
    case N_MEAN: return ct_kernel_mean(x, dims, ndims, keepdim);
    case N_MAX: return ct_kernel_max(x, dims, ndims, keepdim);
    case N_MIN: return ct_kernel_min(x, dims, ndims, keepdim);
    case N_VAR0: return ct_kernel_var(x, dims, ndims, 0, keepdim);
    default: return ct_kernel_var(x, dims, ndims, 1, keepdim);
    }
}

static ct_status run_ref(int op, ct_tensor *out, const ct_tensor *x, uint32_t mask)
{
    switch (op) {
    case N_SUM: return cti_cpu_reduce_ref(CT_REDUCE_SUM, out, x, mask);
    case N_MEAN: return cti_cpu_reduce_ref(CT_REDUCE_MEAN, out, x, mask);
    case N_MAX: return cti_cpu_reduce_ref(CT_REDUCE_MAX, out, x, mask);
    case N_MIN: return cti_cpu_reduce_ref(CT_REDUCE_MIN, out, x, mask);
    case N_VAR0: return cti_cpu_var_ref(out, x, mask, 0);
    default: return cti_cpu_var_ref(out, x, mask, 1);
    }
}

static const char *const op_names[N_OPS] = {"sum", "mean", "max", "min", "var0", "var1"};

/* ---- references against hand values ------------------------------------------------------- */

Test(reduce_ref, hand_values)
{
    CT_FRAME {
        ct_tensor *x = from_f64(CT_DTYPE_F64, CT_SHAPE(2, 3), (double[]){1, 5, 3, 4, 2, 6});
        ct_tensor *o2 = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(2)), *o3 = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(3));
        ct_tensor *o1 = ct_tensor_empty(CT_DTYPE_F64, 0, NULL);
        cti_cpu_reduce_ref(CT_REDUCE_SUM, o3, x, 1u);
        cr_assert(ct_tensor_get(o3, (int64_t[]){0}) == 5 && ct_tensor_get(o3, (int64_t[]){1}) == 7 &&
                  ct_tensor_get(o3, (int64_t[]){2}) == 9);
        cti_cpu_reduce_ref(CT_REDUCE_MEAN, o2, x, 2u);
        cr_assert(ct_tensor_get(o2, (int64_t[]){0}) == 3 && ct_tensor_get(o2, (int64_t[]){1}) == 4);
        cti_cpu_reduce_ref(CT_REDUCE_MAX, o1, x, 3u);
        cr_assert(ct_tensor_item(o1) == 6);
        cti_cpu_reduce_ref(CT_REDUCE_MIN, o2, x, 2u);
        cr_assert(ct_tensor_get(o2, (int64_t[]){0}) == 1 && ct_tensor_get(o2, (int64_t[]){1}) == 2);
        /* var of {1, 5, 3}: mean 3, squares 4 + 4 + 0 = 8 */
        cti_cpu_var_ref(o2, x, 2u, 1);
        cr_assert(ct_tensor_get(o2, (int64_t[]){0}) == 4);
        cti_cpu_var_ref(o2, x, 2u, 0);
        cr_assert(ct_tensor_get(o2, (int64_t[]){0}) == 8.0 / 3);
        ct_tensor *i64 = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(2));
        cti_cpu_argmax_ref(i64, from_f64(CT_DTYPE_F32, CT_SHAPE(2, 4), (double[]){1, 7, 7, 2, 0, NAN, 9, NAN}), 1);
        cr_assert(ct_tensor_get(i64, (int64_t[]){0}) == 1, "first maximum wins");
        cr_assert(ct_tensor_get(i64, (int64_t[]){1}) == 1, "first NaN wins");
        cti_cpu_reduce_ref(CT_REDUCE_MAX, o2, from_f64(CT_DTYPE_F64, CT_SHAPE(2, 2), (double[]){NAN, 1, 2, 3}), 2u);
        cr_assert(isnan(ct_tensor_get(o2, (int64_t[]){0})) && ct_tensor_get(o2, (int64_t[]){1}) == 3);
    }
}

/* ---- every subset of dims ------------------------------------------------------------------ */

Test(reduce, every_dim_subset_vs_naive)
{
    ct_set_seed(11);
    const ct_dtype dts[4] = {CT_DTYPE_F64, CT_DTYPE_F32, CT_DTYPE_BF16, CT_DTYPE_F16};
    const int64_t shape[4] = {2, 3, 5, 7};
    for (int di = 0; di < 4; di++) {
        for (int layout = 0; layout < 3; layout++) {
            CT_FRAME {
                ct_tensor *x = make(dts[di], 4, shape, layout, -3, 5);
                for (uint32_t mask = 0; mask < 16; mask++) {
                    double want[N_OPS][256];
                    naive(x, mask, want);
                    int dims[4], nd = 0;
                    for (int d = 0; d < 4; d++)
                        if ((mask >> d) & 1) dims[nd++] = (d % 2) ? d - 4 : d; /* some negative */
                    for (int keep = 0; keep < 2; keep++) {
                        for (int op = 0; op < N_OPS; op++) {
                            if (nd == 0 && keep) continue; /* ndims == 0 means all dims; tested below */
                            ct_tensor *r = run_op(op, x, dims, nd, keep);
                            cr_assert_not_null(r, "%s: %s", op_names[op], ct_last_error());
                            cr_assert_eq(r->dtype, x->dtype);
                            int64_t nout = 1;
                            int k = 0;
                            for (int d = 0; d < 4; d++) {
                                bool red = nd > 0 ? (mask >> d) & 1 : true;
                                if (!red) {
                                    cr_assert_eq(r->shape[k++], shape[d]);
                                    nout *= shape[d];
                                } else if (keep) {
                                    cr_assert_eq(r->shape[k++], 1);
                                }
                            }
                            cr_assert_eq(r->ndim, k, "%s keepdim %d mask %u", op_names[op], keep, mask);
                            const double *w = want[op];
                            double all[N_OPS][256];
                            if (nd == 0) { /* every dim */
                                naive(x, 15u, all);
                                w = all[op];
                            }
                            double e = rel_err_n(f64_data(r), w, nout, true);
                            double tol = op == N_MAX || op == N_MIN ? 0.0 : tol_for_f64(x->dtype, 1e-13);
                            cr_assert(e <= tol, "%s %s layout %d mask %u keep %d: %g", op_names[op],
                                      ct_dtype_name(x->dtype), layout, mask, keep, e);
                            if (keep) continue;
                            ct_tensor *rr = ct_tensor_empty(r->dtype, r->ndim, r->shape);
                            cr_assert_eq(run_ref(op, rr, x, nd ? mask : 15u), CT_OK);
                            e = rel_err_n(f64_data(rr), w, nout, true);
                            cr_assert(e <= tol, "ref %s mask %u: %g", op_names[op], mask, e);
                        }
                    }
                }
            }
        }
    }
}

/* ---- large shapes: blocks, column-wise layout, thread-count independence -------------------- */

typedef struct big_case {
    int ndim;
    int64_t shape[3];
    int ndims;
    int dims[3];
} big_case;

static const big_case bigs[] = {
    {2, {1000, 77}, 1, {0}},    /* column-wise */
    {2, {20000, 33}, 1, {0}},   /* column-wise, 3 blocks of rows */
    {2, {300, 2500}, 1, {0}},   /* column-wise, 2 runs of columns, 3 blocks of rows */
    {2, {3, 100000}, 1, {1}},   /* rows, 4 blocks each */
    {2, {513, 1025}, 0, {0}},   /* everything into one value, 17 blocks */
    {2, {64, 4096}, 1, {0}},    /* column-wise, 2 runs of columns */
    {3, {50, 30, 70}, 2, {0, 2}}, /* mixed */
    {3, {40, 3, 600}, 2, {0, 1}},
    {2, {7, 5}, 1, {1}},
};

Test(reduce, large_fast_vs_ref_and_thread_independent)
{
    ct_set_seed(12);
    const ct_dtype dts[3] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16};
    for (size_t c = 0; c < sizeof bigs / sizeof bigs[0]; c++) {
        for (int di = 0; di < 3; di++) {
            CT_FRAME {
                const big_case *b = &bigs[c];
                ct_tensor *x = make(dts[di], b->ndim, b->shape, (int)(c + di) % 3, -1, 3);
                uint32_t mask = b->ndims ? 0 : (1u << b->ndim) - 1;
                for (int k = 0; k < b->ndims; k++) mask |= 1u << b->dims[k];
                for (int op = 0; op < N_OPS; op++) {
                    ct_set_num_threads(1);
                    ct_tensor *r1 = run_op(op, x, b->dims, b->ndims, false);
                    ct_set_num_threads(3);
                    ct_tensor *r3 = run_op(op, x, b->dims, b->ndims, false);
                    ct_set_num_threads(0);
                    cr_assert_not_null(r1, "%s", ct_last_error());
                    cr_assert(same_bits(r1, r3), "%s case %zu: bits depend on the thread count", op_names[op], c);
                    ct_tensor *rr = ct_tensor_empty(r1->dtype, r1->ndim, r1->shape);
                    run_ref(op, rr, x, mask);
                    double e = rel_err_n(f64_data(r1), f64_data(rr), ct_tensor_numel(r1), true);
                    double tol = op == N_MAX || op == N_MIN ? 0.0 : tol_for(dts[di]);
                    cr_assert(e <= tol, "%s %s case %zu: %g", op_names[op], ct_dtype_name(dts[di]), c, e);
                }
            }
        }
    }
}

/* ---- integers, NaN, empty, argmax ---------------------------------------------------------- */

Test(reduce, integers)
{
    ct_set_seed(13);
    const ct_dtype dts[4] = {CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8, CT_DTYPE_BOOL};
    const int64_t shape[3] = {6, 35, 40};
    for (int di = 0; di < 4; di++) {
        CT_FRAME {
            ct_tensor *x = make(dts[di], 3, shape, di % 3, dts[di] == CT_DTYPE_I32 ? -1e6 : 0, 200);
            if (dts[di] == CT_DTYPE_BOOL) x = ct_tensor_cast(make(CT_DTYPE_I32, 3, shape, 1, 0, 2), CT_DTYPE_BOOL);
            for (uint32_t mask = 1; mask < 8; mask++) {
                int dims[3], nd = 0;
                for (int d = 0; d < 3; d++)
                    if ((mask >> d) & 1) dims[nd++] = d;
                ct_tensor *s = ct_kernel_sum(x, dims, nd, false);
                cr_assert_eq(s->dtype, CT_DTYPE_I64, "integer sums are i64");
                ct_tensor *mx = ct_kernel_max(x, dims, nd, true), *mn = ct_kernel_min(x, dims, nd, false);
                cr_assert_eq(mx->dtype, x->dtype);
                double *vs = f64_data(s), *vx = f64_data(mx), *vn = f64_data(mn);
                /* against the ref kernels, and against the naive loop where nout fits it */
                ct_tensor *rs = ct_tensor_empty(CT_DTYPE_I64, s->ndim, s->shape);
                ct_tensor *rx = ct_tensor_empty(x->dtype, mx->ndim, mx->shape);
                ct_tensor *rn = ct_tensor_empty(x->dtype, mn->ndim, mn->shape);
                cti_cpu_reduce_ref(CT_REDUCE_SUM, rs, x, mask);
                cti_cpu_reduce_ref(CT_REDUCE_MAX, rx, x, mask);
                cti_cpu_reduce_ref(CT_REDUCE_MIN, rn, x, mask);
                cr_assert_eq(rel_err_n(vs, f64_data(rs), ct_tensor_numel(s), true), 0.0);
                cr_assert_eq(rel_err_n(vx, f64_data(rx), ct_tensor_numel(mx), true), 0.0);
                cr_assert_eq(rel_err_n(vn, f64_data(rn), ct_tensor_numel(mn), true), 0.0);
                if (ct_tensor_numel(s) <= 256) {
                    double want[N_OPS][256];
                    naive(x, mask, want);
                    cr_assert_eq(rel_err_n(vs, want[N_SUM], ct_tensor_numel(s), true), 0.0);
                    cr_assert_eq(rel_err_n(vx, want[N_MAX], ct_tensor_numel(s), true), 0.0);
                }
            }
        }
    }
    CT_FRAME { /* exact in int64 beyond 2^53, and wrapping like PyTorch */
        int64_t v[3] = {(int64_t)1 << 62, (int64_t)1 << 62, 5};
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(3), v);
        ct_tensor *s = ct_kernel_sum(x, NULL, 0, false);
        cr_assert_eq(*(int64_t *)ct_tensor_data(s), INT64_MIN + 5);
        int64_t w[3] = {((int64_t)1 << 53) + 1, 1, -1};
        ct_tensor *m = ct_kernel_max(ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(3), w), NULL, 0, false);
        cr_assert_eq(*(int64_t *)ct_tensor_data(m), ((int64_t)1 << 53) + 1);
        ct_tensor *b = from_f64(CT_DTYPE_BOOL, CT_SHAPE(4), (double[]){1, 0, 1, 1});
        cr_assert_eq(ct_tensor_item(ct_kernel_sum(b, NULL, 0, false)), 3);
        cr_assert_eq(ct_tensor_item(ct_kernel_max(b, NULL, 0, false)), 1);
        cr_assert_eq(ct_tensor_item(ct_kernel_min(b, NULL, 0, false)), 0);
    }
}

Test(reduce, argmax_vs_naive)
{
    ct_set_seed(14);
    const ct_dtype dts[5] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_I32, CT_DTYPE_U8};
    const int64_t shape[4] = {2, 3, 5, 7};
    for (int di = 0; di < 5; di++) {
        for (int layout = 0; layout < 3; layout++) {
            CT_FRAME {
                /* few distinct values, so ties are common and the first must win */
                ct_tensor *x = make(dts[di], 4, shape, layout, 0, 4);
                for (int dim = -4; dim < 4; dim++) {
                    const int d = dim < 0 ? dim + 4 : dim;
                    for (int keep = 0; keep < 2; keep++) {
                        ct_tensor *a = ct_kernel_argmax(x, dim, keep);
                        cr_assert_not_null(a, "%s", ct_last_error());
                        cr_assert_eq(a->dtype, CT_DTYPE_I64);
                        cr_assert_eq(a->ndim, keep ? 4 : 3);
                        const int64_t *pa = ct_tensor_data(a);
                        int64_t o = 0, idx[4];
                        for (idx[0] = 0; idx[0] < 2; idx[0]++)
                            for (idx[1] = 0; idx[1] < 3; idx[1]++)
                                for (idx[2] = 0; idx[2] < 5; idx[2]++)
                                    for (idx[3] = 0; idx[3] < 7; idx[3]++) {
                                        if (idx[d] != 0) continue;
                                        int64_t best = 0, j[4] = {idx[0], idx[1], idx[2], idx[3]};
                                        double bv = -INFINITY;
                                        for (j[d] = 0; j[d] < shape[d]; j[d]++) {
                                            double v = ct_tensor_get(x, j);
                                            if (v > bv) bv = v, best = j[d];
                                        }
                                        cr_assert_eq(pa[o], best, "%s dim %d", ct_dtype_name(dts[di]), dim);
                                        o++;
                                    }
                    }
                }
            }
        }
    }
    CT_FRAME {
        ct_tensor *x = make(CT_DTYPE_F32, CT_SHAPE(300, 257), 1, -1, 1);
        ct_tensor_set(x, (int64_t[]){7, 100}, NAN);
        ct_tensor_set(x, (int64_t[]){7, 200}, NAN);
        ct_tensor_set(x, (int64_t[]){9, 3}, 1e30);
        ct_tensor *a = ct_kernel_argmax(x, 1, false);
        cr_assert_eq(ct_tensor_get(a, (int64_t[]){7}), 100, "first NaN");
        cr_assert_eq(ct_tensor_get(a, (int64_t[]){9}), 3);
        ct_tensor *r = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(300));
        cti_cpu_argmax_ref(r, x, 1);
        cr_assert(same_bits(a, r));
        ct_tensor *m = ct_kernel_max(x, (int[]){1}, 1, false);
        cr_assert(isnan(ct_tensor_get(m, (int64_t[]){7})) && ct_tensor_get(m, (int64_t[]){9}) == (double)1e30f);
        cr_assert(isnan(ct_tensor_item(ct_kernel_min(x, NULL, 0, false))), "NaN propagates through blocks");
        cr_assert(isnan(ct_tensor_item(ct_kernel_max(ct_tensor_transpose(x, 0, 1), NULL, 0, false))));
        ct_tensor *cm = ct_kernel_max(x, (int[]){0}, 1, false); /* column-wise */
        cr_assert(isnan(ct_tensor_get(cm, (int64_t[]){100})) && isnan(ct_tensor_get(cm, (int64_t[]){200})));
        cr_assert(!isnan(ct_tensor_get(cm, (int64_t[]){101})));
    }
}

Test(reduce, empty_scalar_and_small_counts)
{
    CT_FRAME {
        ct_tensor *e = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(0, 3));
        ct_tensor *s = ct_kernel_sum(e, (int[]){0}, 1, false);
        cr_assert(s && s->ndim == 1 && s->shape[0] == 3 && ct_tensor_get(s, (int64_t[]){2}) == 0);
        cr_assert_eq(ct_tensor_item(ct_kernel_sum(e, NULL, 0, false)), 0);
        cr_assert(isnan(ct_tensor_item(ct_kernel_mean(e, NULL, 0, false))));
        cr_assert(isnan(ct_tensor_get(ct_kernel_var(e, (int[]){0}, 1, 1, false), (int64_t[]){1})));
        ct_tensor *m = ct_kernel_max(e, (int[]){1}, 1, false); /* nothing reduced over an empty dim */
        cr_assert(m && m->shape[0] == 0);
        cr_assert_null(ct_kernel_max(e, (int[]){0}, 1, false));
        ERROR_HAS("max", "f32[0, 3]");
        cr_assert_null(ct_kernel_min(e, NULL, 0, false));
        cr_assert_null(ct_kernel_argmax(e, 0, false));
        ERROR_HAS("argmax");
        ct_tensor *ea = ct_kernel_argmax(e, 1, true);
        cr_assert(ea && ea->ndim == 2 && ea->shape[0] == 0 && ea->shape[1] == 1);
        /* var with N <= correction: NaN, no crash */
        ct_tensor *one = from_f64(CT_DTYPE_F32, CT_SHAPE(4, 1), (double[]){1, 2, 3, 4});
        ct_tensor *v1 = ct_kernel_var(one, (int[]){1}, 1, 1, false);
        cr_assert(isnan(ct_tensor_get(v1, (int64_t[]){0})));
        cr_assert_eq(ct_tensor_get(ct_kernel_var(one, (int[]){1}, 1, 0, false), (int64_t[]){0}), 0);
        cr_assert_eq(ct_tensor_item(ct_kernel_var(one, NULL, 0, 1, false)), (float)(5.0 / 3));
        cr_assert(isnan(ct_tensor_item(ct_kernel_var(one, NULL, 0, 4, false))));
        /* 0-d input: dim 0 / -1 accepted, result 0-d */
        ct_tensor *sc = ct_tensor_scalar(CT_DTYPE_F64, 2.5);
        ct_tensor *r0 = ct_kernel_sum(sc, (int[]){0}, 1, true), *r1 = ct_kernel_max(sc, (int[]){-1}, 1, false);
        cr_assert(r0 && r0->ndim == 0 && ct_tensor_item(r0) == 2.5 && ct_tensor_item(r1) == 2.5);
        cr_assert_eq(ct_tensor_item(ct_kernel_argmax(sc, 0, false)), 0);
        cr_assert_null(ct_kernel_sum(sc, (int[]){1}, 1, false));
        /* keepdim over all dims */
        ct_tensor *k = ct_kernel_mean(one, NULL, 0, true);
        cr_assert(k->ndim == 2 && k->shape[0] == 1 && k->shape[1] == 1 && ct_tensor_item(k) == 2.5);
    }
}

/* ---- sum_to_shape --------------------------------------------------------------------------- */

Test(reduce, sum_to_shape)
{
    ct_set_seed(15);
    CT_FRAME {
        ct_tensor *x = make(CT_DTYPE_F64, CT_SHAPE(4, 3, 5), 1, -1, 1);
        const double *v = f64_data(x);
        struct { int n; int64_t s[3]; } targets[] = {{2, {3, 1}}, {1, {5}}, {3, {1, 1, 1}}, {3, {4, 3, 5}},
                                                     {0, {0}}, {3, {4, 1, 5}}, {2, {1, 5}}};
        for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
            const int n = targets[t].n;
            const int64_t *s = targets[t].s;
            ct_tensor *r = ct_kernel_sum_to_shape(x, n, s);
            cr_assert_not_null(r, "%s", ct_last_error());
            cr_assert_eq(r->ndim, n);
            int64_t cnt = 1;
            for (int d = 0; d < n; d++) {
                cr_assert_eq(r->shape[d], s[d]);
                cnt *= s[d];
            }
            double want[60] = {0};
            /* each x element adds into the target element that broadcasting maps it from */
            for (int64_t i = 0; i < 60; i++) {
                int64_t idx[3] = {i / 15, (i / 5) % 3, i % 5}, o = 0;
                for (int d = 0; d < n; d++) {
                    int64_t xi = idx[3 - n + d];
                    o = o * s[d] + (s[d] == 1 ? 0 : xi);
                }
                want[o] += v[i];
            }
            cr_assert(rel_err_n(f64_data(r), want, cnt, true) < 1e-14, "target %zu", t);
        }
        cr_assert_null(ct_kernel_sum_to_shape(x, CT_SHAPE(2, 5)));
        ERROR_HAS("sum_to_shape", "[2, 5]", "f64[4, 3, 5]");
        cr_assert_null(ct_kernel_sum_to_shape(x, CT_SHAPE(1, 4, 3, 5)));
        /* the broadcast-gradient use: d(a + b)/db for b (C,) broadcast over (N, C) */
        ct_tensor *g = ct_tensor_expand(from_f64(CT_DTYPE_F32, CT_SHAPE(1, 3), (double[]){1, 2, 3}), CT_SHAPE(100, 3));
        ct_tensor *gb = ct_kernel_sum_to_shape(g, CT_SHAPE(3));
        cr_assert(ct_tensor_get(gb, (int64_t[]){0}) == 100 && ct_tensor_get(gb, (int64_t[]){2}) == 300);
    }
}

/* ---- errors ------------------------------------------------------------------------------------ */

Test(reduce, errors_name_op_dims_and_shape)
{
    CT_FRAME {
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3));
        cr_assert_null(ct_kernel_sum(x, (int[]){2}, 1, false));
        ERROR_HAS("sum", "dim 2", "f32[2, 3]");
        cr_assert_null(ct_kernel_mean(x, (int[]){-3}, 1, false));
        ERROR_HAS("mean", "-3");
        cr_assert_null(ct_kernel_max(x, (int[]){1, -1}, 2, false));
        ERROR_HAS("max", "twice");
        cr_assert_null(ct_kernel_sum(x, NULL, 2, false));
        ERROR_HAS("sum");
        ct_tensor *i = ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(4));
        cr_assert_null(ct_kernel_mean(i, NULL, 0, false));
        ERROR_HAS("mean", "i32[4]", "ct_tensor_cast");
        cr_assert_null(ct_kernel_var(i, NULL, 0, 1, false));
        ERROR_HAS("var", "i32[4]");
        ct_tensor *q = ct_tensor_zeros(CT_DTYPE_F8_E5M2, CT_SHAPE(4));
        cr_assert_null(ct_kernel_sum(q, NULL, 0, false));
        ERROR_HAS("f8_e5m2[4]", "cast");
        cr_assert_null(ct_kernel_argmax(x, 5, false));
        ERROR_HAS("argmax", "dim 5");
        if (!ct_cuda_built()) { /* a header relabelled as cuda:0: no CUDA kernels in this build */
            ct_tensor fake = *x;
            fake.device = CT_CUDA(0);
            cr_assert_null(ct_kernel_sum(&fake, NULL, 0, false));
            ERROR_HAS("sum", "cuda:0");
            cr_assert_null(ct_kernel_argmax(&fake, 0, false));
            ERROR_HAS("argmax", "cuda:0");
        }
        ct_error_set(CT_ERR_INVALID, "earlier failure");
        cr_assert_null(ct_kernel_sum(NULL, NULL, 0, false));
        cr_assert_null(ct_kernel_var(NULL, NULL, 0, 1, false));
        cr_assert_null(ct_kernel_argmax(NULL, 0, false));
        cr_assert_null(ct_kernel_sum_to_shape(NULL, CT_SHAPE(1)));
        cr_assert_str_eq(ct_last_error(), "earlier failure");
    }
}
