/* Tests for core/safetensors.c. The reader is checked against files assembled byte
 * by byte in the tests from the format's specification (8-byte little-endian length,
 * a JSON literal, raw little-endian data); the writer's output is checked by parsing
 * its header independently with cJSON; the validator against every rule in
 * core/safetensors.h, every truncation of a small file and random byte flips. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "core/tensor.h"

/* ---- helpers ------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n;
} bytes;

/* 8-byte LE length of json, json itself, then dlen data bytes (copied, or zeros). */
static bytes make_file(const char *json, const void *data, size_t dlen)
{
    size_t hl = strlen(json);
    bytes b = {malloc(8 + hl + dlen + 1), 8 + hl + dlen};
    cr_assert_not_null(b.p);
    for (int i = 0; i < 8; i++) b.p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b.p + 8, json, hl);
    if (data) memcpy(b.p + 8 + hl, data, dlen);
    else memset(b.p + 8 + hl, 0, dlen);
    return b;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, fp), n);
    cr_assert_eq(fclose(fp), 0);
}

static bytes read_bytes(const char *path)
{
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "%s", path);
    fseek(fp, 0, SEEK_END);
    bytes b = {NULL, (size_t)ftell(fp)};
    fseek(fp, 0, SEEK_SET);
    b.p = malloc(b.n + 1);
    cr_assert_eq(fread(b.p, 1, b.n, fp), b.n);
    fclose(fp);
    return b;
}

/* A fresh directory per test (Criterion may run tests in parallel). */
static char tmpdir[64];
static const char *tmp_path(const char *name)
{
    static char path[256];
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/ct_safetensors_XXXXXX");
        cr_assert_not_null(mkdtemp(tmpdir));
    }
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    return path;
}

static void remove_tmpdir(void)
{
    if (!tmpdir[0]) return;
    DIR *d = opendir(tmpdir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(tmpdir);
    tmpdir[0] = 0;
}

/* Every test's directory goes away after it, passed or failed. */
TestSuite(safetensors, .fini = remove_tmpdir);

/* Files in the test directory whose name contains part. */
static int count_files_with(const char *part)
{
    int n = 0;
    DIR *d = opendir(tmpdir);
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, part) != NULL;
    if (d) closedir(d);
    return n;
}

static void assert_same_tensor(const ct_tensor *got, ct_tensor *want, const char *what)
{
    cr_assert_not_null(got, "%s: %s", what, ct_last_error());
    cr_assert_eq(got->dtype, want->dtype, "%s", what);
    cr_assert(ct_tensor_same_shape(got, want), "%s", what);
    ct_tensor *c = ct_tensor_contiguous(want);
    cr_assert(ct_tensor_is_contiguous(got), "%s", what);
    cr_assert_eq(memcmp(ct_tensor_data(got), ct_tensor_data(c), ct_tensor_nbytes(c)), 0, "%s: bytes differ", what);
}

static volatile unsigned byte_sink;

/* Reads every byte of every tensor; returns false when the file did not validate. */
static bool open_and_touch(const void *p, size_t n)
{
    ct_safetensors *f = ct_safetensors_open_memory(p, n, "flip");
    if (!f) {
        cr_assert(strstr(ct_last_error(), "safetensors 'flip'") != NULL, "%s", ct_last_error());
        return false;
    }
    CT_FRAME {
        for (int i = 0; i < ct_safetensors_count(f); i++) {
            ct_tensor *t = ct_safetensors_get(f, ct_safetensors_name(f, i));
            cr_assert_not_null(t, "%s", ct_last_error());
            const uint8_t *d = ct_tensor_data(t);
            for (size_t k = 0; k < ct_tensor_nbytes(t); k++) byte_sink += d[k];
        }
    }
    ct_safetensors_close(f);
    return true;
}

/* ---- reading files built by hand ----------------------------------------- */

/* a: F32 [2, 2] = 1, -2, 0.5, 3e38 at [0, 16); b: I64 [3] = 7, -1, 2^40 at [16, 40);
 * c: BF16 0-d = 1.5 (0x3FC0) at [40, 42); e: U8 [0, 4] empty at [42, 42). */
