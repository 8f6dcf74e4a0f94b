#!/usr/bin/env python3
"""The Hugging Face `transformers` oracle for ctrain's causal LMs (tests/reference/test_hf_models.c).

  hf_models.py make DIR --arch gpt2|llama|llama3 [--seed S]
  hf_models.py check DIR [--input FILE] [--logits FILE] [--differs FILE] [--tol 1e-5]

make: transformers builds a small random model and saves it into DIR as Hugging Face
does (config.json, generation_config.json, model.safetensors, f32), then writes
DIR/expect.safetensors:
  ids       i64 (B, T) = (2, 11)   random tokens
  targets   i64 (B, T)             ids[:, 1:], then -1 in the last column
  logits    f32 (B, T, V)          model(ids).logits
  loss      f32 ()                 model(ids, labels=ids).loss
  grad.NAME f32                    every parameter's gradient after loss.backward(), under
                                   transformers' names; a tied tensor under each of its
                                   names (metadata n_params counts it once)
  gen.K.prompt, gen.K.tokens  i64  greedy generation, K = 0, 1: the prompt (ids[0, :7],
                                   ids[1, :4]) and prompt + 32 new tokens from
                                   model.generate(do_sample=False, max_new_tokens=32)
                                   with no end-of-sequence token
and metadata: the sizes a ct_lm takes from config.json (n_layer, n_kv_head, head_dim,
max_positions, vocab_size, bos_token_id, eos_token_id), arch, seed, transformers,
torch, n_params, stop_id (a token neither
generation produces: ctrain passes it as its only stop token so that both sides
produce exactly 32), min_margin (the smallest gap between the largest and the second
largest logit over the generation steps).

The loss: transformers shifts the labels itself (position t predicts ids[t + 1]; the
last position predicts nothing) and averages over B * (T - 1) positions. ctrain's
cross-entropy takes explicit targets, so `targets` holds ids shifted left with
ignore_index -1 in the last column: ct_cross_entropy(logits, targets, -1) is the same
mean, and the gradient of the last position's logits is zero on both sides.

Greedy decoding is only comparable token for token when no step is a near-tie. make
keeps the seed when every step's margin is at least MARGIN times the largest |logit|
of the step, else tries seed + 1, ... (the seed used is in the metadata).

The models have odd sizes so that no shape is a multiple of another:
  gpt2    vocab 101, n_embd 48, 3 layers, 4 heads, n_positions 64
  llama   vocab 97, hidden 48, 3 layers, 6 heads, 2 key/value heads, intermediate 80,
          rope_theta 10000, rms_norm_eps 1e-5, untied head
  llama3  vocab 89, hidden 40, 2 layers, 4 heads, 2 key/value heads (head_dim 10),
          intermediate 72, rope_theta 500000 with rope_scaling llama3 (factor 8,
          original 256 positions: of the 5 frequencies one is kept, one smoothed,
          three divided by 8), tied embeddings
The weights are transformers' initialisation, then every norm weight and bias gets
N(0, 0.1) noise added so that none is 0 or 1.

check: loads DIR (a model ctrain saved) with AutoModelForCausalLM.from_pretrained, which
must log no warning (a missing, unexpected or mis-shaped weight, an unknown config value
all log one), runs it on the "ids" of --input (default DIR/input.safetensors) and
compares the logits with the "logits" of --logits (default DIR/ctrain_logits.safetensors):
max|hf - ctrain| / max|ctrain| <= tol. --differs FILE: the "logits" of FILE (those of
another model, e.g. before training) must be off by more than tol: the comparison can
fail.

Exit status: make 0 when it wrote everything and transformers logged no warning, else
non-zero with the reason; check 0
when transformers agrees, 1 on a disagreement or a warning (each printed), 2 on a usage
or file error.
"""
import argparse
import contextlib
import logging
import os
import sys
import warnings
from math import inf

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

B, T = 2, 11
NEW_TOKENS = 32
PROMPTS = ((0, 7), (1, 4))  # (row of ids, length)
MARGIN = 1e-3
SEED_TRIES = 50


