/* Sampling from a causal language model (see nn/generate.h).
 *
 * One step, on a row of logits z (V):
 *   greedy:       argmax z, the lowest id among equal maxima (torch.argmax)
 *   temperature:  s = z / T
 *   top-k:        drop every s_i below the k-th largest (ties with it stay, as in HF)
 *   top-p:        p = softmax(s over the kept ids); in order of decreasing p (ties:
 *                 lower id first), keep id r iff the mass before it is < top_p, the
 *                 smallest prefix whose mass reaches top_p (HF removes the ids whose
 *                 ascending cumulative mass is <= 1 - top_p: the same set)
 *   sample:       u ~ U[0, 1) from the generator; the first kept id, in id order,
 *                 whose cumulative renormalised mass exceeds u.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/error.h"
#include "core/frame.h"
#include "nn/generate.h"

ct_sample_config ct_sample_config_default(void)
{
    return (ct_sample_config){.max_new_tokens = 32, .temperature = 1.0, .top_p = 1.0, .use_cache = true};
}

static ct_status check_config(const ct_sample_config *c, const char *op)
{
    if (c->max_new_tokens < 0)
        return ct_error_set(CT_ERR_INVALID, "%s: max_new_tokens %lld must be >= 0", op, (long long)c->max_new_tokens);
    if (c->n_stop_ids < 0 || (c->n_stop_ids > 0 && !c->stop_ids))
        return ct_error_set(CT_ERR_INVALID, "%s: %d stop ids given without an array", op, c->n_stop_ids);
    if (c->greedy) return CT_OK;
    if (!(c->temperature > 0 && isfinite(c->temperature)))
        return ct_error_set(CT_ERR_INVALID, "%s: temperature %g must be a finite number > 0 (or use greedy)", op,
                            c->temperature);
    if (c->top_k < 0) return ct_error_set(CT_ERR_INVALID, "%s: top_k %lld must be >= 0 (0 = off)", op, (long long)c->top_k);
    if (!(c->top_p > 0 && c->top_p <= 1))
        return ct_error_set(CT_ERR_INVALID, "%s: top_p %g must be in (0, 1] (1 = off)", op, c->top_p);
    return CT_OK;
}

typedef struct {
    double p;
    int64_t id;
} ranked;

/* decreasing probability, ties by increasing id */
static int by_prob_desc(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int64_t ct_sample_logits(const float *logits, int64_t V, const ct_sample_config *cfg, ct_rng *rng, double *probs)
{
    if (!logits || V < 1 || !cfg || !probs || (!cfg->greedy && !rng)) {
        ct_error_set(CT_ERR_INVALID, "sample_logits: NULL logits, config, generator or scratch, or V %lld < 1",
                     (long long)V);
        return -1;
    }
    if (check_config(cfg, "sample_logits")) return -1;
    int64_t best = 0;
    for (int64_t i = 0; i < V; i++) {
        if (isnan(logits[i])) {
            ct_error_set(CT_ERR_INVALID, "sample_logits: logit %lld is NaN", (long long)i);
            return -1;
        }
        if (logits[i] > logits[best]) best = i;
    }
    if (cfg->greedy) return best;
    if (logits[best] == -INFINITY) {
        ct_error_set(CT_ERR_INVALID, "sample_logits: every one of the %lld logits is -inf", (long long)V);
        return -1;
    }
    /* probs = exp(s - max s), s = z / T: kept ids > 0, dropped ids 0 */
    double mx = (double)logits[best] / cfg->temperature;
    for (int64_t i = 0; i < V; i++) probs[i] = exp((double)logits[i] / cfg->temperature - mx);
    bool top_k = cfg->top_k > 0 && cfg->top_k < V, top_p = cfg->top_p < 1;
    if (top_k || top_p) {
        ranked *order = malloc((size_t)V * sizeof *order);
        if (!order) {
            ct_error_set(CT_ERR_NOMEM, "sample_logits: out of memory for %lld ids", (long long)V);
            return -1;
        }
        /* exp is monotonic: the order of probs is that of s */
        for (int64_t i = 0; i < V; i++) order[i] = (ranked){probs[i], i};
        qsort(order, (size_t)V, sizeof *order, by_prob_desc);
        int64_t keep = V;
        if (top_k) {
            double kth = order[cfg->top_k - 1].p;
            keep = cfg->top_k;
            while (keep < V && order[keep].p == kth) keep++;
        }
        if (top_p) {
            double total = 0;
            for (int64_t r = 0; r < keep; r++) total += order[r].p;
            /* before: the mass of the first r ids; at least one id */
            int64_t r = 1;
            double before = order[0].p;
            while (r < keep && before / total < cfg->top_p) before += order[r++].p;
            keep = r;
        }
        for (int64_t r = keep; r < V; r++) probs[order[r].id] = 0;
        free(order);
    }
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += probs[i];
    double u;
    ct_rng_uniform_f64(rng, &u, 1, 0.0, 1.0);
    double acc = 0, target = u * sum;
    int64_t last = best;
    for (int64_t i = 0; i < V; i++) {
        if (probs[i] <= 0) continue;
        acc += probs[i];
        last = i;
        if (acc > target) return i;
    }
    return last; /* rounding left u * sum at the very end */
}

/* logits (1, T, V) -> its last row as V floats on the CPU (current frame) */
static ct_tensor *last_row(ct_tensor *logits)
{
    ct_tensor *row = ct_tensor_select(ct_tensor_select(logits, 0, 0), 0, logits->shape[1] - 1);
    if (row && row->dtype != CT_DTYPE_F32) row = ct_tensor_cast(row, CT_DTYPE_F32);
    if (row) row = ct_tensor_to(row, CT_CPU);
    return row ? ct_tensor_contiguous(row) : NULL;
}

/* One forward of ids[0..n) (positions cache->len..) and a token from the last row; -1
 * with an error. */
static int64_t step(ct_lm *lm, const int64_t *ids, int64_t n, ct_kv_cache *cache, ct_device dev,
                    const ct_sample_config *cfg, ct_rng *rng, double *probs)
{
    int64_t tok = -1;
    ct_frame_push();
    ct_tensor *idx = ct_tensor_to(ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, n), ids), dev);
    ct_tensor *logits = idx ? ct_lm_forward(lm, idx, cache) : NULL;
    ct_tensor *row = NULL;
    if (logits && (logits->ndim != 3 || logits->shape[0] != 1 || logits->shape[1] != n ||
                   logits->shape[2] != lm->vocab_size)) {
        char d[160];
        ct_error_set(CT_ERR_INVALID, "the model returned logits %s for (1, %lld) tokens, expected (1, %lld, %lld)",
                     ct_tensor_describe(logits, d, sizeof d), (long long)n, (long long)n, (long long)lm->vocab_size);
    } else if (logits) {
        row = last_row(logits);
    }
    if (row) tok = ct_sample_logits(ct_tensor_data(row), lm->vocab_size, cfg, rng, probs);
    ct_frame_pop();
    return tok;
}

