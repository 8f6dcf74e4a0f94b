/* Tests for kernels/attention.c and kernels/cpu/attention.c.
 *
 * The blockwise kernel is compared with the full-matrix double reference; the
 * reference itself is checked against a case worked out by hand (forward) and
 * central finite differences in f64 (backward). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention.h"
#include "tests/kernels/util.h"

/* A (B,H,T,D) tensor; `layout` 0: contiguous, 1: transposed view of (B,T,H,D) (what the
 * GPT hands over), 2: every other element of the last dim of a (B,H,T,2D) tensor. */
static ct_tensor *make_bhtd(ct_dtype dt, int64_t B, int64_t H, int64_t T, int64_t D, int layout, double std)
{
    if (layout == 1) return ct_tensor_transpose(ct_tensor_randn(dt, CT_SHAPE(B, T, H, D), 0, std), 1, 2);
    if (layout == 2) return ct_tensor_slice(ct_tensor_randn(dt, CT_SHAPE(B, H, T, 2 * D), 0, std), 3, 0, 2 * D, 2);
    return ct_tensor_randn(dt, CT_SHAPE(B, H, T, D), 0, std);
}

/* The reference forward into f64 outputs (so comparisons are not limited by rounding). */
static ct_tensor *ref_forward(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal,
                              double scale, ct_tensor **lse)
{
    ct_tensor *out = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(q->shape[0], q->shape[1], q->shape[2], v->shape[3]));
    ct_tensor *l = ct_tensor_empty(CT_DTYPE_F64, CT_SHAPE(q->shape[0], q->shape[1], q->shape[2]));
    cr_assert_eq(cti_cpu_attention_ref(q, k, v, causal, scale, out, l), CT_OK);
    if (lse) *lse = l;
    return out;
}

static void ref_backward(const ct_tensor *dout, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                         bool causal, double scale, ct_tensor **dq, ct_tensor **dk, ct_tensor **dv)
{
    *dq = ct_tensor_empty(CT_DTYPE_F64, q->ndim, q->shape);
    *dk = ct_tensor_empty(CT_DTYPE_F64, k->ndim, k->shape);
    *dv = ct_tensor_empty(CT_DTYPE_F64, v->ndim, v->shape);
    cr_assert_eq(cti_cpu_attention_backward_ref(dout, q, k, v, NULL, NULL, causal, scale, *dq, *dk, *dv), CT_OK);
}

Test(attention, ref_hand_case)
{
    /* T = S = 2, D = Dv = 1, scale 1: q = (1, 2), k = (1, -1), v = (2, 4).
     * row 0 scores (1, -1), row 1 scores (2, -2); causal row 0 sees key 0 only. */
    double qd[] = {1, 2}, kd[] = {1, -1}, vd[] = {2, 4};
    CT_FRAME {
        ct_tensor *q = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1, 1, 2, 1), qd);
        ct_tensor *k = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1, 1, 2, 1), kd);
        ct_tensor *v = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1, 1, 2, 1), vd);
        double p0 = exp(1) / (exp(1) + exp(-1)), p1 = exp(2) / (exp(2) + exp(-2));
        double want_out[2][2] = {{2 * p0 + 4 * (1 - p0), 2 * p1 + 4 * (1 - p1)}, {2, 2 * p1 + 4 * (1 - p1)}};
        double want_lse[2][2] = {{log(exp(1) + exp(-1)), log(exp(2) + exp(-2))}, {1, log(exp(2) + exp(-2))}};
        for (int causal = 0; causal < 2; causal++) {
            ct_tensor *lr, *lf;
            ct_tensor *r = ref_forward(q, k, v, causal, 0, &lr);
            ct_tensor *f = ct_kernel_attention(q, k, v, causal, 0, &lf);
            cr_assert_not_null(f, "%s", ct_last_error());
            for (int i = 0; i < 2; i++) {
                int64_t ix[4] = {0, 0, i, 0};
                cr_assert_float_eq(ct_tensor_get(r, ix), want_out[causal][i], 1e-14);
                cr_assert_float_eq(ct_tensor_get(f, ix), want_out[causal][i], 1e-14);
                cr_assert_float_eq(ct_tensor_get(lr, ix), want_lse[causal][i], 1e-14);
                cr_assert_float_eq(ct_tensor_get(lf, ix), want_lse[causal][i], 1e-14);
            }
        }
    }
}

