/* Byte-level BPE training: counting words and learning merges the way Hugging
 * Face tokenizers' BpeTrainer does (see data/bpe_train.h for the rules).
 *
 * The bookkeeping follows tokenizers' so that even its corner cases give the same
 * merges:
 *   - pair_counts[p] = sum over words of count(word) * occurrences of p, kept up
 *     to date by the changes each merge reports: merging (a, b) into r at a spot
 *     with x on the left and y on the right gives (x, a) -1, (x, r) +1, (b, y) -1,
 *     (r, y) +1. The merged pair's own count is not lowered (tokenizers does not
 *     lower it either; it matters only when a later merge makes a token that
 *     already exists and so recreates the pair).
 *   - the heap holds candidates (pair, count, the words where the pair was
 *     created); a popped candidate whose count is stale is pushed back with the
 *     current count; the merge is applied to the candidate's words only. A pair
 *     may have several candidates (one per round that created it), and then be
 *     merged more than once; the merges list keeps its last rank, as tokenizers'
 *     model does (its merges are a map from pair to rank).
 */
#include <stdlib.h>
#include <string.h>

#include "data/bpe_train_internal.h"

/* ---- a table from pair keys to counts --------------------------------------- */

/* A pair (left, right) is the key (left << 32 | right) + 1, never 0; comparing keys
 * compares pairs. A slot is live when its key is set and its generation is the
 * table's, so bumping the generation empties the table. */
typedef struct pair_slot {
    uint64_t key;
    int64_t val;
    uint32_t gen;
} pair_slot;

typedef struct pair_map {
    pair_slot *slot;
    size_t cap, n;
    uint32_t gen;
} pair_map;

static uint64_t pair_key(uint32_t left, uint32_t right) { return ((uint64_t)left << 32 | right) + 1; }

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static bool live(const pair_map *m, const pair_slot *s) { return s->key && s->gen == m->gen; }

/* the value of key, inserted as 0 when absent; NULL when out of memory */
static int64_t *pair_ref(pair_map *m, uint64_t key, bool *fresh)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 4096;
        pair_slot *s = calloc(cap, sizeof *s);
        if (!s) {
            ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for a table of %zu pairs", cap / 2);
            return NULL;
        }
        for (size_t k = 0; k < m->cap; k++) {
            if (!live(m, &m->slot[k])) continue;
            size_t i = mix64(m->slot[k].key) & (cap - 1);
            while (s[i].key) i = (i + 1) & (cap - 1);
            s[i] = m->slot[k];
            s[i].gen = 1;
        }
        free(m->slot);
        m->slot = s;
        m->cap = cap;
        m->gen = 1;
    }
    size_t i = mix64(key) & (m->cap - 1);
    for (; live(m, &m->slot[i]); i = (i + 1) & (m->cap - 1))
        if (m->slot[i].key == key) {
            if (fresh) *fresh = false;
            return &m->slot[i].val;
        }
    m->slot[i] = (pair_slot){.key = key, .val = 0, .gen = m->gen};
    m->n++;
    if (fresh) *fresh = true;
    return &m->slot[i].val;
}

static int64_t pair_get(const pair_map *m, uint64_t key)
{
    if (!m->cap) return 0;
    for (size_t i = mix64(key) & (m->cap - 1); live(m, &m->slot[i]); i = (i + 1) & (m->cap - 1))
        if (m->slot[i].key == key) return m->slot[i].val;
    return 0;
}

static void pair_clear(pair_map *m)
{
    m->n = 0;
    if (++m->gen == 0) { /* wrapped: old slots could look live again */
        memset(m->slot, 0, m->cap * sizeof *m->slot);
        m->gen = 1;
    }
}

/* ---- word lists, candidates and the heap ------------------------------------ */

typedef struct word_list {
    uint32_t *w;
    uint32_t n, cap;
} word_list;

