/* Matmul benchmark: ctrain's matmul next to the libraries it dispatches to, on the
 * same buffers, in one run.
 *
 *   f32 rows:  ct_kernel_matmul (allocates its output), ct_kernel_matmul_out (into a
 *              preallocated out), cblas_sgemm (OpenBLAS), dnnl_sgemm (oneDNN)
 *   bf16 rows: ct_kernel_matmul bf16, the oneDNN bf16 matmul primitive called
 *              directly (n/a where oneDNN has no bf16 kernel for the CPU), and
 *              convert + sgemm + round written out by hand
 * n x n x n GEMMs, n = 1024 and 2048 (or the sizes given as arguments), 1 and 2
 * threads. Each row: one warm-up call per method, then REPS rounds that call every
 * method once in turn (so a noisy neighbour hits all columns alike); the median
 * time gives GFLOP/s = 2 n^3 / t. "overhead" compares ct_kernel_matmul (which
 * allocates its output every call) with the library called directly. ctrain runs OpenBLAS single-threaded on row
 * panels split across its own OpenMP threads (kernels/cpu/matmul.c says why);
 * the direct cblas_sgemm column uses OpenBLAS's own threads. Prints a markdown table. */
#include <cblas.h>
#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/timing.h"
#include "core/convert.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"

#define REPS 15
#define MAX_METHODS 4

typedef struct bench_ctx {
    int64_t n;
    int threads;
    ct_tensor *a, *b, *c;             /* f32 */
    ct_tensor *ah, *bh, *ch;          /* bf16 */
    float *a32, *b32, *c32;           /* hand conversion buffers */
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t bf16_prim;       /* NULL: oneDNN has no bf16 matmul here */
    dnnl_memory_t bf16_mem[3];
    int failed;
} bench_ctx;

/* ---- the methods; each runs one n x n x n product ---------------------------- */

static void run_ct_matmul(bench_ctx *x)
{
    CT_FRAME {
        if (!ct_kernel_matmul(x->a, x->b, false, false)) x->failed = 1;
    }
}
static void run_ct_matmul_out(bench_ctx *x)
{
    x->failed |= ct_kernel_matmul_out(x->c, x->a, x->b, false, false, 1, 0) != CT_OK;
}
static void run_cblas(bench_ctx *x)
{
    int n = (int)x->n;
    openblas_set_num_threads(x->threads); /* ctrain sets OpenBLAS to 1 thread on each of its calls */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, ct_tensor_data(x->a), n,
                ct_tensor_data(x->b), n, 0.0f, ct_tensor_data(x->c), n);
}
static void run_dnnl(bench_ctx *x)
{
    x->failed |= dnnl_sgemm('N', 'N', x->n, x->n, x->n, 1.0f, ct_tensor_data(x->a), x->n, ct_tensor_data(x->b), x->n,
                            0.0f, ct_tensor_data(x->c), x->n) != dnnl_success;
}
static void run_ct_bf16(bench_ctx *x)
{
    CT_FRAME {
        if (!ct_kernel_matmul(x->ah, x->bh, false, false)) x->failed = 1;
    }
}
static void run_onednn_bf16(bench_ctx *x)
{
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, x->bf16_mem[0]}, {DNNL_ARG_WEIGHTS, x->bf16_mem[1]},
                               {DNNL_ARG_DST, x->bf16_mem[2]}};
    x->failed |= dnnl_primitive_execute(x->bf16_prim, x->stream, 3, args) != dnnl_success;
    dnnl_stream_wait(x->stream);
}
/* n elements, split over the OpenMP threads in chunks */
static void convert_omp(ct_dtype dd, void *dst, ct_dtype sd, const void *src, int64_t n)
{
    const int64_t chunk = 1 << 16;
    size_t ds = ct_dtype_size(dd), ss = ct_dtype_size(sd);
    #pragma omp parallel for schedule(static)
    for (int64_t lo = 0; lo < n; lo += chunk)
        ct_convert_n(dd, (char *)dst + lo * (int64_t)ds, sd, (const char *)src + lo * (int64_t)ss,
                     n - lo < chunk ? n - lo : chunk, false);
}

/* widen both inputs, sgemm with the f32 library ctrain uses by default, round the result */
static void run_convert_by_hand(bench_ctx *x)
{
    int64_t nn = x->n * x->n;
    int n = (int)x->n;
    convert_omp(CT_DTYPE_F32, x->a32, CT_DTYPE_BF16, ct_tensor_data(x->ah), nn);
    convert_omp(CT_DTYPE_F32, x->b32, CT_DTYPE_BF16, ct_tensor_data(x->bh), nn);
    if (cti_cpu_matmul_backend(CT_DTYPE_F32) == CT_GEMM_ONEDNN)
        dnnl_sgemm('N', 'N', n, n, n, 1.0f, x->a32, n, x->b32, n, 0.0f, x->c32, n);
    else {
        openblas_set_num_threads(x->threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, x->a32, n, x->b32, n, 0.0f, x->c32, n);
    }
    convert_omp(CT_DTYPE_BF16, ct_tensor_data(x->ch), CT_DTYPE_F32, x->c32, nn);
}

