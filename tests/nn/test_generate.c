/* Sampling: ct_sample_logits against distributions computed by hand (logits chosen
 * as logs of dyadic probabilities, so every filter boundary is exact) and against a
 * naive f64 reference of Hugging Face's warpers, with frequencies over many seeds
 * held to a chi-square bound; ct_generate against a greedy loop over the full
 * forward, with and without the cache, its stop rules and its errors. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/philox.h"
#include "nn/generate.h"
#include "nn/gpt.h"

/* ---- ct_sample_logits --------------------------------------------------------- */

static ct_sample_config sampling(double temperature, int64_t top_k, double top_p)
{
    ct_sample_config c = ct_sample_config_default();
    c.temperature = temperature, c.top_k = top_k, c.top_p = top_p;
    return c;
}

/* N draws, each from a generator of its own seed: the chi-square of the counts
 * against want over its df degrees of freedom; an id with want 0 must never be drawn */
static double chi_square(const float *logits, int64_t V, const ct_sample_config *cfg, const double *want, int *df)
{
    enum { N = 20000 };
    int64_t *count = calloc((size_t)V, sizeof *count);
    double *probs = malloc((size_t)V * sizeof *probs);
    for (uint64_t s = 0; s < N; s++) {
        ct_rng r;
        ct_rng_init(&r, 1000 + s);
        int64_t t = ct_sample_logits(logits, V, cfg, &r, probs);
        cr_assert(t >= 0 && t < V, "%s", ct_last_error());
        count[t]++;
    }
    double chi2 = 0;
    *df = -1;
    for (int64_t i = 0; i < V; i++) {
        if (want[i] == 0) {
            cr_assert_eq(count[i], 0, "id %lld has probability 0 but was drawn %lld times (T %g, top_k %lld, top_p %g)",
                         (long long)i, (long long)count[i], cfg->temperature, (long long)cfg->top_k, cfg->top_p);
            continue;
        }
        double e = want[i] * N;
        chi2 += (count[i] - e) * (count[i] - e) / e;
        (*df)++;
    }
    free(count);
    free(probs);
    return chi2;
}

static void check_frequencies(const float *logits, int64_t V, const ct_sample_config *cfg, const double *want)
{
    int df;
    double chi2 = chi_square(logits, V, cfg, want, &df);
    /* beyond the 1e-6 quantile for these degrees of freedom (3: 30.7, 19: 54) */
    double bound = df <= 4 ? 35 : 60;
    cr_assert(chi2 < bound, "chi-square %g over %d degrees of freedom (T %g, top_k %lld, top_p %g)", chi2, df,
              cfg->temperature, (long long)cfg->top_k, cfg->top_p);
}

/* p = (1/2, 1/4, 1/8, 1/8) */
static const float dyadic[4] = {-0.69314718f, -1.38629436f, -2.07944154f, -2.07944154f};

Test(generate, greedy_is_the_first_largest_logit)
{
    ct_sample_config g = ct_sample_config_default();
    g.greedy = true;
    double p[6];
    cr_assert_eq(ct_sample_logits((float[]){1, 3, 2, 3, -1, 0}, 6, &g, NULL, p), 1);
    cr_assert_eq(ct_sample_logits((float[]){-INFINITY, -INFINITY, -5}, 3, &g, NULL, p), 2);
    cr_assert_eq(ct_sample_logits((float[]){7}, 1, &g, NULL, p), 0);
    /* greedy ignores the filters, even out-of-range ones */
    g.temperature = -1, g.top_p = 7;
    cr_assert_eq(ct_sample_logits(dyadic, 4, &g, NULL, p), 0);
}

