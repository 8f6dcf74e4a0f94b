/* Byte-level BPE: encoding (added tokens, the GPT-2 regex, merges by rank, the
 * cache of pieces) and decoding. */
#include <stdlib.h>
#include <string.h>

#include "data/bpe_encode_internal.h"

/* Pieces up to this many bytes are merged by the simple loop below; longer ones
 * (rare: a run of letters without spaces) by the heap, whose cost grows as
 * m log m instead of m times the number of passes. */
#define SHORT_PIECE 64

/* GPT-2's reference loop on sym[0..m): find the adjacent pair of lowest rank,
 * merge it everywhere left to right, repeat until no adjacent pair is a merge.
 * Returns the new count. */
static size_t merge_short(const ct_bpe *b, uint32_t *sym, size_t m)
{
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
    return m;
}

/* A candidate merge of the symbols at pos and next[pos], ordered by (rank, pos):
 * the lowest rank first, the leftmost among equals, which is the order the loop
 * above merges in (Hugging Face's BPE uses this heap). */
typedef struct cand {
    int32_t rank;
    uint32_t pos, left, right;
} cand;

static bool cand_less(const cand *a, const cand *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c], i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(const ct_bpe *b, cand *h, size_t *n, const uint32_t *sym, uint32_t pos, uint32_t next)
{
    const struct bpe_pair_entry *e = cti_bpe_pair_get(&b->merges, sym[pos], sym[next]);
    if (e) heap_push(h, n, (cand){.rank = e->rank, .pos = pos, .left = sym[pos], .right = sym[next]});
}

/* The same merges for a long piece: symbols in a linked list (next[i], prev[i];
 * -1 ends), candidates in a heap; a popped candidate whose symbols changed since
 * it was pushed is dropped. */
static ct_status merge_long(const ct_bpe *b, uint32_t *sym, size_t m, size_t *count)
{
    int64_t *next = malloc(m * sizeof *next), *prev = malloc(m * sizeof *prev);
    cand *h = malloc(3 * m * sizeof *h); /* m - 1 pairs, then at most 2 per merge */
    if (!next || !prev || !h) {
        free(next), free(prev), free(h);
        return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for a piece of %zu bytes", m);
    }
    size_t nh = 0;
    for (size_t i = 0; i < m; i++) {
        next[i] = i + 1 < m ? (int64_t)i + 1 : -1;
        prev[i] = (int64_t)i - 1;
        if (i + 1 < m) push_pair(b, h, &nh, sym, (uint32_t)i, (uint32_t)i + 1);
    }
    while (nh) {
        cand c = heap_pop(h, &nh);
        int64_t r = next[c.pos];
        /* stale: pos was merged into its left neighbour (prev = -2), or a side changed */
        if (prev[c.pos] == -2 || r < 0 || sym[c.pos] != c.left || sym[r] != c.right) continue;
        sym[c.pos] = cti_bpe_pair_get(&b->merges, c.left, c.right)->merged;
        next[c.pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = c.pos;
        prev[r] = -2;
        if (prev[c.pos] >= 0) push_pair(b, h, &nh, sym, (uint32_t)prev[c.pos], c.pos);
        if (next[c.pos] >= 0) push_pair(b, h, &nh, sym, c.pos, (uint32_t)next[c.pos]);
    }
    size_t j = 0;
    for (int64_t i = 0; i >= 0; i = next[i]) sym[j++] = sym[i];
    *count = j;
    free(next), free(prev), free(h);
    return CT_OK;
}

/* Merges one piece (bytes p[0..n)) into b->sym; returns the count. */
static ct_status merge_piece(ct_bpe *b, const uint8_t *p, size_t n, size_t *count)
{
    if (n > b->sym_cap) {
        uint32_t *s = realloc(b->sym, n * sizeof *s);
        if (!s) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for a piece of %zu bytes", n);
        b->sym = s;
        b->sym_cap = n;
    }
    for (size_t i = 0; i < n; i++) b->sym[i] = (uint32_t)b->byte_id[p[i]];
    if (n <= SHORT_PIECE) {
        *count = merge_short(b, b->sym, n);
        return CT_OK;
    }
    return merge_long(b, b->sym, n, count);
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

ct_status cti_bpe_split(const pcre2_code *re, pcre2_match_data *md, const uint8_t *s, size_t n, bpe_piece_fn fn,
                        void *ctx)
{
    ct_status st = CT_OK;
    size_t pos = 0;
    while (pos < n && !st) {
        int rc = pcre2_match(re, s, n, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return fn(ctx, s + pos, n - pos);
        if (rc < 0) {
            char msg[256];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
            return ct_error_set(CT_ERR_INTERNAL, "bpe: PCRE2 match failed at byte %zu: %s", pos, msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > pos) st = fn(ctx, s + pos, ov[0] - pos);
        if (!st) st = fn(ctx, s + ov[0], ov[1] - ov[0]);
        pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1; /* no part of the regex matches empty; never loop */
    }
    return st;
}

typedef struct piece_ctx {
    ct_bpe *b;
    bpe_sink *sink;
} piece_ctx;

static ct_status piece_to_sink(void *ctx, const uint8_t *p, size_t n)
{
    piece_ctx *c = ctx;
    return encode_piece(c->b, p, n, c->sink);
}

/* One stretch without added tokens, cut into pieces by the regex. */
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
    ct_status st = cti_bpe_split(b->re, b->md, s, n, piece_to_sink, &(piece_ctx){.b = b, .sink = sink});
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
