/* Tests for data/bpe*.c. Two independent references: tiny vocabularies whose
 * encodings are worked out by hand below (GPT-2's byte-to-unicode map is written
 * here again from its definition), and Hugging Face `tokenizers`
 * (tests/data/bpe_oracle.sh), which trains a byte-level BPE on the fortunes corpus
 * and encodes every line of it for comparison token for token. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "data/bpe.h"
#include "tests/data/fortunes.h"
#include "tests/tmpdir.h"

static void make_tmpdir(void) { make_tmpdir_with("/tmp/ct_bpe_"); }

TestSuite(bpe, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 30);

/* ---- hand-made vocabularies ----------------------------------------------- */

/* GPT-2's bytes_to_unicode: bytes 33-126, 161-172, 174-255 are their own code
 * point; the other 68 get 256, 257, ... in byte order. */
static void byte_char(int byte, char out[3])
{
    static int cp[256];
    if (!cp['!']) {
        int n = 0;
        for (int b = 0; b < 256; b++)
            cp[b] = ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) ? b : 256 + n++;
    }
    int c = cp[byte];
    if (c < 0x80) out[0] = (char)c, out[1] = 0;
    else out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = 0;
}

/* Byte b has id b. Then (rank: merge -> id):
 *   0: t '  -> t'  256      1: a b   -> ab  257      2: ab c -> abc 258
 *   3: Ġ a  -> Ġa  259      4: b c   -> bc  260      5: c Ġ  -> cĠ  261
 *   6: ' s  -> 's  262      7: Ġ Ġ   -> ĠĠ  263      8: Ġ b  -> Ġb  264
 * then "!" with the first byte of some (non-)whitespace characters, 9-14: ! Â
 * (0xC2), ! á (0xE1), ! â (0xE2), ! ã (0xE3), ! ï (0xEF), ! Ĝ (0x1C) -> 265-270,
 * and the added token <|endoftext|> = 300 (ids 271-299 are unused). */
static const char *const MERGES[][3] = {
    {"t", "'", "t'"}, {"a", "b", "ab"},   {"ab", "c", "abc"}, {"Ġ", "a", "Ġa"}, {"b", "c", "bc"},
    {"c", "Ġ", "cĠ"}, {"'", "s", "'s"}, {"Ġ", "Ġ", "ĠĠ"},   {"Ġ", "b", "Ġb"},
    {"!", "Â", "!Â"}, {"!", "á", "!á"}, {"!", "â", "!â"}, {"!", "ã", "!ã"},   {"!", "ï", "!ï"},   {"!", "Ĝ", "!Ĝ"},
};
#define NMERGES 15

static cJSON *tiny_vocab(void)
{
    cJSON *v = cJSON_CreateObject();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        cJSON_AddNumberToObject(v, c, b);
    }
    for (int i = 0; i < NMERGES; i++) cJSON_AddNumberToObject(v, MERGES[i][2], 256 + i);
    return v;
}

/* tokenizer.json text; merges as "a b" strings or [a, b] arrays */
static char *tiny_json(bool string_merges, bool prefix_space)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *eot = cJSON_CreateObject();
    cJSON_AddNumberToObject(eot, "id", 300);
    cJSON_AddStringToObject(eot, "content", "<|endoftext|>");
    cJSON_AddBoolToObject(eot, "special", 1);
    cJSON_AddItemToArray(added, eot);
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddBoolToObject(pre, "add_prefix_space", prefix_space);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", tiny_vocab());
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < NMERGES; i++) {
        char s[32];
        snprintf(s, sizeof s, "%s %s", MERGES[i][0], MERGES[i][1]);
        cJSON_AddItemToArray(merges, string_merges ? cJSON_CreateString(s)
                                                   : cJSON_CreateStringArray(MERGES[i], 2));
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

static ct_bpe *tiny(bool string_merges)
{
    char *json = tiny_json(string_merges, false);
    ct_bpe *b = ct_bpe_load_memory(json, strlen(json), "tiny.json");
    cJSON_free(json);
    cr_assert_not_null(b, "%s", ct_last_error());
    return b;
}

static void write_text(const char *path, const char *text, size_t n)
{
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "%s", path);
    cr_assert_eq(fwrite(text, 1, n, fp), n);
    fclose(fp);
}

