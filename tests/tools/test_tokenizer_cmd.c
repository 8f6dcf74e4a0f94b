/* Tests for `ctrain tokenizer train|encode` (tools/tokenizer_cmd.c), run as a
 * program (CTRAIN_BIN; make test sets it): training writes DIR/tokenizer.json with
 * the merges worked out by hand, encode writes the llm.c file of the hand-computed ids, and each
 * usage error exits 2 with a message naming the problem. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/shell.h"
#include "tests/tmpdir.h"

static void make_tmpdir(void) { make_tmpdir_with("/tmp/ct_tokcmd_"); }

TestSuite(tokenizer_cmd, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 60);

static char out[1 << 16];

/* `ctrain tokenizer ARGS` under a time limit; stdout and stderr into out */
static int run(const char *args)
{
    const char *bin = getenv("CTRAIN_BIN");
    if (!bin || !*bin) cr_skip_test("CTRAIN_BIN is not set (make test sets it)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 50 '%s' tokenizer %s 2>&1", tmpdir, bin, args);
    return shell_capture(cmd, out, sizeof out);
}

static void assert_has(const char *needle) { cr_assert(strstr(out, needle), "expected '%s' in:\n%s", needle, out); }

static void write_text(const char *name, const char *text)
{
    FILE *fp = fopen(path_of(name), "wb");
    cr_assert_not_null(fp);
    fputs(text, fp);
    fclose(fp);
}

Test(tokenizer_cmd, train_and_encode)
{
    write_text("a.txt", "ab ab\n");
    write_text("b.txt", "cd cd\n");
    /* Pieces "ab", " ab", "\n", "cd", " cd", "\n"; specials 0, 1, "a" = 66, "Ċ" (\n)
     * = 200. a b and c d occur twice: ab 258, cd 259; then Ġ ab and Ġ cd tie at
     * once each and (Ġ, ab) is the smaller pair: Ġab 260, Ġcd 261. */
    cr_assert_eq(run("train --vocab_size 1000 --special_tokens '<|endoftext|>,<pad>' --output out/tok a.txt b.txt"), 0,
                 "%s", out);
    assert_has("trained 262 tokens (2 special, 256 bytes, 4 merges) on 2 files");
    size_t n;
    char *json = (char *)read_all(path_of("out/tok/tokenizer.json"), &n);
    cJSON *root = cJSON_Parse(json);
    free(json);
    cr_assert_not_null(root);
    const cJSON *model = cJSON_GetObjectItem(root, "model");
    const cJSON *merges = cJSON_GetObjectItem(model, "merges");
    cr_assert_eq(cJSON_GetArraySize(merges), 4);
    static const char *const want[4][2] = {{"a", "b"}, {"c", "d"}, {"Ġ", "ab"}, {"Ġ", "cd"}};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 2; k++)
            cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(merges, i), k)->valuestring, want[i][k]);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(model, "vocab"), "<pad>")->valueint, 1);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(model, "vocab"), "Ġab")->valueint, 260);
    cJSON_Delete(root);

    /* the same with --flag=value and min_frequency 2: Ġ ab and Ġ cd (once) are not merged */
    cr_assert_eq(run("train --vocab_size=1000 --min_frequency=2 --output=out2 a.txt b.txt"), 0, "%s", out);
    assert_has("2 merges");

    /* <|endoftext|> before each file: 0, ab, Ġab, Ċ, 0, cd, Ġcd, Ċ */
    cr_assert_eq(run("encode --tokenizer out/tok/tokenizer.json --separator '<|endoftext|>' --output x.bin "
                     "a.txt b.txt"),
                 0, "%s", out);
    assert_has("into 8 tokens");
    uint8_t *bin = read_all(path_of("x.bin"), &n);
    cr_assert_eq(n, 256 * 4 + 8 * 2);
    int32_t hdr[3];
    memcpy(hdr, bin, sizeof hdr);
    cr_assert_eq(hdr[0], 20240520);
    cr_assert_eq(hdr[1], 1);
    cr_assert_eq(hdr[2], 8);
    const uint16_t ids[8] = {0, 258, 260, 200, 0, 259, 261, 200};
    for (int i = 0; i < 8; i++) {
        uint16_t v;
        memcpy(&v, bin + 256 * 4 + 2 * i, 2);
        cr_assert_eq(v, ids[i], "token %d: %u, want %u", i, v, ids[i]);
    }
    free(bin);
}

Test(tokenizer_cmd, usage_errors)
{
    write_text("a.txt", "ab ab\n");
    static const struct {
        const char *args, *says;
    } cases[] = {
        {"train --output o a.txt", "--vocab_size is required"},
        {"train --vocab_size 300 a.txt", "--output is required"},
        {"train --vocab_size 30x --output o a.txt", "--vocab_size '30x' is not a whole number"},
        {"train --vocab_size 300 --min_frequency -1 --output o a.txt", "--min_frequency '-1'"},
        {"train --vocab_size 257 --special_tokens a,b --output o a.txt", "--vocab_size 257 is too small"},
        {"train --vocab_size 300 --special_tokens a,,b --output o a.txt", "empty token"},
        {"train --vocab_size 300 --output o missing.txt", "input 'missing.txt'"},
        {"train --vocab_size 300 --output o", "no input FILE"},
        {"train --vocab_size 300 --output o --bogus a.txt", "unknown flag '--bogus'"},
        {"train --vocab_size", "--vocab_size needs a value"},
        {"encode --output x.bin a.txt", "--tokenizer is required"},
        {"encode --tokenizer nope.json --output x.bin a.txt", "input 'nope.json'"},
        {"frobnicate", "unknown action 'frobnicate'"},
        {"", "usage: ctrain tokenizer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_eq(run(cases[i].args), 2, "'%s' exits %d:\n%s", cases[i].args, run(cases[i].args), out);
        assert_has(cases[i].says);
    }
    struct stat sb;
    cr_assert_neq(stat(path_of("o"), &sb), 0, "a failed run created its output directory");

    /* a tokenizer.json that is not one, and a separator that is not a token: exit 1 / 2 */
    cr_assert_eq(run("encode --tokenizer a.txt --output x.bin a.txt"), 1, "%s", out);
    assert_has("a.txt");
    cr_assert_eq(run("train --vocab_size 300 --output t a.txt"), 0, "%s", out);
    cr_assert_eq(run("encode --tokenizer t/tokenizer.json --separator '<nope>' --output x.bin a.txt"), 2, "%s", out);
    assert_has("--separator '<nope>' is not a token");
    cr_assert_eq(run("--help"), 0);
    assert_has("ctrain tokenizer train");
}
