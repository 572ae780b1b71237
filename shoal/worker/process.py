"""A worker dies with the process that started it.

The kernel sends a worker SIGKILL when its parent exits (prctl PR_SET_PDEATHSIG), so killing the
launcher, even with SIGKILL, leaves no orphan training on; stopping the launcher (Ctrl-C, SIGTERM)
ends its workers with SIGKILL (shoal/launch/local.py). Checkpoints commit atomically, so nothing
that a save had finished is lost.

The process tree below a launcher, read from /proc, is here too: the launcher stops its workers by it,
and shoal/testing/processes.py finds them by it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

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


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    return [child for child, parent in _parents().items() if parent == pid]


def descendants(pid: int) -> list[int]:
    """Its children, their children, and so on: a forked worker's parent is the launcher's forkserver."""
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def _parents() -> dict[int, int]:
    """Each live process's parent pid, from /proc (none where there is no /proc)."""
    parents = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    return parents
