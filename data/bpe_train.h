/* ctrain — training a byte-level BPE tokenizer, as Hugging Face `tokenizers`'
 * BpeTrainer does with a ByteLevel pre-tokenizer (add_prefix_space false) and
 * initial_alphabet = ByteLevel.alphabet(): for the same text and settings the
 * vocabulary and the merges are the same, id for id and rank for rank.
 *
 *   1. Every sequence of text is cut into pieces by GPT-2's regex (the one
 *      ct_bpe_encode uses, data/bpe.h); a piece is a word, and the trainer counts
 *      how often each word occurs.
 *   2. Ids: the special tokens first (0 .. n-1, in the order given, a repeated one
 *      once), then the 256 byte tokens in the order of the code points GPT-2's
 *      byte-to-unicode map gives them ("!" .. "~", "¡" .. "¬", "®" .. "ÿ", then
 *      "Ā" .. "Ń" for the other 68 bytes).
 *   3. Merges: the adjacent pair of tokens that occurs most often (each word counts
 *      as many times as it occurs) becomes a new token with the next id, and every
 *      occurrence of it, left to right, is replaced; repeat until the vocabulary
 *      has vocab_size tokens, no pair is left, or the most frequent pair occurs
 *      fewer than min_frequency times. Of pairs with equal counts the one with the
 *      smaller (left id, right id) is merged first. Pair counts are updated
 *      incrementally from the words that held the merged pair, with a max-heap of
 *      candidate pairs, and tokenizers' bookkeeping is kept exactly (a merge
 *      that makes a token already in the vocabulary reuses its id).
 *
 * Files are read as tokenizers' Tokenizer.train(files) reads them: line by line,
 * each line with its "\n" one sequence. Bytes that are not valid UTF-8 (which
 * tokenizers refuses) are pieces of their own, as in ct_bpe_encode.
 *
 * The result is a Hugging Face tokenizer.json (model BPE, ByteLevel pre-tokenizer,
 * decoder and post-processor, the special tokens as added tokens) that ct_bpe_load
 * and tokenizers.Tokenizer.from_file both read.
 */
#ifndef CT_DATA_BPE_TRAIN_H
#define CT_DATA_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"

typedef struct ct_bpe_train_config {
    int64_t vocab_size;    /* the size to reach: specials + 256 bytes + merges; >= specials + 256 */
    int64_t min_frequency; /* a pair occurring fewer times is never merged; 0 (the default): any */
    const char *const *special_tokens; /* UTF-8, not empty; may be NULL when nspecial is 0 */
    size_t nspecial;
} ct_bpe_train_config;

typedef struct ct_bpe_trainer ct_bpe_trainer;

/* A trainer with these settings (copied). NULL and an error naming the bad value
 * (vocab_size too small, min_frequency negative, an empty or non-UTF-8 special). */
CT_API ct_bpe_trainer *ct_bpe_trainer_new(const ct_bpe_train_config *config);
/* Frees t and all it holds; NULL is allowed. */
CT_API void ct_bpe_trainer_free(ct_bpe_trainer *t);

/* Counts the words of n bytes of text, one sequence (as one item of tokenizers'
 * train_from_iterator). */
CT_API ct_status ct_bpe_trainer_feed(ct_bpe_trainer *t, const void *text, size_t n);

/* Counts the words of a file, each line (with its "\n") one sequence. Errors name
 * the file. */
CT_API ct_status ct_bpe_trainer_feed_file(ct_bpe_trainer *t, const char *path);

/* Learns the merges from the words counted so far (the first call; later ones
 * return the same result, and feeding after it is an error) and returns the
 * tokenizer.json text, malloc'd and NUL-terminated (the caller frees it); *len,
 * when not NULL, receives its length. NULL and an error on failure. */
CT_API char *ct_bpe_trainer_json(ct_bpe_trainer *t, size_t *len);

/* ct_bpe_trainer_json written to path through a temporary file beside it, fsynced
 * and renamed, so a failure never leaves a half-written file under that name. */
CT_API ct_status ct_bpe_trainer_save(ct_bpe_trainer *t, const char *path);

/* The number of tokens and of merges learned (0 before ct_bpe_trainer_json). */
CT_API int64_t ct_bpe_trainer_vocab_size(const ct_bpe_trainer *t);
CT_API int64_t ct_bpe_trainer_merge_count(const ct_bpe_trainer *t);

/* Trains on the files paths[0..npaths) and saves the tokenizer.json to out_path
 * (ct_bpe_trainer_save). */
CT_API ct_status ct_bpe_train(const ct_bpe_train_config *config, const char *const *paths, size_t npaths,
                              const char *out_path);

#endif