static const char hand_json[] =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"h\\u00e9llo\"},"
    "\"b\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[16,40]},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
    "\"e\":{\"dtype\":\"U8\",\"shape\":[0,4],\"data_offsets\":[42,42]},"
    "\"c\":{\"shape\":[],\"data_offsets\":[40,42],\"dtype\":\"BF16\"}}";

static bytes hand_file(size_t pad)
{
    uint8_t data[42];
    const uint8_t a[16] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, /* 1, -2 */
                           0x00, 0x00, 0x00, 0x3f, 0x99, 0x76, 0x61, 0x7f}; /* 0.5, ~3e38 */
    memcpy(data, a, 16);
    const uint8_t b[24] = {7, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                           0, 0, 0, 0, 0, 1, 0, 0};
    memcpy(data + 16, b, 24);
    data[40] = 0xC0, data[41] = 0x3F;
    char json[1024];
    snprintf(json, sizeof json, "%s%*s", hand_json, (int)pad, "");
    return make_file(json, data, sizeof data);
}

static void check_hand_file(ct_safetensors *f)
{
    cr_assert_not_null(f, "%s", ct_last_error());
    cr_assert_eq(ct_safetensors_count(f), 4);
    /* file order is data order, not header order */
    const char *order[4] = {"a", "b", "c", "e"};
    for (int i = 0; i < 4; i++) cr_assert_str_eq(ct_safetensors_name(f, i), order[i]);
    ct_dtype dt;
    int nd;
    int64_t sh[CT_MAX_DIMS];
    cr_assert(ct_safetensors_info(f, "a", &dt, &nd, sh));
    cr_assert(dt == CT_DTYPE_F32 && nd == 2 && sh[0] == 2 && sh[1] == 2);
    cr_assert(ct_safetensors_info(f, "c", &dt, &nd, sh));
    cr_assert(dt == CT_DTYPE_BF16 && nd == 0);
    CT_FRAME {
        ct_tensor *a = ct_safetensors_get(f, "a");
        cr_assert_not_null(a, "%s", ct_last_error());
        const float *av = ct_tensor_data(a);
        cr_assert(av[0] == 1.0f && av[1] == -2.0f && av[2] == 0.5f);
        uint32_t bits = 0x7f617699u;
        float big;
        memcpy(&big, &bits, 4);
        cr_assert_eq(av[3], big);
        ct_tensor *b = ct_safetensors_get(f, "b");
        cr_assert(b->dtype == CT_DTYPE_I64 && b->ndim == 1 && b->shape[0] == 3);
        const int64_t *bv = ct_tensor_data(b);
        cr_assert(bv[0] == 7 && bv[1] == -1 && bv[2] == (int64_t)1 << 40);
        ct_tensor *c = ct_safetensors_get(f, "c");
        cr_assert_eq(c->ndim, 0);
        cr_assert_eq(ct_tensor_item(c), 1.5);
        ct_tensor *e = ct_safetensors_get(f, "e");
        cr_assert(e && e->dtype == CT_DTYPE_U8 && e->ndim == 2 && e->shape[0] == 0 && e->shape[1] == 4);
    }
    cr_assert_str_eq(ct_safetensors_metadata(f, "format"), "pt");
    cr_assert_str_eq(ct_safetensors_metadata(f, "note"), "h\xc3\xa9llo");
    cr_assert_null(ct_safetensors_metadata(f, "absent"));
    cr_assert_eq(ct_safetensors_metadata_count(f), 2);
    cr_assert_str_eq(ct_safetensors_metadata_key(f, 1), "note");
}

Test(safetensors, reads_a_file_built_by_hand_from_the_spec)
{
    for (size_t pad = 0; pad < 8; pad++) { /* every alignment of the data section */
        bytes b = hand_file(pad);
        const char *path = tmp_path("hand.safetensors");
        write_bytes(path, b.p, b.n);
        ct_safetensors *f = ct_safetensors_open(path);
        check_hand_file(f);
        cr_assert_str_eq(ct_safetensors_label(f), path);
        ct_safetensors_close(f);
        free(b.p);
    }
}

