/* Tests for the tokenizer.json pre-tokenizers other than GPT-2's (data/bpe_load.c,
 * data/bpe_regex.c): Llama 3's Sequence [Split (regex), ByteLevel (no regex)],
 * ByteLevel without a regex, and the refusals. Two references: a tiny vocabulary
 * whose encodings are worked out by hand below, and Hugging Face `tokenizers`
 * (tests/data/bpe_oracle.sh, mode llama3), which trains a tokenizer in Llama 3's
 * form on the fortunes corpus and encodes every line of it. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "data/bpe.h"
#include "tests/data/fortunes.h"
#include "tests/tmpdir.h"

static void make_tmpdir(void) { make_tmpdir_with("/tmp/ct_bpe_pretok_"); }

TestSuite(bpe_pretok, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 30);

/* Llama 3's regex, as its tokenizer.json holds it */
static const char LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                             "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* GPT-2's byte-to-unicode map, from its definition: bytes 33-126, 161-172,
 * 174-255 are their own code point, the other 68 get 256, 257, ... in order */
static void byte_char(int byte, char out[3])
{
    int n = 0, c = -1;
    for (int b = 0; b <= byte; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        c = printable ? b : 256 + n++;
    }
    if (c < 0x80) out[0] = (char)c, out[1] = 0;
    else out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = 0;
}

/* Byte b has id b; then (rank: merge -> id)
 *   0: 3 4 -> 34 256     1: 1 2 -> 12 257     2: 12 3 -> 123 258   3: ' S -> 'S 259
 *   4: S x -> Sx 260     5: Ġ Ġ -> ĠĠ 261     6: č Ċ -> čĊ 262     7: Ġ y -> Ġy 263
 * and "ab" = 270, which no merge makes. pre: the pre_tokenizer's JSON. */
static char *tiny_json(const char *pre, bool ignore_merges)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(pre));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddBoolToObject(model, "ignore_merges", ignore_merges);
    cJSON *v = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        cJSON_AddNumberToObject(v, c, b);
    }
    static const char *const merges[][3] = {{"3", "4", "34"},   {"1", "2", "12"},   {"12", "3", "123"},
                                            {"'", "S", "'S"},   {"S", "x", "Sx"},   {"Ġ", "Ġ", "ĠĠ"},
                                            {"č", "Ċ", "čĊ"}, {"Ġ", "y", "Ġy"}};
    cJSON *m = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < 8; i++) {
        cJSON_AddNumberToObject(v, merges[i][2], 256 + i);
        cJSON_AddItemToArray(m, cJSON_CreateStringArray(merges[i], 2));
    }
    cJSON_AddNumberToObject(v, "ab", 270);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return json;
}

/* the Sequence of Llama 3, with split (a JSON string) as the Split's regex */
static char *sequence(const char *split_json, const char *behavior)
{
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": %s}, "
             "\"behavior\": \"%s\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
             "\"trim_offsets\": true, \"use_regex\": false}]}",
             split_json, behavior);
    return buf;
}

static char *json_string(const char *s)
{
    cJSON *j = cJSON_CreateString(s);
    char *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return out;
}

static ct_bpe *load_pre(const char *pre, bool ignore_merges)
{
    char *json = tiny_json(pre, ignore_merges);
    cr_assert_not_null(json, "pre_tokenizer JSON: %s", pre);
    ct_bpe *b = ct_bpe_load_memory(json, strlen(json), "tiny.json");
    cr_assert_not_null(b, "%s", ct_last_error());
    cJSON_free(json);
    return b;
}

static ct_bpe *llama(bool ignore_merges)
{
    char *re = json_string(LLAMA3);
    ct_bpe *b = load_pre(sequence(re, "Isolated"), ignore_merges);
    cJSON_free(re);
    return b;
}

