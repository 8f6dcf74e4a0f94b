/* Byte-level BPE training: the trainer's settings and counting the words of the
 * text it is fed (GPT-2's regex cuts each sequence into pieces; files are read
 * line by line, as tokenizers reads them). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/bpe_encode_internal.h"
#include "data/bpe_train_internal.h"

/* the byte-level alphabet; the trainer always keeps all of it */
#define ALPHABET 256

static bool valid_utf8(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n || (len == 2 && c < 0xC2)) return false;
        uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (p[i + k] & 0x3Fu);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += len;
    }
    return true;
}

ct_bpe_trainer *ct_bpe_trainer_new(const ct_bpe_train_config *config)
{
    if (!config || (config->nspecial && !config->special_tokens)) {
        ct_error_set(CT_ERR_INVALID, "bpe_trainer_new: %s is NULL", !config ? "config" : "special_tokens");
        return NULL;
    }
    if (config->min_frequency < 0) {
        ct_error_set(CT_ERR_INVALID, "bpe_trainer_new: min_frequency is %lld; it must be >= 0",
                     (long long)config->min_frequency);
        return NULL;
    }
    for (size_t i = 0; i < config->nspecial; i++) {
        const char *s = config->special_tokens[i];
        if (!s || !*s || !valid_utf8((const uint8_t *)s, strlen(s))) {
            ct_error_set(CT_ERR_INVALID, "bpe_trainer_new: special token %zu is %s", i,
                         !s ? "NULL" : !*s ? "empty" : "not valid UTF-8");
            return NULL;
        }
    }
    if (config->vocab_size < (int64_t)(config->nspecial + ALPHABET) || config->vocab_size > BPE_MAX_ID) {
        ct_error_set(CT_ERR_INVALID,
                     "bpe_trainer_new: vocab_size is %lld; it must be in [%zu, %d]: the %zu special tokens, the %d "
                     "bytes, then the merges",
                     (long long)config->vocab_size, config->nspecial + ALPHABET, BPE_MAX_ID, config->nspecial, ALPHABET);
        return NULL;
    }
    ct_bpe_trainer *t = calloc(1, sizeof *t);
    if (!t) goto nomem;
    t->vocab_size = config->vocab_size;
    t->min_frequency = config->min_frequency;
    t->special = calloc(config->nspecial ? config->nspecial : 1, sizeof *t->special);
    if (!t->special) goto nomem;
    for (size_t i = 0; i < config->nspecial; i++) {
        t->special[i] = strdup(config->special_tokens[i]);
        t->nspecial = i + 1; /* freed with t from here on */
        if (!t->special[i]) goto nomem;
    }
    t->re = cti_bpe_regex();
    if (!t->re) {
        ct_bpe_trainer_free(t);
        return NULL;
    }
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!t->md) goto nomem;
    return t;
nomem:
    ct_bpe_trainer_free(t);
    ct_error_set(CT_ERR_NOMEM, "bpe_trainer_new: out of memory");
    return NULL;
}

void ct_bpe_trainer_free(ct_bpe_trainer *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->nspecial; i++) free(t->special[i]);
    free(t->special);
    pcre2_match_data_free(t->md);
    pcre2_code_free(t->re);
    cti_bpe_str_free(&t->words);
    free(t->json);
    for (size_t i = 0; i < t->ntok; i++) free(t->tok[i]);
    free(t->tok);
    free(t->tok_len);
    cti_bpe_str_free(&t->ids);
    free(t->merges);
    free(t);
}

static ct_status count_word(void *ctx, const uint8_t *piece, size_t n)
{
    ct_bpe_trainer *t = ctx;
    if (n > UINT32_MAX) return ct_error_set(CT_ERR_INVALID, "bpe_train: a piece of %zu bytes is too long", n);
    return cti_bpe_str_add(&t->words, piece, n, 1);
}

static ct_status check_feed(const ct_bpe_trainer *t, const char *fn)
{
    if (!t) return ct_error_set(CT_ERR_INVALID, "%s: trainer is NULL", fn);
    if (t->trained) return ct_error_set(CT_ERR_INVALID, "%s: the trainer has already learned its merges", fn);
    return CT_OK;
}

ct_status ct_bpe_trainer_feed(ct_bpe_trainer *t, const void *text, size_t n)
{
    ct_status st = check_feed(t, "bpe_trainer_feed");
    if (st) return st;
    if (!text && n) return ct_error_set(CT_ERR_INVALID, "bpe_trainer_feed: text is NULL");
    return n ? cti_bpe_split(t->re, t->md, text, n, count_word, t) : CT_OK;
}

ct_status ct_bpe_trainer_feed_file(ct_bpe_trainer *t, const char *path)
{
    ct_status st = check_feed(t, "bpe_trainer_feed_file");
    if (st) return st;
    if (!path) return ct_error_set(CT_ERR_INVALID, "bpe_trainer_feed_file: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ct_error_set(CT_ERR_IO, "bpe_train: cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) st = ct_error_set(CT_ERR_IO, "bpe_train: cannot stat '%s': %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = ct_error_set(CT_ERR_INVALID, "bpe_train: '%s' is not a regular file", path);
    if (st || sb.st_size == 0) {
        close(fd);
        return st;
    }
    size_t n = (size_t)sb.st_size;
    const uint8_t *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return ct_error_set(CT_ERR_IO, "bpe_train: cannot map '%s': %s", path, strerror(errno));
    for (size_t i = 0; i < n && !st;) {
        const uint8_t *nl = memchr(p + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (p + i)) + 1 : n - i; /* the line with its "\n" */
        st = cti_bpe_split(t->re, t->md, p + i, len, count_word, t);
        i += len;
    }
    munmap((void *)p, n);
    if (st) ct_error_prefix("bpe_train: '%s'", path);
    return st;
}

char *ct_bpe_trainer_json(ct_bpe_trainer *t, size_t *len)
{
    if (!t) {
        ct_error_set(CT_ERR_INVALID, "bpe_trainer_json: trainer is NULL");
        return NULL;
    }
    if (!t->trained) { /* once: a failure leaves the vocabulary half built */
        t->trained = true;
        if (!cti_bpe_trainer_learn(t)) t->json = cti_bpe_trainer_write_json(t, &t->json_len);
        if (!t->json) return NULL;
    }
    if (!t->json) {
        ct_error_set(CT_ERR_INVALID, "bpe_trainer_json: an earlier call failed");
        return NULL;
    }
    char *copy = malloc(t->json_len + 1);
    if (!copy) {
        ct_error_set(CT_ERR_NOMEM, "bpe_trainer_json: out of memory for %zu bytes", t->json_len);
        return NULL;
    }
    memcpy(copy, t->json, t->json_len + 1);
    if (len) *len = t->json_len;
    return copy;
}

int64_t ct_bpe_trainer_vocab_size(const ct_bpe_trainer *t) { return t && t->json ? (int64_t)t->ntok : 0; }
int64_t ct_bpe_trainer_merge_count(const ct_bpe_trainer *t) { return t && t->json ? (int64_t)t->nmerges : 0; }
