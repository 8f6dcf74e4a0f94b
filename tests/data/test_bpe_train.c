/* Tests for data/bpe_train*.c. Two independent references: tiny corpora whose
 * merges are worked out by hand below, and Hugging Face `tokenizers`
 * (tests/data/bpe_oracle.sh), whose BpeTrainer learns on the fortunes corpus with
 * the same settings: its vocabulary and merges must be ctrain's, and it must load
 * ctrain's tokenizer.json and encode every line as ctrain does.
 *
 * Ids by hand: with k special tokens the byte tokens follow in the order of their
 * characters' code points, so the character with code point c in 33..126 has id
 * k + c - 33 ("a" = k + 64, "c" = k + 66), "Ġ" (the space, U+0120) has k + 220 and
 * "Ċ" ("\n", U+010A) has k + 198, as in GPT-2's vocabulary. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "data/bpe.h"
#include "data/bpe_train.h"
#include "tests/data/fortunes.h"
#include "tests/tmpdir.h"

static void make_tmpdir(void) { make_tmpdir_with("/tmp/ct_bpetrain_"); }

TestSuite(bpe_train, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 30);

/* Trains on the sequences texts[0..n) and returns the parsed tokenizer.json. */
static cJSON *train_texts(const char *const *texts, size_t n, int64_t vocab_size, int64_t min_frequency,
                          const char *const *specials, size_t nspecial)
{
    ct_bpe_train_config cfg = {.vocab_size = vocab_size,
                               .min_frequency = min_frequency,
                               .special_tokens = specials,
                               .nspecial = nspecial};
    ct_bpe_trainer *t = ct_bpe_trainer_new(&cfg);
    cr_assert_not_null(t, "%s", ct_last_error());
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ct_bpe_trainer_feed(t, texts[i], strlen(texts[i])), CT_OK, "%s", ct_last_error());
    size_t len = 0;
    char *json = ct_bpe_trainer_json(t, &len);
    cr_assert_not_null(json, "%s", ct_last_error());
    cr_assert_eq(strlen(json), len);
    cJSON *root = cJSON_Parse(json);
    cr_assert_not_null(root);
    free(json);
    ct_bpe_trainer_free(t);
    return root;
}

static const cJSON *model_item(const cJSON *root, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), key);
}

/* merges: "left right" strings, in order */
static void expect_merges(const cJSON *root, const char *const *want, int n)
{
    const cJSON *merges = model_item(root, "merges");
    cr_assert_eq(cJSON_GetArraySize(merges), n, "%d merges, want %d", cJSON_GetArraySize(merges), n);
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(merges, i);
        char got[64];
        snprintf(got, sizeof got, "%s %s", cJSON_GetArrayItem(m, 0)->valuestring, cJSON_GetArrayItem(m, 1)->valuestring);
        cr_assert_str_eq(got, want[i], "merge %d", i);
    }
}

static int64_t vocab_id(const cJSON *root, const char *token)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model_item(root, "vocab"), token);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

static int vocab_count(const cJSON *root) { return cJSON_GetArraySize(model_item(root, "vocab")); }

/* Pieces "ab", " ab", " cd", " cd". Pairs: a b 2, c d 2, Ġ c 2, Ġ a 1.
 *   1. the counts tie at 2: (a, b) = (64, 65) is the smallest pair -> ab 256;
 *      " ab" becomes Ġ ab (Ġ a -1, Ġ ab +1)
 *   2. c d = (66, 67) beats Ġ c = (220, 66) -> cd 257; Ġ c drops to 0, Ġ cd is 2
 *   3. Ġ cd (2) -> Ġcd 258
 *   4. Ġ ab (1) -> Ġab 259; no pair is left. */
static const char *const ABCD[] = {"ab ab cd cd"};

