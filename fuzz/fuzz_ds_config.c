/* libFuzzer target for the ds_config.json reader (accel/ds_config.c): any bytes must
 * either be rejected with an error naming the file, or give a config whose values
 * are inside the documented ranges and which resolves (or is refused with an error)
 * against a few Accelerator settings. ASan and UBSan turn an out-of-bounds read, a
 * leak or an overflow into a finding.
 *
 *   clang -std=c11 -D_GNU_SOURCE -O1 -g -I. -fopenmp -fsanitize=fuzzer,address,undefined \
 *       fuzz/fuzz_ds_config.c accel/ds_config.c core/error.c -lcjson
 *   ./a.out -max_total_time=60 CORPUS_DIR
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "accel/ds_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ct_ds_config c;
    if (ct_ds_config_parse((const char *)data, size, "fuzz", &c) != CT_OK) {
        CT_ASSERT(strstr(ct_last_error(), "ds_config 'fuzz'") != NULL);
        CT_ASSERT(c.zero.stage == 0 && c.n_warnings == 0);
        return 0;
    }
    CT_ASSERT(c.zero.stage >= 0 && c.zero.stage <= 3);
    CT_ASSERT(c.zero.reduce_bucket_size >= 1 && c.zero.allgather_bucket_size >= 1);
    CT_ASSERT(c.zero.stage3_prefetch_bucket_size >= 0 && c.zero.stage3_param_persistence_threshold >= 0);
    CT_ASSERT(c.fp16.initial_scale_power >= 0 && c.fp16.initial_scale_power <= 63);
    CT_ASSERT(c.fp16.hysteresis >= 1 && c.fp16.loss_scale_window >= 1 && c.fp16.min_loss_scale > 0);
    CT_ASSERT(c.zero.offload_param == CT_DS_OFFLOAD_NONE || c.zero.stage == 3);
    for (int i = 0; i < c.n_warnings && i < CT_DS_MAX_WARNINGS; i++)
        CT_ASSERT(strncmp(c.warnings[i], "ds_config 'fuzz'", 16) == 0);
    /* the settings come from the size, so the bytes stay a plain file */
    static const char *const mp[] = {NULL, "no", "fp16", "bf16"};
    ct_ds_defaults d = {.world_size = 1 + (int)(size % 4),
                        .micro_batch = (int64_t)(size % 5),
                        .grad_accum = (int64_t)(size % 3),
                        .grad_clip = (size & 8) ? 1.0 : -1,
                        .mixed_precision = mp[(size >> 4) % 4],
                        .hidden_size = (size & 64) ? 768 : 0};
    ct_ds_config r = c;
    if (ct_ds_config_resolve(&r, "fuzz", &d) != CT_OK) {
        CT_ASSERT(strstr(ct_last_error(), "ds_config 'fuzz'") != NULL);
        return 0;
    }
    CT_ASSERT(r.train_micro_batch_size_per_gpu >= 1 && r.gradient_accumulation_steps >= 1);
    CT_ASSERT(r.train_batch_size == r.train_micro_batch_size_per_gpu * r.gradient_accumulation_steps * d.world_size);
    CT_ASSERT(!(r.fp16.enabled && r.bf16_enabled));
    return 0;
}
