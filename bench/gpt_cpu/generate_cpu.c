/* Generation throughput on the CPU: ct_generate (greedy, key/value cache on) on a model
 * with random weights, the twin of torch_llama.py --generate.
 *
 *   generate_cpu --config llama-w1|w1 --threads N [--prompt P] [--new K] [--reps R]
 *                [--seed X]
 *
 * Models (f32, fresh initialisation from ct_set_seed(X)): llama-w1 is gpt_cpu's Llama
 * (vocab 2048, 4 layers, hidden 256, 4 heads, 2 key/value heads, MLP 688), w1 its GPT-2
 * (vocab 256, block 256, 4 layers, 4 heads, width 256). Batch 1.
 *
 * The prompt is P tokens drawn uniformly below the vocabulary (Philox, seeded), default
 * 32; K new tokens are produced (default 128): greedy, use_cache, and a stop set holding
 * only the id `vocab` (outside the vocabulary, so it can never be produced and generation
 * never ends early). One untimed generation warms up, then R (default 3) timed ones; each
 * is timed from the call to its return, and at the first new token (the on_token
 * callback) to split it:
 *   prefill_ms      the prompt's forward and the first token (time to first token)
 *   decode_tok_s    (K - 1) / (the time from the first token to the return)
 *   tokens_per_s    K / the whole call (what a user of generate sees)
 * Each figure is the median over the R runs.
 *
 * Output: one JSON line {"impl":"ctrain","mode":"generate","config":..,"threads":..,
 * "prompt":P,"new_tokens":K,"tokens_per_s":..,"decode_tok_s":..,"prefill_ms":..,
 * "peak_rss_mb":..,"reps":R}. Errors: a message on stderr, exit status 2.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpt_cpu/gpt_step.h"
#include "bench/timing.h"
#include "ctrain.h"

#define PROG "generate_cpu"
#include "bench/args.h" /* after PROG: its messages name the program */

typedef struct gen_options {
    bool llama;
    const char *config;
    int threads, reps;
    long long prompt, new_tokens;
    uint64_t seed;
} gen_options;

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " --config llama-w1|w1 --threads N [--prompt P] [--new K] [--reps R] [--seed X]\n"
               "  greedy generation with the key/value cache, batch 1; prints one JSON line\n"
               "  --prompt P  prompt tokens (default 32)    --new K   new tokens (default 128)\n"
               "  --reps R    timed generations (default 3) --seed X  weights and prompt (default 1337)\n");
}

/* 0 ok, 1 --help, -1 error (message printed) */
static int parse_args(int argc, char **argv, gen_options *o)
{
    *o = (gen_options){.config = NULL, .threads = 0, .reps = 3, .prompt = 32, .new_tokens = 128, .seed = 1337};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--config")) {
            if (!v || (strcmp(v, "llama-w1") && strcmp(v, "w1"))) {
                fprintf(stderr, PROG ": --config needs llama-w1 or w1\n");
                return -1;
            }
            o->config = v;
            o->llama = !strcmp(v, "llama-w1");
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(a, v, 1, 1024, &x)) return -1;
            o->threads = (int)x;
            i++;
        } else if (!strcmp(a, "--prompt")) {
            if (!parse_int(a, v, 1, 100000, &o->prompt)) return -1;
            i++;
        } else if (!strcmp(a, "--new")) {
            if (!parse_int(a, v, 2, 100000, &o->new_tokens)) return -1;
            i++;
        } else if (!strcmp(a, "--reps")) {
            if (!parse_int(a, v, 1, 1000, &x)) return -1;
            o->reps = (int)x;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_int(a, v, 0, (long long)(~0ULL >> 1), &x)) return -1;
            o->seed = (uint64_t)x;
            i++;
        } else {
            fprintf(stderr, PROG ": unknown argument '%s' (see --help)\n", a);
            return -1;
        }
    }
    if (!o->config || !o->threads) {
        fprintf(stderr, PROG ": --config and --threads are required (see --help)\n");
        return -1;
    }
    return 0;
}