Test(bpe_train, ties_and_order)
{
    cJSON *root = train_texts(ABCD, 1, 1000, 0, NULL, 0);
    expect_merges(root, (const char *[]){"a b", "c d", "Ġ cd", "Ġ ab"}, 4);
    cr_assert_eq(vocab_count(root), 260);
    cr_assert_eq(vocab_id(root, "!"), 0);
    cr_assert_eq(vocab_id(root, "a"), 64);
    cr_assert_eq(vocab_id(root, "Ġ"), 220);
    cr_assert_eq(vocab_id(root, "Ċ"), 198);
    cr_assert_eq(vocab_id(root, "ÿ"), 187);
    cr_assert_eq(vocab_id(root, "Ń"), 255); /* byte 0xAD, the last of the remapped ones */
    cr_assert_eq(vocab_id(root, "ab"), 256);
    cr_assert_eq(vocab_id(root, "cd"), 257);
    cr_assert_eq(vocab_id(root, "Ġcd"), 258);
    cr_assert_eq(vocab_id(root, "Ġab"), 259);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(root, "added_tokens")), 0);
    cJSON_Delete(root);
}

Test(bpe_train, min_frequency_and_vocab_size)
{
    /* Ġ ab occurs once: min_frequency 2 stops before it */
    cJSON *root = train_texts(ABCD, 1, 1000, 2, NULL, 0);
    expect_merges(root, (const char *[]){"a b", "c d", "Ġ cd"}, 3);
    cr_assert_eq(vocab_count(root), 259);
    cJSON_Delete(root);
    /* 257 tokens: the bytes and one merge */
    root = train_texts(ABCD, 1, 257, 0, NULL, 0);
    expect_merges(root, (const char *[]){"a b"}, 1);
    cJSON_Delete(root);
    root = train_texts(ABCD, 1, 256, 0, NULL, 0);
    expect_merges(root, NULL, 0);
    cr_assert_eq(vocab_count(root), 256);
    cJSON_Delete(root);
}

/* Specials take 0 and 1 (the repeated one once); "a" is 66. The merge c d makes
 * "cd", the special token 1: the id is reused and the vocabulary does not grow,
 * so the same vocab_size holds one more merge. */
Test(bpe_train, special_tokens)
{
    const char *const sp[] = {"<|endoftext|>", "cd", "<|endoftext|>"};
    cJSON *root = train_texts(ABCD, 1, 1000, 0, sp, 3);
    expect_merges(root, (const char *[]){"a b", "c d", "Ġ cd", "Ġ ab"}, 4);
    cr_assert_eq(vocab_count(root), 261);
    cr_assert_eq(vocab_id(root, "<|endoftext|>"), 0);
    cr_assert_eq(vocab_id(root, "cd"), 1);
    cr_assert_eq(vocab_id(root, "!"), 2);
    cr_assert_eq(vocab_id(root, "a"), 66);
    cr_assert_eq(vocab_id(root, "ab"), 258);
    cr_assert_eq(vocab_id(root, "Ġcd"), 259);
    cr_assert_eq(vocab_id(root, "Ġab"), 260);
    const cJSON *added = cJSON_GetObjectItem(root, "added_tokens");
    cr_assert_eq(cJSON_GetArraySize(added), 2);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 1), "content")->valuestring, "cd");
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 1), "id")->valueint, 1);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 1), "special")));
    cJSON_Delete(root);
}

/* "aaaa" and " aaa": a a occurs 3 + 2 = 5 times -> aa 256. Left to right, aaaa is
 * aa aa and Ġaaa is Ġ aa a. Then Ġ aa, aa aa and aa a (its count went +1 -1 +1)
 * tie at 1; (Ġ, aa) = (220, 256) is the smallest -> Ġaa 257, and Ġaa a takes the
 * last a, so aa a, popped next, is stale (0) and goes back; aa aa -> 258,
 * Ġaa a -> 259; then aa a (0) ends it. */
Test(bpe_train, overlapping_pairs)
{
    cJSON *root = train_texts((const char *[]){"aaaa aaa"}, 1, 1000, 0, NULL, 0);
    expect_merges(root, (const char *[]){"a a", "Ġ aa", "aa aa", "Ġaa a"}, 4);
    cr_assert_eq(vocab_id(root, "Ġaaa"), 259);
    cJSON_Delete(root);
}

/* Sequences are pre-tokenised separately: "a \nb" whole is "a", " ", "\n", "b"
 * (\s+(?!\S) leaves the "\n"), no pair; as the lines "a \n" and "b" it is "a",
 * " \n", "b": one pair, Ġ Ċ. A file is read line by line. */
