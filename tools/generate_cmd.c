/* `ctrain generate` (tools/generate_cmd.h): ct_lm_from_pretrained, the prompt through
 * the tokenizer, ct_generate with a callback that prints each token's bytes.
 *
 * Byte-level BPE tokens are byte strings, so printing the bytes of each token as it
 * comes writes exactly the bytes of the decoded text, even when a token ends in the
 * middle of a UTF-8 sequence: the next token completes it in the terminal. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/bpe.h"
#include "nn/generate.h"
#include "nn/lm.h"
#include "tools/generate_cmd.h"

#define MAX_PROMPT_BYTES (16u << 20)

static void usage(FILE *f)
{
    fputs("usage: ctrain generate --model DIR (--prompt TEXT | --prompt_file FILE) [options]\n\n"
          "Continues the prompt with a causal language model saved in Hugging Face's layout\n"
          "(DIR/config.json and its weights; model_type gpt2 or llama), printing the prompt and then\n"
          "each new token as it is produced. Without --greedy, tokens are sampled in\n"
          "Hugging Face's order: temperature, top-k, top-p. Generation ends after\n"
          "--max_new_tokens or at the model's end-of-text token.\n\n"
          "options:\n"
          "  --model DIR           the model directory\n"
          "  --tokenizer FILE      a tokenizer.json (default DIR/tokenizer.json; without one, a\n"
          "                        model of 256 tokens reads and writes raw bytes)\n"
          "  --prompt TEXT         the text to continue\n"
          "  --prompt_file FILE    the same, read from a file\n"
          "  --max_new_tokens N    at most N new tokens (default 32)\n"
          "  --greedy              the most likely token each step (no sampling)\n"
          "  --temperature T       divide the logits by T > 0 (default 1)\n"
          "  --top_k K             sample among the K most likely tokens (default 0: all)\n"
          "  --top_p P             among the most likely tokens of total probability >= P,\n"
          "                        P in (0, 1] (default 1: all)\n"
          "  --seed S              the sampling generator's seed (default 0)\n"
          "  --no_cache            recompute the whole context for every token (slow; the\n"
          "                        reference for the key/value cache)\n\n"
          "The tokens/s figure goes to stderr. Exit status 0 on success, 1 when generation\n"
          "fails, 2 for a usage error or input that does not fit the model.\n",
          f);
}

typedef struct {
    const char *model, *tokenizer, *prompt, *prompt_file;
    ct_sample_config sample;
} options;

static int bad_value(const char *flag, const char *v, const char *want)
{
    fprintf(stderr, "ctrain generate: %s '%s' is not %s\n", flag, v, want);
    return 2;
}

static bool parse_i64(const char *s, int64_t lo, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo) return false;
    *out = v;
    return true;
}

static bool parse_f64(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* 0: parsed; 1: --help printed; 2: usage error (message on stderr) */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.sample = ct_sample_config_default()};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (strncmp(a, "--", 2)) {
            fprintf(stderr, "ctrain generate: unexpected argument '%s' (ctrain generate --help)\n", a);
            return 2;
        }
        /* --flag value or --flag=value */
        char name[64];
        const char *eq = strchr(a, '='), *val = NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, a, len);
        name[len] = 0;
        if (!strcmp(name, "--greedy") || !strcmp(name, "--no_cache")) {
            if (eq) {
                fprintf(stderr, "ctrain generate: %s takes no value\n", name);
                return 2;
            }
            if (!strcmp(name, "--greedy")) o->sample.greedy = true;
            else o->sample.use_cache = false;
            continue;
        }
        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        static const char *const takes_value[] = {"--model", "--tokenizer", "--prompt", "--prompt_file",
                                                  "--max_new_tokens", "--temperature", "--top_k", "--top_p", "--seed"};
        bool known = false;
        for (size_t k = 0; k < sizeof takes_value / sizeof *takes_value; k++) known |= !strcmp(name, takes_value[k]);
        if (!known) {
            fprintf(stderr, "ctrain generate: unknown flag '%s' (ctrain generate --help)\n", name);
            return 2;
        }
        if (!val) {
            fprintf(stderr, "ctrain generate: %s needs a value\n", name);
            return 2;
        }
        int64_t n;
        double d;
        if (!strcmp(name, "--model")) o->model = val;
        else if (!strcmp(name, "--tokenizer")) o->tokenizer = val;
        else if (!strcmp(name, "--prompt")) o->prompt = val;
        else if (!strcmp(name, "--prompt_file")) o->prompt_file = val;
        else if (!strcmp(name, "--max_new_tokens")) {
            if (!parse_i64(val, 0, &n)) return bad_value(name, val, "a whole number >= 0");
            o->sample.max_new_tokens = n;
        } else if (!strcmp(name, "--top_k")) {
            if (!parse_i64(val, 0, &n)) return bad_value(name, val, "a whole number >= 0 (0 = off)");
            o->sample.top_k = n;
        } else if (!strcmp(name, "--seed")) {
            if (!parse_i64(val, 0, &n)) return bad_value(name, val, "a whole number >= 0");
            o->sample.seed = (uint64_t)n;
        } else if (!strcmp(name, "--temperature")) {
            if (!parse_f64(val, &d) || !(d > 0)) return bad_value(name, val, "a number > 0");
            o->sample.temperature = d;
        } else {
            if (!parse_f64(val, &d) || !(d > 0 && d <= 1)) return bad_value(name, val, "a number in (0, 1]");
            o->sample.top_p = d;
        }
    }
    if (!o->model) {
        fprintf(stderr, "ctrain generate: --model DIR is missing (ctrain generate --help)\n");
        return 2;
    }
    if (!o->prompt == !o->prompt_file) {
        fprintf(stderr, "ctrain generate: give one of --prompt TEXT and --prompt_file FILE\n");
        return 2;
    }
    return 0;
}


