#!/usr/bin/env python3
"""GPT W1 data-parallel training throughput in PyTorch DistributedDataParallel (gloo):
the twin of gpt_ddp.c.

    ctrain launch --num_processes 2 --main_process_port 0 --num_cpu_threads_per_process 1 \\
        /usr/bin/python3 bench/ddp/torch_ddp.py [--steps S] [--warmup W] [--seed X]
        [--adamw auto|foreach|forloop|fused] [--timeout S]

Each rank is one process started by a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT (ctrain launch or torchrun); init_process_group("gloo", env://). The
model, optimizer and step are bench/gpt_cpu/torch_gpt.py's W1, imported from it (vocab
256, block 256, 4 layers, 4 heads, width 256, batch 8 x 256 per process): the model is
wrapped in DistributedDataParallel with its defaults (25 MiB buckets, gradients averaged
while backward runs), and one step is forward, mean cross-entropy, backward,
clip_grad_norm_(1.0), AdamW step, zero_grad(set_to_none=True). Every rank draws its own
random batches before the clock starts (rank 0 the stream torch_gpt.py draws). The AdamW
variant is torch_gpt.py's pre-check, run on rank 0 and used by every rank.
torch.set_num_threads(1) unless OMP_NUM_THREADS says otherwise (the launcher sets it).

W warm-up steps (default 3), then S timed steps (default 20); the step time is the
largest per-rank median. tokens_per_s = world * batch * seq / step time (global).

Output, rank 0 only: one JSON line on stdout,
    {"impl":"torch-ddp-<version>","config":"w1","processes":..,"threads":..,
     "tokens_per_s":..,"step_ms":..,"peak_rss_mb":..,"loss0":..,"steps":..,"warmup":..,
     "params":..,"adamw":..}
Bad arguments or any failure: a message on stderr, exit status 2. The process dies with
its parent (PR_SET_PDEATHSIG), so a launcher killed by a timeout leaves no rank behind.
"""
import datetime
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

fail = procs.failer("torch_ddp")


def die_with_parent():
    procs.die_with_parent(fail)


def parse_args():
    p = procs.parser("GPT W1 DDP training throughput in PyTorch (gloo); rank 0 prints one JSON line", fail)
    procs.add_step_args(p, CFG)
    p.add_argument("--timeout", type=float, default=300, help="seconds for setup and each collective (default 300)")
    a = p.parse_args()
    procs.check_step_args(a, fail)
    if not a.timeout > 0:
        fail(f"--timeout {a.timeout}: expected seconds > 0")
    return a


def main():
    die_with_parent()
    a = parse_args()
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            fail(f"{var} is not set: run under a launcher (ctrain launch --num_processes 2, or torchrun)")
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
    except ImportError as e:
        fail(f"cannot import torch ({e}); Debian's python3-torch provides it for /usr/bin/python3")
    if not dist.is_available() or not dist.is_gloo_available():
        fail(f"torch {torch.__version__} has no gloo backend")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    try:
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=a.timeout))
    except Exception as e:  # RuntimeError or ValueError, by version
        fail(f"init_process_group(gloo) with MASTER_ADDR={os.environ['MASTER_ADDR']} "
             f"MASTER_PORT={os.environ['MASTER_PORT']}: {e}")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(a.seed)  # same weights everywhere; DDP broadcasts rank 0's anyway
    model, _ = torch_gpt.build(torch, CFG)
    model.train()
    # rank 0 times the AdamW variants (lr 0, weights unchanged), everyone uses its pick
    variants = torch_gpt.adamw_variants(torch)
    names = [n for n, _ in variants]
    pick = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        name, _, timings = torch_gpt.pick_adamw(torch, model, a.adamw)
        pick[0] = names.index(name)
        print(f"torch_ddp: torch {torch.__version__}, {world} ranks x {torch.get_num_threads()} threads, AdamW {name}"
              + (" (pre-check ms: " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in timings.items()) + ")"
                 if timings else ""), file=sys.stderr)
    dist.broadcast(pick, 0)
    adamw_name, adamw_kw = variants[int(pick[0])]

    # the causal mask (a bool buffer where torch has no fused attention) is the same on
    # every rank, and gloo cannot broadcast bool tensors: DDP leaves it alone
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [n for n, b in model.named_buffers() if b.dtype == torch.bool])
    ddp = DistributedDataParallel(model)
    params, groups = torch_gpt.param_groups(model)
    opt = torch_gpt.make_adamw(torch, groups, adamw_kw)
    n_total = sum(p.numel() for p in params)

    B, T, V = CFG["batch"], CFG["seq"], CFG["vocab"]
    # rank 0: torch_gpt.py's stream; the others their own
    gen = torch.Generator().manual_seed((a.seed ^ 0x70C3E5) + 1000003 * rank)
    times, loss0 = [], None
    for step in range(a.warmup + a.steps):
        w = torch.randint(0, V, (B, T + 1), generator=gen)
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        t0 = time.perf_counter()
        loss = ddp(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        lv = loss.item()
        if not math.isfinite(lv):
            fail(f"rank {rank}: step {step}: loss is {lv} (not finite)")
        if step == 0:
            loss0 = lv
        if step >= a.warmup:
            times.append(dt)

    med = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    step_s = float(med.item())
    if rank == 0:
        out = {
            "impl": f"torch-ddp-{torch.__version__}",
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
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # a clear one-line reason, never a bare traceback as the only output
        import traceback

        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
