/* CPU matmul: out (B..., M, N) = alpha * op(a) @ op(b) + beta * out.
 *
 * f32/f64 go to a row-major library GEMM one batch at a time. A matrix whose
 * columns (or rows) are unit-stride is passed as is with its row (column) stride
 * as the leading dimension, so transposed views and row slices cost no copy; any
 * other layout is copied to contiguous first. bf16/f16 go to oneDNN's matmul
 * primitive where the CPU has the instructions, else are widened to f32, multiplied
 * with sgemm and rounded once.
 *
 * f32 library choice: OpenBLAS 0.3.21 (pthread) cblas_sgemm vs oneDNN 2.6.3 dnnl_sgemm,
 * square n^3 row-major GEMMs, interleaved, median of 9 (best in brackets), GFLOP/s, on
 * a 2-core AMD EPYC (Zen 3, AVX2) VM shared with other work (so 2 threads barely beat 1):
 *       n   1 thread  openblas     onednn        2 threads  openblas     onednn
 *     512           71.9 (80.1)  49.0 (52.1)               31.7 (36.7)  33.5 (42.7)
 *     768           77.8 (80.8)  75.3 (80.7)               42.6 (46.6)  61.4 (62.0)
 *    1024           74.3 (82.0)  63.8 (68.8)               52.5 (56.0)  57.0 (64.3)
 *    1536           70.9 (74.8)  68.4 (71.4)               63.8 (72.0)  62.9 (70.1)
 *    2048           72.2 (72.9)  67.2 (69.0)               67.0 (70.9)  65.4 (71.5)
 * OpenBLAS wins on one thread there (by 45% at 512). On a Zen 4 (AVX-512) VM the same
 * program (bench/kernels/matmul.c, median of 15) gave the other answer:
 *       n   1 thread  openblas  onednn        2 threads  ctrain's openblas panels  onednn
 *     512             81.5      85.7                     196.3                     215.0
 *     768             99.2     109.6                     181.3                     208.4
 *    1024            102.2     108.8                     199.2                     207.3
 * and the GPT training steps of bench/gpt_cpu ran 1-6% (W1) and 8-14% (GPT-2 124M)
 * faster with dnnl_sgemm. So the default is oneDNN where the CPU has AVX-512 and
 * OpenBLAS elsewhere; CTRAIN_SGEMM=openblas|onednn chooses. On more threads ctrain
 * splits an OpenBLAS GEMM into panels itself and runs OpenBLAS single-threaded on
 * each (see openblas_single_thread below; bench/README.md has the figures).
 */
#include "kernels/cpu/matmul.h"
#include "kernels/matmul_geom.h"

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/threads_internal.h"
#include "kernels/cpu/cpu_features.h"

/* Declared by OpenBLAS's cblas.h; repeated so another cblas.h still compiles. */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);

/* Below this M*N*K OpenBLAS runs a GEMM on one thread anyway (its interface/gemm.c
 * threshold, 65536 * GEMM_MULTITHREAD_THRESHOLD 4), so a batch of such GEMMs is
 * spread over OpenMP threads instead; bigger ones use the library's threads. */
#define SMALL_GEMM_MNK (64 * 64 * 64)
/* M * N * K below which dnnl_sgemm runs on the calling thread only: ~4 MFLOP, tens of
 * microseconds on one core, the cost of waking a contended second thread. */
#define ONEDNN_SERIAL_MNK (1 << 21)

/* ---- geometry -------------------------------------------------------------- */

/* Both operands in a GEMM-ready layout: a or b replaced by a contiguous copy (in the
 * current frame) when cti_mm_blas_layout rejects it; g recomputed. */
static ct_status gemm_operands(cti_mm_geom *g, ct_tensor *out, const ct_tensor **a, const ct_tensor **b, bool ta,
                               bool tb, bool *at, int64_t *lda, bool *bt, int64_t *ldb)
{
    if (!cti_mm_blas_layout(g->M, g->K, g->ars, g->acs, at, lda)) {
        if (!(*a = ct_tensor_contiguous((ct_tensor *)*a))) return ct_last_status();
        cti_mm_geom_init(g, out, *a, *b, ta, tb);
        CT_ASSERT(cti_mm_blas_layout(g->M, g->K, g->ars, g->acs, at, lda));
    }
    if (!cti_mm_blas_layout(g->K, g->N, g->brs, g->bcs, bt, ldb)) {
        if (!(*b = ct_tensor_contiguous((ct_tensor *)*b))) return ct_last_status();
        cti_mm_geom_init(g, out, *a, *b, ta, tb);
        CT_ASSERT(cti_mm_blas_layout(g->K, g->N, g->brs, g->bcs, bt, ldb));
    }
    return CT_OK;
}

/* M = 0, N = 0 or an empty batch: nothing to do. K = 0: op(a) @ op(b) is all zeros,
 * so out = beta * out. Returns true when handled. */