static ct_bpe *tiny_gpt2(void)
{
    cJSON *v = tiny_vocab();
    cJSON_AddNumberToObject(v, "<|endoftext|>", 300);
    char *vj = cJSON_Print(v);
    cJSON_Delete(v);
    write_text(path_of("vocab.json"), vj, strlen(vj));
    cJSON_free(vj);
    char m[1024] = "#version: 0.2\n";
    for (int i = 0; i < NMERGES; i++) snprintf(m + strlen(m), sizeof m - strlen(m), "%s %s\n", MERGES[i][0], MERGES[i][1]);
    write_text(path_of("merges.txt"), m, strlen(m));
    ct_bpe *b = ct_bpe_load_gpt2(path_of("vocab.json"), path_of("merges.txt"));
    cr_assert_not_null(b, "%s", ct_last_error());
    return b;
}

static void expect(ct_bpe *b, const char *text, size_t n, const uint32_t *want, size_t nwant)
{
    uint32_t *ids = NULL;
    size_t cap = 0;
    int64_t got = ct_bpe_encode(b, text, n, &ids, &cap);
    cr_assert_eq(got, (int64_t)nwant, "'%s': %lld ids, want %zu (%s)", text, (long long)got, nwant, ct_last_error());
    for (size_t i = 0; i < nwant; i++) cr_assert_eq(ids[i], want[i], "'%s': id %zu is %u, want %u", text, i, ids[i], want[i]);
    char buf[1024];
    cr_assert_eq(ct_bpe_decode(b, ids, nwant, buf, sizeof buf), (int64_t)n);
    cr_assert(!memcmp(buf, text, n), "'%s' does not round-trip", text);
    free(ids);
}

#define EXPECT(b, text, ...)                                                                                          \
    expect(b, text, sizeof text - 1, (const uint32_t[]){__VA_ARGS__}, sizeof((const uint32_t[]){__VA_ARGS__}) / 4)

/* the hand-worked cases, for either loader */
static void check_tiny(ct_bpe *b)
{
    cr_assert_eq(ct_bpe_vocab_size(b), 301);
    cr_assert_eq(ct_bpe_merge_count(b), NMERGES);
    /* a b c: ab (rank 1) before bc (4); then ab c (2) */
    EXPECT(b, "abc", 258);
    /* b c a b: ab (1) first, then bc (4); c|ab is no merge */
    EXPECT(b, "bcab", 260, 257);
    /* Ġ a b c: ab (1), then ab c (2); Ġa (3) no longer has its a */
    EXPECT(b, " abc", 32, 258);
    /* "c c" is the pieces "c" and " c": the merge c Ġ never sees both */
    EXPECT(b, "c c", 99, 32, 99);
    /* "it's" is "it" + "'s": t ' (rank 0) would merge across them */
    EXPECT(b, "it's", 105, 116, 262);
    /* three spaces before b: \s+(?!\S) takes two, " b" is the next piece */
    EXPECT(b, "a   b", 97, 263, 264);
    /* the added token is split off wherever it occurs */
    EXPECT(b, "abc<|endoftext|>abc", 258, 300, 258);
    EXPECT(b, "<|endoftext|><|endoftext|>", 300, 300);
    /* invalid UTF-8: 0xFF is a piece of its own between "ab" and "c" */
    EXPECT(b, "ab\xff" "c", 257, 255, 99);
    /* a lone continuation byte and a truncated 3-byte sequence */
    EXPECT(b, "\x80\xe2\x82", 128, 0xe2, 0x82);
    expect(b, "", 0, NULL, 0);
}

/* "!" then a character c: the punctuation run " ?[^\s\p{L}\p{N}]+" takes c
 * (and the merge "!" + c's first byte fires) exactly when c is not whitespace.
 * Whitespace is Unicode's White_Space, as in the Oniguruma regex of Hugging Face's
 * tokenizers: U+0085 and U+00A0 are, U+001C, U+180E, U+200B and U+FEFF are not. */