/* fast vs ref on (B,H,T,D): out and lse, causal and not. */
static void check_forward(ct_dtype dt, int64_t B, int64_t H, int64_t T, int64_t S, int64_t D, int64_t Dv,
                          int layout, double tol)
{
    CT_FRAME {
        ct_tensor *q = make_bhtd(dt, B, H, T, D, layout, 1), *k = make_bhtd(dt, B, H, S, D, layout, 1);
        ct_tensor *v = make_bhtd(dt, B, H, S, Dv, layout == 2 ? 0 : layout, 1);
        for (int causal = 0; causal < 2; causal++) {
            ct_tensor *lf, *lr;
            ct_tensor *f = ct_kernel_attention(q, k, v, causal, 0, &lf);
            cr_assert_not_null(f, "%s", ct_last_error());
            ct_tensor *r = ref_forward(q, k, v, causal, 0, &lr);
            double e = rel_err(f, r), el = rel_err(lf, lr);
            cr_assert(e <= tol && el <= tol, "%s B=%ld H=%ld T=%ld S=%ld D=%ld Dv=%ld layout=%d causal=%d: out %.3g lse %.3g",
                      ct_dtype_name(dt), (long)B, (long)H, (long)T, (long)S, (long)D, (long)Dv, layout, causal, e, el);
        }
    }
}

Test(attention, forward_f32_matches_ref)
{
    ct_set_seed(1);
    const int64_t Ts[] = {1, 7, 65, 200}, Ds[] = {8, 64};
    const int64_t BH[][2] = {{1, 1}, {1, 2}, {2, 3}};
    int n = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 2; di++) {
            const int64_t *bh = BH[n++ % 3];
            check_forward(CT_DTYPE_F32, bh[0], bh[1], Ts[ti], Ts[ti], Ds[di], Ds[di], 0, 1e-6);
        }
    check_forward(CT_DTYPE_F32, 1, 2, 70, 70, 8, 24, 0, 1e-6);  /* Dv != D */
    check_forward(CT_DTYPE_F32, 1, 1, 33, 150, 16, 16, 0, 1e-6); /* S > T: causal offset S - T */
    check_forward(CT_DTYPE_F32, 2, 1, 130, 130, 128, 128, 0, 1e-6);
}

Test(attention, forward_strided_views)
{
    ct_set_seed(2);
    check_forward(CT_DTYPE_F32, 2, 3, 65, 65, 16, 16, 1, 1e-6); /* q,k,v transposed from (B,T,H,D) */
    check_forward(CT_DTYPE_F32, 1, 2, 40, 40, 8, 8, 2, 1e-6);   /* q,k with inner stride 2 */
    check_forward(CT_DTYPE_F64, 1, 3, 21, 21, 5, 5, 1, 1e-13);
}

Test(attention, forward_f64_and_bf16)
{
    ct_set_seed(3);
    check_forward(CT_DTYPE_F64, 1, 2, 65, 65, 8, 8, 0, 1e-13);
    check_forward(CT_DTYPE_F64, 2, 1, 7, 7, 64, 3, 0, 1e-13);
    /* bf16 inputs are exact in the reference; only the bf16 rounding of out differs */
    check_forward(CT_DTYPE_BF16, 2, 2, 65, 65, 64, 64, 1, 1e-2);
    check_forward(CT_DTYPE_F16, 1, 2, 30, 30, 8, 8, 0, 1e-2);
}

Test(attention, default_scale_is_rsqrt_d)
{
    ct_set_seed(4);
    CT_FRAME {
        ct_tensor *q = make_bhtd(CT_DTYPE_F32, 1, 2, 9, 16, 0, 1), *k = make_bhtd(CT_DTYPE_F32, 1, 2, 9, 16, 0, 1);
        ct_tensor *v = make_bhtd(CT_DTYPE_F32, 1, 2, 9, 16, 0, 1);
        ct_tensor *a = ct_kernel_attention(q, k, v, true, 0, NULL), *b = ct_kernel_attention(q, k, v, true, 0.25, NULL);
        ct_tensor *c = ct_kernel_attention(q, k, v, true, 0.5, NULL);
        cr_assert(same_bits(a, b));
        cr_assert(!same_bits(a, c));
        cr_assert(rel_err(c, ref_forward(q, k, v, true, 0.5, NULL)) <= 1e-6);
    }
}

