#!/usr/bin/env bash
# The reference for tests/data/test_bpe.c and tests/data/test_bpe_train.c: Hugging
# Face `tokenizers` trains a byte-level BPE on a text file and encodes each of its
# lines.
#
#   bpe_oracle.sh VENV WORKDIR TEXT
#   bpe_oracle.sh VENV WORKDIR TEXT train CT_JSON VOCAB_SIZE MIN_FREQUENCY SPECIALS
#
# VENV (made with /usr/bin/python3 -m venv and `pip install tokenizers` when it
# does not hold tokenizers yet; reused otherwise). In WORKDIR it writes
# tokenizer.json, vocab.json + merges.txt (the model's GPT-2-style pair) and
# ids.txt: for line i of TEXT (split at "\n", UTF-8), line i holds tokenizers'
# ids, separated by spaces.
# With "train": tokenizers trains on TEXT with BpeTrainer(vocab_size=VOCAB_SIZE,
# min_frequency=MIN_FREQUENCY, special_tokens=SPECIALS split at ",",
# initial_alphabet=ByteLevel.alphabet()) into WORKDIR/hf_train.json (and the
# seconds it took into hf_train_seconds.txt), then loads ctrain's CT_JSON with
# Tokenizer.from_file and writes its encoding of each line of TEXT into
# ct_ids.txt, as above. Exit status 77: the venv cannot be made (the reason is
# on stderr); the caller skips. Each step is bounded by a timeout.
set -euo pipefail
venv=$1 work=$2 text=$3

# the oracle tests may run at once: one of them makes the venv, the others wait
# (the lock is named after the venv's path, outside it)
lock="${TMPDIR:-/tmp}/ctrain-bpe-venv-$(printf %s "$venv" | cksum | cut -d' ' -f1).lock"
exec 9>"$lock"
if ! flock -w 600 9; then
    echo "cannot lock $lock to make the venv" >&2
    exit 77
fi
if ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
    rm -rf "$venv"
    if ! timeout 120 /usr/bin/python3 -m venv "$venv" >"$work/venv.log" 2>&1; then
        echo "cannot create a venv with /usr/bin/python3 -m venv: $(tail -n 3 "$work/venv.log")" >&2
        rm -rf "$venv"
        exit 77
    fi
    if ! timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check tokenizers >"$work/pip.log" 2>&1; then
        echo "pip install tokenizers failed: $(tail -n 3 "$work/pip.log")" >&2
        rm -rf "$venv"
        exit 77
    fi
fi

flock -u 9

# one thread: the test shares the machine with the rest of the suite
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
if [ "${4:-}" = train ]; then
    timeout 120 "$venv/bin/python" - "$work" "$text" "$5" "$6" "$7" "$8" <<'PY'
import sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors, trainers

work, text, ct_json, vocab_size, min_frequency, specials = sys.argv[1:7]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=False)
trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), min_frequency=int(min_frequency),
                              special_tokens=[s for s in specials.split(",") if s],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
t0 = time.perf_counter()
tok.train([text], trainer)
seconds = time.perf_counter() - t0
tok.save(f"{work}/hf_train.json")
with open(f"{work}/hf_train_seconds.txt", "w") as out:
    out.write(f"{seconds:.3f}\n")

ct = Tokenizer.from_file(ct_json)
with open(text, "rb") as f:
    lines = f.read().split(b"\n")
with open(f"{work}/ct_ids.txt", "w") as out:
    for line in lines:
        ids = ct.encode(line.decode("utf-8"), add_special_tokens=False).ids
        out.write(" ".join(map(str, ids)) + "\n")
PY
    exit
fi

timeout 120 "$venv/bin/python" - "$work" "$text" <<'PY'
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

work, text = sys.argv[1], sys.argv[2]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train([text], trainer)
tok.save(f"{work}/tokenizer.json")
tok.model.save(work)  # vocab.json + merges.txt

with open(text, "rb") as f:
    lines = f.read().split(b"\n")
with open(f"{work}/ids.txt", "w") as out:
    for line in lines:
        ids = tok.encode(line.decode("utf-8"), add_special_tokens=False).ids
        out.write(" ".join(map(str, ids)) + "\n")
PY
