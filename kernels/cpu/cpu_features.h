/* ctrain — what the CPU can do, detected once at run time with cpuid.
 *
 * Kernels pick a code path from these flags (e.g. oneDNN's bf16 matmul only where
 * AVX512-BF16 or AMX-BF16 exist). A flag is set only when the CPU reports the
 * instructions AND the OS saves the register state they need (XCR0), so a flag
 * that is true can be used. On non-x86 builds every flag is false.
 */
#ifndef CT_KERNELS_CPU_CPU_FEATURES_H
#define CT_KERNELS_CPU_CPU_FEATURES_H

#include <stdbool.h>

typedef struct ct_cpu_features {
    bool avx, avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512_vnni;
    bool avx512_bf16; /* vdpbf16ps: bf16 dot products, f32 accumulation */
    bool avx512_fp16; /* native f16 arithmetic (Sapphire Rapids) */
    bool amx_tile, amx_int8, amx_bf16, amx_fp16;
} ct_cpu_features;

/* The flags of the machine we run on; detected on first call. Borrowed, never NULL. */
const ct_cpu_features *cti_cpu_features_get(void);
/* A bf16 GEMM with f32 accumulation runs in hardware: AVX512-BF16 or AMX-BF16. */
bool cti_cpu_has_bf16_gemm(void);
/* An f16 GEMM runs in hardware: AVX512-FP16 or AMX-FP16. */
bool cti_cpu_has_f16_gemm(void);
/* "avx avx2 fma f16c ..." (the flags that are set) into buf; returns buf. */
const char *cti_cpu_features_str(char *buf, int cap);

#endif