/* Causal with T > S: query i sees keys j <= i + (S - T), so the first T - S rows see none. */
Test(attention, causal_rows_without_keys)
{
    ct_set_seed(5);
    CT_FRAME {
        ct_tensor *q = make_bhtd(CT_DTYPE_F64, 1, 1, 4, 3, 0, 1), *k = make_bhtd(CT_DTYPE_F64, 1, 1, 3, 3, 0, 1);
        ct_tensor *v = make_bhtd(CT_DTYPE_F64, 1, 1, 3, 2, 0, 1);
        ct_tensor *lse, *lr;
        ct_tensor *out = ct_kernel_attention(q, k, v, true, 0, &lse);
        ct_tensor *r = ref_forward(q, k, v, true, 0, &lr);
        cr_assert_eq(ct_tensor_get(out, (int64_t[]){0, 0, 0, 0}), 0.0);
        cr_assert(isinf(ct_tensor_get(lse, (int64_t[]){0, 0, 0})) && ct_tensor_get(lse, (int64_t[]){0, 0, 0}) < 0);
        cr_assert(isinf(ct_tensor_get(lr, (int64_t[]){0, 0, 0})));
        cr_assert(rel_err(out, r) <= 1e-14);
        /* row 3 sees keys 0..2: all of them */
        cr_assert_float_eq(ct_tensor_get(out, (int64_t[]){0, 0, 3, 1}),
                           ct_tensor_get(ct_kernel_attention(q, k, v, false, 0, NULL), (int64_t[]){0, 0, 3, 1}), 1e-15);
        ct_tensor *g = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(1, 1, 4, 2), 0, 1);
        ct_tensor *dq, *dk, *dv, *rq, *rk, *rv;
        cr_assert_eq(ct_kernel_attention_backward(g, q, k, v, out, lse, true, 0, &dq, &dk, &dv), CT_OK, "%s",
                     ct_last_error());
        ref_backward(g, q, k, v, true, 0, &rq, &rk, &rv);
        cr_assert(all_finite(dq) && all_finite(dk) && all_finite(dv));
        cr_assert(rel_err(dq, rq) <= 1e-13 && rel_err(dk, rk) <= 1e-13 && rel_err(dv, rv) <= 1e-13);
    }
}

/* L = sum(out * G); central differences of the reference forward in f64 against both backwards. */
static void check_fd(int64_t T, int64_t S, bool causal)
{
    const int64_t B = 1, H = 2, D = 3, Dv = 4;
    const double h = 1e-6;
    CT_FRAME {
        ct_tensor *q = make_bhtd(CT_DTYPE_F64, B, H, T, D, 0, 1), *k = make_bhtd(CT_DTYPE_F64, B, H, S, D, 0, 1);
        ct_tensor *v = make_bhtd(CT_DTYPE_F64, B, H, S, Dv, 0, 1);
        ct_tensor *G = ct_tensor_randn(CT_DTYPE_F64, CT_SHAPE(B, H, T, Dv), 0, 1);
        ct_tensor *lse, *out = ct_kernel_attention(q, k, v, causal, 0, &lse);
        ct_tensor *dq, *dk, *dv, *rq, *rk, *rv;
        cr_assert_eq(ct_kernel_attention_backward(G, q, k, v, out, lse, causal, 0, &dq, &dk, &dv), CT_OK);
        ref_backward(G, q, k, v, causal, 0, &rq, &rk, &rv);
        ct_tensor *in[3] = {q, k, v}, *fast[3] = {dq, dk, dv}, *ref[3] = {rq, rk, rv};
        for (int w = 0; w < 3; w++) {
            double *x = ct_tensor_data(in[w]);
            for (int64_t i = 0; i < ct_tensor_numel(in[w]); i++) {
                double x0 = x[i], lp = 0, lm = 0;
                CT_FRAME {
                    x[i] = x0 + h;
                    ct_tensor *op = ref_forward(q, k, v, causal, 0, NULL);
                    x[i] = x0 - h;
                    ct_tensor *om = ref_forward(q, k, v, causal, 0, NULL);
                    x[i] = x0;
                    const double *g = ct_tensor_data(G), *a = ct_tensor_data(op), *b = ct_tensor_data(om);
                    for (int64_t j = 0; j < ct_tensor_numel(G); j++) lp += g[j] * a[j], lm += g[j] * b[j];
                }
                double fd = (lp - lm) / (2 * h);
                double r = ((double *)ct_tensor_data(ref[w]))[i], f = ((double *)ct_tensor_data(fast[w]))[i];
                cr_assert(fabs(r - fd) <= 1e-7 * (1 + fabs(fd)), "ref grad %d[%ld]: %.12g vs fd %.12g", w, (long)i, r, fd);
                cr_assert(fabs(f - fd) <= 1e-7 * (1 + fabs(fd)), "fast grad %d[%ld]: %.12g vs fd %.12g", w, (long)i, f, fd);
            }
        }
    }
}