static bool matmul_trivial(ct_tensor *out, const cti_mm_geom *g, double beta)
{
    if (g->M == 0 || g->N == 0 || g->nbatch == 0) return true;
    if (g->K != 0) return false;
    int64_t n = ct_tensor_numel(out);
    char *p = ct_tensor_data(out);
    size_t es = ct_dtype_size(out->dtype);
    if (beta == 0) {
        memset(p, 0, (size_t)n * es); /* all-zero bits are +0 in every float dtype */
    } else if (beta != 1) {
        for (int64_t i = 0; i < n; i++) {
            char *e = p + i * (int64_t)es;
            ct_scalar_store(out->dtype, e, beta * ct_scalar_load(out->dtype, e));
        }
    }
    return true;
}

/* ---- backend selection --------------------------------------------------------- */

static _Atomic int backend_override[CT_DTYPE_COUNT];
static ct_gemm_backend env_backend[CT_DTYPE_COUNT];
static char env_bad[CT_DTYPE_COUNT][40]; /* a value the env variable held that we do not know */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static const char *backend_env_name(ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F32: return "CTRAIN_SGEMM";
    case CT_DTYPE_BF16: return "CTRAIN_BF16_GEMM";
    case CT_DTYPE_F16: return "CTRAIN_F16_GEMM";
    default: return NULL;
    }
}

static bool backend_valid(ct_dtype dt, ct_gemm_backend be)
{
    switch (dt) {
    case CT_DTYPE_F32: return be == CT_GEMM_OPENBLAS || be == CT_GEMM_ONEDNN;
    case CT_DTYPE_F64: return be == CT_GEMM_OPENBLAS;
    case CT_DTYPE_BF16:
    case CT_DTYPE_F16: return be == CT_GEMM_ONEDNN || be == CT_GEMM_CONVERT;
    default: return false;
    }
}

const char *cti_gemm_backend_name(ct_gemm_backend be)
{
    switch (be) {
    case CT_GEMM_OPENBLAS: return "openblas";
    case CT_GEMM_ONEDNN: return "onednn";
    case CT_GEMM_CONVERT: return "convert";
    default: return "default";
    }
}

static void env_parse(void)
{
    for (int dt = 0; dt < CT_DTYPE_COUNT; dt++) {
        const char *name = backend_env_name((ct_dtype)dt);
        const char *v = name ? getenv(name) : NULL;
        if (!v || !*v) continue;
        for (int be = CT_GEMM_OPENBLAS; be <= CT_GEMM_CONVERT; be++)
            if (!strcasecmp(v, cti_gemm_backend_name(be)) && backend_valid((ct_dtype)dt, be)) env_backend[dt] = be;
        if (!env_backend[dt]) snprintf(env_bad[dt], sizeof env_bad[dt], "%s", v);
    }
}

static ct_gemm_backend default_backend(ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F32: return cti_cpu_features_get()->avx512f ? CT_GEMM_ONEDNN : CT_GEMM_OPENBLAS;
    case CT_DTYPE_F64: return CT_GEMM_OPENBLAS;
    case CT_DTYPE_BF16: return cti_cpu_has_bf16_gemm() ? CT_GEMM_ONEDNN : CT_GEMM_CONVERT;
    case CT_DTYPE_F16: return cti_cpu_has_f16_gemm() ? CT_GEMM_ONEDNN : CT_GEMM_CONVERT;
    default: return CT_GEMM_DEFAULT;
    }
}

ct_status cti_cpu_matmul_set_backend(ct_dtype dt, ct_gemm_backend be)
{
    if (!ct_dtype_is_valid(dt) || (be != CT_GEMM_DEFAULT && !backend_valid(dt, be)))
        return ct_error_set(CT_ERR_INVALID, "matmul_set_backend: no %s backend for %s matmul", cti_gemm_backend_name(be),
                            ct_dtype_name(dt));
    atomic_store(&backend_override[dt], (int)be);
    return CT_OK;
}

/* The backend for dt and whether the user chose it (then it never falls back). */
static ct_status backend_resolve(ct_dtype dt, ct_gemm_backend *be, bool *forced)
{
    pthread_once(&env_once, env_parse);
    *be = (ct_gemm_backend)atomic_load(&backend_override[dt]);
    *forced = true;
    if (*be) return CT_OK;
    if (env_bad[dt][0])
        return ct_error_set(CT_ERR_INVALID, "matmul: %s=\"%s\" is not a %s GEMM backend (use %s)", backend_env_name(dt),
                            env_bad[dt], ct_dtype_name(dt), dt == CT_DTYPE_F32 ? "openblas or onednn" : "onednn or convert");
    *be = env_backend[dt];
    if (*be) return CT_OK;
    *forced = false;
    *be = default_backend(dt);
    return CT_OK;
}

