/* Byte-level BPE: a tokenizer.json's own pre-tokenisation regex (a "Split"
 * pre-tokenizer, as Llama 3, Qwen2 and GPT-4-style files use), written for
 * Hugging Face's Oniguruma and compiled here with PCRE2.
 *
 * The two engines agree on most of the syntax; where they read the same text
 * differently the pattern is rewritten, and a construct whose rewrite is not
 * known is refused, so that a file never tokenises differently in silence:
 *   \s, \S    Oniguruma: Unicode White_Space (PCRE2's \s differs on U+0085 and
 *             U+180E); spelled out as the class below. \S inside [...] is refused.
 *   \v        Oniguruma: the character U+000B; PCRE2: vertical whitespace.
 *   \h, \H    Oniguruma: a hex digit (or not); PCRE2: horizontal whitespace.
 *   \uHHHH    Oniguruma's spelling of \x{HHHH}.
 *   {,n}      Oniguruma: {0,n}; PCRE2 10.42: the literal text.
 *   {n,m}+    Oniguruma: a repeat of the interval; PCRE2: possessive. Refused.
 *   \w \W \b \B, digits after \, [[:class:]], nested [..[..]], &&, and
 *             inline options other than i: refused (word characters, \h and the
 *             options mean different things; the rest have no PCRE2 spelling).
 *   ^ $ .     Oniguruma's are line anchors and "not \n": PCRE2 compiles with
 *             PCRE2_MULTILINE and newline LF.
 * (?i:...), \p{..}, lookarounds, atomic groups and possessive *+ ++ ?+ read the
 * same in both. Case-insensitive matching differs only on case folds to several
 * characters (Oniguruma: "ss" matches U+00DF), which PCRE2 does not do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe_internal.h"

/* Unicode White_Space, as data/bpe.c spells it for GPT-2's regex */
#define WS "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

typedef struct out_buf {
    char *p;
    size_t n, cap;
    bool oom;
} out_buf;

static void put(out_buf *o, const char *s, size_t n)
{
    if (o->oom) return;
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n + 1) cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) {
            o->oom = true;
            return;
        }
        o->p = p, o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = '\0';
}

static void puts_(out_buf *o, const char *s) { put(o, s, strlen(s)); }

static ct_status refuse(const char *name, const char *where, size_t at, const char *what)
{
    return ct_error_set(CT_ERR_UNSUPPORTED,
                        "bpe: '%s': %s: the regex's %s at byte %zu is not supported (Oniguruma and PCRE2 read it "
                        "differently, or ctrain does not translate it)",
                        name, where, what, at);
}

/* the length of the {...} that starts at p (0: none) */
static size_t braces(const char *p)
{
    if (*p != '{') return 0;
    const char *e = strchr(p, '}');
    return e ? (size_t)(e - p) + 1 : 0;
}

/* Rewrites the Oniguruma pattern src into PCRE2's syntax (see the top). */
static ct_status translate(const char *src, const char *name, const char *where, out_buf *o)
{
    bool in_class = false;
    for (size_t i = 0; src[i];) {
        char c = src[i];
        if (c == '\\') {
            char e = src[i + 1];
            if (!e) return refuse(name, where, i, "trailing \\");
            size_t at = i;
            i += 2;
            if (e == 's') puts_(o, in_class ? WS : "[" WS "]");
            else if (e == 'S') {
                if (in_class) return refuse(name, where, at, "\\S inside a character class");
                puts_(o, "[^" WS "]");
            } else if (e == 'v') puts_(o, "\\x{0b}");
            else if (e == 'h') puts_(o, in_class ? "0-9a-fA-F" : "[0-9a-fA-F]");
            else if (e == 'H') {
                if (in_class) return refuse(name, where, at, "\\H inside a character class");
                puts_(o, "[^0-9a-fA-F]");
            }
            else if (e == 'u') {
                size_t k = 0;
                while (k < 4 && src[i + k] && strchr("0123456789abcdefABCDEF", src[i + k])) k++;
                if (k != 4) return refuse(name, where, at, "\\u not followed by 4 hex digits");
                puts_(o, "\\x{");
                put(o, src + i, 4);
                puts_(o, "}");
                i += 4;
            } else if (e == 'p' || e == 'P' || e == 'x') {
                put(o, src + at, 2);
                size_t k = braces(src + i); /* \p{L}, \x{41}: the braces go as they are */
                put(o, src + i, k);
                i += k;
            } else if (strchr("dDtnrfaeAzZ", e)) put(o, src + at, 2);
            else if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
                char what[32];
                snprintf(what, sizeof what, "escape \\%c", e);
                return refuse(name, where, at, what);
            } else put(o, src + at, 2); /* an escaped punctuation character (or a byte of one) */
            continue;
        }
        if (in_class) {
            if (c == '[') return refuse(name, where, i, src[i + 1] == ':' ? "[:class:]" : "nested character class");
            if (c == '&' && src[i + 1] == '&') return refuse(name, where, i, "class intersection &&");
            if (c == ']') in_class = false;
            put(o, &c, 1);
            i++;
            continue;
        }
        if (c == '[') { /* a ] right after [ or [^ is a literal in both */
            size_t k = 1 + (src[i + 1] == '^');
            if (src[i + k] == ']') k++;
            put(o, src + i, k);
            i += k;
            in_class = true;
            continue;
        }
        if (c == '(' && src[i + 1] == '?') {
            const char *g = src + i + 2;
            bool plain = *g && strchr(":=!>#", *g);
            bool look_behind = g[0] == '<' && (g[1] == '=' || g[1] == '!');
            bool named = g[0] == '<' && ((g[1] >= 'a' && g[1] <= 'z') || (g[1] >= 'A' && g[1] <= 'Z') || g[1] == '_');
            if (!plain && !look_behind && !named) { /* inline options: only i */
                size_t k = 0;
                while (g[k] == 'i' || g[k] == '-') k++;
                if (!k || (g[k] != ':' && g[k] != ')')) return refuse(name, where, i, "inline option (other than i)");
            }
            put(o, "(?", 2);
            i += 2;
            continue;
        }
        if (c == '{') {
            size_t k = braces(src + i);
            if (k && src[i + k] == '+') return refuse(name, where, i, "interval followed by + ({n,m}+)");
            if (k && src[i + 1] == ',') { /* {,n} */
                puts_(o, "{0");
                i++;
                continue;
            }
        }
        put(o, &c, 1);
        i++;
    }
    if (in_class) return ct_error_set(CT_ERR_FORMAT, "bpe: '%s': %s: the regex has an unclosed [", name, where);
    return o->oom ? ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory for the regex", name) : CT_OK;
}

pcre2_code *cti_bpe_regex_onig(const char *pattern, const char *name, const char *where)
{
    out_buf o = {0};
    if (translate(pattern, name, where, &o)) {
        free(o.p);
        return NULL;
    }
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        free(o.p);
        ct_error_set(CT_ERR_NOMEM, "bpe: '%s': out of memory for the regex", name);
        return NULL;
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(o.p ? o.p : ""), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE, &err, &off, cc);
    pcre2_compile_context_free(cc);
    if (!re) {
        char msg[256];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        ct_error_set(CT_ERR_FORMAT,
                     "bpe: '%s': %s: PCRE2 cannot compile the regex (as translated: '%s') at offset %zu: %s", name,
                     where, o.p ? o.p : "", (size_t)off, msg);
    } else (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    free(o.p);
    return re;
}
