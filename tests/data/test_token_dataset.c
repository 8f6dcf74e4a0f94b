/* Tests for data/token_dataset.c and the checks in data/dataset.c. Every file is
 * assembled byte by byte here from the format's description (256 little-endian
 * int32 header words, then little-endian tokens) in a fresh mkdtemp directory, and
 * every window is compared with slices computed here from the token array. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/frame.h"
#include "tests/tmpdir.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "data/token_dataset.h"

/* ---- temp directory and file builders ------------------------------------- */

static void make_tmpdir(void)
{
    make_tmpdir_with("/tmp/ct_tokds_");
}

TestSuite(token_dataset, .init = make_tmpdir, .fini = remove_tmpdir);

static void put_le(uint8_t *p, uint32_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* header words h[0..2] (the rest zero) unless header is false, then n tokens of tb bytes;
 * extra bytes (may be negative: cut the file short) added at the end. */
static const char *write_tokens(const char *name, bool header, int32_t magic, int32_t version, int32_t count,
                                const uint32_t *tok, int64_t n, int tb, int64_t extra)
{
    size_t hb = header ? 1024 : 0;
    size_t size = hb + (size_t)n * (size_t)tb;
    uint8_t *b = calloc(size + (extra > 0 ? (size_t)extra : 0) + 1, 1);
    if (header) {
        put_le(b, (uint32_t)magic, 4);
        put_le(b + 4, (uint32_t)version, 4);
        put_le(b + 8, (uint32_t)count, 4);
    }
    for (int64_t i = 0; i < n; i++) put_le(b + hb + i * tb, tok[i], tb);
    size = (size_t)((int64_t)size + extra);
    const char *path = path_of(name);
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "%s", path);
    cr_assert_eq(fwrite(b, 1, size, fp), size);
    cr_assert_eq(fclose(fp), 0);
    free(b);
    return path;
}

static uint32_t *ramp(int64_t n, uint32_t base, uint32_t step)
{
    uint32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = base + (uint32_t)i * step;
    return t;
}

/* The message contains every fragment given (NULL-terminated). */
static void assert_msg(const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *))
        cr_assert(strstr(ct_last_error(), s) != NULL, "message lacks '%s': %s", s, ct_last_error());
    va_end(ap);
}

/* Every window of ds equals the hand-computed slices of tok for (begin, stride, T). */
static void check_windows(ct_dataset *ds, const uint32_t *tok, int64_t begin, int64_t end, int64_t stride, int64_t T,
                          ct_dtype dt)
{
    int64_t expect_len = 0;
    for (int64_t s = begin; s + T + 1 <= end; s += stride) expect_len++;
    cr_assert_eq(ct_dataset_len(ds), expect_len);
    CT_FRAME {
        ct_tensor *x = ct_tensor_full(dt, CT_SHAPE(3, T), -7);
        ct_tensor *y = ct_tensor_full(dt, CT_SHAPE(3, T), -7);
        for (int64_t i = 0; i < expect_len; i++) {
            int64_t row = i % 3, s = begin + i * stride;
            cr_assert_eq(ct_dataset_get(ds, i, (ct_tensor *[]){x, y}, row), CT_OK, "%s", ct_last_error());
            for (int64_t t = 0; t < T; t++) {
                cr_assert_eq((uint32_t)ct_tensor_get(x, (int64_t[]){row, t}), tok[s + t], "item %lld t %lld",
                             (long long)i, (long long)t);
                cr_assert_eq((uint32_t)ct_tensor_get(y, (int64_t[]){row, t}), tok[s + t + 1]);
            }
        }
    }
}

/* ---- formats --------------------------------------------------------------- */

Test(token_dataset, llmc_v1_uint16)
{
    int64_t n = 100;
    uint32_t *tok = ramp(n, 65450, 1); /* runs past 65535 ... */
    for (int64_t i = 0; i < n; i++) tok[i] &= 0xFFFF; /* ... and wraps: 65535 and 0 both appear */
    const char *p = write_tokens("v1.bin", true, 20240520, 1, (int32_t)n, tok, n, 2, 0);
    ct_dataset *ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 8});
    cr_assert_not_null(ds, "%s", ct_last_error());
    const ct_token_file_info *fi = ct_token_dataset_file(ds);
    cr_assert_eq(fi->format, CT_TOKENS_LLMC);
    cr_assert_eq(fi->token_bytes, 2);
    cr_assert_eq(fi->header_bytes, 1024);
    cr_assert_eq(fi->ntokens, 100);
    cr_assert_eq(fi->magic, 20240520);
    cr_assert_eq(fi->version, 1);
    cr_assert_eq(ct_dataset_len(ds), 12); /* starts 0, 8, ..., 88: 88 + 9 <= 100 < 96 + 9 */
    cr_assert_eq(ds->nslots, 2);
    cr_assert_eq(ds->slots[0].dtype, CT_DTYPE_I64);
    cr_assert_eq(ds->slots[0].ndim, 1);
    cr_assert_eq(ds->slots[0].shape[0], 8);
    check_windows(ds, tok, 0, n, 8, 8, CT_DTYPE_I64);
    ct_dataset_free(ds);
    free(tok);
}

