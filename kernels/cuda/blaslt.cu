/* ctrain — the cuBLASLt handle per device, the algorithm cache and one GEMM call
 * (see kernels/cuda/blaslt.cuh).
 *
 * Creating descriptors is cheap (host structs); the heuristic query is not (tens of
 * microseconds), so its answer is cached in a direct-mapped table keyed by every
 * input the heuristic sees. The pointers' alignment is part of the key: cuBLASLt
 * assumes 256-byte aligned operands unless told otherwise, and a kernel chosen for
 * aligned pointers may not run on a row slice that starts at an odd element.
 */
#include "kernels/cuda/blaslt.cuh"

#include "core/cublaslt_loader.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define LT_MAX_DEVICES 64
#define LT_CACHE_SLOTS 1024
#define LT_MAX_WORKSPACE ((size_t)32 << 20)

static pthread_mutex_t lt_mu = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t lt_handles[LT_MAX_DEVICES];
static int lt_cc[LT_MAX_DEVICES]; /* 0: not asked yet */

typedef struct lt_key {
    int dev;
    cti_lt_gemm g; /* with the pointers replaced by NULL: only the bias's alignment matters */
    uint32_t align_a, align_b, align_d, align_bias;
    bool scaled_a, scaled_b;
} lt_key;

typedef struct lt_slot {
    bool used;
    lt_key key;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
} lt_slot;

static lt_slot lt_cache[LT_CACHE_SLOTS];

/* The largest power of two (at most 256) dividing the address and every byte offset
 * the GEMM steps by. */
static uint32_t lt_align(const void *p, int64_t ld_bytes, int64_t stride_bytes)
{
    uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)ld_bytes | (uint64_t)stride_bytes | 256u;
    return (uint32_t)(v & (~v + 1));
}

static uint64_t lt_hash(const lt_key *k)
{
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static size_t lt_type_size(cudaDataType_t t)
{
    switch (t) {
    case CUDA_R_64F: return 8;
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 1; /* fp8 */
    }
}

int cti_lt_capability(int dev)
{
    if (dev < 0 || dev >= LT_MAX_DEVICES) return 0;
    pthread_mutex_lock(&lt_mu);
    int cc = lt_cc[dev];
    pthread_mutex_unlock(&lt_mu);
    if (cc) return cc;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: leave no error behind for the next launch check */
        return 0;
    }
    cc = major * 10 + minor;
    pthread_mutex_lock(&lt_mu);
    lt_cc[dev] = cc;
    pthread_mutex_unlock(&lt_mu);
    return cc;
}

static ct_status lt_handle(const cti_cublaslt_api *lt, int dev, cublasLtHandle_t *h, const char *op)
{
    if (dev < 0 || dev >= LT_MAX_DEVICES)
        return ct_error_set(CT_ERR_UNSUPPORTED, "%s: cuda:%d is beyond the %d devices cuBLASLt handles are kept for",
                            op, dev, LT_MAX_DEVICES);
    ct_status st = CT_OK;
    pthread_mutex_lock(&lt_mu);
    if (!lt_handles[dev]) {
        cublasLtHandle_t nh = NULL;
        st = cti_cublas_check((int)lt->Create(&nh), op, dev, "cublasLtCreate");
        if (!st) lt_handles[dev] = nh;
    }
    *h = lt_handles[dev];
    pthread_mutex_unlock(&lt_mu);
    return st;
}

/* Descriptors of one call, destroyed together. */
typedef struct lt_descs {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
} lt_descs;

static void lt_descs_free(const cti_cublaslt_api *lt, lt_descs *d)
{
    if (d->pref) lt->MatmulPreferenceDestroy(d->pref);
    if (d->d) lt->MatrixLayoutDestroy(d->d);
    if (d->b) lt->MatrixLayoutDestroy(d->b);
    if (d->a) lt->MatrixLayoutDestroy(d->a);
    if (d->op) lt->MatmulDescDestroy(d->op);
}

/* A column-major rows x cols layout with leading dimension ld, batched. */
static cublasStatus_t lt_layout(const cti_cublaslt_api *lt, cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                                int32_t batch, int64_t stride)
{
    cublasStatus_t s = lt->MatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
    if (s == CUBLAS_STATUS_SUCCESS && batch > 1) {
        s = lt->MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = lt->MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof stride);
    }
    return s;
}

#define LT_TRY(call, step)                                                                   \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            char w_[600];                                                                    \
            snprintf(w_, sizeof w_, "%s (%s)", step, what);                                  \
            ct_status st_ = cti_cublas_check((int)s_, op, dev, w_);                          \
            lt_descs_free(lt, &d);                                                               \
            return st_;                                                                      \
        }                                                                                    \
    } while (0)

