/* libFuzzer target for the safetensors reader: any input must either fail
 * validation with an error or give tensors whose every byte can be read. ASan and
 * UBSan turn an out-of-bounds read, a leak or an overflow into a finding.
 *
 *   clang -std=c11 -D_GNU_SOURCE -O1 -g -I. -fopenmp -fsanitize=fuzzer,address,undefined \
 *       fuzz/fuzz_safetensors.c core/\*.c kernels/dispatch.c -lopenblas -ldnnl -lcjson -lm
 *   ./a.out -max_total_time=60 CORPUS_DIR fuzz/corpus/fuzz_safetensors
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "core/frame.h"
#include "core/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ct_safetensors *f = ct_safetensors_open_memory(data, size, "fuzz");
    if (!f) {
        CT_ASSERT(ct_last_status() != CT_OK && strstr(ct_last_error(), "safetensors 'fuzz'") != NULL);
        return 0;
    }
    volatile uint64_t sum = 0;
    CT_FRAME {
        for (int i = 0; i < ct_safetensors_count(f); i++) {
            const char *name = ct_safetensors_name(f, i);
            ct_dtype dt;
            int ndim;
            int64_t shape[CT_MAX_DIMS];
            CT_ASSERT(name && ct_safetensors_info(f, name, &dt, &ndim, shape));
            ct_tensor *t = ct_safetensors_get(f, name);
            CT_ASSERT(t != NULL && t->dtype == dt && t->ndim == ndim);
            const uint8_t *p = ct_tensor_data(t);
            size_t n = ct_tensor_nbytes(t);
            for (size_t k = 0; k < n; k++) sum += p[k];
        }
        for (int i = 0; i < ct_safetensors_metadata_count(f); i++)
            CT_ASSERT(ct_safetensors_metadata(f, ct_safetensors_metadata_key(f, i)) != NULL);
    }
    ct_safetensors_close(f);
    (void)sum;
    return 0;
}
