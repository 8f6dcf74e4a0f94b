/* libFuzzer target for the Llama config.json reader (nn/llama_hf.c): any bytes must
 * either be rejected with an error naming the file, or give a resolved config that
 * ct_llama_new would accept (positive sizes, key/value heads dividing the query heads,
 * an even head_dim), which writes back to JSON and reads again to the same config.
 *
 *   make fuzz      (or clang ... -fsanitize=fuzzer,address,undefined fuzz/fuzz_llama_config.c
 *                   with the library's sources, as the Makefile's fuzz rule builds it)
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nn/llama.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    ct_llama_config c;
    if (ct_llama_config_from_json(text, "fuzz", &c) != CT_OK) {
        CT_ASSERT(strncmp(ct_last_error(), "config fuzz", 11) == 0);
        free(text);
        return 0;
    }
    CT_ASSERT(c.vocab_size >= 1 && c.hidden_size >= 1 && c.intermediate_size >= 1 && c.num_hidden_layers >= 1);
    CT_ASSERT(c.num_attention_heads >= 1 && c.num_key_value_heads >= 1 && c.head_dim >= 2 && c.head_dim % 2 == 0);
    CT_ASSERT(c.num_attention_heads % c.num_key_value_heads == 0);
    CT_ASSERT(c.rms_norm_eps > 0 && c.rope_theta > 0 && !c.attention_bias && !c.mlp_bias);
    CT_ASSERT(c.bos_token_id >= -1 && c.eos_token_id >= -1 && c.pad_token_id >= -1);
    char *json = ct_llama_config_to_json(&c);
    CT_ASSERT(json != NULL);
    ct_llama_config d;
    CT_ASSERT(ct_llama_config_from_json(json, "again", &d) == CT_OK);
    CT_ASSERT(d.vocab_size == c.vocab_size && d.hidden_size == c.hidden_size && d.head_dim == c.head_dim &&
              d.num_key_value_heads == c.num_key_value_heads && d.rope_scaling.type == c.rope_scaling.type &&
              d.rms_norm_eps == c.rms_norm_eps && d.rope_theta == c.rope_theta &&
              d.rope_scaling.factor == c.rope_scaling.factor &&
              d.tie_word_embeddings == c.tie_word_embeddings);
    /* ids outside the vocabulary are written as null */
    CT_ASSERT(d.bos_token_id == (c.bos_token_id < c.vocab_size ? c.bos_token_id : -1));
    free(json);
    free(text);
    return 0;
}