ct_gemm_backend cti_cpu_matmul_backend(ct_dtype dt)
{
    if (!ct_dtype_is_valid(dt) || !default_backend(dt)) return CT_GEMM_DEFAULT;
    pthread_once(&env_once, env_parse);
    ct_gemm_backend be = (ct_gemm_backend)atomic_load(&backend_override[dt]);
    if (be) return be;
    if (env_bad[dt][0]) return CT_GEMM_DEFAULT;
    return env_backend[dt] ? env_backend[dt] : default_backend(dt);
}

/* ---- f32 / f64 library GEMMs ------------------------------------------------ */

/* OpenBLAS runs single-threaded, always: its pthread pool and the OpenMP pool
 * that every other ctrain kernel (and oneDNN) uses would otherwise fight for the
 * cores, since OpenMP workers spin for a while after each parallel region. We
 * measured a 1024^3 sgemm on 2 threads 50% slower right after an elementwise
 * kernel than alone. Instead ctrain splits a large GEMM into row (or column)
 * panels on its own OpenMP threads and gives each panel to OpenBLAS. Checked on
 * every call because a program may change OpenBLAS's setting itself. */
static void openblas_single_thread(void)
{
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

/* One row-major GEMM, C (M, N) with leading dimension ldc. Returns a dnnl_status_t (0 = ok). */
static int gemm_one(ct_dtype dt, ct_gemm_backend be, bool at, bool bt, int64_t M, int64_t N, int64_t K, double alpha,
                    const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc)
{
    enum CBLAS_TRANSPOSE ta = at ? CblasTrans : CblasNoTrans, tb = bt ? CblasTrans : CblasNoTrans;
    if (dt == CT_DTYPE_F64) {
        cblas_dgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C,
                    (int)ldc);
        return 0;
    }
    if (be == CT_GEMM_ONEDNN)
        return (int)dnnl_sgemm(at ? 'T' : 'N', bt ? 'T' : 'N', M, N, K, (float)alpha, A, lda, B, ldb, (float)beta, C,
                               ldc);
    cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, (float)alpha, A, (int)lda, B, (int)ldb, (float)beta, C,
                (int)ldc);
    return 0;
}

/* Panels for one large BLAS GEMM: C's rows are split when M >= N, else its
 * columns, into one panel per thread, each a multiple of PANEL_ALIGN so the
 * library's micro-kernels see full tiles. Every output element is computed by
 * the same K-loop whatever the split. */
#define PANEL_ALIGN 16
static void gemm_panels(ct_dtype dt, bool at, bool bt, int64_t M, int64_t N, int64_t K, double alpha, const char *A,
                        int64_t lda, const char *B, int64_t ldb, double beta, char *C, int64_t es)
{
    int nt = M * N * K < SMALL_GEMM_MNK ? 1 : ct_get_num_threads();
    bool split_m = M >= N;
    int64_t len = split_m ? M : N;
    int64_t per = (len + nt - 1) / nt;
    per = (per + PANEL_ALIGN - 1) / PANEL_ALIGN * PANEL_ALIGN;
    int np = (int)((len + per - 1) / per);
    #pragma omp parallel for num_threads(nt) schedule(static) if (np > 1)
    for (int p = 0; p < np; p++) {
        int64_t lo = p * per, n = len - lo < per ? len - lo : per;
        if (split_m) /* rows lo.. of op(A) and C */
            gemm_one(dt, CT_GEMM_OPENBLAS, at, bt, n, N, K, alpha, A + (at ? lo : lo * lda) * es, lda, B, ldb, beta,
                     C + lo * N * es, N);
        else /* columns lo.. of op(B) and C */
            gemm_one(dt, CT_GEMM_OPENBLAS, at, bt, M, n, K, alpha, A, lda, B + (bt ? lo * ldb : lo) * es, ldb, beta,
                     C + lo * es, N);
    }
}