Test(generate, temperature_top_k_top_p_by_hand)
{
    /* the model's distribution */
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_p = 1}, (double[]){.5, .25, .125, .125});
    /* T = 1/2 squares the probabilities: (1/4, 1/16, 1/64, 1/64) / (22/64) */
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 0.5, .top_p = 1},
                      (double[]){16. / 22, 4. / 22, 1. / 22, 1. / 22});
    /* T = 2: square roots, (0.7071, 0.5, 0.3536, 0.3536) / 1.9142 */
    double s = sqrt(.5) + .5 + 2 * sqrt(.125);
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 2, .top_p = 1},
                      (double[]){sqrt(.5) / s, .5 / s, sqrt(.125) / s, sqrt(.125) / s});
    /* top-k 2: (2/3, 1/3); top-k 3 ties with the 4th, which stays (HF keeps >= the k-th) */
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_k = 2, .top_p = 1},
                      (double[]){2. / 3, 1. / 3, 0, 0});
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_k = 3, .top_p = 1},
                      (double[]){.5, .25, .125, .125});
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_k = 1, .top_p = 1},
                      (double[]){1, 0, 0, 0});
    /* top-p: the smallest prefix of mass >= p. The logits are floats, so the masses
     * are dyadic only to ~1e-8: the boundaries are probed just inside and outside. */
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_p = 0.49999}, (double[]){1, 0, 0, 0});
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_p = 0.50001},
                      (double[]){2. / 3, 1. / 3, 0, 0});
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_p = 0.74999},
                      (double[]){2. / 3, 1. / 3, 0, 0});
    /* 0.76 needs a third id: of the tied pair, the lower id */
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_p = 0.76},
                      (double[]){4. / 7, 2. / 7, 1. / 7, 0});
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_p = 0.01}, (double[]){1, 0, 0, 0});
    /* the order is HF's: temperature before top-p (0.7 at T = 1 would keep two ids;
     * at T = 1/2 the first has 16/22 >= 0.7) */
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 0.5, .top_p = 0.7}, (double[]){1, 0, 0, 0});
    /* and top-k before top-p: within the top 2 the first holds 2/3 >= 0.6 (at the
     * full distribution, 1/2 < 0.6 would keep two) */
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_k = 2, .top_p = 0.6},
                      (double[]){1, 0, 0, 0});
    check_frequencies(dyadic, 4, &(ct_sample_config){.temperature = 1, .top_k = 3, .top_p = 0.8},
                      (double[]){4. / 7, 2. / 7, 1. / 7, 0});
}

/* HF's warpers in f64, written plainly: scores / T; top-k by counting how many
 * scores are larger; top-p by removing ascending-cumulative mass <= 1 - p */
static void reference_probs(const float *z, int64_t V, const ct_sample_config *c, double *out)
{
    double *s = malloc((size_t)V * sizeof *s);
    for (int64_t i = 0; i < V; i++) s[i] = z[i] / c->temperature;
    if (c->top_k > 0)
        for (int64_t i = 0; i < V; i++) {
            int64_t larger = 0;
            for (int64_t j = 0; j < V; j++) larger += s[j] > s[i];
            if (larger >= c->top_k) s[i] = -INFINITY;
        }
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; i++) mx = fmax(mx, s[i]);
    for (int64_t i = 0; i < V; i++) sum += out[i] = exp(s[i] - mx);
    for (int64_t i = 0; i < V; i++) out[i] /= sum;
    if (c->top_p < 1) {
        /* ascending mass of the ids at or below i (no ties in the logits used) */
        double *cut = malloc((size_t)V * sizeof *cut);
        for (int64_t i = 0; i < V; i++) {
            cut[i] = 0;
            for (int64_t j = 0; j < V; j++)
                if (out[j] <= out[i]) cut[i] += out[j];
        }
        sum = 0;
        for (int64_t i = 0; i < V; i++) {
            if (cut[i] <= 1 - c->top_p && out[i] < 1) out[i] = 0;
            sum += out[i];
        }
        for (int64_t i = 0; i < V; i++) out[i] /= sum;
        free(cut);
    }
    free(s);
}

Test(generate, random_logits_against_a_reference, .timeout = 60)
{
    enum { V = 20 };
    float z[V];
    ct_rng r;
    ct_rng_init(&r, 42);
    ct_rng_normal_f32(&r, z, V, 0, 1.5f);
    const ct_sample_config cases[] = {
        {.temperature = 1, .top_p = 1}, {.temperature = 0.7, .top_k = 8, .top_p = 1},
        {.temperature = 1.3, .top_p = 0.9}, {.temperature = 0.8, .top_k = 12, .top_p = 0.75},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        double want[V];
        reference_probs(z, V, &cases[k], want);
        check_frequencies(z, V, &cases[k], want);
    }
}

/* the frequency check can fail: draws at T = 1/2 are far from the model's distribution */
Test(generate, chi_square_tells_distributions_apart)
{
    int df;
    double chi2 = chi_square(dyadic, 4, &(ct_sample_config){.temperature = 0.5, .top_p = 1},
                             (double[]){.5, .25, .125, .125}, &df);
    cr_assert_gt(chi2, 1000);
}

