/* Figures a rank measured, combined over the ranks of a job: the `ctrain bench` and
 * `ctrain estimate-memory --measure` rank programs report the largest memory and
 * times over the ranks and the mean loss. */
#ifndef CT_TOOLS_RANK_FIGURES_H
#define CT_TOOLS_RANK_FIGURES_H

#include "dist/pg.h"

/* v[0..n) = op of v over the ranks of pg, in place (an all-reduce in f64); every rank
 * calls it. A no-op for a NULL pg or one rank. Errors are the process group's. */
ct_status ct_rank_figures_reduce(ct_pg *pg, double *v, int n, ct_reduce_op op);

#endif
