/* Byte-level BPE: reading Hugging Face's tokenizer.json and GPT-2's vocab.json +
 * merges.txt (cJSON). Every check names the file and the key or line at fault. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "data/bpe_internal.h"

/* the whole file, NUL-terminated (a Llama 3 tokenizer.json is about 9 MiB) */
static char *read_file(const char *path, size_t *n)
{
    return cti_file_read_text(path, (size_t)1 << 30, "bpe", n);
}

static cJSON *parse_json(const char *text, size_t n, const char *name)
{
    cJSON *root = cJSON_ParseWithLength(text, n);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + n ? (size_t)(at - text) : 0;
        ct_error_set(CT_ERR_FORMAT, "bpe: '%s' is not JSON (the parser stops at byte %zu)", name, off);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        ct_error_set(CT_ERR_FORMAT, "bpe: '%s': the top level is not a JSON object", name);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* an id: an integral JSON number */
static ct_status get_id(const ct_bpe *b, const cJSON *v, const char *what, const char *token, int64_t *id)
{
    /* the range first: casting a double outside int64's is undefined */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < BPE_MAX_ID) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': the id of %s '%s' is not an integer in [0, %d)", b->name, what,
                            token, BPE_MAX_ID);
    *id = (int64_t)v->valuedouble;
    return CT_OK;
}

/* whether added_tokens holds content with this id */
static bool is_added(const cJSON *added, const char *content, int64_t id)
{
    const cJSON *a;
    cJSON_ArrayForEach(a, added)
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content"), *i = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (cJSON_IsString(c) && cJSON_IsNumber(i) && i->valuedouble == (double)id && !strcmp(c->valuestring, content))
            return true;
    }
    return false;
}

/* added: the file's added_tokens (NULL for vocab.json). A special token is also in
 * the model's vocabulary (tokenizers' trainer puts it there); when its text is not
 * written in the byte-level alphabet (a space, a character past U+00FF) it is no
 * model token, only the added token read later. */
static ct_status add_vocab(ct_bpe *b, const cJSON *vocab, const char *where, const cJSON *added)
{
    if (!cJSON_IsObject(vocab))
        return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': %s is not an object of token: id", b->name, where);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        int64_t id = 0;
        ct_status st = get_id(b, e, "token", e->string, &id);
        if (!st && !cti_bpe_token_mappable(e->string) && is_added(added, e->string, id)) continue;
        if (!st) st = cti_bpe_add_token(b, e->string, id);
        if (st) return st;
    }
    return CT_OK;
}

static bool is_null_or_absent(const cJSON *v) { return !v || cJSON_IsNull(v); }
static bool is_empty_string_or_absent(const cJSON *v)
{
    return is_null_or_absent(v) || (cJSON_IsString(v) && !v->valuestring[0]);
}

static ct_status unsupported(const ct_bpe *b, const char *what)
{
    return ct_error_set(CT_ERR_UNSUPPORTED, "bpe: '%s': %s is not supported (byte-level BPE as GPT-2 uses it is)",
                        b->name, what);
}

static ct_status read_model(ct_bpe *b, const cJSON *model, const cJSON *added)
{
    if (!cJSON_IsObject(model)) return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': no \"model\" object", b->name);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "BPE")))
        return ct_error_set(CT_ERR_UNSUPPORTED, "bpe: '%s': model.type is %s%s%s, not \"BPE\"", b->name,
                            cJSON_IsString(type) ? "\"" : "", cJSON_IsString(type) ? type->valuestring : "not a string",
                            cJSON_IsString(type) ? "\"" : "");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (!is_null_or_absent(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return unsupported(b, "model.dropout (random merges)");
    if (!is_empty_string_or_absent(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")))
        return unsupported(b, "model.continuing_subword_prefix");
    if (!is_empty_string_or_absent(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix")))
        return unsupported(b, "model.end_of_word_suffix");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return unsupported(b, "model.byte_fallback (SentencePiece-style BPE)");
    b->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!vocab) return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': model.vocab is missing", b->name);
    ct_status st = add_vocab(b, vocab, "model.vocab", added);
    if (st) return st;

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges))
        return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': model.merges is %s", b->name,
                            merges ? "not an array" : "missing");
    int64_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        const char *left = NULL, *right = NULL;
        char *copy = NULL;
        if (cJSON_IsString(m)) { /* "a b": tokens never hold a space (it is written U+0120) */
            copy = strdup(m->valuestring);
            if (!copy) return ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory", b->name);
            char *sp = strchr(copy, ' ');
            if (sp && !strchr(sp + 1, ' ')) *sp = '\0', left = copy, right = sp + 1;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            left = cJSON_GetArrayItem(m, 0)->valuestring;
            right = cJSON_GetArrayItem(m, 1)->valuestring;
        }
        st = left ? cti_bpe_add_merge(b, left, right, rank)
                  : ct_error_set(CT_ERR_FORMAT,
                                 "bpe: '%s': model.merges[%lld] is neither \"a b\" (two tokens, one space) nor "
                                 "[\"a\", \"b\"]",
                                 b->name, (long long)rank);
        free(copy);
        if (st) return st;
        rank++;
    }
    return CT_OK;
}

static ct_status read_added(ct_bpe *b, const cJSON *added)
{
    if (is_null_or_absent(added)) return CT_OK;
    if (!cJSON_IsArray(added)) return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': added_tokens is not an array", b->name);
    int i = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, added)
    {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsObject(a) || !cJSON_IsString(content))
            return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': added_tokens[%d] is not an object with a \"content\" string",
                                b->name, i);
        static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 3; f++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, flags[f])))
                return ct_error_set(CT_ERR_UNSUPPORTED, "bpe: '%s': added token '%s' sets %s, which is not supported",
                                    b->name, content->valuestring, flags[f]);
        int64_t id = 0;
        ct_status st = get_id(b, cJSON_GetObjectItemCaseSensitive(a, "id"), "added token", content->valuestring, &id);
        if (!st)
            st = cti_bpe_add_added(b, content->valuestring, id,
                               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special")));
        if (st) return st;
        i++;
    }
    return CT_OK;
}