/* f32/f64 out = alpha op(a) op(b) + beta out through OpenBLAS or dnnl_sgemm, batch by batch. */
static ct_status gemm_batched(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, double alpha,
                              double beta, ct_gemm_backend be)
{
    cti_mm_geom g;
    cti_mm_geom_init(&g, out, a, b, ta, tb);
    bool at, bt;
    int64_t lda, ldb;
    ct_status st = gemm_operands(&g, out, &a, &b, ta, tb, &at, &lda, &bt, &ldb);
    if (st) return st;
    if (be == CT_GEMM_OPENBLAS &&
        (g.M > INT_MAX || g.N > INT_MAX || g.K > INT_MAX || lda > INT_MAX || ldb > INT_MAX))
        return ct_error_set(CT_ERR_UNSUPPORTED, "matmul: M=%lld N=%lld K=%lld (leading dims %lld, %lld) exceed "
                            "OpenBLAS's 32-bit sizes", (long long)g.M, (long long)g.N, (long long)g.K,
                            (long long)lda, (long long)ldb);
    ct_dtype dt = out->dtype;
    int64_t es = (int64_t)ct_dtype_size(dt), mnk = g.M * g.N * g.K, nbatch = g.nbatch;
    const char *ap = ct_tensor_data(a), *bp = ct_tensor_data(b);
    char *cp = ct_tensor_data(out);
    if (be == CT_GEMM_OPENBLAS || dt == CT_DTYPE_F64) openblas_single_thread();
    cti_threads_sync(); /* dnnl_sgemm and our batch and panel loops use OpenMP */
    int failed = 0;
    if (nbatch > 1 && mnk <= SMALL_GEMM_MNK) {
        #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (nbatch * mnk > 32768)
        for (int64_t i = 0; i < nbatch; i++) {
            int s = gemm_one(dt, be, at, bt, g.M, g.N, g.K, alpha, ap + cti_mm_batch_offset(&g, g.as, i) * es, lda,
                             bp + cti_mm_batch_offset(&g, g.bs, i) * es, ldb, beta, cp + i * g.M * g.N * es, g.N);
            if (s) {
                #pragma omp atomic write
                failed = s;
            }
        }
    } else {
        /* dnnl_sgemm starts a parallel region on every OpenMP thread whatever the size.
         * For a small product (a decoding step's 1 x C x 4C) that region costs more than
         * the product, and when another process holds a core each one waits for a
         * scheduler slice: generation ran 4 tokens/s instead of 900 on a shared 2-core
         * machine. Below ONEDNN_SERIAL_MNK it runs on this thread alone. */
        bool serial = be == CT_GEMM_ONEDNN && dt == CT_DTYPE_F32 && mnk < ONEDNN_SERIAL_MNK && ct_get_num_threads() > 1;
        if (serial) omp_set_num_threads(1);
        for (int64_t i = 0; i < nbatch && !failed; i++) {
            const char *A = ap + cti_mm_batch_offset(&g, g.as, i) * es, *B = bp + cti_mm_batch_offset(&g, g.bs, i) * es;
            char *C = cp + i * g.M * g.N * es;
            if (be == CT_GEMM_OPENBLAS || dt == CT_DTYPE_F64)
                gemm_panels(dt, at, bt, g.M, g.N, g.K, alpha, A, lda, B, ldb, beta, C, es);
            else
                failed = gemm_one(dt, be, at, bt, g.M, g.N, g.K, alpha, A, lda, B, ldb, beta, C, g.N);
        }
        if (serial) omp_set_num_threads(ct_get_num_threads());
    }
    if (failed)
        return ct_error_set(CT_ERR_INTERNAL, "matmul: dnnl_sgemm failed (status %d) for M=%lld N=%lld K=%lld", failed,
                            (long long)g.M, (long long)g.N, (long long)g.K);
    return CT_OK;
}

/* ---- bf16 / f16 by conversion ------------------------------------------------ */

/* ct_convert_n over n contiguous elements, split into chunks across threads
 * (elementwise, so the bits do not depend on the split). */
static ct_status convert_parallel(ct_dtype dst_dt, void *dst, ct_dtype src_dt, const void *src, int64_t n)
{
    const int64_t chunk = 16384;
    int64_t nchunks = (n + chunk - 1) / chunk;
    size_t ds = ct_dtype_size(dst_dt), ss = ct_dtype_size(src_dt);
    int failed = 0;
    #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > 4 * chunk)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * chunk, len = n - lo < chunk ? n - lo : chunk;
        if (ct_convert_n(dst_dt, (char *)dst + lo * (int64_t)ds, src_dt, (const char *)src + lo * (int64_t)ss, len,
                         false)) {
            #pragma omp atomic write
            failed = 1;
        }
    }
    return failed ? ct_error_set(CT_ERR_INTERNAL, "matmul: %s -> %s conversion failed", ct_dtype_name(src_dt),
                                 ct_dtype_name(dst_dt))
                  : CT_OK;
}

/* The convert path's f32 copies come from a small pool kept between calls: fresh
 * multi-megabyte buffers cost a page fault per 4 KiB on first touch, measured at
 * ~15% of a 1024^3 bf16 matmul on a KVM guest. At most WS_SLOTS buffers (each at
 * most WS_MAX_BYTES) stay allocated for the life of the process. */
#define WS_SLOTS 4
#define WS_MAX_BYTES ((size_t)256 << 20)
static struct {
    void *p;
    size_t cap;
    bool busy;
} ws_pool[WS_SLOTS];
static pthread_mutex_t ws_mu = PTHREAD_MUTEX_INITIALIZER;

