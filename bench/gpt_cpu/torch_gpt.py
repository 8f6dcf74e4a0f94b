#!/usr/bin/env python3
"""GPT training throughput in PyTorch: the twin of gpt_cpu.c (CPU) and gpt_gpu.c (GPU).

    torch_gpt.py --config w1|124m|124m-gpu --threads N [--steps S] [--warmup W] [--seed X]
                 [--adamw auto|foreach|forloop|fused] [--precision f32|bf16]
                 [--device cpu|cuda] [--compile]

--device cuda runs on the first GPU (the twin of bench/gpt_gpu/gpt_gpu.c, config
124m-gpu: batch 16 x 1024): AdamW fused (PyTorch's fastest on a GPU), autocast on
"cuda", the device synchronised before the clock starts and before it stops.
--compile wraps the model in torch.compile (the warm-up steps absorb the compilation).

The model is nanoGPT's GPT-2, written plainly: token + position embeddings, pre-LN blocks
(LayerNorm eps 1e-5), fused qkv projection, causal attention, GELU (tanh), 4x MLP, final
LayerNorm, lm head tied to the token embedding; nn.Linear with biases; dropout 0.
Initialisation as GPT-2 (normal 0.02, residual projections 0.02/sqrt(2 n_layer), zero
biases). Attention: F.scaled_dot_product_attention(is_causal=True) where torch has it
(>= 2.0); otherwise q @ k^T * scale, masked_fill with a precomputed causal mask, softmax,
@ v (torch 1.13 has no fused attention).

One step, timed from the forward to the end of zero_grad, on a fresh batch of random
tokens drawn before the clock starts (torch.Generator, seeded; targets = inputs shifted
by one): forward, mean cross-entropy, backward, clip_grad_norm_(1.0), AdamW step (lr 1e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on tensors with dim >= 2, 0 on the others),
zero_grad(set_to_none=True). W warm-up steps (w1: 3, 124m: 2), then S timed steps
(w1: 20, 124m: 6); the median is reported.

AdamW implementation (--adamw auto, the default): a short pre-check on the real
parameters with lr = 0 (which does every multiply and add of a real step, so the cost
is the same, but leaves the weights as initialised) times two steps of each variant
this torch offers -- foreach=False (per-tensor loop), foreach=True (multi-tensor
kernels) and, where torch supports it on the CPU (>= 2.4), fused=True -- and keeps the
fastest. The choice is printed on stderr and in the JSON ("adamw").

FLOPs per step and the other fields are defined as in gpt_cpu.c:
    flops = tokens * (6 * N + 6 * n_layer * seq * n_embd),  N = parameters except wpe.
peak_rss_mb is getrusage(RUSAGE_SELF).ru_maxrss in MiB: the whole interpreter, so it
includes the Python runtime and torch's libraries (a few hundred MiB before any tensor).

Output: one JSON line on stdout, {"impl":"torch-<version>", ...} with the fields of
gpt_cpu.c. Bad arguments or any failure: a message on stderr, exit status 2.
"""
import argparse
import json
import math
import resource
import statistics
import sys
import time

CONFIGS = {
    # vocab, block, n_layer, n_head, n_embd, batch, seq, warmup, steps
    "w1": dict(vocab=256, block=256, n_layer=4, n_head=4, n_embd=256, batch=8, seq=256, warmup=3, steps=20),
    "124m": dict(vocab=50257, block=1024, n_layer=12, n_head=12, n_embd=768, batch=1, seq=256, warmup=2, steps=6),
    "124m-gpu": dict(vocab=50257, block=1024, n_layer=12, n_head=12, n_embd=768, batch=16, seq=1024, warmup=3,
                     steps=10),
}


def fail(msg):
    print(f"torch_gpt: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args():
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # argparse's own exit status is 2 too; say who we are
            self.print_usage(sys.stderr)
            fail(message)

    p = Parser(description="GPT training-step throughput in PyTorch (CPU, fp32); prints one JSON line")
    p.add_argument("--config", required=True, choices=sorted(CONFIGS))
    p.add_argument("--threads", required=True, type=int)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default w1 20, 124m 6)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default w1 3, 124m 2)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--adamw", choices=["auto", "foreach", "forloop", "fused"], default="auto",
                   help="AdamW implementation; auto times them and keeps the fastest")
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="bf16: the forward and loss under torch.autocast(device, dtype=torch.bfloat16)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = p.parse_args()
    if a.threads < 1:
        fail(f"--threads {a.threads}: expected an integer >= 1")
    if a.steps is not None and a.steps < 1:
        fail(f"--steps {a.steps}: expected an integer >= 1")
    if a.warmup is not None and a.warmup < 0:
        fail(f"--warmup {a.warmup}: expected an integer >= 0")
    return a