Test(bpe_train, lines_of_files)
{
    cJSON *root = train_texts((const char *[]){"a \nb"}, 1, 1000, 0, NULL, 0);
    expect_merges(root, NULL, 0);
    cJSON_Delete(root);
    root = train_texts((const char *[]){"a \n", "b"}, 2, 1000, 0, NULL, 0);
    expect_merges(root, (const char *[]){"Ġ Ċ"}, 1);
    cJSON_Delete(root);

    FILE *fp = fopen(path_of("t.txt"), "wb");
    fputs("a \nb", fp);
    fclose(fp);
    ct_bpe_train_config cfg = {.vocab_size = 1000};
    cr_assert_eq(ct_bpe_train(&cfg, (const char *[]){path_of("t.txt")}, 1, path_of("tok.json")), CT_OK, "%s",
                 ct_last_error());
    size_t n;
    char *json = (char *)read_all(path_of("tok.json"), &n);
    root = cJSON_Parse(json);
    free(json);
    expect_merges(root, (const char *[]){"Ġ Ċ"}, 1);
    cJSON_Delete(root);
}

/* The written tokenizer.json is read back by ct_bpe_load and encodes with the
 * learned merges; nothing is left beside it. */
Test(bpe_train, load_and_encode)
{
    FILE *fp = fopen(path_of("t.txt"), "wb");
    fputs("ab ab cd cd\n", fp);
    fclose(fp);
    const char *const sp[] = {"<|endoftext|>"};
    ct_bpe_train_config cfg = {.vocab_size = 1000, .special_tokens = sp, .nspecial = 1};
    cr_assert_eq(ct_bpe_train(&cfg, (const char *[]){path_of("t.txt")}, 1, path_of("tok.json")), CT_OK, "%s",
                 ct_last_error());
    ct_bpe *b = ct_bpe_load(path_of("tok.json"));
    cr_assert_not_null(b, "%s", ct_last_error());
    /* ab 257, cd 258, Ġcd 259, Ġab 260; "Ċ" 199 */
    cr_assert_eq(ct_bpe_vocab_size(b), 261);
    cr_assert_eq(ct_bpe_merge_count(b), 4);
    cr_assert_eq(ct_bpe_eos_id(b), 0);
    uint32_t *ids = NULL;
    size_t cap = 0;
    const char text[] = "ab cd<|endoftext|> ab\n";
    cr_assert_eq(ct_bpe_encode(b, text, sizeof text - 1, &ids, &cap), 5);
    const uint32_t want[] = {257, 259, 0, 260, 199};
    for (int i = 0; i < 5; i++) cr_assert_eq(ids[i], want[i], "id %d: %u, want %u", i, ids[i], want[i]);
    free(ids);
    ct_bpe_free(b);
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) files += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(files, 2, "a temporary file was left beside tok.json");
}

/* Special tokens whose text is not in the byte-level alphabet (a space, a
 * character past U+00FF) are in the model's vocabulary as tokenizers writes it, and
 * ct_bpe_load takes them as added tokens only. */
Test(bpe_train, special_tokens_outside_the_alphabet)
{
    FILE *fp = fopen(path_of("t.txt"), "wb");
    fputs("ab ab\n", fp);
    fclose(fp);
    const char *const sp[] = {"<my token>", "\xe2\x82\xac"}; /* U+20AC */
    ct_bpe_train_config cfg = {.vocab_size = 1000, .special_tokens = sp, .nspecial = 2};
    cr_assert_eq(ct_bpe_train(&cfg, (const char *[]){path_of("t.txt")}, 1, path_of("tok.json")), CT_OK, "%s",
                 ct_last_error());
    ct_bpe *b = ct_bpe_load(path_of("tok.json"));
    cr_assert_not_null(b, "%s", ct_last_error());
    /* ab 258, Ġab 259 (Ġ a: a = 66) */
    uint32_t *ids = NULL;
    size_t cap = 0;
    const char text[] = "ab<my token> ab\xe2\x82\xac";
    cr_assert_eq(ct_bpe_encode(b, text, sizeof text - 1, &ids, &cap), 4, "%s", ct_last_error());
    const uint32_t want[] = {258, 0, 259, 1};
    for (int i = 0; i < 4; i++) cr_assert_eq(ids[i], want[i], "id %d: %u, want %u", i, ids[i], want[i]);
    char back[64];
    cr_assert_eq(ct_bpe_decode(b, ids, 4, back, sizeof back), (int64_t)sizeof text - 1);
    cr_assert_str_eq(back, text);
    free(ids);
    ct_bpe_free(b);
}