static void ws_release(void *ctx, void *data, size_t nbytes)
{
    (void)ctx;
    (void)nbytes;
    pthread_mutex_lock(&ws_mu);
    for (int i = 0; i < WS_SLOTS; i++) {
        if (ws_pool[i].p == data) {
            ws_pool[i].busy = false;
            pthread_mutex_unlock(&ws_mu);
            return;
        }
    }
    pthread_mutex_unlock(&ws_mu);
    free(data);
}

/* A new contiguous f32 tensor (current frame) over pooled memory: the smallest free
 * slot that fits, else the smallest free slot regrown, else (all busy) the heap. */
static ct_tensor *ws_tensor(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    void *p = NULL;
    pthread_mutex_lock(&ws_mu);
    int pick = -1;
    for (int i = 0; i < WS_SLOTS; i++)
        if (!ws_pool[i].busy && ws_pool[i].cap >= bytes && (pick < 0 || ws_pool[i].cap < ws_pool[pick].cap)) pick = i;
    if (pick < 0 && bytes <= WS_MAX_BYTES) {
        for (int i = 0; i < WS_SLOTS; i++)
            if (!ws_pool[i].busy && (pick < 0 || ws_pool[i].cap < ws_pool[pick].cap)) pick = i;
        if (pick >= 0) {
            free(ws_pool[pick].p);
            ws_pool[pick].p = aligned_alloc(64, bytes);
            ws_pool[pick].cap = ws_pool[pick].p ? bytes : 0;
        }
    }
    if (pick >= 0 && ws_pool[pick].p) {
        ws_pool[pick].busy = true;
        p = ws_pool[pick].p;
    }
    pthread_mutex_unlock(&ws_mu);
    if (!p) p = aligned_alloc(64, bytes);
    if (!p) {
        ct_error_set(CT_ERR_NOMEM, "matmul: cannot allocate a %zu-byte f32 workspace", bytes);
        return NULL;
    }
    /* on failure from_buffer may already have run ws_release (header allocation
     * failed after the storage was made), so p is not released again here */
    return ct_tensor_from_buffer(CT_DTYPE_F32, ndim, shape, p, ws_release, NULL);
}

/* t as a new f32 tensor. A contiguous tensor, or a transposed one (its last two
 * dims swapped are contiguous), is widened in storage order, so the GEMM later
 * reads it through the transpose flag without another copy. */
static ct_tensor *widen_f32(const ct_tensor *t)
{
    ct_tensor *v = (ct_tensor *)t, *swapped = NULL;
    if (!ct_tensor_is_contiguous(v)) {
        swapped = ct_tensor_transpose(v, -2, -1);
        if (!swapped) return NULL;
        if (!ct_tensor_is_contiguous(swapped)) return ct_tensor_cast(v, CT_DTYPE_F32); /* general strides */
        v = swapped;
    }
    ct_tensor *w = ws_tensor(v->ndim, v->shape);
    if (!w || convert_parallel(CT_DTYPE_F32, ct_tensor_data(w), v->dtype, ct_tensor_data(v), ct_tensor_numel(v)))
        return NULL;
    return swapped ? ct_tensor_transpose(w, -2, -1) : w;
}

// bf16/f16: a32, b32 = f32(a), f32(b); o32 = alpha a32 b32 + beta f32(out) (sgemm); out = round(o32)
// (an f32 out is o32 itself: nothing rounded)
static ct_status matmul_convert(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, double alpha,
                                double beta)
{
    ct_gemm_backend be32;
    bool forced;
    ct_status st = backend_resolve(CT_DTYPE_F32, &be32, &forced);
    if (st) return st;
    ct_tensor *a32 = widen_f32(a), *b32 = widen_f32(b);
    ct_tensor *o32 = out->dtype == CT_DTYPE_F32 ? out : beta != 0 ? widen_f32(out) : ws_tensor(out->ndim, out->shape);
    if (!a32 || !b32 || !o32) return ct_last_status();
    st = gemm_batched(o32, a32, b32, ta, tb, alpha, beta, be32);
    if (st || o32 == out) return st;
    return convert_parallel(out->dtype, ct_tensor_data(out), CT_DTYPE_F32, ct_tensor_data(o32), ct_tensor_numel(out));
}

/* ---- oneDNN matmul primitive --------------------------------------------------- */

typedef struct onednn_key {
    dnnl_data_type_t dt, dst_dt; /* a and b; out (f32 or dt) */
    int nd;
    dnnl_dims_t dims[3], strides[3]; /* src (a), weights (b), dst (out) */
    double alpha, beta;
} onednn_key;

typedef struct onednn_entry {
    onednn_key key;
    dnnl_memory_desc_t md[4]; /* src, weights, dst, scratchpad */
    dnnl_primitive_t prim; /* NULL: oneDNN has no implementation (status below) */
    dnnl_status_t status;
    size_t scratch_bytes;
    int users;
    bool evicted;
} onednn_entry;

/* Primitives are cached by layout (creating one costs far more than a small GEMM).
 * Entries are refcounted so a thread may evict one another thread is running. */
