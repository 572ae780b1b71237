"""One live run per output folder: an exclusive flock on `<out>/.lock`.

Two live runs writing one directory interleave their metrics and checkpoints, so the process that
owns a run (the `shoal train --nproc N` launcher, a single process, or rank 0 under plain torchrun)
holds an exclusive flock on `<out>/.lock`, naming its pid and host inside. The kernel drops a flock
when its holder dies, however it dies, so a stale lock never needs cleaning: the next run takes it.
Workers that shoal's launcher starts never take it: the launcher holds it for them.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from shoal.errors import UserError
from shoal.rundir.disk import no_space_left
from shoal.rundir.names import LOCK

LAUNCHER_ENV = "SHOAL_LAUNCHER_PID"
"""Set by shoal's launchers for the processes they start: the pid whose death ends them
(shoal/worker/process.py), which holds the run's lock."""
_held: dict[Path, int] = {}  # run directory -> the lock fd this process holds (closing it drops the lock)


def lock(out: Path) -> None:
    """Take `<out>/.lock` until release(out) or this process ends, or refuse naming the live run
    that holds it. Taking it again in the process that holds it is a no-op."""
    if out.resolve() in _held:
        return
    try:
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:  # e.g. a read-only mount (permission bits alone do not stop root)
        raise UserError("--out", str(out), f"is not writable ({e.strerror}); pick a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").split() or ["?", "?"]
        os.close(fd)
        raise UserError("--out", str(out), f"is in use by a running shoal train (pid {holder[0]} on host "
                        f"{holder[-1]}); wait for it or stop it, or pick another --out") from None
    with no_space_left(out / LOCK):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[out.resolve()] = fd


def release(out: Path) -> None:
    """Let go of `<out>/.lock` (an in-process caller's run is over)."""
    fd = _held.pop(out.resolve(), None)
    if fd is not None:
        os.close(fd)


def claim(out: Path) -> bool:
    """Lock the run directory if this process owns the run; returns whether it took the lock.

    Under plain torchrun rank 0 takes it (one lock per run, and only rank 0 writes into --out); after
    an elastic restart it waits a moment for the failed attempt's rank 0 to let go.
    """
    if "WORLD_SIZE" in os.environ:
        if os.environ.get("RANK", "0") != "0":
            return False
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
            _lock_retrying(out)
            return True
    lock(out)
    return True


def _lock_retrying(out: Path, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return lock(out)
        except UserError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
