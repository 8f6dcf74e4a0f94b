/* ctrain — the scaling state of an fp8 run: one set of metas per weight.
 *
 *     ct_fp8_state *st = ct_fp8_state_new(&recipe);     (NULL: the default recipe)
 *     ct_autocast_set_default_fp8(st);                   linears now quantise (autocast.h)
 *     for each step:
 *         forward + backward                             amaxes are observed
 *         n = ct_fp8_state_amax_count(st);               (across ranks: all-reduce
 *         ct_fp8_state_amax_get(st, buf);                 buf with MAX, then put it
 *         ct_fp8_state_amax_set(st, buf);                 back)
 *         optimizer step
 *         ct_fp8_state_step(st);                         new scales from the histories
 *     ct_fp8_state_free(st);
 *
 * Each weight w that an fp8 product meets gets a slot, in the order of first use (the
 * same on every rank that runs the same model), holding three delayed-scaling metas
 * (precision/fp8.h): the input x (forward format), w itself (forward format) and the
 * gradient of the product's output (backward format), and w quantised with its meta's
 * scale, made once per weight generation (ct_autocast_weights_changed). The slot
 * retains w, so its address names it for the state's lifetime.
 *
 * The amax buffer holds 3 floats per slot (input, weight, gradient), each the largest
 * |x| seen since the last step (NaN after a non-finite value).
 */
#ifndef CT_PRECISION_FP8_STATE_H
#define CT_PRECISION_FP8_STATE_H

#include "core/api.h"
#include "precision/fp8.h"

typedef struct ct_fp8_state ct_fp8_state;

/* NULL with the error set for a bad recipe (ct_fp8_recipe_resolve) or no memory. */
CT_API ct_fp8_state *ct_fp8_state_new(const ct_fp8_recipe *r);
/* Frees s and everything it owns; NULL is fine. */
CT_API void ct_fp8_state_free(ct_fp8_state *s);
/* The resolved recipe (defaults filled in). Borrowed. */
CT_API const ct_fp8_recipe *ct_fp8_state_recipe(const ct_fp8_state *s);
/* How many weights have slots. */
CT_API int ct_fp8_state_weights(const ct_fp8_state *s);

/* What one fp8 product with weight w needs now. */
typedef struct ct_fp8_use {
    int slot;
    ct_tensor *wq;     /* w quantised to the forward format with the weight meta's scale;
                          borrowed: the state holds it for this weight generation */
    ct_dtype x_dtype;  /* the forward format */
    float x_scale;     /* the input meta's scale */
    ct_dtype g_dtype;  /* the backward format */
    float g_scale;     /* the gradient meta's scale */
    ct_tensor *g_amax; /* f32 [1], retained by the state: backward raises it to max |grad|
                          (a node may retain it too, outliving the state safely) */
} ct_fp8_use;

/* The slot of w (2-D f32, bf16 or f16 CPU tensor; made at first use), its quantised copy made if
 * this weight generation has none yet. CT_ERR_INVALID for another w. */
CT_API ct_status ct_fp8_state_use(ct_fp8_state *s, ct_tensor *w, ct_fp8_use *u);
/* Raises the pending amax of slot's input meta. */
CT_API void ct_fp8_state_observe_input(ct_fp8_state *s, int slot, float amax);
/* Stores the largest of a and the value in an amax cell (f32 [1]); NaN sticks. */
CT_API void ct_fp8_amax_cell_raise(ct_tensor *cell, float a);

/* 3 * ct_fp8_state_weights(s). */
CT_API int ct_fp8_state_amax_count(const ct_fp8_state *s);
/* buf[3 i + {0, 1, 2}] = slot i's pending amax of input, weight, gradient (the
 * gradient's: its meta's pending raised by its backward cell). Changes nothing. */
CT_API void ct_fp8_state_amax_get(ct_fp8_state *s, float *buf);
/* Puts (all-reduced) pending amaxes back, the same layout; the cells restart at 0. */
CT_API void ct_fp8_state_amax_set(ct_fp8_state *s, const float *buf);
/* Every meta: pending (raised by the cells not yet taken in) -> history, new scale
 * (ct_fp8_meta_step); the quantised weights are made again at their next use. */
CT_API void ct_fp8_state_step(ct_fp8_state *s);
/* A slot's metas (0 input, 1 weight, 2 gradient), for inspection; NULL out of range.
 * The gradient meta's pending takes in the backward cells at amax_set or step. */
CT_API const ct_fp8_meta *ct_fp8_state_meta(const ct_fp8_state *s, int slot, int which);

/* The metas of every slot, for checkpoints: four new tensors in the current frame,
 * out[0] scale f32 [n, 3], out[1] pending f32 [n, 3], out[2] history f32 [n, 3, len]
 * (len the recipe's amax_history_len; the ring as stored), out[3] counters i64
 * [n, 3, 2] (pos, seen), n = ct_fp8_state_weights (slot order = order of first use). */
CT_API ct_status ct_fp8_state_export(ct_fp8_state *s, ct_tensor *out[4]);
/* Puts exported metas back: slot i gets row i; slots not made yet (a fresh process
 * before its first forward) take theirs when made, in the order of first use, so a
 * resumed run quantises with the saved scales. The shapes are checked first (n no
 * smaller than the slots made so far, len the recipe's); nothing changes on error.
 * The quantised weights are made again at their next use. */
CT_API ct_status ct_fp8_state_import(ct_fp8_state *s, ct_tensor *const in[4]);
#endif
