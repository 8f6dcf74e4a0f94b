/* Tests for `ctrain generate` (tools/generate_cmd.c), run as a program (CTRAIN_BIN)
 * on tiny random GPTs saved with ct_gpt_save_hf: with byte tokens and with a
 * tokenizer.json, the bytes printed are the prompt and then the tokens of a greedy
 * loop over the full forward written here; sampling is repeatable by seed and the
 * same without the cache; bad flags, numbers, directories and prompts exit 2. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/philox.h"
#include "data/bpe.h"
#include "nn/gpt.h"
#include "tests/shell.h"
#include "tests/tmpdir.h"

static const char *bin_or_skip(void)
{
    const char *v = getenv("CTRAIN_BIN");
    if (!v || !*v) cr_skip_test("CTRAIN_BIN is not set (make test sets it)");
    return v;
}

static char out[1 << 16], err[1 << 14];
static size_t out_n;

/* `ctrain generate ARGS` under a time limit: stdout (bytes, out_n of them) into out,
 * stderr into err; the exit status */
static int run_generate(const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout 60 %s generate %s 2>%s", bin_or_skip(), args, path_of("stderr"));
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    out_n = fread(out, 1, sizeof out - 1, p);
    out[out_n] = 0;
    int st = shell_status(pclose(p));
    size_t n;
    uint8_t *e = read_all(path_of("stderr"), &n);
    snprintf(err, sizeof err, "%s", (char *)e);
    free(e);
    return st;
}

static void assert_err_has(const char *needle)
{
    cr_assert(strstr(err, needle), "stderr lacks '%s':\n%s", needle, err);
}

/* a random GPT of vocab V saved under tmpdir/name; the model stays for the reference */
static ct_gpt *save_model(const char *name, int64_t V)
{
    ct_set_seed(9);
    ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = V, .block_size = 24, .n_layer = 2, .n_head = 2, .n_embd = 16});
    cr_assert_not_null(m);
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    ct_rng r;
    ct_rng_init(&r, 21);
    for (int i = 0; i < l.n; i++)
        ct_rng_normal_f32(&r, ct_tensor_data(l.tensors[i]), ct_tensor_numel(l.tensors[i]), 0.0f,
                          strcmp(l.names[i], "wpe.weight") ? 0.5f : 2.0f);
    ct_param_list_free(&l);
    ct_module_train(&m->base, false);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", path_of(name));
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(ct_gpt_save_hf(m, path_of(name)), CT_OK, "%s", ct_last_error());
    return m;
}

/* greedy decoding by hand: the full forward of the context, argmax of its last row */
static void greedy(ct_gpt *m, int64_t *ids, int64_t n, int64_t steps)
{
    bool grad = ct_grad_set_enabled(false);
    for (int64_t k = 0; k < steps; k++) CT_FRAME {
            ct_tensor *lg = ct_gpt_forward(m, ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, n + k), ids));
            const float *row = (const float *)ct_tensor_data(lg) + (n + k - 1) * m->cfg.vocab_size;
            int64_t best = 0;
            for (int64_t v = 1; v < m->cfg.vocab_size; v++)
                if (row[v] > row[best]) best = v;
            ids[n + k] = best;
        }
    ct_grad_set_enabled(grad);
}

static void setup(void) { make_tmpdir_with("/tmp/ct_gencmd_"); }

Test(generate_cmd, byte_tokens_greedy_prints_the_reference_bytes, .init = setup, .fini = remove_tmpdir, .timeout = 120)
{
    ct_gpt *m = save_model("bytes", 256);
    int64_t ids[24] = {'H', 'i', ' '};
    greedy(m, ids, 3, 12);
    char args[512];
    snprintf(args, sizeof args, "--model %s --prompt 'Hi ' --greedy --max_new_tokens 12", path_of("bytes"));
    cr_assert_eq(run_generate(args), 0, "%s", err);
    /* the prompt, 12 bytes, a newline: the model has no end-of-text token */
    cr_assert_eq(out_n, 3 + 12 + 1, "%zu bytes: %s", out_n, err);
    for (int i = 0; i < 15; i++) cr_assert_eq((unsigned char)out[i], ids[i], "byte %d", i);
    cr_assert_eq(out[15], '\n');
    assert_err_has("3 prompt tokens, 12 new tokens in");
    assert_err_has("tokens/s");
    /* the same without the cache */
    snprintf(args, sizeof args, "--model=%s --prompt 'Hi ' --greedy --max_new_tokens=12 --no_cache", path_of("bytes"));
    cr_assert_eq(run_generate(args), 0, "%s", err);
    cr_assert_eq(out_n, 16);
    for (int i = 0; i < 15; i++) cr_assert_eq((unsigned char)out[i], ids[i], "byte %d without the cache", i);
    ct_module_free(&m->base);
}

