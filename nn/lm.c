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
    ct_dtype dt = p ? p->dtype : CT_DTYPE_F32;
    ct_device dev = p ? p->device : CT_CPU;
    return ct_kv_cache_new(lm->n_layer, batch, lm->n_kv_head, max_len, lm->head_dim, dt, dev);
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

/* A whole-number field >= 1; def when absent and def > 0, else an error. */
static ct_status config_size(const config *c, const char *key, const char *alt, int64_t def, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!v && alt) v = cJSON_GetObjectItemCaseSensitive(c->root, alt);
    if (!v && def > 0) return *out = def, CT_OK;
    if (!v) return ct_error_set(CT_ERR_FORMAT, "%s: \"%s\" is missing", c->path, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= 1 && d <= 1e12 && d == floor(d)))
        return ct_error_set(CT_ERR_FORMAT, "%s: \"%s\" must be a whole number >= 1", c->path, key);
    *out = (int64_t)d;
    return CT_OK;
}

/* A token id of the config (null or absent: -1; a list such as Llama 3's eos: its
 * first id); an id outside the vocabulary is dropped with a warning. */
static int64_t config_token(const config *c, const char *key, int64_t vocab_size)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (cJSON_IsArray(v)) v = v->child;
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (d >= 0 && d < (double)vocab_size && d == floor(d)) return (int64_t)d;
    fprintf(stderr, "ctrain: %s: %s %g is outside the vocabulary of %lld; ignored\n", c->path, key, d,
            (long long)vocab_size);
    return -1;
}

static ct_lm *gpt2_from_pretrained(const char *dir, const config *c)
{
    ct_gpt_config g = {0};
    ct_status st = config_size(c, "vocab_size", NULL, 0, &g.vocab_size);
    if (!st) st = config_size(c, "n_positions", "n_ctx", 0, &g.block_size);
    if (!st) st = config_size(c, "n_embd", NULL, 0, &g.n_embd);
    if (!st) st = config_size(c, "n_layer", NULL, 0, &g.n_layer);
    if (!st) st = config_size(c, "n_head", NULL, 0, &g.n_head);
    if (st) return NULL;
    if (g.n_embd % g.n_head) {
        ct_error_set(CT_ERR_FORMAT, "%s: n_embd %lld is not divisible by n_head %lld", c->path, (long long)g.n_embd,
                     (long long)g.n_head);
        return NULL;
    }
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(c->root, "layer_norm_epsilon");
    if (eps && !(cJSON_IsNumber(eps) && eps->valuedouble > 0)) {
        ct_error_set(CT_ERR_FORMAT, "%s: \"layer_norm_epsilon\" must be a number > 0", c->path);
        return NULL;
    }
    g.ln_eps = eps ? eps->valuedouble : 1e-5;
    /* ctrain's GELU is the tanh form: GPT-2's gelu_new */
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(c->root, "activation_function");
    if (act && !(cJSON_IsString(act) &&
                 (!strcmp(act->valuestring, "gelu_new") || !strcmp(act->valuestring, "gelu_pytorch_tanh")))) {
        ct_error_set(CT_ERR_UNSUPPORTED, "%s: activation_function %s is not supported (supported: gelu_new, "
                     "gelu_pytorch_tanh)", c->path, cJSON_IsString(act) ? act->valuestring : "(not a string)");
        return NULL;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c->root, "scale_attn_by_inverse_layer_idx")) ||
        cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c->root, "scale_attn_weights"))) {
        ct_error_set(CT_ERR_UNSUPPORTED, "%s: only GPT-2's attention scaling 1/sqrt(head_dim) is supported "
                     "(scale_attn_weights true, scale_attn_by_inverse_layer_idx false)", c->path);
        return NULL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ct_error_set(CT_ERR_IO, "%s: cannot open model.safetensors: %s (GPT-2 weights are read from one file)", dir,
                     strerror(errno));
        return NULL;
    }
    ct_gpt *m = ct_gpt_new(&g);
    if (!m) return NULL;
    if (ct_gpt_load(m, path, true, NULL)) {
        ct_module_free(&m->base);
        return NULL;
    }
    ct_lm *lm = ct_gpt_as_lm(m, true);
    if (!lm) ct_module_free(&m->base);
    return lm;
}

/* nn/llama_hf.c reads the config itself (it names its own errors). */
static ct_lm *llama_from_pretrained(const char *dir, const config *c)
{
    (void)c;
    ct_llama *m = ct_llama_from_pretrained(dir);
    if (!m) return NULL;
    ct_lm *lm = ct_llama_as_lm(m, true);
    if (!lm) ct_module_free(&m->base);
    return lm;
}

/* The model types ct_lm_from_pretrained knows: config.json's "model_type" -> a loader
 * of dir (config.json already parsed) that returns an owning ct_lm. */
typedef ct_lm *(*lm_loader)(const char *dir, const config *c);
static const struct {
    const char *model_type;
    lm_loader load;
} MODEL_TYPES[] = {
    {"gpt2", gpt2_from_pretrained},
    {"llama", llama_from_pretrained},
};
#define N_MODEL_TYPES (sizeof MODEL_TYPES / sizeof *MODEL_TYPES)

static char *read_text(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    bool ok = buf && !ferror(f) && n <= max;
    fclose(f);
    if (!ok) {
        free(buf);
        errno = buf ? EFBIG : ENOMEM;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

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
    size_t len = 0;
    char *text = read_text(path, 1u << 20, &len);
    if (!text) {
        ct_error_set(CT_ERR_IO, "lm_from_pretrained: cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
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
        } else if ((lm = MODEL_TYPES[i].load(dir, &c)) != NULL) {
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
