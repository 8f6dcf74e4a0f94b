/* Byte-level BPE: encoding (added tokens, the GPT-2 regex, merges by rank, the
 * cache of pieces) and decoding. */
#include <stdlib.h>
#include <string.h>

#include "data/bpe_encode_internal.h"

/* Merges one piece (bytes p[0..n)) into b->sym; returns the count. GPT-2's
 * reference loop: find the adjacent pair of lowest rank, merge it everywhere left
 * to right, repeat until no adjacent pair is a merge. */
static ct_status merge_piece(ct_bpe *b, const uint8_t *p, size_t n, size_t *count)
{
    if (n > b->sym_cap) {
        uint32_t *s = realloc(b->sym, n * sizeof *s);
        if (!s) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for a piece of %zu bytes", n);
        b->sym = s;
        b->sym_cap = n;
    }
    uint32_t *sym = b->sym;
    for (size_t i = 0; i < n; i++) sym[i] = (uint32_t)b->byte_id[p[i]];
    size_t m = n;
    while (m > 1) {
        int32_t best = INT32_MAX;
        uint32_t left = 0, right = 0, merged = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            const struct bpe_pair_entry *e = cti_bpe_pair_get(&b->merges, sym[i], sym[i + 1]);
            if (e && e->rank < best) best = e->rank, left = sym[i], right = sym[i + 1], merged = e->merged;
        }
        if (best == INT32_MAX) break;
        size_t j = 0;
        for (size_t i = 0; i < m;) {
            if (i + 1 < m && sym[i] == left && sym[i + 1] == right) sym[j++] = merged, i += 2;
            else sym[j++] = sym[i++];
        }
        m = j;
    }
    *count = m;
    return CT_OK;
}

static ct_status encode_piece(ct_bpe *b, const uint8_t *p, size_t n, bpe_sink *sink)
{
    int64_t c = n <= BPE_CACHE_PIECE ? cti_bpe_str_get(&b->cache, p, n) : -1;
    if (c >= 0) return sink->emit(sink, b->cache_ids + (c >> 16), (size_t)(c & 0xFFFF));
    if (b->ignore_merges) { /* a piece that is a token is that token */
        int64_t id = cti_bpe_str_get(&b->vocab, p, n);
        if (id >= 0) {
            uint32_t one = (uint32_t)id;
            return sink->emit(sink, &one, 1);
        }
    }
    size_t m = 0;
    ct_status st = merge_piece(b, p, n, &m);
    if (st) return st;
    if (n <= BPE_CACHE_PIECE && b->cache.n < BPE_CACHE_MAX) {
        if (b->cache_n + m > b->cache_cap) {
            size_t cap = b->cache_cap ? b->cache_cap * 2 : 4096;
            while (cap < b->cache_n + m) cap *= 2;
            uint32_t *ids = realloc(b->cache_ids, cap * sizeof *ids);
            if (!ids) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for the piece cache");
            b->cache_ids = ids;
            b->cache_cap = cap;
        }
        memcpy(b->cache_ids + b->cache_n, b->sym, m * sizeof *b->sym);
        st = cti_bpe_str_put(&b->cache, p, n, (int64_t)b->cache_n << 16 | (int64_t)m);
        if (st) return st;
        b->cache_n += m;
    }
    return sink->emit(sink, b->sym, m);
}

/* One stretch without added tokens: the regex cuts it into pieces. A run of bytes
 * that are not valid UTF-8 matches nothing and lies between two matches (or the
 * ends): it is a piece of its own. */
