/* Llama models as Hugging Face directories: config.json (LlamaConfig) and weights
 * (nn/llama.h, nn/hf_weights.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/frame.h"
#include "nn/hf_config.h"
#include "nn/hf_weights.h"
#include "nn/llama.h"

/* ---- config.json in ---------------------------------------------------------------- */

/* The rotary settings. transformers 4 writes rope_theta beside a rope_scaling object
 * (null for none); transformers 5 writes one rope_parameters object holding rope_theta,
 * rope_type and the scaling's numbers. rope_parameters wins when both are there. */
static ct_status get_rope(const cJSON *j, const char *label, double *theta, ct_rope_scaling *r)
{
    *r = (ct_rope_scaling){0};
    const char *key = "rope_parameters";
    const cJSON *s = cti_hf_item(j, key);
    if (!s) key = "rope_scaling", s = cti_hf_item(j, key);
    if (!s) return CT_OK;
    if (!cJSON_IsObject(s)) return cti_hf_bad_value(label, key, s, "an object or null");
    char in[600]; /* messages say "config <file>: rope_parameters: ..." */
    snprintf(in, sizeof in, "%s: %s", label, key);
    if (!strcmp(key, "rope_parameters")) {
        ct_status st = cti_hf_num(s, in, "rope_theta", false, *theta, theta);
        if (st) return st;
    }
    const cJSON *t = cti_hf_item(s, "rope_type");
    if (!t) t = cti_hf_item(s, "type"); /* the older name */
    if (!t) return cti_hf_bad_value(in, "rope_type", NULL, "default, linear, dynamic or llama3");
    if (!cJSON_IsString(t)) return cti_hf_bad_value(in, "rope_type", t, "a string");
    const char *n = t->valuestring;
    if (!strcmp(n, "default")) return CT_OK;
    if (!strcmp(n, "linear")) r->type = CT_ROPE_LINEAR;
    else if (!strcmp(n, "dynamic")) r->type = CT_ROPE_DYNAMIC;
    else if (!strcmp(n, "llama3")) r->type = CT_ROPE_LLAMA3;
    else
        return ct_error_set(CT_ERR_UNSUPPORTED, "config %s: %s type \"%s\" is not supported (supported: "
                            "default, linear, dynamic, llama3)", label, key, n);
    ct_status st = cti_hf_num(s, in, "factor", true, 0, &r->factor);
    if (!st && r->type == CT_ROPE_LLAMA3) {
        st = cti_hf_num(s, in, "low_freq_factor", true, 0, &r->low_freq_factor);
        if (!st) st = cti_hf_num(s, in, "high_freq_factor", true, 0, &r->high_freq_factor);
        if (!st)
            st = cti_hf_int(s, in, "original_max_position_embeddings", true, 0, 1, &r->original_max_position_embeddings);
    }
    return st;
}

