/* ctrain — how a reduction walks its input, shared by kernels/cpu/reduce.c and
 * kernels/cuda/reduce.cu (internal): the kept and the reduced dims of x, each list
 * in row-major order with runs that are contiguous in x merged into one dim, and
 * the number of outputs and of elements per output. Plain C, usable from CUDA C++. */
#ifndef CT_KERNELS_REDUCE_PLAN_H
#define CT_KERNELS_REDUCE_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/tensor.h"

typedef struct cti_red_plan {
    int nk, nr;
    int64_t kshape[CT_MAX_DIMS], kstride[CT_MAX_DIMS]; /* kept dims, x's strides */
    int64_t rshape[CT_MAX_DIMS], rstride[CT_MAX_DIMS]; /* reduced dims, x's strides */
    int64_t nout, nred;
} cti_red_plan;

static inline void cti_red_plan_init(cti_red_plan *pl, const ct_tensor *x, uint32_t mask)
{
    memset(pl, 0, sizeof *pl);
    pl->nout = pl->nred = 1;
    for (int d = 0; d < x->ndim; d++) {
        const int64_t n = x->shape[d], s = x->strides[d];
        const bool red = (mask >> d) & 1;
        if (red) pl->nred *= n;
        else pl->nout *= n;
        if (n == 1) continue;
        int *cnt = red ? &pl->nr : &pl->nk;
        int64_t *sh = red ? pl->rshape : pl->kshape, *st = red ? pl->rstride : pl->kstride;
        /* merging keeps the row-major order within each list, which is the
         * output order (kept) and the accumulation order (reduced) */
        if (*cnt > 0 && st[*cnt - 1] == s * n) {
            sh[*cnt - 1] *= n;
            st[*cnt - 1] = s;
        } else {
            sh[*cnt] = n;
            st[*cnt] = s;
            (*cnt)++;
        }
    }
}

#endif
