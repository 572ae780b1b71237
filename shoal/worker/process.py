"""A worker dies with the process that started it.

The kernel sends a worker SIGKILL when its parent exits (prctl PR_SET_PDEATHSIG), so killing the
launcher, even with SIGKILL, leaves no orphan training on; stopping the launcher (Ctrl-C, SIGTERM)
ends its workers with SIGKILL (shoal/launch/local.py). Checkpoints commit atomically, so nothing
that a save had finished is lost.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from shoal.rundir.lock import LAUNCHER_ENV

PR_SET_PDEATHSIG = 1


def follow_the_launcher() -> None:
    """In a process a launcher started (WORLD_SIZE set): die with it, and let Ctrl-C end the process
    without a KeyboardInterrupt traceback per rank."""
    if "WORLD_SIZE" in os.environ:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> None:
    """The kernel sends `sig` when the parent exits; exits now when it already has."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        return  # not fatal: the launcher still stops its workers on SIGINT/SIGTERM
    if os.getppid() != parent or _gone(os.environ.get(LAUNCHER_ENV)):
        os._exit(1)  # the launcher died before the request took effect: this worker is already an orphan


def _gone(pid: str | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    return False
