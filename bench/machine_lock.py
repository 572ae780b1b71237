"""The shared machine's lock: benchmarks that time several runs hold it once for all of them.

Taking `/tmp/shoal-cpu.lock` once per run queues a benchmark behind every other job on the machine
again for each run; one hold keeps the runs back to back, so they see the same load.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager

LOCK = "/tmp/shoal-cpu.lock"


@contextmanager
def machine_lock():
    """Hold the lock the `flock /tmp/shoal-cpu.lock CMD` command takes (flock(2) on the same file)."""
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
