/* Byte-level BPE encoding speed: ct_bpe_encode on a text file, one thread.
 *
 *   bpe_encode TOKENIZER_JSON TEXT [REPS]
 *
 * Each of REPS rounds (default 5) loads the tokenizer afresh (so its cache of
 * pieces starts empty, as for a new corpus) and encodes the file twice: whole, as
 * one text ("whole"), and line by line, one call per line without its "\n"
 * ("lines"); only the encoding is timed. Prints, for each, the median seconds, MB/s,
 * the token count and the sum of the ids (run.sh compares both with Hugging Face's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    double *t = malloc(2 * (size_t)reps * sizeof *t);
    int64_t count[2] = {0};
    unsigned long long sum[2] = {0};
    for (int r = 0; r < reps; r++) {
        for (int mode = 0; mode < 2; mode++) {
            ct_bpe *b = ct_bpe_load(argv[1]);
            if (!b) {
                fprintf(stderr, "%s\n", ct_last_error());
                return 1;
            }
            uint32_t *ids = NULL;
            size_t cap = 0;
            int64_t k = 0;
            double t0 = now();
            if (mode == 0) k = ct_bpe_encode(b, text, (size_t)n, &ids, &cap);
            else
                for (long i = 0; i <= n && k >= 0;) { /* ids accumulate: each call appends */
                    const char *nl = memchr(text + i, '\n', (size_t)(n - i));
                    long len = nl ? nl - (text + i) : n - i;
                    uint32_t *more = NULL;
                    size_t more_cap = 0;
                    int64_t m = ct_bpe_encode(b, text + i, (size_t)len, &more, &more_cap);
                    if (m < 0) k = -1;
                    else {
                        if ((size_t)(k + m) > cap) {
                            cap = 2 * (size_t)(k + m);
                            ids = realloc(ids, cap * sizeof *ids);
                        }
                        memcpy(ids + k, more, (size_t)m * sizeof *ids);
                        k += m;
                    }
                    free(more);
                    if (!nl) break;
                    i += len + 1;
                }
            t[mode * reps + r] = now() - t0;
            if (k < 0) {
                fprintf(stderr, "%s\n", ct_last_error());
                return 1;
            }
            count[mode] = k;
            sum[mode] = 0;
            for (int64_t i = 0; i < k; i++) sum[mode] += ids[i];
            free(ids);
            ct_bpe_free(b);
        }
    }
    for (int mode = 0; mode < 2; mode++) {
        double med = median(t + mode * reps, reps);
        printf("ctrain %s seconds %.4f MB/s %.2f tokens %lld idsum %llu\n", mode ? "lines" : "whole", med,
               (double)n / med / 1e6, (long long)count[mode], sum[mode]);
    }
    free(t);
    free(text);
    return 0;
}
