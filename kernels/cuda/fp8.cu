/* ctrain — CUDA fp8: quantisation with amax, and the fp8 GEMM (contract:
 * kernels/cuda/fp8.h; the rules: precision/fp8.h).
 *
 * Quantise: q = sat(round(x * scale)), the f32 product rounded once more to the
 * format with the shared bit conversion the CPU uses (core/convert_bits.h), so q is
 * bit-for-bit the CPU's. amax = max |x| is a max over the bits of |x|: for
 * non-negative floats the unsigned order of the bits is the numeric order and every
 * NaN sorts above +inf, so the max is NaN exactly when x holds a NaN (the CPU's rule)
 * and the reduction is exact and order-free.
 *
 * GEMM: cuBLASLt's fp8 kernels take only the "TN" layout (in column-major terms A
 * transposed, B not): for row-major out (M, N) = a' (M, K) @ b'^T, with a' = op(a)
 * and b' = op(b)^T stored (N, K), both contiguous, D = out^T = b' a'^T, i.e. cuBLAS
 * A = b' (K x N column-major, transposed) and B = a' (K x M column-major). The
 * per-tensor scales go in as cuBLASLt's A and B scale pointers (device scalars
 * 1 / scale), so the fp8 kernels dequantise on the accumulator; the fallback takes
 * alpha = 1 / (a.scale * b.scale) instead.
 */
#include "kernels/cuda/blaslt.cuh"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/matmul.h"

#include <string.h>

#define Q_THREADS 256
#define Q_MAX_BLOCKS 1024

template <typename Q> __device__ __forceinline__ uint8_t fp8_bits(float y);
template <> __device__ __forceinline__ uint8_t fp8_bits<cti_e4m3>(float y) { return cti_f32_to_e4m3_bits(y, true); }
template <> __device__ __forceinline__ uint8_t fp8_bits<cti_e5m2>(float y) { return cti_f32_to_e5m2_bits(y, true); }

// x (n) -> q (n) = sat(round_fp8(x * scale)); partial[blockIdx.x] = max over the block's |x| bits.
template <typename T, typename Q>
__global__ void fp8_quant_kernel(uint8_t *q, const T *x, int64_t n, float scale, unsigned *partial)
{
    __shared__ unsigned scratch[32];
    unsigned m = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = ld<T>(x + i); /* exact */
        const unsigned b = __float_as_uint(fabsf(v));
        m = b > m ? b : m;
        q[i] = fp8_bits<Q>(__fmul_rn(v, scale));
    }
    m = cti_block_max(m, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// partial (nparts) -> *out = their max; one block.
__global__ void fp8_amax_kernel(const unsigned *partial, int nparts, unsigned *out)
{
    __shared__ unsigned scratch[32];
    unsigned m = 0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) m = partial[i] > m ? partial[i] : m;
    m = cti_block_max(m, scratch);
    if (threadIdx.x == 0) *out = m;
}

// The reference: one thread per element, amax by an integer atomicMax on the bits of |x|.
template <typename T, typename Q>
__global__ void fp8_quant_ref_kernel(uint8_t *q, const T *x, int64_t n, float scale, unsigned *amax)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = ld<T>(x + i);
        atomicMax(amax, __float_as_uint(fabsf(v)));
        const float y = v * scale;
        q[i] = fp8_bits<Q>(y);
    }
}

/* Runs the quantisation kernels for x's dtype T and out's format. */
template <typename T>
static void fp8_quant_launch(bool ref, ct_dtype dt, uint8_t *q, const T *x, int64_t n, float scale, unsigned *scratch,
                             int nblocks, cudaStream_t s)
{
    const bool e4 = dt == CT_DTYPE_F8_E4M3;
    if (ref) {
        if (e4) fp8_quant_ref_kernel<T, cti_e4m3><<<cti_cu_blocks(n, Q_THREADS), Q_THREADS, 0, s>>>(q, x, n, scale, scratch);
        else fp8_quant_ref_kernel<T, cti_e5m2><<<cti_cu_blocks(n, Q_THREADS), Q_THREADS, 0, s>>>(q, x, n, scale, scratch);
        return;
    }
    if (e4) fp8_quant_kernel<T, cti_e4m3><<<nblocks, Q_THREADS, 0, s>>>(q, x, n, scale, scratch);
    else fp8_quant_kernel<T, cti_e5m2><<<nblocks, Q_THREADS, 0, s>>>(q, x, n, scale, scratch);
}