Test(bpe, regex_whitespace)
{
    static const struct {
        const char *c;
        bool space;
        uint32_t merged; /* "!" + the first byte */
    } cases[] = {
        {"\xc2\x85", true, 265},     {"\xc2\xa0", true, 265},     {"\xe1\x9a\x80", true, 266},
        {"\xe2\x80\x80", true, 267}, {"\xe2\x80\x8a", true, 267}, {"\xe2\x80\xa8", true, 267},
        {"\xe2\x80\xa9", true, 267}, {"\xe2\x80\xaf", true, 267}, {"\xe2\x81\x9f", true, 267},
        {"\xe3\x80\x80", true, 268}, {"\x1c", false, 270},        {"\xe1\xa0\x8e", false, 266},
        {"\xe2\x80\x8b", false, 267}, {"\xef\xbb\xbf", false, 269}, {"\xc2\xa9", false, 265},
    };
    ct_bpe *b = tiny(true);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[8];
        size_t n = (size_t)snprintf(text, sizeof text, "!%s", cases[i].c);
        uint32_t want[8], nw = 0;
        if (cases[i].space) want[nw++] = '!', want[nw++] = (uint8_t)text[1];
        else want[nw++] = cases[i].merged;
        for (size_t k = 2; k < n; k++) want[nw++] = (uint8_t)text[k];
        expect(b, text, n, want, nw);
    }
    ct_bpe_free(b);
}

/* Pieces longer than 64 bytes take the encoder's other merge path (a heap). */
Test(bpe, long_pieces)
{
    ct_bpe *b = tiny(true);
    char text[512];
    uint32_t want[512];
    /* "abab...": one piece of 200 letters; "a b" merges each pair */
    for (int i = 0; i < 100; i++) text[2 * i] = 'a', text[2 * i + 1] = 'b', want[i] = 257;
    expect(b, text, 200, want, 100);
    /* "abcabc...": ab (rank 1) everywhere, then ab c (rank 2) */
    for (int i = 0; i < 50; i++) memcpy(text + 3 * i, "abc", 3), want[i] = 258;
    expect(b, text, 150, want, 50);
    /* "a", 100 spaces, "b": the pieces "a", 99 spaces (49 ĠĠ and a Ġ), " b" */
    size_t n = 0, k = 0;
    text[n++] = 'a', want[k++] = 97;
    for (int i = 0; i < 100; i++) text[n++] = ' ';
    text[n++] = 'b';
    for (int i = 0; i < 49; i++) want[k++] = 263;
    want[k++] = 32, want[k++] = 264;
    expect(b, text, n, want, k);
    ct_bpe_free(b);
}

Test(bpe, tiny_string_merges) { ct_bpe *b = tiny(true); check_tiny(b); ct_bpe_free(b); }
Test(bpe, tiny_array_merges) { ct_bpe *b = tiny(false); check_tiny(b); ct_bpe_free(b); }
Test(bpe, tiny_gpt2_pair)
{
    ct_bpe *b = tiny_gpt2();
    check_tiny(b);
    cr_assert_eq(ct_bpe_eos_id(b), 300);
    ct_bpe_free(b);
}

Test(bpe, special_ids)
{
    ct_bpe *b = tiny(true);
    cr_assert_eq(ct_bpe_bos_id(b), 300);
    cr_assert_eq(ct_bpe_eos_id(b), 300);
    cr_assert_eq(ct_bpe_pad_id(b), 300);
    cr_assert_eq(ct_bpe_token_id(b, "<|endoftext|>", 13), 300);
    cr_assert_eq(ct_bpe_token_id(b, "abc", 3), 258);
    cr_assert_eq(ct_bpe_token_id(b, " a", 2), 259);
    cr_assert_eq(ct_bpe_token_id(b, "zz", 2), -1);
    ct_bpe_free(b);
}

Test(bpe, prefix_space)
{
    char *json = tiny_json(true, true);
    ct_bpe *b = ct_bpe_load_memory(json, strlen(json), "tiny.json");
    cJSON_free(json);
    cr_assert_not_null(b, "%s", ct_last_error());
    /* "abc" is read as " abc" */
    uint32_t *ids = NULL;
    size_t cap = 0;
    cr_assert_eq(ct_bpe_encode(b, "abc", 3, &ids, &cap), 2);
    cr_assert(ids[0] == 32 && ids[1] == 258);
    free(ids);
    ct_bpe_free(b);
}

/* model.ignore_merges: a piece that is a token is that token, merges or not */
static char *edit(const char *old, const char *new);