Test(generate_cmd, sampling_repeats_by_seed_with_and_without_cache, .init = setup, .fini = remove_tmpdir,
     .timeout = 120)
{
    ct_gpt *m = save_model("bytes", 256);
    ct_module_free(&m->base);
    char args[512], first[64];
    snprintf(args, sizeof args, "--model %s --prompt ab --max_new_tokens 20 --seed 7 --temperature 1.3 --top_k 50 "
             "--top_p 0.95", path_of("bytes"));
    cr_assert_eq(run_generate(args), 0, "%s", err);
    cr_assert_eq(out_n, 23);
    memcpy(first, out, out_n);
    cr_assert_eq(run_generate(args), 0, "%s", err);
    cr_assert_eq(memcmp(first, out, 23), 0, "the same seed gave another text");
    strcat(args, " --no_cache");
    cr_assert_eq(run_generate(args), 0, "%s", err);
    cr_assert_eq(memcmp(first, out, 23), 0, "the cache changed the sampled text");
    snprintf(args, sizeof args, "--model %s --prompt ab --max_new_tokens 20 --seed 8 --temperature 1.3",
             path_of("bytes"));
    cr_assert_eq(run_generate(args), 0, "%s", err);
    cr_assert_neq(memcmp(first, out, 23), 0, "seeds 7 and 8 gave the same text");
}

/* GPT-2's byte-to-unicode map: the printable bytes stand for themselves, the others
 * for U+0100 onwards, in byte order; the char's UTF-8 into s */
static void byte_char(int b, char *s)
{
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = b;
    if (!printable) {
        int k = 0;
        for (int c = 0; c < b; c++)
            if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) s[0] = (char)cp, s[1] = 0;
    else s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F)), s[2] = 0;
}

/* a tokenizer.json of the 256 bytes, one merge ("h" "e" -> 256) and <|endoftext|> (257) */
static void write_tokenizer(const char *path)
{
    cJSON *root = cJSON_CreateObject(), *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *eot = cJSON_CreateObject();
    cJSON_AddNumberToObject(eot, "id", 257);
    cJSON_AddStringToObject(eot, "content", "<|endoftext|>");
    cJSON_AddBoolToObject(eot, "special", 1);
    cJSON_AddItemToArray(added, eot);
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char s[4];
        byte_char(b, s);
        cJSON_AddNumberToObject(vocab, s, b);
    }
    cJSON_AddNumberToObject(vocab, "he", 256);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(model, "merges"), cJSON_CreateString("h e"));
    char *text = cJSON_Print(root);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    cJSON_free(text);
    cJSON_Delete(root);
}