static void expect(ct_bpe *b, const char *text, const uint32_t *want, size_t nwant)
{
    uint32_t *ids = NULL;
    size_t cap = 0, n = strlen(text);
    int64_t k = ct_bpe_encode(b, text, n, &ids, &cap);
    cr_assert_eq(k, (int64_t)nwant, "'%s': %lld ids, want %zu (%s)", text, (long long)k, nwant, ct_last_error());
    for (size_t i = 0; i < nwant; i++)
        cr_assert_eq(ids[i], want[i], "'%s': id %zu is %u, want %u", text, i, ids[i], want[i]);
    char *back = malloc(n + 1);
    cr_assert_eq(ct_bpe_decode(b, ids, (size_t)k, back, n + 1), (int64_t)n);
    cr_assert(!memcmp(back, text, n), "'%s' decodes to '%s'", text, back);
    free(back);
    free(ids);
}
#define EXPECT(b, text, ...)                                                                                           \
    expect(b, text, (const uint32_t[]){__VA_ARGS__}, sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))

/* The pieces by hand (Llama 3's regex): digits in threes, (?i:'s) before letters,
 * a CRLF run as one piece, whitespace but the last before a letter. */
Test(bpe_pretok, llama3_split)
{
    ct_bpe *b = llama(false);
    EXPECT(b, "1234", 258, '4');                    /* "123" "4"; as one piece: 12 34 */
    EXPECT(b, "12345678", 258, '4', '5', '6', '7', '8'); /* "123" "456" "78" */
    EXPECT(b, "'Sx", 259, 'x');                     /* "'S" "x" (case-insensitive 's) */
    EXPECT(b, "a\r\n\r\nb", 'a', 262, 262, 'b');     /* "a" "\r\n\r\n" "b" */
    EXPECT(b, "x   y", 'x', 261, 263);               /* "x" "  " " y" */
    EXPECT(b, "ab", 'a', 'b');                       /* no merge makes "ab" */
    ct_bpe_free(b);
    b = llama(true); /* ignore_merges: a piece that is a token is that token */
    EXPECT(b, "ab", 270);
    EXPECT(b, "ab ab", 270, ' ', 'a', 'b'); /* " ab" is no token */
    EXPECT(b, "1234", 258, '4');
    ct_bpe_free(b);
}

/* GPT-2's regex ("1234" one piece, "'" apart from "Sx") and no regex at all */
Test(bpe_pretok, byte_level_forms)
{
    ct_bpe *b = load_pre("{\"type\": \"ByteLevel\", \"add_prefix_space\": false}", false);
    EXPECT(b, "1234", 257, 256);
    EXPECT(b, "'Sx", '\'', 260);
    ct_bpe_free(b);
    b = load_pre("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}", false);
    EXPECT(b, "1234 1234", 257, 256, ' ', 257, 256); /* one piece */
    EXPECT(b, "x\xff\xfe y", 'x', 0xff, 0xfe, 263);  /* invalid UTF-8 is bytes too */
    ct_bpe_free(b);
    b = load_pre("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}", true);
    EXPECT(b, "ab", 270);
    EXPECT(b, "abab", 'a', 'b', 'a', 'b');
    ct_bpe_free(b);
}

/* A regex that matches the empty string: as in tokenizers (checked with its
 * Split), an empty match makes no piece but ends the text before it. */
Test(bpe_pretok, empty_matches)
{
    ct_bpe *b = load_pre(sequence("\"x*\"", "Isolated"), false);
    EXPECT(b, "Sxx", 'S', 'x', 'x');             /* "S" "xx": S x is not merged */
    EXPECT(b, "\xc3\xa9Sx", 0xc3, 0xa9, 'S', 'x'); /* "é" "S" "x" */
    EXPECT(b, "12 34", '1', '2', ' ', '3', '4'); /* an empty match before each character */
    ct_bpe_free(b);
    b = load_pre(sequence("\"(?=4)\"", "Isolated"), false);
    EXPECT(b, "1234", 258, '4'); /* "123" "4"; as one piece: 12 34 */
    ct_bpe_free(b);
    /* \s is White_Space (U+0085 included, as in tokenizers) */
    b = load_pre(sequence("\"\\\\s+\"", "Isolated"), false);
    EXPECT(b, "34\xc2\x85y", 256, 0xc2, 0x85, 'y');
    EXPECT(b, "  y", 261, 'y');
    ct_bpe_free(b);
}

static void fails(const char *pre, const char *what)
{
    char *json = tiny_json(pre, false);
    ct_bpe *b = ct_bpe_load_memory(json, strlen(json), "tiny.json");
    cJSON_free(json);
    cr_assert_null(b, "loads with pre_tokenizer %s", pre);
    cr_assert_eq(ct_last_status(), CT_ERR_UNSUPPORTED, "%s", ct_last_error());
    cr_assert(strstr(ct_last_error(), what), "'%s' lacks '%s'", ct_last_error(), what);
    cr_assert(strstr(ct_last_error(), "tiny.json"), "%s", ct_last_error());
}

