/* Causal language models behind one interface (see nn/lm.h): the generic calls,
 * loading a Hugging Face directory by its config.json's "model_type", and the GPT's
 * ops (ct_gpt_as_lm). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "nn/gpt.h"
#include "nn/hf_config.h"
#include "nn/hf_weights.h"
#include "nn/llama.h"
#include "nn/lm.h"

/* ---- the generic calls ---------------------------------------------------------- */

ct_status ct_lm_save_pretrained(ct_lm *lm, const char *dir)
{
    if (!lm || !dir) return ct_error_set(CT_ERR_INVALID, "lm_save_pretrained: NULL model or directory");
    struct stat sb;
    if (stat(dir, &sb) != 0 && mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ct_error_set(CT_ERR_IO, "lm_save_pretrained: cannot create directory '%s': %s", dir, strerror(errno));
    ct_status st = lm->ops->save_pretrained(lm, dir);
    if (st) ct_error_prefix("lm_save_pretrained %s: ", dir);
    return st;
}

/* the first parameter says where the model lives and in which dtype */
static ct_tensor *first_param(const ct_module *m)
{
    if (m->nparams > 0) return m->params[0].tensor;
    for (int i = 0; i < m->nchildren; i++) {
        ct_tensor *t = first_param(m->children[i].module);
        if (t) return t;
    }
    return NULL;
}

ct_kv_cache *ct_lm_cache_new(ct_lm *lm, int64_t batch, int64_t max_len)
{
    if (!lm) {
        ct_error_set(CT_ERR_INVALID, "lm_cache_new: NULL model");
        return NULL;
    }
    if (max_len > lm->max_positions) {
        ct_error_set(CT_ERR_INVALID, "lm_cache_new: max_len %lld exceeds the model's %lld positions", (long long)max_len,
                     (long long)lm->max_positions);
        return NULL;
    }
    const ct_tensor *p = first_param(lm->module);
    return ct_kv_cache_new(lm->n_layer, batch, lm->n_kv_head, max_len, lm->head_dim, p ? p->dtype : CT_DTYPE_F32,
                           ct_lm_device(lm));
}

ct_device ct_lm_device(const ct_lm *lm)
{
    const ct_tensor *p = lm ? first_param(lm->module) : NULL;
    return p ? p->device : CT_CPU;
}

ct_tensor *ct_lm_forward(ct_lm *lm, ct_tensor *idx, ct_kv_cache *cache)
{
    if (!lm || !idx) {
        ct_error_set(CT_ERR_INVALID, "lm_forward: NULL model or idx");
        return NULL;
    }
    return lm->ops->forward(lm, idx, cache);
}

void ct_lm_free(ct_lm *lm)
{
    if (!lm) return;
    if (lm->owns_model && lm->ops->free_model) lm->ops->free_model(lm->model);
    free(lm);
}

/* ---- GPT-2 ------------------------------------------------------------------------ */

static ct_tensor *gpt_lm_forward(ct_lm *lm, ct_tensor *idx, ct_kv_cache *cache)
{
    return ct_gpt_forward_cached(lm->model, idx, cache);
}

static ct_status gpt_lm_save(ct_lm *lm, const char *dir) { return ct_gpt_save_hf(lm->model, dir); }

static void gpt_lm_free(void *model) { ct_module_free(model); }

static const ct_lm_ops GPT_LM_OPS = {"gpt2", gpt_lm_forward, gpt_lm_save, gpt_lm_free};

ct_lm *ct_gpt_as_lm(ct_gpt *m, bool owns)
{
    if (!m) {
        ct_error_set(CT_ERR_INVALID, "gpt_as_lm: NULL model");
        return NULL;
    }
    ct_lm *lm = calloc(1, sizeof *lm);
    if (!lm) {
        ct_error_set(CT_ERR_NOMEM, "gpt_as_lm: out of memory");
        return NULL;
    }
    *lm = (ct_lm){.ops = &GPT_LM_OPS, .model = m, .owns_model = owns, .module = &m->base,
                  .vocab_size = m->cfg.vocab_size, .max_positions = m->cfg.block_size, .n_layer = (int)m->cfg.n_layer,
                  .n_kv_head = m->cfg.n_head, .head_dim = m->cfg.n_embd / m->cfg.n_head,
                  /* GPT-2's <|endoftext|> is the last id of its 50257; a model of another
                   * vocabulary has none unless its config.json says so */
                  .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1};
    return lm;
}

/* ---- config.json ------------------------------------------------------------------ */

typedef struct {
    const char *path; /* dir/config.json, for messages */
    const cJSON *root;
} config;

/* A token id of the config (see cti_hf_token); an id outside the vocabulary is dropped
 * with a warning, as a model cannot produce it. */
static int64_t config_token(const config *c, const char *key, int64_t vocab_size)
{
    int64_t id = -1;
    if (cti_hf_token(c->root, c->path, key, &id)) {
        fprintf(stderr, "ctrain: %s; ignored\n", ct_last_error());
        ct_error_clear();
        return -1;
    }
    if (id < vocab_size) return id;
    fprintf(stderr, "ctrain: %s: %s %lld is outside the vocabulary of %lld; ignored\n", c->path, key, (long long)id,
            (long long)vocab_size);
    return -1;
}

/* GPT2Config and the weights (one file or shards) through nn/gpt_hf.c. */
static ct_lm *gpt2_from_pretrained(const char *dir)
{
    ct_gpt *m = ct_gpt_from_pretrained(dir);
    ct_lm *lm = m ? ct_gpt_as_lm(m, true) : NULL;
    if (m && !lm) ct_module_free(&m->base);
    return lm;
}

/* LlamaConfig and the weights through nn/llama_hf.c. */
static ct_lm *llama_from_pretrained(const char *dir)
{
    ct_llama *m = ct_llama_from_pretrained(dir);
    ct_lm *lm = m ? ct_llama_as_lm(m, true) : NULL;
    if (m && !lm) ct_module_free(&m->base);
    return lm;
}

/* The model types ct_lm_from_pretrained knows: config.json's "model_type" -> a loader
 * of dir (its own config.json and weights) that returns an owning ct_lm. */
typedef ct_lm *(*lm_loader)(const char *dir);
static const struct {
    const char *model_type;
    lm_loader load;
} MODEL_TYPES[] = {
    {"gpt2", gpt2_from_pretrained},
    {"llama", llama_from_pretrained},
};
#define N_MODEL_TYPES (sizeof MODEL_TYPES / sizeof *MODEL_TYPES)

ct_lm *ct_lm_from_pretrained(const char *dir)
{
    if (!dir) {
        ct_error_set(CT_ERR_INVALID, "lm_from_pretrained: NULL directory");
        return NULL;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        ct_error_set(CT_ERR_IO, "lm_from_pretrained: cannot open model directory '%s': %s", dir, strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(sb.st_mode)) {
        ct_error_set(CT_ERR_INVALID, "lm_from_pretrained: '%s' is not a directory", dir);
        return NULL;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path) {
        ct_error_set(CT_ERR_INVALID, "lm_from_pretrained: directory name too long");
        return NULL;
    }
    char *text = ct_hf_text_read(path);
    if (!text) {
        ct_error_prefix("lm_from_pretrained: ");
        return NULL;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    config c = {path, root};
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    ct_lm *lm = NULL;
    if (!cJSON_IsObject(root)) {
        ct_error_set(CT_ERR_FORMAT, "lm_from_pretrained: %s is not a JSON object", path);
    } else if (!cJSON_IsString(type)) {
        ct_error_set(CT_ERR_FORMAT, "lm_from_pretrained: %s has no \"model_type\" string", path);
    } else {
        size_t i = 0;
        while (i < N_MODEL_TYPES && strcmp(MODEL_TYPES[i].model_type, type->valuestring)) i++;
        if (i == N_MODEL_TYPES) {
            char names[256] = "";
            for (size_t j = 0; j < N_MODEL_TYPES; j++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", j ? ", " : "",
                         MODEL_TYPES[j].model_type);
            ct_error_set(CT_ERR_UNSUPPORTED, "lm_from_pretrained: %s: model_type '%s' is not supported (supported: %s)",
                         path, type->valuestring, names);
        } else if ((lm = MODEL_TYPES[i].load(dir)) != NULL) {
            lm->bos_token_id = config_token(&c, "bos_token_id", lm->vocab_size);
            lm->eos_token_id = config_token(&c, "eos_token_id", lm->vocab_size);
            lm->pad_token_id = config_token(&c, "pad_token_id", lm->vocab_size);
        } else {
            ct_error_prefix("lm_from_pretrained %s: ", dir);
        }
    }
    cJSON_Delete(root);
    return lm;
}
