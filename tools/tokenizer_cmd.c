/* `ctrain tokenizer train|encode` (tools/tokenizer_cmd.h): the commands around
 * ct_bpe_train (data/bpe_train.h) and ct_bpe_encode_files (data/bpe.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/bpe.h"
#include "data/bpe_train.h"
#include "tools/tokenizer_cmd.h"

static void usage(FILE *f)
{
    fputs("usage: ctrain tokenizer train --vocab_size N [--min_frequency K] [--special_tokens A,B,...]\n"
          "                              --output DIR FILE...\n"
          "       ctrain tokenizer encode --tokenizer FILE --output OUT.bin [--separator TOKEN] FILE...\n\n"
          "train: learns a byte-level BPE tokenizer from the text FILEs, as Hugging Face tokenizers'\n"
          "BpeTrainer does with a ByteLevel pre-tokenizer (same vocabulary, same merges), and writes\n"
          "DIR/tokenizer.json (DIR is created). The special tokens get ids 0, 1, ..., the 256 bytes\n"
          "the next ids, then the merges until the vocabulary has N tokens; a pair seen fewer than K\n"
          "times (default 0: any) is never merged. Each line of a file is one sequence.\n\n"
          "encode: encodes the FILEs, one after another, with the tokenizer.json FILE into the llm.c\n"
          "token file OUT.bin (uint16 tokens when the vocabulary fits, else uint32); with --separator\n"
          "that token (e.g. '<|endoftext|>') is written before each file's tokens.\n\n"
          "Flags take their value as the next argument or after '='.\n"
          "Exit status 0 on success, 1 when training, encoding or writing fails, 2 for a usage error.\n",
          f);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "--name value" or "--name=value": the value, or NULL when argv[*i] is not that
 * flag; *missing when the flag has no value */
static const char *flag_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n)) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n]) return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

/* a whole decimal number in [lo, hi] */
static bool parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* every input exists and is a readable regular file */
static bool check_inputs(const char *cmd, char **paths, int n)
{
    if (n == 0) {
        fprintf(stderr, "ctrain tokenizer %s: no input FILE (ctrain tokenizer --help)\n", cmd);
        return false;
    }
    for (int i = 0; i < n; i++) {
        struct stat sb;
        const char *why = stat(paths[i], &sb) != 0   ? strerror(errno)
                          : !S_ISREG(sb.st_mode)     ? "not a regular file"
                          : access(paths[i], R_OK) ? strerror(errno)
                                                   : NULL;
        if (why) {
            fprintf(stderr, "ctrain tokenizer %s: input '%s': %s\n", cmd, paths[i], why);
            return false;
        }
    }
    return true;
}

/* mkdir -p */
static bool make_dirs(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return errno = ENAMETOOLONG, false;
    for (char *s = p + 1;; s++) {
        if (*s && *s != '/') continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return false;
        *s = c;
        if (!c) break;
    }
    struct stat sb;
    if (stat(p, &sb) != 0) return false;
    if (!S_ISDIR(sb.st_mode)) return errno = ENOTDIR, false;
    return true;
}

/* splits "a,b,c" into tokens appended to *list (copies; empty items refused) */
static bool add_specials(const char *arg, char ***list, size_t *n)
{
    const char *s = arg;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (len == 0) {
            fprintf(stderr, "ctrain tokenizer train: --special_tokens '%s' holds an empty token\n", arg);
            return false;
        }
        char **l = realloc(*list, (*n + 1) * sizeof *l);
        char *copy = l ? strndup(s, len) : NULL;
        if (l) *list = l;
        if (!copy) {
            fprintf(stderr, "ctrain tokenizer train: out of memory\n");
            return false;
        }
        l[(*n)++] = copy;
        if (!comma) return true;
        s = comma + 1;
    }
}