static ct_status fp8_quantize(bool ref, ct_tensor *out, const ct_tensor *x, float scale, float *amax)
{
    const char *op = ref ? "fp8_quantize_ref" : "fp8_quantize";
    const int dev = x->device.index;
    ct_status st = cti_cuda_enter(dev, op);
    if (st) return st;
    const int64_t n = ct_tensor_numel(x);
    if (n == 0) {
        *amax = 0.0f;
        return CT_OK;
    }
    int64_t nb = (n + Q_THREADS - 1) / Q_THREADS;
    const int nblocks = (int)(nb < Q_MAX_BLOCKS ? nb : Q_MAX_BLOCKS);
    /* the fast path's per-block maxima and the result; the reference's one counter */
    const int64_t ns = ref ? 1 : nblocks + 1;
    ct_tensor *scr = ct_tensor_empty_on(x->device, CT_DTYPE_I32, 1, &ns);
    if (!scr) return ct_last_status();
    unsigned *sp = (unsigned *)ct_tensor_data(scr), *res = ref ? sp : sp + nblocks;
    cudaStream_t s = cti_cu_stream(x);
    if (ref && (st = cti_cuda_check((int)cudaMemsetAsync(sp, 0, sizeof(unsigned), s), op, dev, "zeroing amax")))
        return st;
    uint8_t *q = (uint8_t *)ct_tensor_data(out);
    if (x->dtype == CT_DTYPE_F32) fp8_quant_launch<float>(ref, out->dtype, q, cti_cu_ptr<float>(x), n, scale, sp, nblocks, s);
    else if (x->dtype == CT_DTYPE_BF16) fp8_quant_launch<cti_bf16>(ref, out->dtype, q, cti_cu_ptr<cti_bf16>(x), n, scale, sp, nblocks, s);
    else if (x->dtype == CT_DTYPE_F16) fp8_quant_launch<cti_f16>(ref, out->dtype, q, cti_cu_ptr<cti_f16>(x), n, scale, sp, nblocks, s);
    else return ct_error_set(CT_ERR_INVALID, "%s: x must be f32, bf16 or f16, got %s", op, ct_dtype_name(x->dtype));
    if ((st = cti_cuda_launched(op, out))) return st;
    if (!ref) {
        fp8_amax_kernel<<<1, 1024, 0, s>>>(sp, nblocks, res);
        if ((st = cti_cuda_launched(op, out))) return st;
    }
    unsigned bits = 0;
    if ((st = cti_cuda_copy_host(dev, &bits, res, sizeof bits, 1, s, op))) return st;
    memcpy(amax, &bits, sizeof bits);
    return CT_OK;
}

extern "C" ct_status cti_cuda_fp8_quantize(ct_tensor *out, const ct_tensor *x, float scale, float *amax)
{
    ct_frame_push();
    ct_status st = fp8_quantize(false, out, x, scale, amax);
    ct_frame_pop();
    return st;
}

extern "C" ct_status cti_cuda_fp8_quantize_ref(ct_tensor *out, const ct_tensor *x, float scale, float *amax)
{
    ct_frame_push();
    ct_status st = fp8_quantize(true, out, x, scale, amax);
    ct_frame_pop();
    return st;
}

/* ---- GEMM ------------------------------------------------------------------------------ */

// out (M, N) = (sum_k op(a)[m, k] op(b)[k, n], in f32 in k order) * inv.
template <typename QA, typename QB>
__global__ void fp8_mm_ref_kernel(float *out, const QA *a, const QB *b, int64_t M, int64_t N, int64_t K, int64_t a_m,
                                  int64_t a_k, int64_t b_k, int64_t b_n, float inv)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * N; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / N, n = i % N;
        float s = 0.0f;
        for (int64_t k = 0; k < K; k++) s += ld<QA>(a + m * a_m + k * a_k) * ld<QB>(b + k * b_k + n * b_n); /* exact products */
        out[i] = s * inv;
    }
}

