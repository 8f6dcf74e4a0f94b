/* GPU conformance: embedding (kernels/cuda/embedding.cu) against the CPU kernels
 * (kernels/cpu/embedding.c): the gather bit for bit in every dtype, the backward
 * against the double reference and bit for bit against the CPU's fast kernel (both
 * add each row's dout rows in position order in the same accumulation type), with
 * heavily repeated ids, strided dweight and the out-of-range id error. */
#include "tests/gpu_conformance.h"

#include <string.h>

#include "kernels/cpu/embedding.h"
#ifdef CT_HAVE_CUDA
#include "kernels/cuda/embedding.h"
#endif

static const ct_dtype dtypes[4] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16};

/* The GPU's error message with every "cuda:0" read as "cpu" equals the CPU's. */
static void expect_same_error(const char *gpu_msg, const char *cpu_msg)
{
    char buf[1024];
    size_t o = 0;
    for (const char *p = gpu_msg; *p && o + 4 < sizeof buf;) {
        if (strncmp(p, "cuda:0", 6) == 0) {
            memcpy(buf + o, "cpu", 3), o += 3, p += 6;
        } else {
            buf[o++] = *p++;
        }
    }
    buf[o] = 0;
    cr_assert_str_eq(buf, cpu_msg, "GPU: %s\nCPU: %s", gpu_msg, cpu_msg);
}

/* ids of shape (ndim, shape) in [0, V), i64 or i32. */
static ct_tensor *make_ids(ct_dtype dt, int ndim, const int64_t *shape, int64_t V, uint64_t seed)
{
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_I64, ndim, shape);
    int64_t *p = ct_tensor_data(t);
    ct_rng r;
    ct_rng_init(&r, seed);
    for (int64_t i = 0; i < ct_tensor_numel(t); i++) p[i] = (int64_t)ct_rng_below(&r, (uint64_t)V);
    return dt == CT_DTYPE_I64 ? t : ct_tensor_cast(t, dt);
}

/* ids' shape + [C] */
static int out_shape(const ct_tensor *ids, int64_t C, int64_t *shape)
{
    for (int d = 0; d < ids->ndim; d++) shape[d] = ids->shape[d];
    shape[ids->ndim] = C;
    return ids->ndim + 1;
}

