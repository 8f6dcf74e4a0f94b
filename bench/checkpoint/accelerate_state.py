#!/usr/bin/env python3
"""Checkpoint throughput with HuggingFace Accelerate: accelerator.save_state and
accelerator.load_state on GPT-2 124M with AdamW, the twin of checkpoint.c.

    accelerate_state.py --dir DIR [--reps R] [--batch B] [--seq T] [--seed X]
        [--deepspeed] [--expect-processes P]
    torchrun --standalone --nproc_per_node 2 accelerate_state.py --dir DIR [--deepspeed]

The model is transformers' GPT2LMHeadModel(GPT2Config()) with the dropouts at 0: GPT-2
124M (vocab 50257, 1024 positions, 12 layers, 12 heads, width 768, lm head tied to wte:
124,439,808 parameters), f32, and torch's AdamW with checkpoint.c's groups and settings
(lr 1e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the 2-D tensors). The loop is
Accelerate's: Accelerator(cpu=True) (several processes: DDP over gloo), prepare, one
step on B rows of T random tokens (default 1 x 64) so AdamW has its moments. With
--deepspeed: Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2)) instead (DeepSpeed
on its CPU accelerator, gloo; save_state is then DeepSpeed's save_checkpoint: the module's
states and one file per rank of its optimizer partition).

The resume check and the rounds are checkpoint.c's:
  - save into DIR/check, two steps (losses L2, L3), load, the same batches again: the
    losses must come back (reported as resume "exact" or "differs", not enforced);
  - R rounds (default 5), each into a new DIR/accelerate-<i>, each between barriers,
    the slowest process's time:
      save     accelerator.save_state(path), as it returns. Accelerate does not fsync:
               the bytes may still be in the page cache.
      durable  from the same start until, after a barrier, the main process has fsynced
               every file of the checkpoint and its directory: the time to the same
               state checkpoint.c's save reaches before it returns.
      cold     accelerator.load_state(path) after the main process dropped every file
               from the page cache (posix_fadvise DONTNEED; clean after the fsync;
               cold_resident: the largest fraction of pages still cached, by mincore).
      raw      then the files dropped again and read with plain 16 MiB reads;
               raw_over_load: raw / cold per round, median (checkpoint.c's ceiling).
      warm     accelerator.load_state(path) again (in the page cache).
    The directory is removed between rounds and its file system synced, untimed.
bytes and files: every regular file under DIR/accelerate-0. Rates are computed by run.sh.

Output, main process only: one JSON line on stdout,
    {"impl":"accelerate","accelerate":..,"torch":..,"transformers":..,"deepspeed":..,
     "processes":..,"threads":..,"distributed_type":..,"files":..,"bytes":..,"params":..,
     "reps":..,"save_s":..,"durable_s":..,"load_cold_s":..,"load_warm_s":..,
     "save_all":[..],"durable_all":[..],"load_cold_all":[..],"load_warm_all":[..],
     "raw_read_all":[..],"raw_over_load_all":[..],"raw_read_s":..,"raw_over_load":..,
     "cold_resident":..,"peak_rss_mb":..,"loss0":..,"resume":..,"resume_rel_diff":..}
Bad arguments or any failure: a message on stderr, exit status 2. The process dies with
its parent (PR_SET_PDEATHSIG), so a launcher killed by a timeout leaves no rank behind.
"""
import ctypes
import json
import math
import mmap
import os
import resource
import shutil
import statistics
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/
import procs  # noqa: E402