Test(token_dataset, llmc_v2_uint32_and_llama3)
{
    int64_t n = 50;
    uint32_t *tok = ramp(n, 100000, 4099); /* beyond uint16 */
    const char *p2 = write_tokens("v2.bin", true, 20240520, 2, (int32_t)n, tok, n, 4, 0);
    const char *p7 = write_tokens("v7.bin", true, 20240801, 7, (int32_t)n, tok, n, 4, 0);
    const char *paths[2] = {p2, p7};
    for (int k = 0; k < 2; k++) {
        ct_dataset *ds = ct_token_dataset_open(paths[k], &(ct_token_dataset_config){.block_size = 5});
        cr_assert_not_null(ds, "%s", ct_last_error());
        cr_assert_eq(ct_token_dataset_file(ds)->token_bytes, 4);
        cr_assert_eq(ct_token_dataset_file(ds)->version, k ? 7 : 2);
        check_windows(ds, tok, 0, n, 5, 5, CT_DTYPE_I64);
        ct_dataset_free(ds);
    }
    free(tok);
}

Test(token_dataset, raw_uint16_and_uint32)
{
    int64_t n = 40;
    uint32_t *t16 = ramp(n, 3, 1601), *t32 = ramp(n, 70000, 123457);
    for (int64_t i = 0; i < n; i++) t16[i] &= 0xFFFF;
    const char *p16 = write_tokens("r16", false, 0, 0, 0, t16, n, 2, 0);
    const char *p32 = write_tokens("r32", false, 0, 0, 0, t32, n, 4, 0);
    ct_dataset *a = ct_token_dataset_open(p16, &(ct_token_dataset_config){.block_size = 4, .format = CT_TOKENS_RAW_U16});
    ct_dataset *b = ct_token_dataset_open(p32, &(ct_token_dataset_config){.block_size = 4, .format = CT_TOKENS_RAW_U32});
    cr_assert(a && b, "%s", ct_last_error());
    cr_assert_eq(ct_token_dataset_file(a)->header_bytes, 0);
    cr_assert_eq(ct_token_dataset_file(a)->ntokens, 40);
    cr_assert_eq(ct_token_dataset_file(b)->ntokens, 40);
    check_windows(a, t16, 0, n, 4, 4, CT_DTYPE_I64);
    check_windows(b, t32, 0, n, 4, 4, CT_DTYPE_I64);
    ct_dataset_free(a);
    ct_dataset_free(b);
    /* the same bytes read as the default llm.c format: no magic, a hint to set the format */
    ct_dataset *c = ct_token_dataset_open(p16, &(ct_token_dataset_config){.block_size = 4});
    cr_assert_null(c);
    /* 80 bytes: shorter than the header */
    assert_msg(p16, "1024-byte", "CT_TOKENS_RAW_U16", NULL);
    free(t16);
    free(t32);
}

Test(token_dataset, i32_batches)
{
    int64_t n = 30;
    uint32_t *tok = ramp(n, 9, 77);
    const char *p = write_tokens("i32.bin", true, 20240520, 1, (int32_t)n, tok, n, 2, 0);
    ct_dataset *ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 6, .dtype = CT_DTYPE_I32});
    cr_assert_not_null(ds, "%s", ct_last_error());
    cr_assert_eq(ds->slots[1].dtype, CT_DTYPE_I32);
    check_windows(ds, tok, 0, n, 6, 6, CT_DTYPE_I32);
    ct_dataset_free(ds);
    free(tok);
    /* a uint32 token above INT32_MAX cannot go in an i32 batch */
    uint32_t big[4] = {1, 2, 0x80000000u, 3};
    p = write_tokens("big.bin", false, 0, 0, 0, big, 4, 4, 0);
    ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 3, .format = CT_TOKENS_RAW_U32,
                                                             .dtype = CT_DTYPE_I32});
    cr_assert_not_null(ds, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(1, 3)), *y = ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(1, 3));
        cr_assert_eq(ct_dataset_get(ds, 0, (ct_tensor *[]){x, y}, 0), CT_ERR_FORMAT);
        assert_msg(p, "2147483648", "position 2", "CT_DTYPE_I64", NULL);
    }
    ct_dataset_free(ds);
}