#define ONEDNN_CACHE 128
static onednn_entry *onednn_cache[ONEDNN_CACHE];
static int onednn_next;
static pthread_mutex_t onednn_mu = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t onednn_engine;
static dnnl_status_t onednn_engine_status;
static pthread_once_t onednn_once = PTHREAD_ONCE_INIT;

static void onednn_engine_init(void) { onednn_engine_status = dnnl_engine_create(&onednn_engine, dnnl_cpu, 0); }

static void onednn_entry_free(onednn_entry *e)
{
    if (e->prim) dnnl_primitive_destroy(e->prim);
    free(e);
}

static void onednn_create(onednn_entry *e)
{
    const onednn_key *k = &e->key;
    dnnl_status_t s = dnnl_success;
    for (int i = 0; i < 3 && !s; i++)
        s = dnnl_memory_desc_init_by_strides(&e->md[i], k->nd, k->dims[i], i == 2 ? k->dst_dt : k->dt, k->strides[i]);
    dnnl_matmul_desc_t desc;
    if (!s) s = dnnl_matmul_desc_init(&desc, &e->md[0], &e->md[1], NULL, &e->md[2]);
    dnnl_primitive_attr_t attr = NULL;
    if (!s) s = dnnl_primitive_attr_create(&attr);
    if (!s) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    float alpha = (float)k->alpha;
    if (!s && k->alpha != 1) s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
    if (!s && k->beta != 0) {
        dnnl_post_ops_t po;
        s = dnnl_post_ops_create(&po);
        if (!s) {
            s = dnnl_post_ops_append_sum(po, (float)k->beta);
            if (!s) s = dnnl_primitive_attr_set_post_ops(attr, po);
            dnnl_post_ops_destroy(po);
        }
    }
    dnnl_primitive_desc_t pd = NULL;
    if (!s) s = dnnl_primitive_desc_create(&pd, &desc, attr, onednn_engine, NULL);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!s) {
        const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
        if (smd) e->md[3] = *smd;
        s = dnnl_primitive_create(&e->prim, pd);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    e->status = s;
}

static onednn_entry *onednn_acquire(const onednn_key *k)
{
    pthread_mutex_lock(&onednn_mu);
    for (int i = 0; i < ONEDNN_CACHE; i++) {
        onednn_entry *e = onednn_cache[i];
        if (e && !memcmp(&e->key, k, sizeof *k)) {
            e->users++;
            pthread_mutex_unlock(&onednn_mu);
            return e;
        }
    }
    onednn_entry *e = calloc(1, sizeof *e);
    if (e) {
        e->key = *k;
        e->users = 1;
        onednn_create(e);
        onednn_entry *victim = onednn_cache[onednn_next];
        onednn_cache[onednn_next] = e;
        onednn_next = (onednn_next + 1) % ONEDNN_CACHE;
        if (victim) {
            victim->evicted = true;
            if (victim->users == 0) onednn_entry_free(victim);
        }
    }
    pthread_mutex_unlock(&onednn_mu);
    return e;
}

static void onednn_release(onednn_entry *e)
{
    pthread_mutex_lock(&onednn_mu);
    if (--e->users == 0 && e->evicted) onednn_entry_free(e);
    pthread_mutex_unlock(&onednn_mu);
}

static const char *onednn_isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

/* Fills one operand's dims/strides for the key: batch dims padded with 1s to out's
 * count, the matrix dims in the canonical BLAS layout, size-1 dims given the
 * outermost stride (oneDNN ignores them, but expects a plausible layout). */
static void onednn_operand(const cti_mm_geom *g, const ct_tensor *t, const int64_t *bstr, int64_t rows, int64_t cols,
                           bool trans, int64_t ld, int64_t *dims, int64_t *strides)
{
    int nb = g->nb;
    dims[nb] = rows;
    dims[nb + 1] = cols;
    strides[nb] = trans ? 1 : ld;
    strides[nb + 1] = trans ? ld : 1;
    int64_t span = cti_mm_max64(rows * strides[nb], cols * strides[nb + 1]);
    int lead = nb - (t ? t->ndim - 2 : nb);
    for (int d = 0; d < nb; d++) {
        dims[d] = d < lead ? 1 : t ? t->shape[d - lead] : g->bshape[d];
        strides[d] = t ? bstr[d] : 0;
        if (dims[d] != 1) span = cti_mm_max64(span, dims[d] * strides[d]);
    }
    for (int d = 0; d < nb; d++)
        if (dims[d] == 1) strides[d] = span;
}

static bool expanded_batch(const cti_mm_geom *g, const ct_tensor *t, const int64_t *bstr)
{
    int lead = g->nb - (t->ndim - 2);
    for (int d = lead; d < g->nb; d++)
        if (bstr[d] == 0 && t->shape[d - lead] != 1) return true;
    return false;
}

