/* Text from a causal language model in a few calls.
 *
 *   ./generate MODEL_DIR "Once upon a time" [MAX_NEW_TOKENS]
 *
 * MODEL_DIR is a Hugging Face model directory (config.json + model.safetensors), such
 * as the one examples/gpt/train.c writes (byte tokens) or a GPT-2 download (with its
 * tokenizer.json). The model is loaded by its config.json's model_type, the prompt is
 * tokenized, and ct_generate samples with a key/value cache, calling back with each
 * token so that it is printed as soon as it exists. `ctrain generate` is the same with
 * every option.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrain.h"

typedef struct {
    const ct_bpe *bpe; /* NULL: one token per byte */
} printer;

/* each new token's bytes, at once */
static int print_token(int64_t token, void *ctx)
{
    const printer *p = ctx;
    char buf[256];
    uint32_t id = (uint32_t)token;
    int64_t n = p->bpe ? ct_bpe_decode(p->bpe, &id, 1, buf, sizeof buf) : (buf[0] = (char)token, 1);
    if (n < 0 || n > (int64_t)sizeof buf) return 1; /* not a token of this tokenizer: stop */
    fwrite(buf, 1, (size_t)n, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR PROMPT [MAX_NEW_TOKENS]\n", argv[0]);
        return 2;
    }
    /* (1) the model, by its config.json */
    ct_lm *lm = ct_lm_from_pretrained(argv[1]);
    if (!lm) {
        fprintf(stderr, "%s\n", ct_last_error());
        return 1;
    }
    /* (2) the tokenizer: DIR/tokenizer.json, or bytes for a 256-token model */
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", argv[1]);
    ct_bpe *bpe = access(path, R_OK) == 0 ? ct_bpe_load(path) : NULL;
    if (!bpe && lm->vocab_size != 256) {
        fprintf(stderr, "%s: no usable tokenizer.json (%s)\n", argv[1], ct_last_error());
        ct_lm_free(lm);
        return 1;
    }
    const char *text = argv[2];
    uint32_t *ids = NULL;
    size_t cap = 0;
    int64_t n = (int64_t)strlen(text);
    if (bpe) {
        n = ct_bpe_encode(bpe, text, strlen(text), &ids, &cap);
    } else if ((ids = malloc((size_t)n * sizeof *ids + 1))) {
        for (int64_t i = 0; i < n; i++) ids[i] = (unsigned char)text[i];
    }
    /* (3) sampling settings: the defaults, then a few changes */
    ct_sample_config cfg = ct_sample_config_default();
    cfg.max_new_tokens = argc > 3 ? atoll(argv[3]) : 100;
    cfg.temperature = 0.8;
    cfg.top_k = 40;
    int64_t *prompt = n > 0 ? malloc((size_t)n * sizeof *prompt) : NULL;
    int64_t *out = n > 0 ? malloc((size_t)(n + cfg.max_new_tokens) * sizeof *out) : NULL;
    int rc = 1;
    if (!prompt || !out || !ids) {
        fprintf(stderr, "an empty prompt, or out of memory\n");
    } else {
        for (int64_t i = 0; i < n; i++) prompt[i] = ids[i];
        fputs(text, stdout);
        /* (4) generate: the prompt once through the model, then one token at a time */
        printer p = {bpe};
        int64_t made = ct_generate(lm, prompt, n, &cfg, print_token, &p, out);
        putchar('\n');
        if (made < 0) fprintf(stderr, "%s\n", ct_last_error());
        else rc = 0;
    }
    free(out);
    free(prompt);
    free(ids);
    ct_bpe_free(bpe);
    ct_lm_free(lm);
    return rc;
}