fail = procs.failer("accelerate_state")
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def parse_args():
    p = procs.parser("checkpoint save/load throughput with HF Accelerate; main process prints one JSON line", fail)
    p.add_argument("--dir", required=True, help="an existing directory on the file system to measure")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--deepspeed", action="store_true", help="DeepSpeed ZeRO-2 through Accelerate's plugin")
    p.add_argument("--expect-processes", type=int, default=int(os.environ.get("WORLD_SIZE", "1") or 1))
    a = p.parse_args()
    if not os.path.isdir(a.dir):
        fail(f"--dir {a.dir} is not a directory")
    if not 1 <= a.reps <= 100:
        fail(f"--reps {a.reps}: expected an integer in [1, 100]")
    if not 1 <= a.seq <= 1024 or not 1 <= a.batch <= 64:
        fail(f"--batch {a.batch} --seq {a.seq}: expected 1..64 rows of 1..1024 tokens")
    return a


# ---- the checkpoint's files ------------------------------------------------------------

def files_under(path):
    out = []
    for root, _, names in os.walk(path):
        out += [os.path.join(root, n) for n in names if os.path.isfile(os.path.join(root, n))]
    return sorted(out)


def resident_pages(fd, size):
    """Pages of the open file fd in the page cache, by mincore."""
    page = mmap.PAGESIZE
    n = (size + page - 1) // page
    if n == 0:
        return 0
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    try:
        vec = (ctypes.c_ubyte * n)()
        if libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec)
    finally:
        libc.munmap(addr, size)


