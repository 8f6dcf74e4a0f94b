#include "core/iter_internal.h"

#include <string.h>

void cti_iter_init(ct_iter *it, int ndim, const int64_t *shape, int nops,
                   const int64_t *const *strides)
{
    CT_ASSERT(nops >= 1 && nops <= CT_ITER_MAX_OPS && ndim >= 0 && ndim <= CT_MAX_DIMS);
    memset(it, 0, sizeof *it);
    it->nops = nops;
    /* drop size-1 dims, then merge dim d into d+1 where every operand has
     * stride[d] == stride[d+1] * shape[d+1] */
    int n = 0;
    int64_t sh[CT_MAX_DIMS], st[CT_ITER_MAX_OPS][CT_MAX_DIMS];
    bool empty = false;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 0) empty = true;
        if (shape[d] == 1) continue;
        sh[n] = shape[d];
        for (int k = 0; k < nops; k++) st[k][n] = strides[k][d];
        n++;
    }
    int m = 0;
    for (int d = 0; d < n; d++) {
        if (m > 0) {
            bool mergeable = true;
            for (int k = 0; k < nops; k++)
                if (st[k][m - 1] != st[k][d] * sh[d]) mergeable = false;
            if (mergeable) {
                sh[m - 1] *= sh[d];
                for (int k = 0; k < nops; k++) st[k][m - 1] = st[k][d];
                continue;
            }
        }
        sh[m] = sh[d];
        for (int k = 0; k < nops; k++) st[k][m] = st[k][d];
        m++;
    }
    if (empty) {
        it->inner = 0;
        it->nrows = 0;
        return;
    }
    if (m == 0) {
        it->inner = 1;
        it->nrows = 1;
        return;
    }
    it->inner = sh[m - 1];
    for (int k = 0; k < nops; k++) it->inner_stride[k] = st[k][m - 1];
    it->ndim = m - 1;
    it->nrows = 1;
    for (int d = 0; d < m - 1; d++) {
        it->shape[d] = sh[d];
        it->nrows *= sh[d];
        for (int k = 0; k < nops; k++) it->strides[k][d] = st[k][d];
    }
}

void cti_iter_row(const ct_iter *it, int64_t row, int64_t *offs)
{
    for (int k = 0; k < it->nops; k++) offs[k] = 0;
    for (int d = it->ndim - 1; d >= 0; d--) {
        int64_t i = row % it->shape[d];
        row /= it->shape[d];
        for (int k = 0; k < it->nops; k++) offs[k] += i * it->strides[k][d];
    }
}
