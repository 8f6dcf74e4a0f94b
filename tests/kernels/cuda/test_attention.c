/* GPU conformance tests for attention (kernels/attention.c on cuda:0: the tiled kernels
 * of kernels/cuda/attention_fwd.cu and attention_bwd.cu, and the plain CUDA reference
 * kernels of attention_ref.cu; bf16 and f16 forwards run on tensor cores in
 * attention_fwd_tc.cu), each against the CPU's double reference kernels
 * (cti_cpu_attention_ref, cti_cpu_attention_backward_ref) on the same inputs.
 *
 * Shapes: sequence lengths that are not multiples of the 64-row tiles (1, 7, 63, 65,
 * 130, 257, and 1024 for many tiles), head dims 8, 31, 64, 80, 128 (and one past 128),
 * several heads and batches, S != T both ways under the causal mask, Dv != D, strided
 * views, empty sizes. */
#include <string.h>

#include "kernels/cpu/attention.h"
#include "tests/gpu_conformance.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/attention.h"
#endif

/* The backward's bound for f32, bf16 and f16: two roundings of the result dtype. The
 * fast kernels take rowsum(dO * O) from the forward's out, already rounded to the
 * dtype (and for bf16/f16 made on tensor cores from P rounded to the dtype), and
 * recompute P from the forward's f32 lse, then round the gradient; the reference
 * recomputes the softmax in double from q, k, v and rounds once. (f32 also sums up to
 * 1024 products per element in f32.) */
static gpu_tolerance bwd_tol(ct_dtype dt) { return dt == CT_DTYPE_F64 ? gpu_tolerance_of(dt) : gpu_tolerance_chain(dt, 2); }

static ct_dtype stat_dtype(ct_dtype dt) { return dt == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32; }

typedef struct attn_case {
    ct_dtype dt;
    int64_t B, H, T, S, D, Dv;
    bool causal;
    double scale; /* 0: 1/sqrt(D) */
    bool backward;
} attn_case;

/* A random (B,H,n,d) input in [-1, 1). */
static ct_tensor *rand_bhtd(ct_dtype dt, int64_t B, int64_t H, int64_t n, int64_t d, uint64_t seed)
{
    return gpu_rand_cpu(dt, 4, (const int64_t[]){B, H, n, d}, seed, -1, 1);
}

static void describe(const attn_case *c, const char *what, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s %s B=%lld H=%lld T=%lld S=%lld D=%lld Dv=%lld causal=%d scale=%g", what,
             ct_dtype_name(c->dt), (long long)c->B, (long long)c->H, (long long)c->T, (long long)c->S,
             (long long)c->D, (long long)c->Dv, c->causal, c->scale);
}

/* Forward (and backward) of one case: the GPU entry point and the CUDA reference, each
 * against the CPU reference. */
