#!/usr/bin/env python3
"""Regenerates docs/api.md from the public headers that ctrain.h includes.

For each header: its opening comment as prose under the header's heading, then a
table with every public function (a declaration marked CT_API) and one sentence
about it, taken from the comment above its declaration; a comment directly above
a run of declarations describes the whole run. The headers stay the authority;
this page is the index. The output depends only on the headers (same input, same
bytes). Run from the repository root:

    make api-doc        (or: python3 tools/api_doc.py > docs/api.md)

With --check it exits 1 when a public function has no sentence.
"""
import re
import sys
import textwrap

PROTO = re.compile(r'^CT_API\s+[A-Za-z_][\w\s\*]*?\b(ct_\w+)\s*\(')
SENTENCE_MAX = 240   # characters of a table cell before it is cut at a word
WIDTH = 96           # prose is wrapped to this width


def comment_text(lines):
    """The words of a /* ... */ comment given as its source lines."""
    out = []
    for l in lines:
        s = l.strip()
        if s.startswith('/*'):
            s = s[2:]
        if s.endswith('*/'):
            s = s[:-2]
        s = s.strip()
        if s.startswith('*'):
            s = s[1:].strip()
        out.append(s)
    return re.sub(r'\s+', ' ', ' '.join(out)).strip()


def first_sentence(text):
    """Up to the first full stop that ends a sentence, cut at a word if too long."""
    m = re.match(r'(.+?[.!?])(\s+[A-Z("`]|\s*$)', text)
    s = m.group(1) if m else text
    if len(s) > SENTENCE_MAX:
        s = s[:SENTENCE_MAX].rsplit(' ', 1)[0].rstrip(',;:') + ' ...'
    return s


def prose(intro):
    """The header's opening comment as Markdown: paragraphs wrapped at WIDTH; runs of
    indented lines (formulas, tables, code) kept as they are in a code block."""
    body = []
    for l in intro:
        s = l.rstrip()
        s = re.sub(r'^\s*/\*+', '', s)
        s = re.sub(r'\*/\s*$', '', s)
        s = re.sub(r'^\s?\*(?!/)', '', s) if s.lstrip().startswith('*') else s
        if s.startswith(' ') and not s.startswith('  '):
            s = s[1:]
        body.append(s.rstrip())
    if body and body[0].startswith('ctrain'):
        # "ctrain — what this header holds." is the heading's subtitle
        body[0] = re.sub(r'^ctrain\s+—\s+', '', body[0])
        body[0] = body[0][:1].upper() + body[0][1:]
    out, para, code = [], [], []

    def flush():
        if para:
            text = re.sub(r'\s+', ' ', ' '.join(para)).strip()
            out.extend(textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False))
            out.append('')
            para.clear()
        if code:
            while code and not code[-1].strip():
                code.pop()
            out.append('```')
            out.extend(code)
            out.append('```')
            out.append('')
            code.clear()

    for s in body:
        if not s.strip():
            if code:
                code.append('')
            else:
                flush()
        elif s.startswith('  ') or (code and s.startswith(' ')):
            if para:
                flush()
            code.append(s)
        else:
            if code:
                flush()
            para.append(s)
    flush()
    return out


def header_doc(path, missing):
    lines = open(path, encoding='utf-8').read().splitlines()
    intro, i = [], 0
    if lines and lines[0].startswith('/*'):
        while i < len(lines):
            intro.append(lines[i])
            if '*/' in lines[i]:
                break
            i += 1
    out = ['## `%s`' % path, '']
    out += prose(intro)
    rows, comment, current, in_comment = [], [], '', False
    for line in lines[i + 1:]:
        s = line.strip()
        if in_comment:
            comment.append(s)
            in_comment = '*/' not in s
            if not in_comment:
                current = comment_text(comment)
            continue
        if s.startswith('/*'):
            comment, in_comment = [s], '*/' not in s
            if not in_comment:
                current = comment_text(comment)
            continue
        m = PROTO.match(line)
        if m:
            sentence = first_sentence(current) if current else ''
            if not sentence:
                missing.append('%s: %s' % (path, m.group(1)))
            rows.append('| `%s` | %s |' % (m.group(1), sentence.replace('|', '\\|')))
        elif not s or s.startswith('#') or s.startswith('typedef') or s.startswith('}'):
            # a blank line, a macro or a type ends the run a comment describes
            current = ''
    if rows:
        out += ['| function | summary |', '|---|---|'] + rows + ['']
    return out


def main():
    headers = re.findall(r'^#include "([^"]+)"', open('ctrain.h', encoding='utf-8').read(), re.M)
    missing = []
    page = ['# ctrain API reference', '',
            'Generated from the public headers by `tools/api_doc.py` (`make api-doc`); each header',
            'holds the full contract (shapes, ownership, errors). Functions returning `ct_tensor *`',
            'return a new reference owned by the current frame unless the header says otherwise.',
            'These functions, and only these, are exported by `libctrain.so`.', '']
    for h in headers:
        page += header_doc(h, missing)
    if '--check' in sys.argv[1:]:
        for m in missing:
            print('no sentence: ' + m, file=sys.stderr)
        return 1 if missing else 0
    sys.stdout.write('\n'.join(page).rstrip('\n') + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