Test(bpe_pretok, refusals)
{
    fails(sequence("\"a\"", "Removed"), "pre_tokenizer.pretokenizers[0].behavior \"Removed\"");
    fails(sequence("\"a\"", "MergedWithPrevious"), "behavior");
    fails("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
          "\"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": false}]}",
          "pretokenizers[1].add_prefix_space");
    fails("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
          "\"behavior\": \"Isolated\", \"invert\": true}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}",
          "pretokenizers[0].invert = true");
    fails("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"String\": \"a\"}, "
          "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}",
          "pretokenizers[0].pattern is not supported");
    fails("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
          "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\"}]}",
          "pretokenizers[1].use_regex = true");
    fails("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}", "pre_tokenizer.pretokenizers");
    fails("{\"type\": \"Metaspace\"}", "pre_tokenizer.type is \"Metaspace\"");
    /* constructs Oniguruma and PCRE2 read differently */
    static const char *const bad[][2] = {
        {"\"\\\\w+\"", "escape \\w"},           {"\"[\\\\H]\"", "\\H inside"},
        {"\"[^\\\\S]\"", "\\S inside"},         {"\"[[:alpha:]]\"", "[:class:]"},
        {"\"[a[b]]\"", "nested"},          {"\"[a-z&&b]\"", "intersection"},
        {"\"(?m:a.)\"", "inline option"},       {"\"a{1,2}+\"", "interval followed by +"},
        {"\"(a)\\\\1\"", "escape \\1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) fails(sequence(bad[i][0], "Isolated"), bad[i][1]);
    /* what PCRE2 itself rejects is a format error naming the field */
    char *json = tiny_json(sequence("\"(a\"", "Isolated"), false);
    cr_assert_null(ct_bpe_load_memory(json, strlen(json), "tiny.json"));
    cr_assert(strstr(ct_last_error(), "pretokenizers[0].pattern.Regex"), "%s", ct_last_error());
    cJSON_free(json);
}

/* Oniguruma's spellings that PCRE2 reads otherwise, translated: {,n}, \uHHHH, \h, \v
 * (what tokenizers' Split makes of each, checked by hand) */
Test(bpe_pretok, translations)
{
    ct_bpe *b = load_pre(sequence("\"\\\\p{N}{,2}\"", "Isolated"), false);
    EXPECT(b, "1234", 257, 256); /* "12" "34" */
    ct_bpe_free(b);
    b = load_pre(sequence("\"\\\\u0031\\\\u0032\"", "Isolated"), false);
    EXPECT(b, "3124", '3', 257, '4'); /* "3" "12" "4" */
    ct_bpe_free(b);
    b = load_pre(sequence("\"\\\\h+\"", "Isolated"), false); /* hex digits, not blanks */
    EXPECT(b, "x12 34", 'x', 257, ' ', 256);
    ct_bpe_free(b);
    b = load_pre(sequence("\"\\\\v\"", "Isolated"), false);
    EXPECT(b, "12\n34\x0b", 257, '\n', 256, 0x0b); /* \v is U+000B alone: "12\n34" */
    ct_bpe_free(b);
}

/* ---- the Hugging Face oracle ------------------------------------------------ */

static const char *const HARD[] = {
    "digits 1234567 and 12345678901234567890 ٣٤٥٦ ½ x²",
    "CRLF\r\nline\r\n\r\n  \r\n\tend \r",
    "mixed Ελληνικά русский 日本語のテキスト والعربية עברית हिन्दी",
    "emoji 👍🏽 👨‍👩‍👧 🇫🇷 ✨✨✨",
    "contractions it's IT'S we'RE they've I'M you'll HE'D 'ſ 'K",
    "whitespace                                                   run\t\t\t\t  \xc2\xa0\xc2\x85 x",
    "   xyzzyplugh Supercalifragilistic quuxbaz quuxbaz xyzzyplugh     end",
    "<|begin_of_text|> is not split off here",
};

static size_t write_corpus(const char *path)
{
    FILE *out = fopen(path, "wb");
    cr_assert_not_null(out);
    size_t lines = fortunes_append(out);
    if (!lines) {
        fclose(out);
        return 0;
    }
    for (size_t i = 0; i < sizeof HARD / sizeof *HARD; i++) fprintf(out, "%s\n", HARD[i]);
    fprintf(out, "the last line has no newline  ");
    fclose(out);
    return lines + sizeof HARD / sizeof *HARD + 1;
}

Test(bpe_pretok, hugging_face_llama3, .timeout = 600)
{
    const char *src = getenv("CTRAIN_SRC");
    if (!src || !*src) cr_skip_test("CTRAIN_SRC is not set: run through `make test`");
    if (!write_corpus(path_of("text.txt")))
        cr_skip_test("no fortunes corpus in " FORTUNES " (Debian's fortunes package; tools/setup.sh)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 500 bash '%s/tests/data/bpe_oracle.sh' '%s' '%s' '%s' llama3 2>'%s'", src,
             bpe_venv_dir(), tmpdir, path_of("text.txt"), path_of("oracle.err"));
    int rc = system(cmd);
    size_t n;
    char *err = (char *)read_all(path_of("oracle.err"), &n);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) cr_skip_test("Hugging Face tokenizers is not available: %s", err);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "bpe_oracle.sh failed (status %d): %s", rc, err);
    free(err);

    size_t tn;
    uint8_t *text = read_all(path_of("text.txt"), &tn);
    char *want = (char *)read_all(path_of("llama3_ids.txt"), &n);
    ct_bpe *b = ct_bpe_load(path_of("llama3.json"));
    cr_assert_not_null(b, "%s", ct_last_error());
    cr_assert_eq(ct_bpe_bos_id(b), 0);
    cr_assert_eq(ct_bpe_token_id(b, "<|end_of_text|>", 15), 1);

    uint32_t *ids = NULL;
    size_t cap = 0, line = 0, tokens = 0, one_id = 0;
    double seconds = 0;
    const char *w = want;
    for (size_t i = 0; i <= tn; line++) {
        const uint8_t *nl = i < tn ? memchr(text + i, '\n', tn - i) : NULL;
        size_t len = nl ? (size_t)(nl - (text + i)) : tn - i;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int64_t k = ct_bpe_encode(b, text + i, len, &ids, &cap);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        seconds += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        cr_assert_geq(k, 0, "line %zu: %s", line + 1, ct_last_error());
        const char *eol = strchr(w, '\n');
        cr_assert_not_null(eol, "llama3_ids.txt ends before line %zu", line + 1);
        char *p = (char *)w;
        for (int64_t t = 0; t < k; t++) {
            char *q;
            unsigned long v = strtoul(p, &q, 10);
            cr_assert(q != p && q <= eol && v == ids[t],
                      "line %zu ('%.*s') differs from tokenizers at token %lld: %u, tokenizers: %.*s", line + 1,
                      (int)len, text + i, (long long)t, ids[t], (int)(eol - w), w);
            p = q;
        }
        while (*p == ' ') p++;
        cr_assert_eq(p, eol, "line %zu ('%.*s'): tokenizers has more tokens: %.*s", line + 1, (int)len, text + i,
                     (int)(eol - w), w);
        /* the tokens added after training: only ignore_merges makes them */
        for (int64_t t = 0; t < k; t++) one_id += ids[t] >= 4000;
        /* decode(encode(x)) == x */
        char *back = malloc(len + 1);
        cr_assert_eq(ct_bpe_decode(b, ids, (size_t)k, back, len + 1), (int64_t)len);
        cr_assert(!memcmp(back, text + i, len), "line %zu does not decode to itself", line + 1);
        free(back);
        w = eol + 1;
        tokens += (size_t)k;
        if (!nl) break;
        i += len + 1;
    }
    cr_assert_geq(one_id, 3, "the hand-added whole-word tokens appear %zu times", one_id);
    cr_log_info("llama3: %zu lines, %zu tokens identical to tokenizers; encoded in %.3f s (%.1f MB/s)", line + 1,
                tokens, seconds, (double)tn / seconds / 1e6);
    free(ids);
    free(want);
    free(text);
    ct_bpe_free(b);
}