static void check_case(const attn_case *c, uint64_t seed)
{
    char what[256];
    const ct_dtype dt = c->dt, sdt = stat_dtype(dt);
    const int64_t oshape[4] = {c->B, c->H, c->T, c->Dv}, lshape[3] = {c->B, c->H, c->T};
    CT_FRAME {
        ct_tensor *q = rand_bhtd(dt, c->B, c->H, c->T, c->D, seed);
        ct_tensor *k = rand_bhtd(dt, c->B, c->H, c->S, c->D, seed + 1);
        ct_tensor *v = rand_bhtd(dt, c->B, c->H, c->S, c->Dv, seed + 2);
        cr_assert(q && k && v, "%s", ct_last_error());
        ct_tensor *out_ref = ct_tensor_empty(dt, 4, oshape), *lse_ref = ct_tensor_empty(sdt, 3, lshape);
        cr_assert_eq(cti_cpu_attention_ref(q, k, v, c->causal, c->scale, out_ref, lse_ref), CT_OK, "%s",
                     ct_last_error());
        ct_tensor *gq = gpu_of(q), *gk = gpu_of(k), *gv = gpu_of(v);
        cr_assert(gq && gk && gv, "%s", ct_last_error());

        ct_tensor *glse = NULL, *gout = ct_kernel_attention(gq, gk, gv, c->causal, c->scale, &glse);
        describe(c, "out", what, sizeof what);
        gpu_expect_close(gout, out_ref, what);
        describe(c, "lse", what, sizeof what);
        gpu_expect_close(glse, lse_ref, what);
#ifdef CT_HAVE_CUDA
        ct_tensor *rout = ct_tensor_empty_on(CT_CUDA(0), dt, 4, oshape), *rlse = ct_tensor_empty_on(CT_CUDA(0), sdt, 3, lshape);
        cr_assert_eq(cti_cuda_attention_ref(gq, gk, gv, c->causal, c->scale, rout, rlse), CT_OK, "%s", ct_last_error());
        describe(c, "out (CUDA reference)", what, sizeof what);
        gpu_expect_close(rout, out_ref, what);
        describe(c, "lse (CUDA reference)", what, sizeof what);
        gpu_expect_close(rlse, lse_ref, what);
#endif
        if (c->backward) {
            ct_tensor *g = rand_bhtd(dt, c->B, c->H, c->T, c->Dv, seed + 3);
            ct_tensor *rq = ct_tensor_empty(dt, 4, q->shape), *rk = ct_tensor_empty(dt, 4, k->shape);
            ct_tensor *rv = ct_tensor_empty(dt, 4, v->shape);
            cr_assert_eq(cti_cpu_attention_backward_ref(g, q, k, v, NULL, NULL, c->causal, c->scale, rq, rk, rv), CT_OK,
                         "%s", ct_last_error());
            ct_tensor *gg = gpu_of(g), *dq = NULL, *dk = NULL, *dv = NULL;
            cr_assert_eq(ct_kernel_attention_backward(gg, gq, gk, gv, gout, glse, c->causal, c->scale, &dq, &dk, &dv),
                         CT_OK, "%s", ct_last_error());
            const gpu_tolerance tol = bwd_tol(dt);
            describe(c, "dq", what, sizeof what);
            gpu_expect_close_tol(dq, rq, tol, what);
            describe(c, "dk", what, sizeof what);
            gpu_expect_close_tol(dk, rk, tol, what);
            describe(c, "dv", what, sizeof what);
            gpu_expect_close_tol(dv, rv, tol, what);
#ifdef CT_HAVE_CUDA
            /* the CUDA reference recomputes the softmax in double and rounds once, like the
             * CPU one: the dtype's own tolerance */
            ct_tensor *eq = ct_tensor_empty_on(CT_CUDA(0), dt, 4, q->shape);
            ct_tensor *ek = ct_tensor_empty_on(CT_CUDA(0), dt, 4, k->shape);
            ct_tensor *ev = ct_tensor_empty_on(CT_CUDA(0), dt, 4, v->shape);
            cr_assert_eq(cti_cuda_attention_backward_ref(gg, gq, gk, gv, gout, glse, c->causal, c->scale, eq, ek, ev),
                         CT_OK, "%s", ct_last_error());
            describe(c, "dq (CUDA reference)", what, sizeof what);
            gpu_expect_close(eq, rq, what);
            describe(c, "dk (CUDA reference)", what, sizeof what);
            gpu_expect_close(ek, rk, what);
            describe(c, "dv (CUDA reference)", what, sizeof what);
            gpu_expect_close(ev, rv, what);
#endif
        }
    }
}

/* T in {1, 7, 63, 65, 130, 257} against D in {8, 31, 64, 80, 128} (every T meets
 * several D over the dtypes), B*H > 1, causal and not. */
static void check_shapes(ct_dtype dt, bool backward, uint64_t seed)
{
    static const int64_t Ts[] = {1, 7, 63, 65, 130, 257}, Ds[] = {8, 31, 64, 80, 128};
    static const int64_t BH[][2] = {{2, 3}, {1, 2}, {3, 1}};
    int n = 0;
    for (int ti = 0; ti < 6; ti++)
        for (int di = 0; di < 5; di++) {
            /* the long rows with the wide heads only once each, to keep the CPU reference quick */
            if (Ts[ti] >= 130 && (di + ti) % 2) continue;
            const int64_t *bh = BH[n % 3];
            for (int causal = 0; causal < 2; causal++) {
                attn_case c = {dt, bh[0], bh[1], Ts[ti], Ts[ti], Ds[di], Ds[di], causal, 0, backward};
                check_case(&c, seed + 10 * (uint64_t)n);
            }
            n++;
        }
}

Test(gpu_attention, f32_forward_shapes)
{
    GPU_REQUIRE();
    check_shapes(CT_DTYPE_F32, false, 100);
}

Test(gpu_attention, f32_backward_shapes)
{
    GPU_REQUIRE();
    check_shapes(CT_DTYPE_F32, true, 200);
}

Test(gpu_attention, bf16_forward_backward_shapes)
{
    GPU_REQUIRE();
    check_shapes(CT_DTYPE_BF16, true, 300);
}