Test(safetensors, memory_views_when_aligned_copies_when_not)
{
    bytes b = hand_file(0);
    size_t dstart = b.n - 42;
    for (size_t shift = 0; shift < 8; shift++) {
        uint8_t *buf = aligned_alloc(64, (b.n + 8 + 63) / 64 * 64);
        memcpy(buf + shift, b.p, b.n);
        ct_safetensors *f = ct_safetensors_open_memory(buf + shift, b.n, "mem");
        check_hand_file(f);
        CT_FRAME {
            ct_tensor *a = ct_safetensors_get(f, "a"), *i = ct_safetensors_get(f, "b");
            const uint8_t *where = buf + shift + dstart;
            bool a_view = ct_tensor_data(a) == (void *)where;
            cr_assert_eq(a_view, (uintptr_t)where % 4 == 0, "shift %zu: f32 view iff 4-byte aligned", shift);
            cr_assert_eq(ct_tensor_data(i) == (void *)(where + 16), (uintptr_t)(where + 16) % 8 == 0);
        }
        ct_safetensors_close(f);
        free(buf);
    }
    free(b.p);
}

Test(safetensors, accepts_holes_trailing_bytes_and_hf_spacing)
{
    /* x at [8, 12) leaves a hole [0, 8); 4 trailing bytes after it; empty y sits inside x */
    const char *json = "  {\"x\" : {\"dtype\":\"I32\", \"shape\":[1], \"data_offsets\":[8, 12]},\n"
                       "\"y\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[9,9]}}  \n";
    uint8_t data[16] = {0};
    data[8] = 42;
    bytes b = make_file(json, data, sizeof data);
    ct_safetensors *f = ct_safetensors_open_memory(b.p, b.n, "holes");
    cr_assert_not_null(f, "%s", ct_last_error());
    CT_FRAME {
        cr_assert_eq(ct_tensor_item(ct_safetensors_get(f, "x")), 42.0);
    }
    ct_safetensors_close(f);
    free(b.p);
}

Test(safetensors, bool_bytes_other_than_0_1_read_as_true)
{
    const uint8_t data[4] = {0, 1, 7, 255};
    bytes b = make_file("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[0,4]}}", data, 4);
    ct_safetensors *f = ct_safetensors_open_memory(b.p, b.n, "bools");
    CT_FRAME {
        ct_tensor *m = ct_safetensors_get(f, "m");
        const uint8_t *v = ct_tensor_data(m);
        cr_assert(v[0] == 0 && v[1] == 1 && v[2] == 1 && v[3] == 1);
    }
    ct_safetensors_close(f);
    free(b.p);
}

/* ---- round trips --------------------------------------------------------- */

Test(safetensors, round_trip_every_dtype_layout_and_metadata)
{
    ct_set_seed(11);
    const char *path = tmp_path("rt.safetensors");
    CT_FRAME {
        enum { PER = 6 };
        char names[CT_DTYPE_COUNT * PER + 1][32];
        const char *np[CT_DTYPE_COUNT * PER + 1];
        ct_tensor *ts[CT_DTYPE_COUNT * PER + 1];
        int n = 0;
        for (int d = 0; d < CT_DTYPE_COUNT; d++) {
            ct_dtype dt = (ct_dtype)d;
            /* a byte pattern covers every bit of every dtype (NaNs included: compared as bytes) */
            int64_t numel = 2 * 3 * 5;
            uint8_t raw[2 * 3 * 5 * 8];
            for (size_t k = 0; k < sizeof raw; k++) raw[k] = (uint8_t)(k * 37 + d * 11 + 1);
            if (dt == CT_DTYPE_BOOL)
                for (int64_t k = 0; k < numel; k++) raw[k] = (uint8_t)(k % 3 == 0);
            ct_tensor *base = ct_tensor_from_data(dt, CT_SHAPE(2, 3, 5), raw);
            ct_tensor *views[PER] = {
                base,
                ct_tensor_transpose(base, 0, 2),             /* (5, 3, 2), non-contiguous */
                ct_tensor_slice(base, 2, 1, 5, 2),           /* step 2 */
                ct_tensor_expand(ct_tensor_select(base, 1, 1), CT_SHAPE(4, 2, 5)), /* stride 0 */
                ct_tensor_from_data(dt, 0, NULL, raw),       /* 0-d */
                ct_tensor_empty(dt, CT_SHAPE(3, 0)),         /* empty */
            };
            for (int v = 0; v < PER; v++) {
                cr_assert_not_null(views[v], "%s", ct_last_error());
                snprintf(names[n], sizeof names[n], "%s.v%d", ct_dtype_safetensors_name(dt), v);
                np[n] = names[n];
                ts[n++] = views[v];
            }
        }
        ts[n] = ct_tensor_randn(CT_DTYPE_F32, CT_SHAPE(17, 3), 0, 1);
        np[n] = "model.layers.0.weight \xe2\x9c\x93"; /* UTF-8 in a name */
        n++;
        const char *keys[2] = {"format", "quote\"key"}, *vals[2] = {"pt", "line\nbreak \xc3\xa9"};
        cr_assert_eq(ct_safetensors_save(path, n, np, ts, 2, keys, vals), CT_OK, "%s", ct_last_error());
        cr_assert_eq(count_files_with(".tmp."), 0, "the temporary file was renamed");

        ct_safetensors *f = ct_safetensors_open(path);
        cr_assert_not_null(f, "%s", ct_last_error());
        cr_assert_eq(ct_safetensors_count(f), n);
        for (int i = 0; i < n; i++) {
            cr_assert_str_eq(ct_safetensors_name(f, i), np[i], "file order is the order given");
            assert_same_tensor(ct_safetensors_get(f, np[i]), ts[i], np[i]);
        }
        cr_assert_str_eq(ct_safetensors_metadata(f, "quote\"key"), "line\nbreak \xc3\xa9");
        cr_assert_str_eq(ct_safetensors_metadata(f, "format"), "pt");
        ct_safetensors_close(f);
    }
}