/* ---- windows, strides, splits ------------------------------------------------ */

Test(token_dataset, strides)
{
    int64_t n = 57;
    uint32_t *tok = ramp(n, 1000, 3);
    const char *p = write_tokens("s.bin", true, 20240520, 1, (int32_t)n, tok, n, 2, 0);
    int64_t strides[] = {1, 3, 7, 10, 56};
    for (size_t k = 0; k < sizeof strides / sizeof strides[0]; k++) {
        ct_dataset *ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 7, .stride = strides[k]});
        cr_assert_not_null(ds, "%s", ct_last_error());
        check_windows(ds, tok, 0, n, strides[k], 7, CT_DTYPE_I64);
        ct_dataset_free(ds);
    }
    /* hand counts: stride 1 -> 57 - 8 + 1 = 50 windows; stride 56 -> 1 */
    ct_dataset *ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 7, .stride = 1});
    cr_assert_eq(ct_dataset_len(ds), 50);
    ct_dataset_free(ds);
    free(tok);
}

Test(token_dataset, exactly_one_window_and_too_short)
{
    uint32_t tok[10] = {5, 4, 3, 2, 1, 0, 1, 2, 3, 4};
    const char *p = write_tokens("ten.bin", true, 20240520, 1, 10, tok, 10, 2, 0);
    ct_dataset *ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 9});
    cr_assert_not_null(ds, "%s", ct_last_error());
    cr_assert_eq(ct_dataset_len(ds), 1);
    check_windows(ds, tok, 0, 10, 9, 9, CT_DTYPE_I64);
    ct_dataset_free(ds);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 10}));
    assert_msg(p, "10 tokens", "too few", "block_size + 1 = 11", NULL);
    cr_assert_eq(ct_last_status(), CT_ERR_FORMAT);
    /* an empty llm.c file (count 0) and an empty raw file */
    p = write_tokens("zero.bin", true, 20240520, 1, 0, tok, 0, 2, 0);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1}));
    assert_msg(p, "0 tokens", "too few", NULL);
    p = write_tokens("empty", false, 0, 0, 0, tok, 0, 2, 0);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1, .format = CT_TOKENS_RAW_U16}));
    assert_msg(p, "too few", NULL);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1}));
    assert_msg(p, "0 bytes is shorter than the 1024-byte", NULL);
}

Test(token_dataset, split_ranges)
{
    int64_t n = 200;
    uint32_t *tok = ramp(n, 0, 1);
    const char *p = write_tokens("split.bin", true, 20240520, 1, (int32_t)n, tok, n, 2, 0);
    ct_token_file_info info;
    cr_assert_eq(ct_token_file_probe(p, CT_TOKENS_LLMC, &info), CT_OK, "%s", ct_last_error());
    cr_assert_eq(info.ntokens, 200);
    int64_t cut = info.ntokens * 9 / 10; /* 180 */
    ct_dataset *train = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 16, .end = cut});
    ct_dataset *val = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 16, .begin = cut});
    cr_assert(train && val, "%s", ct_last_error());
    check_windows(train, tok, 0, cut, 16, 16, CT_DTYPE_I64);
    check_windows(val, tok, cut, n, 16, 16, CT_DTYPE_I64);
    cr_assert_eq(ct_dataset_len(train), 11); /* starts 0, 16, ..., 160: 160 + 17 <= 180 */
    cr_assert_eq(ct_dataset_len(val), 1);    /* 20 tokens: one window of 17 */
    /* tokens are their positions: no training target reaches the validation range */
    CT_FRAME {
        ct_tensor *x = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(1, 16)), *y = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(1, 16));
        for (int64_t i = 0; i < ct_dataset_len(train); i++) {
            cr_assert_eq(ct_dataset_get(train, i, (ct_tensor *[]){x, y}, 0), CT_OK);
            cr_assert_lt(ct_tensor_get(y, (int64_t[]){0, 15}), cut);
        }
        cr_assert_eq(ct_dataset_get(val, 0, (ct_tensor *[]){x, y}, 0), CT_OK);
        cr_assert_eq(ct_tensor_get(x, (int64_t[]){0, 0}), cut);
    }
    ct_dataset_free(train);
    ct_dataset_free(val);
    /* a middle range */
    ct_dataset *mid = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 4, .begin = 33, .end = 61, .stride = 5});
    cr_assert_not_null(mid, "%s", ct_last_error());
    check_windows(mid, tok, 33, 61, 5, 4, CT_DTYPE_I64);
    ct_dataset_free(mid);
    /* ranges outside the file */
    int64_t bad[][2] = {{0, 201}, {-1, 0}, {150, 100}, {0, -5}};
    for (int k = 0; k < 4; k++) {
        cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 4, .begin = bad[k][0], .end = bad[k][1]}));
        assert_msg(p, "range", "200 tokens", NULL);
    }
    free(tok);
}