static void check_forward(ct_tensor *weight, ct_tensor *ids, const char *what)
{
    char msg[200];
    int64_t shape[CT_MAX_DIMS];
    int nd = out_shape(ids, weight->shape[1], shape);
    ct_tensor *ref = ct_tensor_empty(weight->dtype, nd, shape);
    cr_assert_eq(cti_cpu_embedding_ref(ct_tensor_contiguous(weight), ids, ref), CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s forward", what);
    gpu_expect_equal(ct_kernel_embedding(gpu_of(weight), gpu_of(ids)), ref, msg);
#ifdef CT_HAVE_CUDA
    ct_tensor *out = ct_tensor_empty_on(CT_CUDA(0), weight->dtype, nd, shape);
    cr_assert_eq(cti_cuda_embedding_ref(gpu_of(ct_tensor_contiguous(weight)), gpu_of(ids), out), CT_OK, "%s",
                 ct_last_error());
    snprintf(msg, sizeof msg, "%s forward (CUDA reference)", what);
    gpu_expect_equal(out, ref, msg);
#endif
}

/* dweight (V, C) of wdt starting from random values, dout of ddt, ids (n). The
 * tolerance against the double reference allows `steps` roundings: the fast kernels
 * (CPU and GPU alike) add up to n / V * (a few) terms per row in f32. */
static void check_backward(ct_dtype wdt, ct_dtype ddt, int64_t V, int64_t C, ct_tensor *ids, int steps, uint64_t seed,
                           const char *what)
{
    char msg[200];
    int64_t shape[CT_MAX_DIMS];
    int nd = out_shape(ids, C, shape);
    ct_tensor *dw0 = gpu_rand_cpu(wdt, 2, (int64_t[]){V, C}, seed, -1, 1);
    ct_tensor *dout = gpu_rand_cpu(ddt, nd, shape, seed + 1, -1, 1);
    ct_tensor *ref = ct_tensor_clone(dw0), *fast = ct_tensor_clone(dw0);
    cr_assert_eq(cti_cpu_embedding_backward_ref(ref, dout, ids), CT_OK, "%s", ct_last_error());
    cr_assert_eq(ct_kernel_embedding_backward(fast, dout, ids), CT_OK, "%s", ct_last_error());

    ct_tensor *g = gpu_of(dw0);
    cr_assert_eq(ct_kernel_embedding_backward(g, gpu_of(dout), gpu_of(ids)), CT_OK, "%s: %s", what, ct_last_error());
    snprintf(msg, sizeof msg, "%s backward", what);
    gpu_expect_close_tol(g, ref, gpu_tolerance_chain(wdt, steps), msg);
    snprintf(msg, sizeof msg, "%s backward, bit for bit against the CPU's kernel", what);
    gpu_expect_equal(g, fast, msg);
#ifdef CT_HAVE_CUDA
    ct_tensor *r = gpu_of(dw0);
    cr_assert_eq(cti_cuda_embedding_backward_ref(r, gpu_of(dout), gpu_of(ids)), CT_OK, "%s", ct_last_error());
    snprintf(msg, sizeof msg, "%s backward (CUDA reference)", what);
    gpu_expect_close(r, ref, msg);
#endif
}

Test(gpu_embedding, forward_every_dtype)
{
    GPU_REQUIRE();
    const ct_dtype all[] = {CT_DTYPE_F32,  CT_DTYPE_F64, CT_DTYPE_BF16, CT_DTYPE_F16, CT_DTYPE_F8_E4M3,
                            CT_DTYPE_I64, CT_DTYPE_I32, CT_DTYPE_U8};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        for (int i32 = 0; i32 < 2; i32++) CT_FRAME {
                char what[80];
                snprintf(what, sizeof what, "%s weight, %s ids", ct_dtype_name(all[k]), i32 ? "i32" : "i64");
                ct_tensor *w = gpu_rand_cpu(all[k], 2, (int64_t[]){37, 19}, 100 + k, -50, 50);
                check_forward(w, make_ids(i32 ? CT_DTYPE_I32 : CT_DTYPE_I64, 1, (int64_t[]){45}, 37, 110 + k), what);
                check_forward(w, make_ids(i32 ? CT_DTYPE_I32 : CT_DTYPE_I64, 2, (int64_t[]){3, 7}, 37, 120 + k), what);
            }
}

Test(gpu_embedding, forward_large_and_strided)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *w = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){1000, 257}, 200, -1, 1);
        check_forward(w, make_ids(CT_DTYPE_I64, 2, (int64_t[]){16, 128}, 1000, 201), "(16, 128) ids");
        /* a transposed table: the entry point makes it contiguous first */
        ct_tensor *base = gpu_rand_cpu(CT_DTYPE_BF16, 2, (int64_t[]){24, 50}, 202, -1, 1);
        ct_tensor *wt = ct_tensor_transpose(base, 0, 1);
        ct_tensor *ids = make_ids(CT_DTYPE_I64, 1, (int64_t[]){30}, 50, 203);
        ct_tensor *ref = ct_tensor_empty(CT_DTYPE_BF16, 2, (int64_t[]){30, 24});
        cr_assert_eq(cti_cpu_embedding_ref(ct_tensor_contiguous(wt), ids, ref), CT_OK, "%s", ct_last_error());
        gpu_expect_equal(ct_kernel_embedding(ct_tensor_transpose(gpu_of(base), 0, 1), gpu_of(ids)), ref,
                         "transposed table");
    }
}

Test(gpu_embedding, backward_every_dtype)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++)
        for (int i32 = 0; i32 < 2; i32++) CT_FRAME {
                char what[80];
                snprintf(what, sizeof what, "%s, %s ids", ct_dtype_name(dtypes[k]), i32 ? "i32" : "i64");
                ct_tensor *ids = make_ids(i32 ? CT_DTYPE_I32 : CT_DTYPE_I64, 2, (int64_t[]){4, 9}, 23, 300 + k);
                check_backward(dtypes[k], dtypes[k], 23, 33, ids, 1, 310 + 10 * k + i32, what);
            }
}

Test(gpu_embedding, backward_mixed_dtypes)
{
    GPU_REQUIRE();
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            if (a == b) continue;
            CT_FRAME {
                char what[80];
                snprintf(what, sizeof what, "dweight %s, dout %s", ct_dtype_name(dtypes[a]), ct_dtype_name(dtypes[b]));
                ct_tensor *ids = make_ids(CT_DTYPE_I64, 1, (int64_t[]){40}, 11, 400 + 4 * a + b);
                check_backward(dtypes[a], dtypes[b], 11, 17, ids, 1, 410 + 4 * a + b, what);
            }
        }
}

Test(gpu_embedding, backward_repeated_ids_many_tiles)
{
    GPU_REQUIRE();
    for (int k = 0; k < 4; k++) CT_FRAME {
            /* 5000 positions over 50 ids: about 100 dout rows per dweight row, several
             * placement tiles; 4 roundings of slack for the f32 sums of ~100 terms */
            char what[80];
            snprintf(what, sizeof what, "%s, 5000 ids over 50 rows", ct_dtype_name(dtypes[k]));
            ct_tensor *ids = make_ids(CT_DTYPE_I64, 1, (int64_t[]){5000}, 50, 500 + k);
            check_backward(dtypes[k], dtypes[k], 50, 70, ids, 4, 510 + k, what);
        }
    CT_FRAME {
        /* one id everywhere, and a table much larger than the ids used */
        int64_t same[3000];
        for (int i = 0; i < 3000; i++) same[i] = 7;
        ct_tensor *ids = ct_tensor_from_data(CT_DTYPE_I64, 1, (int64_t[]){3000}, same);
        check_backward(CT_DTYPE_F64, CT_DTYPE_F64, 9, 40, ids, 1, 520, "f64, one id 3000 times");
        check_backward(CT_DTYPE_F32, CT_DTYPE_F32, 5000, 8, make_ids(CT_DTYPE_I32, 1, (int64_t[]){64}, 5000, 521), 1,
                       522, "f32, 64 ids of 5000 rows");
    }
}

