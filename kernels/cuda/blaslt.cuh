/* ctrain — one cuBLASLt GEMM call (internal to kernels/cuda).
 *
 * cuBLASLt is column-major: D (m, n) = alpha * op(A) @ op(B) + beta * C, C and D one
 * matrix here (in place when beta != 0). Callers with row-major tensors describe
 * C^T = B^T A^T (kernels/cuda/matmul.cu). A strided batch of `batch` GEMMs steps
 * each operand by its stride (0: the same matrix for every batch).
 *
 * cti_lt_matmul owns the per-device handle (made on first use), picks the algorithm
 * with cublasLtMatmulAlgoGetHeuristic and caches it by everything the heuristic
 * looks at (types, transposes, sizes, leading dims, batch, epilogue, the pointers'
 * alignment), and allocates the algorithm's workspace from the caching allocator
 * in the current frame (the caller holds a frame around the call).
 */
#ifndef CT_KERNELS_CUDA_BLASLT_CUH
#define CT_KERNELS_CUDA_BLASLT_CUH

#include <cublasLt.h>

#include "kernels/cuda/common.cuh"

typedef struct cti_lt_gemm {
    cudaDataType_t a_type, b_type, d_type; /* C has D's type */
    cublasComputeType_t compute;
    cudaDataType_t scale_type; /* alpha and beta point to this type */
    bool trans_a, trans_b;
    int64_t m, n, k;          /* op(A) (m, k), op(B) (k, n), D (m, n) */
    int64_t lda, ldb, ldd;    /* of the stored matrices */
    int32_t batch;            /* >= 1 */
    int64_t stride_a, stride_b, stride_d; /* elements between batches */
    cublasLtEpilogue_t epilogue;          /* CUBLASLT_EPILOGUE_DEFAULT, _BIAS, _GELU, _GELU_BIAS */
    const void *bias;                     /* m values of D's type for the bias epilogues */
    const float *a_scale, *b_scale;       /* fp8: device scalars multiplying A and B, or NULL */
} cti_lt_gemm;

/* Queues the GEMM on stream s of device dev (the current device). g is zeroed with
 * memset before its fields are set (its bytes, padding included, key the cache). op
 * names the caller in errors, what describes the operands ("a bf16[4, 8] cuda:0, ..."). */
ct_status cti_lt_matmul(int dev, cudaStream_t s, const cti_lt_gemm *g, const void *alpha, const void *A,
                        const void *B, const void *beta, void *D, const char *op, const char *what);

/* The compute capability of device dev (major * 10 + minor), cached. */
int cti_lt_capability(int dev);

#endif