Test(generate_cmd, a_tokenizer_json_encodes_and_decodes, .init = setup, .fini = remove_tmpdir, .timeout = 120)
{
    ct_gpt *m = save_model("bpe", 258);
    write_tokenizer(path_of("bpe/tokenizer.json"));
    ct_bpe *bpe = ct_bpe_load(path_of("bpe/tokenizer.json"));
    cr_assert_not_null(bpe, "%s", ct_last_error());
    const char *prompt = "hello \xc3\xa9t\xc3\xa9";
    uint32_t *u = NULL;
    size_t cap = 0;
    int64_t n = ct_bpe_encode(bpe, prompt, strlen(prompt), &u, &cap);
    cr_assert_eq(n, 10); /* he l l o | ' ' c3 a9 t c3 a9: "he" merged */
    int64_t ids[24];
    for (int64_t i = 0; i < n; i++) ids[i] = u[i];
    greedy(m, ids, n, 10);
    /* the reference text: the new tokens up to and including a first <|endoftext|> */
    int64_t made = 0;
    while (made < 10 && ids[n + made] != 257) made++;
    made += made < 10;
    uint32_t new_ids[10];
    for (int64_t i = 0; i < made; i++) new_ids[i] = (uint32_t)ids[n + i];
    char want[256];
    int64_t wn = ct_bpe_decode(bpe, new_ids, (size_t)made, want, sizeof want);
    cr_assert_geq(wn, 0);
    char args[512];
    snprintf(args, sizeof args, "--model %s --prompt '%s' --greedy --max_new_tokens 10", path_of("bpe"), prompt);
    cr_assert_eq(run_generate(args), 0, "%s", err);
    size_t pn = strlen(prompt);
    cr_assert_eq(out_n, pn + (size_t)wn + 1, "%zu bytes, want %zu: %s", out_n, pn + (size_t)wn + 1, err);
    cr_assert_eq(memcmp(out, prompt, pn), 0);
    cr_assert_eq(memcmp(out + pn, want, (size_t)wn), 0, "the generated bytes differ from the reference");
    /* --tokenizer names the file explicitly; the prompt from a file */
    FILE *f = fopen(path_of("prompt.txt"), "w");
    fputs(prompt, f);
    fclose(f);
    snprintf(args, sizeof args, "--model %s --tokenizer %s --prompt_file %s --greedy --max_new_tokens 10",
             path_of("bpe"), path_of("bpe/tokenizer.json"), path_of("prompt.txt"));
    cr_assert_eq(run_generate(args), 0, "%s", err);
    cr_assert_eq(memcmp(out + pn, want, (size_t)wn), 0);
    free(u);
    ct_bpe_free(bpe);
    ct_module_free(&m->base);
}

Test(generate_cmd, bad_input_exits_2, .init = setup, .fini = remove_tmpdir, .timeout = 120)
{
    ct_gpt *m = save_model("bytes", 256);
    ct_module_free(&m->base);
    m = save_model("v300", 300);
    ct_module_free(&m->base);
    char d[256]; /* path_of's results do not last */
    snprintf(d, sizeof d, "%s", path_of("bytes"));
    char args[1024];
    struct {
        const char *fmt, *needle;
    } cases[] = {
        {"--model %s/nope --prompt a", "cannot open --model"},
        {"--model %s --prompt a --temperature 0", "--temperature '0' is not a number > 0"},
        {"--model %s --prompt a --top_p 1.5", "--top_p '1.5' is not a number in (0, 1]"},
        {"--model %s --prompt a --max_new_tokens 3x", "--max_new_tokens '3x' is not a whole number"},
        {"--model %s --prompt a --top_k -1", "--top_k '-1'"},
        {"--model %s --prompt a --bogus 1", "unknown flag '--bogus'"},
        {"--model %s --prompt a --max_new_tokens", "--max_new_tokens needs a value"},
        {"--model %s", "give one of --prompt"},
        {"--prompt a", "--model DIR is missing"},
        {"--model %s --prompt 0123456789 --max_new_tokens 15", "the prompt's 10 tokens + --max_new_tokens 15 exceed "
                                                               "the model's 24 positions"},
        {"--model %s --prompt_file %s/none.txt", "--prompt_file: cannot open"},
        {"--model %s/../v300 --prompt a", "pass --tokenizer FILE"},
        {"--model %s/model.safetensors --prompt a", "is not a directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, cases[i].fmt, d, d); /* each %s is the model directory */
        cr_assert_eq(run_generate(args), 2, "ctrain generate %s: %s", args, err);
        assert_err_has(cases[i].needle);
    }
    /* a model type ctrain does not know */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sed -i 's/\"gpt2\"/\"mamba\"/' %s/config.json", d);
    cr_assert_eq(system(cmd), 0);
    snprintf(args, sizeof args, "--model %s --prompt a", d);
    cr_assert_eq(run_generate(args), 2, "%s", err);
    assert_err_has("model_type 'mamba' is not supported (supported: gpt2");
    cr_assert_eq(run_generate("--help"), 0);
    cr_assert(strstr(out, "usage: ctrain generate"), "%s", out);
}