def walk(path, evict):
    """(files, bytes, pages, resident pages after the eviction) of the files under path."""
    files = nbytes = pages = resident = 0
    for f in files_under(path):
        size = os.path.getsize(f)
        files, nbytes = files + 1, nbytes + size
        if evict:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                resident += resident_pages(fd, size)
            finally:
                os.close(fd)
            pages += (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    return files, nbytes, pages, resident


def raw_read(path):
    """Seconds to read every file under path with plain 16 MiB reads: what the device
    gives these files at this moment (checkpoint.c's raw_read)."""
    t0 = time.perf_counter()
    for f in files_under(path):
        with open(f, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass
    return time.perf_counter() - t0


def fsync_tree(path):
    for f in files_under(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for root, dirs, _ in os.walk(path, topdown=False):
        for d in [root] + [os.path.join(root, x) for x in dirs]:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # the checkpoint directory's own entry
    finally:
        os.close(fd)


def remove_and_sync(path, parent):
    """Removes path, then syncs the file system, so the next round does not write while
    these blocks are still being freed."""
    shutil.rmtree(path, ignore_errors=True)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        libc.syncfs(fd)
    finally:
        os.close(fd)


# ---- the run -----------------------------------------------------------------------------

def main():
    procs.die_with_parent(fail)
    a = parse_args()
    try:
        import torch
        import accelerate
        import transformers
        from accelerate import Accelerator
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        fail(f"cannot import torch, accelerate and transformers with {sys.executable} ({e}); "
             "bench/checkpoint/run.sh installs them into build/bench/checkpoint/venv")
    ds_version = None
    if a.deepspeed:
        import deepspeed
        from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

        ds_version = deepspeed.__version__
        # Accelerate takes DeepSpeed's path only without cpu=True, and on a machine with no
        # GPU it then finds no process-group backend of its own (and runs one process):
        # gloo, as DeepSpeed's CPU accelerator uses, is named here.
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1),
                          kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
        # DeepSpeed wants a micro batch size even when no loader is prepared
        acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = a.batch
    else:
        acc = Accelerator(cpu=True)
    if acc.num_processes != a.expect_processes:
        fail(f"Accelerate runs {acc.num_processes} process(es) ({acc.distributed_type}), expected "
             f"{a.expect_processes}: start the ranks with torchrun")
    rank, world, main_proc = acc.process_index, acc.num_processes, acc.is_main_process

    torch.manual_seed(a.seed)
    cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # GPT-2 124M
    model = GPT2LMHeadModel(cfg)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    model, opt = acc.prepare(model, opt)

    gen = torch.Generator().manual_seed((a.seed ^ 0x70C3E5) + 1000003 * rank)

    def step():
        x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen).to(acc.device)
        loss = model(input_ids=x, labels=x).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()
        if not math.isfinite(lv):
            fail(f"process {rank}: loss is {lv} (not finite)")
        return lv

    def slowest(v):
        return float(acc.gather(torch.tensor([v], dtype=torch.float64, device=acc.device)).max().item())

    loss0 = step()  # AdamW's moments and step count

    # resume check
    check = os.path.join(a.dir, "check")
    if main_proc:
        shutil.rmtree(check, ignore_errors=True)
    acc.wait_for_everyone()
    acc.save_state(check)
    at_save = gen.get_state()  # the batches are this program's own stream, not the checkpoint's
    losses = [step(), step()]
    acc.load_state(check)
    gen.set_state(at_save)
    losses += [step(), step()]
    rel = max(abs(losses[2] - losses[0]) / abs(losses[0]), abs(losses[3] - losses[1]) / abs(losses[1]))
    rel = slowest(rel)
    if main_proc:
        print(f"accelerate_state: resume check: losses {losses[0]:.9g} {losses[1]:.9g}, after load "
              f"{losses[2]:.9g} {losses[3]:.9g}", file=sys.stderr)
        remove_and_sync(check, a.dir)
    acc.wait_for_everyone()

    save, durable, cold, warm, rawr, ratio = [], [], [], [], [], []
    files = nbytes = 0
    resident = 0.0
    for r in range(a.reps):
        path = os.path.join(a.dir, f"accelerate-{r}")
        if main_proc:
            shutil.rmtree(path, ignore_errors=True)
        acc.wait_for_everyone()
        t0 = time.perf_counter()
        acc.save_state(path)
        save.append(slowest(time.perf_counter() - t0))  # a barrier too: every process has written
        if main_proc:
            fsync_tree(path)
        durable.append(slowest(time.perf_counter() - t0))
        if main_proc:
            f, b, pages, res = walk(path, evict=True)
            if r == 0:
                files, nbytes = f, b
                for x in files_under(path):  # into the log: what the bytes are
                    print(f"accelerate_state: {os.path.relpath(x, path)} {os.path.getsize(x)} bytes", file=sys.stderr)
            if pages:
                resident = max(resident, res / pages)
        for out in (cold, warm):
            acc.wait_for_everyone()
            t0 = time.perf_counter()
            acc.load_state(path)
            out.append(slowest(time.perf_counter() - t0))
            if main_proc and out is cold:
                # after the load, as checkpoint.c: a host cache below helps the raw read
                walk(path, evict=True)
                rawr.append(raw_read(path))
                ratio.append(rawr[-1] / cold[-1])
        if main_proc:
            remove_and_sync(path, a.dir)
        acc.wait_for_everyone()

    if main_proc:
        med = statistics.median
        out = {
            "impl": "accelerate",
            "accelerate": accelerate.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "deepspeed": ds_version,
            "processes": world,
            "threads": torch.get_num_threads(),
            "distributed_type": str(acc.distributed_type).split(".")[-1],
            "files": files,
            "bytes": nbytes,
            "params": n_params,
            "reps": a.reps,
            "save_all": [round(v, 4) for v in save],
            "durable_all": [round(v, 4) for v in durable],
            "load_cold_all": [round(v, 4) for v in cold],
            "load_warm_all": [round(v, 4) for v in warm],
            "raw_read_all": [round(v, 4) for v in rawr],
            "raw_over_load_all": [round(v, 4) for v in ratio],
            "save_s": round(med(save), 4),
            "durable_s": round(med(durable), 4),
            "load_cold_s": round(med(cold), 4),
            "load_warm_s": round(med(warm), 4),
            "raw_read_s": round(med(rawr), 4),
            "raw_over_load": round(med(ratio), 4),
            "cold_resident": round(resident, 4),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            "loss0": round(loss0, 6),
            "resume": "exact" if rel == 0 else "differs",
            "resume_rel_diff": rel,
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
