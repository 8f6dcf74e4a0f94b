/* Llama models as Hugging Face directories (nn/llama_hf.c): save_pretrained ->
 * from_pretrained gives the same model bit for bit (tied and untied, single file and
 * sharded), config.json holds LlamaConfig's keys, and configs that cannot be built are
 * refused with the file and the key named. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "nn/hf_weights.h"
#include "nn/llama.h"
#include "tests/tmpdir.h"

static void setup(void) { make_tmpdir_with("/tmp/ct_llama_hf_"); }
TestSuite(llama_hf, .init = setup, .fini = remove_tmpdir);

static const ct_llama_config tiny = {.vocab_size = 41, .hidden_size = 12, .intermediate_size = 20,
                                     .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                                     .head_dim = 4, .max_position_embeddings = 64, .rms_norm_eps = 1e-5, .rope_theta = 500000,
                                     .token_ids_set = true, .bos_token_id = 1, .eos_token_id = 40,
                                     .pad_token_id = 41 /* outside: written as null */};

static ct_llama *random_model(const ct_llama_config *c, uint64_t seed)
{
    ct_set_seed(seed);
    ct_llama *m = ct_llama_new(c);
    cr_assert_not_null(m, "%s", ct_last_error());
    ct_param_list l;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &l), CT_OK);
    for (int i = 0; i < l.n; i++) cr_assert_eq(ct_init_normal_(l.tensors[i], 0.3), CT_OK);
    ct_param_list_free(&l);
    return m;
}

static void expect_same_model(ct_llama *a, ct_llama *b)
{
    ct_param_list la, lb;
    cr_assert_eq(ct_module_named_tensors(&a->base, true, &la), CT_OK);
    cr_assert_eq(ct_module_named_tensors(&b->base, true, &lb), CT_OK);
    cr_assert_eq(la.n, lb.n);
    for (int i = 0; i < la.n; i++) {
        cr_assert_str_eq(la.names[i], lb.names[i]);
        cr_assert_eq(memcmp(ct_tensor_data(la.tensors[i]), ct_tensor_data(lb.tensors[i]),
                            ct_tensor_nbytes(la.tensors[i])),
                     0, "%s differs", la.names[i]);
    }
    ct_param_list_free(&la);
    ct_param_list_free(&lb);
    CT_FRAME {
        int64_t ids[6] = {1, 7, 3, 40, 0, 12};
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, 6), ids);
        ct_tensor *ya = ct_tensor_contiguous(ct_llama_forward(a, idx)), *yb = ct_tensor_contiguous(ct_llama_forward(b, idx));
        cr_assert(ya && yb, "%s", ct_last_error());
        cr_assert_eq(memcmp(ct_tensor_data(ya), ct_tensor_data(yb), ct_tensor_nbytes(ya)), 0, "logits differ");
    }
}

static cJSON *read_config(void)
{
    size_t n;
    uint8_t *text = read_all(path_of("config.json"), &n);
    cJSON *j = cJSON_Parse((const char *)text);
    free(text);
    cr_assert_not_null(j);
    return j;
}

Test(llama_hf, save_then_from_pretrained_is_bitwise_untied)
{
    ct_llama *a = random_model(&tiny, 3);
    cr_assert_eq(ct_llama_save_pretrained(a, tmpdir), CT_OK, "%s", ct_last_error());
    cJSON *j = read_config();
    cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0)->valuestring, "LlamaForCausalLM");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "model_type")->valuestring, "llama");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "hidden_act")->valuestring, "silu");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "torch_dtype")->valuestring, "float32");
    cr_assert_eq(cJSON_GetObjectItem(j, "num_key_value_heads")->valuedouble, 2);
    cr_assert_eq(cJSON_GetObjectItem(j, "head_dim")->valuedouble, 4);
    cr_assert_eq(cJSON_GetObjectItem(j, "rope_theta")->valuedouble, 500000);
    cr_assert_eq(cJSON_GetObjectItem(j, "bos_token_id")->valuedouble, 1);
    cr_assert_eq(cJSON_GetObjectItem(j, "eos_token_id")->valuedouble, 40);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "pad_token_id")), "41 is outside a vocabulary of 41");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "rope_scaling")));
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "tie_word_embeddings")));
    cJSON_Delete(j);
    ct_safetensors *f = ct_safetensors_open(path_of("model.safetensors"));
    cr_assert_not_null(f, "%s", ct_last_error());
    cr_assert_str_eq(ct_safetensors_metadata(f, "format"), "pt");
    cr_assert_eq(ct_safetensors_count(f), 2 + 2 * 9 + 1);
    ct_safetensors_close(f);

    ct_llama *b = ct_llama_from_pretrained(tmpdir);
    cr_assert_not_null(b, "%s", ct_last_error());
    cr_assert(b->cfg.bos_token_id == 1 && b->cfg.eos_token_id == 40 && b->cfg.pad_token_id == -1);
    cr_assert_eq(b->cfg.num_key_value_heads, 2);
    expect_same_model(a, b);
    ct_module_free(&a->base);
    ct_module_free(&b->base);
}

