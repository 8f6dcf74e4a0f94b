/* Built-in model shapes for the command line (tools/model_spec.h). */
#include "tools/model_spec.h"

#include <string.h>

/* The Llama presets' token ids: bos, eos; no padding token */
#define LLAMA_IDS(bos, eos) .token_ids_set = true, .bos_token_id = bos, .eos_token_id = eos, .pad_token_id = -1
#define LLAMA3_ROPE(f) {CT_ROPE_LLAMA3, f, 1.0, 4.0, 8192}

/* GPT: vocab, block, layers, heads, width: w1 and wide are ctrain's benchmark shapes
 * (bench/README.md), gpt2* HuggingFace's GPT2Config presets (bos = eos = <|endoftext|>).
 * Llama: llama:w1 is ctrain's benchmark Llama (bench/gpt_cpu's llama-w1, with 256
 * positions); the others are the config.json of TinyLlama/TinyLlama-1.1B-Chat-v1.0,
 * meta-llama/Llama-3.2-1B, meta-llama/Llama-3.2-3B and meta-llama/Meta-Llama-3-8B. */
static const ct_model_spec SPECS[] = {
    {.name = "gpt:w1", .about = "ctrain's byte-level test GPT",
     .gpt = {256, 256, 4, 4, 256, 0, 1e-5, CT_DTYPE_F32, false, -1, -1}},
    {.name = "gpt:wide", .about = "ctrain's wide benchmark GPT",
     .gpt = {256, 256, 12, 12, 768, 0, 1e-5, CT_DTYPE_F32, false, -1, -1}},
    {.name = "gpt2", .about = "GPT-2 small (124M)",
     .gpt = {50257, 1024, 12, 12, 768, 0, 1e-5, CT_DTYPE_F32, true, 50256, 50256}},
    {.name = "gpt2-medium", .about = "GPT-2 medium (355M)",
     .gpt = {50257, 1024, 24, 16, 1024, 0, 1e-5, CT_DTYPE_F32, true, 50256, 50256}},
    {.name = "gpt2-large", .about = "GPT-2 large (774M)",
     .gpt = {50257, 1024, 36, 20, 1280, 0, 1e-5, CT_DTYPE_F32, true, 50256, 50256}},
    {.name = "gpt2-xl", .about = "GPT-2 XL (1.5B)",
     .gpt = {50257, 1024, 48, 25, 1600, 0, 1e-5, CT_DTYPE_F32, true, 50256, 50256}},
    {.name = "llama:w1", .about = "ctrain's benchmark Llama", .kind = CT_MODEL_LLAMA,
     .llama = {.vocab_size = 2048, .hidden_size = 256, .intermediate_size = 688, .num_hidden_layers = 4,
      .num_attention_heads = 4, .num_key_value_heads = 2, .max_position_embeddings = 256}},
    {.name = "tinyllama-1.1b", .about = "TinyLlama 1.1B", .kind = CT_MODEL_LLAMA,
     .llama = {.vocab_size = 32000, .hidden_size = 2048, .intermediate_size = 5632, .num_hidden_layers = 22,
      .num_attention_heads = 32, .num_key_value_heads = 4, .max_position_embeddings = 2048, .rms_norm_eps = 1e-5,
      .rope_theta = 10000, LLAMA_IDS(1, 2)}},
    {.name = "llama-3.2-1b", .about = "Llama 3.2 1B (tied head)", .kind = CT_MODEL_LLAMA, .seq_len = 4096,
     .llama = {.vocab_size = 128256, .hidden_size = 2048, .intermediate_size = 8192, .num_hidden_layers = 16,
      .num_attention_heads = 32, .num_key_value_heads = 8, .head_dim = 64, .max_position_embeddings = 131072,
      .rms_norm_eps = 1e-5, .rope_theta = 500000, .rope_scaling = LLAMA3_ROPE(32.0), .tie_word_embeddings = true,
      LLAMA_IDS(128000, 128001)}},
    {.name = "llama-3.2-3b", .about = "Llama 3.2 3B (tied head)", .kind = CT_MODEL_LLAMA, .seq_len = 4096,
     .llama = {.vocab_size = 128256, .hidden_size = 3072, .intermediate_size = 8192, .num_hidden_layers = 28,
      .num_attention_heads = 24, .num_key_value_heads = 8, .head_dim = 128, .max_position_embeddings = 131072,
      .rms_norm_eps = 1e-5, .rope_theta = 500000, .rope_scaling = LLAMA3_ROPE(32.0), .tie_word_embeddings = true,
      LLAMA_IDS(128000, 128001)}},
    {.name = "llama-3-8b", .about = "Llama 3 8B", .kind = CT_MODEL_LLAMA,
     .llama = {.vocab_size = 128256, .hidden_size = 4096, .intermediate_size = 14336, .num_hidden_layers = 32,
      .num_attention_heads = 32, .num_key_value_heads = 8, .max_position_embeddings = 8192, .rms_norm_eps = 1e-5,
      .rope_theta = 500000, LLAMA_IDS(128000, 128001)}},
};
#define NSPECS (sizeof SPECS / sizeof *SPECS)

