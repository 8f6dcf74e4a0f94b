"""Byte-level BPE encoding speed: Hugging Face tokenizers' Tokenizer.encode on a text
file, one thread (run with RAYON_NUM_THREADS=1; a single encode is sequential anyway).

    python hf_encode.py TOKENIZER_JSON TEXT [REPS]

The same protocol as bpe_encode.c: each round loads the tokenizer afresh and encodes
the file whole, as one string ("whole"), then, with a fresh tokenizer, line by line
with encode_batch ("lines", one thread under RAYON_NUM_THREADS=1); only the encoding
is timed."""
import statistics
import sys
import time

from tokenizers import Tokenizer

path, text_path = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
with open(text_path, "rb") as f:
    raw = f.read()
text = raw.decode("utf-8")
lines = text.split("\n")
times = {"whole": [], "lines": []}
for _ in range(reps):
    for mode in times:
        tok = Tokenizer.from_file(path)
        t0 = time.perf_counter()
        if mode == "whole":
            ids = tok.encode(text, add_special_tokens=False).ids
        else:
            ids = [i for e in tok.encode_batch(lines, add_special_tokens=False) for i in e.ids]
        times[mode].append(time.perf_counter() - t0)
        count, total = len(ids), sum(ids)
        if mode == "whole":
            whole = (count, total)
        else:
            per_line = (count, total)
for mode, (count, total) in (("whole", whole), ("lines", per_line)):
    med = statistics.median(times[mode])
    print(f"tokenizers {mode} seconds {med:.4f} MB/s {len(raw) / med / 1e6:.2f} tokens {count} idsum {total}")