Test(generate, sample_logits_errors)
{
    double p[4];
    ct_rng r;
    ct_rng_init(&r, 0);
    ct_sample_config c = sampling(0, 0, 1);
    cr_assert_eq(ct_sample_logits(dyadic, 4, &c, &r, p), -1);
    cr_assert(strstr(ct_last_error(), "temperature 0"), "%s", ct_last_error());
    c = sampling(NAN, 0, 1);
    cr_assert_eq(ct_sample_logits(dyadic, 4, &c, &r, p), -1);
    c = sampling(1, -2, 1);
    cr_assert_eq(ct_sample_logits(dyadic, 4, &c, &r, p), -1);
    cr_assert(strstr(ct_last_error(), "top_k -2"), "%s", ct_last_error());
    c = sampling(1, 0, 0);
    cr_assert_eq(ct_sample_logits(dyadic, 4, &c, &r, p), -1);
    cr_assert(strstr(ct_last_error(), "top_p 0"), "%s", ct_last_error());
    c = sampling(1, 0, 1.5);
    cr_assert_eq(ct_sample_logits(dyadic, 4, &c, &r, p), -1);
    c = sampling(1, 0, 1);
    cr_assert_eq(ct_sample_logits((float[]){0, NAN}, 2, &c, &r, p), -1);
    cr_assert(strstr(ct_last_error(), "logit 1 is NaN"), "%s", ct_last_error());
    cr_assert_eq(ct_sample_logits((float[]){-INFINITY, -INFINITY}, 2, &c, &r, p), -1);
    cr_assert_eq(ct_sample_logits(dyadic, 0, &c, &r, p), -1);
    cr_assert_eq(ct_sample_logits(dyadic, 4, &c, NULL, p), -1);
    /* top_k beyond V is no filter */
    c = sampling(1, 99, 1);
    cr_assert_geq(ct_sample_logits(dyadic, 4, &c, &r, p), 0);
}

/* ---- ct_generate ---------------------------------------------------------------- */

static const ct_gpt_config tiny = {.vocab_size = 23, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 8};

/* a tiny GPT with weights ~ N(0, 0.5): peaked, position-dependent distributions */
static ct_lm *random_lm(void)
{
    ct_set_seed(5);
    ct_gpt *m = ct_gpt_new(&tiny);
    cr_assert_not_null(m);
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    ct_rng r;
    ct_rng_init(&r, 11);
    /* strong position embeddings keep greedy decoding from settling on one token */
    for (int i = 0; i < l.n; i++)
        ct_rng_normal_f32(&r, ct_tensor_data(l.tensors[i]), ct_tensor_numel(l.tensors[i]), 0.0f,
                          strcmp(l.names[i], "wpe.weight") ? 0.5f : 2.0f);
    ct_param_list_free(&l);
    ct_lm *lm = ct_gpt_as_lm(m, true);
    cr_assert_not_null(lm);
    cr_assert_eq(lm->vocab_size, 23);
    cr_assert_eq(lm->max_positions, 16);
    cr_assert_eq(lm->n_layer, 2);
    cr_assert_eq(lm->n_kv_head, 2);
    cr_assert_eq(lm->head_dim, 4);
    cr_assert_eq(lm->eos_token_id, -1);
    return lm;
}

/* greedy decoding written out: full forward of the whole context, argmax of the last row */
static void greedy_reference(ct_lm *lm, const int64_t *prompt, int64_t n, int64_t steps, int64_t *out)
{
    memcpy(out, prompt, (size_t)n * sizeof *out);
    bool grad = ct_grad_set_enabled(false);
    for (int64_t k = 0; k < steps; k++) CT_FRAME {
            ct_tensor *lg = ct_gpt_forward(lm->model, ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, n + k), out));
            const float *row = (const float *)ct_tensor_data(lg) + (n + k - 1) * lm->vocab_size;
            int64_t best = 0;
            for (int64_t v = 1; v < lm->vocab_size; v++)
                if (row[v] > row[best]) best = v;
            out[n + k] = best;
        }
    ct_grad_set_enabled(grad);
}

static const int64_t prompt[3] = {4, 19, 7};

Test(generate, greedy_with_and_without_cache_matches_a_plain_loop)
{
    ct_lm *lm = random_lm();
    int64_t want[16], got[16], nocache[16];
    greedy_reference(lm, prompt, 3, 13, want);
    ct_sample_config c = ct_sample_config_default();
    c.greedy = true, c.max_new_tokens = 13;
    ct_module_train(lm->module, true);
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, got), 13, "%s", ct_last_error());
    cr_assert(lm->module->training, "the training flag was not restored");
    c.use_cache = false;
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, nocache), 13, "%s", ct_last_error());
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(got[i], want[i], "position %d: %lld, reference %lld", i, (long long)got[i], (long long)want[i]);
        cr_assert_eq(nocache[i], want[i]);
    }
    /* the sequence is not constant: a broken cache would show */
    int distinct = 0;
    for (int i = 4; i < 16; i++) distinct += want[i] != want[i - 1];
    cr_assert_geq(distinct, 3, "greedy decoding repeats one token: %lld ...", (long long)want[3]);
    ct_lm_free(lm);
}