/* ---- rejected files ------------------------------------------------------------ */

Test(token_dataset, size_mismatch)
{
    uint32_t *tok = ramp(100, 1, 1);
    /* header says 100, 90 are there */
    const char *p = write_tokens("short.bin", true, 20240520, 1, 100, tok, 90, 2, 0);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 4}));
    cr_assert_eq(ct_last_status(), CT_ERR_FORMAT);
    assert_msg(p, "header says 100 tokens", "1224 bytes", "file is 1204 bytes", "truncated", NULL);
    /* a byte cut off the last token */
    p = write_tokens("cut.bin", true, 20240520, 1, 100, tok, 100, 2, -1);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 4}));
    assert_msg(p, "file is 1223 bytes", "truncated", NULL);
    /* trailing garbage */
    p = write_tokens("long.bin", true, 20240520, 2, 100, tok, 100, 4, 3);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 4}));
    assert_msg(p, "1424 bytes", "file is 1427 bytes", "trailing", NULL);
    /* the count is read as uint16 tokens for version 1: a v2-sized file does not fit */
    p = write_tokens("ver.bin", true, 20240520, 1, 100, tok, 100, 4, 0);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 4}));
    assert_msg(p, "100 tokens of 2 bytes", "trailing", NULL);
    /* a negative count */
    p = write_tokens("neg.bin", true, 20240520, 1, -5, tok, 0, 2, 0);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 4}));
    assert_msg(p, "-5 tokens", "negative", NULL);
    /* raw files that are not whole tokens */
    p = write_tokens("odd16", false, 0, 0, 0, tok, 3, 2, 1);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1, .format = CT_TOKENS_RAW_U16}));
    assert_msg(p, "7 bytes", "2-byte", NULL);
    p = write_tokens("odd32", false, 0, 0, 0, tok, 3, 4, -2);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1, .format = CT_TOKENS_RAW_U32}));
    assert_msg(p, "10 bytes", "4-byte", NULL);
    free(tok);
}

Test(token_dataset, truncated_header_bad_magic_bad_version)
{
    uint32_t tok[4] = {1, 2, 3, 4};
    /* every header cut short is rejected: 0 .. 1023 bytes */
    const char *p = write_tokens("full.bin", true, 20240520, 1, 4, tok, 4, 2, 0);
    FILE *fp = fopen(p, "rb");
    uint8_t buf[1032];
    cr_assert_eq(fread(buf, 1, sizeof buf, fp), sizeof buf);
    fclose(fp);
    for (size_t cut = 0; cut < 1024; cut += 37) {
        ct_token_file_info info;
        cr_assert_eq(ct_token_file_parse(buf, cut, "cut", CT_TOKENS_LLMC, &info), CT_ERR_FORMAT);
        assert_msg("token file 'cut'", "shorter than the 1024-byte llm.c header", NULL);
    }
    /* every cut between header and full size: truncated */
    for (size_t cut = 1024; cut < sizeof buf; cut++) {
        ct_token_file_info info;
        cr_assert_eq(ct_token_file_parse(buf, cut, "cut", CT_TOKENS_LLMC, &info), CT_ERR_FORMAT);
        assert_msg("header says 4 tokens", "truncated", NULL);
    }
    p = write_tokens("magic.bin", true, 12345, 1, 4, tok, 4, 2, 0);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1}));
    assert_msg(p, "bad magic 12345", "20240520", NULL);
    p = write_tokens("version.bin", true, 20240520, 3, 4, tok, 4, 2, 0);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1}));
    assert_msg(p, "unknown version 3", NULL);
    p = write_tokens("version7.bin", true, 20240520, 7, 4, tok, 4, 4, 0);
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1}));
    assert_msg(p, "unknown version 7 for magic 20240520", NULL);
    /* probe agrees with open */
    ct_token_file_info info;
    cr_assert_eq(ct_token_file_probe(p, CT_TOKENS_LLMC, &info), CT_ERR_FORMAT);
    assert_msg(p, "unknown version 7", NULL);
}

