/* HuggingFace GPT-2 checkpoints: files laid out as HF writes them load with
 * ct_gpt_load (prefix, mask buffers, tied head), an untied head is refused
 * without touching the model, and ct_gpt_save_hf writes what HF's
 * from_pretrained reads (model.safetensors with format = pt, config.json). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "nn/gpt.h"
#include "tests/tmpdir.h"

static const ct_gpt_config tiny = {.vocab_size = 32, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 16};

static bool same_params(ct_gpt *a, ct_gpt *b)
{
    ct_param_list la, lb;
    cr_assert_eq(ct_module_named_tensors(&a->base, true, &la), CT_OK);
    cr_assert_eq(ct_module_named_tensors(&b->base, true, &lb), CT_OK);
    bool same = la.n == lb.n;
    for (int i = 0; same && i < la.n; i++)
        same = !memcmp(ct_tensor_data(la.tensors[i]), ct_tensor_data(lb.tensors[i]), ct_tensor_nbytes(la.tensors[i]));
    ct_param_list_free(&la);
    ct_param_list_free(&lb);
    return same;
}

/* Writes a's state dict as GPT2LMHeadModel.save_pretrained of an older
 * checkpoint would: "transformer." names, per-block mask buffers, and an
 * lm_head.weight equal to wte (head_delta = 0) or not. */
static void write_hf_style(ct_gpt *a, const char *path, float head_delta)
{
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&a->base, true, &l), CT_OK);
    int n = 0, cap = l.n + 2 * (int)tiny.n_layer + 1;
    char **names = calloc((size_t)cap, sizeof *names);
    ct_tensor **ts = calloc((size_t)cap, sizeof *ts);
    CT_FRAME {
        for (int i = 0; i < l.n; i++) {
            char buf[128];
            snprintf(buf, sizeof buf, "transformer.%s", l.names[i]);
            names[n] = strdup(buf), ts[n++] = l.tensors[i];
        }
        ct_tensor *mask = ct_tensor_zeros(CT_DTYPE_F32, 4, (int64_t[]){1, 1, 16, 16});
        ct_tensor *masked_bias = ct_tensor_scalar(CT_DTYPE_F32, -1e4);
        for (int b = 0; b < tiny.n_layer; b++) {
            char buf[64];
            snprintf(buf, sizeof buf, "transformer.h.%d.attn.bias", b);
            names[n] = strdup(buf), ts[n++] = mask;
            snprintf(buf, sizeof buf, "transformer.h.%d.attn.masked_bias", b);
            names[n] = strdup(buf), ts[n++] = masked_bias;
        }
        ct_tensor *head = ct_tensor_clone(ct_module_find(&a->base, "wte.weight"));
        ((float *)ct_tensor_data(head))[5] += head_delta;
        names[n] = strdup("lm_head.weight"), ts[n++] = head;
        cr_assert_eq(ct_safetensors_save(path, n, (const char *const *)names, ts, 1, (const char *[]){"format"},
                                         (const char *[]){"pt"}),
                     CT_OK, "%s", ct_last_error());
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(ts);
    ct_param_list_free(&l);
}

static void setup(void) { make_tmpdir_with("/tmp/ct_gpt_hf_"); }
TestSuite(gpt_hf, .init = setup, .fini = remove_tmpdir);

/* two tiny GPTs with different weights */
static void two_models(ct_gpt **a, ct_gpt **b)
{
    ct_set_seed(11);
    *a = ct_gpt_new(&tiny);
    ct_set_seed(12);
    *b = ct_gpt_new(&tiny);
    cr_assert(*a && *b, "%s", ct_last_error());
    cr_assert_not(same_params(*a, *b));
}

Test(gpt_hf, hf_layout_loads_with_prefix_mask_buffers_and_tied_head)
{
    const char *path = path_of("model.safetensors");
    ct_gpt *a, *b;
    two_models(&a, &b);
    write_hf_style(a, path, 0.0f);

    /* the generic loader sees the HF names as foreign and refuses */
    cr_assert_neq(ct_module_load(&b->base, path, true, NULL), CT_OK);
    cr_assert(strstr(ct_last_error(), "transformer.wte.weight"), "%s", ct_last_error());
    cr_assert(strstr(ct_last_error(), "missing keys (28)"), "%s", ct_last_error());
    cr_assert_not(same_params(a, b), "a refused strict load changes nothing");

    ct_load_report r;
    cr_assert_eq(ct_gpt_load(b, path, true, &r), CT_OK, "%s", ct_last_error());
    cr_assert_eq(r.nmissing + r.nunexpected + r.nmismatched, 0);
    ct_load_report_free(&r);
    cr_assert(same_params(a, b));
    ct_module_free(&a->base);
    ct_module_free(&b->base);
}