const ct_model_spec *ct_model_spec_find(const char *name)
{
    for (size_t i = 0; i < NSPECS; i++)
        if (name && !strcmp(SPECS[i].name, name)) return &SPECS[i];
    char list[512] = "";
    for (size_t i = 0; i < NSPECS; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, SPECS[i].name, sizeof list - strlen(list) - 1);
    }
    ct_error_set(CT_ERR_INVALID, "model '%s': not a built-in model (built in: %s)", name ? name : "(null)", list);
    return NULL;
}

ct_model_shape ct_model_spec_shape(const ct_model_spec *spec)
{
    ct_model_shape m = {.kind = spec->kind, .gpt = spec->gpt};
    /* the table's configs are valid: resolving only fills LlamaConfig's defaults in */
    if (spec->kind == CT_MODEL_LLAMA && ct_llama_config_resolve(&spec->llama, &m.llama)) m.llama = spec->llama;
    return m;
}

int64_t ct_model_spec_default_seq(const ct_model_spec *spec)
{
    if (spec->seq_len > 0) return spec->seq_len;
    ct_model_shape m = ct_model_spec_shape(spec);
    return ct_model_shape_positions(&m);
}

void ct_model_spec_list(FILE *f)
{
    for (size_t i = 0; i < NSPECS; i++) {
        const ct_model_shape m = ct_model_spec_shape(&SPECS[i]);
        fprintf(f, "  %-15s %-28s %7.1fM parameters: ", SPECS[i].name, SPECS[i].about,
                (double)ct_model_shape_params(&m) / 1e6);
        if (m.kind == CT_MODEL_GPT) {
            const ct_gpt_config *g = &m.gpt;
            fprintf(f, "vocab %lld, block %lld, %lld layers, %lld heads, width %lld\n", (long long)g->vocab_size,
                    (long long)g->block_size, (long long)g->n_layer, (long long)g->n_head, (long long)g->n_embd);
            continue;
        }
        const ct_llama_config *l = &m.llama;
        fprintf(f, "vocab %lld, %lld layers, %lld heads (%lld kv) of %lld, width %lld, MLP %lld, %s head, "
                "%lld positions",
                (long long)l->vocab_size, (long long)l->num_hidden_layers, (long long)l->num_attention_heads,
                (long long)l->num_key_value_heads, (long long)l->head_dim, (long long)l->hidden_size,
                (long long)l->intermediate_size, l->tie_word_embeddings ? "tied" : "untied",
                (long long)l->max_position_embeddings);
        if (SPECS[i].seq_len > 0) fprintf(f, " (default --seq_len %lld)", (long long)SPECS[i].seq_len);
        fprintf(f, "\n");
    }
}