/* out = alpha op(a) op(b) + beta out as one oneDNN matmul primitive: batch
 * broadcasting, alpha (output scale) and beta (sum post-op) all inside oneDNN, which
 * accumulates bf16/f16 products in f32 and rounds once. `report` = false: an
 * unimplemented dtype returns CT_ERR_UNSUPPORTED without recording an error. */
static ct_status onednn_run(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, double alpha,
                            double beta, bool report)
{
    static const dnnl_data_type_t dts[CT_DTYPE_COUNT] = {
        [CT_DTYPE_F32] = dnnl_f32, [CT_DTYPE_BF16] = dnnl_bf16, [CT_DTYPE_F16] = dnnl_f16};
    if (!dts[a->dtype] || !dts[out->dtype])
        return ct_error_set(CT_ERR_INVALID, "matmul: oneDNN path takes f32, bf16 or f16, not %s into %s",
                            ct_dtype_name(a->dtype), ct_dtype_name(out->dtype));
    pthread_once(&onednn_once, onednn_engine_init);
    if (onednn_engine_status)
        return ct_error_set(CT_ERR_INTERNAL, "matmul: oneDNN CPU engine creation failed (status %d)",
                            (int)onednn_engine_status);
    cti_mm_geom g;
    cti_mm_geom_init(&g, out, a, b, ta, tb);
    bool at, bt;
    int64_t lda, ldb;
    /* a batch dim the caller expanded (size > 1, stride 0) is materialised first */
    if (expanded_batch(&g, a, g.as) || expanded_batch(&g, b, g.bs)) {
        if (!(a = ct_tensor_contiguous((ct_tensor *)a)) || !(b = ct_tensor_contiguous((ct_tensor *)b)))
            return ct_last_status();
        cti_mm_geom_init(&g, out, a, b, ta, tb);
    }
    ct_status st = gemm_operands(&g, out, &a, &b, ta, tb, &at, &lda, &bt, &ldb);
    if (st) return st;
    onednn_key k;
    memset(&k, 0, sizeof k); /* keys are compared with memcmp */
    k.dt = dts[a->dtype];
    k.dst_dt = dts[out->dtype];
    k.nd = out->ndim;
    k.alpha = alpha;
    k.beta = beta;
    onednn_operand(&g, a, g.as, g.M, g.K, at, lda, k.dims[0], k.strides[0]);
    onednn_operand(&g, b, g.bs, g.K, g.N, bt, ldb, k.dims[1], k.strides[1]);
    onednn_operand(&g, NULL, NULL, g.M, g.N, false, g.N, k.dims[2], k.strides[2]);
    for (int d = g.nb - 1; d >= 0; d--) k.strides[2][d] = k.strides[2][d + 1] * k.dims[2][d + 1];
    onednn_entry *e = onednn_acquire(&k);
    if (!e) return ct_error_set(CT_ERR_NOMEM, "matmul: out of memory for a oneDNN primitive cache entry");
    if (!e->prim) {
        dnnl_status_t s = e->status;
        onednn_release(e);
        if (s == dnnl_unimplemented) {
            if (!report) return CT_ERR_UNSUPPORTED;
            char flags[256];
            const dnnl_version_t *v = dnnl_version();
            const char *env = backend_env_name(a->dtype);
            return ct_error_set(CT_ERR_UNSUPPORTED,
                                "matmul: oneDNN %d.%d has no %s matmul for this CPU (its max ISA: %s; CPU: %s); "
                                "unset %s or set it to convert", v->major, v->minor, ct_dtype_name(a->dtype),
                                onednn_isa_name(dnnl_get_effective_cpu_isa()), cti_cpu_features_str(flags, sizeof flags),
                                env ? env : "the backend override");
        }
        return ct_error_set(CT_ERR_INTERNAL, "matmul: oneDNN matmul primitive creation failed (status %d)", (int)s);
    }
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    void *ptr[3] = {ct_tensor_data(a), ct_tensor_data(b), ct_tensor_data(out)};
    void *scratch = e->scratch_bytes ? aligned_alloc(64, (e->scratch_bytes + 63) / 64 * 64) : NULL;
    dnnl_stream_t stream = NULL;
    dnnl_status_t s = e->scratch_bytes && !scratch ? dnnl_out_of_memory : dnnl_success;
    for (int i = 0; i < 3 && !s; i++) s = dnnl_memory_create(&mem[i], &e->md[i], onednn_engine, ptr[i]);
    if (!s && scratch) s = dnnl_memory_create(&mem[3], &e->md[3], onednn_engine, scratch);
    if (!s) s = dnnl_stream_create(&stream, onednn_engine, dnnl_stream_default_flags);
    if (!s) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]},
                                   {DNNL_ARG_SCRATCHPAD, mem[3]}};
        cti_threads_sync();
        s = dnnl_primitive_execute(e->prim, stream, mem[3] ? 4 : 3, args);
        if (!s) s = dnnl_stream_wait(stream);
    }
    if (stream) dnnl_stream_destroy(stream);
    for (int i = 0; i < 4; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    free(scratch);
    onednn_release(e);
    if (s) return ct_error_set(CT_ERR_INTERNAL, "matmul: oneDNN matmul execution failed (status %d)", (int)s);
    return CT_OK;
}