Test(bpe_train, bad_settings)
{
    const char *const sp[] = {"<s>", ""};
    struct {
        ct_bpe_train_config cfg;
        const char *says;
    } cases[] = {
        {{.vocab_size = 255}, "vocab_size is 255"},
        {{.vocab_size = 256, .special_tokens = sp, .nspecial = 1}, "[257,"},
        {{.vocab_size = 300, .min_frequency = -1}, "min_frequency is -1"},
        {{.vocab_size = 300, .special_tokens = sp, .nspecial = 2}, "special token 1 is empty"},
        {{.vocab_size = 300, .special_tokens = (const char *[]){"\xff"}, .nspecial = 1}, "not valid UTF-8"},
        {{.vocab_size = 300, .nspecial = 1}, "special_tokens is NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_null(ct_bpe_trainer_new(&cases[i].cfg), "case %zu", i);
        cr_assert_eq(ct_last_status(), CT_ERR_INVALID);
        cr_assert(strstr(ct_last_error(), cases[i].says), "case %zu: '%s' does not say '%s'", i, ct_last_error(),
                  cases[i].says);
    }
    cr_assert_null(ct_bpe_trainer_new(NULL));

    ct_bpe_trainer *t = ct_bpe_trainer_new(&(ct_bpe_train_config){.vocab_size = 300});
    cr_assert_eq(ct_bpe_trainer_feed_file(t, path_of("missing.txt")), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), "missing.txt"), "%s", ct_last_error());
    cr_assert_eq(ct_bpe_trainer_feed_file(t, tmpdir), CT_ERR_INVALID); /* a directory */
    cr_assert_eq(ct_bpe_trainer_feed(t, NULL, 3), CT_ERR_INVALID);
    cr_assert_eq(ct_bpe_trainer_feed(t, "ab", 2), CT_OK);
    char *json = ct_bpe_trainer_json(t, NULL);
    cr_assert_not_null(json);
    free(json);
    cr_assert_eq(ct_bpe_trainer_merge_count(t), 1);
    cr_assert_eq(ct_bpe_trainer_feed(t, "ab", 2), CT_ERR_INVALID, "fed after training");
    cr_assert(strstr(ct_last_error(), "already"), "%s", ct_last_error());
    /* a second call gives the same text */
    json = ct_bpe_trainer_json(t, NULL);
    cr_assert_not_null(json);
    free(json);
    ct_bpe_trainer_free(t);

    /* an output directory that does not exist: an error, no file */
    cr_assert_neq(ct_bpe_train(&(ct_bpe_train_config){.vocab_size = 300}, NULL, 0, path_of("no/such/dir/tok.json")),
                  CT_OK);
    cr_assert(strstr(ct_last_error(), "no/such/dir"), "%s", ct_last_error());
}

/* invalid UTF-8 (tokenizers refuses it): each run of bad bytes is a word */
Test(bpe_train, invalid_utf8)
{
    cJSON *root = train_texts((const char *[]){"\xff\xfe \xff\xfe"}, 1, 1000, 0, NULL, 0);
    /* pieces "\xff\xfe", " ", "\xff\xfe": ÿ þ twice */
    expect_merges(root, (const char *[]){"ÿ þ"}, 1);
    cJSON_Delete(root);
}

/* ---- the Hugging Face oracle ------------------------------------------------ */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* merge i as "a b", whichever form the file has */
static void merge_text(const cJSON *m, char *out, size_t cap)
{
    if (cJSON_IsString(m)) snprintf(out, cap, "%s", m->valuestring);
    else snprintf(out, cap, "%s %s", cJSON_GetArrayItem(m, 0)->valuestring, cJSON_GetArrayItem(m, 1)->valuestring);
}