Test(attention, backward_finite_differences_f64)
{
    ct_set_seed(6);
    check_fd(5, 5, false);
    check_fd(5, 5, true);
    check_fd(3, 6, true); /* S > T */
}

static void check_backward(ct_dtype dt, int64_t B, int64_t H, int64_t T, int64_t D, int64_t Dv, int layout,
                           double tol)
{
    CT_FRAME {
        ct_tensor *q = make_bhtd(dt, B, H, T, D, layout, 1), *k = make_bhtd(dt, B, H, T, D, layout, 1);
        ct_tensor *v = make_bhtd(dt, B, H, T, Dv, layout, 1);
        ct_tensor *g = make_bhtd(dt, B, H, T, Dv, layout, 1);
        for (int causal = 0; causal < 2; causal++) {
            ct_tensor *lse, *out = ct_kernel_attention(q, k, v, causal, 0, &lse);
            ct_tensor *dq, *dk, *dv, *rq, *rk, *rv;
            cr_assert_eq(ct_kernel_attention_backward(g, q, k, v, out, lse, causal, 0, &dq, &dk, &dv), CT_OK, "%s",
                         ct_last_error());
            ref_backward(g, q, k, v, causal, 0, &rq, &rk, &rv);
            double e[3] = {rel_err(dq, rq), rel_err(dk, rk), rel_err(dv, rv)};
            cr_assert(e[0] <= tol && e[1] <= tol && e[2] <= tol,
                      "%s B=%ld H=%ld T=%ld D=%ld causal=%d: dq %.3g dk %.3g dv %.3g", ct_dtype_name(dt), (long)B,
                      (long)H, (long)T, (long)D, causal, e[0], e[1], e[2]);
            cr_assert_eq(dq->dtype, dt);
        }
    }
}

Test(attention, backward_matches_ref)
{
    ct_set_seed(7);
    check_backward(CT_DTYPE_F32, 1, 1, 1, 8, 8, 0, 1e-6);
    check_backward(CT_DTYPE_F32, 1, 2, 7, 64, 64, 0, 1e-6);
    check_backward(CT_DTYPE_F32, 2, 3, 65, 8, 8, 1, 1e-6);
    check_backward(CT_DTYPE_F32, 1, 2, 200, 64, 64, 0, 1e-6);
    check_backward(CT_DTYPE_F32, 1, 1, 70, 8, 24, 0, 1e-6);
    check_backward(CT_DTYPE_F64, 2, 1, 65, 16, 16, 1, 1e-13);
    /* bf16: the f32-computed gradients are rounded to bf16 once */
    check_backward(CT_DTYPE_BF16, 1, 2, 65, 64, 64, 1, 1e-2);
}

/* The backward splits work differently for 1 and 2 threads (heads vs blocks); both must
 * give the same bits, as must the forward. */
Test(attention, deterministic_across_thread_counts)
{
    ct_set_seed(8);
    CT_FRAME {
        ct_tensor *q = make_bhtd(CT_DTYPE_F32, 1, 3, 150, 32, 1, 1), *k = make_bhtd(CT_DTYPE_F32, 1, 3, 150, 32, 1, 1);
        ct_tensor *v = make_bhtd(CT_DTYPE_F32, 1, 3, 150, 32, 1, 1);
        ct_tensor *g = make_bhtd(CT_DTYPE_F32, 1, 3, 150, 32, 0, 1);
        ct_tensor *res[2][5];
        for (int run = 0; run < 2; run++) {
            ct_set_num_threads(run + 1);
            ct_tensor *lse, *out = ct_kernel_attention(q, k, v, true, 0, &lse);
            ct_tensor *dq, *dk, *dv;
            cr_assert_eq(ct_kernel_attention_backward(g, q, k, v, out, lse, true, 0, &dq, &dk, &dv), CT_OK);
            res[run][0] = out, res[run][1] = lse, res[run][2] = dq, res[run][3] = dk, res[run][4] = dv;
        }
        ct_set_num_threads(0);
        for (int i = 0; i < 5; i++) cr_assert(same_bits(res[0][i], res[1][i]), "result %d differs", i);
    }
}

