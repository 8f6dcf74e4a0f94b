/* HuggingFace GPT-2 checkpoints in and out (see nn/gpt.h).
 *
 * What HF's files hold besides GPT2Model's state dict:
 *   - GPT2LMHeadModel.save_pretrained prefixes every name with "transformer.";
 *   - files converted from older checkpoints carry the causal-mask buffers
 *     h.{i}.attn.bias (1, 1, n_ctx, n_ctx) and h.{i}.attn.masked_bias (a scalar),
 *     which ctrain recomputes and HF itself ignores on load;
 *   - some carry lm_head.weight, which GPT-2 ties to wte.weight.
 * The map below accepts all three; an lm_head.weight that is not wte.weight would be
 * a different model, and is refused before anything is loaded. */
#include <ctype.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/frame.h"
#include "core/safetensors.h"
#include "nn/gpt.h"
#include "nn/hf_config.h"
#include "nn/hf_weights.h"

static const char *strip_prefix(const char *name)
{
    return strncmp(name, "transformer.", 12) ? name : name + 12;
}

/* "h.<digits><rest>" with rest one of the mask buffers' suffixes */
static bool is_mask_buffer(const char *name)
{
    if (strncmp(name, "h.", 2) || !isdigit((unsigned char)name[2])) return false;
    const char *p = name + 2;
    while (isdigit((unsigned char)*p)) p++;
    return !strcmp(p, ".attn.bias") || !strcmp(p, ".attn.masked_bias");
}

static const char *hf_key(const char *file_name, char *buf, size_t buflen, void *ctx)
{
    (void)buf, (void)buflen, (void)ctx;
    const char *n = strip_prefix(file_name);
    if (!strcmp(n, "lm_head.weight") || is_mask_buffer(n)) return NULL;
    return n;
}

/* CT_OK when the weights have no lm_head.weight or it equals their wte.weight. */
static ct_status check_tied_head(const char *path)
{
    ct_hf_weights *f = ct_hf_weights_open(path);
    if (!f) return ct_last_status();
    const char *head = NULL, *wte = NULL;
    for (int j = 0; j < ct_hf_weights_count(f); j++) {
        const char *n = ct_hf_weights_name(f, j);
        if (!strcmp(strip_prefix(n), "lm_head.weight")) head = n;
        if (!strcmp(strip_prefix(n), "wte.weight")) wte = n;
    }
    ct_status st = CT_OK;
    if (head) {
        ct_frame_push();
        ct_tensor *h = ct_hf_weights_get(f, head), *w = wte ? ct_hf_weights_get(f, wte) : NULL;
        if (!h || (wte && !w)) {
            st = ct_last_status();
        } else {
            bool same = w && h->dtype == w->dtype && h->ndim == w->ndim;
            for (int d = 0; same && d < h->ndim; d++) same = h->shape[d] == w->shape[d];
            /* both are fresh contiguous tensors from the file */
            if (same) same = !memcmp(ct_tensor_data(h), ct_tensor_data(w), ct_tensor_nbytes(h));
            if (!same)
                st = ct_error_set(CT_ERR_FORMAT,
                                  "gpt_load %s: %s is not equal to %s; ctrain's GPT ties the lm head to the token "
                                  "embedding as GPT-2 does, so this untied head cannot be loaded (nothing was loaded)",
                                  path, head, wte ? wte : "wte.weight (absent)");
        }
        ct_frame_pop();
    }
    ct_hf_weights_close(f);
    return st;
}

ct_status ct_gpt_load(ct_gpt *m, const char *path, bool strict, ct_load_report *report)
{
    if (!m || !path) return ct_error_set(CT_ERR_INVALID, "gpt_load: model or path is NULL");
    ct_status st = check_tied_head(path);
    if (st) return st;
    return ct_hf_weights_load(&m->base, path, strict, report, hf_key, NULL);
}

/* GPT2Config's fields for this model; GPT-2's defaults for the rest. */
static char *hf_config_json(const ct_gpt_config *c)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    if (arch) cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", (double)c->block_size);
    cJSON_AddNumberToObject(j, "n_ctx", (double)c->block_size);
    cJSON_AddNumberToObject(j, "n_embd", (double)c->n_embd);
    cJSON_AddNumberToObject(j, "n_layer", (double)c->n_layer);
    cJSON_AddNumberToObject(j, "n_head", (double)c->n_head);
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", c->ln_eps);
    cJSON_AddNumberToObject(j, "resid_pdrop", c->dropout);
    cJSON_AddNumberToObject(j, "embd_pdrop", c->dropout);
    cJSON_AddNumberToObject(j, "attn_pdrop", c->dropout);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", true);
    cJSON_AddStringToObject(j, "torch_dtype", cti_hf_torch_dtype(c->dtype));
    /* GPT2Config's defaults (50256) lie outside a small vocabulary and make transformers
     * warn: write the model's own ids, null for none */
    cti_hf_add_token(j, "bos_token_id", c->bos_token_id, c->vocab_size);
    cti_hf_add_token(j, "eos_token_id", c->eos_token_id, c->vocab_size);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