template <typename QA>
static void fp8_mm_ref_launch(float *o, const QA *a, const ct_tensor *b, int64_t M, int64_t N, int64_t K, int64_t a_m,
                              int64_t a_k, int64_t b_k, int64_t b_n, float inv, cudaStream_t s)
{
    const unsigned blocks = cti_cu_blocks(M * N, 128);
    if (b->dtype == CT_DTYPE_F8_E4M3)
        fp8_mm_ref_kernel<QA, cti_e4m3><<<blocks, 128, 0, s>>>(o, a, cti_cu_ptr<cti_e4m3>(b), M, N, K, a_m, a_k, b_k, b_n, inv);
    else
        fp8_mm_ref_kernel<QA, cti_e5m2><<<blocks, 128, 0, s>>>(o, a, cti_cu_ptr<cti_e5m2>(b), M, N, K, a_m, a_k, b_k, b_n, inv);
}

extern "C" ct_status cti_cuda_fp8_matmul_ref(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                                             bool trans_b)
{
    ct_status st = cti_cuda_enter(out->device.index, "fp8_matmul_ref");
    if (st) return st;
    const int64_t M = out->shape[0], N = out->shape[1], K = trans_a ? a->shape[0] : a->shape[1];
    if (M * N == 0) return CT_OK;
    const int64_t a_m = trans_a ? a->strides[1] : a->strides[0], a_k = trans_a ? a->strides[0] : a->strides[1];
    const int64_t b_k = trans_b ? b->strides[1] : b->strides[0], b_n = trans_b ? b->strides[0] : b->strides[1];
    const float inv = 1.0f / (a->scale * b->scale); /* as ct_fp8_matmul_ref: f32 product, f32 quotient */
    cudaStream_t s = cti_cu_stream(out);
    float *o = cti_cu_ptr<float>(out);
    if (a->dtype == CT_DTYPE_F8_E4M3)
        fp8_mm_ref_launch<cti_e4m3>(o, cti_cu_ptr<cti_e4m3>(a), b, M, N, K, a_m, a_k, b_k, b_n, inv, s);
    else
        fp8_mm_ref_launch<cti_e5m2>(o, cti_cu_ptr<cti_e5m2>(a), b, M, N, K, a_m, a_k, b_k, b_n, inv, s);
    return cti_cuda_launched("fp8_matmul_ref", out);
}

// src (n) fp8 -> dst (n) bf16, exact (3 or 2 mantissa bits fit in bf16's 7).
template <typename Q> __global__ void fp8_widen_kernel(cti_bf16 *dst, const Q *src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        st<cti_bf16>(dst + i, ld<Q>(src + i));
}

/* t (fp8, 2-D) as a new contiguous bf16 tensor of its shape, in the current frame. */
static ct_tensor *fp8_widen(const ct_tensor *t)
{
    ct_tensor *c = ct_tensor_contiguous((ct_tensor *)t);
    ct_tensor *w = c ? ct_tensor_empty_on(t->device, CT_DTYPE_BF16, t->ndim, t->shape) : NULL;
    if (!w) return NULL;
    const int64_t n = ct_tensor_numel(t);
    if (n == 0) return w;
    cudaStream_t s = cti_cu_stream(t);
    if (t->dtype == CT_DTYPE_F8_E4M3)
        fp8_widen_kernel<cti_e4m3><<<cti_cu_blocks(n, 256), 256, 0, s>>>(cti_cu_ptr<cti_bf16>(w), cti_cu_ptr<cti_e4m3>(c), n);
    else
        fp8_widen_kernel<cti_e5m2><<<cti_cu_blocks(n, 256), 256, 0, s>>>(cti_cu_ptr<cti_bf16>(w), cti_cu_ptr<cti_e5m2>(c), n);
    return cti_cuda_launched("fp8_matmul", w) ? NULL : w;
}

/* The cuBLASLt fp8 GEMM; CT_ERR_UNSUPPORTED (nothing queued) when this GPU or these
 * sizes and formats cannot take it. */