Test(generate, sampling_with_and_without_cache_and_seeds)
{
    ct_lm *lm = random_lm();
    int64_t a[16], b[16], d[16];
    ct_sample_config c = ct_sample_config_default();
    c.max_new_tokens = 13, c.seed = 3, c.temperature = 1.5;
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, a), 13);
    c.use_cache = false;
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, b), 13);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "the same seed gave other tokens without the cache");
    c.seed = 4;
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, d), 13);
    cr_assert_neq(memcmp(a, d, sizeof a), 0, "seeds 3 and 4 gave the same 13 tokens");
    ct_lm_free(lm);
}

typedef struct {
    int64_t seen[16];
    int n, stop_after;
} recorder;

static int record(int64_t token, void *ctx)
{
    recorder *r = ctx;
    r->seen[r->n++] = token;
    return r->n == r->stop_after;
}

Test(generate, stops_on_eos_stop_ids_and_the_callback)
{
    ct_lm *lm = random_lm();
    int64_t want[16], got[16];
    greedy_reference(lm, prompt, 3, 13, want);
    ct_sample_config c = ct_sample_config_default();
    c.greedy = true, c.max_new_tokens = 13;
    /* the model's eos: the 4th new token (its first occurrence) ends generation and is kept */
    int64_t eos = want[6], first = 3;
    while (want[first] != eos) first++;
    lm->eos_token_id = eos;
    recorder r = {.stop_after = 0};
    int64_t n = ct_generate(lm, prompt, 3, &c, record, &r, got);
    cr_assert_eq(n, first - 2);
    cr_assert_eq(got[3 + n - 1], eos);
    cr_assert_eq(r.n, n);
    for (int i = 0; i < r.n; i++) cr_assert_eq(r.seen[i], want[3 + i]);
    /* stop ids given replace the eos */
    int64_t stops[2] = {want[9], 999};
    c.stop_ids = stops, c.n_stop_ids = 2;
    first = 3;
    while (want[first] != want[9]) first++;
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, got), first - 2);
    /* the callback stops after two tokens */
    c.n_stop_ids = 0, c.stop_ids = NULL, lm->eos_token_id = -1;
    r = (recorder){.stop_after = 2};
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, record, &r, got), 2);
    cr_assert_eq(r.n, 2);
    /* no new tokens: the prompt is copied */
    c.max_new_tokens = 0;
    memset(got, 0, sizeof got);
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, got), 0);
    cr_assert_eq(got[2], 7);
    ct_lm_free(lm);
}

Test(generate, generate_errors)
{
    ct_lm *lm = random_lm();
    int64_t out[32];
    ct_sample_config c = ct_sample_config_default();
    c.max_new_tokens = 14;
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, out), -1);
    cr_assert(strstr(ct_last_error(), "3 prompt tokens + max_new_tokens 14 exceed the model's 16 positions"), "%s",
              ct_last_error());
    c.max_new_tokens = 2;
    cr_assert_eq(ct_generate(lm, (int64_t[]){1, 23}, 2, &c, NULL, NULL, out), -1);
    cr_assert(strstr(ct_last_error(), "prompt token 23 at position 1"), "%s", ct_last_error());
    cr_assert_eq(ct_generate(lm, (int64_t[]){-1}, 1, &c, NULL, NULL, out), -1);
    cr_assert_eq(ct_generate(lm, prompt, 0, &c, NULL, NULL, out), -1);
    cr_assert(strstr(ct_last_error(), "at least 1"), "%s", ct_last_error());
    c.top_p = 0;
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, out), -1);
    cr_assert(strstr(ct_last_error(), "top_p"), "%s", ct_last_error());
    c = ct_sample_config_default();
    c.max_new_tokens = -1;
    cr_assert_eq(ct_generate(lm, prompt, 3, &c, NULL, NULL, out), -1);
    cr_assert_eq(ct_generate(NULL, prompt, 3, &c, NULL, NULL, out), -1);
    ct_lm_free(lm);
}