Test(llama_hf, tied_sharded_with_llama3_rope_round_trips)
{
    ct_llama_config c = tiny;
    c.tie_word_embeddings = true;
    c.head_dim = 4; /* 4 heads of 4 over a width of 12 */
    c.rope_scaling = (ct_rope_scaling){.type = CT_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1,
                                       .high_freq_factor = 4, .original_max_position_embeddings = 16};
    ct_llama *a = random_model(&c, 4);
    /* 1 KiB shards: the 41 x 12 embedding (1968 bytes) alone, then the layers */
    cr_assert_eq(ct_llama_save_pretrained_sharded(a, tmpdir, 1024), CT_OK, "%s", ct_last_error());
    struct stat sb;
    cr_assert_neq(stat(path_of("model.safetensors"), &sb), 0);
    cr_assert_eq(stat(path_of("model.safetensors.index.json"), &sb), 0);
    ct_hf_weights *w = ct_hf_weights_open(tmpdir);
    cr_assert_not_null(w, "%s", ct_last_error());
    cr_assert_gt(ct_hf_weights_shard_count(w), 2);
    cr_assert_eq(ct_hf_weights_find(w, "lm_head.weight"), -1, "tied: no lm_head.weight");
    ct_hf_weights_close(w);
    cJSON *j = read_config();
    const cJSON *r = cJSON_GetObjectItem(j, "rope_scaling");
    cr_assert_str_eq(cJSON_GetObjectItem(r, "rope_type")->valuestring, "llama3");
    cr_assert_eq(cJSON_GetObjectItem(r, "original_max_position_embeddings")->valuedouble, 16);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "tie_word_embeddings")));
    cJSON_Delete(j);
    /* floats written as floats: transformers warns about an integer "factor" */
    size_t n;
    char *text = (char *)read_all(path_of("config.json"), &n);
    cr_assert(strstr(text, "\"factor\":\t8.0") && strstr(text, "\"low_freq_factor\":\t1.0") &&
              strstr(text, "\"rope_theta\":\t500000.0") && strstr(text, "\"rms_norm_eps\":\t1e-05"), "%s", text);
    free(text);

    ct_llama *b = ct_llama_from_pretrained(tmpdir);
    cr_assert_not_null(b, "%s", ct_last_error());
    cr_assert_eq(b->cfg.rope_scaling.type, CT_ROPE_LLAMA3);
    cr_assert(b->cfg.rope_scaling.factor == 8 && b->cfg.rope_scaling.high_freq_factor == 4);
    cr_assert_null(b->lm_head);
    expect_same_model(a, b);

    /* through nn/lm.h too */
    ct_lm *lm = ct_llama_as_lm(b, false);
    cr_assert_eq(lm->ops->save_pretrained(lm, path_of("again")), CT_OK, "%s", ct_last_error());
    free(lm);
    ct_llama *c2 = ct_llama_from_pretrained(path_of("again"));
    cr_assert_not_null(c2, "%s", ct_last_error());
    expect_same_model(a, c2);
    ct_module_free(&c2->base);
    ct_module_free(&a->base);
    ct_module_free(&b->base);
}