Test(gpu_attention, f16_forward_backward_shapes)
{
    GPU_REQUIRE();
    check_shapes(CT_DTYPE_F16, true, 400);
}

/* f64 runs smaller tiles (32 x 32) than the other dtypes: lengths around them too. */
Test(gpu_attention, f64_forward_backward)
{
    GPU_REQUIRE();
    static const int64_t shapes[][6] = {
        /* B, H, T, S, D, Dv */
        {2, 2, 1, 1, 8, 8}, {1, 3, 31, 31, 31, 31}, {2, 1, 33, 33, 64, 64}, {1, 2, 65, 65, 80, 80},
        {1, 1, 130, 130, 128, 128}, {1, 2, 40, 97, 16, 24}, {1, 1, 90, 30, 8, 8},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t *d = shapes[s];
            attn_case c = {CT_DTYPE_F64, d[0], d[1], d[2], d[3], d[4], d[5], causal, 0, true};
            check_case(&c, 500 + 10 * s);
        }
}

/* T = S = 1024: 16 query tiles and 16 key tiles per head, the causal diagonal in each. */
Test(gpu_attention, long_sequence_many_tiles)
{
    GPU_REQUIRE();
    const ct_dtype dts[] = {CT_DTYPE_F32, CT_DTYPE_BF16};
    for (int i = 0; i < 2; i++)
        for (int causal = 0; causal < 2; causal++) {
            attn_case c = {dts[i], 1, 2, 1024, 1024, 64, 64, causal, 0, true};
            check_case(&c, 600 + 10 * (uint64_t)i);
        }
}

/* S > T (the causal diagonal shifted by S - T), T > S (the first T - S rows see no key:
 * out 0, lse -inf, dq 0), Dv != D, an explicit scale, head dims past 128 (the plain
 * kernels take them), in every dtype. */
Test(gpu_attention, uneven_shapes_all_dtypes)
{
    GPU_REQUIRE();
    static const int64_t shapes[][6] = {
        /* B, H, T, S, D, Dv */
        {1, 2, 33, 150, 16, 16}, {2, 1, 70, 20, 8, 8}, {1, 2, 65, 130, 31, 80},
        {1, 1, 7, 200, 128, 5},  {2, 1, 20, 9, 160, 136},
    };
    const ct_dtype dts[] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};
    for (int t = 0; t < 4; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int causal = 0; causal < 2; causal++) {
                const int64_t *d = shapes[s];
                attn_case c = {dts[t], d[0], d[1], d[2], d[3], d[4], d[5], causal, s == 2 ? 0.3 : 0, true};
                check_case(&c, 700 + 100 * (uint64_t)t + 10 * s);
            }
}

/* q, k, v, dout as the transposed (B,T,H,D) views the GPT hands over, out and the
 * gradients written into views of larger buffers (the _into entry points). */