ct_status ct_gpt_save_hf_sharded(const ct_gpt *m, const char *dir, int64_t max_shard_bytes)
{
    if (!m || !dir) return ct_error_set(CT_ERR_INVALID, "gpt_save_hf: model or directory is NULL");
    if (m->tp) /* its tensors are slices under the full names */
        return ct_error_set(CT_ERR_UNSUPPORTED, "gpt_save_hf %s: the model is sharded for tensor parallelism; "
                            "save ct_gpt_tp_gather_model(m) instead", dir);
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    char *json = hf_config_json(&m->cfg);
    ct_status st = CT_OK;
    if (!path || !json) st = ct_error_set(CT_ERR_NOMEM, "gpt_save_hf %s: out of memory", dir);
    if (!st) st = ct_hf_weights_save_module(&m->base, dir, max_shard_bytes);
    if (!st) {
        snprintf(path, n, "%s/config.json", dir);
        st = ct_hf_text_write(path, json);
    }
    if (st) ct_error_prefix("gpt_save_hf %s: ", dir);
    free(path);
    cJSON_free(json);
    return st;
}

ct_status ct_gpt_save_hf(const ct_gpt *m, const char *dir) { return ct_gpt_save_hf_sharded(m, dir, 0); }

/* ---- GPT2Config in ------------------------------------------------------------- */

ct_status ct_gpt_config_from_json(const char *json, const char *label, ct_gpt_config *out)
{
    if (!json || !out) return ct_error_set(CT_ERR_INVALID, "gpt_config_from_json: NULL argument");
    if (!label) label = "<memory>";
    cJSON *j = cJSON_Parse(json);
    if (!j) {
        const char *e = cJSON_GetErrorPtr();
        return ct_error_set(CT_ERR_FORMAT, "config %s: not valid JSON (near '%.24s')", label, e ? e : "");
    }
    /* GPT2Config's defaults where a key is absent, except the sizes, which must be there */
    ct_gpt_config c = {.token_ids_set = true};
    ct_status st = CT_OK;
    const cJSON *mt = cti_hf_item(j, "model_type"), *act = cti_hf_item(j, "activation_function"), *eps = cti_hf_item(j, "layer_norm_epsilon");
    if (!cJSON_IsObject(j)) st = ct_error_set(CT_ERR_FORMAT, "config %s: not a JSON object", label);
    else if (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gpt2")))
        st = cti_hf_bad_value(label, "model_type", mt, "\"gpt2\"");
    else if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "gelu_new") &&
                                               strcmp(act->valuestring, "gelu_pytorch_tanh"))))
        st = cti_hf_bad_value(label, "activation_function", act, "\"gelu_new\" (the tanh GELU ctrain's GPT computes)");
    else if (eps && (!cJSON_IsNumber(eps) || !(eps->valuedouble > 0)))
        st = cti_hf_bad_value(label, "layer_norm_epsilon", eps, "a positive number");
    if (!st) st = cti_hf_int(j, label, "vocab_size", true, 0, 1, &c.vocab_size);
    if (!st) st = cti_hf_int(j, label, "n_positions", true, 0, 1, &c.block_size);
    if (!st) st = cti_hf_int(j, label, "n_embd", true, 0, 1, &c.n_embd);
    if (!st) st = cti_hf_int(j, label, "n_layer", true, 0, 1, &c.n_layer);
    if (!st) st = cti_hf_int(j, label, "n_head", true, 0, 1, &c.n_head);
    if (!st) st = cti_hf_token(j, label, "bos_token_id", &c.bos_token_id);
    if (!st) st = cti_hf_token(j, label, "eos_token_id", &c.eos_token_id);
    if (!st && c.n_embd % c.n_head)
        st = ct_error_set(CT_ERR_FORMAT, "config %s: n_head %lld must divide n_embd %lld", label, (long long)c.n_head,
                          (long long)c.n_embd);
    c.ln_eps = eps ? eps->valuedouble : 1e-5;
    c.dtype = CT_DTYPE_F32;
    if (!st) *out = c;
    cJSON_Delete(j);
    return st;
}

ct_gpt *ct_gpt_from_pretrained(const char *dir)
{
    if (!dir) return ct_error_set(CT_ERR_INVALID, "gpt_from_pretrained: directory is NULL"), NULL;
    size_t n = strlen(dir) + 16;
    char *path = malloc(n);
    if (!path) return ct_error_set(CT_ERR_NOMEM, "gpt_from_pretrained: out of memory"), NULL;
    snprintf(path, n, "%s/config.json", dir);
    char *text = ct_hf_text_read(path);
    ct_gpt_config c;
    ct_gpt *m = NULL;
    if (text && !ct_gpt_config_from_json(text, path, &c) && (m = ct_gpt_new(&c)) && ct_gpt_load(m, dir, true, NULL)) {
        ct_module_free(&m->base);
        m = NULL;
    }
    if (!m) ct_error_prefix("gpt_from_pretrained %s: ", dir);
    free(text);
    free(path);
    return m;
}