def config_of(arch):
    if arch == "gpt2":
        return GPT2Config(vocab_size=101, n_embd=48, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=100, eos_token_id=100), GPT2LMHeadModel
    if arch == "llama":
        return LlamaConfig(vocab_size=97, hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
                           num_key_value_heads=2, intermediate_size=80, max_position_embeddings=64,
                           rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                           eos_token_id=2), LlamaForCausalLM
    if arch == "llama3":
        return LlamaConfig(vocab_size=89, hidden_size=40, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=72, max_position_embeddings=512,
                           rope_theta=500000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1,
                           eos_token_id=2,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
                           ), LlamaForCausalLM
    raise SystemExit(f"hf_models.py: unknown --arch {arch!r} (gpt2, llama or llama3)")


def build(arch, seed):
    cfg, cls = config_of(arch)
    torch.manual_seed(seed)
    model = cls(cfg).float()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:  # norm weights and biases: away from 1 and 0
                p.add_(0.1 * torch.randn_like(p))
    model.eval()  # no dropout anywhere (the configs have none either)
    return model


def sizes_of(c):
    """What a ct_lm reads from config.json, under its field names (nn/lm.h)."""
    if c.model_type == "gpt2":
        n_kv, head_dim, max_pos = c.n_head, c.n_embd // c.n_head, c.n_positions
    else:
        n_kv, head_dim, max_pos = c.num_key_value_heads, c.head_dim, c.max_position_embeddings
    return {"n_layer": str(c.num_hidden_layers), "n_kv_head": str(n_kv), "head_dim": str(head_dim),
            "max_positions": str(max_pos), "vocab_size": str(c.vocab_size), "bos_token_id": str(c.bos_token_id),
            "eos_token_id": str(c.eos_token_id)}


def greedy(model, prompt):
    """prompt (n,) -> (prompt + NEW_TOKENS tokens, the smallest relative top-1/top-2 margin)."""
    # synced_gpus=False: left as None, 4.49 asks torch.distributed.fsdp whether the model is
    # sharded, and torch 1.13's fsdp does not import on Python 3.11
    out = model.generate(prompt[None], do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                         pad_token_id=0, synced_gpus=False, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0]
    if tokens.numel() != prompt.numel() + NEW_TOKENS:
        raise SystemExit(f"generate returned {tokens.numel() - prompt.numel()} new tokens, not {NEW_TOKENS}")
    margin = float("inf")
    for step in out.logits:  # (1, V) raw logits of each step
        top = torch.topk(step[0].double(), 2).values
        margin = min(margin, float((top[0] - top[1]) / step.abs().max()))
    return tokens, margin


def make(args):
    found = []
    with warnings_into(found):
        status = make_files(args)
    for w in found:  # a config transformers does not take as meant (e.g. a rope_scaling it corrects)
        print(f"hf_models.py make: transformers warned: {w}", file=sys.stderr)
    return 1 if found else status


