/* Open-addressing hash tables (linear probing, load <= 1/2) for the BPE
 * vocabulary, its merges and its cache of encoded pieces. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "data/bpe_internal.h"

static uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

/* a 64-bit mix (splitmix64's finaliser) for pair keys */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

int64_t cti_bpe_str_get(const bpe_str_table *t, const void *key, size_t len)
{
    if (!t->cap) return -1;
    uint64_t h = hash_bytes(key, len);
    for (size_t i = h & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        const struct bpe_str_entry *e = &t->slot[i];
        if (!e->key) return -1;
        if (e->hash == h && e->len == len && !memcmp(e->key, key, len)) return e->val;
    }
}

static ct_status str_grow(bpe_str_table *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    struct bpe_str_entry *s = calloc(cap, sizeof *s);
    if (!s) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for a table of %zu entries", cap);
    for (size_t k = 0; k < t->cap; k++) {
        if (!t->slot[k].key) continue;
        size_t i = t->slot[k].hash & (cap - 1);
        while (s[i].key) i = (i + 1) & (cap - 1);
        s[i] = t->slot[k];
    }
    free(t->slot);
    t->slot = s;
    t->cap = cap;
    return CT_OK;
}

static ct_status str_set(bpe_str_table *t, const void *key, size_t len, int64_t val, bool add)
{
    if ((t->n + 1) * 2 > t->cap) {
        ct_status st = str_grow(t);
        if (st) return st;
    }
    uint64_t h = hash_bytes(key, len);
    size_t i = h & (t->cap - 1);
    for (; t->slot[i].key; i = (i + 1) & (t->cap - 1)) {
        struct bpe_str_entry *e = &t->slot[i];
        if (e->hash == h && e->len == len && !memcmp(e->key, key, len)) {
            e->val = add ? e->val + val : val;
            return CT_OK;
        }
    }
    char *k = malloc(len ? len : 1);
    if (!k) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for a key of %zu bytes", len);
    memcpy(k, key, len);
    t->slot[i] = (struct bpe_str_entry){.key = k, .len = (uint32_t)len, .hash = h, .val = val};
    t->n++;
    return CT_OK;
}

ct_status cti_bpe_str_put(bpe_str_table *t, const void *key, size_t len, int64_t val)
{
    return str_set(t, key, len, val, false);
}

ct_status cti_bpe_str_add(bpe_str_table *t, const void *key, size_t len, int64_t delta)
{
    return str_set(t, key, len, delta, true);
}

void cti_bpe_str_free(bpe_str_table *t)
{
    for (size_t i = 0; i < t->cap; i++) free(t->slot[i].key);
    free(t->slot);
    *t = (bpe_str_table){0};
}

const struct bpe_pair_entry *cti_bpe_pair_get(const bpe_pair_table *t, uint32_t left, uint32_t right)
{
    if (!t->cap) return NULL;
    uint64_t key = ((uint64_t)left << 32 | right) + 1;
    for (size_t i = mix64(key) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        const struct bpe_pair_entry *e = &t->slot[i];
        if (e->key == key) return e;
        if (!e->key) return NULL;
    }
}

ct_status cti_bpe_pair_put(bpe_pair_table *t, uint32_t left, uint32_t right, int32_t rank, uint32_t merged)
{
    if ((t->n + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        struct bpe_pair_entry *s = calloc(cap, sizeof *s);
        if (!s) return ct_error_set(CT_ERR_NOMEM, "bpe: out of memory for %zu merges", cap / 2);
        for (size_t k = 0; k < t->cap; k++) {
            if (!t->slot[k].key) continue;
            size_t i = mix64(t->slot[k].key) & (cap - 1);
            while (s[i].key) i = (i + 1) & (cap - 1);
            s[i] = t->slot[k];
        }
        free(t->slot);
        t->slot = s;
        t->cap = cap;
    }
    uint64_t key = ((uint64_t)left << 32 | right) + 1;
    size_t i = mix64(key) & (t->cap - 1);
    while (t->slot[i].key && t->slot[i].key != key) i = (i + 1) & (t->cap - 1);
    if (!t->slot[i].key) t->n++;
    /* a repeated merge takes its later rank, as Hugging Face's loader does */
    t->slot[i] = (struct bpe_pair_entry){.key = key, .rank = rank, .merged = merged};
    return CT_OK;
}

void cti_bpe_pair_free(bpe_pair_table *t)
{
    free(t->slot);
    *t = (bpe_pair_table){0};
}