static ct_status encode_stretch(ct_bpe *b, const uint8_t *s, size_t n, bpe_sink *sink)
{
    if (n == 0) return CT_OK;
    uint8_t *tmp = NULL;
    if (b->add_prefix_space && s[0] != ' ') {
        tmp = malloc(n + 1);
        if (!tmp) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for %zu bytes", n + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, s, n);
        s = tmp, n++;
    }
    ct_status st = CT_OK;
    size_t pos = 0;
    while (pos < n && !st) {
        int rc = pcre2_match(b->re, s, n, pos, 0, b->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) {
            st = encode_piece(b, s + pos, n - pos, sink);
            break;
        }
        if (rc < 0) {
            char msg[256];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
            st = ct_error_set(CT_ERR_INTERNAL, "bpe: PCRE2 match failed at byte %zu: %s", pos, msg);
            break;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
        if (ov[0] > pos) st = encode_piece(b, s + pos, ov[0] - pos, sink);
        if (!st) st = encode_piece(b, s + ov[0], ov[1] - ov[0], sink);
        pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1; /* no part of the regex matches empty; never loop */
    }
    free(tmp);
    return st;
}

/* the longest added token at s[0..n), or NULL */
static const bpe_added *added_at(const ct_bpe *b, const uint8_t *s, size_t n)
{
    const bpe_added *best = NULL;
    for (size_t i = 0; i < b->nadded; i++) {
        const bpe_added *a = &b->added[i];
        if (a->len <= n && (!best || a->len > best->len) && !memcmp(a->text, s, a->len)) best = a;
    }
    return best;
}

ct_status cti_bpe_encode_to(ct_bpe *b, const uint8_t *s, size_t n, bpe_sink *sink)
{
    size_t start = 0;
    for (size_t pos = 0; pos < n;) {
        const bpe_added *a = b->added_first[s[pos]] ? added_at(b, s + pos, n - pos) : NULL;
        if (!a) {
            pos++;
            continue;
        }
        ct_status st = encode_stretch(b, s + start, pos - start, sink);
        if (!st) st = sink->emit(sink, &a->id, 1);
        if (st) return st;
        pos += a->len;
        start = pos;
    }
    return encode_stretch(b, s + start, n - start, sink);
}

typedef struct array_sink {
    bpe_sink base;
    uint32_t **ids;
    size_t *cap, n, start;
} array_sink;

static ct_status array_emit(bpe_sink *sink, const uint32_t *ids, size_t n)
{
    array_sink *a = (array_sink *)sink;
    if (a->n + n > *a->cap) {
        size_t cap = *a->cap ? *a->cap * 2 : 256;
        while (cap < a->n + n) cap *= 2;
        uint32_t *p = realloc(*a->ids, cap * sizeof *p);
        if (!p) return ct_error_set(CT_ERR_NOMEM, "bpe_encode: out of memory for %zu ids", cap);
        *a->ids = p;
        *a->cap = cap;
    }
    memcpy(*a->ids + a->n, ids, n * sizeof *ids);
    a->n += n;
    return CT_OK;
}

int64_t ct_bpe_encode(ct_bpe *b, const void *text, size_t n, uint32_t **ids, size_t *cap)
{
    if (!b || (!text && n) || !ids || !cap || (!*ids && *cap)) {
        ct_error_set(CT_ERR_INVALID, "bpe_encode: %s",
                     !b ? "bpe is NULL" : !text && n ? "text is NULL" : !ids || !cap ? "ids or cap is NULL"
                                                                                      : "*ids is NULL but *cap is not 0");
        return -1;
    }
    array_sink sink = {.base = {.emit = array_emit}, .ids = ids, .cap = cap};
    if (cti_bpe_encode_to(b, text, n, &sink.base)) return -1;
    return (int64_t)sink.n;
}

int64_t ct_bpe_decode(const ct_bpe *b, const uint32_t *ids, size_t n, char *buf, size_t cap)
{
    if (!b || (!ids && n) || (!buf && cap)) {
        ct_error_set(CT_ERR_INVALID, "bpe_decode: %s", !b ? "bpe is NULL" : !buf ? "buf is NULL" : "ids is NULL");
        return -1;
    }
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= b->vocab_size || !b->tok[ids[i]]) {
            ct_error_set(CT_ERR_INVALID, "bpe_decode: id %u at position %zu is not a token of '%s' (vocabulary size %lld)",
                         ids[i], i, b->name, (long long)b->vocab_size);
            return -1;
        }
        size_t k = b->tok_len[ids[i]];
        if (len < cap) memcpy(buf + len, b->tok[ids[i]], len + k <= cap ? k : cap - len);
        len += k;
    }
    if (len < cap) buf[len] = '\0';
    return (int64_t)len;
}
