#!/usr/bin/env python3
"""Allreduce bus bandwidth of PyTorch's torch.distributed with the gloo backend, the
twin of allreduce.c.

    ctrain launch --num_processes 2 --main_process_port 0 --num_cpu_threads_per_process 1 \\
        /usr/bin/python3 bench/collectives/allreduce_gloo.py [--sizes B,B,...]
        [--min-time S] [--min-iters N] [--warmup W] [--timeout S]

Each rank is one process started by a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT (ctrain launch or torchrun); init_process_group("gloo") reads them
(init_method env://). The method is allreduce.c's, step for step: per size B (bytes,
a multiple of 4) a check that B/4 f32 holding rank+1 sum to n(n+1)/2, then zeros, W
timed warm-up calls (default 5), the iteration count max(N, ceil(S / the largest
per-rank fastest warm-up call)) (default S = 0.2 s, N = 5, at most 200000) agreed
through an all_reduce MAX, each call timed alone (time.perf_counter around a blocking
dist.all_reduce), and the largest per-rank median. Calls are in place (all_reduce has
no other form), SUM, f32. algbw = B / time, busbw = algbw * 2 (n-1) / n, in GB/s.
torch.set_num_threads(1), so that gloo's reduction is not helped by intra-op threads
the other implementations do not get; gloo's own I/O threads run as they do by default.

Output, rank 0 only: one JSON line per size on stdout,
    {"impl":"gloo","torch":<version>,"ranks":n,"bytes":B,"iters":..,"warmup":W,
     "median_us":..,"algbw_gbs":..,"busbw_gbs":..}
Bad arguments or any failure: a message on stderr, exit status 2. The process dies with
its parent (PR_SET_PDEATHSIG), so a launcher killed by a timeout leaves no rank behind.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time

DEFAULT_SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
MAX_ITERS = 200000


sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/
import procs  # noqa: E402

fail = procs.failer("allreduce_gloo")


def die_with_parent():
    procs.die_with_parent(fail)


def parse_args():
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # argparse's own exit status is 2 too; say who we are
            self.print_usage(sys.stderr)
            fail(message)

    def sizes(s):
        try:
            v = [int(x) for x in s.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{s}': expected comma-separated byte counts")
        for b in v:
            if b < 4 or b % 4:
                raise argparse.ArgumentTypeError(f"'{s}': each size must be a multiple of 4 bytes, >= 4")
        return v

    p = Parser(description="allreduce bus bandwidth of torch.distributed (gloo); rank 0 prints JSON lines")
    p.add_argument("--sizes", type=sizes, default=DEFAULT_SIZES, help="bytes, comma-separated")
    p.add_argument("--min-time", type=float, default=0.2, help="seconds of timed calls per size (default 0.2)")
    p.add_argument("--min-iters", type=int, default=5, help="at least this many timed calls (default 5)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per size first, >= 1 (default 5)")
    p.add_argument("--timeout", type=float, default=300, help="seconds for setup and each call (default 300)")
    a = p.parse_args()
    if not (0 <= a.min_time <= 3600):
        fail(f"--min-time {a.min_time}: expected seconds in [0, 3600]")
    if not (1 <= a.min_iters <= MAX_ITERS):
        fail(f"--min-iters {a.min_iters}: expected an integer in [1, {MAX_ITERS}]")
    if a.warmup < 1:
        fail(f"--warmup {a.warmup}: expected an integer >= 1")
    if not a.timeout > 0:
        fail(f"--timeout {a.timeout}: expected seconds > 0")
    return a


def max_over_ranks(dist, torch, v):
    t = torch.tensor([v], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def bench_size(dist, torch, a, rank, n, nbytes):
    count = nbytes // 4
    x = torch.full((count,), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(x)
    want = n * (n + 1) / 2
    bad = (x != want).nonzero()
    if bad.numel():
        i = int(bad[0])
        fail(f"rank {rank}: allreduce of {nbytes} bytes: element {i} is {float(x[i])}, expected {want}")
    x.zero_()
    times = []
    for _ in range(a.warmup):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    est = max_over_ranks(dist, torch, min(times))
    iters = MAX_ITERS if est <= 0 else int(min(MAX_ITERS, max(a.min_iters, math.ceil(a.min_time / est))))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    med = max_over_ranks(dist, torch, statistics.median(times))
    bad = x.nonzero()
    if bad.numel():
        i = int(bad[0])
        fail(f"rank {rank}: after allreduces of zeros ({nbytes} bytes) element {i} is {float(x[i])}")
    if rank == 0:
        algbw = nbytes / med
        print(json.dumps({"impl": "gloo", "torch": torch.__version__, "ranks": n, "bytes": nbytes, "iters": iters,
                          "warmup": a.warmup, "median_us": round(1e6 * med, 3), "algbw_gbs": round(1e-9 * algbw, 4),
                          "busbw_gbs": round(1e-9 * algbw * 2 * (n - 1) / n, 4)}), flush=True)


def main():
    die_with_parent()
    a = parse_args()
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            fail(f"{var} is not set: run under a launcher (ctrain launch --num_processes 2, or torchrun)")
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        fail(f"cannot import torch ({e}); Debian's python3-torch provides it for /usr/bin/python3")
    if not dist.is_available() or not dist.is_gloo_available():
        fail(f"torch {torch.__version__} has no gloo backend")
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=a.timeout))
    except Exception as e:  # torch raises RuntimeError or ValueError, by version
        fail(f"init_process_group(gloo) with MASTER_ADDR={os.environ['MASTER_ADDR']} "
             f"MASTER_PORT={os.environ['MASTER_PORT']}: {e}")
    rank, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        fail(f"WORLD_SIZE is {n}; this benchmark needs at least 2 ranks")
    try:
        for b in a.sizes:
            bench_size(dist, torch, a, rank, n, b)
    except RuntimeError as e:
        fail(f"rank {rank}: {e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
