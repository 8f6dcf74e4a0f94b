/* ct_lm: a GPT saved in Hugging Face's layout loads back by its config.json's
 * model_type with the same logits; token ids come from config.json; the cache has
 * the model's sizes; every misfit of the directory is an error naming the file and
 * key. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "autograd/autograd.h"
#include "core/frame.h"
#include "nn/gpt.h"
#include "nn/lm.h"
#include "tests/tmpdir.h"

static void setup(void) { make_tmpdir_with("/tmp/ct_lm_"); }

static const ct_gpt_config tiny = {.vocab_size = 40, .block_size = 12, .n_layer = 2, .n_head = 2, .n_embd = 8,
                                   .ln_eps = 1e-6};

/* tmpdir/m holding a fresh tiny GPT; *out keeps it when out is not NULL */
static const char *saved_model(ct_gpt **out)
{
    ct_set_seed(2);
    ct_gpt *m = ct_gpt_new(&tiny);
    ct_lm *lm = ct_gpt_as_lm(m, true);
    cr_assert_not_null(lm);
    const char *dir = path_of("m");
    cr_assert_eq(ct_lm_save_pretrained(lm, dir), CT_OK, "%s", ct_last_error()); /* creates dir */
    if (out) {
        lm->owns_model = false;
        *out = m;
    }
    ct_lm_free(lm);
    return dir;
}

/* config.json's key set to v (NULL: removed) */
static void edit_config(const char *key, cJSON *v)
{
    size_t n;
    uint8_t *text = read_all(path_of("m/config.json"), &n);
    cJSON *root = cJSON_Parse((char *)text);
    free(text);
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    if (v) cJSON_AddItemToObject(root, key, v);
    char *s = cJSON_Print(root);
    FILE *f = fopen(path_of("m/config.json"), "w");
    fputs(s, f);
    fclose(f);
    cJSON_free(s);
    cJSON_Delete(root);
}

Test(lm, a_saved_gpt_loads_back_with_the_same_logits, .init = setup, .fini = remove_tmpdir)
{
    ct_gpt *m;
    const char *dir = saved_model(&m);
    ct_lm *lm = ct_lm_from_pretrained(dir);
    cr_assert_not_null(lm, "%s", ct_last_error());
    cr_assert_str_eq(lm->ops->model_type, "gpt2");
    cr_assert_eq(lm->vocab_size, 40);
    cr_assert_eq(lm->max_positions, 12);
    cr_assert_eq(lm->n_layer, 2);
    cr_assert_eq(lm->n_kv_head, 2);
    cr_assert_eq(lm->head_dim, 4);
    cr_assert_eq(lm->bos_token_id, -1);
    cr_assert_eq(lm->eos_token_id, -1);
    cr_assert_eq(((ct_gpt *)lm->model)->cfg.ln_eps, 1e-6);
    bool grad = ct_grad_set_enabled(false);
    CT_FRAME {
        ct_tensor *idx = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, 5), (int64_t[]){1, 39, 0, 7, 7});
        ct_tensor *a = ct_gpt_forward(m, idx), *b = ct_lm_forward(lm, idx, NULL);
        cr_assert_not_null(b, "%s", ct_last_error());
        cr_assert_eq(memcmp(ct_tensor_data(a), ct_tensor_data(b), ct_tensor_nbytes(a)), 0);
        /* the cache has the model's sizes, dtype and device */
        ct_kv_cache *c = ct_lm_cache_new(lm, 1, 12);
        cr_assert_not_null(c, "%s", ct_last_error());
        cr_assert(c->n_layer == 2 && c->n_kv_head == 2 && c->head_dim == 4 && c->max_len == 12);
        cr_assert_eq(c->dtype, CT_DTYPE_F32);
        cr_assert_not_null(ct_lm_forward(lm, idx, c));
        cr_assert_eq(c->len, 5);
        ct_kv_cache_free(c);
        cr_assert_null(ct_lm_cache_new(lm, 1, 13));
        cr_assert(strstr(ct_last_error(), "max_len 13 exceeds the model's 12 positions"), "%s", ct_last_error());
    }
    ct_grad_set_enabled(grad);
    ct_lm_free(lm);
    ct_module_free(&m->base);
}

