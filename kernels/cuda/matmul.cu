/* ctrain — CUDA matmul and linear through cuBLASLt (contract: kernels/cuda/matmul.h).
 *
 * Row-major tensors, column-major cuBLAS: out (M, N) row-major is D = out^T (N, M)
 * column-major, and out^T = op(b)^T op(a)^T, so b is cuBLAS's A and a its B. A
 * matrix whose columns (or rows) are unit-stride goes to cuBLASLt as is with its row
 * (column) stride as the leading dimension; any other layout is copied first, as the
 * CPU path does.
 *
 * Batches: the longest run of trailing batch dims over which both operands step by
 * one stride each (0 for a broadcast) is one strided-batched call; the leading batch
 * dims that do not fit it are looped over on the host (no copies of broadcast
 * operands).
 */
#include "kernels/cuda/blaslt.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/matmul_geom.h"

#include <stdio.h>
#include <string.h>

/* cuBLASLt's batch count is an int; smaller chunks keep every kernel's grid in range */
#define MM_MAX_BATCH 65535

/* True when batch dims [k, nb) step through one operand by a single stride: batch i
 * of that range sits at i * *stride. */
static bool suffix_uniform(const cti_mm_geom *g, const int64_t *bstr, int k, int64_t *stride)
{
    int64_t s = 0, after = 1; /* after: the number of batches of the dims inside d */
    bool have = false;
    for (int d = g->nb - 1; d >= k; d--) {
        if (g->bshape[d] != 1) {
            if (!have) {
                s = bstr[d]; /* every dim inside is 1, so after == 1 here */
                have = true;
            } else if (bstr[d] != s * after) {
                return false;
            }
        }
        after *= g->bshape[d];
    }
    *stride = s;
    return true;
}

static bool lt_types(ct_dtype in, ct_dtype out, cudaDataType_t *ti, cudaDataType_t *to, cublasComputeType_t *ct,
                     cudaDataType_t *st)
{
    static const struct {
        ct_dtype dt;
        cudaDataType_t cu;
    } map[] = {{CT_DTYPE_F32, CUDA_R_32F}, {CT_DTYPE_F64, CUDA_R_64F}, {CT_DTYPE_BF16, CUDA_R_16BF},
               {CT_DTYPE_F16, CUDA_R_16F}};
    bool fi = false, fo = false;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (map[i].dt == in) *ti = map[i].cu, fi = true;
        if (map[i].dt == out) *to = map[i].cu, fo = true;
    }
    if (!fi || !fo) return false;
    if (in == CT_DTYPE_F64) {
        *ct = CUBLAS_COMPUTE_64F;
        *st = CUDA_R_64F;
    } else {
        /* bf16/f16 accumulate in f32 (pedantic: no f16 accumulation); f32 may use TF32 */
        *ct = in == CT_DTYPE_F32 && ct_cuda_allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        *st = CUDA_R_32F;
    }
    return true;
}

// out (n) = beta * out, the K = 0 case (beta != 0, 1).
template <typename T> __global__ void mm_scale_kernel(T *p, int64_t n, double beta)
{
    typedef typename cti_acc<T>::type A;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        st<T>(p + i, (A)((A)beta * ld<T>(p + i)));
}

/* M = 0, N = 0 or an empty batch: nothing to do. K = 0: op(a) @ op(b) is all zeros,
 * so out = beta * out. True when handled (*st set). */
static bool mm_trivial(ct_tensor *out, const cti_mm_geom *g, double beta, ct_status *st)
{
    *st = CT_OK;
    if (g->M == 0 || g->N == 0 || g->nbatch == 0) return true;
    if (g->K != 0) return false;
    const int64_t n = ct_tensor_numel(out);
    cudaStream_t s = cti_cu_stream(out);
    if (beta == 0) {
        /* all-zero bits are +0 in every float dtype */
        *st = cti_cuda_check((int)cudaMemsetAsync(ct_tensor_data(out), 0, ct_tensor_nbytes(out), s), "matmul",
                             out->device.index, "zeroing out for K = 0");
        return true;
    }
    if (beta == 1) return true;
    CTI_CU_DISPATCH_FLOAT(out->dtype, T, {
        mm_scale_kernel<T><<<cti_cu_blocks(n, 256), 256, 0, s>>>(cti_cu_ptr<T>(out), n, beta);
        *st = cti_cuda_launched("matmul", out);
    })
    return true;
}

static void mm_describe(char *w, size_t cap, const ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta,
                        bool tb)
{
    char da[200], db[200], d0[200];
    snprintf(w, cap, "a %s%s @ b %s%s -> out %s", ct_tensor_describe(a, da, sizeof da), ta ? " (transposed)" : "",
             ct_tensor_describe(b, db, sizeof db), tb ? " (transposed)" : "", ct_tensor_describe(out, d0, sizeof d0));
}

/* Queues the cuBLASLt calls of out = alpha op(a) op(b) + beta out (+ epilogue);
 * *queued counts the calls queued before a failure. */