static ct_status fp8_mm_lt(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb)
{
    const int dev = out->device.index;
    const int64_t M = out->shape[0], N = out->shape[1], K = ta ? a->shape[0] : a->shape[1];
    const bool both_e5m2 = a->dtype == CT_DTYPE_F8_E5M2 && b->dtype == CT_DTYPE_F8_E5M2;
    if (cti_lt_capability(dev) < 89 || both_e5m2 || M % 16 || N % 16 || K % 16 || K == 0)
        return CT_ERR_UNSUPPORTED;
    /* a' = op(a) (M, K) and b' = op(b)^T (N, K), both contiguous (copies when not) */
    ct_tensor *a2 = ta ? ct_tensor_contiguous(ct_tensor_transpose((ct_tensor *)a, 0, 1))
                       : ct_tensor_contiguous((ct_tensor *)a);
    ct_tensor *b2 = tb ? ct_tensor_contiguous((ct_tensor *)b)
                       : ct_tensor_contiguous(ct_tensor_transpose((ct_tensor *)b, 0, 1));
    if (!a2 || !b2) return ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    /* the dequantising factors 1/scale as device scalars (filled on the stream, no host
     * wait): cuBLASLt multiplies the f32 accumulator by a_scale * b_scale * alpha */
    const int64_t one = 1;
    ct_tensor *inv_a = ct_tensor_empty_on(out->device, CT_DTYPE_F32, 1, &one);
    ct_tensor *inv_b = inv_a ? ct_tensor_empty_on(out->device, CT_DTYPE_F32, 1, &one) : NULL;
    if (!inv_b || ct_tensor_fill_(inv_a, 1.0 / a->scale) || ct_tensor_fill_(inv_b, 1.0 / b->scale))
        return ct_last_status() ? ct_last_status() : CT_ERR_INTERNAL;
    cti_lt_gemm g;
    memset(&g, 0, sizeof g);
    g.a_type = b->dtype == CT_DTYPE_F8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    g.b_type = a->dtype == CT_DTYPE_F8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    g.d_type = CUDA_R_32F;
    g.compute = CUBLAS_COMPUTE_32F;
    g.scale_type = CUDA_R_32F;
    g.trans_a = true; /* A = b' stored K x N (column-major): op(A) (N, K) */
    g.trans_b = false; /* B = a' stored K x M: op(B) (K, M) */
    g.m = N;
    g.n = M;
    g.k = K;
    g.lda = K;
    g.ldb = K;
    g.ldd = N;
    g.batch = 1;
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.a_scale = (const float *)ct_tensor_data(inv_b); /* cuBLAS A is b' */
    g.b_scale = (const float *)ct_tensor_data(inv_a);
    const float alpha = 1.0f, beta = 0.0f;
    char da[200], db[200], what[500];
    snprintf(what, sizeof what, "a %s%s @ b %s%s (fp8 GEMM)", ct_tensor_describe(a, da, sizeof da),
             ta ? " (transposed)" : "", ct_tensor_describe(b, db, sizeof db), tb ? " (transposed)" : "");
    return cti_lt_matmul(dev, cti_cu_stream(out), &g, &alpha, ct_tensor_data(b2), ct_tensor_data(a2), &beta,
                         ct_tensor_data(out), "fp8_matmul", what);
}

static ct_status fp8_mm(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb)
{
    ct_status st = cti_cuda_enter(out->device.index, "fp8_matmul");
    if (st) return st;
    st = fp8_mm_lt(out, a, b, ta, tb);
    if (st != CT_ERR_UNSUPPORTED) return st;
    ct_error_clear(); /* no fp8 kernel for this case: the exact widening to bf16 and the bf16 GEMM */
    ct_tensor *aw = fp8_widen(a), *bw = aw ? fp8_widen(b) : NULL;
    if (!bw) return ct_last_status();
    return cti_cuda_matmul(out, aw, bw, ta, tb, 1.0 / ((double)a->scale * b->scale), 0.0);
}

extern "C" ct_status cti_cuda_fp8_matmul(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                                         bool trans_b)
{
    ct_frame_push();
    ct_status st = fp8_mm(out, a, b, trans_a, trans_b);
    ct_frame_pop();
    return st;
}