ct_status cti_cpu_matmul_onednn(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b,
                                double alpha, double beta)
{
    cti_mm_geom g;
    cti_mm_geom_init(&g, out, a, b, trans_a, trans_b);
    if (matmul_trivial(out, &g, beta)) return CT_OK;
    ct_frame_push();
    ct_status st = onednn_run(out, a, b, trans_a, trans_b, alpha, beta, true);
    ct_frame_pop();
    return st;
}

/* ---- entry points -------------------------------------------------------------- */

ct_status cti_cpu_matmul(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b,
                         double alpha, double beta)
{
    cti_mm_geom g;
    cti_mm_geom_init(&g, out, a, b, trans_a, trans_b);
    ct_gemm_backend be;
    bool forced;
    /* the inputs' dtype picks the library; 16-bit inputs may write an f32 out */
    ct_status st = backend_resolve(a->dtype, &be, &forced);
    if (st) return st;
    if (matmul_trivial(out, &g, beta)) return CT_OK;
    ct_frame_push(); /* contiguous copies and f32 temporaries die here */
    if (a->dtype == CT_DTYPE_F32 || a->dtype == CT_DTYPE_F64) {
        st = gemm_batched(out, a, b, trans_a, trans_b, alpha, beta, be);
    } else if (be == CT_GEMM_ONEDNN) {
        st = onednn_run(out, a, b, trans_a, trans_b, alpha, beta, forced);
        /* chosen by CPU flags but oneDNN lacks the kernel: convert instead */
        if (st == CT_ERR_UNSUPPORTED && !forced) st = matmul_convert(out, a, b, trans_a, trans_b, alpha, beta);
    } else {
        st = matmul_convert(out, a, b, trans_a, trans_b, alpha, beta);
    }
    ct_frame_pop();
    return st;
}

// out (B..., M, N) = alpha * sum_k op(a)[.., m, k] op(b)[.., k, n] + beta * out, in double, any dtype, any strides.
// Written without the fast path's helpers (its own index arithmetic), so tests compare two independent codes.
ct_status cti_cpu_matmul_ref(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b,
                             double alpha, double beta)
{
    int nb = out->ndim - 2, na = a->ndim - 2, nbb = b->ndim - 2;
    int64_t M = out->shape[nb], N = out->shape[nb + 1], K = a->shape[na + (trans_a ? 0 : 1)];
    int64_t a_m = a->strides[na + (trans_a ? 1 : 0)], a_k = a->strides[na + (trans_a ? 0 : 1)];
    int64_t b_k = b->strides[nbb + (trans_b ? 1 : 0)], b_n = b->strides[nbb + (trans_b ? 0 : 1)];
    int64_t es_a = (int64_t)ct_dtype_size(a->dtype), es_b = (int64_t)ct_dtype_size(b->dtype);
    int64_t es_o = (int64_t)ct_dtype_size(out->dtype), nbatch = 1;
    for (int d = 0; d < nb; d++) nbatch *= out->shape[d];
    const char *ap = ct_tensor_data(a), *bp = ct_tensor_data(b);
    char *op = ct_tensor_data(out);
    for (int64_t i = 0; i < nbatch; i++) {
        /* out's batch index, last dim fastest; a dim of a or b that is missing or 1 is broadcast */
        int64_t ao = 0, bo = 0, oo = 0, rem = i;
        for (int d = nb - 1; d >= 0; d--) {
            int64_t idx = rem % out->shape[d];
            rem /= out->shape[d];
            int da = d - nb + na, db = d - nb + nbb;
            if (da >= 0 && a->shape[da] > 1) ao += idx * a->strides[da];
            if (db >= 0 && b->shape[db] > 1) bo += idx * b->strides[db];
            oo += idx * out->strides[d];
        }
        for (int64_t m = 0; m < M; m++) {
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += ct_scalar_load(a->dtype, ap + (ao + m * a_m + k * a_k) * es_a) *
                           ct_scalar_load(b->dtype, bp + (bo + k * b_k + n * b_n) * es_b);
                char *p = op + (oo + m * out->strides[nb] + n * out->strides[nb + 1]) * es_o;
                double v = alpha * acc;
                if (beta != 0) v += beta * ct_scalar_load(out->dtype, p);
                ct_scalar_store(out->dtype, p, v);
            }
        }
    }
    return CT_OK;
}
