/* Tests for data/tokenizer.c. The files it writes are read back byte by byte and
 * checked against llm.c's format as described in data/token_dataset.h (magic,
 * version, count, little-endian uint16 tokens), independently of the reader, and
 * then through the token dataset. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/frame.h"
#include "tests/tmpdir.h"
#include "core/tensor.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"

static void make_tmpdir(void)
{
    make_tmpdir_with("/tmp/ct_tokzr_");
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

TestSuite(tokenizer, .init = make_tmpdir, .fini = remove_tmpdir);

static uint32_t le(const uint8_t *p, int nbytes)
{
    uint32_t v = 0;
    for (int i = 0; i < nbytes; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

/* The .bin at path holds exactly the bytes text[0..n) as uint16 tokens. */
static void check_bin(const char *path, const uint8_t *text, size_t n)
{
    size_t size;
    uint8_t *b = read_all(path, &size);
    cr_assert_eq(size, 1024 + 2 * n);
    cr_assert_eq(le(b, 4), 20240520u);
    cr_assert_eq(le(b + 4, 4), 1u);
    cr_assert_eq(le(b + 8, 4), (uint32_t)n);
    for (int i = 3; i < 256; i++) cr_assert_eq(le(b + 4 * i, 4), 0u, "header word %d", i);
    for (size_t i = 0; i < n; i++) cr_assert_eq(le(b + 1024 + 2 * i, 2), text[i], "token %zu", i);
    free(b);
}

Test(tokenizer, round_trip_all_bytes)
{
    uint8_t text[512];
    for (int i = 0; i < 512; i++) text[i] = (uint8_t)(i < 256 ? i : 511 - i); /* up, then down */
    uint16_t tok[512];
    cr_assert_eq(ct_tokenizer_encode(text, 512, tok, 512), 512);
    int64_t t64[512];
    for (int i = 0; i < 512; i++) {
        cr_assert_eq(tok[i], text[i]);
        t64[i] = tok[i];
    }
    char back[513];
    cr_assert_eq(ct_tokenizer_decode(t64, 512, back, sizeof back), 512);
    cr_assert_eq(memcmp(back, text, 512), 0, "NUL, control and high bytes survive");
    cr_assert_eq(back[512], '\0');
}

Test(tokenizer, encode_memory_writes_llmc_bin)
{
    uint8_t text[300];
    for (int i = 0; i < 300; i++) text[i] = (uint8_t)(i * 7 + 3);
    const char *p = path_of("mem.bin");
    cr_assert_eq(ct_tokenizer_encode_memory(text, sizeof text, p), CT_OK, "%s", ct_last_error());
    check_bin(p, text, sizeof text);
    cr_assert_eq(count_entries(tmpdir), 1, "no temporary file left behind");
    /* overwriting an existing file replaces it */
    cr_assert_eq(ct_tokenizer_encode_memory("ab", 2, p), CT_OK);
    check_bin(p, (const uint8_t *)"ab", 2);
    /* empty text: a valid file with count 0 */
    cr_assert_eq(ct_tokenizer_encode_memory(NULL, 0, p), CT_OK, "%s", ct_last_error());
    check_bin(p, NULL, 0);
}