Test(gpu_attention, strided_views)
{
    GPU_REQUIRE();
    const int64_t B = 2, H = 3, T = 70, D = 24;
    const ct_dtype dts[] = {CT_DTYPE_F32, CT_DTYPE_BF16};
    for (int t = 0; t < 2; t++)
        for (int causal = 0; causal < 2; causal++)
            CT_FRAME {
                const ct_dtype dt = dts[t];
                ct_tensor *in[4], *gin[4];
                for (int i = 0; i < 4; i++) {
                    /* (B,T,H,D) made on the CPU, moved, and viewed as (B,H,T,D) on each side */
                    ct_tensor *btd = gpu_rand_cpu(dt, 4, (const int64_t[]){B, T, H, D}, 800 + 10 * (uint64_t)t + i, -1, 1);
                    cr_assert_not_null(btd, "%s", ct_last_error());
                    ct_tensor *g = gpu_of(btd);
                    cr_assert_not_null(g, "%s", ct_last_error());
                    in[i] = ct_tensor_transpose(btd, 1, 2), gin[i] = ct_tensor_transpose(g, 1, 2);
                    cr_assert(in[i] && gin[i], "%s", ct_last_error());
                }
                const int64_t oshape[4] = {B, H, T, D}, lshape[3] = {B, H, T};
                ct_tensor *out_ref = ct_tensor_empty(dt, 4, oshape), *lse_ref = ct_tensor_empty(CT_DTYPE_F32, 3, lshape);
                cr_assert_eq(cti_cpu_attention_ref(in[0], in[1], in[2], causal, 0, out_ref, lse_ref), CT_OK);
                /* out into every other column of a (B,H,T,2D) buffer, lse into a (B,T,H) transposed */
                ct_tensor *obuf = ct_tensor_empty_on(CT_CUDA(0), dt, 4, (const int64_t[]){B, H, T, 2 * D});
                ct_tensor *lbuf = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_F32, 3, (const int64_t[]){B, T, H});
                cr_assert(obuf && lbuf, "%s", ct_last_error());
                ct_tensor *gout = ct_tensor_slice(obuf, 3, 1, 2 * D, 2), *glse = ct_tensor_transpose(lbuf, 1, 2);
                cr_assert_eq(ct_kernel_attention_into(gin[0], gin[1], gin[2], causal, 0, gout, glse), CT_OK, "%s",
                             ct_last_error());
                gpu_expect_close(gout, out_ref, "strided out");
                gpu_expect_close(glse, lse_ref, "strided lse");

                ct_tensor *rq = ct_tensor_empty(dt, 4, oshape), *rk = ct_tensor_empty(dt, 4, oshape);
                ct_tensor *rv = ct_tensor_empty(dt, 4, oshape);
                cr_assert_eq(cti_cpu_attention_backward_ref(in[3], in[0], in[1], in[2], NULL, NULL, causal, 0, rq, rk, rv),
                             CT_OK);
                /* dq, dk, dv: the three column blocks of one (B,T,H,3D) gradient, viewed (B,H,T,D) */
                ct_tensor *gbuf = ct_tensor_empty_on(CT_CUDA(0), dt, 4, (const int64_t[]){B, T, H, 3 * D});
                cr_assert_not_null(gbuf, "%s", ct_last_error());
                ct_tensor *gd[3];
                for (int i = 0; i < 3; i++) gd[i] = ct_tensor_transpose(ct_tensor_slice(gbuf, 3, i * D, (i + 1) * D, 1), 1, 2);
                cr_assert_eq(ct_kernel_attention_backward_into(gin[3], gin[0], gin[1], gin[2], gout, glse, causal, 0,
                                                               gd[0], gd[1], gd[2]),
                             CT_OK, "%s", ct_last_error());
                gpu_expect_close_tol(gd[0], rq, bwd_tol(dt), "strided dq");
                gpu_expect_close_tol(gd[1], rk, bwd_tol(dt), "strided dk");
                gpu_expect_close_tol(gd[2], rv, bwd_tol(dt), "strided dv");
            }
}

/* No atomics: two runs give the same bits. */
Test(gpu_attention, backward_is_deterministic)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *q = gpu_of(rand_bhtd(CT_DTYPE_F32, 2, 2, 300, 64, 900)), *k = gpu_of(rand_bhtd(CT_DTYPE_F32, 2, 2, 300, 64, 901));
        ct_tensor *v = gpu_of(rand_bhtd(CT_DTYPE_F32, 2, 2, 300, 64, 902)), *g = gpu_of(rand_bhtd(CT_DTYPE_F32, 2, 2, 300, 64, 903));
        cr_assert(q && k && v && g, "%s", ct_last_error());
        ct_tensor *res[2][5];
        for (int run = 0; run < 2; run++) {
            ct_tensor *lse = NULL, *out = ct_kernel_attention(q, k, v, true, 0, &lse), *dq, *dk, *dv;
            cr_assert_not_null(out, "%s", ct_last_error());
            cr_assert_eq(ct_kernel_attention_backward(g, q, k, v, out, lse, true, 0, &dq, &dk, &dv), CT_OK, "%s",
                         ct_last_error());
            res[run][0] = ct_tensor_to(out, CT_CPU), res[run][1] = ct_tensor_to(lse, CT_CPU);
            res[run][2] = ct_tensor_to(dq, CT_CPU), res[run][3] = ct_tensor_to(dk, CT_CPU);
            res[run][4] = ct_tensor_to(dv, CT_CPU);
        }
        static const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
        for (int i = 0; i < 5; i++) gpu_expect_equal(res[1][i], res[0][i], names[i]);
    }
}

