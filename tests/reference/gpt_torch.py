"""PyTorch side of ctrain's reference test (tests/reference/test_torch.c).

Builds a GPT-2 (HF GPT2LMHeadModel semantics: pre-LN blocks, fused qkv Conv1D
weights stored [in, out], GELU tanh, LayerNorm eps 1e-5, lm head tied to wte)
from the model.safetensors ctrain wrote, runs the same 3 training steps on the
same batch (forward, mean cross-entropy, backward, clip_grad_norm_(1.0),
torch.optim.AdamW with weight decay on the 2-D tensors only) and compares, in
f32, with what ctrain wrote to ctrain.safetensors.

Each tensor is compared as  max|ctrain - torch| / max|torch| <= 1e-5  (the
infinity-norm relative error; a tensor that is 0 in torch must be 0 in ctrain).

The parameters after the AdamW steps need one exception. Adam divides each
gradient element by its own RMS, so an element whose gradient is zero in exact
arithmetic but not in floating point moves by about lr in a direction set by
rounding alone, in either library. The key part of c_attn.bias is such a case:
adding a constant to a key shifts every score of a softmax row equally, so its
gradient vanishes. An element counts as determined when its gradient, computed
in f64 from the same weights, is at least 1e-6 of the largest in its tensor at
every step (or exactly 0 at every step); the others (the 64 key-bias elements
of this model and a few more) are counted in the summary and only checked not
to have moved more than the steps allow (|delta| <= steps * lr * 1.01 + decay).
Without this exception the key biases differ by ~1e-3 and nothing else does.
The f64 run is also compared with ctrain's logits as a second, looser (1e-4)
check of the forward pass.

Exit status: 0 all agree, 1 a mismatch (each one is named), 2 bad usage or files.
"""
import argparse
import json
import math
import struct
import sys

import torch

TOL = 1e-5
VANISHING = 1e-6  # of the largest gradient element of the same tensor, in f64
DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "I64": (torch.int64, 8), "I32": (torch.int32, 4)}