static int on_token(int64_t token, void *ctx)
{
    (void)token;
    double *first = ctx;
    if (*first == 0) *first = now();
    return 0;
}

int main(int argc, char **argv)
{
    gen_options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    ct_set_num_threads(o.threads);
    ct_set_seed(o.seed);
    ct_lm *lm = NULL;
    if (o.llama) {
        ct_llama *m = ct_llama_new(&(ct_llama_config){.vocab_size = 2048, .hidden_size = 256,
                                                      .intermediate_size = 688, .num_hidden_layers = 4,
                                                      .num_attention_heads = 4, .num_key_value_heads = 2,
                                                      .max_position_embeddings = 2048});
        lm = m ? ct_llama_as_lm(m, true) : NULL;
        if (m && !lm) ct_module_free(&m->base);
    } else {
        ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 256, .block_size = 256, .n_layer = 4, .n_head = 4,
                                                .n_embd = 256, .dropout = 0.0, .ln_eps = 1e-5});
        lm = m ? ct_gpt_as_lm(m, true) : NULL;
        if (m && !lm) ct_module_free(&m->base);
    }
    if (!lm) {
        fprintf(stderr, PROG ": building %s: %s\n", o.config, ct_last_error());
        return 2;
    }
    int64_t V = lm->vocab_size, n = o.prompt, K = o.new_tokens;
    int64_t *prompt = malloc((size_t)n * sizeof *prompt), *out = malloc((size_t)(n + K) * sizeof *out);
    uint32_t *raw = malloc((size_t)n * sizeof *raw);
    double *total = malloc((size_t)o.reps * sizeof(double)), *decode = malloc((size_t)o.reps * sizeof(double)),
           *prefill = malloc((size_t)o.reps * sizeof(double));
    int status = 2;
    if (!prompt || !out || !raw || !total || !decode || !prefill) {
        fprintf(stderr, PROG ": out of memory\n");
        goto done;
    }
    ct_rng rng;
    ct_rng_init(&rng, o.seed ^ 0x9e3779b9ULL);
    ct_rng_u32(&rng, raw, n);
    for (int64_t i = 0; i < n; i++) prompt[i] = (int64_t)(raw[i] % (uint32_t)V);
    int64_t never = V; /* an id outside the vocabulary: generation runs K tokens */
    ct_sample_config sc = ct_sample_config_default();
    sc.greedy = true;
    sc.use_cache = true;
    sc.max_new_tokens = K;
    sc.stop_ids = &never;
    sc.n_stop_ids = 1;
    for (int r = -1; r < o.reps; r++) {
        double first = 0, t0 = now();
        int64_t got = ct_generate(lm, prompt, n, &sc, on_token, &first, out);
        double t1 = now();
        if (got != K) {
            fprintf(stderr, PROG ": ct_generate produced %lld of %lld tokens: %s\n", (long long)got, (long long)K,
                    got < 0 ? ct_last_error() : "stopped early");
            goto done;
        }
        if (r < 0) continue; /* warm-up */
        total[r] = t1 - t0;
        prefill[r] = first - t0;
        decode[r] = (double)(K - 1) / (t1 - first);
    }
    printf("{\"impl\":\"ctrain\",\"mode\":\"generate\",\"config\":\"%s\",\"threads\":%d,\"prompt\":%lld,"
           "\"new_tokens\":%lld,\"tokens_per_s\":%.2f,\"decode_tok_s\":%.2f,\"prefill_ms\":%.3f,"
           "\"peak_rss_mb\":%.1f,\"reps\":%d}\n",
           o.config, o.threads, (long long)n, (long long)K, (double)K / median(total, o.reps),
           median(decode, o.reps), 1e3 * median(prefill, o.reps), peak_rss_mib(), o.reps);
    status = 0;
done:
    ct_lm_free(lm);
    ct_frame_reset_root();
    free(prompt), free(out), free(raw), free(total), free(decode), free(prefill);
    return status;
}