static ct_status mm_queue(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, double alpha,
                          double beta, cublasLtEpilogue_t epi, const ct_tensor *bias, const char *op,
                          const char *what, int64_t *queued)
{
    const int dev = out->device.index;
    ct_status st = CT_OK;
    cti_mm_geom g;
    cti_mm_geom_init(&g, out, a, b, ta, tb);
    bool at, bt;
    int64_t lda, ldb;
    if (!cti_mm_blas_layout(g.M, g.K, g.ars, g.acs, &at, &lda)) {
        if (!(a = ct_tensor_contiguous((ct_tensor *)a))) return ct_last_status();
        cti_mm_geom_init(&g, out, a, b, ta, tb);
        CT_ASSERT(cti_mm_blas_layout(g.M, g.K, g.ars, g.acs, &at, &lda));
    }
    if (!cti_mm_blas_layout(g.K, g.N, g.brs, g.bcs, &bt, &ldb)) {
        if (!(b = ct_tensor_contiguous((ct_tensor *)b))) return ct_last_status();
        cti_mm_geom_init(&g, out, a, b, ta, tb);
        CT_ASSERT(cti_mm_blas_layout(g.K, g.N, g.brs, g.bcs, &bt, &ldb));
    }
    cti_lt_gemm lg;
    memset(&lg, 0, sizeof lg);
    if (!lt_types(a->dtype, out->dtype, &lg.b_type, &lg.d_type, &lg.compute, &lg.scale_type))
        return ct_error_set(CT_ERR_INVALID, "%s: no cuBLASLt types for %s", op, what);
    lg.a_type = lg.b_type;
    /* cuBLAS A = b: op(A) = op(b)^T (N, K); cuBLAS B = a: op(B) = op(a)^T (K, M) */
    lg.trans_a = bt;
    lg.trans_b = at;
    lg.m = g.N;
    lg.n = g.M;
    lg.k = g.K;
    lg.lda = ldb;
    lg.ldb = lda;
    lg.ldd = g.N;
    lg.epilogue = epi;
    lg.bias = bias ? ct_tensor_data(bias) : NULL;

    /* split the batch dims: [0, k) looped here, [k, nb) strided inside cuBLASLt */
    int k = 0;
    int64_t sa = 0, sb = 0;
    while (!(suffix_uniform(&g, g.as, k, &sa) && suffix_uniform(&g, g.bs, k, &sb))) k++;
    int64_t inner = 1, outer = 1;
    for (int d = 0; d < g.nb; d++) (d < k ? outer : inner) *= g.bshape[d];
    lg.stride_a = sb;
    lg.stride_b = sa;
    lg.stride_d = g.M * g.N;

    const size_t es_in = ct_dtype_size(a->dtype), es_out = ct_dtype_size(out->dtype);
    const char *ap = (const char *)ct_tensor_data(a), *bp = (const char *)ct_tensor_data(b);
    char *op_ = (char *)ct_tensor_data(out);
    float alpha32 = (float)alpha, beta32 = (float)beta;
    const void *pa = lg.scale_type == CUDA_R_64F ? (const void *)&alpha : (const void *)&alpha32;
    const void *pb = lg.scale_type == CUDA_R_64F ? (const void *)&beta : (const void *)&beta32;
    cudaStream_t s = cti_cu_stream(out);
    for (int64_t o = 0; o < outer; o++) {
        int64_t ao = 0, bo = 0, rem = o;
        for (int d = k - 1; d >= 0; d--) {
            const int64_t idx = rem % g.bshape[d];
            rem /= g.bshape[d];
            ao += idx * g.as[d];
            bo += idx * g.bs[d];
        }
        for (int64_t c = 0; c < inner; c += MM_MAX_BATCH) {
            const int64_t cnt = inner - c < MM_MAX_BATCH ? inner - c : MM_MAX_BATCH;
            lg.batch = (int32_t)cnt;
            const char *A = bp + (size_t)(bo + c * sb) * es_in, *B = ap + (size_t)(ao + c * sa) * es_in;
            char *D = op_ + (size_t)((o * inner + c) * g.M * g.N) * es_out;
            st = cti_lt_matmul(dev, s, &lg, pa, A, B, pb, D, op, what);
            if (st) return st;
            (*queued)++;
        }
    }
    return CT_OK;
}

/* out = alpha op(a) op(b) + beta out with an epilogue (bias: out's last dim long).
 * Inside a frame of the caller: contiguous copies and workspaces die with it. */