Test(token_dataset, system_errors_name_the_file)
{
    const char *p = path_of("missing.bin");
    cr_assert_null(ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 1}));
    cr_assert_eq(ct_last_status(), CT_ERR_IO);
    assert_msg(p, "cannot open", "No such file or directory", NULL);
    ct_token_file_info info;
    cr_assert_eq(ct_token_file_probe(p, CT_TOKENS_LLMC, &info), CT_ERR_IO);
    assert_msg(p, "No such file", NULL);
    cr_assert_null(ct_token_dataset_open(tmpdir, &(ct_token_dataset_config){.block_size = 1}));
    assert_msg(tmpdir, "not a regular file", NULL);
    cr_assert_null(ct_token_dataset_open(NULL, &(ct_token_dataset_config){.block_size = 1}));
    assert_msg("path is NULL", NULL);
}

Test(token_dataset, bad_config_names_the_key)
{
    uint32_t tok[20] = {0};
    const char *p = write_tokens("cfg.bin", true, 20240520, 1, 20, tok, 20, 2, 0);
    struct {
        ct_token_dataset_config cfg;
        const char *frag;
    } cases[] = {
        {{.block_size = 0}, "block_size = 0"},
        {{.block_size = -3}, "block_size = -3"},
        {{.block_size = 2, .stride = -1}, "stride = -1"},
        {{.block_size = 2, .vocab_size = -2}, "vocab_size = -2"},
        {{.block_size = 2, .dtype = CT_DTYPE_F64}, "dtype = f64"},
        {{.block_size = 2, .format = (ct_token_format)9}, "format = 9"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cr_assert_null(ct_token_dataset_open(p, &cases[k].cfg));
        cr_assert_eq(ct_last_status(), CT_ERR_INVALID);
        assert_msg(p, cases[k].frag, NULL);
    }
    cr_assert_null(ct_token_dataset_open(p, NULL));
    assert_msg("config is NULL", NULL);
}

/* ---- vocab check on read --------------------------------------------------------- */

Test(token_dataset, vocab_check_on_read)
{
    uint32_t *tok = ramp(64, 0, 3); /* 0 .. 189 */
    tok[17] = 300;
    const char *p = write_tokens("vocab.bin", true, 20240520, 1, 64, tok, 64, 2, 0);
    ct_dataset *ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 8, .vocab_size = 256});
    cr_assert_not_null(ds, "%s", ct_last_error()); /* opening does not scan the tokens */
    CT_FRAME {
        ct_tensor *x = ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(1, 8), -1), *y = ct_tensor_full(CT_DTYPE_I64, CT_SHAPE(1, 8), -1);
        ct_tensor *s[2] = {x, y};
        cr_assert_eq(ct_dataset_get(ds, 0, s, 0), CT_OK); /* tokens 0 .. 8 */
        cr_assert_eq(ct_dataset_get(ds, 1, s, 0), CT_OK); /* tokens 8 .. 16: 16 is the last target */
        ct_tensor_fill_(x, -1);
        cr_assert_eq(ct_dataset_get(ds, 2, s, 0), CT_ERR_FORMAT); /* tokens 16 .. 24 */
        assert_msg(p, "token 300", "position 17", "byte offset 1058", "vocab_size 256", NULL);
        cr_assert_eq(ct_tensor_get(x, (int64_t[]){0, 0}), -1, "a failed get leaves the row untouched");
        cr_assert_eq(ct_dataset_get(ds, 3, s, 0), CT_OK);
    }
    ct_dataset_free(ds);
    /* the largest token, 189, is legal for vocab_size 190, not for 189 */
    tok[17] = 51;
    p = write_tokens("vocab2.bin", true, 20240520, 1, 64, tok, 64, 2, 0);
    for (int v = 189; v <= 190; v++) {
        ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 63, .vocab_size = v});
        CT_FRAME {
            ct_tensor *x = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(1, 63)), *y = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(1, 63));
            cr_assert_eq(ct_dataset_get(ds, 0, (ct_tensor *[]){x, y}, 0), v == 190 ? CT_OK : CT_ERR_FORMAT);
        }
        ct_dataset_free(ds);
    }
    free(tok);
}

