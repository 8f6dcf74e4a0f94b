/* Llama models as Hugging Face directories: config.json (LlamaConfig) and weights
 * (nn/llama.h, nn/hf_weights.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/frame.h"
#include "nn/hf_weights.h"
#include "nn/llama.h"

/* ---- config.json in ---------------------------------------------------------------- */

/* The key's value, NULL when absent or null. */
static const cJSON *item(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static ct_status missing(const char *label, const char *key, const char *what)
{
    return ct_error_set(CT_ERR_FORMAT, "config %s: missing key \"%s\" (%s)", label, key, what);
}

static ct_status bad_value(const char *label, const char *key, const cJSON *v, const char *what)
{
    char *s = cJSON_PrintUnformatted(v);
    ct_status st = ct_error_set(CT_ERR_FORMAT, "config %s: \"%s\" is %.60s; it must be %s", label, key,
                                s ? s : "?", what);
    cJSON_free(s);
    return st;
}

static bool is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) <= 9007199254740992.0;
}

/* An integer (>= lo) under key; absent or null: def, or an error when required. */
static ct_status get_int(const cJSON *j, const char *label, const char *key, bool required, int64_t def, int64_t lo,
                         int64_t *out)
{
    const cJSON *v = item(j, key);
    if (!v) {
        if (required) return missing(label, key, "an integer");
        *out = def;
        return CT_OK;
    }
    if (!is_int(v) || v->valuedouble < (double)lo) {
        char what[64];
        snprintf(what, sizeof what, "an integer >= %lld", (long long)lo);
        return bad_value(label, key, v, what);
    }
    *out = (int64_t)v->valuedouble;
    return CT_OK;
}

static ct_status get_num(const cJSON *j, const char *label, const char *key, bool required, double def, double *out)
{
    const cJSON *v = item(j, key);
    if (!v) {
        if (required) return missing(label, key, "a number");
        *out = def;
        return CT_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bad_value(label, key, v, "a number");
    *out = v->valuedouble;
    return CT_OK;
}

static ct_status get_bool(const cJSON *j, const char *label, const char *key, bool def, bool *out)
{
    const cJSON *v = item(j, key);
    if (!v) {
        *out = def;
        return CT_OK;
    }
    if (!cJSON_IsBool(v)) return bad_value(label, key, v, "true or false");
    *out = cJSON_IsTrue(v);
    return CT_OK;
}

/* A token id: an integer, null (-1 = none), or a list of them (the first counts: the
 * eos_token_id of Llama 3.1 lists every end-of-turn token). */
static ct_status get_token(const cJSON *j, const char *label, const char *key, int64_t *out)
{
    const cJSON *v = item(j, key);
    *out = -1;
    if (!v) return CT_OK;
    if (cJSON_IsArray(v)) {
        for (const cJSON *e = v->child; e; e = e->next)
            if (!is_int(e) || e->valuedouble < 0) return bad_value(label, key, v, "a token id, a list of them or null");
        if (v->child) *out = (int64_t)v->child->valuedouble;
        return CT_OK;
    }
    if (!is_int(v) || v->valuedouble < 0) return bad_value(label, key, v, "a token id, a list of them or null");
    *out = (int64_t)v->valuedouble;
    return CT_OK;
}

static ct_status get_rope_scaling(const cJSON *j, const char *label, ct_rope_scaling *r)
{
    *r = (ct_rope_scaling){0};
    const cJSON *s = item(j, "rope_scaling");
    if (!s) return CT_OK;
    if (!cJSON_IsObject(s)) return bad_value(label, "rope_scaling", s, "an object or null");
    const cJSON *t = item(s, "rope_type");
    if (!t) t = item(s, "type"); /* the older name */
    if (!t) return missing(label, "rope_scaling.rope_type", "default, linear, dynamic or llama3");
    if (!cJSON_IsString(t)) return bad_value(label, "rope_scaling.rope_type", t, "a string");
    const char *n = t->valuestring;
    if (!strcmp(n, "default")) return CT_OK;
    if (!strcmp(n, "linear")) r->type = CT_ROPE_LINEAR;
    else if (!strcmp(n, "dynamic")) r->type = CT_ROPE_DYNAMIC;
    else if (!strcmp(n, "llama3")) r->type = CT_ROPE_LLAMA3;
    else
        return ct_error_set(CT_ERR_UNSUPPORTED, "config %s: rope_scaling type \"%s\" is not supported (supported: "
                            "default, linear, dynamic, llama3)", label, n);
    char in[600]; /* messages say "config <file>: rope_scaling: ..." */
    snprintf(in, sizeof in, "%s: rope_scaling", label);
    ct_status st = get_num(s, in, "factor", true, 0, &r->factor);
    if (!st && r->type == CT_ROPE_LLAMA3) {
        st = get_num(s, in, "low_freq_factor", true, 0, &r->low_freq_factor);
        if (!st) st = get_num(s, in, "high_freq_factor", true, 0, &r->high_freq_factor);
        if (!st)
            st = get_int(s, in, "original_max_position_embeddings", true, 0, 1, &r->original_max_position_embeddings);
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
    const cJSON *mt = item(j, "model_type"), *act = item(j, "hidden_act");
    if (!cJSON_IsObject(j)) st = ct_error_set(CT_ERR_FORMAT, "config %s: not a JSON object", label);
    else if (!mt) st = missing(label, "model_type", "\"llama\"");
    else if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "llama"))
        st = bad_value(label, "model_type", mt, "\"llama\" (this reader builds LlamaForCausalLM)");
    else if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        st = bad_value(label, "hidden_act", act, "\"silu\" (the only activation supported)");
    if (!st) st = get_int(j, label, "vocab_size", true, 0, 1, &c.vocab_size);
    if (!st) st = get_int(j, label, "hidden_size", true, 0, 1, &c.hidden_size);
    if (!st) st = get_int(j, label, "intermediate_size", true, 0, 1, &c.intermediate_size);
    if (!st) st = get_int(j, label, "num_hidden_layers", true, 0, 1, &c.num_hidden_layers);
    if (!st) st = get_int(j, label, "num_attention_heads", true, 0, 1, &c.num_attention_heads);
    if (!st) st = get_int(j, label, "num_key_value_heads", false, c.num_attention_heads, 1, &c.num_key_value_heads);
    if (!st) st = get_int(j, label, "head_dim", false, 0, 1, &c.head_dim);
    if (!st) st = get_int(j, label, "max_position_embeddings", false, 2048, 1, &c.max_position_embeddings);
    if (!st) st = get_num(j, label, "rms_norm_eps", false, 1e-6, &c.rms_norm_eps);
    if (!st) st = get_num(j, label, "rope_theta", false, 10000, &c.rope_theta);
    if (!st) st = get_num(j, label, "initializer_range", false, 0.02, &c.initializer_range);
    if (!st) st = get_bool(j, label, "tie_word_embeddings", false, &c.tie_word_embeddings);
    if (!st) st = get_bool(j, label, "attention_bias", false, &c.attention_bias);
    if (!st) st = get_bool(j, label, "mlp_bias", false, &c.mlp_bias);
    if (!st) st = get_token(j, label, "bos_token_id", &c.bos_token_id);
    if (!st) st = get_token(j, label, "eos_token_id", &c.eos_token_id);
    if (!st) st = get_token(j, label, "pad_token_id", &c.pad_token_id);
    if (!st) st = get_rope_scaling(j, label, &c.rope_scaling);
    if (!st && (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0)))
        st = ct_error_set(CT_ERR_FORMAT, "config %s: rms_norm_eps %g and rope_theta %g must be positive", label,
                          c.rms_norm_eps, c.rope_theta);
    if (!st && (st = ct_llama_config_resolve(&c, out))) ct_error_prefix("config %s: ", label);
    cJSON_Delete(j);
    return st;
}

