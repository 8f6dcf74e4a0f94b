#!/usr/bin/env python3
"""Regenerates docs/api.md from the public headers that ctrain.h includes.

For each header: its opening comment, then every public function with the first
sentence of the comment above it. The headers stay the authority; this page is
the index. Run from the repository root: python3 tools/api_doc.py > docs/api.md
"""
import re
import sys

PROTO = re.compile(r'^[A-Za-z_][\w\s\*]*?\b(ct_\w+)\s*\(')


def first_sentence(comment):
    text = ' '.join(l.strip().lstrip('/*').strip() for l in comment).strip()
    text = re.sub(r'\s+', ' ', text.replace('*/', '')).strip()
    m = re.match(r'(.+?\.)(\s|$)', text)
    return (m.group(1) if m else text)[:200]


def header_doc(path):
    lines = open(path).read().splitlines()
    intro, i = [], 0
    if lines and lines[0].startswith('/*'):
        while i < len(lines):
            intro.append(lines[i])
            if '*/' in lines[i]:
                break
            i += 1
    out = ['## `%s`' % path, '']
    body = ' '.join(l.strip().lstrip('/*').strip() for l in intro).replace('*/', '').strip()
    if body:
        out += [re.sub(r'\s+', ' ', body), '']
    rows, comment, in_comment = [], [], False
    for line in lines[i + 1:]:
        s = line.strip()
        if s.startswith('/*'):
            comment, in_comment = [s], '*/' not in s
            continue
        if in_comment:
            comment.append(s)
            in_comment = '*/' not in s
            continue
        m = PROTO.match(line)
        if m and not s.startswith('#') and not s.startswith('typedef'):
            # a comment above a run of declarations describes the whole run
            rows.append('| `%s` | %s |' % (m.group(1), first_sentence(comment).replace('|', '\\|')))
        elif not s:
            comment = []
    if rows:
        out += ['| function | summary |', '|---|---|'] + rows + ['']
    return out


def main():
    headers = re.findall(r'#include "([^"]+)"', open('ctrain.h').read())
    print('# ctrain API reference\n')
    print('Generated from the public headers by `tools/api_doc.py`; each header holds the full')
    print('contract (shapes, ownership, errors). Functions returning `ct_tensor *` return a new')
    print('reference owned by the current frame unless the header says otherwise.\n')
    for h in headers:
        print('\n'.join(header_doc(h)))


if __name__ == '__main__':
    sys.exit(main())