Test(gpt_hf, untied_head_is_refused_and_nothing_loads)
{
    const char *path = path_of("model.safetensors"), *copy = path_of("b.safetensors");
    ct_gpt *a, *b, *b0 = ct_gpt_new(&tiny);
    two_models(&a, &b);
    cr_assert_neq(ct_module_load(&b0->base, path, false, NULL), CT_OK, "no file yet");
    write_hf_style(a, path, 0.5f);
    /* b0: a copy of b to compare against after the refused load */
    cr_assert_eq(ct_module_save(&b->base, copy, 0, NULL, NULL), CT_OK);
    cr_assert_eq(ct_module_load(&b0->base, copy, true, NULL), CT_OK);

    cr_assert_neq(ct_gpt_load(b, path, false, NULL), CT_OK);
    const char *e = ct_last_error();
    cr_assert(strstr(e, "lm_head.weight") && strstr(e, "transformer.wte.weight") && strstr(e, "untied"), "%s", e);
    cr_assert(same_params(b, b0), "the refused load left the model as it was");
    cr_assert_neq(ct_gpt_load(b, "/nonexistent/model.safetensors", false, NULL), CT_OK);
    cr_assert(strstr(ct_last_error(), "/nonexistent/model.safetensors"), "%s", ct_last_error());
    ct_module_free(&a->base);
    ct_module_free(&b->base);
    ct_module_free(&b0->base);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

Test(gpt_hf, save_hf_writes_config_and_format_metadata)
{
    ct_gpt *a, *b;
    two_models(&a, &b);
    cr_assert_eq(ct_gpt_save_hf(a, tmpdir), CT_OK, "%s", ct_last_error());

    cJSON *j = cJSON_Parse(slurp(path_of("config.json")));
    cr_assert_not_null(j);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "model_type")->valuestring, "gpt2");
    cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0)->valuestring, "GPT2LMHeadModel");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "activation_function")->valuestring, "gelu_new");
    cr_assert_eq(cJSON_GetObjectItem(j, "vocab_size")->valuedouble, 32);
    cr_assert_eq(cJSON_GetObjectItem(j, "n_positions")->valuedouble, 16);
    cr_assert_eq(cJSON_GetObjectItem(j, "n_embd")->valuedouble, 16);
    cr_assert_eq(cJSON_GetObjectItem(j, "n_layer")->valuedouble, 2);
    cr_assert_eq(cJSON_GetObjectItem(j, "n_head")->valuedouble, 2);
    cr_assert_float_eq(cJSON_GetObjectItem(j, "layer_norm_epsilon")->valuedouble, 1e-5, 1e-12);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "tie_word_embeddings")));
    cJSON_Delete(j);

    const char *path = path_of("model.safetensors");
    ct_safetensors *f = ct_safetensors_open(path);
    cr_assert_not_null(f, "%s", ct_last_error());
    cr_assert_str_eq(ct_safetensors_metadata(f, "format"), "pt");
    cr_assert_eq(ct_safetensors_count(f), 28, "GPT2Model's state dict, the tied head once");
    ct_safetensors_close(f);
    cr_assert_eq(ct_gpt_load(b, path, true, NULL), CT_OK, "%s", ct_last_error());
    cr_assert(same_params(a, b));

    cr_assert_neq(ct_gpt_save_hf(a, "/nonexistent/dir"), CT_OK);
    cr_assert(strstr(ct_last_error(), "/nonexistent/dir"), "%s", ct_last_error());
    ct_module_free(&a->base);
    ct_module_free(&b->base);
}

