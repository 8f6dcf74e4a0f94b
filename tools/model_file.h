/* A model shape read from a file, for commands that take a model by name or by path
 * (`ctrain estimate-memory`):
 *   - a HuggingFace config.json (or a directory holding one) by its "model_type":
 *     "llama": LlamaConfig as ct_llama_config_from_json reads it (nn/llama.h);
 *     "gpt2" or none: vocab_size, n_positions (or n_ctx), n_layer, n_head, n_embd,
 *     layer_norm_epsilon; another model_type is an error naming the supported ones;
 *   - a GPT-2 model.safetensors: vocab and width from wte.weight (V, E), the block
 *     size from wpe.weight, the layers from the largest h.N, each name with or without
 *     HF's "transformer." prefix. The file does not say how many heads there are:
 *     E / 64 (GPT-2's head size) where 64 divides E, else 1; heads change no
 *     parameter and only a few bytes of activations;
 *   - any other model.safetensors (a Llama's): the config.json beside it.
 */
#ifndef CT_TOOLS_MODEL_FILE_H
#define CT_TOOLS_MODEL_FILE_H

#include "core/error.h"
#include "tools/model_shape.h"

/* Fills *out (f32, dropout 0; a Llama's defaults resolved) from path. CT_ERR_IO when it cannot be read,
 * CT_ERR_INVALID when it is not such a file or a size is missing or out of range;
 * the message names the file and the key or tensor. */
ct_status ct_model_file_load(const char *path, ct_model_shape *out);

#endif
