/* ctrain — reading and writing the fields of a Hugging Face config.json (internal to nn/).
 *
 * Every reader takes the parsed object, a label for messages (the file's path) and
 * the key; a wrong value becomes an error naming the file, the key, the value and
 * what is allowed. null counts as absent, as in transformers' configs. */
#ifndef CT_NN_HF_CONFIG_H
#define CT_NN_HF_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/api.h"
#include "core/error.h"
#include "core/tensor.h"

/* The key's value; NULL when absent or null. */
const cJSON *cti_hf_item(const cJSON *j, const char *key);
/* "config LABEL: "KEY" is VALUE; it must be WHAT" (v NULL: the key is missing). */
ct_status cti_hf_bad_value(const char *label, const char *key, const cJSON *v, const char *what);
/* An integer >= lo; absent: def, or an error when required. */
ct_status cti_hf_int(const cJSON *j, const char *label, const char *key, bool required, int64_t def, int64_t lo,
                     int64_t *out);
/* A finite number; absent: def, or an error when required. */
ct_status cti_hf_num(const cJSON *j, const char *label, const char *key, bool required, double def, double *out);
/* true or false; absent: def. */
ct_status cti_hf_bool(const cJSON *j, const char *label, const char *key, bool def, bool *out);
/* A token id: an integer >= 0, null or absent (-1 = none), or a list of them (the
 * first counts: Llama 3.1's eos_token_id lists every end-of-turn token). */
ct_status cti_hf_token(const cJSON *j, const char *label, const char *key, int64_t *out);

/* torch_dtype's name of a parameter dtype ("float32", "bfloat16", ...). */
const char *cti_hf_torch_dtype(ct_dtype dt);
/* A token id inside the vocabulary, else null: transformers warns about ids outside it. */
void cti_hf_add_token(cJSON *j, const char *key, int64_t id, int64_t vocab);
/* A float as Python reads a float: the shortest text that reads back the same, with
 * ".0" when it would look like an integer (transformers warns on an integer where a
 * float belongs, e.g. rope_scaling's factor). */
void cti_hf_add_float(cJSON *j, const char *key, double v);

#endif
