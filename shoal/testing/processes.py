"""A launcher's worker processes, found from outside (for tests and bench/): its children, or, when
they were forked (shoal/launch/forked.py), its forkserver's children, each titled `python -m MODULE ...`."""

from __future__ import annotations

import re
from pathlib import Path

from shoal.worker.process import descendants


def workers(launcher: int, module: str = "shoal.train") -> list[int]:
    """The live processes below `launcher` running `python -m MODULE`."""
    return [p for p in descendants(launcher) if f" -m {module} " in f" {cmdline(p)} "]


def worker(launcher: int, rank_: int, restart: int = 0, module: str = "shoal.train") -> int | None:
    """The pid of worker `rank_` of restart `restart` below `launcher`, while it lives."""
    return next((p for p in workers(launcher, module) if rank(p) == (rank_, restart)), None)


def cmdline(pid: int) -> str:
    """Its command line, words joined by spaces ('' once it has exited: a zombie has none)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def rank(pid: int) -> tuple[int, int] | None:
    """(rank, restart) of a worker: from its title when forked (forked.title), else its environment."""
    if titled := re.search(r"\(rank (\d+) of \d+, restart (\d+)\)$", cmdline(pid)):
        return int(titled[1]), int(titled[2])
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return None
    env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
    if "RANK" in env and "TORCHELASTIC_RESTART_COUNT" in env:
        return int(env["RANK"]), int(env["TORCHELASTIC_RESTART_COUNT"])
    return None

