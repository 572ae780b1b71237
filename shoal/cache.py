"""Where shoal keeps what it measures or derives once per machine (token shards, CPU peak FLOP/s,
the planner's `local` profile), and the lock that makes processes starting at once fill an entry once.
Imports no torch: the planner uses it."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_POLL_S, TELL_AFTER_S = 0.05, 2.0


def cache_dir() -> Path:
    """$SHOAL_CACHE_DIR if set (tests point it at a temporary folder), else ~/.cache/shoal."""
    return Path(os.environ.get("SHOAL_CACHE_DIR") or Path.home() / ".cache" / "shoal").expanduser()  # "~/x" quoted


@contextlib.contextmanager
def one_filler(entry: str | os.PathLike) -> Iterator[None]:
    """Serialise the processes that fill one cache entry (a file or a folder), so that one does the work and
    the rest, finding it there once they hold the lock, reuse it: launchers started at once, a run's ranks.

    Only an optimisation: without flock (some network filesystems) they race, and each writes what it
    writes atomically, whole.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(f"{entry}.lock", "a") as lock:
        waited = 0.0
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # said once, and only when it is more than another rank's quick check
                if waited <= TELL_AFTER_S < waited + LOCK_POLL_S:
                    print(f"shoal: waiting for another process to finish {entry}", file=sys.stderr, flush=True)
                time.sleep(LOCK_POLL_S)
                waited += LOCK_POLL_S
            except OSError:
                yield  # flock unsupported here
                return
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