Test(gpu_embedding, backward_strided_dweight_and_no_ids)
{
    GPU_REQUIRE();
    CT_FRAME {
        /* dweight the transpose of a (C, V) tensor: the entry point accumulates in a
         * contiguous copy and writes it back */
        const int64_t V = 13, C = 6;
        ct_tensor *base = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){C, V}, 600, -1, 1);
        ct_tensor *ids = make_ids(CT_DTYPE_I64, 1, (int64_t[]){50}, V, 601);
        ct_tensor *dout = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){50, C}, 602, -1, 1);
        ct_tensor *ref = ct_tensor_contiguous(ct_tensor_transpose(ct_tensor_clone(base), 0, 1));
        cr_assert_eq(cti_cpu_embedding_backward_ref(ref, dout, ids), CT_OK, "%s", ct_last_error());
        ct_tensor *gbase = gpu_of(base);
        cr_assert_eq(ct_kernel_embedding_backward(ct_tensor_transpose(gbase, 0, 1), gpu_of(dout), gpu_of(ids)), CT_OK,
                     "%s", ct_last_error());
        gpu_expect_close(ct_tensor_contiguous(ct_tensor_transpose(gbase, 0, 1)), ref, "strided dweight");
        /* no ids: dweight unchanged */
        ct_tensor *g = gpu_of(base);
        ct_tensor *none = ct_tensor_empty(CT_DTYPE_I64, 1, (int64_t[]){0});
        cr_assert_eq(ct_kernel_embedding_backward(g, gpu_of(ct_tensor_empty(CT_DTYPE_F32, 2, (int64_t[]){0, V})),
                                                  gpu_of(none)),
                     CT_OK, "%s", ct_last_error());
        gpu_expect_equal(g, base, "no ids");
    }
}

Test(gpu_embedding, id_out_of_range)
{
    GPU_REQUIRE();
    CT_FRAME {
        int64_t idv[5] = {0, 3, 1, 12, 2};
        ct_tensor *ids = gpu_of(ct_tensor_from_data(CT_DTYPE_I64, 1, (int64_t[]){5}, idv));
        ct_tensor *w0 = gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){10, 4}, 700, -1, 1);
        cr_assert_null(ct_kernel_embedding(gpu_of(w0), ids));
        cr_assert(strstr(ct_last_error(), "embedding: id 12 at position [3] of ids") &&
                      strstr(ct_last_error(), "V = 10 rows of weight"),
                  "%s", ct_last_error());
        char gpu_msg[1024];
        snprintf(gpu_msg, sizeof gpu_msg, "%s", ct_last_error());
        cr_assert_null(ct_kernel_embedding(w0, ct_tensor_from_data(CT_DTYPE_I64, 1, (int64_t[]){5}, idv)));
        expect_same_error(gpu_msg, ct_last_error());
        /* the backward fails before writing: dweight keeps its values */
        ct_tensor *g = gpu_of(w0);
        ct_tensor *dout = gpu_of(gpu_rand_cpu(CT_DTYPE_F32, 2, (int64_t[]){5, 4}, 701, -1, 1));
        cr_assert_neq(ct_kernel_embedding_backward(g, dout, ids), CT_OK);
        cr_assert(strstr(ct_last_error(), "embedding_backward: id 12 at position [3]"), "%s", ct_last_error());
        gpu_expect_equal(g, w0, "dweight after a failed backward");
        int32_t neg[2] = {1, -1};
        ct_tensor *nids = gpu_of(ct_tensor_from_data(CT_DTYPE_I32, 1, (int64_t[]){2}, neg));
        cr_assert_null(ct_kernel_embedding(gpu_of(w0), nids));
        cr_assert(strstr(ct_last_error(), "id -1 at position [1]"), "%s", ct_last_error());
    }
}

Test(gpu_embedding, mixed_devices)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *w = gpu_of(ct_tensor_zeros(CT_DTYPE_F32, 2, (int64_t[]){4, 3}));
        ct_tensor *ids = ct_tensor_zeros(CT_DTYPE_I64, 1, (int64_t[]){2});
        cr_assert_null(ct_kernel_embedding(w, ids));
        cr_assert(strstr(ct_last_error(), "cuda:0") && strstr(ct_last_error(), "cpu"), "%s", ct_last_error());
    }
}