ct_status ct_llama_config_from_json(const char *json, const char *label, ct_llama_config *out)
{
    if (!json || !out) return ct_error_set(CT_ERR_INVALID, "llama_config_from_json: NULL argument");
    if (!label) label = "<memory>";
    cJSON *j = cJSON_Parse(json);
    if (!j) {
        const char *e = cJSON_GetErrorPtr();
        return ct_error_set(CT_ERR_FORMAT, "config %s: not valid JSON (near '%.24s')", label, e ? e : "");
    }
    ct_llama_config c = {.token_ids_set = true};
    ct_status st = CT_OK;
    const cJSON *mt = cti_hf_item(j, "model_type"), *act = cti_hf_item(j, "hidden_act");
    if (!cJSON_IsObject(j)) st = ct_error_set(CT_ERR_FORMAT, "config %s: not a JSON object", label);
    else if (!mt) st = cti_hf_bad_value(label, "model_type", NULL, "\"llama\"");
    else if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "llama"))
        st = cti_hf_bad_value(label, "model_type", mt, "\"llama\" (this reader builds LlamaForCausalLM)");
    else if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        st = cti_hf_bad_value(label, "hidden_act", act, "\"silu\" (the only activation supported)");
    if (!st) st = cti_hf_int(j, label, "vocab_size", true, 0, 1, &c.vocab_size);
    if (!st) st = cti_hf_int(j, label, "hidden_size", true, 0, 1, &c.hidden_size);
    if (!st) st = cti_hf_int(j, label, "intermediate_size", true, 0, 1, &c.intermediate_size);
    if (!st) st = cti_hf_int(j, label, "num_hidden_layers", true, 0, 1, &c.num_hidden_layers);
    if (!st) st = cti_hf_int(j, label, "num_attention_heads", true, 0, 1, &c.num_attention_heads);
    if (!st) st = cti_hf_int(j, label, "num_key_value_heads", false, c.num_attention_heads, 1, &c.num_key_value_heads);
    if (!st) st = cti_hf_int(j, label, "head_dim", false, 0, 1, &c.head_dim);
    if (!st) st = cti_hf_int(j, label, "max_position_embeddings", false, 2048, 1, &c.max_position_embeddings);
    if (!st) st = cti_hf_num(j, label, "rms_norm_eps", false, 1e-6, &c.rms_norm_eps);
    if (!st) st = cti_hf_num(j, label, "rope_theta", false, 10000, &c.rope_theta);
    if (!st) st = cti_hf_num(j, label, "initializer_range", false, 0.02, &c.initializer_range);
    if (!st) st = cti_hf_bool(j, label, "tie_word_embeddings", false, &c.tie_word_embeddings);
    if (!st) st = cti_hf_bool(j, label, "attention_bias", false, &c.attention_bias);
    if (!st) st = cti_hf_bool(j, label, "mlp_bias", false, &c.mlp_bias);
    if (!st) st = cti_hf_token(j, label, "bos_token_id", &c.bos_token_id);
    if (!st) st = cti_hf_token(j, label, "eos_token_id", &c.eos_token_id);
    if (!st) st = cti_hf_token(j, label, "pad_token_id", &c.pad_token_id);
    if (!st) st = get_rope(j, label, &c.rope_theta, &c.rope_scaling);
    if (!st && (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0)))
        st = ct_error_set(CT_ERR_FORMAT, "config %s: rms_norm_eps %g and rope_theta %g must be positive", label,
                          c.rms_norm_eps, c.rope_theta);
    if (!st && (st = ct_llama_config_resolve(&c, out))) ct_error_prefix("config %s: ", label);
    cJSON_Delete(j);
    return st;
}

/* ---- config.json out --------------------------------------------------------------- */

char *ct_llama_config_to_json(const ct_llama_config *cfg)
{
    ct_llama_config c;
    if (ct_llama_config_resolve(cfg, &c)) return NULL;
    cJSON *j = cJSON_CreateObject();
    if (!j) return ct_error_set(CT_ERR_NOMEM, "llama config: out of memory"), NULL;
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    if (arch) cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", "llama");
    cJSON_AddNumberToObject(j, "vocab_size", (double)c.vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", (double)c.hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)c.intermediate_size);
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c.num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)c.num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c.num_key_value_heads);
    cJSON_AddNumberToObject(j, "head_dim", (double)c.head_dim);
    cJSON_AddNumberToObject(j, "max_position_embeddings", (double)c.max_position_embeddings);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cti_hf_add_float(j, "rms_norm_eps", c.rms_norm_eps);
    cti_hf_add_float(j, "rope_theta", c.rope_theta);
    static const char *const rope_names[] = {"default", "linear", "dynamic", "llama3"};
    if (c.rope_scaling.type == CT_ROPE_DEFAULT) {
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        if (r) {
            cJSON_AddStringToObject(r, "rope_type", rope_names[c.rope_scaling.type]);
            cti_hf_add_float(r, "factor", c.rope_scaling.factor);
            if (c.rope_scaling.type == CT_ROPE_LLAMA3) {
                cti_hf_add_float(r, "low_freq_factor", c.rope_scaling.low_freq_factor);
                cti_hf_add_float(r, "high_freq_factor", c.rope_scaling.high_freq_factor);
                cJSON_AddNumberToObject(r, "original_max_position_embeddings",
                                        (double)c.rope_scaling.original_max_position_embeddings);
            }
        }
    }
    cJSON_AddBoolToObject(j, "attention_bias", false);
    cti_hf_add_float(j, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(j, "mlp_bias", false);
    cti_hf_add_float(j, "initializer_range", c.initializer_range);
    cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c.tie_word_embeddings);
    cJSON_AddBoolToObject(j, "use_cache", true);
    cti_hf_add_token(j, "bos_token_id", c.bos_token_id, c.vocab_size);
    cti_hf_add_token(j, "eos_token_id", c.eos_token_id, c.vocab_size);
    cti_hf_add_token(j, "pad_token_id", c.pad_token_id, c.vocab_size);
    cJSON_AddStringToObject(j, "torch_dtype", cti_hf_torch_dtype(c.dtype));
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s) ct_error_set(CT_ERR_NOMEM, "llama config: out of memory");
    return s;
}

