"""Byte-level BPE encoding speed: Hugging Face tokenizers' Tokenizer.encode on a text
file, one thread (run with RAYON_NUM_THREADS=1; a single encode is sequential anyway).

    python hf_encode.py TOKENIZER_JSON TEXT [REPS]

The same protocol as bpe_encode.c: each round loads the tokenizer afresh and encodes
the whole file as one string; only the encoding is timed."""
import statistics
import sys
import time

from tokenizers import Tokenizer

path, text_path = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
with open(text_path, "rb") as f:
    raw = f.read()
text = raw.decode("utf-8")
times = []
for _ in range(reps):
    tok = Tokenizer.from_file(path)
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(f"tokenizers seconds {med:.4f} MB/s {len(raw) / med / 1e6:.2f} tokens {len(ids)} idsum {sum(ids)}")
