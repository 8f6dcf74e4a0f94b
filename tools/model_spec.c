/* Built-in model shapes for the command line (tools/model_spec.h). */
#include "tools/model_spec.h"

#include <string.h>

/* vocab, block, layers, heads, width: w1 and wide are ctrain's benchmark shapes
 * (bench/README.md), gpt2* HuggingFace's GPT2Config presets (bos = eos = <|endoftext|>). */
static const ct_model_spec SPECS[] = {
    {"gpt:w1", "ctrain's byte-level test GPT", {256, 256, 4, 4, 256, 0, 1e-5, CT_DTYPE_F32, false, -1, -1}},
    {"gpt:wide", "ctrain's wide benchmark GPT", {256, 256, 12, 12, 768, 0, 1e-5, CT_DTYPE_F32, false, -1, -1}},
    {"gpt2", "GPT-2 small (124M)", {50257, 1024, 12, 12, 768, 0, 1e-5, CT_DTYPE_F32, true, 50256, 50256}},
    {"gpt2-medium", "GPT-2 medium (355M)", {50257, 1024, 24, 16, 1024, 0, 1e-5, CT_DTYPE_F32, true, 50256, 50256}},
    {"gpt2-large", "GPT-2 large (774M)", {50257, 1024, 36, 20, 1280, 0, 1e-5, CT_DTYPE_F32, true, 50256, 50256}},
    {"gpt2-xl", "GPT-2 XL (1.5B)", {50257, 1024, 48, 25, 1600, 0, 1e-5, CT_DTYPE_F32, true, 50256, 50256}},
};
#define NSPECS (sizeof SPECS / sizeof *SPECS)

const ct_model_spec *ct_model_spec_find(const char *name)
{
    for (size_t i = 0; i < NSPECS; i++)
        if (!strcmp(SPECS[i].name, name)) return &SPECS[i];
    char list[256] = "";
    for (size_t i = 0; i < NSPECS; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, SPECS[i].name, sizeof list - strlen(list) - 1);
    }
    ct_error_set(CT_ERR_INVALID, "model '%s': not a built-in model (built in: %s)", name ? name : "(null)", list);
    return NULL;
}

int64_t ct_model_spec_gpt_params(const ct_gpt_config *c)
{
    int64_t E = c->n_embd;
    int64_t block = 2 * 2 * E                  /* ln_1, ln_2 */
                    + 3 * E * E + 3 * E        /* attn.c_attn */
                    + E * E + E                /* attn.c_proj */
                    + 4 * E * E + 4 * E        /* mlp.c_fc */
                    + 4 * E * E + E;           /* mlp.c_proj */
    return c->vocab_size * E + c->block_size * E + c->n_layer * block + 2 * E;
}

void ct_model_spec_list(FILE *f)
{
    for (size_t i = 0; i < NSPECS; i++) {
        const ct_gpt_config *g = &SPECS[i].gpt;
        fprintf(f, "  %-12s %-30s %6.1fM parameters: vocab %lld, block %lld, %lld layers, %lld heads, width %lld\n",
                SPECS[i].name, SPECS[i].about, (double)ct_model_spec_gpt_params(g) / 1e6, (long long)g->vocab_size,
                (long long)g->block_size, (long long)g->n_layer, (long long)g->n_head, (long long)g->n_embd);
    }
}
