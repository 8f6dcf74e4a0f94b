/* Hugging Face model directories' weights (nn/hf_weights.c): sharding as transformers
 * does it (greedy in order, a tensor over the limit alone, index with total_size and a
 * sorted weight_map), reading both layouts back bitwise, stale files removed, and
 * broken indexes refused with the file, the shard and the tensor named. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "nn/hf_weights.h"
#include "tests/tmpdir.h"

static void setup(void) { make_tmpdir_with("/tmp/ct_hf_weights_"); }
TestSuite(hf_weights, .init = setup, .fini = remove_tmpdir);

/* five f32 tensors of 40, 24, 100, 8 and 32 bytes */
#define NT 5
static const char *const names[NT] = {"b.weight", "a.weight", "big", "c.bias", "d"};
static const int64_t sizes[NT] = {10, 6, 25, 2, 8};

static void make_tensors(ct_tensor **ts)
{
    ct_set_seed(5);
    for (int i = 0; i < NT; i++) ts[i] = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(sizes[i]), 0, 1);
}

static bool exists(const char *name)
{
    struct stat sb;
    return stat(path_of(name), &sb) == 0;
}

static void expect_same(ct_hf_weights *w, ct_tensor *const *ts)
{
    cr_assert_eq(ct_hf_weights_count(w), NT);
    for (int i = 0; i < NT; i++) {
        ct_tensor *t = ct_hf_weights_get(w, names[i]);
        cr_assert_not_null(t, "%s", ct_last_error());
        cr_assert_eq(memcmp(ct_tensor_data(t), ct_tensor_data(ts[i]), (size_t)sizes[i] * 4), 0, "%s", names[i]);
    }
}

static cJSON *read_json(const char *name)
{
    size_t n;
    uint8_t *text = read_all(path_of(name), &n);
    cJSON *j = cJSON_Parse((const char *)text);
    free(text);
    cr_assert_not_null(j, "%s is not JSON", name);
    return j;
}

