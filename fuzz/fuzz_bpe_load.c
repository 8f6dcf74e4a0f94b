/* libFuzzer target for the BPE loaders (data/bpe_load.c): any input, read as a
 * tokenizer.json and as a GPT-2 vocab.json or merges.txt (beside a small valid
 * partner), must either fail with an error naming the file or give a tokenizer
 * that encodes text (the input itself) into ids that decode back to that text.
 * ASan and UBSan turn an out-of-bounds read, a leak or an overflow into a finding.
 *
 *   make fuzz   (or: clang -std=c11 -D_GNU_SOURCE -O1 -g -I. -fopenmp
 *       -fsanitize=fuzzer,address,undefined fuzz/fuzz_bpe_load.c core/\*.c ... data/\*.c
 *       -lopenblas -ldnnl -lcjson -lyaml -luv -lxxhash -lpcre2-8 -lm)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "data/bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* a tokenizer loaded from the input: encodes the input, decodes it back */
static void exercise(ct_bpe *b, const uint8_t *data, size_t size, int prefix_space_possible)
{
    uint32_t *ids = NULL;
    size_t cap = 0;
    int64_t n = ct_bpe_encode(b, data, size, &ids, &cap);
    CT_ASSERT(n >= 0);
    int64_t len = ct_bpe_decode(b, ids, (size_t)n, NULL, 0);
    CT_ASSERT(len >= 0);
    char *text = malloc((size_t)len + 1);
    CT_ASSERT(text && ct_bpe_decode(b, ids, (size_t)n, text, (size_t)len + 1) == len);
    /* add_prefix_space adds a space at the start of each stretch between added tokens */
    if (!prefix_space_possible) CT_ASSERT(len == (int64_t)size && !memcmp(text, data, size));
    free(text);
    free(ids);
    CT_ASSERT(ct_bpe_vocab_size(b) > 0);
}

static char *write_temp(const char *tag, const void *p, size_t n)
{
    char *path = malloc(64);
    CT_ASSERT(path);
    snprintf(path, 64, "/tmp/fuzz_bpe_%s_%ld", tag, (long)getpid());
    FILE *fp = fopen(path, "wb");
    CT_ASSERT(fp && fwrite(p, 1, n, fp) == n && fclose(fp) == 0);
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ct_bpe *b = ct_bpe_load_memory(data, size, "fuzz");
    if (!b) {
        CT_ASSERT(ct_last_status() != CT_OK && strstr(ct_last_error(), "'fuzz'") != NULL);
    } else {
        exercise(b, data, size, memmem(data, size, "add_prefix_space", 16) != NULL);
        ct_bpe_free(b);
    }

    /* the GPT-2 pair: the input as merges.txt beside a vocabulary of the 256 bytes
     * and "ab", and as vocab.json beside the merges "a b" */
    static const char vocab_head[] = "{\"ab\": 256";
    char vocab[8192] = "";
    strcpy(vocab, vocab_head);
    for (int c = 0, n = 0; c < 256; c++) {
        int cp = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174 ? c : 256 + n++;
        size_t at = strlen(vocab);
        if (cp == '"' || cp == '\\') snprintf(vocab + at, sizeof vocab - at, ", \"\\%c\": %d", cp, c);
        else if (cp < 0x80) snprintf(vocab + at, sizeof vocab - at, ", \"%c\": %d", cp, c);
        else snprintf(vocab + at, sizeof vocab - at, ", \"%c%c\": %d", 0xC0 | cp >> 6, 0x80 | (cp & 0x3F), c);
    }
    strcat(vocab, "}");
    char *good_vocab = write_temp("vocab", vocab, strlen(vocab));
    char *good_merges = write_temp("merges", "#version: 0.2\na b\n", 18);
    char *input = write_temp("input", data, size);
    b = ct_bpe_load_gpt2(good_vocab, input);
    if (!b) CT_ASSERT(strstr(ct_last_error(), input) != NULL);
    else exercise(b, data, size, 0), ct_bpe_free(b);
    b = ct_bpe_load_gpt2(input, good_merges);
    if (!b) CT_ASSERT(strstr(ct_last_error(), input) != NULL || strstr(ct_last_error(), good_merges) != NULL);
    else exercise(b, data, size, 0), ct_bpe_free(b);
    unlink(good_vocab), unlink(good_merges), unlink(input);
    free(good_vocab), free(good_merges), free(input);
    return 0;
}