int64_t ct_generate(ct_lm *lm, const int64_t *prompt, int64_t n, const ct_sample_config *cfg,
                    ct_token_callback on_token, void *ctx, int64_t *out)
{
    if (!lm || !cfg || !out || (n > 0 && !prompt)) {
        ct_error_set(CT_ERR_INVALID, "generate: NULL model, config, prompt or output");
        return -1;
    }
    if (check_config(cfg, "generate")) return -1;
    if (n < 1) {
        ct_error_set(CT_ERR_INVALID, "generate: the prompt has %lld tokens; at least 1 is needed", (long long)n);
        return -1;
    }
    if (n > lm->max_positions - cfg->max_new_tokens) {
        ct_error_set(CT_ERR_INVALID, "generate: %lld prompt tokens + max_new_tokens %lld exceed the model's %lld "
                     "positions", (long long)n, (long long)cfg->max_new_tokens, (long long)lm->max_positions);
        return -1;
    }
    const int64_t V = lm->vocab_size;
    for (int64_t i = 0; i < n; i++) {
        if (prompt[i] < 0 || prompt[i] >= V) {
            ct_error_set(CT_ERR_INVALID, "generate: prompt token %lld at position %lld is outside the vocabulary "
                         "[0, %lld)", (long long)prompt[i], (long long)i, (long long)V);
            return -1;
        }
    }
    memmove(out, prompt, (size_t)n * sizeof *out);
    if (cfg->max_new_tokens == 0) return 0;
    const int64_t eos = lm->eos_token_id;
    const int64_t *stop = cfg->n_stop_ids > 0 ? cfg->stop_ids : (eos >= 0 ? &eos : NULL);
    const int n_stop = cfg->n_stop_ids > 0 ? cfg->n_stop_ids : (eos >= 0 ? 1 : 0);

    const ct_device dev = ct_lm_device(lm);
    double *probs = malloc((size_t)V * sizeof *probs);
    ct_kv_cache *cache = cfg->use_cache ? ct_lm_cache_new(lm, 1, n + cfg->max_new_tokens) : NULL;
    if (!probs || (cfg->use_cache && !cache)) {
        if (!probs) ct_error_set(CT_ERR_NOMEM, "generate: out of memory for %lld probabilities", (long long)V);
        else ct_error_prefix("generate: ");
        free(probs);
        return -1;
    }
    ct_rng rng;
    ct_rng_init(&rng, cfg->seed);
    bool was_training = lm->module->training;
    ct_module_train(lm->module, false);
    bool grad = ct_grad_set_enabled(false);

    int64_t len = n, produced = 0;
    bool failed = false;
    while (produced < cfg->max_new_tokens) {
        /* with the cache: the prompt once, then the last token alone */
        int64_t tok = cache ? step(lm, out + len - (produced ? 1 : n), produced ? 1 : n, cache, dev, cfg, &rng, probs)
                            : step(lm, out, len, NULL, dev, cfg, &rng, probs);
        if (tok < 0) {
            failed = true;
            break;
        }
        out[len++] = tok;
        produced++;
        bool stop_now = false;
        for (int i = 0; i < n_stop && !stop_now; i++) stop_now = stop[i] == tok;
        if (on_token && on_token(tok, ctx)) stop_now = true;
        if (stop_now) break;
    }

    ct_grad_set_enabled(grad);
    ct_module_train(lm->module, was_training);
    ct_kv_cache_free(cache);
    free(probs);
    if (failed) {
        ct_error_prefix("generate: token %lld: ", (long long)produced);
        return -1;
    }
    return produced;
}