Test(safetensors, save_writes_bool_as_0_1_and_saves_nothing_cleanly)
{
    const char *path = tmp_path("b.safetensors");
    uint8_t raw[3] = {0, 5, 255};
    CT_FRAME {
        ct_tensor *m = ct_tensor_from_buffer(CT_DTYPE_BOOL, CT_SHAPE(3), raw, NULL, NULL);
        cr_assert_eq(ct_safetensors_save(path, 1, (const char *[]){"m"}, &m, 0, NULL, NULL), CT_OK);
    }
    bytes b = read_bytes(path);
    cr_assert_eq(memcmp(b.p + b.n - 3, "\0\1\1", 3), 0);
    free(b.p);
    /* no tensors, no metadata: header "{}" padded to 8 */
    cr_assert_eq(ct_safetensors_save(path, 0, NULL, NULL, 0, NULL, NULL), CT_OK);
    b = read_bytes(path);
    cr_assert_eq(b.n, 16);
    cr_assert_eq(memcmp(b.p, "\x08\0\0\0\0\0\0\0{}      ", 16), 0);
    free(b.p);
    ct_safetensors *f = ct_safetensors_open(path);
    cr_assert(f && ct_safetensors_count(f) == 0);
    ct_safetensors_close(f);
}

/* The written header parsed independently: length, padding, JSON, offsets. */
Test(safetensors, written_header_follows_the_spec)
{
    const char *path = tmp_path("spec.safetensors");
    CT_FRAME {
        ct_tensor *ts[4] = {
            ct_tensor_zeros(CT_DTYPE_BF16, CT_SHAPE(3)),  /* 6 bytes: the next offset is not aligned */
            ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(2, 2)),
            ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(0)),
            ct_tensor_zeros(CT_DTYPE_U8, CT_SHAPE(5)),
        };
        const char *np[4] = {"w1", "w2", "w3", "w4"};
        cr_assert_eq(ct_safetensors_save(path, 4, np, ts, 1, (const char *[]){"k"}, (const char *[]){"v"}), CT_OK);
        bytes b = read_bytes(path);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | b.p[i];
        cr_assert_eq((8 + hl) % 8, 0, "data section 8-byte aligned");
        cr_assert(8 + hl <= b.n);
        cJSON *root = cJSON_ParseWithLength((const char *)b.p + 8, hl);
        cr_assert_not_null(root);
        const char *want_dt[4] = {"BF16", "F64", "I32", "U8"};
        uint64_t expect_begin = 0;
        for (int i = 0; i < 4; i++) {
            cJSON *e = cJSON_GetObjectItemCaseSensitive(root, np[i]);
            cr_assert_not_null(e);
            cr_assert_eq(cJSON_GetArraySize(e), 3, "exactly dtype, shape, data_offsets");
            cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring, want_dt[i]);
            cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
            cr_assert_eq(cJSON_GetArraySize(sh), ts[i]->ndim);
            for (int d = 0; d < ts[i]->ndim; d++) cr_assert_eq(cJSON_GetArrayItem(sh, d)->valuedouble, (double)ts[i]->shape[d]);
            cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
            cr_assert_eq(cJSON_GetArrayItem(o, 0)->valuedouble, (double)expect_begin, "no holes");
            expect_begin += ct_tensor_nbytes(ts[i]);
            cr_assert_eq(cJSON_GetArrayItem(o, 1)->valuedouble, (double)expect_begin);
        }
        cr_assert_eq(8 + hl + expect_begin, b.n, "the data section is exactly covered");
        cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(md, "k")->valuestring, "v");
        cr_assert_eq(cJSON_GetArraySize(root), 5);
        /* what follows the JSON inside the header is spaces only */
        char *printed = cJSON_PrintUnformatted(root);
        size_t pl = strlen(printed);
        cr_assert(pl <= hl && hl - pl < 8);
        for (size_t k = pl; k < hl; k++) cr_assert_eq(b.p[8 + k], ' ');
        free(printed);
        cJSON_Delete(root);
        free(b.p);
    }
}

