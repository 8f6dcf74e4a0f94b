/* Byte-level BPE encoding speed: ct_bpe_encode on a text file, one thread.
 *
 *   bpe_encode TOKENIZER_JSON TEXT [REPS]
 *
 * Each of REPS rounds (default 5) loads the tokenizer afresh (so its cache of
 * pieces starts empty, as for a new corpus) and encodes the whole file as one text;
 * only the encoding is timed. Prints the median seconds, MB/s, the token count and
 * the sum of the ids (run.sh compares both with Hugging Face's). */
#include <stdio.h>
#include <stdlib.h>

#include "bench/timing.h"
#include "data/bpe.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT [REPS]\n", argv[0]);
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "bpe_encode: REPS must be in [1, 1000], not '%s'\n", argv[3]);
        return 2;
    }
    FILE *fp = fopen(argv[2], "rb");
    if (!fp) {
        perror(argv[2]);
        return 1;
    }
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, fp) != (size_t)n) {
        fprintf(stderr, "bpe_encode: cannot read '%s'\n", argv[2]);
        return 1;
    }
    fclose(fp);
    double *t = malloc((size_t)reps * sizeof *t);
    int64_t count = 0;
    unsigned long long sum = 0;
    for (int r = 0; r < reps; r++) {
        ct_bpe *b = ct_bpe_load(argv[1]);
        if (!b) {
            fprintf(stderr, "%s\n", ct_last_error());
            return 1;
        }
        uint32_t *ids = NULL;
        size_t cap = 0;
        double t0 = now();
        count = ct_bpe_encode(b, text, (size_t)n, &ids, &cap);
        t[r] = now() - t0;
        if (count < 0) {
            fprintf(stderr, "%s\n", ct_last_error());
            return 1;
        }
        sum = 0;
        for (int64_t i = 0; i < count; i++) sum += ids[i];
        free(ids);
        ct_bpe_free(b);
    }
    double med = median(t, reps);
    printf("ctrain seconds %.4f MB/s %.2f tokens %lld idsum %llu\n", med, (double)n / med / 1e6, (long long)count, sum);
    free(t);
    free(text);
    return 0;
}