Test(tokenizer, encode_file_and_read_back_through_the_dataset)
{
    /* every byte value, more than one read chunk (16 KiB) */
    size_t n = 40000;
    uint8_t *text = malloc(n);
    for (size_t i = 0; i < n; i++) text[i] = (uint8_t)((i * 131 + i / 256) & 0xFF);
    const char *tp = path_of("text.txt"), *bp = path_of("text.bin");
    FILE *fp = fopen(tp, "wb");
    cr_assert_eq(fwrite(text, 1, n, fp), n);
    cr_assert_eq(fclose(fp), 0);
    cr_assert_eq(ct_tokenizer_encode_file(tp, bp), CT_OK, "%s", ct_last_error());
    check_bin(bp, text, n);
    cr_assert_eq(count_entries(tmpdir), 2);

    /* the reader, with the byte vocabulary, gives the text back window by window */
    int64_t T = 1000;
    ct_dataset *ds = ct_token_dataset_open(bp, &(ct_token_dataset_config){.block_size = T,
                                                                           .vocab_size = CT_TOKENIZER_VOCAB_SIZE});
    cr_assert_not_null(ds, "%s", ct_last_error());
    cr_assert_eq(ct_dataset_len(ds), (int64_t)(n - 1) / T);
    char *back = malloc((size_t)T + 1);
    CT_FRAME {
        ct_tensor *x = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(1, T)), *y = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(1, T));
        for (int64_t i = 0; i < ct_dataset_len(ds); i++) {
            cr_assert_eq(ct_dataset_get(ds, i, (ct_tensor *[]){x, y}, 0), CT_OK, "%s", ct_last_error());
            cr_assert_eq(ct_tokenizer_decode(ct_tensor_data(x), T, back, T + 1), T);
            cr_assert_eq(memcmp(back, text + i * T, (size_t)T), 0, "window %lld", (long long)i);
            cr_assert_eq(ct_tokenizer_decode(ct_tensor_data(y), T, back, T + 1), T);
            cr_assert_eq(memcmp(back, text + i * T + 1, (size_t)T), 0);
        }
    }
    ct_dataset_free(ds);
    free(back);
    free(text);
}

Test(tokenizer, bad_arguments)
{
    uint16_t tok[4];
    cr_assert_eq(ct_tokenizer_encode("hello", 5, tok, 4), -1);
    cr_assert(strstr(ct_last_error(), "cap is 4") != NULL, "%s", ct_last_error());
    cr_assert_eq(ct_tokenizer_encode(NULL, 3, tok, 4), -1);
    cr_assert_eq(ct_tokenizer_encode("x", -1, tok, 4), -1);
    cr_assert_eq(ct_tokenizer_encode(NULL, 0, NULL, 0), 0);

    char buf[8];
    int64_t bad[3] = {65, 256, 66};
    cr_assert_eq(ct_tokenizer_decode(bad, 3, buf, sizeof buf), -1);
    cr_assert(strstr(ct_last_error(), "token 256 at position 1") != NULL, "%s", ct_last_error());
    bad[1] = -1;
    cr_assert_eq(ct_tokenizer_decode(bad, 3, buf, sizeof buf), -1);
    cr_assert(strstr(ct_last_error(), "token -1 at position 1") != NULL, "%s", ct_last_error());
    int64_t ok[3] = {65, 66, 67};
    cr_assert_eq(ct_tokenizer_decode(ok, 3, buf, 3), -1, "no room for the NUL");
    cr_assert(strstr(ct_last_error(), "4 bytes") != NULL, "%s", ct_last_error());
    cr_assert_eq(ct_tokenizer_decode(ok, 3, buf, 4), 3);
    cr_assert_str_eq(buf, "ABC");
}

Test(tokenizer, file_errors_name_the_path_and_leave_nothing)
{
    const char *missing = path_of("nope.txt");
    cr_assert_eq(ct_tokenizer_encode_file(missing, path_of("out.bin")), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), missing) && strstr(ct_last_error(), "No such file"), "%s", ct_last_error());
    cr_assert_eq(ct_tokenizer_encode_file(tmpdir, path_of("out.bin")), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), "directory") != NULL, "%s", ct_last_error());
    const char *deep = path_of("no/such/dir/out.bin");
    cr_assert_eq(ct_tokenizer_encode_memory("abc", 3, deep), CT_ERR_IO);
    cr_assert(strstr(ct_last_error(), "no/such/dir/out.bin.tmp") && strstr(ct_last_error(), "No such file"), "%s",
              ct_last_error());
    cr_assert_eq(count_entries(tmpdir), 0, "failures leave no files");
    cr_assert_eq(ct_tokenizer_encode_memory("abc", 3, NULL), CT_ERR_INVALID);
    cr_assert_eq(ct_tokenizer_encode_file(NULL, "x"), CT_ERR_INVALID);
}
