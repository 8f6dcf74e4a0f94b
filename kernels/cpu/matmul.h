/* ctrain — CPU matmul: library GEMMs behind one strided, batched interface.
 *
 * out (B..., M, N) = alpha * op(a) @ op(b) + beta * out, a (A..., M, K) or (A..., K, M)
 * with trans_a, b (B'..., K, N) or (B'..., N, K) with trans_b; batch dims broadcast.
 * The caller (kernels/matmul.c) has checked shapes and dtypes: a and b share one
 * dtype, out has it too, out is contiguous with the broadcast shape. beta = 0 never
 * reads out.
 *
 * Library per dtype ("backend"), chosen at run time:
 *   f32   oneDNN dnnl_sgemm where the CPU has AVX-512, else OpenBLAS cblas_sgemm
 *                                                          env CTRAIN_SGEMM=openblas|onednn
 *   f64   OpenBLAS cblas_dgemm
 *   bf16  oneDNN matmul primitive (bf16 in, f32 accumulation) where the CPU has
 *         AVX512-BF16 or AMX-BF16, else convert to f32 + sgemm + round
 *                                                          env CTRAIN_BF16_GEMM=onednn|convert
 *   f16   the same with AVX512-FP16 / AMX-FP16            env CTRAIN_F16_GEMM=onednn|convert
 * Forcing onednn for bf16/f16 on a CPU where oneDNN has no such kernel makes matmul
 * fail with CT_ERR_UNSUPPORTED and a message saying so (oneDNN 2.6 refuses bf16
 * below AVX512); it never falls back silently once forced.
 * Every library call first applies ct_get_num_threads() (OpenBLAS's own pool and
 * oneDNN's OpenMP), so the libraries and ctrain's loops share one thread count.
 */
#ifndef CT_KERNELS_CPU_MATMUL_H
#define CT_KERNELS_CPU_MATMUL_H

#include <stdbool.h>

#include "core/tensor.h"

typedef ct_status (*ct_matmul_fn)(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                                  bool trans_b, double alpha, double beta);

/* Fast path: the backend selected for out's dtype. */
ct_status cti_cpu_matmul(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b,
                         double alpha, double beta);
/* Reference: triple loop over the strided inputs, any dtype read with
 * ct_scalar_load, sums in double, stored once with ct_scalar_store. out may be strided. */
ct_status cti_cpu_matmul_ref(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                             bool trans_b, double alpha, double beta);
/* The oneDNN matmul primitive path on its own (f32, bf16, f16), whatever the
 * backend setting: tests run it in f32 on any CPU to check its layouts, strides and
 * broadcasting. CT_ERR_UNSUPPORTED when oneDNN has no kernel for the dtype here. */
ct_status cti_cpu_matmul_onednn(ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool trans_a,
                                bool trans_b, double alpha, double beta);

typedef enum ct_gemm_backend {
    CT_GEMM_DEFAULT = 0, /* env variable if set, else the measured/CPU-based default */
    CT_GEMM_OPENBLAS,    /* f32, f64 */
    CT_GEMM_ONEDNN,      /* f32 (dnnl_sgemm), bf16, f16 (matmul primitive) */
    CT_GEMM_CONVERT,     /* bf16, f16: widen to f32, sgemm, round */
} ct_gemm_backend;

/* Overrides the backend for one dtype in this process (CT_GEMM_DEFAULT restores the
 * env/default choice). CT_ERR_INVALID for a combination that does not exist. */
ct_status cti_cpu_matmul_set_backend(ct_dtype dt, ct_gemm_backend be);
/* The backend a matmul of dtype dt uses now (never CT_GEMM_DEFAULT; CT_GEMM_DEFAULT
 * for a dtype matmul does not take, or when the env variable holds a bad value). */
ct_gemm_backend cti_cpu_matmul_backend(ct_dtype dt);
/* "openblas", "onednn", "convert", "default". */
const char *cti_gemm_backend_name(ct_gemm_backend be);

#endif
