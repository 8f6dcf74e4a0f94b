/* ctrain — helpers shared by the tensor-parallel layers (nn/tp_layers.c, tp_vocab.c). */
#ifndef CT_PARALLEL_TP_INTERNAL_H
#define CT_PARALLEL_TP_INTERNAL_H

#include "core/tensor.h"
#include "dist/pg.h"

/* Indices [start, end) of full along dim as a new contiguous tensor (current frame);
 * indices at or past full's size are zeros (vocabulary padding). */
ct_tensor *cti_tp_take_slice(const ct_tensor *full, int dim, int64_t start, int64_t end);
/* An error naming op when g is NULL. */
ct_status cti_tp_check_group(const char *op, ct_pg *g);

#endif