/* adds word w unless it was the last one added (a word's changes come together) */
static ct_status list_add(word_list *l, uint32_t w)
{
    if (l->n && l->w[l->n - 1] == w) return CT_OK;
    if (l->n == l->cap) {
        uint32_t cap = l->cap ? l->cap * 2 : 4;
        uint32_t *p = realloc(l->w, cap * sizeof *p);
        if (!p) return ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for a list of %u words", cap);
        l->w = p;
        l->cap = cap;
    }
    l->w[l->n++] = w;
    return CT_OK;
}

typedef struct cand {
    uint64_t key;
    int64_t count;
    word_list where;
} cand;

/* the heap's order: the higher count first, then the smaller pair */
static bool before(const cand *a, const cand *b) { return a->count != b->count ? a->count > b->count : a->key < b->key; }

typedef struct heap {
    cand *c;
    size_t n, cap;
} heap;

static ct_status heap_push(heap *h, cand c)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 1024;
        cand *p = realloc(h->c, cap * sizeof *p);
        if (!p) {
            free(c.where.w);
            return ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for %zu candidate pairs", cap);
        }
        h->c = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && before(&c, &h->c[(i - 1) / 2])) h->c[i] = h->c[(i - 1) / 2], i = (i - 1) / 2;
    h->c[i] = c;
    return CT_OK;
}

static cand heap_pop(heap *h)
{
    cand top = h->c[0], last = h->c[--h->n];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= h->n) break;
        if (k + 1 < h->n && before(&h->c[k + 1], &h->c[k])) k++;
        if (!before(&h->c[k], &last)) break;
        h->c[i] = h->c[k], i = k;
    }
    if (h->n) h->c[i] = last;
    return top;
}

/* ---- the merge loop ------------------------------------------------------------ */

typedef struct word {
    size_t off;    /* its symbols: sym[off .. off + n) */
    uint32_t n;
    int64_t count;
} word;

typedef struct pending {
    uint64_t key;
    word_list where;
} pending;

typedef struct learner {
    ct_bpe_trainer *t;
    word *words;
    size_t nwords;
    uint32_t *sym;
    pair_map counts;   /* pair -> count */
    pair_map index;    /* pair -> its entry in pend, this round */
    pending *pend;     /* pairs created this round, with the words they were created in */
    size_t npend, pend_cap;
    heap h;
} learner;

/* pair_counts[key] += delta; a pair created (delta > 0) notes word w */
static ct_status change(learner *L, uint32_t left, uint32_t right, int64_t delta, uint32_t w)
{
    uint64_t key = pair_key(left, right);
    int64_t *c = pair_ref(&L->counts, key, NULL);
    if (!c) return CT_ERR_NOMEM;
    *c += delta;
    if (delta <= 0) return CT_OK;
    bool fresh;
    int64_t *at = pair_ref(&L->index, key, &fresh);
    if (!at) return CT_ERR_NOMEM;
    if (fresh) {
        if (L->npend == L->pend_cap) {
            size_t cap = L->pend_cap ? L->pend_cap * 2 : 1024;
            pending *p = realloc(L->pend, cap * sizeof *p);
            if (!p) return ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for %zu pairs", cap);
            L->pend = p;
            L->pend_cap = cap;
        }
        *at = (int64_t)L->npend;
        L->pend[L->npend++] = (pending){.key = key};
    }
    return list_add(&L->pend[*at].where, w);
}

/* this round's pairs become candidates, with their current counts */
static ct_status push_pending(learner *L)
{
    ct_status st = CT_OK;
    for (size_t i = 0; i < L->npend; i++) {
        int64_t count = pair_get(&L->counts, L->pend[i].key);
        if (!st && count > 0) st = heap_push(&L->h, (cand){.key = L->pend[i].key, .count = count, .where = L->pend[i].where});
        else free(L->pend[i].where.w);
    }
    L->npend = 0;
    pair_clear(&L->index);
    return st;
}