Test(lm, token_ids_come_from_config_json, .init = setup, .fini = remove_tmpdir)
{
    char dir[256]; /* path_of's results do not last */
    snprintf(dir, sizeof dir, "%s", saved_model(NULL));
    edit_config("bos_token_id", cJSON_CreateNumber(3));
    edit_config("eos_token_id", cJSON_CreateIntArray((int[]){7, 8}, 2)); /* Llama 3 writes lists */
    edit_config("pad_token_id", cJSON_CreateNull());
    ct_lm *lm = ct_lm_from_pretrained(dir);
    cr_assert_not_null(lm, "%s", ct_last_error());
    cr_assert_eq(lm->bos_token_id, 3);
    cr_assert_eq(lm->eos_token_id, 7);
    cr_assert_eq(lm->pad_token_id, -1);
    ct_lm_free(lm);
    /* GPT-2's 50256 in a model of 40 ids: dropped with a warning */
    edit_config("eos_token_id", cJSON_CreateNumber(50256));
    lm = ct_lm_from_pretrained(dir);
    cr_assert_not_null(lm, "%s", ct_last_error());
    cr_assert_eq(lm->eos_token_id, -1);
    ct_lm_free(lm);
}

static void expect_error(const char *dir, const char *needle)
{
    ct_lm *lm = ct_lm_from_pretrained(dir);
    cr_assert_null(lm, "loaded, expected an error with '%s'", needle);
    cr_assert(strstr(ct_last_error(), needle), "'%s' lacks '%s'", ct_last_error(), needle);
}

Test(lm, misfits_are_errors_naming_file_and_key, .init = setup, .fini = remove_tmpdir)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s", saved_model(NULL));
    char missing[300];
    snprintf(missing, sizeof missing, "%s/absent", dir);
    expect_error(missing, "cannot open model directory");
    snprintf(missing, sizeof missing, "%s/config.json", dir);
    expect_error(missing, "is not a directory");
    edit_config("model_type", cJSON_CreateString("bert"));
    expect_error(dir, "model_type 'bert' is not supported (supported: gpt2");
    edit_config("model_type", NULL);
    expect_error(dir, "has no \"model_type\" string");
    edit_config("model_type", cJSON_CreateString("gpt2"));
    edit_config("n_head", cJSON_CreateNumber(0));
    expect_error(dir, "\"n_head\" is 0; it must be an integer >= 1");
    edit_config("n_head", cJSON_CreateNumber(3));
    expect_error(dir, "n_head 3 must divide n_embd 8");
    edit_config("n_head", cJSON_CreateNumber(2));
    edit_config("vocab_size", NULL);
    expect_error(dir, "missing key \"vocab_size\"");
    edit_config("vocab_size", cJSON_CreateNumber(41)); /* the file holds 40 rows */
    expect_error(dir, "wte.weight");
    edit_config("vocab_size", cJSON_CreateNumber(40));
    edit_config("activation_function", cJSON_CreateString("relu"));
    expect_error(dir, "\"activation_function\" is \"relu\"");
    edit_config("activation_function", cJSON_CreateString("gelu_new"));
    ct_lm *lm = ct_lm_from_pretrained(dir);
    cr_assert_not_null(lm, "%s", ct_last_error());
    ct_lm_free(lm);
    remove(path_of("m/model.safetensors"));
    expect_error(dir, "model.safetensors");
    FILE *f = fopen(path_of("m/config.json"), "w");
    fputs("{\"model_type\": ", f);
    fclose(f);
    expect_error(dir, "is not a JSON object");
    remove(path_of("m/config.json"));
    expect_error(dir, "config.json");
}