/* config.json with one key replaced (value NULL: removed), for error tests */
static void write_config(const char *key, const char *value)
{
    const char *base = "{\"model_type\": \"llama\", \"vocab_size\": 41, \"hidden_size\": 12, "
                       "\"intermediate_size\": 20, \"num_hidden_layers\": 2, \"num_attention_heads\": 6, "
                       "\"num_key_value_heads\": 2, \"hidden_act\": \"silu\", \"rope_scaling\": null}";
    cJSON *j = cJSON_Parse(base);
    if (key) {
        cJSON_DeleteItemFromObject(j, key);
        if (value) cJSON_AddItemToObject(j, key, cJSON_Parse(value));
    }
    char *s = cJSON_Print(j);
    cr_assert_eq(ct_hf_text_write(path_of("config.json"), s), CT_OK);
    cJSON_free(s);
    cJSON_Delete(j);
}

static void expect_refused(const char *key, const char *value, const char *want)
{
    write_config(key, value);
    ct_llama *m = ct_llama_from_pretrained(tmpdir);
    cr_assert_null(m, "%s = %s loaded", key, value ? value : "(absent)");
    const char *e = ct_last_error();
    cr_assert(strstr(e, "config.json") && strstr(e, want), "%s = %s: %s", key, value ? value : "(absent)", e);
}

Test(llama_hf, bad_configs_name_the_key)
{
    /* the valid base loads once weights are there */
    ct_llama *a = ct_llama_new(&(ct_llama_config){.vocab_size = 41, .hidden_size = 12, .intermediate_size = 20,
                                                  .num_hidden_layers = 2, .num_attention_heads = 6,
                                                  .num_key_value_heads = 2});
    cr_assert_eq(ct_llama_save_pretrained(a, tmpdir), CT_OK, "%s", ct_last_error());
    write_config(NULL, NULL);
    ct_llama *b = ct_llama_from_pretrained(tmpdir);
    cr_assert_not_null(b, "%s", ct_last_error());
    cr_assert(b->cfg.bos_token_id == -1 && b->cfg.rms_norm_eps == 1e-6 && b->cfg.max_position_embeddings == 2048);
    ct_module_free(&b->base);

    expect_refused("hidden_size", NULL, "missing key \"hidden_size\"");
    expect_refused("hidden_size", "\"12\"", "\"hidden_size\" is \"12\"");
    expect_refused("num_hidden_layers", "2.5", "\"num_hidden_layers\" is 2.5");
    expect_refused("model_type", "\"mistral\"", "\"model_type\" is \"mistral\"");
    expect_refused("model_type", NULL, "missing key \"model_type\"");
    expect_refused("hidden_act", "\"gelu\"", "\"hidden_act\" is \"gelu\"");
    expect_refused("attention_bias", "true", "attention_bias true");
    expect_refused("rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_scaling type \"yarn\"");
    expect_refused("rope_scaling", "{\"type\": \"linear\"}", "missing key \"factor\"");
    expect_refused("rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}", "\"low_freq_factor\"");
    expect_refused("num_key_value_heads", "4", "num_key_value_heads 4 must divide num_attention_heads 6");
    expect_refused("num_attention_heads", "5", "num_attention_heads 5 must divide hidden_size 12");
    expect_refused("eos_token_id", "\"x\"", "\"eos_token_id\"");
    /* weights that do not fit the config: the missing and unexpected names */
    write_config("num_hidden_layers", "3");
    cr_assert_null(ct_llama_from_pretrained(tmpdir));
    cr_assert(strstr(ct_last_error(), tmpdir) && strstr(ct_last_error(), "missing keys (9): model.layers.2."), "%s",
              ct_last_error());
    cr_assert_eq(ct_hf_text_write(path_of("config.json"), "{\"model_type\": \"llama\","), CT_OK);
    cr_assert_null(ct_llama_from_pretrained(tmpdir));
    cr_assert(strstr(ct_last_error(), "not valid JSON"), "%s", ct_last_error());
    cr_assert_null(ct_llama_from_pretrained("/nonexistent/dir"));
    cr_assert(strstr(ct_last_error(), "/nonexistent/dir/config.json"), "%s", ct_last_error());
    /* a token list (Llama 3.1's eos) takes its first id */
    write_config("eos_token_id", "[40, 38]");
    b = ct_llama_from_pretrained(tmpdir);
    cr_assert_not_null(b, "%s", ct_last_error());
    cr_assert_eq(b->cfg.eos_token_id, 40);
    ct_module_free(&b->base);
    ct_module_free(&a->base);
}