static int train_main(int argc, char **argv)
{
    long long vocab_size = -1, min_frequency = 0;
    const char *output = NULL;
    char **special = NULL, **inputs = calloc((size_t)argc, sizeof *inputs);
    size_t nspecial = 0;
    int ninputs = 0, code = 2;
    if (!inputs) {
        fprintf(stderr, "ctrain tokenizer train: out of memory\n");
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        bool missing = false;
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            code = 0;
            goto done;
        } else if ((v = flag_value(argc, argv, &i, "--vocab_size", &missing))) {
            if (!parse_int(v, 1, 1 << 24, &vocab_size)) {
                fprintf(stderr, "ctrain tokenizer train: --vocab_size '%s' is not a whole number in [1, %d]\n", v,
                        1 << 24);
                goto done;
            }
        } else if ((v = flag_value(argc, argv, &i, "--min_frequency", &missing))) {
            if (!parse_int(v, 0, INT64_MAX, &min_frequency)) {
                fprintf(stderr, "ctrain tokenizer train: --min_frequency '%s' is not a whole number >= 0\n", v);
                goto done;
            }
        } else if ((v = flag_value(argc, argv, &i, "--special_tokens", &missing))) {
            if (!add_specials(v, &special, &nspecial)) goto done;
        } else if ((v = flag_value(argc, argv, &i, "--output", &missing))) {
            output = v;
        } else if (missing) {
            fprintf(stderr, "ctrain tokenizer train: %s needs a value\n", argv[i]);
            goto done;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "ctrain tokenizer train: unknown flag '%s' (ctrain tokenizer --help)\n", argv[i]);
            goto done;
        } else {
            inputs[ninputs++] = argv[i];
        }
    }
    if (vocab_size < 0 || !output) {
        fprintf(stderr, "ctrain tokenizer train: %s is required (ctrain tokenizer --help)\n",
                vocab_size < 0 ? "--vocab_size" : "--output");
        goto done;
    }
    if (vocab_size < (long long)nspecial + 256) {
        fprintf(stderr,
                "ctrain tokenizer train: --vocab_size %lld is too small: the %zu special tokens and the 256 bytes "
                "need %zu ids before the first merge\n",
                vocab_size, nspecial, nspecial + 256);
        goto done;
    }
    if (!check_inputs("train", inputs, ninputs)) goto done;
    if (!make_dirs(output)) {
        fprintf(stderr, "ctrain tokenizer train: cannot create the output directory '%s': %s\n", output,
                strerror(errno));
        code = 1;
        goto done;
    }
    char out[4096];
    if (snprintf(out, sizeof out, "%s/tokenizer.json", output) >= (int)sizeof out) {
        fprintf(stderr, "ctrain tokenizer train: the output path '%s' is too long\n", output);
        goto done;
    }
    ct_bpe_train_config cfg = {.vocab_size = vocab_size,
                               .min_frequency = min_frequency,
                               .special_tokens = (const char *const *)special,
                               .nspecial = nspecial};
    double t0 = now();
    ct_bpe_trainer *t = ct_bpe_trainer_new(&cfg);
    if (!t) { /* the settings: a special token that is not UTF-8 */
        fprintf(stderr, "ctrain tokenizer train: %s\n", ct_last_error());
        goto done;
    }
    code = 1;
    ct_status st = CT_OK;
    for (int i = 0; i < ninputs && !st; i++) st = ct_bpe_trainer_feed_file(t, inputs[i]);
    if (!st) st = ct_bpe_trainer_save(t, out);
    double seconds = now() - t0;
    if (st) {
        fprintf(stderr, "ctrain tokenizer train: %s\n", ct_last_error());
    } else {
        printf("trained %lld tokens (%zu special, 256 bytes, %lld merges) on %d file%s in %.2f s: %s\n",
               (long long)ct_bpe_trainer_vocab_size(t), nspecial, (long long)ct_bpe_trainer_merge_count(t), ninputs,
               ninputs == 1 ? "" : "s", seconds, out);
        code = 0;
    }
    ct_bpe_trainer_free(t);
done:
    for (size_t i = 0; i < nspecial; i++) free(special[i]);
    free(special);
    free(inputs);
    return code;
}

static int encode_main(int argc, char **argv)
{
    const char *tokenizer = NULL, *output = NULL, *separator = NULL;
    char **inputs = calloc((size_t)argc, sizeof *inputs);
    int ninputs = 0, code = 2;
    if (!inputs) {
        fprintf(stderr, "ctrain tokenizer encode: out of memory\n");
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        bool missing = false;
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            code = 0;
            goto done;
        } else if ((v = flag_value(argc, argv, &i, "--tokenizer", &missing))) {
            tokenizer = v;
        } else if ((v = flag_value(argc, argv, &i, "--output", &missing))) {
            output = v;
        } else if ((v = flag_value(argc, argv, &i, "--separator", &missing))) {
            separator = v;
        } else if (missing) {
            fprintf(stderr, "ctrain tokenizer encode: %s needs a value\n", argv[i]);
            goto done;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "ctrain tokenizer encode: unknown flag '%s' (ctrain tokenizer --help)\n", argv[i]);
            goto done;
        } else {
            inputs[ninputs++] = argv[i];
        }
    }
    if (!tokenizer || !output) {
        fprintf(stderr, "ctrain tokenizer encode: %s is required (ctrain tokenizer --help)\n",
                !tokenizer ? "--tokenizer" : "--output");
        goto done;
    }
    if (!check_inputs("encode", inputs, ninputs) || !check_inputs("encode", (char **)&tokenizer, 1)) goto done;
    ct_bpe *b = ct_bpe_load(tokenizer);
    if (!b) {
        fprintf(stderr, "ctrain tokenizer encode: %s\n", ct_last_error());
        code = 1;
        goto done;
    }
    int64_t sep = -1;
    if (separator && (sep = ct_bpe_token_id(b, separator, strlen(separator))) < 0) {
        fprintf(stderr, "ctrain tokenizer encode: --separator '%s' is not a token of '%s'\n", separator, tokenizer);
    } else {
        double t0 = now();
        int64_t ntokens = 0;
        if (ct_bpe_encode_files(b, (const char *const *)inputs, (size_t)ninputs, sep, output, &ntokens)) {
            fprintf(stderr, "ctrain tokenizer encode: %s\n", ct_last_error());
            code = 1;
        } else {
            printf("encoded %d file%s into %lld tokens in %.2f s: %s\n", ninputs, ninputs == 1 ? "" : "s",
                   (long long)ntokens, now() - t0, output);
            code = 0;
        }
    }
    ct_bpe_free(b);
done:
    free(inputs);
    return code;
}

int ct_tokenizer_main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "train")) return train_main(argc, argv);
    if (!strcmp(argv[1], "encode")) return encode_main(argc, argv);
    fprintf(stderr, "ctrain tokenizer: unknown action '%s': expected train or encode (ctrain tokenizer --help)\n",
            argv[1]);
    return 2;
}