/* ---- lifetime -------------------------------------------------------------- */

Test(safetensors, tensors_outlive_close_and_the_file)
{
    const char *path = tmp_path("life.safetensors");
    float vals[6] = {1, 2, 3, 4, 5, 6};
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F32, CT_SHAPE(2, 3), vals);
        cr_assert_eq(ct_safetensors_save(path, 1, (const char *[]){"t"}, &t, 0, NULL, NULL), CT_OK);
    }
    ct_tensor *kept = NULL;
    CT_FRAME {
        ct_safetensors *f = ct_safetensors_open(path);
        ct_tensor *a = ct_safetensors_get(f, "t"), *b = ct_safetensors_get(f, "t");
        ct_safetensors_close(f);
        unlink(path);
        kept = ct_tensor_retain(a);
        cr_assert_eq(ct_tensor_get(b, (int64_t[]){1, 2}), 6.0);
        /* two gets of one tensor view the same (private) mapping; the file stays as it was (next test) */
        ((float *)ct_tensor_data(a))[0] = 100;
        cr_assert_eq(((float *)ct_tensor_data(b))[0], 100.0f, "views of one tensor share the mapping");
    }
    cr_assert_eq(ct_tensor_get(kept, (int64_t[]){1, 1}), 5.0, "valid after close, unlink and the frame");
    ct_tensor_release(kept); /* the last reference unmaps (ASan/LSan check the rest) */
}

Test(safetensors, writes_to_a_view_never_reach_the_file)
{
    const char *path = tmp_path("cow.safetensors");
    CT_FRAME {
        ct_tensor *t = ct_tensor_full(CT_DTYPE_F64, CT_SHAPE(4), 2.0);
        cr_assert_eq(ct_safetensors_save(path, 1, (const char *[]){"t"}, &t, 0, NULL, NULL), CT_OK);
        ct_safetensors *f = ct_safetensors_open(path);
        ct_tensor_fill_(ct_safetensors_get(f, "t"), -1.0);
        ct_safetensors_close(f);
        f = ct_safetensors_open(path);
        cr_assert_eq(ct_tensor_get(ct_safetensors_get(f, "t"), (int64_t[]){3}), 2.0);
        ct_safetensors_close(f);
    }
}

/* ---- robustness ------------------------------------------------------------ */

static bytes small_valid_file(void)
{
    const char *path = tmp_path("small.safetensors");
    CT_FRAME {
        ct_tensor *ts[3] = {ct_tensor_arange(CT_DTYPE_I32, 0, 5, 1), ct_tensor_scalar(CT_DTYPE_F16, 0.25),
                            ct_tensor_full(CT_DTYPE_F32, CT_SHAPE(2, 2), 3.0)};
        cr_assert_eq(ct_safetensors_save(path, 3, (const char *[]){"i", "h", "f"}, ts, 1, (const char *[]){"k"},
                                         (const char *[]){"v"}),
                     CT_OK);
    }
    return read_bytes(path);
}