Test(gpt_hf, config_token_ids_are_the_models_or_null)
{
    ct_gpt *a = ct_gpt_new(&tiny);
    cr_assert_eq(ct_gpt_save_hf(a, tmpdir), CT_OK, "%s", ct_last_error());
    cJSON *j = cJSON_Parse(slurp(path_of("config.json")));
    /* transformers' GPT2Config defaults (50256) would lie outside a vocabulary of 32 */
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "bos_token_id")), "no ids: null");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "eos_token_id")));
    cJSON_Delete(j);
    ct_module_free(&a->base);

    ct_gpt_config c = tiny;
    c.token_ids_set = true, c.bos_token_id = 31, c.eos_token_id = 50256;
    a = ct_gpt_new(&c);
    cr_assert_eq(ct_gpt_save_hf(a, tmpdir), CT_OK, "%s", ct_last_error());
    j = cJSON_Parse(slurp(path_of("config.json")));
    cr_assert_eq(cJSON_GetObjectItem(j, "bos_token_id")->valuedouble, 31);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "eos_token_id")), "50256 is outside the vocabulary");
    cJSON_Delete(j);
    ct_gpt *b = ct_gpt_from_pretrained(tmpdir);
    cr_assert_not_null(b, "%s", ct_last_error());
    cr_assert(b->cfg.bos_token_id == 31 && b->cfg.eos_token_id == -1);
    ct_module_free(&a->base);
    ct_module_free(&b->base);
}

Test(gpt_hf, sharded_directory_loads_and_from_pretrained_round_trips)
{
    ct_gpt *a, *b;
    two_models(&a, &b);
    /* 2 KiB shards: the 32 x 16 embeddings and each block's matrices spread over many files */
    cr_assert_eq(ct_gpt_save_hf_sharded(a, tmpdir, 2048), CT_OK, "%s", ct_last_error());
    cr_assert_eq(access(path_of("model.safetensors"), F_OK), -1);
    cJSON *j = cJSON_Parse(slurp(path_of("model.safetensors.index.json")));
    cr_assert_not_null(j);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "weight_map")), 28);
    cJSON_Delete(j);
    cr_assert_eq(ct_gpt_load(b, tmpdir, true, NULL), CT_OK, "%s", ct_last_error());
    cr_assert(same_params(a, b));

    ct_gpt *c = ct_gpt_from_pretrained(tmpdir);
    cr_assert_not_null(c, "%s", ct_last_error());
    cr_assert(c->cfg.vocab_size == 32 && c->cfg.block_size == 16 && c->cfg.n_layer == 2 && c->cfg.n_head == 2 &&
              c->cfg.n_embd == 16 && c->cfg.ln_eps == 1e-5);
    cr_assert(same_params(a, c));
    ct_module_free(&a->base);
    ct_module_free(&b->base);
    ct_module_free(&c->base);
}

Test(gpt_hf, from_pretrained_refuses_bad_configs_naming_the_key)
{
    ct_gpt *a = ct_gpt_new(&tiny);
    cr_assert_eq(ct_gpt_save_hf(a, tmpdir), CT_OK, "%s", ct_last_error());
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"model_type\": \"gpt2\", \"n_positions\": 16, \"n_embd\": 16, \"n_layer\": 2, \"n_head\": 2}",
         "missing key \"vocab_size\""},
        {"{\"vocab_size\": 32, \"n_positions\": 16, \"n_embd\": 16, \"n_layer\": 2, \"n_head\": 3}",
         "n_head 3 must divide n_embd 16"},
        {"{\"vocab_size\": 32, \"n_positions\": 16, \"n_embd\": 16, \"n_layer\": 2, \"n_head\": 2, "
         "\"activation_function\": \"relu\"}",
         "\"activation_function\" is \"relu\""},
        {"{\"model_type\": \"llama\"}", "\"model_type\" is \"llama\""},
        {"{\"vocab_size\": 32,", "not valid JSON"},
        /* sizes that do not match the weights */
        {"{\"vocab_size\": 32, \"n_positions\": 16, \"n_embd\": 16, \"n_layer\": 3, \"n_head\": 2}", "h.2."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        FILE *f = fopen(path_of("config.json"), "w");
        fputs(cases[i].json, f);
        fclose(f);
        cr_assert_null(ct_gpt_from_pretrained(tmpdir), "%s", cases[i].json);
        const char *e = ct_last_error();
        cr_assert(strstr(e, "config.json") || strstr(e, tmpdir), "%s", e);
        cr_assert(strstr(e, cases[i].want), "%s: %s", cases[i].json, e);
    }
    ct_module_free(&a->base);
}
