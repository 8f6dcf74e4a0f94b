/* Byte-level BPE training: the trained tokenizer as a Hugging Face tokenizer.json
 * (cJSON), with the settings tokenizers writes for a byte-level BPE (ByteLevel
 * pre-tokenizer without a prefix space, ByteLevel decoder, ByteLevel
 * post-processor without offset trimming), and writing it to a file
 * through a temporary name. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "data/bpe_train_internal.h"

static cJSON *byte_level(bool add_prefix_space, bool trim_offsets)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", true);
    return o;
}

static cJSON *added_tokens(const ct_bpe_trainer *t)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < t->nspecial; i++) {
        int64_t id = cti_bpe_str_get(&t->ids, t->special[i], strlen(t->special[i]));
        bool seen = false; /* a special given twice is one token */
        for (size_t k = 0; k < i; k++) seen |= !strcmp(t->special[k], t->special[i]);
        if (seen) continue;
        cJSON *a = cJSON_CreateObject();
        if (!a) break;
        cJSON_AddItemToArray(arr, a);
        cJSON_AddNumberToObject(a, "id", (double)id);
        cJSON_AddStringToObject(a, "content", t->special[i]);
        cJSON_AddBoolToObject(a, "single_word", false);
        cJSON_AddBoolToObject(a, "lstrip", false);
        cJSON_AddBoolToObject(a, "rstrip", false);
        cJSON_AddBoolToObject(a, "normalized", false);
        cJSON_AddBoolToObject(a, "special", true);
    }
    return arr;
}

static cJSON *model(const ct_bpe_trainer *t)
{
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", false);
    cJSON_AddBoolToObject(m, "byte_fallback", false);
    cJSON_AddBoolToObject(m, "ignore_merges", false);
    cJSON *vocab = cJSON_AddObjectToObject(m, "vocab");
    for (size_t id = 0; vocab && id < t->ntok; id++)
        if (!cJSON_AddNumberToObject(vocab, t->tok[id], (double)id)) return cJSON_Delete(m), NULL;
    /* [left, right] arrays, the form tokenizers writes since 0.20 */
    cJSON *merges = cJSON_AddArrayToObject(m, "merges");
    for (size_t i = 0; merges && i < t->nmerges; i++) {
        const char *pair[2] = {t->tok[(t->merges[i] - 1) >> 32], t->tok[(uint32_t)(t->merges[i] - 1)]};
        cJSON *p = cJSON_CreateStringArray(pair, 2);
        if (!p) return cJSON_Delete(m), NULL;
        cJSON_AddItemToArray(merges, p);
    }
    if (!vocab || !merges) return cJSON_Delete(m), NULL;
    return m;
}

char *cti_bpe_trainer_write_json(const ct_bpe_trainer *t, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok) {
        cJSON_AddStringToObject(root, "version", "1.0");
        cJSON_AddNullToObject(root, "truncation");
        cJSON_AddNullToObject(root, "padding");
        cJSON *parts[5] = {added_tokens(t), NULL, byte_level(false, true), byte_level(true, false),
                           byte_level(true, true)};
        static const char *const names[5] = {"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder"};
        for (int i = 0; i < 5; i++) {
            if (i == 1) {
                cJSON_AddNullToObject(root, names[i]);
                continue;
            }
            if (!parts[i]) ok = false;
            else cJSON_AddItemToObject(root, names[i], parts[i]);
        }
        cJSON *m = ok ? model(t) : NULL;
        if (m) cJSON_AddItemToObject(root, "model", m);
        else ok = false;
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory writing the tokenizer.json of %zu tokens", t->ntok);
        return NULL;
    }
    /* cJSON's allocator is malloc unless a program changes its hooks; copy to be sure */
    size_t n = strlen(text);
    char *out = malloc(n + 1);
    if (out) memcpy(out, text, n + 1);
    else ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for %zu bytes", n);
    cJSON_free(text);
    if (out) *len = n;
    return out;
}

ct_status ct_bpe_trainer_save(ct_bpe_trainer *t, const char *path)
{
    if (!path) return ct_error_set(CT_ERR_INVALID, "bpe_trainer_save: path is NULL");
    size_t n = 0;
    char *text = ct_bpe_trainer_json(t, &n);
    if (!text) return ct_last_status();
    ct_status st = cti_file_write_atomic(path, text, n, "bpe_train");
    free(text);
    return st;
}

ct_status ct_bpe_train(const ct_bpe_train_config *config, const char *const *paths, size_t npaths,
                       const char *out_path)
{
    if ((!paths && npaths) || !out_path)
        return ct_error_set(CT_ERR_INVALID, "bpe_train: %s is NULL", !out_path ? "out_path" : "paths");
    ct_bpe_trainer *t = ct_bpe_trainer_new(config);
    if (!t) return ct_last_status();
    ct_status st = CT_OK;
    for (size_t i = 0; i < npaths && !st; i++) st = ct_bpe_trainer_feed_file(t, paths[i]);
    if (!st) st = ct_bpe_trainer_save(t, out_path);
    ct_bpe_trainer_free(t);
    return st;
}
