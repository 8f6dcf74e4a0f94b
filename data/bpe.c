/* Byte-level BPE: building the tokenizer from its vocabulary, merges and added
 * tokens (whatever file they come from), GPT-2's byte-to-unicode map, the
 * pre-tokenisation regex, and the accessors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe_internal.h"

/* GPT-2's regex. \s is spelled out as Unicode's White_Space property, which is
 * what Hugging Face's Oniguruma regex matches: PCRE2's \s differs on U+0085 (NEL,
 * White_Space but not a separator) and U+180E (a separator in PCRE2's older
 * tables, no longer White_Space). (?!\S) is (?![^WS]). */
#define WS "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+"
                                   "|[" WS "]+(?![^" WS "])|[" WS "]+";

/* GPT-2's bytes_to_unicode: the printable bytes 33-126, 161-172 and 174-255 stand
 * for themselves; the other 68 bytes, in order, for U+0100 .. U+0143. cp_byte is
 * the inverse (-1: no byte). */
static int cp_byte[256 + 68];
static uint32_t byte_cp[256];

static void init_byte_map(void)
{
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE)) return;
    int map[256 + 68];
    for (int i = 0; i < 256 + 68; i++) map[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        byte_cp[b] = printable ? (uint32_t)b : 256u + (uint32_t)n;
        map[printable ? b : 256 + n++] = b;
    }
    memcpy(cp_byte, map, sizeof map); /* every thread writes the same values */
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}

uint32_t cti_bpe_byte_char(uint8_t byte)
{
    init_byte_map();
    return byte_cp[byte];
}

/* The bytes a vocabulary token's text stands for, into out (>= strlen(token)
 * bytes). Returns the length, or -1 with *bad the offending code point (or -1 for
 * malformed UTF-8). */