Test(attention, extreme_scores_stay_finite)
{
    ct_set_seed(9);
    CT_FRAME {
        /* D = 1, |q|, |k| ~ 100: scores ~ 1e4 */
        ct_tensor *q = make_bhtd(CT_DTYPE_F32, 1, 2, 70, 1, 0, 100), *k = make_bhtd(CT_DTYPE_F32, 1, 2, 70, 1, 0, 100);
        ct_tensor *v = make_bhtd(CT_DTYPE_F32, 1, 2, 70, 4, 0, 1), *g = make_bhtd(CT_DTYPE_F32, 1, 2, 70, 4, 0, 1);
        for (int causal = 0; causal < 2; causal++) {
            ct_tensor *lse, *lr, *out = ct_kernel_attention(q, k, v, causal, 1, &lse);
            ct_tensor *r = ref_forward(q, k, v, causal, 1, &lr);
            cr_assert(all_finite(out) && all_finite(lse));
            /* f32 scores ~1e4 carry absolute errors ~1e-3, so probabilities agree to ~1e-3 */
            cr_assert(rel_err(out, r) <= 1e-2 && rel_err(lse, lr) <= 1e-6);
            ct_tensor *dq, *dk, *dv;
            cr_assert_eq(ct_kernel_attention_backward(g, q, k, v, out, lse, causal, 1, &dq, &dk, &dv), CT_OK);
            cr_assert(all_finite(dq) && all_finite(dk) && all_finite(dv));
        }
        ct_tensor *q64 = ct_tensor_cast(q, CT_DTYPE_F64), *k64 = ct_tensor_cast(k, CT_DTYPE_F64);
        ct_tensor *v64 = ct_tensor_cast(v, CT_DTYPE_F64);
        cr_assert(rel_err(ct_kernel_attention(q64, k64, v64, true, 1, NULL), ref_forward(q64, k64, v64, true, 1, NULL)) <=
                  1e-13);
    }
}

/* Memory is O((T + S) * D) per thread: the workspace never holds a T x S matrix. */
Test(attention, workspace_is_not_quadratic)
{
    size_t quad = (size_t)1024 * 1024 * 4;
    cr_assert_lt(cti_cpu_attention_workspace_bytes(1024, 1024, 64, 64, 4), quad);
    cr_assert_lt(cti_cpu_attention_workspace_bytes(1024, 1024, 128, 128, 8), 2 * quad);
    /* doubling S or T grows it by less than 2x (linear, with a constant part) */
    cr_assert_lt(cti_cpu_attention_workspace_bytes(1024, 8192, 64, 64, 4),
                 2 * cti_cpu_attention_workspace_bytes(1024, 4096, 64, 64, 4));
    cr_assert_lt(cti_cpu_attention_workspace_bytes(4096, 4096, 64, 64, 4),
                 2 * cti_cpu_attention_workspace_bytes(2048, 2048, 64, 64, 4));
    cr_assert_lt(cti_cpu_attention_workspace_bytes(8192, 8192, 64, 64, 4), (size_t)8192 * 8192 * 4 / 16);
}

