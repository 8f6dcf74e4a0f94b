#!/usr/bin/env bash
# Byte-level BPE encoding speed, one thread: ctrain's ct_bpe_encode
# (bench/tokenizer/bpe_encode.c) beside Hugging Face tokenizers (hf_encode.py), on the
# fortunes corpus (the text files of Debian's fortunes packages under
# /usr/share/games/fortunes, their valid UTF-8 lines), with a byte-level BPE that
# tokenizers trains on that corpus. Then training speed: `ctrain tokenizer train`
# beside tokenizers' BpeTrainer, the same settings, on the same corpus.
#
#   bench/tokenizer/run.sh [--vocab N] [--reps R] [--venv DIR] [--timeout S]
#
# --vocab (default 16384) sizes the trained vocabulary, --reps (default 5) the rounds
# (medians are reported). The venv (default build/tests/venv-tokenizers, the test
# suite's) is made with `pip install tokenizers` when it lacks it. Prints both rates,
# their ratio and the CPU; the two programs must produce the same tokens (count and
# sum of ids), and the two trainers the same vocabulary and merges, or the run fails.
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
make --no-print-directory CUDA=0 build/bench/tokenizer/bpe_encode build/bin/ctrain >/dev/null
work=$(mktemp -d build/bench/tokenizer/work.XXXXXX)
trap 'rm -rf "$work"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

timeout "$limit" "$venv/bin/python" - "$work" "$vocab" "$reps" <<'PY'
import os, statistics, sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
work, vocab, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
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
times = []
for _ in range(reps):  # training, timed: reading the file, counting words, merging
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    t0 = time.perf_counter()
    tok.train([f"{work}/corpus.txt"], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    times.append(time.perf_counter() - t0)
tok.save(f"{work}/tokenizer.json")
with open(f"{work}/hf_train_seconds", "w") as f:
    f.write(f"{statistics.median(times):.4f}\n")
PY

# ctrain's trainer, timed by the command itself (reading, counting, merging, writing
# the tokenizer.json)
ct_times=()
for _ in $(seq "$reps"); do
    line=$(timeout "$limit" build/bin/ctrain tokenizer train --vocab_size "$vocab" --special_tokens '<|endoftext|>' \
        --output "$work/ct" "$work/corpus.txt")
    ct_times+=("$(sed -n 's/.* in \([0-9.]*\) s: .*/\1/p' <<<"$line")")
done
"$venv/bin/python" - "$work/tokenizer.json" "$work/ct/tokenizer.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["model"] for p in sys.argv[1:3])
if a["vocab"] != b["vocab"] or a["merges"] != b["merges"]:
    sys.exit("bench/tokenizer/run.sh: ctrain's trained vocabulary or merges differ from tokenizers'")
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
ct_train=$(printf '%s\n' "${ct_times[@]}" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
hf_train=$(cat "$work/hf_train_seconds")
echo "train: vocabulary $vocab, identical merges; ctrain $ct_train s, tokenizers $hf_train s (medians); tokenizers time / ctrain time = $(awk -v a="$hf_train" -v b="$ct_train" 'BEGIN { printf "%.2f", a / b }')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
