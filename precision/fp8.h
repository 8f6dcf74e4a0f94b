/* ctrain — fp8 recipe and delayed per-tensor scaling.
 *
 *     ct_fp8_recipe r;
 *     ct_fp8_recipe_resolve(NULL, &r);                 HYBRID, history 1024, margin 0, max
 *     ct_fp8_meta w;
 *     ct_fp8_meta_init(&w, &r, CT_FP8_FORWARD);        E4M3, scale 1
 *     ... each use: q = quantise(x * w.scale), ct_fp8_meta_observe(&w, amax(|x|)) ...
 *     ... (across ranks: all-reduce every meta's `pending` with MAX) ...
 *     ct_fp8_meta_step(&w);                            history <- pending; new scale
 *
 * Delayed scaling: a tensor is quantised with the scale computed from the amaxes of
 * EARLIER steps (its history), and the amax it shows now only enters the history at
 * the next ct_fp8_meta_step. The stored fp8 value q stands for q / scale.
 *
 * Scale: with a = the history's maximum (CT_FP8_AMAX_MAX) or its newest entry
 * (CT_FP8_AMAX_MOST_RECENT), and fmax the format's largest finite value (E4M3 448,
 * E5M2 57344):
 *     scale = fmax / a / 2^margin
 * kept at its previous value when a is 0 or not finite or the result is not a finite
 * positive number (nothing seen yet, or an overflowing step). The history has
 * amax_history_len entries; before it fills, only the entries seen count.
 *
 * Formats: HYBRID quantises the forward pass (activations, weights) to E4M3 and the
 * gradients to E5M2 (range over precision); E4M3 uses E4M3 for both.
 */
#ifndef CT_PRECISION_FP8_H
#define CT_PRECISION_FP8_H

#include <stdbool.h>

#include "core/api.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

typedef enum ct_fp8_format { CT_FP8_HYBRID = 0, CT_FP8_E4M3 } ct_fp8_format;
typedef enum ct_fp8_amax_algo { CT_FP8_AMAX_MAX = 0, CT_FP8_AMAX_MOST_RECENT } ct_fp8_amax_algo;
typedef enum ct_fp8_role { CT_FP8_FORWARD = 0, CT_FP8_BACKWARD } ct_fp8_role;

#define CT_FP8_DEFAULT_HISTORY 1024
#define CT_FP8_MAX_HISTORY (1 << 20)
#define CT_FP8_MAX_MARGIN 64

/* Every setting of an fp8 run in one place. Zero means default for every field. */
typedef struct ct_fp8_recipe {
    ct_fp8_format format;               /* default HYBRID */
    int amax_history_len;               /* default 1024; 1 .. 2^20 */
    int margin;                         /* default 0; 0 .. 64: scales are 2^margin smaller */
    ct_fp8_amax_algo amax_compute_algo; /* default MAX over the history */
    bool fp8_embedding_and_head;        /* default false: the embedding and the lm head stay bf16 */
} ct_fp8_recipe;

/* *out = in with defaults filled in (in NULL: all defaults). CT_ERR_INVALID naming
 * the field, its value and the allowed range for a bad one. */
CT_API ct_status ct_fp8_recipe_resolve(const ct_fp8_recipe *in, ct_fp8_recipe *out);
/* The fp8 dtype a role uses under the recipe (E4M3 or E5M2). */
CT_API ct_dtype ct_fp8_dtype(const ct_fp8_recipe *r, ct_fp8_role role);
/* "hybrid"/"e4m3", "max"/"most_recent"; static strings. */
CT_API const char *ct_fp8_format_name(ct_fp8_format f);
CT_API const char *ct_fp8_amax_algo_name(ct_fp8_amax_algo a);
/* The largest finite value of an fp8 dtype (448, 57344); 0 for another dtype. */
CT_API double ct_fp8_max(ct_dtype dt);

/* One tensor's scaling state. Owned by its user; ct_fp8_meta_free releases it. */
typedef struct ct_fp8_meta {
    ct_dtype dtype;   /* CT_DTYPE_F8_E4M3 or CT_DTYPE_F8_E5M2 */
    float scale;      /* multiply by it before quantising; 1 until a step sets it */
    float pending;    /* the largest |x| seen since the last step (all-reduce it with MAX) */
    float *history;   /* len entries, a ring: newest at (pos - 1) mod len */
    int len, pos, seen;
    int margin;
    ct_fp8_amax_algo algo;
} ct_fp8_meta;

/* Sets up m for role with recipe r (format by ct_fp8_dtype), scale 1 and an empty amax history;
 * free it with ct_fp8_meta_free. */
CT_API ct_status ct_fp8_meta_init(ct_fp8_meta *m, const ct_fp8_recipe *r, ct_fp8_role role);
/* Frees the amax history m owns (not m itself); m may then be initialised again. */
CT_API void ct_fp8_meta_free(ct_fp8_meta *m);
/* pending = max(pending, amax); a NaN amax is kept (it poisons the step, so the scale
 * stays where it was). */
CT_API void ct_fp8_meta_observe(ct_fp8_meta *m, float amax);
/* The amax the next scale comes from: max over the history or its newest entry; 0
 * before any step. */
CT_API float ct_fp8_meta_amax(const ct_fp8_meta *m);
/* Pushes pending into the history, resets it to 0 and recomputes the scale. */
CT_API void ct_fp8_meta_step(ct_fp8_meta *m);

/* out (fp8 dtype, x's shape, contiguous) = round(x * scale) saturated to the
 * format's finite range (f32, bf16 or f16 x, any strides; x * scale is the f32
 * product of x's exact f32 value); out->scale = scale and out->amax =
 * max |x| (NaN if x has one), which *amax receives too when not NULL. NULL with
 * the error set for a bad dtype or shape. The reference below is the plain loop.
 * On a GPU (x a CUDA tensor, out on its device) the bits of out and amax are the
 * CPU's; the call waits for the GPU, as amax comes back to the host. */
CT_API ct_tensor *ct_fp8_quantize(const ct_tensor *x, ct_dtype dt, float scale, float *amax);
CT_API ct_tensor *ct_fp8_quantize_ref(const ct_tensor *x, ct_dtype dt, float scale, float *amax);

/* out (M, N) f32 = op(a) @ op(b) / (a->scale * b->scale) for 2-D fp8 tensors, the
 * products summed in f32: the fp8 values widen exactly (to bf16 where the CPU
 * multiplies bf16 natively, else to f32) and every product of two of them is exact
 * in f32, so the result is what quantise -> f32 GEMM gives; the scales are the
 * GEMM's alpha. a and b on one device; on a GPU of compute capability 8.9 or later
 * cuBLASLt's fp8 GEMM runs it (f32 accumulation; M, N, K multiples of 16, not
 * e5m2 x e5m2), else the same exact widening to bf16 and a bf16 GEMM.
 * NULL with the error set for bad dtypes or shapes. */
CT_API ct_tensor *ct_fp8_matmul(const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b);
/* Reference: the triple loop, summing in f32 in k order. */
CT_API ct_tensor *ct_fp8_matmul_ref(const ct_tensor *a, const ct_tensor *b, bool trans_a, bool trans_b);

#endif