Test(bpe, ignore_merges)
{
    char *json = edit("\"abc\":\t258", "\"abc\": 258, \"ba\": 280");
    ct_bpe *b = ct_bpe_load_memory(json, strlen(json), "tiny.json");
    cr_assert_not_null(b, "%s", ct_last_error());
    EXPECT(b, "ba", 98, 97); /* no merge makes "ba" */
    ct_bpe_free(b);
    char *at = strstr(json, "\"BPE\"");
    size_t n = strlen(json) + 32;
    char *with = malloc(n);
    snprintf(with, n, "%.*s\"BPE\", \"ignore_merges\": true%s", (int)(at - json), json, at + 5);
    b = ct_bpe_load_memory(with, strlen(with), "tiny.json");
    cr_assert_not_null(b, "%s", ct_last_error());
    EXPECT(b, "ba", 280);
    EXPECT(b, "bcab", 260, 257); /* not a token: merged as usual */
    ct_bpe_free(b);
    free(with);
    free(json);
}

Test(bpe, decode_errors)
{
    ct_bpe *b = tiny(true);
    char buf[8];
    cr_assert_eq(ct_bpe_decode(b, (const uint32_t[]){97, 290}, 2, buf, sizeof buf), -1);
    cr_assert(strstr(ct_last_error(), "id 290 at position 1"), "%s", ct_last_error());
    cr_assert_eq(ct_bpe_decode(b, (const uint32_t[]){301}, 1, buf, sizeof buf), -1);
    /* snprintf-like: the length even when the buffer is short */
    cr_assert_eq(ct_bpe_decode(b, (const uint32_t[]){258, 258, 258}, 3, buf, 4), 9);
    cr_assert(!memcmp(buf, "abca", 4));
    cr_assert_eq(ct_bpe_decode(b, NULL, 0, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "");
    ct_bpe_free(b);
}

/* ---- malformed files -------------------------------------------------------- */

static void load_fails(const char *json, ct_status st, const char *what)
{
    ct_bpe *b = ct_bpe_load_memory(json, strlen(json), "bad.json");
    cr_assert_null(b, "'%s' loaded", json);
    cr_assert_eq(ct_last_status(), st, "%s: status %d: %s", json, ct_last_status(), ct_last_error());
    cr_assert(strstr(ct_last_error(), "'bad.json'"), "no file name: %s", ct_last_error());
    cr_assert(strstr(ct_last_error(), what), "'%s' not in: %s", what, ct_last_error());
}

/* the tiny tokenizer.json with text replaced: old must occur in it */
static char *edit(const char *old, const char *new)
{
    char *json = tiny_json(true, false);
    char *at = strstr(json, old);
    cr_assert_not_null(at, "%s", old);
    size_t n = strlen(json) + strlen(new) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - json), json, new, at + strlen(old));
    cJSON_free(json);
    return out;
}

static void edit_fails(const char *old, const char *new, ct_status st, const char *what)
{
    char *json = edit(old, new);
    load_fails(json, st, what);
    free(json);
}

Test(bpe, malformed_json)
{
    load_fails("", CT_ERR_FORMAT, "is not JSON");
    load_fails("{\"model\": ", CT_ERR_FORMAT, "is not JSON");
    load_fails("[1, 2]", CT_ERR_FORMAT, "top level is not a JSON object");
    load_fails("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", CT_ERR_FORMAT, "no \"model\" object");
    load_fails("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\"}}", CT_ERR_FORMAT,
               "model.vocab is missing");
    load_fails("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {}}}", CT_ERR_FORMAT,
               "model.merges is missing");
    load_fails("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": [], \"merges\": []}}",
               CT_ERR_FORMAT, "model.vocab is not an object");
    load_fails("{\"model\": {}}", CT_ERR_FORMAT, "pre_tokenizer is not an object");
}

