"""The launcher's environment (WORLD_SIZE, RANK, LOCAL_RANK), checked once before anything reads it.

torchrun, Slurm and Kubernetes set these; a person may too, by hand or left over in a shell. A
value that is not a sensible integer is a user mistake, reported before any worker starts.
"""

from __future__ import annotations

import os

from shoal.errors import UserError

_FIX = "torchrun sets it; unset it to run one process, or give an integer"


def _read(name: str, default: int, low: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise UserError(name, raw, f"environment variable is not an integer; {_FIX}") from None
    if value < low:
        raise UserError(name, raw, f"environment variable must be >= {low}; {_FIX}")
    return value


def world_size() -> int:
    """WORLD_SIZE (1 when unset), after checking RANK and LOCAL_RANK agree with it."""
    world = _read("WORLD_SIZE", 1, 1)
    rank = _read("RANK", 0, 0)
    if rank >= world:
        raise UserError("RANK", os.environ.get("RANK"), f"environment variable must be below WORLD_SIZE={world}; {_FIX}")
    _read("LOCAL_RANK", 0, 0)
    return world
