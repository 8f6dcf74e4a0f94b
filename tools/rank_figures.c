/* Figures combined over ranks (tools/rank_figures.h). */
#include "tools/rank_figures.h"

#include <string.h>

#include "core/frame.h"
#include "core/tensor.h"

ct_status ct_rank_figures_reduce(ct_pg *pg, double *v, int n, ct_reduce_op op)
{
    if (!pg || ct_pg_size(pg) <= 1) return CT_OK;
    ct_status st = CT_OK;
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(n), v);
        ct_work *w = t ? ct_pg_allreduce(pg, t, op) : NULL;
        st = w ? ct_work_wait(w) : ct_last_status();
        ct_work_free(w);
        if (!st) memcpy(v, ct_tensor_data(t), (size_t)n * sizeof *v);
    }
    return st;
}