/* T = 0: nothing to compute, dk = dv = 0; S = 0: out = 0, lse = -inf, dq = 0. */
Test(gpu_attention, empty_sizes)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *q0 = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_F32, CT_SHAPE(1, 2, 0, 8));
        ct_tensor *k = gpu_of(ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(1, 2, 5, 8)));
        cr_assert(q0 && k, "%s", ct_last_error());
        ct_tensor *lse = NULL, *out = ct_kernel_attention(q0, k, k, true, 0, &lse);
        cr_assert_not_null(out, "%s", ct_last_error());
        cr_assert_eq(ct_tensor_numel(out), 0);
        ct_tensor *dq, *dk, *dv;
        cr_assert_eq(ct_kernel_attention_backward(out, q0, k, k, out, lse, true, 0, &dq, &dk, &dv), CT_OK, "%s",
                     ct_last_error());
        gpu_expect_equal(dk, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2, 5, 8)), "dk with no query");
        gpu_expect_equal(dv, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2, 5, 8)), "dv with no query");

        ct_tensor *q = gpu_of(ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(1, 2, 3, 8)));
        ct_tensor *k0 = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_F32, CT_SHAPE(1, 2, 0, 8));
        cr_assert(q && k0, "%s", ct_last_error());
        out = ct_kernel_attention(q, k0, k0, false, 0, &lse);
        cr_assert_not_null(out, "%s", ct_last_error());
        gpu_expect_equal(out, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2, 3, 8)), "out with no key");
        ct_tensor *lse_cpu = ct_tensor_to(lse, CT_CPU);
        cr_assert_not_null(lse_cpu, "%s", ct_last_error());
        for (int64_t i = 0; i < 6; i++) {
            const float l = ((const float *)ct_tensor_data(lse_cpu))[i];
            cr_assert(isinf(l) && l < 0, "lse[%lld] = %g with no key", (long long)i, l);
        }
        cr_assert_eq(ct_kernel_attention_backward(out, q, k0, k0, out, lse, false, 0, &dq, &dk, &dv), CT_OK, "%s",
                     ct_last_error());
        gpu_expect_equal(dq, ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1, 2, 3, 8)), "dq with no key");
    }
}

static void expect_error_has(const char *a, const char *b, const char *c)
{
    const char *msg = ct_last_error();
    cr_assert(strstr(msg, a) && strstr(msg, b) && (!c || strstr(msg, c)), "message \"%s\" lacks \"%s\", \"%s\"%s%s", msg,
              a, b, c ? " or " : "", c ? c : "");
}

/* GPU tensors get the CPU's argument errors; a CPU tensor among GPU ones is an error
 * naming both devices. */
Test(gpu_attention, errors_name_op_shapes_and_devices)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *q = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 5, 8)));
        ct_tensor *k = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 6, 8)));
        ct_tensor *v = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 6, 4)));
        ct_tensor *bad_d = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 6, 7)));
        ct_tensor *k64 = gpu_of(ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2, 3, 6, 8)));
        ct_tensor *k_cpu = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 3, 6, 8));
        cr_assert(q && k && v && bad_d && k64, "%s", ct_last_error());
        cr_assert_null(ct_kernel_attention(q, bad_d, v, true, 0, NULL));
        expect_error_has("attention", "[2, 3, 6, 7]", "cuda:0");
        cr_assert_null(ct_kernel_attention(q, k64, v, false, 0, NULL));
        expect_error_has("attention", "f64[2, 3, 6, 8]", NULL);
        cr_assert_null(ct_kernel_attention(q, k, v, false, NAN, NULL));
        expect_error_has("attention", "scale", NULL);
        cr_assert_null(ct_kernel_attention(q, k_cpu, v, false, 0, NULL));
        expect_error_has("attention", "cpu", "cuda:0");

        ct_tensor *lse = NULL, *out = ct_kernel_attention(q, k, v, true, 0, &lse);
        cr_assert_not_null(out, "%s", ct_last_error());
        ct_tensor *dq = NULL, *dk = NULL, *dv = NULL;
        cr_assert_neq(ct_kernel_attention_backward(q, q, k, v, out, lse, true, 0, &dq, &dk, &dv), CT_OK);
        expect_error_has("attention_backward", "[2, 3, 5, 8]", NULL);
        cr_assert_null(dq);
        ct_tensor *lse_cpu = ct_tensor_to(lse, CT_CPU);
        cr_assert_neq(ct_kernel_attention_backward(out, q, k, v, out, lse_cpu, true, 0, &dq, &dk, &dv), CT_OK);
        expect_error_has("attention_backward", "cpu", "cuda:0");
        /* a result on the wrong device */
        ct_tensor *out_cpu = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(2, 3, 5, 4));
        cr_assert_neq(ct_kernel_attention_into(q, k, v, true, 0, out_cpu, NULL), CT_OK);
        expect_error_has("attention", "out", "cpu");
    }
}
