/* The store's table: keys to values, chained hashing (FNV-1a), doubling at load 1.
 * Used by the server's loop thread only. */
#include <stdlib.h>
#include <string.h>

#include "dist/store_internal.h"

/* FNV-1a */
static uint64_t table_hash(const uint8_t *k, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ull;
    return h;
}

ct_store_entry *cti_store_table_find(const ct_store_table *t, const uint8_t *k, uint32_t n)
{
    if (!t->nb) return NULL;
    uint64_t h = table_hash(k, n);
    for (ct_store_entry *e = t->b[h & (t->nb - 1)]; e; e = e->next)
        if (e->hash == h && e->klen == n && !memcmp(e->key, k, n)) return e;
    return NULL;
}

static bool table_grow(ct_store_table *t)
{
    size_t nb = t->nb ? t->nb * 2 : 64;
    ct_store_entry **b = calloc(nb, sizeof *b);
    if (!b) return false;
    for (size_t i = 0; i < t->nb; i++)
        for (ct_store_entry *e = t->b[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
        }
    free(t->b);
    t->b = b;
    t->nb = nb;
    return true;
}

bool cti_store_table_put(ct_store_table *t, const uint8_t *k, uint32_t n, uint8_t *val, size_t vlen)
{
    ct_store_entry *e = cti_store_table_find(t, k, n);
    if (e) {
        free(e->val);
        e->val = val;
        e->vlen = vlen;
        return true;
    }
    if (t->n >= t->nb && !table_grow(t)) return false;
    e = malloc(sizeof *e + n);
    if (!e) return false;
    e->hash = table_hash(k, n);
    e->val = val;
    e->vlen = vlen;
    e->klen = n;
    memcpy(e->key, k, n);
    e->next = t->b[e->hash & (t->nb - 1)];
    t->b[e->hash & (t->nb - 1)] = e;
    t->n++;
    return true;
}

void cti_store_table_free(ct_store_table *t)
{
    for (size_t i = 0; i < t->nb; i++)
        for (ct_store_entry *e = t->b[i], *next; e; e = next) {
            next = e->next;
            free(e->val);
            free(e);
        }
    free(t->b);
    *t = (ct_store_table){0};
}