Test(safetensors, every_truncation_is_rejected_cleanly)
{
    bytes b = small_valid_file();
    cr_assert(open_and_touch(b.p, b.n));
    const char *cut = tmp_path("cut.safetensors");
    for (size_t len = 0; len < b.n; len++) {
        /* an exact-size heap copy, so ASan catches any read past the end */
        uint8_t *p = malloc(len ? len : 1);
        memcpy(p, b.p, len);
        cr_assert_null(ct_safetensors_open_memory(p, len, "cut"), "prefix of %zu bytes accepted", len);
        cr_assert_eq(ct_last_status(), CT_ERR_FORMAT);
        cr_assert(strstr(ct_last_error(), "safetensors 'cut'") != NULL);
        free(p);
        write_bytes(cut, b.p, len);
        cr_assert_null(ct_safetensors_open(cut), "file prefix of %zu bytes accepted", len);
        cr_assert(strstr(ct_last_error(), cut) != NULL);
    }
    free(b.p);
}

Test(safetensors, random_byte_flips_never_crash)
{
    bytes b = small_valid_file();
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        uint8_t *p = malloc(b.n);
        memcpy(p, b.p, b.n);
        int flips = 1 + it % 3;
        for (int k = 0; k < flips; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            /* mostly the length and the header, where the structure is */
            size_t at = (s >> 8) % (it % 4 ? b.n - 32 : b.n);
            p[at] ^= (uint8_t)(1u << ((s >> 40) % 8));
        }
        accepted += open_and_touch(p, b.n);
        free(p);
    }
    cr_assert(accepted > 0 && accepted < 20000, "accepted %d", accepted);
    free(b.p);
}

/* ---- each validation rule --------------------------------------------------- */

typedef struct {
    const char *json;
    size_t dlen;
    const char *expect[2]; /* substrings of the message: tensor and problem */
} bad_case;

#define T(dt, shape, offs) "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static const bad_case bad_cases[] = {
    {"{not json}", 0, {"not valid JSON", NULL}},
    {"[1, 2]", 0, {"not a JSON object", NULL}},
    {"{} x", 0, {"after the JSON header", NULL}},
    {"{\"a\xff\":1}", 0, {"not valid UTF-8", NULL}},
    {"{\"\xc0\xaf\":1}", 0, {"not valid UTF-8", NULL}}, /* overlong '/' */
    {"{\"a\x01\":1}", 0, {"not valid UTF-8 JSON text", NULL}},
    {"{\"w\": 3}", 0, {"'w'", "not a JSON object"}},
    {"{\"w\":{\"shape\":[],\"data_offsets\":[0,4]}}", 4, {"'w'", "missing \"dtype\""}},
    {"{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, {"'w'", "missing \"shape\""}},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[]}}", 4, {"'w'", "missing \"data_offsets\""}},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"extra\":1}}", 4, {"'w'", "unexpected key \"extra\""}},
    {"{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, {"'w'", "duplicate key \"dtype\""}},
    {"{\"w\":" T("I16", "[2]", "[0,4]") "}", 4, {"'w'", "unsupported dtype \"I16\""}},
    {"{\"w\":" T("f32", "[1]", "[0,4]") "}", 4, {"'w'", "unsupported dtype \"f32\""}},
    {"{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, {"'w'", "dtype is not a string"}},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, {"'w'", "shape is not an array"}},
    {"{\"w\":" T("F32", "[-1]", "[0,4]") "}", 4, {"'w'", "shape entry 0 is not a non-negative integer"}},
    {"{\"w\":" T("F32", "[1, 1.5]", "[0,4]") "}", 4, {"'w'", "shape entry 1"}},
    {"{\"w\":" T("F32", "[\"1\"]", "[0,4]") "}", 4, {"'w'", "shape entry 0"}},
    {"{\"w\":" T("F32", "[1e300]", "[0,4]") "}", 4, {"'w'", "shape entry 0"}},
    {"{\"w\":" T("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, {"'w'", "9 dims"}},
    {"{\"w\":" T("F32", "[1]", "[0]") "}", 4, {"'w'", "data_offsets is not [begin, end]"}},
    {"{\"w\":" T("F32", "[1]", "[0,4,8]") "}", 8, {"'w'", "data_offsets is not [begin, end]"}},
    {"{\"w\":" T("F32", "[1]", "[-4,0]") "}", 4, {"'w'", "data_offsets is not [begin, end]"}},
    {"{\"w\":" T("F32", "[1]", "{}") "}", 4, {"'w'", "data_offsets is not [begin, end]"}},
    {"{\"w\":" T("F32", "[0]", "[4,0]") "}", 4, {"'w'", "end before they begin"}},
    {"{\"w\":" T("F32", "[2]", "[0,4]") "}", 8, {"'w'", "hold 4 bytes but F32[2] needs 8"}},
    {"{\"w\":" T("F64", "[9007199254740992,9007199254740992]", "[0,8]") "}", 8, {"'w'", "too large"}},
    {"{\"w\":" T("F32", "[2]", "[0,8]") "}", 4, {"'w'", "run past the data section (4 bytes"}},
    {"{\"v\":" T("F32", "[1]", "[0,4]") ",\"w\":" T("U8", "[4]", "[4,8]") "}", 6, {"'w'", "past the data section"}},
    {"{\"a\":" T("F32", "[2]", "[0,8]") ",\"b\":" T("F32", "[2]", "[4,12]") "}", 12,
     {"'b' [4, 12) overlaps tensor 'a' [0, 8)", NULL}},
    {"{\"a\":" T("U8", "[4]", "[4,8]") ",\"b\":" T("U8", "[8]", "[0,8]") "}", 8, {"overlaps", NULL}},
    {"{\"w\":" T("F32", "[1]", "[0,4]") ",\"w\":" T("F32", "[1]", "[4,8]") "}", 8, {"duplicate tensor name 'w'", NULL}},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, {"duplicate \"__metadata__\"", NULL}},
    {"{\"__metadata__\":[]}", 0, {"__metadata__ is not a JSON object", NULL}},
    {"{\"__metadata__\":{\"epoch\":3}}", 0, {"__metadata__ key 'epoch'", "not a string"}},
    {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, {"__metadata__: duplicate key 'k'", NULL}},
};

Test(safetensors, each_validation_rule_names_the_file_tensor_and_problem)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        bytes b = make_file(c->json, NULL, c->dlen);
        cr_assert_null(ct_safetensors_open_memory(b.p, b.n, "case.st"), "case %zu accepted: %s", i, c->json);
        const char *msg = ct_last_error();
        cr_assert_eq(ct_last_status(), CT_ERR_FORMAT, "case %zu", i);
        cr_assert(strstr(msg, "safetensors 'case.st'") != NULL, "case %zu: %s", i, msg);
        for (int k = 0; k < 2; k++)
            cr_assert(!c->expect[k] || strstr(msg, c->expect[k]), "case %zu: '%s' not in: %s", i, c->expect[k], msg);
        free(b.p);
    }
}