Test(bpe, malformed_model)
{
    edit_fails("\"type\":\t\"BPE\"", "\"type\": \"WordPiece\"", CT_ERR_UNSUPPORTED, "model.type is \"WordPiece\"");
    edit_fails("\"ByteLevel\"", "\"Metaspace\"", CT_ERR_UNSUPPORTED, "pre_tokenizer.type is \"Metaspace\"");
    edit_fails("\"normalizer\":\tnull", "\"normalizer\": {\"type\": \"NFC\"}", CT_ERR_UNSUPPORTED, "normalizer");
    edit_fails("\"type\":\t\"BPE\"", "\"type\": \"BPE\", \"dropout\": 0.1", CT_ERR_UNSUPPORTED, "dropout");
    edit_fails("\"type\":\t\"BPE\"", "\"type\": \"BPE\", \"byte_fallback\": true", CT_ERR_UNSUPPORTED,
               "byte_fallback");
    /* merges */
    edit_fails("\"a b\"", "\"a zz\"", CT_ERR_FORMAT, "merge 1 ('a' 'zz') names 'zz', which is not in the vocabulary");
    edit_fails("\"b c\"", "\"c b\"", CT_ERR_FORMAT, "merge 4 ('c' 'b') makes 'cb', which is not in the vocabulary");
    edit_fails("\"a b\"", "\"a b c\"", CT_ERR_FORMAT, "model.merges[1] is neither");
    edit_fails("\"a b\"", "\"ab\"", CT_ERR_FORMAT, "model.merges[1] is neither");
    edit_fails("\"a b\"", "[\"a\"]", CT_ERR_FORMAT, "model.merges[1] is neither");
    edit_fails("\"a b\"", "7", CT_ERR_FORMAT, "model.merges[1] is neither");
    /* ids */
    edit_fails("\"abc\":\t258", "\"abc\": 257", CT_ERR_FORMAT, "id 257 is given to two tokens");
    edit_fails("\"abc\":\t258", "\"abc\": -1", CT_ERR_FORMAT, "the id of token 'abc' is not an integer in [0, 16777216)");
    edit_fails("\"abc\":\t258", "\"abc\": 2.5", CT_ERR_FORMAT, "the id of token 'abc' is not an integer");
    edit_fails("\"abc\":\t258", "\"abc\": 1e12", CT_ERR_FORMAT, "the id of token 'abc' is not an integer");
    edit_fails("\"abc\":\t258", "\"abc\": 1e70", CT_ERR_FORMAT, "the id of token 'abc' is not an integer");
    edit_fails("\"abc\":\t258", "\"abc\": \"258\"", CT_ERR_FORMAT, "the id of token 'abc' is not an integer");
    edit_fails("\"abc\":\t258", "\"abc\": 258, \"xyz\u20ac\": 400", CT_ERR_FORMAT, "holds U+20AC");
    edit_fails("\"abc\":\t258", "\"\": 258", CT_ERR_FORMAT, "the empty token");
    /* every byte needs a token: remove "z" (0x7A) */
    edit_fails("\"z\":\t122,", "", CT_ERR_FORMAT, "byte 0x7A (the token U+007A) is not in the vocabulary");
    /* added tokens */
    edit_fails("\"id\":\t300", "\"id\": 97", CT_ERR_FORMAT, "added token '<|endoftext|>' has id 97");
    edit_fails("\"id\":\t300", "\"id\": null", CT_ERR_FORMAT, "the id of added token '<|endoftext|>'");
    edit_fails("\"special\":\ttrue", "\"special\": true, \"lstrip\": true", CT_ERR_UNSUPPORTED, "sets lstrip");
    edit_fails("\"content\":\t\"<|endoftext|>\"", "\"content\": 5", CT_ERR_FORMAT, "added_tokens[0] is not an object");
    edit_fails("\"content\":\t\"<|endoftext|>\"", "\"content\": \"\"", CT_ERR_FORMAT, "added token 300 is empty");
}

Test(bpe, file_errors)
{
    cr_assert_null(ct_bpe_load(path_of("missing.json")));
    cr_assert_eq(ct_last_status(), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), "missing.json"), "%s", ct_last_error());
    ct_bpe_free(tiny_gpt2()); /* writes vocab.json and merges.txt */
    cr_assert_null(ct_bpe_load_gpt2(path_of("vocab.json"), path_of("missing.txt")));
    cr_assert(strstr(ct_last_error(), "missing.txt"), "%s", ct_last_error());
    write_text(path_of("bad.txt"), "#version: 0.2\na b\nab\n", 21);
    cr_assert_null(ct_bpe_load_gpt2(path_of("vocab.json"), path_of("bad.txt")));
    cr_assert(strstr(ct_last_error(), "bad.txt': line 3 is not \"a b\""), "%s", ct_last_error());
    write_text(path_of("bad.txt"), "a q\n", 4);
    cr_assert_null(ct_bpe_load_gpt2(path_of("vocab.json"), path_of("bad.txt")));
    cr_assert(strstr(ct_last_error(), "bad.txt': merge 0 ('a' 'q') makes 'aq'"), "%s", ct_last_error());
    write_text(path_of("bad.json"), "{\"a\": 1", 7);
    cr_assert_null(ct_bpe_load_gpt2(path_of("bad.json"), path_of("merges.txt")));
    cr_assert(strstr(ct_last_error(), "bad.json' is not JSON"), "%s", ct_last_error());
}