/* ---- directories ------------------------------------------------------------------- */

/* File names to the model's: a tied model ignores an lm_head.weight (transformers ties
 * it to the embedding on load), and older conversions' rotary buffers are recomputed. */
static const char *llama_key(const char *name, char *buf, size_t buflen, void *ctx)
{
    (void)buf, (void)buflen;
    const ct_llama *m = ctx;
    if (m->cfg.tie_word_embeddings && !strcmp(name, "lm_head.weight")) return NULL;
    size_t n = strlen(name), k = strlen(".rotary_emb.inv_freq");
    if (n > k && !strcmp(name + n - k, ".rotary_emb.inv_freq")) return NULL;
    return name;
}

ct_llama *ct_llama_from_pretrained(const char *dir)
{
    if (!dir) return ct_error_set(CT_ERR_INVALID, "llama_from_pretrained: directory is NULL"), NULL;
    size_t n = strlen(dir) + 16;
    char *path = malloc(n);
    if (!path) return ct_error_set(CT_ERR_NOMEM, "llama_from_pretrained: out of memory"), NULL;
    snprintf(path, n, "%s/config.json", dir);
    char *text = ct_hf_text_read(path);
    ct_llama_config c;
    ct_llama *m = NULL;
    if (text && !ct_llama_config_from_json(text, path, &c) && (m = ct_llama_new(&c)) &&
        ct_hf_weights_load(&m->base, dir, true, NULL, llama_key, m)) {
        ct_module_free(&m->base);
        m = NULL;
    }
    if (!m) ct_error_prefix("llama_from_pretrained %s: ", dir);
    free(text);
    free(path);
    return m;
}

ct_status ct_llama_save_pretrained_sharded(const ct_llama *m, const char *dir, int64_t max_shard_bytes)
{
    if (!m || !dir) return ct_error_set(CT_ERR_INVALID, "llama_save_pretrained: model or directory is NULL");
    if (m->tp) /* its tensors are slices under the full names: gather them first (ct_llama_tp_shard_of) */
        return ct_error_set(CT_ERR_UNSUPPORTED, "llama_save_pretrained %s: the model is sharded for tensor "
                            "parallelism; save the gathered full weights", dir);
    ct_status st = ct_hf_dir_make(dir);
    char *json = st ? NULL : ct_llama_config_to_json(&m->cfg);
    size_t n = strlen(dir) + 16;
    char *path = malloc(n);
    if (!st && (!json || !path)) st = json ? ct_error_set(CT_ERR_NOMEM, "out of memory") : ct_last_status();
    if (!st) st = ct_hf_weights_save_module(&m->base, dir, max_shard_bytes);
    if (!st) {
        snprintf(path, n, "%s/config.json", dir);
        st = ct_hf_text_write(path, json);
    }
    if (st) ct_error_prefix("llama_save_pretrained %s: ", dir);
    cJSON_free(json);
    free(path);
    return st;
}

ct_status ct_llama_save_pretrained(const ct_llama *m, const char *dir)
{
    return ct_llama_save_pretrained_sharded(m, dir, 0);
}