Test(attention, errors_name_op_and_shapes)
{
    CT_FRAME {
        ct_tensor *q = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 5, 8));
        ct_tensor *k = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 6, 8));
        ct_tensor *v = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 6, 4));
        ct_tensor *bad_d = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 6, 7));
        ct_tensor *bad_s = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 5, 4));
        ct_tensor *three = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(3, 5, 8));
        ct_tensor *k64 = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2, 3, 6, 8));
        ct_tensor *qi = ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(2, 3, 5, 8));
        cr_assert_null(ct_kernel_attention(q, bad_d, v, true, 0, NULL));
        ERROR_HAS("attention", "[2, 3, 6, 7]");
        cr_assert_null(ct_kernel_attention(q, k, bad_s, true, 0, NULL));
        ERROR_HAS("attention", "[2, 3, 5, 4]");
        cr_assert_null(ct_kernel_attention(three, k, v, false, 0, NULL));
        ERROR_HAS("attention", "[3, 5, 8]");
        cr_assert_null(ct_kernel_attention(q, k64, v, false, 0, NULL));
        ERROR_HAS("attention", "f64[2, 3, 6, 8]");
        cr_assert_null(ct_kernel_attention(qi, qi, qi, false, 0, NULL));
        ERROR_HAS("attention", "i32");
        cr_assert_null(ct_kernel_attention(q, k, v, false, NAN, NULL));
        ERROR_HAS("attention", "scale");
        ct_error_clear();
        cr_assert_null(ct_kernel_attention(NULL, k, v, false, 0, NULL));

        ct_tensor *lse, *out = ct_kernel_attention(q, k, v, true, 0, &lse);
        cr_assert_not_null(out);
        ct_tensor *dq = NULL, *dk = NULL, *dv = NULL;
        cr_assert_neq(ct_kernel_attention_backward(q, q, k, v, out, lse, true, 0, &dq, &dk, &dv), CT_OK);
        ERROR_HAS("attention_backward", "[2, 3, 5, 8]");
        cr_assert_null(dq);
        cr_assert_neq(ct_kernel_attention_backward(out, q, k, v, out, three, true, 0, &dq, &dk, &dv), CT_OK);
        ERROR_HAS("attention_backward", "[3, 5, 8]");
        ct_tensor *lse_bf16 = ct_tensor_cast(lse, CT_DTYPE_BF16);
        cr_assert_neq(ct_kernel_attention_backward(out, q, k, v, out, lse_bf16, true, 0, &dq, &dk, &dv), CT_OK);
        ERROR_HAS("attention_backward", "bf16[2, 3, 5]");
        cr_assert_neq(ct_kernel_attention_backward(out, q, bad_d, v, out, lse, true, 0, &dq, &dk, &dv), CT_OK);
        ERROR_HAS("attention_backward", "[2, 3, 6, 7]");
        cr_assert_neq(ct_kernel_attention_backward(out, q, k, v, out, NULL, true, 0, &dq, &dk, &dv), CT_OK);
        cr_assert_neq(ct_kernel_attention_backward(out, q, k, v, out, lse, true, 0, NULL, &dk, &dv), CT_OK);
        cr_assert_null(dq);
    }
}

Test(attention, empty_sizes)
{
    CT_FRAME {
        ct_tensor *q0 = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2, 0, 8)), *k = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(1, 2, 5, 8));
        ct_tensor *lse, *out = ct_kernel_attention(q0, k, k, true, 0, &lse);
        cr_assert_not_null(out, "%s", ct_last_error());
        cr_assert_eq(ct_tensor_numel(out), 0);
        ct_tensor *dq, *dk, *dv;
        cr_assert_eq(ct_kernel_attention_backward(out, q0, k, k, out, lse, true, 0, &dq, &dk, &dv), CT_OK);
        cr_assert_eq(ct_tensor_get(dk, (int64_t[]){0, 1, 4, 7}), 0.0, "no query sees the keys: zero gradient");
        /* no keys: out = 0, lse = -inf, dq = 0 */
        ct_tensor *q = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(1, 2, 3, 8)), *k0 = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2, 0, 8));
        out = ct_kernel_attention(q, k0, k0, false, 0, &lse);
        cr_assert_not_null(out, "%s", ct_last_error());
        cr_assert_eq(ct_tensor_get(out, (int64_t[]){0, 1, 2, 7}), 0.0);
        cr_assert(isinf(ct_tensor_get(lse, (int64_t[]){0, 1, 2})));
        cr_assert_eq(ct_kernel_attention_backward(out, q, k0, k0, out, lse, false, 0, &dq, &dk, &dv), CT_OK);
        cr_assert_eq(ct_tensor_get(dq, (int64_t[]){0, 1, 2, 7}), 0.0);
    }
}

/* bf16 inputs through both CPU paths: the bf16 dot-product kernels (where the CPU has
 * AVX512-BF16; they round P and dS to bf16 before their products) and the widening
 * path every CPU has. Each against the f64 reference, on shapes that exercise the
 * tile edges: odd T, S > T, Dv != D, head dims that are not a multiple of 16, one
 * query, several heads (the backward runs head by head). Measured on Zen 4: relative
 * errors 1.4e-3 to 3.0e-3 widening (the final bf16 rounding), 1.5e-3 to 3.7e-3 dot;
 * a wrong pair or tile would be O(1). */
