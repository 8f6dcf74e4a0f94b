/* Test helper for the Hugging Face oracles of data/bpe*.c: the fortunes corpus (the
 * text files of Debian's fortunes packages) and the venv that holds `tokenizers`. */
#ifndef CT_TESTS_DATA_FORTUNES_H
#define CT_TESTS_DATA_FORTUNES_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/tmpdir.h"

#define FORTUNES "/usr/share/games/fortunes"

static inline bool valid_utf8(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n || (len == 2 && c < 0xC2)) return false;
        uint32_t cp = len == 1 ? c : c & (0x7F >> len);
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (p[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += len;
    }
    return true;
}

/* Appends the valid UTF-8 lines of the corpus (the files without an extension:
 * not ., .., *.dat, *.u8), each with a "\n", to out. Returns the number of lines,
 * 0 when there is no corpus. */
static inline size_t fortunes_append(FILE *out)
{
    DIR *d = opendir(FORTUNES);
    if (!d) return 0;
    size_t lines = 0;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (strchr(e->d_name, '.')) continue;
        snprintf(p, sizeof p, "%s/%s", FORTUNES, e->d_name);
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        size_t n;
        uint8_t *text = read_all(p, &n);
        for (size_t i = 0; i < n;) {
            uint8_t *nl = memchr(text + i, '\n', n - i);
            size_t len = nl ? (size_t)(nl - (text + i)) : n - i;
            if (valid_utf8(text + i, len)) {
                fwrite(text + i, 1, len, out);
                fputc('\n', out);
                lines++;
            }
            i += len + 1;
        }
        free(text);
    }
    closedir(d);
    return lines;
}

/* $CTRAIN_BPE_VENV, else $CTRAIN_SRC/build/tests/venv-tokenizers */
static inline const char *bpe_venv_dir(void)
{
    static char p[1024];
    const char *v = getenv("CTRAIN_BPE_VENV");
    if (v && *v) return v;
    const char *src = getenv("CTRAIN_SRC");
    snprintf(p, sizeof p, "%s/build/tests/venv-tokenizers", src && *src ? src : ".");
    return p;
}

#endif
