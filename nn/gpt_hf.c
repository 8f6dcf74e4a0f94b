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
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/frame.h"
#include "core/safetensors.h"
#include "nn/gpt.h"

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

/* CT_OK when the file has no lm_head.weight or it equals the file's wte.weight. */
static ct_status check_tied_head(const char *path)
{
    ct_safetensors *f = ct_safetensors_open(path);
    if (!f) return ct_last_status();
    const char *head = NULL, *wte = NULL;
    for (int j = 0; j < ct_safetensors_count(f); j++) {
        const char *n = ct_safetensors_name(f, j);
        if (!strcmp(strip_prefix(n), "lm_head.weight")) head = n;
        if (!strcmp(strip_prefix(n), "wte.weight")) wte = n;
    }
    ct_status st = CT_OK;
    if (head) {
        ct_frame_push();
        ct_tensor *h = ct_safetensors_get(f, head), *w = wte ? ct_safetensors_get(f, wte) : NULL;
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
    ct_safetensors_close(f);
    return st;
}

ct_status ct_gpt_load(ct_gpt *m, const char *path, bool strict, ct_load_report *report)
{
    if (!m || !path) return ct_error_set(CT_ERR_INVALID, "gpt_load: model or path is NULL");
    ct_status st = check_tied_head(path);
    if (st) return st;
    return ct_module_load_mapped(&m->base, path, strict, report, hf_key, NULL);
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
    cJSON_AddStringToObject(j, "torch_dtype", c->dtype == CT_DTYPE_F64 ? "float64" : "float32");
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

ct_status ct_gpt_save_hf(const ct_gpt *m, const char *dir)
{
    if (!m || !dir) return ct_error_set(CT_ERR_INVALID, "gpt_save_hf: model or directory is NULL");
    size_t n = strlen(dir) + 32;
    char *path = malloc(n), *tmp = malloc(n + 24);
    char *json = hf_config_json(&m->cfg);
    ct_status st = CT_OK;
    if (!path || !tmp || !json) st = ct_error_set(CT_ERR_NOMEM, "gpt_save_hf %s: out of memory", dir);
    if (!st) {
        snprintf(path, n, "%s/model.safetensors", dir);
        /* HF's loader requires the "format" metadata */
        st = ct_module_save(&m->base, path, 1, (const char *[]){"format"}, (const char *[]){"pt"});
    }
    if (!st) {
        snprintf(path, n, "%s/config.json", dir);
        snprintf(tmp, n + 24, "%s.tmp.%ld", path, (long)getpid());
        FILE *f = fopen(tmp, "w");
        bool ok = f && fputs(json, f) >= 0 && fputc('\n', f) != EOF;
        if (f && fclose(f)) ok = false;
        if (!ok || rename(tmp, path)) {
            st = ct_error_set(CT_ERR_IO, "gpt_save_hf: cannot write %s: %s", path, strerror(errno));
            remove(tmp);
        }
    }
    free(path);
    free(tmp);
    free(json);
    return st;
}
