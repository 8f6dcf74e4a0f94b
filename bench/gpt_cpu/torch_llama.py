#!/usr/bin/env python3
"""Llama training and generation throughput in PyTorch + transformers: the twin of
gpt_cpu.c --config llama-w1 and of generate_cpu.c.

    torch_llama.py --config llama-w1 --threads N [--steps S] [--warmup W] [--seed X]
                   [--adamw auto|foreach|forloop|fused] [--precision f32|bf16]
    torch_llama.py --generate --config llama-w1|w1 --threads N [--prompt P] [--new K]
                   [--reps R] [--seed X]

The model is transformers' own LlamaForCausalLM built from a LlamaConfig (vocab 2048,
hidden 256, 4 layers, 4 heads, 2 key/value heads, intermediate 688, RMSNorm eps 1e-6,
RoPE theta 10000, untied lm_head, no biases), f32, attention "sdpa" where the torch has
scaled_dot_product_attention, "eager" otherwise; its own initialisation (normal 0.02).
--generate --config w1 uses GPT2LMHeadModel (vocab 256, n_positions 256, 4 layers,
4 heads, width 256), gpt_cpu's GPT W1.

Training: the step of torch_gpt.py (and gpt_cpu.c): on a fresh batch of random tokens
(8 x 256, drawn before the clock starts), logits = model(input_ids=x).logits, mean
cross-entropy against y = x shifted by one (computed here, not by the model's shifting
`labels`), backward, clip_grad_norm_(1.0), AdamW (lr 1e-4, betas 0.9/0.95, weight decay
0.1 on the 2-D tensors; the implementation picked as torch_gpt.py does), zero_grad.
--precision bf16: the forward and the loss under torch.autocast("cpu", bfloat16).
FLOPs as gpt_cpu.c counts them for llama-w1: tokens * (6 N + 6 L T C), N = parameters
except embed_tokens.

Generation: model.generate(prompt, attention_mask=ones, do_sample=False, use_cache=True,
max_new_tokens=K, min_new_tokens=K) with eos_token_id None in the model's config and
generation config (nothing stops it early), batch 1, a prompt of P random tokens (default
32; K default 128) under torch.inference_mode(). One untimed run, then R timed (default
3); a streamer stamps the first new token, so the figures split as in generate_cpu.c
(tokens_per_s = K / the call, decode_tok_s = (K - 1) / (first token -> return),
prefill_ms = call -> first token), medians over the R runs.

Output: one JSON line; errors: a message on stderr, exit status 2.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402
from torch_gpt import make_adamw, param_groups, pick_adamw  # noqa: E402


def fail(msg):
    print(f"torch_llama: {msg}", file=sys.stderr)
    sys.exit(2)


torch_gpt.fail = fail  # pick_adamw's messages name this program

LLAMA = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0,
             tie_word_embeddings=False, attention_bias=False, mlp_bias=False, bos_token_id=None,
             eos_token_id=None, pad_token_id=None)
GPT_W1 = dict(vocab_size=256, n_positions=256, n_layer=4, n_head=4, n_embd=256, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=None,
              eos_token_id=None)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, choices=["llama-w1", "w1"])
    p.add_argument("--threads", required=True, type=int)
    p.add_argument("--generate", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--adamw", choices=["auto", "foreach", "forloop", "fused"], default="auto")
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    if a.threads < 1 or a.steps < 1 or a.warmup < 0 or a.prompt < 1 or a.new < 2 or a.reps < 1:
        fail("--threads, --steps, --prompt, --reps >= 1, --new >= 2, --warmup >= 0")
    if not a.generate and a.config != "llama-w1":
        fail("training here is --config llama-w1 (the GPT configs: torch_gpt.py)")
    return a


def build(torch, transformers, name):
    attn = "sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "eager"
    if name == "llama-w1":
        cfg = transformers.LlamaConfig(**LLAMA)
        cls = transformers.LlamaForCausalLM
    else:
        cfg = transformers.GPT2Config(**GPT_W1)
        cls = transformers.GPT2LMHeadModel
    cfg._attn_implementation = attn
    model = cls(cfg)
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0  # no padding in batch 1; silences the warning
    return model, attn


def rss_mb():
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def train(torch, transformers, a):
    F = torch.nn.functional
    model, attn = build(torch, transformers, a.config)
    model.train()
    adamw_name, adamw_kw, timings = pick_adamw(torch, model, a.adamw)
    print(f"torch_llama: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, attention {attn}, AdamW {adamw_name}", file=sys.stderr)
    params, groups = param_groups(model)
    opt = make_adamw(torch, groups, adamw_kw)
    n_total = sum(p.numel() for p in params)
    n_matmul = n_total - model.model.embed_tokens.weight.numel()
    B, T, V = 8, 256, LLAMA["vocab_size"]
    gen = torch.Generator().manual_seed(a.seed ^ 0x70C3E5)
    times, loss0 = [], None
    for step in range(a.warmup + a.steps):
        w = torch.randint(0, V, (B, T + 1), generator=gen)
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        t0 = time.perf_counter()
        if a.precision == "bf16":
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(input_ids=x).logits.view(-1, V), y.view(-1))
        else:
            loss = F.cross_entropy(model(input_ids=x).logits.view(-1, V), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        lv = loss.item()
        if not math.isfinite(lv):
            fail(f"step {step}: loss is {lv} (not finite)")
        if step == 0:
            loss0 = lv
        if step >= a.warmup:
            times.append(dt)
    step_s = statistics.median(times)
    flops = B * T * (6 * n_matmul + 6 * LLAMA["num_hidden_layers"] * T * LLAMA["hidden_size"])
    return {"impl": f"torch-{torch.__version__}", "config": a.config, "threads": a.threads,
            "precision": a.precision, "tokens_per_s": round(B * T / step_s, 2), "step_ms": round(1e3 * step_s, 3),
            "gflops": round(1e-9 * flops / step_s, 3), "peak_rss_mb": rss_mb(), "loss0": round(loss0, 6),
            "steps": a.steps, "warmup": a.warmup, "params": n_total, "adamw": adamw_name,
            "transformers": transformers.__version__}


def generate(torch, transformers, a):
    from transformers.generation.streamers import BaseStreamer

    class FirstToken(BaseStreamer):  # put() gets the prompt first, then each new token
        def __init__(self):
            self.calls, self.first = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2:
                self.first = time.perf_counter()

        def end(self):
            pass

    if int(torch.__version__.split(".")[0]) < 2:
        # generate() asks whether the model is FSDP-managed, which imports
        # torch.distributed.fsdp; torch 1.13's fails to import under Python 3.11 (a
        # dataclass with a mutable default). No model here is: answer for it.
        import transformers.generation.utils as gu

        if hasattr(gu, "is_fsdp_managed_module"):
            gu.is_fsdp_managed_module = lambda module: False
    model, attn = build(torch, transformers, a.config)
    model.eval()
    print(f"torch_llama: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, attention {attn}", file=sys.stderr)
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(a.seed ^ 0x9E3779B9)
    prompt = torch.randint(0, V, (1, a.prompt), generator=gen)
    mask = torch.ones_like(prompt)
    total, decode, prefill = [], [], []
    for r in range(-1, a.reps):
        s = FirstToken()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(prompt, attention_mask=mask, do_sample=False, use_cache=True,
                                 max_new_tokens=a.new, min_new_tokens=a.new, eos_token_id=None, streamer=s)
            t1 = time.perf_counter()
        got = out.shape[1] - a.prompt
        if got != a.new:
            fail(f"generate produced {got} of {a.new} tokens")
        if r < 0:
            continue
        total.append(t1 - t0)
        prefill.append(s.first - t0)
        decode.append((a.new - 1) / (t1 - s.first))
    return {"impl": f"torch-{torch.__version__}", "mode": "generate", "config": a.config, "threads": a.threads,
            "prompt": a.prompt, "new_tokens": a.new, "tokens_per_s": round(a.new / statistics.median(total), 2),
            "decode_tok_s": round(statistics.median(decode), 2),
            "prefill_ms": round(1e3 * statistics.median(prefill), 3), "peak_rss_mb": rss_mb(), "reps": a.reps,
            "transformers": transformers.__version__}


def main():
    a = parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        fail(f"cannot import torch and transformers with {sys.executable}: {e}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    out = generate(torch, transformers, a) if a.generate else train(torch, transformers, a)
    print(json.dumps(out, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:
        import traceback

        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
