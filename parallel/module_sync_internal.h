/* ctrain — rank 0's tensors on every rank, for the engines that start a model on
 * several ranks (parallel/ddp.c, parallel/shard.c). Not installed. */
#ifndef CT_PARALLEL_MODULE_SYNC_INTERNAL_H
#define CT_PARALLEL_MODULE_SYNC_INTERNAL_H

#include "dist/pg.h"
#include "nn/module.h"

/* Broadcasts the tensors l->tensors[first .. l->n) from rank 0 of pg in place, one
 * at a time; a tensor that is not contiguous is an error naming it (who starts every
 * message). Then autocast's low-precision copies of the old values are dropped. */
ct_status cti_dist_broadcast_tensors(ct_pg *pg, const ct_param_list *l, int first, const char *who);

#endif
