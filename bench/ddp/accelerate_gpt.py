#!/usr/bin/env python3
"""GPT W1 data-parallel training throughput with HuggingFace Accelerate on the CPU: the
twin of gpt_ddp.c, written the way Accelerate's examples write a training loop.

    accelerate launch --cpu --num_processes 2 bench/ddp/accelerate_gpt.py
        [--expect-processes P] [--steps S] [--warmup W] [--seed X]
        [--adamw auto|foreach|forloop|fused]

Accelerator(cpu=True); model, optimizer = accelerator.prepare(model, optimizer) (with
several processes: DistributedDataParallel over gloo with Accelerate's defaults); one
step is forward, mean cross-entropy, accelerator.backward(loss),
accelerator.clip_grad_norm_(1.0), optimizer.step(), optimizer.zero_grad(). The model,
AdamW groups and variants are bench/gpt_cpu/torch_gpt.py's W1 (vocab 256, block 256,
4 layers, 4 heads, width 256, batch 8 x 256 per process), imported from it; the AdamW
variant is its pre-check, run on the main process and used by all. Every process draws
its own random batches before the clock starts (rank 0 torch_gpt.py's stream).

Processes. Accelerate's own launcher starts one process for --cpu (its multi-process
CPU path expects MPI or torchrun to start the ranks), and torchrun in Debian's torch 1.13
fails under Python 3.11, so bench/ddp/run.sh starts the 2 ranks with `ctrain launch` and
each runs `accelerate launch --cpu --num_processes 2` with the rendezvous ctrain launch
set (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE); Accelerate then joins them as
MULTI_CPU with gloo. --expect-processes P (default: WORLD_SIZE, else 1) makes a run that
did not end up with P processes fail instead of silently measuring one.

W warm-up steps (default 3), then S timed steps (default 20); the step time is the
largest per-process median. tokens_per_s = processes * batch * seq / step time.

Output, main process only: one JSON line on stdout,
    {"impl":"accelerate-<version>","torch":..,"config":"w1","processes":..,"threads":..,
     "tokens_per_s":..,"step_ms":..,"peak_rss_mb":..,"loss0":..,"steps":..,"warmup":..,
     "params":..,"adamw":..}
Bad arguments or any failure: a message on stderr, exit status 2. The process dies with
its parent (PR_SET_PDEATHSIG), so a launcher killed by a timeout leaves no rank behind.
"""
import json
import math
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(HERE, "..", "gpt_cpu"))
import torch_gpt  # noqa: E402  the model, AdamW groups and variants of the single-process benchmark

CFG = torch_gpt.CONFIGS["w1"]


sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/
import procs  # noqa: E402

fail = procs.failer("accelerate_gpt")


def die_with_parent():
    procs.die_with_parent(fail)


def parse_args():
    p = procs.parser("GPT W1 training throughput with HF Accelerate (CPU); main process prints one JSON line", fail)
    p.add_argument("--expect-processes", type=int, default=int(os.environ.get("WORLD_SIZE", "1") or 1))
    procs.add_step_args(p, CFG)
    a = p.parse_args()
    procs.check_step_args(a, fail)
    if a.expect_processes < 1:
        fail(f"--expect-processes {a.expect_processes}: expected an integer >= 1")
    return a


def main():
    die_with_parent()
    a = parse_args()
    try:
        import torch
        import accelerate
        from accelerate import Accelerator
        from torch.nn.parallel import DistributedDataParallel
    except ImportError as e:
        fail(f"cannot import torch and accelerate with {sys.executable} ({e}); bench/ddp/run.sh installs "
             "accelerate into build/bench/ddp/venv")
    acc = Accelerator(cpu=True)
    if acc.num_processes != a.expect_processes:
        fail(f"Accelerate runs {acc.num_processes} process(es) ({acc.distributed_type}), expected "
             f"{a.expect_processes}: start the ranks with a launcher (see the header of this file)")
    rank, world = acc.process_index, acc.num_processes

    torch.manual_seed(a.seed)
    model, _ = torch_gpt.build(torch, CFG)
    model.train()
    variants = torch_gpt.adamw_variants(torch)
    names = [n for n, _ in variants]
    pick = torch.zeros(1, dtype=torch.int64)
    if acc.is_main_process:
        name, _, timings = torch_gpt.pick_adamw(torch, model, a.adamw)
        pick[0] = names.index(name)
        print(f"accelerate_gpt: accelerate {accelerate.__version__}, torch {torch.__version__}, {world} processes "
              f"x {torch.get_num_threads()} threads, {acc.distributed_type}, AdamW {name}"
              + (" (pre-check ms: " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in timings.items()) + ")"
                 if timings else ""), file=sys.stderr)
    if world > 1:
        import torch.distributed as dist

        dist.broadcast(pick, 0)
        # the causal mask (a bool buffer where torch has no fused attention) is the same on
        # every rank, and gloo cannot broadcast bool tensors: DDP leaves it alone
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [n for n, b in model.named_buffers() if b.dtype == torch.bool])
    adamw_name, adamw_kw = variants[int(pick[0])]
    params, groups = torch_gpt.param_groups(model)
    n_total = sum(p.numel() for p in params)
    opt = torch_gpt.make_adamw(torch, groups, adamw_kw)
    model, opt = acc.prepare(model, opt)

    B, T, V = CFG["batch"], CFG["seq"], CFG["vocab"]
    gen = torch.Generator().manual_seed((a.seed ^ 0x70C3E5) + 1000003 * rank)
    times, loss0 = [], None
    for step in range(a.warmup + a.steps):
        w = torch.randint(0, V, (B, T + 1), generator=gen)
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        t0 = time.perf_counter()
        loss = model(x, y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        lv = loss.item()
        if not math.isfinite(lv):
            fail(f"process {rank}: step {step}: loss is {lv} (not finite)")
        if step == 0:
            loss0 = lv
        if step >= a.warmup:
            times.append(dt)

    med = torch.tensor([statistics.median(times)], dtype=torch.float64)
    step_s = float(acc.gather(med).max().item())
    if acc.is_main_process:
        out = {
            "impl": f"accelerate-{accelerate.__version__}",
            "torch": torch.__version__,
            "config": "w1",
            "processes": world,
            "threads": torch.get_num_threads(),
            "tokens_per_s": round(world * B * T / step_s, 2),
            "step_ms": round(1e3 * step_s, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            "loss0": round(loss0, 6),
            "steps": a.steps,
            "warmup": a.warmup,
            "params": n_total,
            "adamw": adamw_name,
        }
        print(json.dumps(out, separators=(",", ":")), flush=True)
    acc.wait_for_everyone()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # a clear one-line reason, never a bare traceback as the only output
        import traceback

        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
