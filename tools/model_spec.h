/* Models named on the command line: `--model gpt:w1`, `gpt2-medium`, `llama:w1`,
 * `llama-3.2-1b`, ... for `ctrain estimate-memory` and `ctrain bench`.
 *
 * A built-in name is one of the specs in tools/model_spec.c (ct_model_spec_list
 * prints them): a GPT (nn/gpt.h) or a Llama (nn/llama.h) shape. GPT-2's sizes are
 * HuggingFace's GPT2Config presets; the Llama presets carry the values of their
 * HuggingFace config.json (vocabulary, widths, key/value heads, tied or untied head,
 * rotary settings).
 */
#ifndef CT_TOOLS_MODEL_SPEC_H
#define CT_TOOLS_MODEL_SPEC_H

#include <stdio.h>

#include "core/error.h"
#include "tools/model_shape.h"

typedef struct ct_model_spec {
    const char *name;      /* "gpt:w1", "gpt2", "llama:w1", "llama-3.2-1b", ... */
    const char *about;     /* one line for --help */
    ct_gpt_config gpt;     /* kind GPT: the shape; dropout 0, f32 */
    ct_model_kind kind;
    ct_llama_config llama; /* kind LLAMA: the shape (zeros: LlamaConfig's defaults) */
    /* The sequence length a command uses when none is given: 0 for the model's
     * positions (GPT's block size, Llama's max_position_embeddings); set where those
     * are far beyond what one trains on (Llama 3.2's 131072 positions: 4096). */
    int64_t seq_len;
} ct_model_spec;

/* The built-in spec called name (case-sensitive), or NULL + CT_ERR_INVALID naming
 * the name and the ones there are. */
const ct_model_spec *ct_model_spec_find(const char *name);

/* The shape of spec (a Llama's defaults resolved). */
ct_model_shape ct_model_spec_shape(const ct_model_spec *spec);

/* The default sequence length of spec (its seq_len, else the model's positions). */
int64_t ct_model_spec_default_seq(const ct_model_spec *spec);

/* One line per built-in spec: name, parameter count and shape. */
void ct_model_spec_list(FILE *f);

#endif
