#!/usr/bin/env bash
# The Python environment of the Hugging Face `transformers` oracle
# (tests/reference/hf_models.py, run by tests/reference/test_hf_models.c).
#
#   hf_venv.sh VENV
#
# Makes VENV once (reused while it imports the models): a venv over Debian's python3
# and python3-torch (1.13) with transformers 4.49.0 and the dependencies pip picks
# for it (huggingface-hub, safetensors, tokenizers, regex, ...; torch is not one).
# 4.49.0 is the newest that runs on torch 1.13: 4.50 and 4.51 import
# torch.distributed.tensor (torch >= 2.1) when they load any model, and from 4.52 on
# transformers ignores a torch older than 2.1. Exit 0 when VENV/bin/python can run the
# oracle; 77 with "skip: REASON" on stderr when the venv cannot be made (no python3-venv,
# no torch, no network for pip): the caller skips. Each step has a timeout; a lock
# keeps two tests from building the same venv at once.
#
#   hf_venv.sh --external VENV
#
# Uses a venv the user made (CT_HF_VENV; e.g. PyPI's torch 2 with transformers 5) as it
# is: exit 0 when it imports the models, else 77 with the reason. It is never changed.
set -u
external=0
if [ "${1:-}" = --external ]; then external=1; shift; fi
venv=$1
version=4.49.0
py=$venv/bin/python

skip() { echo "skip: $*" >&2; exit 77; }

probe() { # $1: where its messages go
    "$py" -c "import transformers, torch, safetensors.torch
assert transformers.__version__ == '$version', transformers.__version__
from transformers import GPT2LMHeadModel, LlamaForCausalLM, AutoModelForCausalLM" >"$1" 2>&1
}

if [ "$external" = 1 ]; then
    "$py" -c "import transformers, torch, safetensors.torch
from transformers import GPT2LMHeadModel, LlamaForCausalLM, AutoModelForCausalLM" >/dev/null 2>&1 ||
        skip "CT_HF_VENV=$venv cannot import torch, transformers and safetensors"
    exit 0
fi
mkdir -p "$(dirname "$venv")" || skip "cannot create $(dirname "$venv")"
exec 9>"$venv.lock" || skip "cannot open the lock file $venv.lock"
timeout 500 flock 9 || skip "another test held $venv.lock for 500 s"
# the stamp saves the import (seconds) on every later run
[ "$(cat "$venv/ctrain-ok" 2>/dev/null)" = "$version" ] && [ -x "$py" ] && exit 0
probe /dev/null && { echo "$version" >"$venv/ctrain-ok"; exit 0; }

/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 ||
    skip "Debian's python3 cannot import torch (the python3-torch package; tools/setup.sh)"
rm -rf "$venv"
log=$venv.log
timeout 120 /usr/bin/python3 -m venv --system-site-packages "$venv" >"$log" 2>&1 ||
    { rm -rf "$venv"; skip "python3 -m venv failed (see python3-venv): $(tail -n 1 "$log")"; }
timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check "transformers==$version" >>"$log" 2>&1 ||
    { rm -rf "$venv"; skip "pip could not install transformers==$version (no network?): $(tail -n 1 "$log")"; }
probe "$venv.import.log" ||
    { rm -rf "$venv"; skip "transformers $version does not import here: $(tail -n 3 "$venv.import.log")"; }
echo "$version" >"$venv/ctrain-ok"
exit 0
