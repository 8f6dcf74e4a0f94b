"""Helpers shared by the Python benchmark programs (bench/*/*.py): failing, dying with
the launcher, and the options of a training-step benchmark."""
import argparse
import ctypes
import os
import signal
import sys


def failer(prog):
    """fail(msg): prints "prog: msg" on stderr and exits with status 2."""

    def fail(msg):
        print(f"{prog}: {msg}", file=sys.stderr)
        sys.exit(2)

    return fail


def die_with_parent(fail):
    """Makes the kernel kill this process when its parent (the launcher) dies, so a
    launcher stopped by a timeout leaves no rank behind."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        fail(f"prctl(PR_SET_PDEATHSIG): {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:
        fail("the launcher is gone")


def parser(description, fail):
    """An ArgumentParser whose errors go through fail (exit status 2, the program named)."""

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            self.print_usage(sys.stderr)
            fail(message)

    return Parser(description=description)


def add_step_args(p, cfg):
    """--steps, --warmup (defaults from the benchmark config cfg), --seed, --adamw."""
    p.add_argument("--steps", type=int, default=cfg["steps"], help=f"timed steps (default {cfg['steps']})")
    p.add_argument("--warmup", type=int, default=cfg["warmup"], help=f"untimed steps first (default {cfg['warmup']})")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--adamw", choices=["auto", "foreach", "forloop", "fused"], default="auto")


def check_step_args(a, fail):
    if a.steps < 1:
        fail(f"--steps {a.steps}: expected an integer >= 1")
    if a.warmup < 0:
        fail(f"--warmup {a.warmup}: expected an integer >= 0")