Test(safetensors, header_length_rules)
{
    uint8_t buf[64] = {0};
    memcpy(buf + 8, "{}", 2);
    struct { uint64_t hl; size_t len; const char *expect; } cases[] = {
        {2, 7, "shorter than the 8-byte header length"},
        {1, 16, "header length 1 is below 2"},
        {0, 16, "header length 0 is below 2"},
        {(100u << 20) + 1, 64, "exceeds the 104857600-byte limit"},
        {UINT64_MAX, 64, "exceeds"},
        {57, 64, "header length 57 runs past the end of the 64-byte file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int k = 0; k < 8; k++) buf[k] = (uint8_t)(cases[i].hl >> (8 * k));
        cr_assert_null(ct_safetensors_open_memory(buf, cases[i].len, "len.st"));
        cr_assert(strstr(ct_last_error(), cases[i].expect), "case %zu: %s", i, ct_last_error());
    }
    memcpy(buf, "\x02\0\0\0\0\0\0\0", 8);
    ct_safetensors *f = ct_safetensors_open_memory(buf, 10, "len.st");
    cr_assert(f && ct_safetensors_count(f) == 0, "\"{}\" with no data is a valid file");
    ct_safetensors_close(f);
}

Test(safetensors, open_and_lookup_errors_name_the_path_and_cause)
{
    cr_assert_null(ct_safetensors_open("/nonexistent/dir/model.safetensors"));
    cr_assert_eq(ct_last_status(), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), "/nonexistent/dir/model.safetensors") && strstr(ct_last_error(), "No such file"),
              "%s", ct_last_error());
    cr_assert_null(ct_safetensors_open("/tmp"));
    cr_assert(strstr(ct_last_error(), "not a regular file"), "%s", ct_last_error());
    cr_assert_null(ct_safetensors_open(NULL));

    bytes b = hand_file(0);
    ct_safetensors *f = ct_safetensors_open_memory(b.p, b.n, NULL);
    cr_assert_not_null(f);
    CT_FRAME {
        cr_assert_null(ct_safetensors_get(f, "nope"));
        cr_assert(strstr(ct_last_error(), "'nope'") && strstr(ct_last_error(), "<memory>"), "%s", ct_last_error());
        cr_assert_null(ct_safetensors_get(f, NULL));
        cr_assert(!ct_safetensors_info(f, "zz", NULL, NULL, NULL));
        cr_assert_null(ct_safetensors_name(f, 4));
        cr_assert(strstr(ct_last_error(), "index 4"));
        cr_assert_null(ct_safetensors_get(NULL, "a"));
    }
    ct_safetensors_close(f);
    ct_safetensors_close(NULL);
    free(b.p);
}