/* ---- config.json out --------------------------------------------------------------- */

static const char *torch_dtype(ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F64: return "float64";
    case CT_DTYPE_BF16: return "bfloat16";
    case CT_DTYPE_F16: return "float16";
    default: return "float32";
    }
}

/* a token id inside the vocabulary, else null: transformers warns about ids outside it */
static void add_token(cJSON *j, const char *key, int64_t id, int64_t vocab)
{
    if (id >= 0 && id < vocab) cJSON_AddNumberToObject(j, key, (double)id);
    else cJSON_AddNullToObject(j, key);
}

/* A float as Python reads a float: the shortest text that reads back the same, with a
 * ".0" when it would look like an integer (transformers' rope validation warns when
 * "factor" and friends are ints). */
static void add_float(cJSON *j, const char *key, double v)
{
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);
    if (!strpbrk(buf, ".eEni")) strcat(buf, ".0");
    cJSON_AddRawToObject(j, key, buf);
}

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
    add_float(j, "rms_norm_eps", c.rms_norm_eps);
    add_float(j, "rope_theta", c.rope_theta);
    static const char *const rope_names[] = {"default", "linear", "dynamic", "llama3"};
    if (c.rope_scaling.type == CT_ROPE_DEFAULT) {
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        if (r) {
            cJSON_AddStringToObject(r, "rope_type", rope_names[c.rope_scaling.type]);
            add_float(r, "factor", c.rope_scaling.factor);
            if (c.rope_scaling.type == CT_ROPE_LLAMA3) {
                add_float(r, "low_freq_factor", c.rope_scaling.low_freq_factor);
                add_float(r, "high_freq_factor", c.rope_scaling.high_freq_factor);
                cJSON_AddNumberToObject(r, "original_max_position_embeddings",
                                        (double)c.rope_scaling.original_max_position_embeddings);
            }
        }
    }
    cJSON_AddBoolToObject(j, "attention_bias", false);
    add_float(j, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(j, "mlp_bias", false);
    add_float(j, "initializer_range", c.initializer_range);
    cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c.tie_word_embeddings);
    cJSON_AddBoolToObject(j, "use_cache", true);
    add_token(j, "bos_token_id", c.bos_token_id, c.vocab_size);
    add_token(j, "eos_token_id", c.eos_token_id, c.vocab_size);
    add_token(j, "pad_token_id", c.pad_token_id, c.vocab_size);
    cJSON_AddStringToObject(j, "torch_dtype", torch_dtype(c.dtype));
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
