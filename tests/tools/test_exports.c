/* The interface of libctrain.so: what `nm -D --defined-only` lists must be exactly
 * the documented API. Every exported symbol is a ct_ function declared in a public
 * header (one ctrain.h includes) and listed in docs/api.md; no cti_ helper (the
 * library's own, declared in *_internal.h) and no data symbol is exported; every
 * function docs/api.md lists is exported (a public declaration without CT_API would
 * be missing). `make test` names the library and the source tree in CTRAIN_LIB and
 * CTRAIN_SRC. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char **v;
    int n, cap;
} names;

static void names_add(names *s, const char *p, size_t len)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
        cr_assert_not_null(s->v);
    }
    s->v[s->n] = strndup(p, len);
    cr_assert_not_null(s->v[s->n]);
    s->n++;
}

static bool names_has(const names *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], name)) return true;
    return false;
}

static void names_free(names *s)
{
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

static const char *env_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set: run through `make test`", var);
    return v;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert_not_null(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n, "short read of %s", path);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* The dynamic symbols the library defines: functions (nm types T, W, i) into fns,
 * everything else (data: D, B, R, V, ...) into data. */
static void exported(names *fns, names *data)
{
    const char *lib = env_or_skip("CTRAIN_LIB");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s' 2>&1", lib);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "cannot run nm");
    char line[1024], type[8], name[512];
    while (fgets(line, sizeof line, f)) {
        /* "0000000000012340 T ct_tensor_new" (address, type, name) */
        if (sscanf(line, "%*s %7s %511s", type, name) != 2) continue;
        bool fn = !strcmp(type, "T") || !strcmp(type, "W") || !strcmp(type, "i");
        names_add(fn ? fns : data, name, strlen(name));
    }
    int rc = pclose(f);
    cr_assert_eq(rc, 0, "nm -D --defined-only %s failed (status %d)", lib, rc);
    /* a library that exports almost nothing means nm or the build went wrong */
    cr_assert_gt(fns->n, 100, "only %d functions exported by %s", fns->n, lib);
}

/* The function names docs/api.md lists: its table rows "| `ct_name` | ... |". */
static void documented(names *doc)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/api.md", env_or_skip("CTRAIN_SRC"));
    char *s = read_file(path);
    for (char *p = s; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, "| `", 3)) continue;
        const char *b = p + 3, *e = strchr(b, '`');
        if (e && memchr(b, '\n', (size_t)(e - b)) == NULL) names_add(doc, b, (size_t)(e - b));
    }
    free(s);
    cr_assert_gt(doc->n, 100, "only %d functions listed in %s", doc->n, path);
}

/* The public headers' text: ctrain.h and every header it includes, concatenated. */
static char *public_headers(void)
{
    const char *src = env_or_skip("CTRAIN_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/ctrain.h", src);
    char *umbrella = read_file(path);
    size_t cap = strlen(umbrella) + 1, n = 0;
    char *all = malloc(cap);
    cr_assert_not_null(all);
    all[0] = '\0';
    int count = 0;
    for (char *p = umbrella; (p = strstr(p, "#include \"")) != NULL; p++) {
        char *b = p + strlen("#include \""), *e = strchr(b, '"');
        cr_assert_not_null(e);
        snprintf(path, sizeof path, "%s/%.*s", src, (int)(e - b), b);
        char *h = read_file(path);
        size_t k = strlen(h);
        all = realloc(all, cap += k + 1);
        cr_assert_not_null(all);
        memcpy(all + n, h, k);
        all[n += k] = '\n';
        all[++n] = '\0';
        free(h);
        count++;
    }
    free(umbrella);
    cr_assert_gt(count, 10, "ctrain.h includes only %d headers", count);
    return all;
}

/* name followed by "(" as a whole word in text, on a line that starts with CT_API
 * (a declaration the library exports), not inside a comment's prose. */
static bool declared(const char *text, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = text; (p = strstr(p, name)) != NULL; p += len) {
        if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) continue;
        const char *q = p + len;
        while (*q == ' ') q++;
        if (*q != '(') continue;
        const char *bol = p;
        while (bol > text && bol[-1] != '\n') bol--;
        if (!strncmp(bol, "CT_API ", 7)) return true;
    }
    return false;
}

Test(exports, only_ct_functions)
{
    names fns = {0}, data = {0};
    exported(&fns, &data);
    int bad = 0;
    for (int i = 0; i < fns.n; i++) {
        const char *s = fns.v[i];
        if (!strncmp(s, "cti_", 4)) {
            cr_log_error("internal helper exported: %s (declare it without CT_API)", s);
            bad++;
        } else if (strncmp(s, "ct_", 3)) {
            cr_log_error("exported without the ct_ prefix: %s", s);
            bad++;
        }
    }
    for (int i = 0; i < data.n; i++) {
        cr_log_error("data symbol exported: %s", data.v[i]);
        bad++;
    }
    names_free(&fns);
    names_free(&data);
    cr_expect_eq(bad, 0, "%d symbols exported that are not the API (listed above)", bad);
}

Test(exports, declared_and_documented)
{
    names fns = {0}, data = {0}, doc = {0};
    exported(&fns, &data);
    documented(&doc);
    char *hdrs = public_headers();
    int bad = 0;
    for (int i = 0; i < fns.n; i++) {
        const char *s = fns.v[i];
        if (!declared(hdrs, s)) {
            cr_log_error("exported but not declared CT_API in a public header: %s", s);
            bad++;
        }
        if (!names_has(&doc, s)) {
            cr_log_error("exported but not in docs/api.md: %s (make api-doc)", s);
            bad++;
        }
    }
    free(hdrs);
    names_free(&fns);
    names_free(&data);
    names_free(&doc);
    cr_expect_eq(bad, 0, "%d problems (listed above)", bad);
}

Test(exports, documented_are_exported)
{
    names fns = {0}, data = {0}, doc = {0};
    exported(&fns, &data);
    documented(&doc);
    int bad = 0;
    for (int i = 0; i < doc.n; i++)
        if (!names_has(&fns, doc.v[i])) {
            cr_log_error("in docs/api.md but not exported: %s (CT_API missing?)", doc.v[i]);
            bad++;
        }
    names_free(&fns);
    names_free(&data);
    names_free(&doc);
    cr_expect_eq(bad, 0, "%d documented functions missing from the library (listed above)", bad);
}
