/* ctrain — byte-level BPE: the tokenizer's state, shared by data/bpe*.c. */
#ifndef CT_DATA_BPE_INTERNAL_H
#define CT_DATA_BPE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/bpe.h"

/* ids are kept below this, so tables indexed by id stay small */
#define BPE_MAX_ID (1 << 24)
/* pieces up to this many bytes are cached, at most BPE_CACHE_MAX of them */
#define BPE_CACHE_PIECE 256
#define BPE_CACHE_MAX (1 << 16)

/* An open-addressing table from byte strings (copied in) to int64 values. */
typedef struct bpe_str_table {
    struct bpe_str_entry {
        char *key; /* NULL: empty slot */
        uint32_t len;
        uint64_t hash;
        int64_t val;
    } *slot;
    size_t cap, n; /* cap: a power of two */
} bpe_str_table;

/* An open-addressing table from a pair of ids to (rank, merged id). */
typedef struct bpe_pair_table {
    struct bpe_pair_entry {
        uint64_t key; /* (left << 32 | right) + 1; 0: empty slot */
        int32_t rank;
        uint32_t merged;
    } *slot;
    size_t cap, n;
} bpe_pair_table;

typedef struct bpe_added {
    char *text;
    size_t len;
    uint32_t id;
    bool special;
} bpe_added;

struct ct_bpe {
    char *name;             /* the file, for messages */
    int64_t vocab_size;     /* 1 + largest id */
    size_t id_cap;          /* entries of tok / tok_len */
    char **tok;             /* id -> the bytes it stands for (NULL: no token) */
    uint32_t *tok_len;
    bpe_str_table vocab;    /* model vocabulary: bytes -> id */
    int64_t byte_id[256];   /* the token of each single byte */
    bpe_pair_table merges;
    int64_t nmerges;
    bpe_added *added;
    size_t nadded;
    uint8_t added_first[256]; /* 1 where some added token starts with that byte */
    int64_t bos, eos, pad;
    bool add_prefix_space, ignore_merges;
    pcre2_code *re;
    pcre2_match_data *md;
    bpe_str_table cache;    /* piece -> (offset << 16 | count) in cache_ids */
    uint32_t *cache_ids;
    size_t cache_n, cache_cap;
    uint32_t *sym;          /* scratch for merging one piece */
    size_t sym_cap;
};

/* tables (data/bpe_table.c) */
int64_t cti_bpe_str_get(const bpe_str_table *t, const void *key, size_t len);
ct_status cti_bpe_str_put(bpe_str_table *t, const void *key, size_t len, int64_t val); /* replaces */
/* adds delta to the value of key, inserting it with delta when absent */
ct_status cti_bpe_str_add(bpe_str_table *t, const void *key, size_t len, int64_t delta);
void cti_bpe_str_free(bpe_str_table *t);
const struct bpe_pair_entry *cti_bpe_pair_get(const bpe_pair_table *t, uint32_t left, uint32_t right);
ct_status cti_bpe_pair_put(bpe_pair_table *t, uint32_t left, uint32_t right, int32_t rank, uint32_t merged);
void cti_bpe_pair_free(bpe_pair_table *t);

/* GPT-2's byte-to-unicode map: the code point that stands for a byte */
uint32_t cti_bpe_byte_char(uint8_t byte);
/* whether a vocabulary token's text is written in the byte-level alphabet */
bool cti_bpe_token_mappable(const char *token);
/* GPT-2's pre-tokenisation regex, compiled (and JIT-compiled where allowed); NULL
 * and an error on failure. The caller frees it with pcre2_code_free. */
pcre2_code *cti_bpe_regex(void);

/* building (data/bpe.c); every error names b->name */
ct_bpe *cti_bpe_new(const char *name);
/* token: the vocabulary's text (GPT-2's byte-to-unicode characters) */
ct_status cti_bpe_add_token(ct_bpe *b, const char *token, int64_t id);
ct_status cti_bpe_add_merge(ct_bpe *b, const char *left, const char *right, int64_t rank);
/* text: the added token's content, as is */
ct_status cti_bpe_add_added(ct_bpe *b, const char *text, int64_t id, bool special);
/* checks every byte has a token, compiles the regex, picks bos/eos/pad by name
 * where not set */
ct_status cti_bpe_finish(ct_bpe *b);

#endif
