/* libFuzzer target for the token-file parser (data/token_dataset.c): any input,
 * read as each format, must either fail validation with an error naming the file
 * or give a dataset whose every window can be read (or rejected by the vocab check
 * with an error). ASan and UBSan turn an out-of-bounds read, a leak or an overflow
 * into a finding.
 *
 *   clang -std=c11 -D_GNU_SOURCE -O1 -g -I. -fopenmp -fsanitize=fuzzer,address,undefined \
 *       fuzz/fuzz_token_file.c core/\*.c kernels/dispatch.c data/\*.c -lopenblas -ldnnl -lcjson -luv -lm
 *   ./a.out -max_total_time=60 CORPUS_DIR
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "core/frame.h"
#include "data/token_dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const ct_token_format formats[3] = {CT_TOKENS_LLMC, CT_TOKENS_RAW_U16, CT_TOKENS_RAW_U32};
    /* the config comes from the size, so the bytes stay a plain file */
    int64_t block = 1 + (int64_t)(size % 7);
    for (int f = 0; f < 3; f++) {
        ct_token_file_info info;
        ct_status pst = ct_token_file_parse(data, size, "fuzz", formats[f], &info);
        ct_token_dataset_config cfg = {.block_size = block,
                                       .stride = (int64_t)(size % 3),
                                       .vocab_size = (size & 8) ? 50257 : 0,
                                       .format = formats[f],
                                       .dtype = (size & 16) ? CT_DTYPE_I32 : CT_DTYPE_I64};
        ct_dataset *ds = ct_token_dataset_open_memory(data, size, "fuzz", &cfg);
        if (!ds) {
            CT_ASSERT(ct_last_status() != CT_OK && strstr(ct_last_error(), "token file 'fuzz'") != NULL);
            continue;
        }
        /* a dataset opens only from a file that parses, and agrees with the parse */
        CT_ASSERT(pst == CT_OK);
        const ct_token_file_info *fi = ct_token_dataset_file(ds);
        CT_ASSERT(fi && fi->ntokens == info.ntokens && fi->token_bytes == info.token_bytes);
        CT_ASSERT((uint64_t)info.header_bytes + (uint64_t)info.ntokens * (uint64_t)info.token_bytes == size);
        int64_t n = ct_dataset_len(ds);
        CT_ASSERT(n >= 1);
        volatile int64_t sum = 0;
        CT_FRAME {
            ct_tensor *x = ct_tensor_empty(ds->slots[0].dtype, CT_SHAPE(1, block));
            ct_tensor *y = ct_tensor_empty(ds->slots[1].dtype, CT_SHAPE(1, block));
            ct_tensor *slots[2] = {x, y};
            for (int64_t i = 0; i < n && i < 256; i++) {
                if (ct_dataset_get(ds, i, slots, 0) != CT_OK) {
                    CT_ASSERT(strstr(ct_last_error(), "token file 'fuzz'") != NULL);
                    continue;
                }
                for (int64_t t = 0; t < block; t++) {
                    int64_t a = (int64_t)ct_tensor_get(x, (int64_t[]){0, t});
                    int64_t b = (int64_t)ct_tensor_get(y, (int64_t[]){0, t});
                    CT_ASSERT(cfg.vocab_size == 0 || (a < cfg.vocab_size && b < cfg.vocab_size));
                    sum += a + b;
                }
            }
            /* one past the end is an argument error, never a read */
            CT_ASSERT(ct_dataset_get(ds, n, slots, 0) == CT_ERR_INVALID);
        }
        (void)sum;
        ct_dataset_free(ds);
    }
    return 0;
}