/* pre: a ByteLevel pre-tokenizer at where; alone (GPT-2's form, or no split at all
 * when use_regex is false) or after a Split (in_sequence: its regex must be off) */
/* pre: a ByteLevel pre-tokenizer at where; alone (GPT-2's form, or no split at all
 * when use_regex is false) or after a Split (in_sequence: its regex must be off) */
static ct_status read_byte_level(ct_bpe *b, const cJSON *pre, const char *where, bool in_sequence)
{
    const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");
    bool prefix = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space"));
    if (in_sequence && !cJSON_IsFalse(use_regex)) /* GPT-2's regex after another split */
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "bpe: '%s': %s.use_regex = true after a Split is not supported (only false is)", b->name,
                            where);
    if (in_sequence && prefix)
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "bpe: '%s': %s.add_prefix_space = true after a Split is not supported (only false is)",
                            b->name, where);
    if (in_sequence) return CT_OK;
    b->no_split = cJSON_IsFalse(use_regex);
    b->add_prefix_space = prefix;
    return CT_OK;
}

/* a Split pre-tokenizer at where: a regex, each match its own piece */
static ct_status read_split(ct_bpe *b, const cJSON *pre, const char *where)
{
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(pre, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    if (!cJSON_IsString(regex))
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "bpe: '%s': %s.pattern is not supported: only {\"Regex\": \"...\"} is%s", b->name, where,
                            cJSON_GetObjectItemCaseSensitive(pattern, "String") ? " (this is a String)" : "");
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(pre, "behavior");
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated")) {
        const char *q = cJSON_IsString(behavior) ? "\"" : "";
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "bpe: '%s': %s.behavior %s%.40s%s is not supported (only \"Isolated\" is)", b->name, where,
                            q, cJSON_IsString(behavior) ? behavior->valuestring : "(missing)", q);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "invert")))
        return ct_error_set(CT_ERR_UNSUPPORTED, "bpe: '%s': %s.invert = true is not supported (only false is)",
                            b->name, where);
    b->split_regex = strdup(regex->valuestring);
    return b->split_regex ? CT_OK : ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory", b->name);
}

/* The forms read: ByteLevel (with or without GPT-2's regex), and Sequence [Split
 * (Regex, Isolated), ByteLevel (use_regex false)] as Llama 3 and Qwen2 write it. */
static ct_status read_pre_tokenizer(ct_bpe *b, const cJSON *root)
{
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!is_null_or_absent(norm)) return unsupported(b, "a normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (!cJSON_IsObject(pre) || !cJSON_IsString(type))
        return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': pre_tokenizer is not an object with a \"type\"", b->name);
    if (!strcmp(type->valuestring, "ByteLevel")) return read_byte_level(b, pre, "pre_tokenizer", false);
    if (strcmp(type->valuestring, "Sequence"))
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "bpe: '%s': pre_tokenizer.type is \"%s\"; only \"ByteLevel\" and \"Sequence\" (Split, "
                            "ByteLevel) are supported",
                            b->name, type->valuestring);
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    const cJSON *t0 = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(seq, 0), "type");
    const cJSON *t1 = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(seq, 1), "type");
    if (!cJSON_IsArray(seq) || cJSON_GetArraySize(seq) != 2 || !cJSON_IsString(t0) || !cJSON_IsString(t1) ||
        strcmp(t0->valuestring, "Split") || strcmp(t1->valuestring, "ByteLevel"))
        return ct_error_set(CT_ERR_UNSUPPORTED,
                            "bpe: '%s': pre_tokenizer.pretokenizers is not supported: only a Sequence of a \"Split\" "
                            "then a \"ByteLevel\" is",
                            b->name);
    ct_status st = read_split(b, cJSON_GetArrayItem(seq, 0), "pre_tokenizer.pretokenizers[0]");
    return st ? st : read_byte_level(b, cJSON_GetArrayItem(seq, 1), "pre_tokenizer.pretokenizers[1]", true);
}

