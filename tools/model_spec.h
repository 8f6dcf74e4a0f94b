/* Models named on the command line: `--model gpt:w1`, `gpt2-medium`, ... for
 * `ctrain estimate-memory` and `ctrain bench`.
 *
 * A built-in name is one of CT_MODEL_SPECS (ct_model_spec_list prints them); each is
 * a GPT (nn/gpt.h) shape. GPT-2's sizes are HuggingFace's GPT2Config presets.
 */
#ifndef CT_TOOLS_MODEL_SPEC_H
#define CT_TOOLS_MODEL_SPEC_H

#include <stdio.h>

#include "core/error.h"
#include "nn/gpt.h"

typedef struct ct_model_spec {
    const char *name;    /* "gpt:w1", "gpt2", ... */
    const char *about;   /* one line for --help */
    ct_gpt_config gpt;   /* the shape; dropout 0, f32 */
} ct_model_spec;

/* The built-in spec called name (case-sensitive), or NULL + CT_ERR_INVALID naming
 * the name and the ones there are. */
const ct_model_spec *ct_model_spec_find(const char *name);

/* One line per built-in spec: name, parameter count and shape. */
void ct_model_spec_list(FILE *f);

/* Parameters of a GPT of shape c: token and position tables, per block two
 * layernorms, the attention (c_attn 3E x E + bias, c_proj E x E + bias) and the MLP
 * (4E x E + bias, E x 4E + bias), the final layernorm; the head is tied to wte. */
int64_t ct_model_spec_gpt_params(const ct_gpt_config *c);

#endif
