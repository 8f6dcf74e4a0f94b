/* Fields of Hugging Face config.json files (see nn/hf_config.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn/hf_config.h"

const cJSON *cti_hf_item(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

ct_status cti_hf_bad_value(const char *label, const char *key, const cJSON *v, const char *what)
{
    if (!v) return ct_error_set(CT_ERR_FORMAT, "config %s: missing key \"%s\" (%s)", label, key, what);
    char *s = cJSON_PrintUnformatted(v);
    ct_status st = ct_error_set(CT_ERR_FORMAT, "config %s: \"%s\" is %.60s; it must be %s", label, key, s ? s : "?", what);
    cJSON_free(s);
    return st;
}

static bool is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) <= 9007199254740992.0;
}

ct_status cti_hf_int(const cJSON *j, const char *label, const char *key, bool required, int64_t def, int64_t lo,
                     int64_t *out)
{
    const cJSON *v = cti_hf_item(j, key);
    if (!v && !required) return *out = def, CT_OK;
    if (!v || !is_int(v) || v->valuedouble < (double)lo) {
        char what[64];
        snprintf(what, sizeof what, "an integer >= %lld", (long long)lo);
        return cti_hf_bad_value(label, key, v, what);
    }
    *out = (int64_t)v->valuedouble;
    return CT_OK;
}

ct_status cti_hf_num(const cJSON *j, const char *label, const char *key, bool required, double def, double *out)
{
    const cJSON *v = cti_hf_item(j, key);
    if (!v && !required) return *out = def, CT_OK;
    if (!v || !cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return cti_hf_bad_value(label, key, v, "a number");
    *out = v->valuedouble;
    return CT_OK;
}

ct_status cti_hf_bool(const cJSON *j, const char *label, const char *key, bool def, bool *out)
{
    const cJSON *v = cti_hf_item(j, key);
    if (!v) return *out = def, CT_OK;
    if (!cJSON_IsBool(v)) return cti_hf_bad_value(label, key, v, "true or false");
    *out = cJSON_IsTrue(v);
    return CT_OK;
}

ct_status cti_hf_token(const cJSON *j, const char *label, const char *key, int64_t *out)
{
    const cJSON *v = cti_hf_item(j, key);
    *out = -1;
    if (!v) return CT_OK;
    const cJSON *first = cJSON_IsArray(v) ? v->child : v;
    for (const cJSON *e = first; e; e = cJSON_IsArray(v) ? e->next : NULL)
        if (!is_int(e) || e->valuedouble < 0) return cti_hf_bad_value(label, key, v, "a token id, a list of them or null");
    if (first) *out = (int64_t)first->valuedouble;
    return CT_OK;
}

const char *cti_hf_torch_dtype(ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F64: return "float64";
    case CT_DTYPE_BF16: return "bfloat16";
    case CT_DTYPE_F16: return "float16";
    default: return "float32";
    }
}

void cti_hf_add_token(cJSON *j, const char *key, int64_t id, int64_t vocab)
{
    if (id >= 0 && id < vocab) cJSON_AddNumberToObject(j, key, (double)id);
    else cJSON_AddNullToObject(j, key);
}

void cti_hf_add_float(cJSON *j, const char *key, double v)
{
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);
    if (!strpbrk(buf, ".eEni")) strcat(buf, ".0");
    cJSON_AddRawToObject(j, key, buf);
}