/* ---- round trips ------------------------------------------------------------ */

static void round_trip(ct_bpe *b, const char *text, size_t n)
{
    uint32_t *ids = NULL;
    size_t cap = 0;
    int64_t k = ct_bpe_encode(b, text, n, &ids, &cap);
    cr_assert_geq(k, n ? 1 : 0, "%s", ct_last_error());
    char *buf = malloc(n + 1);
    cr_assert_eq(ct_bpe_decode(b, ids, (size_t)k, buf, n + 1), (int64_t)n);
    cr_assert(!memcmp(buf, text, n), "round trip of %zu bytes differs", n);
    free(buf);
    free(ids);
}

static const char *const TRICKY[] = {
    "héllo wörld, ça va? 日本語のテキスト и русский текст، والعربية",
    "emoji: 👍🏽 👨‍👩‍👧 🇫🇷 ✨✨✨",
    "tabs\tand\r\nCRLF\x0b\x0c and NEL\xc2\x85 and NBSP\xc2\xa0here",
    "numbers 123 4567 ٣٤٥ ½ x²",
    "contractions: it's we're they've I'm you'll he'd DON'T",
    "<|endoftext|>between<|endoftext|> and <|endoftext",
};

static void round_trips(ct_bpe *b)
{
    for (size_t i = 0; i < sizeof TRICKY / sizeof *TRICKY; i++) round_trip(b, TRICKY[i], strlen(TRICKY[i]));
    uint64_t s = 88172645463325252ULL; /* xorshift64 */
    char buf[4096];
    for (int t = 0; t < 200; t++) {
        size_t n = (size_t)(t * 37 % 4096);
        for (size_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            /* every third text mostly ASCII letters and spaces, the rest any bytes */
            buf[i] = t % 3 ? (char)s : " abcs'\n\t\xc3\xa9"[s % 11];
        }
        round_trip(b, buf, n);
    }
    memset(buf, ' ', 3000);
    round_trip(b, buf, 3000);
    memset(buf, '\n', 1000);
    round_trip(b, buf, 2000);
}

Test(bpe, round_trip_tiny) { ct_bpe *b = tiny(false); round_trips(b); ct_bpe_free(b); }

/* ---- token files ------------------------------------------------------------ */

static uint32_t le(const uint8_t *p, int n)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

/* the .bin holds magic 20240520, version, count, then these tokens */
static void check_bin(const char *path, int version, const uint32_t *want, size_t n)
{
    size_t size;
    uint8_t *b = read_all(path, &size);
    int tb = version == 1 ? 2 : 4;
    cr_assert_eq(size, 1024 + n * (size_t)tb, "%s: %zu bytes, want %zu", path, size, 1024 + n * (size_t)tb);
    cr_assert_eq(le(b, 4), 20240520);
    cr_assert_eq(le(b + 4, 4), (uint32_t)version);
    cr_assert_eq(le(b + 8, 4), n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(le(b + 1024 + i * tb, tb), want[i], "token %zu", i);
    free(b);
}

Test(bpe, encode_files)
{
    ct_bpe *b = tiny(true);
    write_text(path_of("one.txt"), "abc", 3);
    write_text(path_of("two.txt"), "bcab", 4);
    char one[256], two[256], nope[256]; /* path_of keeps only its last four results */
    snprintf(one, sizeof one, "%s", path_of("one.txt"));
    snprintf(two, sizeof two, "%s", path_of("two.txt"));
    snprintf(nope, sizeof nope, "%s", path_of("nope.txt"));
    const char *paths[] = {one, two};
    int64_t n = 0;
    cr_assert_eq(ct_bpe_encode_files(b, paths, 2, 300, path_of("out.bin"), &n), CT_OK, "%s", ct_last_error());
    cr_assert_eq(n, 5);
    check_bin(path_of("out.bin"), 1, (const uint32_t[]){300, 258, 300, 260, 257}, 5);
    cr_assert_eq(ct_bpe_encode_files(b, paths, 2, -1, path_of("out.bin"), NULL), CT_OK);
    check_bin(path_of("out.bin"), 1, (const uint32_t[]){258, 260, 257}, 3);
    /* errors name the file, and leave neither the output nor a temporary file */
    const char *bad[] = {one, nope};
    cr_assert_eq(ct_bpe_encode_files(b, bad, 2, -1, path_of("new.bin"), NULL), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), "nope.txt"), "%s", ct_last_error());
    struct stat sb;
    cr_assert_neq(stat(path_of("new.bin"), &sb), 0);
    cr_assert_eq(ct_bpe_encode_files(b, paths, 2, 301, path_of("new.bin"), NULL), CT_ERR_INVALID);
    cr_assert_eq(ct_bpe_encode_files(b, paths, 1, -1, path_of("no/such/dir.bin"), NULL), CT_ERR_IO);
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while ((e = readdir(d))) cr_assert_null(strstr(e->d_name, ".tmp."), "%s left behind", e->d_name);
    closedir(d);
    ct_bpe_free(b);

    /* a vocabulary past 65536 ids: uint32 tokens, version 2 */
    char *json = edit("\"id\":\t300", "\"id\": 70000");
    b = ct_bpe_load_memory(json, strlen(json), "big.json");
    free(json);
    cr_assert_not_null(b, "%s", ct_last_error());
    cr_assert_eq(ct_bpe_encode_files(b, paths, 2, 70000, path_of("big.bin"), NULL), CT_OK, "%s", ct_last_error());
    check_bin(path_of("big.bin"), 2, (const uint32_t[]){70000, 258, 70000, 260, 257}, 5);
    ct_bpe_free(b);
}

