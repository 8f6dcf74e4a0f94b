/* llm.c .bin token files written whole or not at all (data/token_writer.h). */
#include "data/token_writer.h"

#include <string.h>

#include "data/token_dataset.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

#define MAX_TOKENS 2147483647LL /* the header's count is an int32 */

ct_status cti_token_writer_open(cti_token_writer *w, const char *path, int token_bytes, const char *what)
{
    w->what = what ? what : "tokens";
    w->token_bytes = token_bytes;
    w->count = 0;
    w->nbuf = 0;
    if (token_bytes != 2 && token_bytes != 4)
        return ct_error_set(CT_ERR_INVALID, "%s: '%s': %d-byte tokens; allowed: 2, 4", w->what, path, token_bytes);
    ct_status st = cti_atomic_open(&w->file, path, w->what);
    if (st) return st;
    /* the header is rewritten with the count at the end; zeros hold its place */
    int32_t hdr[CT_LLMC_HEADER_INTS] = {0};
    st = cti_atomic_write(&w->file, hdr, sizeof hdr);
    if (st) cti_atomic_commit(&w->file, st, 0);
    return st;
}

static ct_status flush(cti_token_writer *w)
{
    ct_status st = cti_atomic_write(&w->file, w->buf, w->nbuf);
    w->nbuf = 0;
    return st;
}

ct_status cti_token_writer_add(cti_token_writer *w, const uint32_t *ids, size_t n)
{
    if ((int64_t)n > MAX_TOKENS - w->count)
        return ct_error_set(CT_ERR_INVALID, "%s: '%s' would hold more than %lld tokens, the llm.c header's limit",
                            w->what, w->file.path, MAX_TOKENS);
    for (size_t i = 0; i < n; i++) {
        if (w->nbuf + 4 > sizeof w->buf) {
            ct_status st = flush(w);
            if (st) return st;
        }
        if (w->token_bytes == 2) {
            uint16_t v = (uint16_t)ids[i];
            memcpy(w->buf + w->nbuf, &v, 2);
        } else {
            memcpy(w->buf + w->nbuf, &ids[i], 4);
        }
        w->nbuf += (size_t)w->token_bytes;
    }
    w->count += (int64_t)n;
    return CT_OK;
}

ct_status cti_token_writer_close(cti_token_writer *w, ct_status st, int64_t *count)
{
    if (!st) st = flush(w);
    if (!st) {
        int32_t hdr[3] = {CT_LLMC_MAGIC, w->token_bytes == 2 ? 1 : 2, (int32_t)w->count};
        st = cti_atomic_pwrite(&w->file, hdr, sizeof hdr, 0);
    }
    st = cti_atomic_commit(&w->file, st, 0);
    if (!st && count) *count = w->count;
    return st;
}
