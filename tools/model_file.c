/* GPT and Llama shapes from HuggingFace files (tools/model_file.h). */
#include "tools/model_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/atomic_file.h"
#include "core/safetensors.h"

#define MAX_CONFIG_BYTES (1 << 20)

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* key of root as an integer in [lo, hi]; def when absent and def >= 0 */
static ct_status json_int(const cJSON *root, const char *path, const char *key, int64_t lo, int64_t hi, int64_t def,
                          int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v && def >= 0) {
        *out = def;
        return CT_OK;
    }
    if (!v) return ct_error_set(CT_ERR_INVALID, "model config '%s': key \"%s\" is missing", path, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!cJSON_IsNumber(v) || d != (double)(int64_t)d || d < (double)lo || d > (double)hi)
        return ct_error_set(CT_ERR_INVALID, "model config '%s': \"%s\" must be an integer from %lld to %lld", path,
                            key, (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return CT_OK;
}

/* The model types a config.json may name, for messages */
#define MODEL_TYPES "\"gpt2\" (or none: GPT-2's keys), \"llama\""

static ct_status load_config(const char *path, ct_model_shape *m)
{
    size_t len = 0;
    char *text = cti_file_read_text(path, MAX_CONFIG_BYTES, "model file", &len);
    if (!text) return ct_last_status();
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        free(text);
        cJSON_Delete(root);
        return ct_error_set(CT_ERR_INVALID, "model config '%s': not a JSON object (a HuggingFace config.json "
                            "is expected)", path);
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (mt && (!cJSON_IsString(mt) || (strcmp(mt->valuestring, "gpt2") && strcmp(mt->valuestring, "llama")))) {
        char *shown = cJSON_PrintUnformatted(mt);
        ct_error_set(CT_ERR_UNSUPPORTED, "model config '%s': model_type %.80s is not supported (supported: "
                     MODEL_TYPES ")", path, shown ? shown : "?");
        free(shown);
        free(text);
        cJSON_Delete(root);
        return CT_ERR_UNSUPPORTED;
    }
    if (mt && !strcmp(mt->valuestring, "llama")) {
        cJSON_Delete(root);
        m->kind = CT_MODEL_LLAMA;
        ct_status st = ct_llama_config_from_json(text, path, &m->llama);
        free(text);
        if (!st) st = ct_llama_config_resolve(&m->llama, &m->llama);
        m->llama.dtype = CT_DTYPE_F32;
        return st;
    }
    free(text);
    m->kind = CT_MODEL_GPT;
    ct_gpt_config *g = &m->gpt;
    const int64_t big = (int64_t)1 << 31;
    int64_t ctx = 0;
    ct_status st = json_int(root, path, "vocab_size", 1, big, -1, &g->vocab_size);
    if (!st) st = json_int(root, path, "n_ctx", 1, big, 1024, &ctx);
    if (!st) st = json_int(root, path, "n_positions", 1, big, ctx, &g->block_size);
    if (!st) st = json_int(root, path, "n_layer", 1, 1 << 20, -1, &g->n_layer);
    if (!st) st = json_int(root, path, "n_head", 1, 1 << 20, -1, &g->n_head);
    if (!st) st = json_int(root, path, "n_embd", 1, big, -1, &g->n_embd);
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    g->ln_eps = cJSON_IsNumber(eps) && eps->valuedouble > 0 ? eps->valuedouble : 1e-5;
    cJSON_Delete(root);
    if (!st && g->n_embd % g->n_head)
        st = ct_error_set(CT_ERR_INVALID, "model config '%s': n_embd %lld is not a multiple of n_head %lld", path,
                          (long long)g->n_embd, (long long)g->n_head);
    return st;
}

/* shape of name (with or without "transformer.") as 2-d, or an error */
static ct_status matrix_shape(const ct_safetensors *f, const char *path, const char *name, int64_t *rows, int64_t *cols)
{
    char full[128];
    snprintf(full, sizeof full, "transformer.%s", name);
    int ndim = 0;
    int64_t shape[CT_MAX_DIMS];
    const bool has = ct_safetensors_info(f, name, NULL, &ndim, shape) || ct_safetensors_info(f, full, NULL, &ndim, shape);
    if (!has || ndim != 2)
        return ct_error_set(CT_ERR_INVALID, "model file '%s': %s (a GPT-2 %s, 2-d) is %s", path, name,
                            !strcmp(name, "wte.weight") ? "token embedding" : "position embedding",
                            has ? "not 2-d" : "missing");
    *rows = shape[0], *cols = shape[1];
    return CT_OK;
}

/* dir/config.json beside the file path, or an error saying why it is needed */
static ct_status load_config_beside(const char *path, ct_model_shape *m)
{
    char cfg[4096];
    const char *slash = strrchr(path, '/');
    int n = slash ? snprintf(cfg, sizeof cfg, "%.*s/config.json", (int)(slash - path), path)
                  : snprintf(cfg, sizeof cfg, "config.json");
    struct stat sb;
    if (n >= (int)sizeof cfg) return ct_error_set(CT_ERR_INVALID, "model '%s': the path is too long", path);
    if (stat(cfg, &sb))
        return ct_error_set(CT_ERR_INVALID, "model file '%s': not a GPT-2 model (no wte.weight), and no config.json "
                            "beside it to say what it is (%s: %s)", path, cfg, strerror(errno));
    return load_config(cfg, m);
}

static bool has_tensor(const ct_safetensors *f, const char *name)
{
    char full[128];
    snprintf(full, sizeof full, "transformer.%s", name);
    return ct_safetensors_info(f, name, NULL, NULL, NULL) || ct_safetensors_info(f, full, NULL, NULL, NULL);
}

static ct_status load_safetensors(const char *path, ct_model_shape *m)
{
    ct_safetensors *f = ct_safetensors_open(path);
    if (!f) return ct_last_status();
    if (!has_tensor(f, "wte.weight")) {
        ct_safetensors_close(f);
        return load_config_beside(path, m);
    }
    m->kind = CT_MODEL_GPT;
    ct_gpt_config *g = &m->gpt;
    int64_t pe = 0;
    ct_status st = matrix_shape(f, path, "wte.weight", &g->vocab_size, &g->n_embd);
    if (!st) st = matrix_shape(f, path, "wpe.weight", &g->block_size, &pe);
    if (!st && pe != g->n_embd)
        st = ct_error_set(CT_ERR_INVALID, "model file '%s': wpe.weight has width %lld, wte.weight %lld", path,
                          (long long)pe, (long long)g->n_embd);
    int64_t layers = 0;
    for (int i = 0; !st && i < ct_safetensors_count(f); i++) {
        const char *n = ct_safetensors_name(f, i);
        if (!strncmp(n, "transformer.", 12)) n += 12;
        char *end;
        if (strncmp(n, "h.", 2)) continue;
        long long k = strtoll(n + 2, &end, 10);
        if (end != n + 2 && *end == '.' && k >= 0 && k < (1 << 20) && k + 1 > layers) layers = k + 1;
    }
    ct_safetensors_close(f);
    if (!st && !layers)
        st = ct_error_set(CT_ERR_INVALID, "model file '%s': no h.N.* tensors: not a GPT-2 model", path);
    if (st) return st;
    g->n_layer = layers;
    g->n_head = g->n_embd % 64 == 0 ? g->n_embd / 64 : 1;
    g->ln_eps = 1e-5;
    return CT_OK;
}

ct_status ct_model_file_load(const char *path, ct_model_shape *out)
{
    if (!path || !out) return ct_error_set(CT_ERR_INVALID, "model file: NULL path or result");
    struct stat sb;
    if (stat(path, &sb))
        return ct_error_set(CT_ERR_IO, "model '%s': no such built-in model or file: %s", path, strerror(errno));
    ct_model_shape g = {.gpt = {.dtype = CT_DTYPE_F32}};
    ct_status st;
    if (S_ISDIR(sb.st_mode)) {
        char cfg[4096];
        if (snprintf(cfg, sizeof cfg, "%s/config.json", path) >= (int)sizeof cfg)
            return ct_error_set(CT_ERR_INVALID, "model '%s': the path is too long", path);
        st = load_config(cfg, &g);
    } else if (ends_with(path, ".safetensors")) {
        st = load_safetensors(path, &g);
    } else {
        st = load_config(path, &g);
    }
    if (!st) *out = g;
    return st;
}