ct_status cti_lt_matmul(int dev, cudaStream_t s, const cti_lt_gemm *g, const void *alpha, const void *A,
                        const void *B, const void *beta, void *D, const char *op, const char *what)
{
    const cti_cublaslt_api *lt = cti_cublaslt(op);
    if (!lt) return ct_last_status();
    cublasLtHandle_t h = NULL;
    ct_status st = lt_handle(lt, dev, &h, op);
    if (st) return st;
    lt_descs d = {};
    const size_t ea = lt_type_size(g->a_type), eb = lt_type_size(g->b_type), ed = lt_type_size(g->d_type);
    const cublasOperation_t ta = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint32_t epi = (uint32_t)g->epilogue;
    LT_TRY(lt->MatmulDescCreate(&d.op, g->compute, g->scale_type), "cublasLtMatmulDescCreate");
    LT_TRY(lt->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    LT_TRY(lt->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    if (g->a_scale)
        LT_TRY(lt->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->a_scale,
                                              sizeof g->a_scale),
               "A_SCALE_POINTER");
    if (g->b_scale)
        LT_TRY(lt->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->b_scale,
                                              sizeof g->b_scale),
               "B_SCALE_POINTER");
    if (g->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        LT_TRY(lt->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "EPILOGUE");
        if (g->bias) {
            const int32_t bt = (int32_t)g->d_type;
            LT_TRY(lt->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias),
                   "BIAS_POINTER");
            LT_TRY(lt->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
                   "BIAS_DATA_TYPE");
        }
    }
    /* stored shapes: op(A) (m, k) is A (k, m) when transposed */
    LT_TRY(lt_layout(lt, &d.a, g->a_type, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda, g->batch,
                     g->stride_a),
           "layout A");
    LT_TRY(lt_layout(lt, &d.b, g->b_type, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb, g->batch,
                     g->stride_b),
           "layout B");
    LT_TRY(lt_layout(lt, &d.d, g->d_type, g->m, g->n, g->ldd, g->batch, g->stride_d), "layout D");

    lt_key key;
    memset(&key, 0, sizeof key); /* padding takes part in the hash and the compare */
    key.dev = dev;
    memcpy(&key.g, g, sizeof *g); /* with its padding: callers zero the struct first */
    key.g.bias = NULL;
    key.g.a_scale = key.g.b_scale = NULL;
    key.scaled_a = g->a_scale != NULL;
    key.scaled_b = g->b_scale != NULL;
    const int64_t bs = g->batch > 1;
    key.align_a = lt_align(A, g->lda * (int64_t)ea, bs * g->stride_a * (int64_t)ea);
    key.align_b = lt_align(B, g->ldb * (int64_t)eb, bs * g->stride_b * (int64_t)eb);
    key.align_d = lt_align(D, g->ldd * (int64_t)ed, bs * g->stride_d * (int64_t)ed);
    key.align_bias = g->bias ? lt_align(g->bias, 0, 0) : 0;
    const size_t slot = (size_t)(lt_hash(&key) % LT_CACHE_SLOTS);

    cublasLtMatmulAlgo_t algo;
    size_t ws_bytes = 0;
    bool hit = false;
    pthread_mutex_lock(&lt_mu);
    if (lt_cache[slot].used && memcmp(&lt_cache[slot].key, &key, sizeof key) == 0) {
        algo = lt_cache[slot].algo;
        ws_bytes = lt_cache[slot].workspace;
        hit = true;
    }
    pthread_mutex_unlock(&lt_mu);
    if (!hit) {
        const uint64_t max_ws = LT_MAX_WORKSPACE;
        LT_TRY(lt->MatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
        LT_TRY(lt->MatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                    sizeof max_ws),
               "MAX_WORKSPACE_BYTES");
        /* split-K only with its partial sums kept in the compute type: the in-place and
         * output-type schemes store them in D's type, which would round a bf16/f16
         * result more than once */
        const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        LT_TRY(lt->MatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                    sizeof schemes),
               "REDUCTION_SCHEME_MASK");
        LT_TRY(lt->MatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a,
                                                    sizeof key.align_a),
               "MIN_ALIGNMENT_A_BYTES");
        LT_TRY(lt->MatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b,
                                                    sizeof key.align_b),
               "MIN_ALIGNMENT_B_BYTES");
        LT_TRY(lt->MatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_d,
                                                    sizeof key.align_d),
               "MIN_ALIGNMENT_C_BYTES");
        LT_TRY(lt->MatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_d,
                                                    sizeof key.align_d),
               "MIN_ALIGNMENT_D_BYTES");
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        memset(&res, 0, sizeof res);
        cublasStatus_t hs = lt->MatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.d, d.d, d.pref, 1, &res, &found);
        if (hs != CUBLAS_STATUS_NOT_SUPPORTED)
            LT_TRY(hs, "cublasLtMatmulAlgoGetHeuristic");
        /* CT_ERR_UNSUPPORTED, nothing queued: callers with another way (fused epilogue,
         * fp8) fall back to it */
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED || found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
            lt_descs_free(lt, &d);
            return ct_error_set(CT_ERR_UNSUPPORTED, "%s: cuBLASLt has no algorithm for %s on cuda:%d", op, what, dev);
        }
        algo = res.algo;
        ws_bytes = res.workspaceSize;
        pthread_mutex_lock(&lt_mu);
        lt_cache[slot].used = true;
        lt_cache[slot].key = key;
        lt_cache[slot].algo = algo;
        lt_cache[slot].workspace = ws_bytes;
        pthread_mutex_unlock(&lt_mu);
    }
    void *ws = NULL;
    if (ws_bytes > 0) {
        /* freed by the caller's frame; the caching allocator keeps it in stream order */
        const int64_t nb = (int64_t)ws_bytes;
        ct_tensor *w = ct_tensor_empty_on(CT_CUDA(dev), CT_DTYPE_U8, 1, &nb);
        if (!w) {
            lt_descs_free(lt, &d);
            return ct_last_status();
        }
        ws = ct_tensor_data(w);
    }
    LT_TRY(lt->Matmul(h, d.op, alpha, A, d.a, B, d.b, beta, D, d.d, D, d.d, &algo, ws, ws_bytes, s),
           "cublasLtMatmul");
    lt_descs_free(lt, &d);
    cti_cuda_note_op(op, dev, what);
    return CT_OK;
}