/* ---- the Hugging Face oracle ------------------------------------------------ */

/* The fortunes corpus (the text files of Debian's fortunes packages: the names
 * without an extension), its valid UTF-8 lines and the tricky ones above, into
 * path. Returns the number of lines, 0 when there is no corpus. */
static size_t write_corpus(const char *path)
{
    FILE *out = fopen(path, "wb");
    cr_assert_not_null(out);
    size_t lines = fortunes_append(out);
    if (!lines) {
        fclose(out);
        return 0;
    }
    for (size_t i = 0; i < sizeof TRICKY / sizeof *TRICKY; i++) {
        fprintf(out, "%s\n", TRICKY[i]);
        lines++;
    }
    /* long pieces (over 64 bytes: the encoder's heap path): letters, digits,
     * punctuation, each from a fixed linear congruential sequence */
    uint32_t x = 12345;
    static const char *const alphabets[] = {"etaoinshrdlucmfwyp", "0123456789", "=-+*#~.,;:!?"};
    for (int a = 0; a < 3; a++) {
        for (int i = 0; i < 3000; i++) {
            x = x * 1103515245u + 12345u;
            fputc(alphabets[a][(x >> 16) % strlen(alphabets[a])], out);
        }
        fputc('\n', out);
        lines++;
    }
    /* the last line has no newline */
    fprintf(out, "   long   runs\t\t\t of     whitespace                                      end");
    lines++;
    fclose(out);
    return lines;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Encodes every line of text (split at "\n") with b and compares with ids.txt;
 * reports the first line that differs. */
static void compare_lines(ct_bpe *b, const char *what, const uint8_t *text, size_t n, const char *ids_txt)
{
    uint32_t *ids = NULL;
    size_t cap = 0, line = 0, tokens = 0;
    double seconds = 0;
    const char *want = ids_txt;
    for (size_t i = 0; i <= n; line++) {
        const uint8_t *nl = i < n ? memchr(text + i, '\n', n - i) : NULL;
        size_t len = nl ? (size_t)(nl - (text + i)) : n - i;
        double t0 = now();
        int64_t k = ct_bpe_encode(b, text + i, len, &ids, &cap);
        seconds += now() - t0;
        cr_assert_geq(k, 0, "%s: line %zu: %s", what, line + 1, ct_last_error());
        const char *eol = strchr(want, '\n');
        cr_assert_not_null(eol, "%s: ids.txt ends before line %zu", what, line + 1);
        char *p = (char *)want;
        for (int64_t t = 0; t < k; t++) {
            char *q;
            unsigned long v = strtoul(p, &q, 10);
            cr_assert(q != p && q <= eol && v == ids[t],
                      "%s: line %zu ('%.*s') differs from tokenizers at token %lld: %u, tokenizers: %.*s", what,
                      line + 1, (int)len, text + i, (long long)t, ids[t], (int)(eol - want), want);
            p = q;
        }
        while (*p == ' ') p++;
        cr_assert_eq(p, eol, "%s: line %zu ('%.*s'): tokenizers has more tokens: %.*s", what, line + 1, (int)len,
                     text + i, (int)(eol - want), want);
        want = eol + 1;
        tokens += (size_t)k;
        if (!nl) break;
        i += len + 1;
    }
    cr_log_info("%s: %zu lines, %zu tokens identical to tokenizers; encoded in %.3f s (%.1f MB/s)", what, line + 1,
                tokens, seconds, (double)n / seconds / 1e6);
    free(ids);
}

Test(bpe, hugging_face_oracle, .timeout = 600)
{
    const char *src = getenv("CTRAIN_SRC");
    if (!src || !*src) cr_skip_test("CTRAIN_SRC is not set: run through `make test`");
    size_t lines = write_corpus(path_of("text.txt"));
    if (!lines) cr_skip_test("no fortunes corpus in " FORTUNES " (Debian's fortunes package; tools/setup.sh)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 500 bash '%s/tests/data/bpe_oracle.sh' '%s' '%s' '%s' 2>'%s'", src, bpe_venv_dir(),
             tmpdir, path_of("text.txt"), path_of("oracle.err"));
    int rc = system(cmd);
    size_t n;
    char *err = (char *)read_all(path_of("oracle.err"), &n);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) cr_skip_test("Hugging Face tokenizers is not available: %s", err);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "bpe_oracle.sh failed (status %d): %s", rc, err);
    free(err);

    uint8_t *text = read_all(path_of("text.txt"), &n);
    char *ids = (char *)read_all(path_of("ids.txt"), &n);
    size_t tn;
    free(read_all(path_of("text.txt"), &tn));

    ct_bpe *b = ct_bpe_load(path_of("tokenizer.json"));
    cr_assert_not_null(b, "%s", ct_last_error());
    cr_assert_eq(ct_bpe_vocab_size(b), 2000);
    cr_assert_eq(ct_bpe_eos_id(b), 0);
    compare_lines(b, "tokenizer.json", text, tn, ids);
    round_trips(b);
    ct_bpe_free(b);

    b = ct_bpe_load_gpt2(path_of("vocab.json"), path_of("merges.txt"));
    cr_assert_not_null(b, "%s", ct_last_error());
    compare_lines(b, "vocab.json + merges.txt", text, tn, ids);
    ct_bpe_free(b);

    /* the same tokenizer.json with its merges in the other form ("a b" strings or
     * [a, b] arrays, whichever the installed tokenizers did not write) */
    size_t jn;
    char *json = (char *)read_all(path_of("tokenizer.json"), &jn);
    cJSON *root = cJSON_Parse(json);
    free(json);
    cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "merges");
    cr_assert(cJSON_IsArray(merges));
    cJSON *other = cJSON_CreateArray(), *m;
    cJSON_ArrayForEach(m, merges)
    {
        if (cJSON_IsArray(m)) {
            char s[256];
            snprintf(s, sizeof s, "%s %s", cJSON_GetArrayItem(m, 0)->valuestring, cJSON_GetArrayItem(m, 1)->valuestring);
            cJSON_AddItemToArray(other, cJSON_CreateString(s));
        } else {
            const char *sp = strchr(m->valuestring, ' ');
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(sp + 1));
            cJSON_AddItemToArray(pair, cJSON_CreateString(m->valuestring)); /* then cut at the space */
            cJSON_GetArrayItem(pair, 1)->valuestring[sp - m->valuestring] = '\0';
            cJSON_AddItemToArray(other, cJSON_CreateStringArray((const char *[]){cJSON_GetArrayItem(pair, 1)->valuestring,
                                                                                 cJSON_GetArrayItem(pair, 0)->valuestring},
                                                                2));
            cJSON_Delete(pair);
        }
    }
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "model"), "merges", other);
    json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    b = ct_bpe_load_memory(json, strlen(json), "tokenizer.json, other merge form");
    cJSON_free(json);
    cr_assert_not_null(b, "%s", ct_last_error());
    compare_lines(b, "tokenizer.json, other merge form", text, tn, ids);
    ct_bpe_free(b);
    free(text);
    free(ids);
    (void)lines;
}