/* Replaces every (a, b) of word w, left to right, by r and reports the changes. */
static ct_status merge_word(learner *L, uint32_t w, uint32_t a, uint32_t b, uint32_t r)
{
    uint32_t *s = L->sym + L->words[w].off, n = L->words[w].n, j = 0;
    int64_t c = L->words[w].count;
    ct_status st = CT_OK;
    for (uint32_t i = 0; i < n && !st;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            /* s[j - 1] is already the output (maybe an r); s[i + 2] still the input */
            if (j > 0) {
                st = change(L, s[j - 1], a, -c, w);
                if (!st) st = change(L, s[j - 1], r, c, w);
            }
            if (i + 2 < n && !st) {
                st = change(L, b, s[i + 2], -c, w);
                if (!st) st = change(L, r, s[i + 2], c, w);
            }
            s[j++] = r;
            i += 2;
        } else {
            s[j++] = s[i++];
        }
    }
    L->words[w].n = j;
    return st;
}

static ct_status add_token(ct_bpe_trainer *t, const char *text, size_t len, int64_t *id)
{
    int64_t have = cti_bpe_str_get(&t->ids, text, len);
    if (have >= 0) {
        *id = have;
        return CT_OK;
    }
    if (t->ntok == t->tok_cap) {
        size_t cap = t->tok_cap ? t->tok_cap * 2 : 1024;
        char **tok = realloc(t->tok, cap * sizeof *tok);
        if (tok) t->tok = tok;
        uint32_t *tl = tok ? realloc(t->tok_len, cap * sizeof *tl) : NULL;
        if (!tl) return ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for %zu tokens", cap);
        t->tok_len = tl;
        t->tok_cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for a token of %zu bytes", len);
    memcpy(copy, text, len);
    copy[len] = '\0';
    ct_status st = cti_bpe_str_put(&t->ids, text, len, (int64_t)t->ntok);
    if (st) {
        free(copy);
        return st;
    }
    t->tok[t->ntok] = copy;
    t->tok_len[t->ntok] = (uint32_t)len;
    *id = (int64_t)t->ntok++;
    return CT_OK;
}

static size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) return out[0] = (char)cp, 1;
    out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* the byte-level characters stop at U+0143 */
}

static int by_code_point(const void *x, const void *y)
{
    uint32_t a = cti_bpe_byte_char(*(const uint8_t *)x), b = cti_bpe_byte_char(*(const uint8_t *)y);
    return (a > b) - (a < b);
}

/* specials, then the alphabet in code point order; byte_id[b]: the token of b */
static ct_status initial_vocab(ct_bpe_trainer *t, uint32_t byte_id[256])
{
    ct_status st = CT_OK;
    int64_t id;
    for (size_t i = 0; i < t->nspecial && !st; i++) st = add_token(t, t->special[i], strlen(t->special[i]), &id);
    uint8_t order[256];
    for (int b = 0; b < 256; b++) order[b] = (uint8_t)b;
    qsort(order, 256, 1, by_code_point);
    for (int k = 0; k < 256 && !st; k++) {
        char c[2];
        st = add_token(t, c, utf8_put(cti_bpe_byte_char(order[k]), c), &id);
        byte_id[order[k]] = (uint32_t)id;
    }
    return st;
}

/* the words, as byte tokens, and the first candidates */
static ct_status count_pairs(learner *L, const uint32_t byte_id[256])
{
    ct_bpe_trainer *t = L->t;
    size_t total = 0;
    for (size_t i = 0; i < t->words.cap; i++) total += t->words.slot[i].key ? t->words.slot[i].len : 0;
    L->words = malloc((t->words.n ? t->words.n : 1) * sizeof *L->words);
    L->sym = malloc((total ? total : 1) * sizeof *L->sym);
    if (!L->words || !L->sym)
        return ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for %zu words of %zu bytes", t->words.n, total);
    if (t->words.n > UINT32_MAX)
        return ct_error_set(CT_ERR_INVALID, "bpe_train: %zu distinct words; at most %u are supported", t->words.n,
                            UINT32_MAX);
    size_t off = 0;
    ct_status st = CT_OK;
    for (size_t i = 0; i < t->words.cap && !st; i++) {
        const struct bpe_str_entry *e = &t->words.slot[i];
        if (!e->key) continue;
        uint32_t w = (uint32_t)L->nwords++;
        L->words[w] = (word){.off = off, .n = e->len, .count = e->val};
        for (uint32_t k = 0; k < e->len; k++) L->sym[off + k] = byte_id[(uint8_t)e->key[k]];
        for (uint32_t k = 0; k + 1 < e->len && !st; k++) st = change(L, L->sym[off + k], L->sym[off + k + 1], e->val, w);
        off += e->len;
    }
    return st ? st : push_pending(L);
}