static ct_status mm_run(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, double alpha,
                        double beta, cublasLtEpilogue_t epi, const ct_tensor *bias, const char *op)
{
    ct_status st = cti_cuda_enter(out->device.index, op);
    if (st) return st;
    cti_mm_geom g;
    cti_mm_geom_init(&g, out, a, b, ta, tb);
    if (epi == CUBLASLT_EPILOGUE_DEFAULT && mm_trivial(out, &g, beta, &st)) return st;
    char what[700];
    mm_describe(what, sizeof what, out, a, b, ta, tb);
    int64_t queued = 0;
    st = mm_queue(out, a, b, ta, tb, alpha, beta, epi, bias, op, what, &queued);
    if (st != CT_ERR_UNSUPPORTED || queued > 0 || epi != CUBLASLT_EPILOGUE_DEFAULT) return st;
    /* no algorithm for these pointers' alignment or strides: once more on fresh
     * (256-byte aligned, contiguous) copies of both operands; nothing was queued yet */
    ct_error_clear();
    const ct_tensor *a2 = ct_tensor_clone(a), *b2 = a2 ? ct_tensor_clone(b) : NULL;
    if (!b2) return ct_last_status();
    return mm_queue(out, a2, b2, ta, tb, alpha, beta, epi, bias, op, what, &queued);
}

extern "C" ct_status cti_cuda_matmul(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                                     bool trans_b, double alpha, double beta)
{
    ct_frame_push(); /* contiguous copies and workspaces die here (stream-ordered reuse) */
    ct_status st = mm_run(out, a, b, trans_a, trans_b, alpha, beta, CUBLASLT_EPILOGUE_DEFAULT, NULL, "matmul");
    ct_frame_pop();
    return st;
}

/* ---- linear ------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define GELU_C 0.044715

/* kernels/cpu/unary.c's GELU-tanh: x sigmoid(2u) = x / (1 + exp(-2u)), u = k (x + c x^3) */
__device__ __forceinline__ float lin_gelu(float x)
{
    return x / (1.0f + expf((float)(-2.0 * GELU_K) * fmaf((float)GELU_C * x * x, x, x)));
}

__device__ __forceinline__ double lin_gelu(double x)
{
    const double z = 2.0 * (GELU_K * (x + GELU_C * x * x * x));
    const double e = exp(-fabs(z)), s = 1.0 / (1.0 + e);
    return x * (z >= 0.0 ? s : e * s);
}

// y (R, O) in place: y = gelu?(y + bias), bias (O) or NULL; in y's compute type, stored once.
template <typename T>
__global__ void lin_epilogue_kernel(T *y, const T *bias, int64_t n, int64_t O, bool gelu)
{
    typedef typename cti_acc<T>::type A;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        A v = ld<T>(y + i);
        if (bias) v = v + ld<T>(bias + i % O);
        if (gelu) v = lin_gelu(v);
        st<T>(y + i, v);
    }
}

static ct_status lin_epilogue(ct_tensor *y, const ct_tensor *bias, bool gelu)
{
    const int64_t n = ct_tensor_numel(y), O = y->shape[1];
    if (n == 0 || (!bias && !gelu)) return CT_OK;
    cudaStream_t s = cti_cu_stream(y);
    CTI_CU_DISPATCH_FLOAT(y->dtype, T, {
        lin_epilogue_kernel<T><<<cti_cu_blocks(n, 256), 256, 0, s>>>(cti_cu_ptr<T>(y),
                                                                     bias ? cti_cu_ptr<T>(bias) : NULL, n, O, gelu);
        return cti_cuda_launched("linear", y);
    })
    return ct_error_set(CT_ERR_INVALID, "linear: no CUDA epilogue for %s", ct_dtype_name(y->dtype));
}

static ct_status lin_run(ct_tensor *y, const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias, bool gelu)
{
    const int64_t R = y->shape[0], O = y->shape[1], I = x->shape[1];
    if (R == 0 || O == 0) return CT_OK;
    const bool low = y->dtype == CT_DTYPE_BF16 || y->dtype == CT_DTYPE_F16;
    if (I > 0 && y->dtype != CT_DTYPE_F64) {
        /* bf16/f16: bias and GELU on the f32 accumulator; f32: the bias there, and the
         * GELU after in full f32 precision (the epilogue's own GELU is an approximation
         * meant for 16-bit outputs) */
        cublasLtEpilogue_t epi = bias ? (gelu && low ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                      : (gelu && low ? CUBLASLT_EPILOGUE_GELU : CUBLASLT_EPILOGUE_DEFAULT);
        ct_status st = mm_run(y, x, w, false, false, 1.0, 0.0, epi, bias, "linear");
        if (st == CT_OK) return gelu && !low ? lin_epilogue(y, NULL, true) : CT_OK;
        if (st != CT_ERR_UNSUPPORTED) return st;
        ct_error_clear(); /* no algorithm with that epilogue here: the plain GEMM and our own epilogue */
    }
    ct_status st = mm_run(y, x, w, false, false, 1.0, 0.0, CUBLASLT_EPILOGUE_DEFAULT, NULL, "linear");
    return st ? st : lin_epilogue(y, bias, gelu);
}

extern "C" ct_status cti_cuda_linear(ct_tensor *y, const ct_tensor *x, const ct_tensor *w, const ct_tensor *bias,
                                     bool gelu)
{
    ct_frame_push();
    ct_status st = lin_run(y, x, w, bias, gelu);
    ct_frame_pop();
    return st;
}
