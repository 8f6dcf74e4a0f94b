/* ctrain — byte-level BPE training: the trainer's state, shared by
 * data/bpe_train.c (counting and merging) and data/bpe_train_json.c (writing). */
#ifndef CT_DATA_BPE_TRAIN_INTERNAL_H
#define CT_DATA_BPE_TRAIN_INTERNAL_H

#include <stdbool.h>

#include "data/bpe_internal.h"
#include "data/bpe_train.h"

struct ct_bpe_trainer {
    int64_t vocab_size, min_frequency;
    char **special; /* the special tokens as given (copies) */
    size_t nspecial;
    pcre2_code *re;
    pcre2_match_data *md;
    bpe_str_table words; /* word (a piece's bytes) -> how often it occurs */
    bool trained;
    char *json; /* the result, once trained */
    size_t json_len;
    /* the vocabulary: id -> its text (byte-level characters, UTF-8; a special
     * token's content as is), and back */
    char **tok;
    uint32_t *tok_len;
    size_t ntok, tok_cap;
    bpe_str_table ids;
    /* the merges, highest priority first: (left id << 32 | right id) */
    uint64_t *merges;
    size_t nmerges;
};

/* learns the vocabulary and the merges from t->words (data/bpe_train.c) */
ct_status cti_bpe_trainer_learn(ct_bpe_trainer *t);
/* the tokenizer.json of a trained t, malloc'd (data/bpe_train_json.c) */
char *cti_bpe_trainer_write_json(const ct_bpe_trainer *t, size_t *len);

#endif