/* the merges with each pair at its last rank */
static ct_status keep_last(ct_bpe_trainer *t)
{
    if (!t->nmerges) return CT_OK;
    pair_map seen = {0};
    size_t j = t->nmerges;
    for (size_t i = t->nmerges; i-- > 0;) {
        bool fresh;
        if (!pair_ref(&seen, t->merges[i], &fresh)) {
            free(seen.slot);
            return CT_ERR_NOMEM;
        }
        if (fresh) t->merges[--j] = t->merges[i];
    }
    free(seen.slot);
    memmove(t->merges, t->merges + j, (t->nmerges - j) * sizeof *t->merges);
    t->nmerges -= j;
    return CT_OK;
}

static ct_status merge_loop(learner *L)
{
    ct_bpe_trainer *t = L->t;
    size_t cap = 0;
    char *text = NULL;
    ct_status st = CT_OK;
    while (!st && (int64_t)t->ntok < t->vocab_size && L->h.n) {
        cand top = heap_pop(&L->h);
        int64_t now = pair_get(&L->counts, top.key);
        if (top.count != now) {
            top.count = now;
            st = heap_push(&L->h, top);
            continue;
        }
        if (top.count < 1 || top.count < t->min_frequency) {
            free(top.where.w);
            break;
        }
        uint32_t a = (uint32_t)((top.key - 1) >> 32), b = (uint32_t)(top.key - 1);
        size_t len = (size_t)t->tok_len[a] + t->tok_len[b];
        if (len > cap) {
            char *p = realloc(text, cap = 2 * len);
            if (!p) st = ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for a token of %zu bytes", len);
            else text = p;
        }
        int64_t r = 0;
        if (!st) {
            memcpy(text, t->tok[a], t->tok_len[a]);
            memcpy(text + t->tok_len[a], t->tok[b], t->tok_len[b]);
            st = add_token(t, text, len, &r);
        }
        if (!st && (t->nmerges & (t->nmerges - 1)) == 0) { /* grows at powers of two */
            uint64_t *m = realloc(t->merges, (t->nmerges ? 2 * t->nmerges : 1) * sizeof *m);
            if (!m) st = ct_error_set(CT_ERR_NOMEM, "bpe_train: out of memory for %zu merges", t->nmerges);
            else t->merges = m;
        }
        if (!st) t->merges[t->nmerges++] = top.key;
        for (uint32_t k = 0; k < top.where.n && !st; k++) st = merge_word(L, top.where.w[k], a, b, (uint32_t)r);
        free(top.where.w);
        if (!st) st = push_pending(L);
    }
    free(text);
    return st ? st : keep_last(t);
}

ct_status cti_bpe_trainer_learn(ct_bpe_trainer *t)
{
    learner L = {.t = t};
    uint32_t byte_id[256];
    ct_status st = initial_vocab(t, byte_id);
    if (!st) st = count_pairs(&L, byte_id);
    if (!st) st = merge_loop(&L);
    for (size_t i = 0; i < L.h.n; i++) free(L.h.c[i].where.w);
    for (size_t i = 0; i < L.npend; i++) free(L.pend[i].where.w);
    free(L.h.c);
    free(L.pend);
    free(L.counts.slot);
    free(L.index.slot);
    free(L.words);
    free(L.sym);
    return st;
}