typedef void (*method_fn)(bench_ctx *);

/* Median seconds per call of each method, interleaved round by round. */
static void measure(bench_ctx *x, int nm, method_fn *fns, double *med)
{
    double t[MAX_METHODS][REPS];
    for (int m = 0; m < nm; m++)
        if (fns[m]) fns[m](x);
    for (int r = 0; r < REPS; r++) {
        for (int m = 0; m < nm; m++) {
            if (!fns[m]) continue;
            double t0 = now();
            fns[m](x);
            t[m][r] = now() - t0;
        }
    }
    for (int m = 0; m < nm; m++) {
        med[m] = NAN;
        if (!fns[m]) continue;
        qsort(t[m], REPS, sizeof(double), cmp_double);
        med[m] = t[m][REPS / 2];
    }
}

static void set_threads(int t)
{
    ct_set_num_threads(t);      /* ctrain, and OpenMP (so oneDNN) on this thread */
    openblas_set_num_threads(t); /* for the direct cblas calls */
    omp_set_num_threads(t);
}

static void bf16_primitive_init(bench_ctx *x)
{
    dnnl_memory_desc_t md[3];
    dnnl_dims_t dims = {x->n, x->n};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    x->bf16_prim = NULL;
    for (int i = 0; i < 3; i++) dnnl_memory_desc_init_by_tag(&md[i], 2, dims, dnnl_bf16, dnnl_ab);
    if (dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]) ||
        dnnl_primitive_desc_create(&pd, &desc, NULL, x->eng, NULL))
        return;
    if (dnnl_primitive_create(&x->bf16_prim, pd)) x->bf16_prim = NULL;
    dnnl_primitive_desc_destroy(pd);
    void *ptr[3] = {ct_tensor_data(x->ah), ct_tensor_data(x->bh), ct_tensor_data(x->ch)};
    for (int i = 0; i < 3 && x->bf16_prim; i++) dnnl_memory_create(&x->bf16_mem[i], &md[i], x->eng, ptr[i]);
}

static void bf16_primitive_free(bench_ctx *x)
{
    if (!x->bf16_prim) return;
    for (int i = 0; i < 3; i++) dnnl_memory_destroy(x->bf16_mem[i]);
    dnnl_primitive_destroy(x->bf16_prim);
}

static double gflops(int64_t n, double s) { return 2.0 * (double)n * n * n / s * 1e-9; }

/* Why ctrain splits GEMMs itself: an n^3 sgemm timed alone and right after an
 * OpenMP kernel (exp over 256 x 1024 floats), through ct_kernel_matmul_out and
 * through cblas_sgemm on OpenBLAS's own threads. Medians of REPS, milliseconds. */
static void after_openmp_rows(int64_t n, int threads)
{
    CT_FRAME {
        ct_set_num_threads(threads);
        ct_tensor *a = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(n, n), 0, 1);
        ct_tensor *b = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(n, n), 0, 1);
        ct_tensor *c = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(n, n));
        ct_tensor *x = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(256, 1024), 0, 1);
        /* each mode runs its REPS calls back to back (after one warm-up), so "alone"
         * really follows the same library's previous call */
        double t[4][REPS];
        for (int m = 0; m < 4; m++) {
            bool ct = m < 2, after = m % 2 == 1;
            for (int r = -1; r < REPS; r++) {
                if (!ct) openblas_set_num_threads(threads);
                if (after) ct_kernel_unary_out(CT_UNARY_EXP, x, x);
                double t0 = now();
                if (ct) ct_kernel_matmul_out(c, a, b, false, false, 1, 0);
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f,
                                ct_tensor_data(a), (int)n, ct_tensor_data(b), (int)n, 0.0f, ct_tensor_data(c), (int)n);
                if (r >= 0) t[m][r] = now() - t0;
            }
        }
        for (int m = 0; m < 4; m++) qsort(t[m], REPS, sizeof(double), cmp_double);
        printf("| %lld | %d | %.2f | %.2f | %.2f | %.2f |\n", (long long)n, threads, 1e3 * t[0][REPS / 2],
               1e3 * t[1][REPS / 2], 1e3 * t[2][REPS / 2], 1e3 * t[3][REPS / 2]);
    }
}