/* bos/eos from a TemplateProcessing post-processor (alone or in a Sequence): the
 * special tokens before and after $A in "single" */
static void read_post_processor(ct_bpe *b, const cJSON *root)
{
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pp, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "Sequence")) { /* Llama 3: ByteLevel, TemplateProcessing */
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(pp, "processors"))
        {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
            if (cJSON_IsString(t) && !strcmp(t->valuestring, "TemplateProcessing")) pp = p, type = t;
        }
    }
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "TemplateProcessing")) return;
    bool seen_a = false;
    const cJSON *item;
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(pp, "single"))
    {
        if (cJSON_GetObjectItemCaseSensitive(item, "Sequence")) {
            seen_a = true;
            continue;
        }
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(item, "SpecialToken"), "id");
        if (!cJSON_IsString(id)) continue;
        int64_t t = ct_bpe_token_id(b, id->valuestring, strlen(id->valuestring));
        if (t < 0) continue;
        if (!seen_a && b->bos < 0) b->bos = t;
        if (seen_a && b->eos < 0) b->eos = t;
    }
}

ct_bpe *ct_bpe_load_memory(const void *json, size_t n, const char *name)
{
    if (!json && n) {
        ct_error_set(CT_ERR_INVALID, "bpe_load_memory: json is NULL");
        return NULL;
    }
    ct_bpe *b = cti_bpe_new(name);
    if (!b) return NULL;
    cJSON *root = parse_json(json ? json : "", n, b->name);
    ct_status st = root ? CT_OK : CT_ERR_FORMAT;
    if (!st) st = read_pre_tokenizer(b, root);
    if (!st) st = read_model(b, cJSON_GetObjectItemCaseSensitive(root, "model"),
                                cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (!st) st = read_added(b, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (!st) read_post_processor(b, root);
    if (!st) st = cti_bpe_finish(b);
    cJSON_Delete(root);
    if (st) {
        ct_bpe_free(b);
        return NULL;
    }
    return b;
}

ct_bpe *ct_bpe_load(const char *path)
{
    if (!path) {
        ct_error_set(CT_ERR_INVALID, "bpe_load: path is NULL");
        return NULL;
    }
    size_t n;
    char *text = read_file(path, &n);
    if (!text) return NULL;
    ct_bpe *b = ct_bpe_load_memory(text, n, path);
    free(text);
    return b;
}

static ct_status read_merges_txt(ct_bpe *b, char *text, const char *path)
{
    int64_t rank = 0, line = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        line++;
        size_t len = strlen(p);
        if (len && p[len - 1] == '\r') p[--len] = '\0';
        if (len && !(line == 1 && !strncmp(p, "#version", 8))) {
            char *sp = strchr(p, ' ');
            if (!sp || sp == p || !sp[1] || strchr(sp + 1, ' '))
                return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': line %lld is not \"a b\" (two tokens, one space)", path,
                                    (long long)line);
            *sp = '\0';
            ct_status st = cti_bpe_add_merge(b, p, sp + 1, rank++);
            if (st) return st;
        }
        if (!nl) break;
        p = nl + 1;
    }
    return CT_OK;
}

ct_bpe *ct_bpe_load_gpt2(const char *vocab_path, const char *merges_path)
{
    if (!vocab_path || !merges_path) {
        ct_error_set(CT_ERR_INVALID, "bpe_load_gpt2: %s is NULL", !vocab_path ? "vocab_json_path" : "merges_txt_path");
        return NULL;
    }
    size_t n;
    char *text = read_file(vocab_path, &n);
    if (!text) return NULL;
    ct_bpe *b = cti_bpe_new(vocab_path);
    cJSON *root = b ? parse_json(text, n, vocab_path) : NULL;
    free(text);
    ct_status st = root ? add_vocab(b, root, "the top level", NULL) : ct_last_status();
    cJSON_Delete(root);
    char *merges = st ? NULL : read_file(merges_path, &n);
    if (!st && !merges) st = ct_last_status();
    if (!st) { /* errors in the merges name merges.txt */
        char *name = strdup(merges_path);
        if (!name) st = ct_error_set(CT_ERR_NOMEM, "bpe: out of memory loading '%s'", merges_path);
        if (!st) {
            char *vocab_name = b->name;
            b->name = name;
            st = read_merges_txt(b, merges, merges_path);
            b->name = vocab_name;
            free(name);
        }
    }
    free(merges);
    /* GPT-2's only special token, split off as its tokenizer does */
    int64_t eot = st ? -1 : cti_bpe_str_get(&b->vocab, "<|endoftext|>", 13);
    if (eot >= 0) st = cti_bpe_add_added(b, "<|endoftext|>", eot, true);
    if (!st) st = cti_bpe_finish(b);
    if (st) {
        ct_bpe_free(b);
        return NULL;
    }
    return b;
}
