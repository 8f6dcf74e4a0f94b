/* ctrain — byte-level BPE, the tokenizer of GPT-2 and of most Llama-family models.
 *
 * Sources: a Hugging Face tokenizer.json (model.type "BPE" with a ByteLevel
 * pre-tokenizer; merges as "a b" strings or [a, b] arrays; added_tokens), or
 * GPT-2's vocab.json + merges.txt pair. Every malformed file is an error naming
 * the file and the problem (CT_ERR_FORMAT; CT_ERR_UNSUPPORTED for a valid
 * tokenizer.json using features this reader does not implement).
 *
 * Encoding a byte string s:
 *   1. the added tokens are split off where their content occurs exactly in s
 *      (leftmost, then longest match) and become their own ids;
 *   2. each stretch between them is cut into pieces by GPT-2's regex
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (Unicode classes; \s also holds U+0085 as in the Oniguruma regex Hugging
 *      Face uses). Bytes that are not valid UTF-8 match no part of the regex: each
 *      maximal run of them between two matches is a piece of its own;
 *   3. each piece is written with GPT-2's byte-to-unicode map and merged by BPE:
 *      the adjacent pair of lowest merge rank is merged, everywhere it occurs, left
 *      to right, until no pair of the piece is a merge.
 * Every byte has a token (a file whose vocabulary lacks one is rejected), so
 * decode(encode(s)) == s for every s, invalid UTF-8 included, unless the
 * tokenizer.json asks for add_prefix_space (which adds a space at the start of
 * each stretch, as Hugging Face does).
 *
 * A ct_bpe is not thread-safe: encoding fills its cache of pieces already seen.
 * Use one per thread (loading is cheap next to encoding a corpus).
 */
#ifndef CT_DATA_BPE_H
#define CT_DATA_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"

typedef struct ct_bpe ct_bpe;

/* Loads a Hugging Face tokenizer.json. NULL and an error naming the file and the
 * problem on failure. */
CT_API ct_bpe *ct_bpe_load(const char *tokenizer_json_path);

/* The same from the n bytes of a tokenizer.json in memory; name is used in
 * messages. */
CT_API ct_bpe *ct_bpe_load_memory(const void *json, size_t n, const char *name);

/* Loads GPT-2's pair: vocab.json ({"token": id, ...}) and merges.txt (one "a b"
 * merge a line, highest priority first; a first line starting with "#version" is
 * skipped). "<|endoftext|>", when in the vocabulary, is a special token and the
 * bos, eos and pad id, as in GPT-2. */
CT_API ct_bpe *ct_bpe_load_gpt2(const char *vocab_json_path, const char *merges_txt_path);

CT_API void ct_bpe_free(ct_bpe *bpe);

/* 1 + the largest id of the model vocabulary and the added tokens. */
CT_API int64_t ct_bpe_vocab_size(const ct_bpe *bpe);

/* Number of merges (ranks 0 .. n-1). */
CT_API int64_t ct_bpe_merge_count(const ct_bpe *bpe);

/* The special ids, -1 where the tokenizer has none. bos/eos come from the
 * post_processor's TemplateProcessing (the special token before/after $A), else
 * from the added tokens' names: <|endoftext|> (bos and eos, as GPT-2), <s> /
 * <|begin_of_text|> (bos), </s> / <|end_of_text|> / <|eot_id|> (eos); pad from
 * <pad> / <|pad|> / [PAD], else <|endoftext|>. */
CT_API int64_t ct_bpe_bos_id(const ct_bpe *bpe);
CT_API int64_t ct_bpe_eos_id(const ct_bpe *bpe);
CT_API int64_t ct_bpe_pad_id(const ct_bpe *bpe);

/* The id of a token given as its text (an added token's content, or a vocabulary
 * token written as the bytes it stands for), -1 when there is none. */
CT_API int64_t ct_bpe_token_id(const ct_bpe *bpe, const char *text, size_t n);

/* Encodes n bytes of text, appending the ids to *ids (a malloc'd array of *cap
 * entries, grown with realloc; *ids = NULL, *cap = 0 to start; the caller frees
 * it). Returns the number of ids, or -1 and an error. */
CT_API int64_t ct_bpe_encode(ct_bpe *bpe, const void *text, size_t n, uint32_t **ids, size_t *cap);

/* Writes the bytes of ids[0..n) to buf (at most cap bytes, then a NUL when it
 * fits, like snprintf) and returns how many bytes the text has; -1 and an error
 * naming the position of an id that is not a token. */
CT_API int64_t ct_bpe_decode(const ct_bpe *bpe, const uint32_t *ids, size_t n, char *buf, size_t cap);

/* Encodes the files text_paths[0..npaths) one after another into the llm.c .bin
 * out_token_path: uint16 tokens (magic 20240520, version 1) when the vocabulary
 * fits in 65536 ids, else uint32 (version 2); see data/token_dataset.h. With
 * separator_id >= 0 that id is written before each file's tokens (llm.c's GPT-2
 * files put <|endoftext|> before each document). Each file is encoded whole, as one
 * text. The output is written to a temporary name beside it, fsynced and renamed,
 * so a failure never leaves a half-written file under that name. Errors name the
 * file. ntokens, when not NULL, receives the number of tokens written. */
CT_API ct_status ct_bpe_encode_files(ct_bpe *bpe, const char *const *text_paths, size_t npaths,
                                     int64_t separator_id, const char *out_token_path, int64_t *ntokens);

#endif
