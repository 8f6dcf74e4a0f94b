/* cuBLASLt, loaded when the first GPU matmul needs it (internal).
 *
 * Linking libcublasLt makes every process map and relocate it at start: about 146 MiB
 * resident on a machine with or without a GPU, in every rank of a CPU job too. So the
 * library is opened with dlopen on first use instead, and its entry points are called
 * through this table. C and CUDA C++ include it.
 */
#ifndef CT_CORE_CUBLASLT_LOADER_H
#define CT_CORE_CUBLASLT_LOADER_H

#ifdef CT_HAVE_CUDA
#include <cublasLt.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One pointer per cuBLASLt function ctrain calls, typed as the function is declared. */
typedef struct cti_cublaslt_api {
    __typeof__(cublasLtCreate) *Create;
    __typeof__(cublasLtGetStatusName) *GetStatusName;
    __typeof__(cublasLtGetStatusString) *GetStatusString;
    __typeof__(cublasLtMatmul) *Matmul;
    __typeof__(cublasLtMatmulAlgoGetHeuristic) *MatmulAlgoGetHeuristic;
    __typeof__(cublasLtMatmulDescCreate) *MatmulDescCreate;
    __typeof__(cublasLtMatmulDescDestroy) *MatmulDescDestroy;
    __typeof__(cublasLtMatmulDescSetAttribute) *MatmulDescSetAttribute;
    __typeof__(cublasLtMatmulPreferenceCreate) *MatmulPreferenceCreate;
    __typeof__(cublasLtMatmulPreferenceDestroy) *MatmulPreferenceDestroy;
    __typeof__(cublasLtMatmulPreferenceSetAttribute) *MatmulPreferenceSetAttribute;
    __typeof__(cublasLtMatrixLayoutCreate) *MatrixLayoutCreate;
    __typeof__(cublasLtMatrixLayoutDestroy) *MatrixLayoutDestroy;
    __typeof__(cublasLtMatrixLayoutSetAttribute) *MatrixLayoutSetAttribute;
} cti_cublaslt_api;

/* The table, the library opened on the first call (thread-safe; later calls return the
 * same table). NULL + CT_ERR_DEVICE naming the library, op and dlerror when it cannot be
 * opened or lacks a function. */
const cti_cublaslt_api *cti_cublaslt(const char *op);

/* Whether the library has been opened in this process (for tests: a CPU-only run never
 * opens it). */
int cti_cublaslt_loaded(void);

#ifdef __cplusplus
}
#endif
#endif /* CT_HAVE_CUDA */
#endif