def read_safetensors(path):
    """name -> tensor, parsed from the format's spec (u64 header length, JSON, data)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        print(f"gpt_torch: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if len(raw) < 8:
        print(f"gpt_torch: {path}: too short for a safetensors header", file=sys.stderr)
        sys.exit(2)
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, size = DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        count = (e - b) // size
        t = torch.frombuffer(bytearray(raw[base + b : base + e]), dtype=dt, count=count) if count else torch.empty(0, dtype=dt)
        out[name] = t.reshape(info["shape"]).clone()
    return out


class GPT(torch.nn.Module):
    """GPT-2 with HF's parameter names; weights [in, out] as HF's Conv1D."""

    def __init__(self, sd, n_head, dtype):
        super().__init__()
        self.n_head = n_head
        self.names = list(sd.keys())
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(v.to(dtype).clone()) for k, v in sd.items()})
        self.n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h."))

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def named(self):
        return [(n, self.w(n)) for n in self.names]

    def conv1d(self, x, prefix):
        return x @ self.w(prefix + ".weight") + self.w(prefix + ".bias")

    def ln(self, x, prefix):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.w(prefix + ".weight"), self.w(prefix + ".bias"), 1e-5)

    def forward(self, idx):
        B, T = idx.shape
        wte = self.w("wte.weight")
        x = wte[idx] + self.w("wpe.weight")[:T]
        C = x.shape[-1]
        H, D = self.n_head, C // self.n_head
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for i in range(self.n_layer):
            h = f"h.{i}"
            qkv = self.conv1d(self.ln(x, h + ".ln_1"), h + ".attn.c_attn")
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + self.conv1d(y, h + ".attn.c_proj")
            m = self.conv1d(self.ln(x, h + ".ln_2"), h + ".mlp.c_fc")
            m = torch.nn.functional.gelu(m, approximate="tanh")
            x = x + self.conv1d(m, h + ".mlp.c_proj")
        return self.ln(x, "ln_f") @ wte.t()


def train(sd, x, y, args, dtype):
    """The 3 steps; returns logits and grads of step 0, losses, norms, params and per-step grads."""
    model = GPT(sd, args.n_head, dtype)
    named = model.named()
    decay = [p for _, p in named if p.dim() == 2]
    rest = [p for _, p in named if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, args.beta2), eps=1e-8, foreach=False)
    rec = {"loss": [], "norm": [], "grads": []}
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if step == 0:
            rec["logits"] = logits.detach().clone()
        rec["grads"].append({n: p.grad.detach().clone() for n, p in named})
        rec["norm"].append(float(torch.nn.utils.clip_grad_norm_([p for _, p in named], 1.0)))
        opt.step()
        rec["loss"].append(float(loss))
    rec["params"] = {n: p.detach().clone() for n, p in named}
    return rec


def rel_err(a, b):
    a, b = a.double(), b.double()
    scale = b.abs().max().item() if b.numel() else 0.0
    diff = (a - b).abs().max().item() if b.numel() else 0.0
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--weight_decay", type=float, required=True)
    ap.add_argument("--beta2", type=float, required=True)
    ap.add_argument("--n_head", type=int, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--perturb", help="add 1e-3 to element 0 of this weight before running (must then fail)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    sd = read_safetensors(f"{args.dir}/model.safetensors")
    batch = read_safetensors(f"{args.dir}/batch.safetensors")
    ct = read_safetensors(f"{args.dir}/ctrain.safetensors")
    if args.perturb:
        if args.perturb not in sd:
            print(f"gpt_torch: --perturb {args.perturb}: no such tensor in model.safetensors", file=sys.stderr)
            return 2
        sd[args.perturb].view(-1)[0] += 1e-3
        print(f"gpt_torch: {args.perturb}[0] perturbed by 1e-3 on the PyTorch side: the mismatches below are expected")
    x, y = batch["x"], batch["y"]

    ref = train(sd, x, y, args, torch.float32)
    ref64 = train(sd, x, y, args, torch.float64)
    failures, report = [], []

    def check(name, ours, theirs, tol=TOL):
        if tuple(ours.shape) != tuple(theirs.shape):
            failures.append(f"{name}: shape ctrain {tuple(ours.shape)} vs torch {tuple(theirs.shape)}")
            return
        e = rel_err(ours, theirs)
        report.append((e, name))
        if not e <= tol:
            failures.append(f"{name}: relative error {e:.3e} > {tol:g}")

    check("logits", ct["logits"], ref["logits"])
    check("logits (vs f64)", ct["logits"], ref64["logits"], 1e-4)
    for k in range(args.steps):
        check(f"loss.{k}", ct[f"loss.{k}"].reshape(()), torch.tensor(ref["loss"][k]))
        check(f"norm.{k}", ct[f"norm.{k}"].reshape(()), torch.tensor(ref["norm"][k]))
    names = list(sd.keys())
    for n in names:
        check(f"grad.{n}", ct[f"grad.{n}"], ref["grads"][0][n])

    undetermined = 0
    for n in names:
        determined = torch.ones_like(sd[n], dtype=torch.bool)
        for g in (step[n] for step in ref64["grads"]):
            top = g.abs().max()
            determined &= g.abs() >= VANISHING * top if top > 0 else torch.zeros_like(determined)
        # an element with an exactly zero gradient at every step only decays: determined
        zero = torch.stack([step[n] == 0 for step in ref64["grads"]]).all(dim=0)
        determined |= zero
        ours, theirs = ct[f"param.{n}"], ref["params"][n]
        if tuple(ours.shape) != tuple(theirs.shape):
            failures.append(f"param.{n}: shape ctrain {tuple(ours.shape)} vs torch {tuple(theirs.shape)}")
            continue
        check(f"param.{n}", ours[determined], theirs[determined])
        rest = ~determined
        undetermined += int(rest.sum())
        if rest.any():
            bound = args.steps * args.lr * 1.01 + args.steps * args.lr * args.weight_decay * sd[n].abs().max().item()
            moved = (ours[rest].double() - sd[n][rest].double()).abs().max().item()
            if moved > bound:
                failures.append(f"param.{n}: an element with a vanishing gradient moved {moved:.3e} > {bound:.3e}")

    worst = max(report)
    print(f"gpt_torch: torch {torch.__version__}; {len(report)} comparisons, worst {worst[0]:.2e} ({worst[1]}); "
          f"{undetermined} parameter elements with vanishing gradients checked by bound only")
    if failures:
        for f in failures:
            print(f"gpt_torch: MISMATCH {f}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a crash must not read as a mismatch (status 1)
        print(f"gpt_torch: error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