static int64_t unmap_token(const char *token, uint8_t *out, long *bad)
{
    const uint8_t *p = (const uint8_t *)token;
    int64_t n = 0;
    while (*p) {
        uint32_t cp;
        int len;
        if (p[0] < 0x80) cp = p[0], len = 1;
        else if ((p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) cp = (p[0] & 0x1Fu) << 6 | (p[1] & 0x3Fu), len = 2;
        else if ((p[0] & 0xF0) == 0xE0) cp = 0x10000, len = 3; /* past the map either way */
        else if ((p[0] & 0xF8) == 0xF0) cp = 0x110000, len = 4;
        else return *bad = -1, -1;
        for (int k = 1; k < len; k++)
            if ((p[k] & 0xC0) != 0x80) return *bad = -1, -1;
        if (len >= 3) {
            cp = len == 3 ? (p[0] & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu)
                          : (p[0] & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
        }
        if (cp >= 256 + 68 || cp_byte[cp] < 0) return *bad = (long)cp, -1;
        out[n++] = (uint8_t)cp_byte[cp];
        p += len;
    }
    return n;
}

bool cti_bpe_token_mappable(const char *token)
{
    init_byte_map();
    size_t n = strlen(token);
    uint8_t small[64], *out = n <= sizeof small ? small : malloc(n);
    long bad;
    bool ok = out && unmap_token(token, out, &bad) >= 0;
    if (out != small) free(out);
    return ok;
}

ct_bpe *cti_bpe_new(const char *name)
{
    init_byte_map();
    ct_bpe *b = calloc(1, sizeof *b);
    if (b) b->name = strdup(name ? name : "?");
    if (!b || !b->name) {
        free(b);
        ct_error_set(CT_ERR_NOMEM, "bpe: out of memory loading '%s'", name ? name : "?");
        return NULL;
    }
    for (int i = 0; i < 256; i++) b->byte_id[i] = -1;
    b->bos = b->eos = b->pad = -1;
    return b;
}

static ct_status check_id(ct_bpe *b, int64_t id, const char *what, const char *token)
{
    if (id < 0 || id >= BPE_MAX_ID)
        return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': %s '%s' has id %lld, outside [0, %d)", b->name, what, token,
                            (long long)id, BPE_MAX_ID);
    if ((size_t)id >= b->id_cap) {
        size_t cap = b->id_cap ? b->id_cap : 1024;
        while (cap <= (size_t)id) cap *= 2;
        char **tok = realloc(b->tok, cap * sizeof *tok);
        if (tok) b->tok = tok;
        uint32_t *len = tok ? realloc(b->tok_len, cap * sizeof *len) : NULL;
        if (!len) return ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory for %zu ids", b->name, cap);
        b->tok_len = len;
        memset(b->tok + b->id_cap, 0, (cap - b->id_cap) * sizeof *tok);
        memset(b->tok_len + b->id_cap, 0, (cap - b->id_cap) * sizeof *len);
        b->id_cap = cap;
    }
    if (id + 1 > b->vocab_size) b->vocab_size = id + 1;
    return CT_OK;
}

static ct_status set_id(ct_bpe *b, int64_t id, const uint8_t *bytes, size_t n)
{
    b->tok[id] = malloc(n ? n : 1);
    if (!b->tok[id]) return ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory", b->name);
    memcpy(b->tok[id], bytes, n);
    b->tok_len[id] = (uint32_t)n;
    return CT_OK;
}

ct_status cti_bpe_add_token(ct_bpe *b, const char *token, int64_t id)
{
    ct_status st = check_id(b, id, "token", token);
    if (st) return st;
    size_t tl = strlen(token);
    uint8_t *bytes = malloc(tl ? tl : 1);
    if (!bytes) return ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory", b->name);
    long bad;
    int64_t n = unmap_token(token, bytes, &bad);
    if (n < 0)
        st = bad < 0 ? ct_error_set(CT_ERR_FORMAT, "bpe: '%s': token with id %lld is not valid UTF-8", b->name,
                                    (long long)id)
                     : ct_error_set(CT_ERR_FORMAT,
                                    "bpe: '%s': token '%s' (id %lld) holds U+%04lX, which is not one of the 256 "
                                    "characters of the byte-level alphabet",
                                    b->name, token, (long long)id, bad);
    else if (n == 0)
        st = ct_error_set(CT_ERR_FORMAT, "bpe: '%s': the empty token (id %lld) is not allowed", b->name,
                          (long long)id);
    else if (b->tok[id])
        st = ct_error_set(CT_ERR_FORMAT, "bpe: '%s': id %lld is given to two tokens, the second is '%s'", b->name,
                          (long long)id, token);
    else if (cti_bpe_str_get(&b->vocab, bytes, (size_t)n) >= 0)
        st = ct_error_set(CT_ERR_FORMAT, "bpe: '%s': token '%s' appears twice (ids %lld and %lld)", b->name, token,
                          (long long)cti_bpe_str_get(&b->vocab, bytes, (size_t)n), (long long)id);
    if (!st) st = set_id(b, id, bytes, (size_t)n);
    if (!st) st = cti_bpe_str_put(&b->vocab, bytes, (size_t)n, id);
    if (!st && n == 1) b->byte_id[bytes[0]] = id;
    free(bytes);
    return st;
}

/* the id of a vocabulary token given as its text, -1 when absent or not mappable */
static int64_t token_lookup(const ct_bpe *b, const char *token, uint8_t *scratch)
{
    long bad;
    int64_t n = unmap_token(token, scratch, &bad);
    return n < 0 ? -1 : cti_bpe_str_get(&b->vocab, scratch, (size_t)n);
}

ct_status cti_bpe_add_merge(ct_bpe *b, const char *left, const char *right, int64_t rank)
{
    size_t ll = strlen(left), rl = strlen(right);
    uint8_t *s = malloc(ll + rl + 1);
    if (!s) return ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory", b->name);
    ct_status st = CT_OK;
    int64_t a = token_lookup(b, left, s), c = token_lookup(b, right, s);
    if (a < 0 || c < 0) {
        st = ct_error_set(CT_ERR_FORMAT, "bpe: '%s': merge %lld ('%s' '%s') names '%s', which is not in the vocabulary",
                          b->name, (long long)rank, left, right, a < 0 ? left : right);
    } else {
        memcpy(s, b->tok[a], b->tok_len[a]);
        memcpy(s + b->tok_len[a], b->tok[c], b->tok_len[c]);
        int64_t m = cti_bpe_str_get(&b->vocab, s, b->tok_len[a] + b->tok_len[c]);
        if (m < 0)
            st = ct_error_set(CT_ERR_FORMAT,
                              "bpe: '%s': merge %lld ('%s' '%s') makes '%s%s', which is not in the vocabulary", b->name,
                              (long long)rank, left, right, left, right);
        else if (rank > INT32_MAX)
            st = ct_error_set(CT_ERR_FORMAT, "bpe: '%s': more than %d merges", b->name, INT32_MAX);
        else
            st = cti_bpe_pair_put(&b->merges, (uint32_t)a, (uint32_t)c, (int32_t)rank, (uint32_t)m);
    }
    free(s);
    if (!st) b->nmerges = rank + 1;
    return st;
}

ct_status cti_bpe_add_added(ct_bpe *b, const char *text, int64_t id, bool special)
{
    ct_status st = check_id(b, id, "added token", text);
    if (st) return st;
    size_t n = strlen(text);
    if (n == 0) return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': added token %lld is empty", b->name, (long long)id);
    for (size_t i = 0; i < b->nadded; i++)
        if (b->added[i].len == n && !memcmp(b->added[i].text, text, n))
            return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': added token '%s' appears twice", b->name, text);
    if (b->tok[id] && (b->tok_len[id] != n || memcmp(b->tok[id], text, n)))
        return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': added token '%s' has id %lld, which is already another token",
                            b->name, text, (long long)id);
    if (!b->tok[id] && (st = set_id(b, id, (const uint8_t *)text, n))) return st;
    bpe_added *a = realloc(b->added, (b->nadded + 1) * sizeof *a);
    if (!a) return ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory", b->name);
    b->added = a;
    char *copy = strdup(text);
    if (!copy) return ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory", b->name);
    a[b->nadded++] = (bpe_added){.text = copy, .len = n, .id = (uint32_t)id, .special = special};
    b->added_first[(uint8_t)text[0]] = 1;
    return CT_OK;
}

