"""Process helpers shared by the Python benchmark programs (bench/*/*.py)."""
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