Test(attention, bf16_paths_match_ref)
{
    static const int64_t shapes[][6] = {
        /* B, H, T, S, D, Dv */
        {2, 2, 65, 65, 64, 64}, {1, 3, 130, 130, 32, 32}, {1, 1, 33, 150, 16, 16},
        {1, 2, 70, 70, 8, 24},  {2, 1, 7, 7, 10, 6},      {1, 2, 1, 1, 64, 64},
        {1, 1, 200, 200, 64, 64},
    };
    const bool dot_here = cti_cpu_attention_bf16_dot();
    ct_tensor *first_out[2] = {NULL, NULL}; /* shape 0's causal out on each path */
    for (int path = 0; path < 2; path++) {
        if (path == 0 && !dot_here) continue;
        cti_cpu_attention_set_bf16_dot(path == 0);
        ct_set_seed(40);
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            const int64_t *d = shapes[s];
            CT_FRAME {
                ct_tensor *q = make_bhtd(CT_DTYPE_BF16, d[0], d[1], d[2], d[4], 1, 1);
                ct_tensor *k = make_bhtd(CT_DTYPE_BF16, d[0], d[1], d[3], d[4], 1, 1);
                ct_tensor *v = make_bhtd(CT_DTYPE_BF16, d[0], d[1], d[3], d[5], 1, 1);
                ct_tensor *g = make_bhtd(CT_DTYPE_BF16, d[0], d[1], d[2], d[5], 1, 1);
                for (int causal = 0; causal < 2; causal++) {
                    ct_tensor *lse, *out = ct_kernel_attention(q, k, v, causal, 0, &lse), *lr;
                    cr_assert_not_null(out, "%s", ct_last_error());
                    if (s == 0 && causal) first_out[path] = ct_tensor_retain(out);
                    ct_tensor *ro = ref_forward(q, k, v, causal, 0, &lr);
                    ct_tensor *dq, *dk, *dv, *rq, *rk, *rv;
                    cr_assert_eq(ct_kernel_attention_backward(g, q, k, v, out, lse, causal, 0, &dq, &dk, &dv), CT_OK,
                                 "%s", ct_last_error());
                    ref_backward(g, q, k, v, causal, 0, &rq, &rk, &rv);
                    double e[5] = {rel_err(out, ro), rel_err(lse, lr), rel_err(dq, rq), rel_err(dk, rk),
                                   rel_err(dv, rv)};
                    for (int i = 0; i < 5; i++)
                        cr_assert(e[i] <= 5e-3, "%s path, B=%ld H=%ld T=%ld S=%ld D=%ld Dv=%ld causal=%d: error %d is %.3g",
                                  path == 0 ? "dot" : "widening", (long)d[0], (long)d[1], (long)d[2], (long)d[3],
                                  (long)d[4], (long)d[5], causal, i, e[i]);
                }
            }
        }
    }
    cti_cpu_attention_set_bf16_dot(true);
    if (dot_here) /* the switch really changes the path: P's rounding moves some outputs */
        cr_assert_neq(memcmp(ct_tensor_data(first_out[0]), ct_tensor_data(first_out[1]), ct_tensor_nbytes(first_out[0])),
                      0, "the dot and widening paths gave the same bits");
    ct_tensor_release(first_out[0]);
    ct_tensor_release(first_out[1]);
}

Test(attention, bf16_path_variable_is_checked)
{
    setenv("CTRAIN_BF16_ATTENTION", "fast", 1);
    CT_FRAME {
        ct_tensor *q = make_bhtd(CT_DTYPE_BF16, 1, 1, 4, 8, 0, 1);
        cr_assert_null(ct_kernel_attention(q, q, q, true, 0, NULL));
        ERROR_HAS("CTRAIN_BF16_ATTENTION='fast'", "expected dot or widen");
        ct_tensor *f = make_bhtd(CT_DTYPE_F32, 1, 1, 4, 8, 0, 1); /* other dtypes do not care */
        cr_assert_not_null(ct_kernel_attention(f, f, f, true, 0, NULL), "%s", ct_last_error());
    }
}