def build(torch, cfg):
    nn = torch.nn
    F = torch.nn.functional
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    C, H, L, V = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["vocab"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            if not has_sdpa:
                mask = torch.tril(torch.ones(cfg["block"], cfg["block"], dtype=torch.bool))
                self.register_buffer("mask", mask.view(1, 1, cfg["block"], cfg["block"]), persistent=False)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, H, C // H).transpose(1, 2)
            k = k.view(B, T, H, C // H).transpose(1, 2)
            v = v.view(B, T, H, C // H).transpose(1, 2)
            if has_sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
                att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(cfg["block"], C)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            self.lm_head = nn.Linear(C, V, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                elif p.dim() >= 2:
                    nn.init.normal_(p, 0.0, 0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)
                else:
                    nn.init.ones_(p)  # LayerNorm weights

        def forward(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, dtype=torch.long, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    return GPT(), has_sdpa


def adamw_variants(torch):
    """(name, constructor kwargs) of the AdamW implementations this torch offers."""
    import inspect

    sig = inspect.signature(torch.optim.AdamW.__init__).parameters
    out = []
    if "foreach" in sig:
        out += [("forloop", dict(foreach=False)), ("foreach", dict(foreach=True))]
    else:
        out += [("forloop", {})]
    if "fused" in sig:
        try:  # CPU fused AdamW arrived in torch 2.4; older versions refuse it for CPU tensors
            p = torch.nn.Parameter(torch.zeros(4))
            p.grad = torch.ones(4)
            torch.optim.AdamW([p], fused=True).step()
            out.append(("fused", dict(fused=True)))
        except (RuntimeError, ValueError, TypeError):
            pass
    return out


def make_adamw(torch, groups, kwargs, lr=1e-4):
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **kwargs)


def param_groups(model):
    params = [p for p in model.parameters() if p.requires_grad]  # tied weight listed once
    decay = [p for p in params if p.dim() >= 2]
    nodecay = [p for p in params if p.dim() < 2]
    return params, [dict(params=decay, weight_decay=0.1), dict(params=nodecay, weight_decay=0.0)]


def pick_adamw(torch, model, choice):
    variants = adamw_variants(torch)
    names = [n for n, _ in variants]
    if choice != "auto":
        if choice not in names:
            fail(f"--adamw {choice}: this torch ({torch.__version__}) offers {', '.join(names)}")
        return choice, dict(variants)[choice], {}
    params, _ = param_groups(model)
    gen = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    timings = {}
    for name, kw in variants:
        _, groups = param_groups(model)
        opt = make_adamw(torch, groups, kw, lr=0.0)  # lr 0: same work, weights unchanged
        opt.step()  # allocates the state
        ts = []
        for _ in range(2):
            t0 = time.perf_counter()
            opt.step()
            ts.append(time.perf_counter() - t0)
        timings[name] = min(ts)
        del opt
    for p in params:
        p.grad = None
    best = min(timings, key=timings.get)
    return best, dict(variants)[best], timings


def main():
    a = parse_args()
    try:
        import torch
    except ImportError as e:
        fail(f"cannot import torch with {sys.executable}: {e}")
    cfg = CONFIGS[a.config]
    warmup = cfg["warmup"] if a.warmup is None else a.warmup
    steps = cfg["steps"] if a.steps is None else a.steps
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    model, has_sdpa = build(torch, cfg)
    model.train()
    cuda = a.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            fail(f"--device cuda: torch {torch.__version__} sees no GPU")
        model = model.to("cuda")
        adamw_name, adamw_kw, timings = "fused", dict(fused=True), {}
    else:
        adamw_name, adamw_kw, timings = pick_adamw(torch, model, a.adamw)
    print(f"torch_gpt: torch {torch.__version__}, {torch.get_num_threads()} threads, attention "
          f"{'scaled_dot_product_attention' if has_sdpa else 'matmul+mask+softmax'}, AdamW {adamw_name}"
          + (" (pre-check ms: " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in timings.items()) + ")"
             if timings else ""), file=sys.stderr)
    params, groups = param_groups(model)
    opt = make_adamw(torch, groups, adamw_kw)
    n_total = sum(p.numel() for p in params)
    n_matmul = n_total - model.wpe.weight.numel()

    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    gen = torch.Generator().manual_seed(a.seed ^ 0x70C3E5)
    step_model = torch.compile(model) if a.compile else model
    times, loss0 = [], None
    for step in range(warmup + steps):
        w = torch.randint(0, V, (B, T + 1), generator=gen)
        x, y = w[:, :-1].contiguous().to(a.device), w[:, 1:].contiguous().to(a.device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if a.precision == "bf16":
            with torch.autocast(device_type=a.device, dtype=torch.bfloat16):
                loss = step_model(x, y)
        else:
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        lv = loss.item()
        if not math.isfinite(lv):
            fail(f"step {step}: loss is {lv} (not finite)")
        if step == 0:
            loss0 = lv
        if step >= warmup:
            times.append(dt)

    step_s = statistics.median(times)
    tokens = B * T
    flops = tokens * (6 * n_matmul + 6 * cfg["n_layer"] * T * cfg["n_embd"])
    out = {
        "impl": f"torch-{torch.__version__}" + ("-compile" if a.compile else ""),
        "device": a.device,
        "config": a.config,
        "threads": a.threads,
        "precision": a.precision,
        "tokens_per_s": round(tokens / step_s, 2),
        "step_ms": round(1e3 * step_s, 3),
        "gflops": round(1e-9 * flops / step_s, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "loss0": round(loss0, 6),
        "steps": steps,
        "warmup": warmup,
        "params": n_total,
        "adamw": adamw_name,
    }
    print(json.dumps(out, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # a clear one-line reason, never a bare traceback as the only output
        import traceback

        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