Test(safetensors, save_rejects_bad_requests_and_leaves_the_old_file)
{
    const char *path = tmp_path("keep.safetensors");
    write_bytes(path, "old", 3);
    CT_FRAME {
        ct_tensor *t = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2));
        ct_tensor *two[2] = {t, t};
        struct { int n; const char *names[2]; ct_tensor *const *ts; const char *expect; } cases[] = {
            {2, {"w", "w"}, two, "duplicate name or metadata key 'w'"},
            {1, {"", NULL}, two, "empty name"},
            {1, {"__metadata__", NULL}, two, "reserved"},
            {1, {"bad\xff", NULL}, two, "not valid UTF-8"},
            {1, {"w", NULL}, (ct_tensor *[]){NULL}, "tensor 'w' is NULL"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            cr_assert_neq(ct_safetensors_save(path, cases[i].n, cases[i].names, cases[i].ts, 0, NULL, NULL), CT_OK);
            cr_assert(strstr(ct_last_error(), cases[i].expect) && strstr(ct_last_error(), path), "case %zu: %s", i,
                      ct_last_error());
        }
        cr_assert_neq(ct_safetensors_save(path, 1, (const char *[]){"w"}, &t, 2, (const char *[]){"k", "k"},
                                          (const char *[]){"1", "2"}),
                      CT_OK);
        cr_assert(strstr(ct_last_error(), "duplicate name or metadata key 'k'"), "%s", ct_last_error());
        cr_assert_neq(ct_safetensors_save(path, 1, (const char *[]){"w"}, &t, 1, (const char *[]){"k"},
                                          (const char *[]){NULL}),
                      CT_OK);
        cr_assert_eq(ct_safetensors_save("/nonexistent/dir/x.safetensors", 1, (const char *[]){"w"}, &t, 0, NULL, NULL),
                     CT_ERR_IO);
        cr_assert(strstr(ct_last_error(), "/nonexistent/dir/x.safetensors.tmp.") &&
                      strstr(ct_last_error(), "No such file"),
                  "%s", ct_last_error());
    }
    bytes b = read_bytes(path);
    cr_assert(b.n == 3 && memcmp(b.p, "old", 3) == 0, "a failed save leaves the old file");
    free(b.p);
    cr_assert_eq(count_files_with(".tmp."), 0);
}

/* A write that fails half-way (file size limit) leaves the old file and no temporary. */
Test(safetensors, failed_write_midway_is_atomic)
{
    const char *path = tmp_path("atomic.safetensors");
    write_bytes(path, "previous", 8);
    signal(SIGXFSZ, SIG_IGN); /* write() then fails with EFBIG instead of killing us */
    struct rlimit rl = {4096, 4096};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    CT_FRAME {
        ct_tensor *t = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(64, 64)); /* 16 KiB > 4 KiB */
        cr_assert_eq(ct_safetensors_save(path, 1, (const char *[]){"w"}, &t, 0, NULL, NULL), CT_ERR_IO);
        cr_assert(strstr(ct_last_error(), "cannot write") && strstr(ct_last_error(), "File too large"), "%s",
                  ct_last_error());
    }
    bytes b = read_bytes(path);
    cr_assert(b.n == 8 && memcmp(b.p, "previous", 8) == 0);
    free(b.p);
    cr_assert_eq(count_files_with(".tmp."), 0);
}