/* ---- the generic get checks -------------------------------------------------------- */

Test(token_dataset, get_argument_checks)
{
    uint32_t *tok = ramp(32, 0, 1);
    const char *p = write_tokens("args.bin", true, 20240520, 1, 32, tok, 32, 2, 0);
    ct_dataset *ds = ct_token_dataset_open(p, &(ct_token_dataset_config){.block_size = 4});
    cr_assert_not_null(ds);
    CT_FRAME {
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2, 4)), *y = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2, 4));
        ct_tensor *f = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(2, 4));
        ct_tensor *w = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2, 5));
        ct_tensor *big = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2, 8));
        ct_tensor *strided = ct_tensor_slice(big, 1, 0, 8, 2); /* (2, 4) with stride 2 in a row */
        cr_assert_eq(ct_dataset_get(ds, 6, (ct_tensor *[]){x, y}, 1), CT_OK);
        cr_assert_eq(ct_dataset_get(ds, 7, (ct_tensor *[]){x, y}, 0), CT_ERR_INVALID);
        assert_msg("token", "item 7 out of range [0, 7)", NULL);
        cr_assert_eq(ct_dataset_get(ds, -1, (ct_tensor *[]){x, y}, 0), CT_ERR_INVALID);
        cr_assert_eq(ct_dataset_get(ds, 0, (ct_tensor *[]){x, y}, 2), CT_ERR_INVALID);
        assert_msg("row 2 out of range", "slot 0", "i64[2, 4] cpu", NULL);
        cr_assert_eq(ct_dataset_get(ds, 0, (ct_tensor *[]){x, f}, 0), CT_ERR_INVALID);
        assert_msg("slot 1 is f32[2, 4] cpu", "expected i64[B, 4] cpu", NULL);
        cr_assert_eq(ct_dataset_get(ds, 0, (ct_tensor *[]){w, y}, 0), CT_ERR_INVALID);
        assert_msg("slot 0 is i64[2, 5] cpu", NULL);
        cr_assert_eq(ct_dataset_get(ds, 0, (ct_tensor *[]){x, NULL}, 0), CT_ERR_INVALID);
        assert_msg("slot 1 is NULL", NULL);
        cr_assert_eq(ct_dataset_get(ds, 0, (ct_tensor *[]){strided, y}, 0), CT_ERR_INVALID);
        assert_msg("contiguous", NULL);
        cr_assert_eq(ct_dataset_get(ds, 0, NULL, 0), CT_ERR_INVALID);
        cr_assert_eq(ct_dataset_get(NULL, 0, (ct_tensor *[]){x, y}, 0), CT_ERR_INVALID);
        /* a row of a transposed-then-sliced batch whose rows are still contiguous is fine */
        ct_tensor *rows = ct_tensor_slice(ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(6, 4)), 0, 0, 6, 3);
        cr_assert_eq(ct_dataset_get(ds, 3, (ct_tensor *[]){rows, y}, 1), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_tensor_get(rows, (int64_t[]){1, 0}), 12);
    }
    cr_assert_eq(ct_dataset_len(NULL), -1);
    cr_assert_null(ct_token_dataset_file(NULL));
    ct_dataset_free(ds);
    ct_dataset_free(NULL);
    free(tok);
}

Test(token_dataset, open_memory_borrows_the_buffer)
{
    uint8_t buf[1024 + 2 * 12] = {0};
    put_le(buf, 20240520, 4);
    put_le(buf + 4, 1, 4);
    put_le(buf + 8, 12, 4);
    uint32_t tok[12];
    for (int i = 0; i < 12; i++) put_le(buf + 1024 + 2 * i, tok[i] = (uint32_t)(500 + i * i), 2);
    ct_dataset *ds = ct_token_dataset_open_memory(buf, sizeof buf, "mem", &(ct_token_dataset_config){.block_size = 3});
    cr_assert_not_null(ds, "%s", ct_last_error());
    check_windows(ds, tok, 0, 12, 3, 3, CT_DTYPE_I64);
    ct_dataset_free(ds);
    cr_assert_null(ct_token_dataset_open_memory(buf, 100, "mem", &(ct_token_dataset_config){.block_size = 3}));
    assert_msg("token file 'mem'", "100 bytes", NULL);
    cr_assert_null(ct_token_dataset_open_memory(NULL, 5, NULL, &(ct_token_dataset_config){.block_size = 3}));
    assert_msg("'<memory>'", "data is NULL", NULL);
}
