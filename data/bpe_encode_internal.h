/* ctrain — byte-level BPE: the streaming encoder shared by ct_bpe_encode and the
 * file writer. */
#ifndef CT_DATA_BPE_ENCODE_INTERNAL_H
#define CT_DATA_BPE_ENCODE_INTERNAL_H

#include "data/bpe_internal.h"

/* receives the ids in order, a few at a time */
typedef struct bpe_sink bpe_sink;
struct bpe_sink {
    ct_status (*emit)(bpe_sink *sink, const uint32_t *ids, size_t n);
};

/* Cuts s[0..n) into pieces with GPT-2's regex (re, with its match data md) and
 * calls fn on each, in order. A run of bytes that are not valid UTF-8 matches
 * nothing and lies between two matches (or the ends): it is a piece of its own. */
typedef ct_status (*bpe_piece_fn)(void *ctx, const uint8_t *piece, size_t n);
ct_status cti_bpe_split(const pcre2_code *re, pcre2_match_data *md, const uint8_t *s, size_t n, bpe_piece_fn fn,
                        void *ctx);

ct_status cti_bpe_encode_to(ct_bpe *b, const uint8_t *s, size_t n, bpe_sink *sink);

#endif