pcre2_code *cti_bpe_regex(void)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    if (!re) {
        char msg[256];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        ct_error_set(CT_ERR_INTERNAL, "bpe: PCRE2 cannot compile the GPT-2 regex at offset %zu: %s", (size_t)off, msg);
        return NULL;
    }
    /* without JIT (a build or a system that forbids it) pcre2_match interprets */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

static int64_t added_named(const ct_bpe *b, const char *const *names)
{
    for (const char *const *nm = names; *nm; nm++)
        for (size_t i = 0; i < b->nadded; i++)
            if (!strcmp(b->added[i].text, *nm)) return b->added[i].id;
    return -1;
}

ct_status cti_bpe_finish(ct_bpe *b)
{
    for (int c = 0; c < 256; c++) {
        if (b->byte_id[c] >= 0) continue;
        int cp = 0;
        while (cp_byte[cp] != c) cp++;
        return ct_error_set(CT_ERR_FORMAT,
                            "bpe: '%s': byte 0x%02X (the token U+%04X) is not in the vocabulary; byte-level BPE needs "
                            "all 256 so that any text can be encoded",
                            b->name, c, cp);
    }
    static const char *const BOS[] = {"<|endoftext|>", "<s>", "<|begin_of_text|>", NULL};
    static const char *const EOS[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<|eot_id|>", NULL};
    static const char *const PAD[] = {"<pad>", "<|pad|>", "[PAD]", "<|endoftext|>", NULL};
    if (b->bos < 0) b->bos = added_named(b, BOS);
    if (b->eos < 0) b->eos = added_named(b, EOS);
    if (b->pad < 0) b->pad = added_named(b, PAD);

    b->re = cti_bpe_regex();
    if (!b->re) return ct_last_status();
    b->md = pcre2_match_data_create_from_pattern(b->re, NULL);
    if (!b->md) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for PCRE2 match data");
    return CT_OK;
}

void ct_bpe_free(ct_bpe *b)
{
    if (!b) return;
    for (size_t i = 0; i < b->id_cap; i++) free(b->tok[i]);
    free(b->tok);
    free(b->tok_len);
    cti_bpe_str_free(&b->vocab);
    cti_bpe_pair_free(&b->merges);
    for (size_t i = 0; i < b->nadded; i++) free(b->added[i].text);
    free(b->added);
    pcre2_match_data_free(b->md);
    pcre2_code_free(b->re);
    cti_bpe_str_free(&b->cache);
    free(b->cache_ids);
    free(b->sym);
    free(b->name);
    free(b);
}

int64_t ct_bpe_vocab_size(const ct_bpe *b) { return b ? b->vocab_size : 0; }
int64_t ct_bpe_merge_count(const ct_bpe *b) { return b ? b->nmerges : 0; }
int64_t ct_bpe_bos_id(const ct_bpe *b) { return b ? b->bos : -1; }
int64_t ct_bpe_eos_id(const ct_bpe *b) { return b ? b->eos : -1; }
int64_t ct_bpe_pad_id(const ct_bpe *b) { return b ? b->pad : -1; }

int64_t ct_bpe_token_id(const ct_bpe *b, const char *text, size_t n)
{
    if (!b || (!text && n)) return -1;
    for (size_t i = 0; i < b->nadded; i++)
        if (b->added[i].len == n && !memcmp(b->added[i].text, text, n)) return b->added[i].id;
    return cti_bpe_str_get(&b->vocab, text, n);
}