static cJSON *parse_file(const char *path)
{
    size_t n;
    char *text = (char *)read_all(path, &n);
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    cr_assert_not_null(root, "%s is not JSON", path);
    return root;
}

/* ctrain's and tokenizers' tokenizer.json: the same vocabulary, merges and added
 * tokens */
static void compare_models(const char *ct_path, const char *hf_path)
{
    cJSON *ct = parse_file(ct_path), *hf = parse_file(hf_path);
    const cJSON *cv = model_item(ct, "vocab"), *hv = model_item(hf, "vocab"), *e;
    cr_assert_eq(cJSON_GetArraySize(cv), cJSON_GetArraySize(hv), "vocabulary: ctrain %d tokens, tokenizers %d",
                 cJSON_GetArraySize(cv), cJSON_GetArraySize(hv));
    cJSON_ArrayForEach(e, hv)
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(cv, e->string);
        cr_assert(c && c->valuedouble == e->valuedouble, "token '%s': tokenizers id %d, ctrain %s%d", e->string,
                  e->valueint, c ? "" : "none ", c ? c->valueint : 0);
    }
    const cJSON *cm = model_item(ct, "merges"), *hm = model_item(hf, "merges");
    cr_assert_eq(cJSON_GetArraySize(cm), cJSON_GetArraySize(hm), "merges: ctrain %d, tokenizers %d",
                 cJSON_GetArraySize(cm), cJSON_GetArraySize(hm));
    for (int i = 0; i < cJSON_GetArraySize(hm); i++) {
        char a[256], b[256];
        merge_text(cJSON_GetArrayItem(cm, i), a, sizeof a);
        merge_text(cJSON_GetArrayItem(hm, i), b, sizeof b);
        cr_assert_str_eq(a, b, "merge %d: ctrain '%s', tokenizers '%s'", i, a, b);
    }
    const cJSON *ca = cJSON_GetObjectItem(ct, "added_tokens"), *ha = cJSON_GetObjectItem(hf, "added_tokens");
    cr_assert_eq(cJSON_GetArraySize(ca), cJSON_GetArraySize(ha));
    for (int i = 0; i < cJSON_GetArraySize(ha); i++) {
        cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ca, i), "content")->valuestring,
                         cJSON_GetObjectItem(cJSON_GetArrayItem(ha, i), "content")->valuestring);
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ca, i), "id")->valueint,
                     cJSON_GetObjectItem(cJSON_GetArrayItem(ha, i), "id")->valueint);
    }
    cJSON_Delete(ct);
    cJSON_Delete(hf);
}

/* ctrain's encoding of every line of text (split at "\n") with b against
 * tokenizers' encoding, with the same tokenizer.json, in ids_txt */
static void compare_lines(ct_bpe *b, const uint8_t *text, size_t n, const char *ids_txt)
{
    uint32_t *ids = NULL;
    size_t cap = 0, line = 0;
    const char *want = ids_txt;
    for (size_t i = 0; i <= n; line++) {
        const uint8_t *nl = i < n ? memchr(text + i, '\n', n - i) : NULL;
        size_t len = nl ? (size_t)(nl - (text + i)) : n - i;
        int64_t k = ct_bpe_encode(b, text + i, len, &ids, &cap);
        cr_assert_geq(k, 0, "line %zu: %s", line + 1, ct_last_error());
        const char *eol = strchr(want, '\n');
        cr_assert_not_null(eol, "ct_ids.txt ends before line %zu", line + 1);
        char *p = (char *)want;
        for (int64_t t = 0; t < k; t++) {
            char *q;
            unsigned long v = strtoul(p, &q, 10);
            cr_assert(q != p && q <= eol && v == ids[t], "line %zu ('%.*s'), token %lld: ctrain %u, tokenizers %.*s",
                      line + 1, (int)len, text + i, (long long)t, ids[t], (int)(eol - want), want);
            p = q;
        }
        while (*p == ' ') p++;
        cr_assert_eq(p, eol, "line %zu ('%.*s'): tokenizers has more tokens: %.*s", line + 1, (int)len, text + i,
                     (int)(eol - want), want);
        want = eol + 1;
        if (!nl) break;
        i += len + 1;
    }
    free(ids);
}