Test(hf_weights, small_limit_shards_like_transformers_and_loads_back)
{
    CT_FRAME {
        ct_tensor *ts[NT];
        make_tensors(ts);
        /* limit 64 bytes, greedy in order: [40] (+24 = 64 fits) -> {b, a}; big (100) alone;
         * [8] + 32 = 40 -> {c.bias, d}: three shards */
        cr_assert_eq(ct_hf_weights_save(tmpdir, NT, names, ts, 64), CT_OK, "%s", ct_last_error());
        cr_assert(exists("model-00001-of-00003.safetensors") && exists("model-00002-of-00003.safetensors") &&
                  exists("model-00003-of-00003.safetensors"));
        cr_assert_not(exists("model.safetensors"));
        cJSON *j = read_json("model.safetensors.index.json");
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metadata"), "total_size")->valuedouble, 204);
        const cJSON *map = cJSON_GetObjectItem(j, "weight_map");
        static const char *const want_shard[NT] = {"model-00001-of-00003.safetensors", "model-00001-of-00003.safetensors",
                                                   "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                                   "model-00003-of-00003.safetensors"};
        cr_assert_eq(cJSON_GetArraySize(map), NT);
        for (int i = 0; i < NT; i++)
            cr_assert_str_eq(cJSON_GetObjectItem(map, names[i])->valuestring, want_shard[i], "%s", names[i]);
        /* sorted, as transformers writes it */
        const char *prev = "";
        for (const cJSON *e = map->child; e; e = e->next) {
            cr_assert_gt(strcmp(e->string, prev), 0);
            prev = e->string;
        }
        cJSON_Delete(j);
        /* every shard is a safetensors file with format = pt */
        ct_safetensors *f = ct_safetensors_open(path_of("model-00002-of-00003.safetensors"));
        cr_assert_not_null(f, "%s", ct_last_error());
        cr_assert_str_eq(ct_safetensors_metadata(f, "format"), "pt");
        cr_assert_eq(ct_safetensors_count(f), 1);
        ct_safetensors_close(f);

        ct_hf_weights *w = ct_hf_weights_open(tmpdir);
        cr_assert_not_null(w, "%s", ct_last_error());
        cr_assert_eq(ct_hf_weights_shard_count(w), 3);
        expect_same(w, ts);
        ct_hf_weights_close(w);

        /* the default limit writes one model.safetensors and removes the sharded files */
        cr_assert_eq(ct_hf_weights_save(tmpdir, NT, names, ts, 0), CT_OK, "%s", ct_last_error());
        cr_assert(exists("model.safetensors"));
        cr_assert_not(exists("model.safetensors.index.json"));
        cr_assert_not(exists("model-00001-of-00003.safetensors"));
        cr_assert_not(exists("model-00003-of-00003.safetensors"));
        w = ct_hf_weights_open(tmpdir);
        cr_assert_not_null(w, "%s", ct_last_error());
        cr_assert_eq(ct_hf_weights_shard_count(w), 1);
        expect_same(w, ts);
        ct_hf_weights_close(w);

        /* and back to two shards: model.safetensors goes */
        cr_assert_eq(ct_hf_weights_save(tmpdir, NT, names, ts, 150), CT_OK, "%s", ct_last_error());
        cr_assert_not(exists("model.safetensors"));
        cr_assert(exists("model-00002-of-00002.safetensors"));
        w = ct_hf_weights_open(tmpdir);
        cr_assert_not_null(w, "%s", ct_last_error());
        cr_assert_eq(ct_hf_weights_shard_count(w), 2);
        expect_same(w, ts);
        ct_hf_weights_close(w);
    }
}

/* writes an index whose weight_map is the given JSON text */
static void write_index(const char *map_json)
{
    char text[1024];
    snprintf(text, sizeof text, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": %s}", map_json);
    cr_assert_eq(ct_hf_text_write(path_of("model.safetensors.index.json"), text), CT_OK);
}

static void expect_open_error(const char *what, const char *a, const char *b)
{
    ct_hf_weights *w = ct_hf_weights_open(tmpdir);
    cr_assert_null(w, "%s: opened", what);
    const char *e = ct_last_error();
    cr_assert(strstr(e, "model.safetensors.index.json"), "%s: %s", what, e);
    cr_assert(strstr(e, a) && (!b || strstr(e, b)), "%s: %s", what, e);
}

Test(hf_weights, broken_indexes_are_refused_with_a_reason)
{
    CT_FRAME {
        ct_tensor *ts[NT];
        make_tensors(ts);
        cr_assert_eq(ct_hf_weights_save(tmpdir, NT, names, ts, 64), CT_OK, "%s", ct_last_error());
    }
    const char *s1 = "model-00001-of-00003.safetensors", *s2 = "model-00002-of-00003.safetensors",
               *s3 = "model-00003-of-00003.safetensors";
    char map[800];
    /* a tensor of shard 3 left out of the map */
    snprintf(map, sizeof map, "{\"b.weight\": \"%s\", \"a.weight\": \"%s\", \"big\": \"%s\", \"c.bias\": \"%s\"}", s1,
             s1, s2, s3);
    write_index(map);
    expect_open_error("unmapped", "holds tensor d", "does not list");
    /* a name mapped to the wrong shard */
    snprintf(map, sizeof map,
             "{\"b.weight\": \"%s\", \"a.weight\": \"%s\", \"big\": \"%s\", \"c.bias\": \"%s\", \"d\": \"%s\"}", s1, s1,
             s2, s3, s1);
    write_index(map);
    expect_open_error("wrong shard", "maps tensor d to shard model-00001-of-00003.safetensors", "does not hold it");
    /* a name twice */
    snprintf(map, sizeof map,
             "{\"b.weight\": \"%s\", \"a.weight\": \"%s\", \"big\": \"%s\", \"c.bias\": \"%s\", \"d\": \"%s\", "
             "\"d\": \"%s\"}", s1, s1, s2, s3, s3, s3);
    write_index(map);
    expect_open_error("twice", "tensor d is mapped more than once", NULL);
    /* a shard path outside the directory, a number for a file */
    write_index("{\"d\": \"../model-00003-of-00003.safetensors\"}");
    expect_open_error("path", "weight_map[\"d\"]", "without '/'");
    write_index("{\"d\": 3}");
    expect_open_error("number", "weight_map[\"d\"]", NULL);
    write_index("[]");
    expect_open_error("no map", "no \"weight_map\"", NULL);
    cr_assert_eq(ct_hf_text_write(path_of("model.safetensors.index.json"), "{\"weight_map\": {"), CT_OK);
    expect_open_error("corrupt", "not valid JSON", NULL);
    /* a missing shard */
    snprintf(map, sizeof map,
             "{\"b.weight\": \"%s\", \"a.weight\": \"%s\", \"big\": \"%s\", \"c.bias\": \"%s\", \"d\": \"%s\"}", s1, s1,
             s2, s3, s3);
    write_index(map);
    ct_hf_weights *w = ct_hf_weights_open(tmpdir);
    cr_assert_not_null(w, "the intact index opens: %s", ct_last_error());
    ct_hf_weights_close(w);
    cr_assert_eq(unlink(path_of(s2)), 0);
    expect_open_error("missing shard", "shard model-00002-of-00003.safetensors is missing", NULL);
    /* a truncated shard */
    FILE *f = fopen(path_of(s2), "wb");
    fputs("garbage", f);
    fclose(f);
    expect_open_error("corrupt shard", "shard model-00002-of-00003.safetensors", NULL);
    /* nothing at all */
    unlink(path_of("model.safetensors.index.json"));
    cr_assert_null(ct_hf_weights_open(tmpdir));
    cr_assert(strstr(ct_last_error(), "holds neither model.safetensors nor model.safetensors.index.json"), "%s",
              ct_last_error());
}
