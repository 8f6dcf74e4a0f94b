/* ctrain — strided N-d iteration shared by copies and elementwise kernels.
 *
 * Up to CT_ITER_MAX_OPS operands with the same logical shape but their own
 * strides (0 on broadcast dims) are walked as rows: the innermost dimension is
 * a row of `inner` elements, the outer dims are enumerated by a flat row index
 * so a parallel loop can split rows between threads. Dimensions of size 1 are
 * dropped and adjacent dimensions that are contiguous in every operand are
 * merged, so a contiguous tensor is one long row.
 */
#ifndef CT_CORE_ITER_INTERNAL_H
#define CT_CORE_ITER_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdint.h>

#include "core/tensor.h"

#define CT_ITER_MAX_OPS 4

typedef struct ct_iter {
    int nops;
    int ndim; /* outer dims (excluding the inner one) */
    int64_t shape[CT_MAX_DIMS];
    int64_t strides[CT_ITER_MAX_OPS][CT_MAX_DIMS];
    int64_t inner;                          /* elements per row */
    int64_t inner_stride[CT_ITER_MAX_OPS];  /* element stride along the row */
    int64_t nrows;
} ct_iter;

/* strides[k] are operand k's strides for the ndim-d shape. */
void cti_iter_init(ct_iter *it, int ndim, const int64_t *shape, int nops,
                   const int64_t *const *strides);
/* Element offsets (relative to each operand's first element) of row r's start. */
void cti_iter_row(const ct_iter *it, int64_t row, int64_t *offs);

#ifdef __cplusplus
}
#endif

#endif