/* lines that exercise the regex and the byte map beyond the corpus */
static const char *const EXTRA[] = {
    "naïve café — “quotes” ½ 中文字符 🙂🙂 emoji",
    "tabs\tand\t\tspaces    and   runs\r",
    "numbers 1234567 3.14159 and it's we'll they'd I'm",
    "    leading spaces, trailing spaces    ",
};

static void oracle(int64_t vocab_size, int64_t min_frequency, const char *specials)
{
    const char *src = getenv("CTRAIN_SRC");
    if (!src || !*src) cr_skip_test("CTRAIN_SRC is not set: run through `make test`");
    FILE *out = fopen(path_of("text.txt"), "wb");
    cr_assert_not_null(out);
    size_t lines = fortunes_append(out);
    for (size_t i = 0; i < sizeof EXTRA / sizeof *EXTRA; i++) fprintf(out, "%s\n", EXTRA[i]);
    fclose(out);
    if (!lines) cr_skip_test("no fortunes corpus in " FORTUNES " (Debian's fortunes package; tools/setup.sh)");

    /* the specials, split at "," */
    char buf[256], *sp[8];
    size_t nsp = 0;
    snprintf(buf, sizeof buf, "%s", specials);
    for (char *s = strtok(buf, ","); s && nsp < 8; s = strtok(NULL, ",")) sp[nsp++] = s;
    ct_bpe_train_config cfg = {.vocab_size = vocab_size,
                               .min_frequency = min_frequency,
                               .special_tokens = (const char *const *)sp,
                               .nspecial = nsp};
    double t0 = now();
    ct_status st = ct_bpe_train(&cfg, (const char *[]){path_of("text.txt")}, 1, path_of("ct.json"));
    double ct_seconds = now() - t0;
    cr_assert_eq(st, CT_OK, "%s", ct_last_error());

    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "timeout 500 bash '%s/tests/data/bpe_oracle.sh' '%s' '%s' '%s' train '%s' %lld %lld '%s' 2>'%s'", src,
             bpe_venv_dir(), tmpdir, path_of("text.txt"), path_of("ct.json"), (long long)vocab_size,
             (long long)min_frequency, specials, path_of("oracle.err"));
    int rc = system(cmd);
    size_t n;
    char *err = (char *)read_all(path_of("oracle.err"), &n);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) cr_skip_test("Hugging Face tokenizers is not available: %s", err);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "bpe_oracle.sh failed (status %d): %s", rc, err);
    free(err);

    compare_models(path_of("ct.json"), path_of("hf_train.json"));
    uint8_t *text = read_all(path_of("text.txt"), &n);
    size_t tn = n;
    char *ids = (char *)read_all(path_of("ct_ids.txt"), &n);
    ct_bpe *b = ct_bpe_load(path_of("ct.json"));
    cr_assert_not_null(b, "%s", ct_last_error());
    compare_lines(b, text, tn, ids);
    ct_bpe_free(b);
    char *hf_seconds = (char *)read_all(path_of("hf_train_seconds.txt"), &n);
    cr_log_info("vocab_size %lld, min_frequency %lld, specials '%s': %zu lines; vocabulary and merges identical to "
                "tokenizers; trained in %.3f s (tokenizers, one thread: %.3f s); tokenizers encodes ctrain's "
                "tokenizer.json as ctrain does",
                (long long)vocab_size, (long long)min_frequency, specials, lines, ct_seconds, atof(hf_seconds));
    free(hf_seconds);
    free(text);
    free(ids);
}

Test(bpe_train, hugging_face_oracle, .timeout = 600) { oracle(3000, 0, "<|endoftext|>"); }

/* specials that merges make again ("the", "in": their ids are reused) and a
 * minimum frequency that ends the merges before vocab_size */
Test(bpe_train, hugging_face_oracle_specials, .timeout = 600) { oracle(20000, 40, "<|endoftext|>,<pad>,the,in"); }
