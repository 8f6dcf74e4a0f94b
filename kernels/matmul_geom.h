/* ctrain — the geometry of a (batched) matmul as the device kernels see it, shared by
 * kernels/cpu/matmul.c and kernels/cuda/matmul.cu (internal): out's batch shape, M,
 * N, K, each input's batch strides aligned to out's (0 where it broadcasts) and the
 * element strides of op(a) (M, K) and op(b) (K, N); and how an operand goes to a
 * row-major GEMM (as is or transposed, with its leading dimension). Plain C, usable
 * from CUDA C++. */
#ifndef CT_KERNELS_MATMUL_GEOM_H
#define CT_KERNELS_MATMUL_GEOM_H

#include <stdbool.h>
#include <stdint.h>

#include "core/tensor.h"

typedef struct cti_mm_geom {
    int nb; /* batch dims of out */
    int64_t bshape[CT_MAX_DIMS];
    int64_t nbatch, M, N, K;
    int64_t as[CT_MAX_DIMS], bs[CT_MAX_DIMS]; /* batch strides aligned to out's, 0 where broadcast */
    int64_t ars, acs, brs, bcs;               /* op(a) (M, K) and op(b) (K, N) element strides */
} cti_mm_geom;

static inline void cti_mm_geom_init(cti_mm_geom *g, const ct_tensor *out, const ct_tensor *a, const ct_tensor *b, bool ta, bool tb)
{
    g->nb = out->ndim - 2;
    g->M = out->shape[g->nb];
    g->N = out->shape[g->nb + 1];
    g->K = a->shape[a->ndim - (ta ? 2 : 1)];
    g->nbatch = 1;
    for (int d = 0; d < g->nb; d++) {
        g->bshape[d] = out->shape[d];
        g->nbatch *= out->shape[d];
        int da = d - (g->nb - (a->ndim - 2)), db = d - (g->nb - (b->ndim - 2));
        g->as[d] = da >= 0 && a->shape[da] != 1 ? a->strides[da] : 0;
        g->bs[d] = db >= 0 && b->shape[db] != 1 ? b->strides[db] : 0;
    }
    const int64_t *s = a->strides + a->ndim - 2;
    g->ars = ta ? s[1] : s[0];
    g->acs = ta ? s[0] : s[1];
    s = b->strides + b->ndim - 2;
    g->brs = tb ? s[1] : s[0];
    g->bcs = tb ? s[0] : s[1];
}

/* Element offset of batch i (row-major over bshape) for batch strides bstr. */
static inline int64_t cti_mm_batch_offset(const cti_mm_geom *g, const int64_t *bstr, int64_t i)
{
    int64_t off = 0;
    for (int d = g->nb - 1; d >= 0; d--) {
        off += (i % g->bshape[d]) * bstr[d];
        i /= g->bshape[d];
    }
    return off;
}

static inline int64_t cti_mm_max64(int64_t x, int64_t y) { return x > y ? x : y; }

/* How a rows x cols matrix with element strides (rs, cs) goes to a row-major GEMM:
 * as is (trans = false, ld = row stride) or as the transpose of a row-major
 * (cols, rows) matrix (trans = true, ld = column stride). A stride along a dim of
 * size 1 is never used, so it does not matter. False when neither fits (column
 * slices with a step, expanded dims): the caller copies. */
static inline bool cti_mm_blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool *trans, int64_t *ld)
{
    if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= cti_mm_max64(cols, 1))) {
        *trans = false;
        *ld = rows <= 1 ? cti_mm_max64(cols, 1) : rs;
        return true;
    }
    if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= cti_mm_max64(rows, 1))) {
        *trans = true;
        *ld = cols <= 1 ? cti_mm_max64(rows, 1) : cs;
        return true;
    }
    return false;
}

#endif