typedef struct {
    const ct_bpe *bpe; /* NULL: tokens are bytes */
    int64_t produced;
    bool failed;
} printer;

/* writes the token's bytes and flushes, so the text appears as it is made */
static int print_token(int64_t token, void *ctx)
{
    printer *p = ctx;
    p->produced++;
    if (!p->bpe) {
        putchar((int)token);
    } else {
        char buf[256];
        uint32_t id = (uint32_t)token;
        int64_t n = ct_bpe_decode(p->bpe, &id, 1, buf, sizeof buf);
        char *big = n >= (int64_t)sizeof buf ? malloc((size_t)n + 1) : NULL;
        if (big) n = ct_bpe_decode(p->bpe, &id, 1, big, (size_t)n + 1);
        if (n < 0 || (n >= (int64_t)sizeof buf && !big)) {
            fprintf(stderr, "\nctrain generate: token %lld: %s\n", (long long)token,
                    n < 0 ? ct_last_error() : "out of memory");
            p->failed = true;
            free(big);
            return 1;
        }
        fwrite(big ? big : buf, 1, (size_t)n, stdout);
        free(big);
    }
    fflush(stdout);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The prompt's ids into *ids (malloc'd); 2 with a message when it does not fit. */
static int encode_prompt(ct_bpe *bpe, const ct_lm *lm, const char *text, size_t len, int64_t **ids, int64_t *n)
{
    *n = 0;
    *ids = NULL;
    if (!bpe) {
        if (!(*ids = malloc((len ? len : 1) * sizeof **ids))) return fprintf(stderr, "ctrain generate: out of memory\n"), 1;
        for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
        *n = (int64_t)len;
    } else {
        uint32_t *u = NULL;
        size_t cap = 0;
        int64_t m = ct_bpe_encode(bpe, text, len, &u, &cap);
        if (m < 0) {
            fprintf(stderr, "ctrain generate: the prompt: %s\n", ct_last_error());
            free(u);
            return 2;
        }
        *ids = malloc((size_t)(m ? m : 1) * sizeof **ids);
        if (!*ids) return free(u), fprintf(stderr, "ctrain generate: out of memory\n"), 1;
        for (int64_t i = 0; i < m; i++) (*ids)[i] = u[i];
        *n = m;
        free(u);
    }
    /* an empty prompt starts from the model's beginning-of-text token, if it has one */
    if (*n == 0 && lm->bos_token_id >= 0) (*ids)[(*n)++] = lm->bos_token_id;
    if (*n == 0) {
        fprintf(stderr, "ctrain generate: the prompt is empty and the model has no bos_token_id to start from\n");
        return 2;
    }
    for (int64_t i = 0; i < *n; i++)
        if ((*ids)[i] >= lm->vocab_size) {
            fprintf(stderr, "ctrain generate: prompt token %lld is outside the model's vocabulary of %lld: the "
                    "tokenizer does not belong to this model\n", (long long)(*ids)[i], (long long)lm->vocab_size);
            return 2;
        }
    return 0;
}