def make_files(args):
    os.makedirs(args.dir, exist_ok=True)
    for attempt in range(SEED_TRIES):
        seed = args.seed + attempt
        model = build(args.arch, seed)
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.config.vocab_size, (B, T), generator=gen)
        with torch.no_grad():
            gens = [greedy(model, ids[row, :n]) for row, n in PROMPTS]
        margin = min(m for _, m in gens)
        if margin >= MARGIN:
            break
        print(f"seed {seed}: a greedy step's margin is {margin:.2e} < {MARGIN}: next seed", file=sys.stderr)
    else:
        raise SystemExit(f"no seed in [{args.seed}, {args.seed + SEED_TRIES}) gives greedy margins >= {MARGIN}")

    model.loss_type = "ForCausalLM"  # what 4.49 falls back to anyway, with a notice, for GPT-2
    out = model(ids, labels=ids)
    out.loss.backward()
    targets = torch.cat([ids[:, 1:], torch.full((B, 1), -1, dtype=ids.dtype)], dim=1)
    # the alignment documented above, checked against transformers' own loss
    mine = torch.nn.functional.cross_entropy(out.logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)
    assert torch.allclose(mine, out.loss, rtol=1e-6, atol=0), (float(mine), float(out.loss))

    tensors = {"ids": ids, "targets": targets, "logits": out.logits.detach(), "loss": out.loss.detach()}
    params = {id(p) for p in model.parameters()}
    for name, p in model.state_dict(keep_vars=True).items():  # a tied tensor under each of its names
        if id(p) in params:
            tensors["grad." + name] = p.grad.detach().clone()
    produced = set()
    for k, (tokens, _) in enumerate(gens):
        row, n = PROMPTS[k]
        tensors[f"gen.{k}.prompt"] = ids[row, :n].clone()
        tensors[f"gen.{k}.tokens"] = tokens
        produced.update(tokens[n:].tolist())
    stop_id = min(set(range(model.config.vocab_size)) - produced)
    meta = {"arch": args.arch, "seed": str(seed), "transformers": transformers.__version__,
            "torch": torch.__version__, "n_params": str(sum(1 for _ in model.parameters())),
            "stop_id": str(stop_id), "min_margin": f"{margin:.3e}", **sizes_of(model.config)}
    model.save_pretrained(args.dir, safe_serialization=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(args.dir, "expect.safetensors"), meta)
    print(f"{args.arch}: seed {seed}, {meta['n_params']} parameters, loss {float(out.loss.detach()):.6f}, "
          f"greedy margin >= {margin:.2e}, stop id {stop_id}, transformers {transformers.__version__}")
    return 0


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def warnings_into(found):
    """Appends to found every warning transformers logs, and every Python warning, in the block."""
    # transformers' loggers do not propagate to the root logger: listen on its own
    lib = transformers.utils.logging.get_logger()
    transformers.utils.logging.set_verbosity_warning()
    seen = Collect()
    lib.addHandler(seen)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        lib.removeHandler(seen)
        found += seen.records + [f"{w.category.__name__} ({w.filename}:{w.lineno}): {w.message}" for w in caught]


def check(args):
    inp = args.input or os.path.join(args.dir, "input.safetensors")
    ref = args.logits or os.path.join(args.dir, "ctrain_logits.safetensors")
    try:
        ids = load_file(inp)["ids"]
        want = load_file(ref)["logits"]
        if args.differs:
            load_file(args.differs)["logits"]
    except (OSError, KeyError, ValueError) as e:
        print(f"hf_models.py check: cannot read the ids of {inp} or the logits of {ref} / {args.differs}: {e!r}")
        return 2
    bad = []
    try:
        with warnings_into(bad):
            model = AutoModelForCausalLM.from_pretrained(args.dir)
    except Exception as e:  # noqa: BLE001 -- any failure to load is the finding
        print(f"FAIL: transformers cannot load {args.dir}: {type(e).__name__}: {e}")
        return 1
    model.eval()
    with torch.no_grad():
        got = model(ids).logits
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    print(f"{type(model).__name__} from {args.dir}: {sum(p.numel() for p in model.parameters())} parameters "
          f"({', '.join(dtypes)})")
    if got.shape != want.shape:
        print(f"FAIL: logits of shape {tuple(got.shape)} from transformers, {tuple(want.shape)} from {ref}")
        return 1
    err = float((got.double() - want.double()).abs().max() / want.double().abs().max())
    print(f"logits: max|hf - ctrain| / max|ctrain| = {err:.3e} (tolerance {args.tol:g})")
    status = 0
    for w in bad:
        print(f"FAIL: loading logged a warning: {w}")
        status = 1
    if not err <= args.tol:
        print("FAIL: the logits differ")
        status = 1
    if args.differs:
        other = load_file(args.differs)["logits"].double()
        off = float((got.double() - other).abs().max() / other.abs().max()) if other.shape == got.shape else inf
        print(f"logits of {args.differs} (which must differ): off by {off:.3e}")
        if not off > args.tol:
            print(f"FAIL: the logits of {args.differs} match too: the comparison cannot fail")
            status = 1
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="build a random model, save it and what it computes")
    m.add_argument("dir")
    m.add_argument("--arch", required=True, choices=["gpt2", "llama", "llama3"])
    m.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("check", help="load a model ctrain saved and compare its logits")
    c.add_argument("dir")
    c.add_argument("--input")
    c.add_argument("--logits")
    c.add_argument("--differs")
    c.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the tests share the machine
    return make(args) if args.cmd == "make" else check(args)


if __name__ == "__main__":
    sys.exit(main())
