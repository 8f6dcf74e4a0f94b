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

ct_status cti_bpe_encode_to(ct_bpe *b, const uint8_t *s, size_t n, bpe_sink *sink);

#endif