/* the tokenizer: --tokenizer, else DIR/tokenizer.json, else bytes for a 256-token model */
static int load_tokenizer(const options *o, const ct_lm *lm, ct_bpe **bpe)
{
    *bpe = NULL;
    char path[4096];
    const char *file = o->tokenizer;
    struct stat sb;
    if (!file) {
        snprintf(path, sizeof path, "%s/tokenizer.json", o->model);
        if (!stat(path, &sb)) file = path;
    }
    if (!file) {
        if (lm->vocab_size == 256) return 0;
        fprintf(stderr, "ctrain generate: %s has no tokenizer.json and the model's %lld tokens are not bytes (256); "
                "pass --tokenizer FILE\n", o->model, (long long)lm->vocab_size);
        return 2;
    }
    if (!(*bpe = ct_bpe_load(file))) {
        fprintf(stderr, "ctrain generate: %s\n", ct_last_error());
        return 2;
    }
    return 0;
}

int ct_generate_main(int argc, char **argv)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    struct stat sb;
    if (stat(o.model, &sb)) {
        fprintf(stderr, "ctrain generate: cannot open --model %s: %s\n", o.model, strerror(errno));
        return 2;
    }
    if (!S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "ctrain generate: --model %s is not a directory (config.json and the weights)\n", o.model);
        return 2;
    }
    size_t plen = 0;
    char *text = NULL;
    if (o.prompt_file && !(text = cti_file_read_text(o.prompt_file, MAX_PROMPT_BYTES, "--prompt_file", &plen))) {
        fprintf(stderr, "ctrain generate: %s\n", ct_last_error());
        return 2;
    }
    const char *prompt = text ? text : o.prompt;
    if (!text) plen = strlen(prompt);

    ct_lm *lm = ct_lm_from_pretrained(o.model);
    ct_bpe *bpe = NULL;
    int64_t *ids = NULL, *out = NULL, n = 0;
    if (!lm) {
        fprintf(stderr, "ctrain generate: %s\n", ct_last_error());
        rc = 2;
    }
    if (!rc) rc = load_tokenizer(&o, lm, &bpe);
    if (!rc) rc = encode_prompt(bpe, lm, prompt, plen, &ids, &n);
    if (!rc && n > lm->max_positions - o.sample.max_new_tokens) {
        fprintf(stderr, "ctrain generate: the prompt's %lld tokens + --max_new_tokens %lld exceed the model's %lld "
                "positions; shorten the prompt or ask for fewer tokens\n", (long long)n,
                (long long)o.sample.max_new_tokens, (long long)lm->max_positions);
        rc = 2;
    }
    /* a model without an end-of-text id stops at the tokenizer's */
    int64_t eos = bpe ? ct_bpe_eos_id(bpe) : -1;
    if (!rc && lm->eos_token_id < 0 && eos >= 0 && eos < lm->vocab_size) {
        o.sample.stop_ids = &eos;
        o.sample.n_stop_ids = 1;
    }
    if (!rc && !(out = malloc((size_t)(n + o.sample.max_new_tokens) * sizeof *out))) {
        fprintf(stderr, "ctrain generate: out of memory\n");
        rc = 1;
    }
    if (!rc) {
        fwrite(prompt, 1, plen, stdout);
        fflush(stdout);
        printer p = {.bpe = bpe};
        double t0 = now_s();
        int64_t made = ct_generate(lm, ids, n, &o.sample, print_token, &p, out);
        double dt = now_s() - t0;
        putchar('\n');
        fflush(stdout);
        if (made < 0 || p.failed) {
            if (made < 0) fprintf(stderr, "ctrain generate: %s\n", ct_last_error());
            rc = 1;
        } else {
            fprintf(stderr, "ctrain generate: %lld prompt tokens, %lld new tokens in %.3f s: %.1f tokens/s%s\n",
                    (long long)n, (long long)made, dt, dt > 0 ? (double)made / dt : 0.0,
                    o.sample.use_cache ? "" : " (no cache)");
        }
    }
    free(out);
    free(ids);
    ct_bpe_free(bpe);
    ct_lm_free(lm);
    free(text);
    return rc;
}
