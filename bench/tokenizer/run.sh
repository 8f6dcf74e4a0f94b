#!/usr/bin/env bash
# Byte-level BPE encoding speed, one thread: ctrain's ct_bpe_encode
# (bench/tokenizer/bpe_encode.c) beside Hugging Face tokenizers (hf_encode.py), on the
# fortunes corpus (the text files of Debian's fortunes packages under
# /usr/share/games/fortunes, their valid UTF-8 lines), with a byte-level BPE that
# tokenizers trains on that corpus.
#
#   bench/tokenizer/run.sh [--vocab N] [--reps R] [--venv DIR] [--timeout S]
#
# --vocab (default 16384) sizes the trained vocabulary, --reps (default 5) the rounds
# (medians are reported). The venv (default build/tests/venv-tokenizers, the test
# suite's) is made with `pip install tokenizers` when it lacks it. Prints both rates,
# their ratio and the CPU; the two programs must produce the same tokens (count and
# sum of ids), or the run fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
vocab=16384 reps=5 venv=build/tests/venv-tokenizers limit=600
while [ $# -gt 0 ]; do
    case $1 in
        --vocab) vocab=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --venv) venv=$2; shift 2 ;;
        --timeout) limit=$2; shift 2 ;;
        *) echo "bench/tokenizer/run.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
[ -d /usr/share/games/fortunes ] || { echo "no /usr/share/games/fortunes: install Debian's fortunes" >&2; exit 1; }
if ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
    /usr/bin/python3 -m venv "$venv"
    timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check tokenizers
fi
make --no-print-directory CUDA=0 build/bench/tokenizer/bpe_encode >/dev/null
work=$(mktemp -d build/bench/tokenizer/work.XXXXXX)
trap 'rm -rf "$work"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

timeout "$limit" "$venv/bin/python" - "$work" "$vocab" <<'PY'
import os, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
work, vocab = sys.argv[1], int(sys.argv[2])
d = "/usr/share/games/fortunes"
lines = []
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    if "." in name or not os.path.isfile(p):
        continue
    for line in open(p, "rb").read().split(b"\n"):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            pass
with open(f"{work}/corpus.txt", "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train([f"{work}/corpus.txt"], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(f"{work}/tokenizer.json")
PY

c=$(timeout "$limit" build/bench/tokenizer/bpe_encode "$work/tokenizer.json" "$work/corpus.txt" "$reps")
h=$(timeout "$limit" "$venv/bin/python" bench/tokenizer/hf_encode.py "$work/tokenizer.json" "$work/corpus.txt" "$reps")
echo "$c"
echo "$h"
size=$(stat -c %s "$work/corpus.txt")
echo "corpus: $size bytes of UTF-8 text, vocabulary $vocab; $("$venv/bin/python" -c 'import tokenizers; print("tokenizers", tokenizers.__version__)'), one thread"
for mode in whole lines; do
    read -r _ _ _ cs _ _ _ ctok _ csum <<<"$(grep " $mode " <<<"$c")"
    read -r _ _ _ hs _ _ _ htok _ hsum <<<"$(grep " $mode " <<<"$h")"
    if [ "$ctok $csum" != "$htok $hsum" ]; then
        echo "bench/tokenizer/run.sh: $mode: the tokens differ (ctrain $ctok, sum $csum; tokenizers $htok, sum $hsum)" >&2
        exit 1
    fi
    echo "$mode: $ctok tokens; tokenizers time / ctrain time = $(awk -v a="$hs" -v b="$cs" 'BEGIN { printf "%.2f", a / b }')"
done
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