int main(int argc, char **argv)
{
    int64_t sizes[16] = {1024, 2048};
    int nsizes = 2;
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc && nsizes < 16; i++) sizes[nsizes++] = atoll(argv[i]);
    }
    char flags[256];
    const dnnl_version_t *v = dnnl_version();
    printf("# matmul benchmark\n\nCPU flags: %s; %s; oneDNN %d.%d.%d. ctrain backends: f32 %s, bf16 %s.\n",
           cti_cpu_features_str(flags, sizeof flags), openblas_get_config(), v->major, v->minor, v->patch,
           cti_gemm_backend_name(cti_cpu_matmul_backend(CT_DTYPE_F32)),
           cti_gemm_backend_name(cti_cpu_matmul_backend(CT_DTYPE_BF16)));
    printf("GFLOP/s = 2n^3 / median time of %d calls after a warm-up. overhead: f32 = ct_kernel_matmul (output "
           "allocated each call) vs the library's own call; bf16 = ct_kernel_matmul vs the same path written by hand.\n\n", REPS);

    bench_ctx x = {0};
    if (dnnl_engine_create(&x.eng, dnnl_cpu, 0) || dnnl_stream_create(&x.stream, x.eng, dnnl_stream_default_flags)) {
        fprintf(stderr, "matmul bench: oneDNN engine/stream creation failed\n");
        return 1;
    }
    ct_set_seed(42);
    printf("| dtype | n | threads | ct_kernel_matmul | ct_kernel_matmul_out | cblas_sgemm | dnnl_sgemm "
           "| dispatches to | overhead |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < nsizes; s++) {
        for (int th = 1; th <= 2; th++) {
            CT_FRAME {
                x.n = sizes[s];
                x.threads = th;
                set_threads(th);
                int64_t shape[2] = {x.n, x.n};
                x.a = ct_tensor_randn(CT_DTYPE_F32, 2, shape, 0, 1);
                x.b = ct_tensor_randn(CT_DTYPE_F32, 2, shape, 0, 1);
                x.c = ct_tensor_zeros(CT_DTYPE_F32, 2, shape);
                method_fn fns[4] = {run_ct_matmul, run_ct_matmul_out, run_cblas, run_dnnl};
                double med[4];
                measure(&x, 4, fns, med);
                ct_gemm_backend be = cti_cpu_matmul_backend(CT_DTYPE_F32);
                double lib = be == CT_GEMM_ONEDNN ? med[3] : med[2];
                printf("| f32 | %lld | %d | %.1f | %.1f | %.1f | %.1f | %s | %+.1f%% |\n", (long long)x.n, th,
                       gflops(x.n, med[0]), gflops(x.n, med[1]), gflops(x.n, med[2]), gflops(x.n, med[3]),
                       be == CT_GEMM_ONEDNN ? "dnnl_sgemm" : "cblas_sgemm", 100 * (med[0] / lib - 1));
                fflush(stdout);
            }
        }
    }
    printf("\n| dtype | n | threads | ct_kernel_matmul | oneDNN bf16 primitive | convert+sgemm by hand "
           "| dispatches to | overhead |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < nsizes; s++) {
        for (int th = 1; th <= 2; th++) {
            CT_FRAME {
                x.n = sizes[s];
                x.threads = th;
                set_threads(th);
                int64_t shape[2] = {x.n, x.n}, nn = x.n * x.n;
                x.ah = ct_tensor_randn(CT_DTYPE_BF16, 2, shape, 0, 1);
                x.bh = ct_tensor_randn(CT_DTYPE_BF16, 2, shape, 0, 1);
                x.ch = ct_tensor_zeros(CT_DTYPE_BF16, 2, shape);
                x.a32 = aligned_alloc(64, (size_t)nn * sizeof(float));
                x.b32 = aligned_alloc(64, (size_t)nn * sizeof(float));
                x.c32 = aligned_alloc(64, (size_t)nn * sizeof(float));
                bf16_primitive_init(&x);
                method_fn fns[3] = {run_ct_bf16, x.bf16_prim ? run_onednn_bf16 : NULL, run_convert_by_hand};
                double med[3];
                measure(&x, 3, fns, med);
                bool onednn = cti_cpu_matmul_backend(CT_DTYPE_BF16) == CT_GEMM_ONEDNN && x.bf16_prim;
                double lib = onednn ? med[1] : med[2];
                char prim[32] = "n/a";
                if (x.bf16_prim) snprintf(prim, sizeof prim, "%.1f", gflops(x.n, med[1]));
                printf("| bf16 | %lld | %d | %.1f | %s | %.1f | %s | %+.1f%% |\n", (long long)x.n, th,
                       gflops(x.n, med[0]), prim, gflops(x.n, med[2]), onednn ? "oneDNN primitive" : "convert+sgemm",
                       100 * (med[0] / lib - 1));
                fflush(stdout);
                bf16_primitive_free(&x);
                free(x.a32);
                free(x.b32);
                free(x.c32);
            }
        }
    }
    printf("\nsgemm alone and right after an OpenMP kernel, ms (median of %d):\n\n", REPS);
    printf("| n | threads | ct alone | ct after OpenMP | cblas_sgemm alone | cblas_sgemm after OpenMP |\n");
    printf("|---|---|---|---|---|---|\n");
    for (int s = 0; s < nsizes; s++) after_openmp_rows(sizes[s], 2);
    dnnl_stream_destroy(x.stream);
    dnnl_engine_destroy(x.eng);
    if (x.failed) {
        fprintf(stderr, "matmul bench: a call failed: %s\n", ct_last_error());
        return 1;
    }
    return 0;
}
