/* ctrain — the Accelerator's fp8 pieces: the recipe from its config and the
 * launcher's variables, and the once-per-step amax exchange (internal to accel/). */
#ifndef CT_ACCEL_FP8_SYNC_INTERNAL_H
#define CT_ACCEL_FP8_SYNC_INTERNAL_H

#include "dist/pg.h"
#include "precision/fp8_state.h"

/* *out = cfg with each zero field taken from the launcher's variable when set
 * (CTRAIN_FP8_FORMAT hybrid|e4m3, CTRAIN_FP8_AMAX_HISTORY_LEN, CTRAIN_FP8_AMAX_COMPUTE_ALGO
 * max|most_recent, CTRAIN_FP8_MARGIN, CTRAIN_FP8_EMBEDDING_AND_HEAD 0|1), then
 * resolved. CT_ERR_INVALID naming the variable or field and its value. */
ct_status cti_accel_fp8_recipe(const ct_fp8_recipe *cfg, ct_fp8_recipe *out);

/* Once per optimizer step, on every rank: the pending amaxes all-reduced with MAX
 * (after checking that every rank has as many weights), then every meta steps. */
ct_status cti_accel_fp8_sync(ct_fp8_state *st, ct_pg *pg);

#endif
