/* ctrain — sampling from a causal language model with a key/value cache.
 *
 * ct_generate runs the prompt through the model once (filling the cache), then one
 * token at a time: logits of the last position -> (greedy) argmax, or
 *   temperature: logits / T;  top_k: keep the k largest;  top_p: keep the smallest
 *   set of most likely tokens whose probability sums to >= p (at least one);
 *   sample from the renormalised softmax with the given generator.
 * The filters apply in Hugging Face's order (temperature, top-k, top-p), so a seed
 * and a filter setting name one distribution. Generation stops after
 * max_new_tokens, or after a token in the stop set (eos) is produced (it is kept).
 */
#ifndef CT_NN_GENERATE_H
#define CT_NN_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/philox.h"
#include "nn/lm.h"

typedef struct ct_sample_config {
    int64_t max_new_tokens;
    bool greedy;        /* argmax; the other fields but the stop set are ignored */
    double temperature; /* > 0; 1 = the model's distribution */
    int64_t top_k;      /* 0 = off */
    double top_p;       /* in (0, 1]; 1 = off */
    uint64_t seed;      /* of the sampling generator (ct_rng) */
    const int64_t *stop_ids; /* tokens that end generation (eos); NULL/0 = the model's eos_token_id if any */
    int n_stop_ids;
    bool use_cache;     /* false: recompute the whole context each token (the reference path) */
} ct_sample_config;

/* Called with each new token as it is produced; a non-zero return stops generation. */
typedef int (*ct_token_callback)(int64_t token, void *ctx);

/* The defaults: 32 new tokens, sampling at temperature 1, no filters, seed 0,
 * the model's eos, cache on. */
CT_API ct_sample_config ct_sample_config_default(void);

/* prompt[0..n) -> out[0..n + produced) (the prompt, then the new tokens); returns the
 * number of new tokens (>= 0), or -1 with an error. out has room for
 * n + cfg->max_new_tokens ids. A prompt token outside the vocabulary, n < 1, or
 * n + max_new_tokens beyond the model's max_positions is an error naming the value.
 * The model runs in eval mode without grad; its training flag is restored. */
CT_API int64_t ct_generate(ct_lm *lm, const int64_t *prompt, int64_t n, const ct_sample_config *cfg,
                           ct_token_callback on_token, void *ctx, int64_t *out);

/* The sampling step alone, for tests and custom loops: one row of logits (V floats)
 * -> a token id, with the rules above (probs: scratch of V doubles). */
CT_API int64_t ct_sample_logits(const float *logits, int64_t V, const ct_sample_config *cfg, ct_rng *rng,
                                double *probs);

#endif
