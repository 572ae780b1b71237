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


def world_size(nproc: int = 0) -> int:
    """The job's world size: --nproc when it starts local workers, else WORLD_SIZE (1 when unset),
    after checking that the launcher's variables are integers that agree with each other."""
    world = _read("WORLD_SIZE", 1, 1)
    rank = _read("RANK", 0, 0)
    if rank >= world:
        raise UserError("RANK", os.environ.get("RANK"), f"environment variable must be below WORLD_SIZE={world}; {_FIX}")
    _read("LOCAL_RANK", 0, 0)
    _read("TORCHELASTIC_RESTART_COUNT", 0, 0)
    if nproc and "WORLD_SIZE" in os.environ:  # this process is already one worker of some launcher
        raise UserError("--nproc", nproc, f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set, so this is already a "
                                          "worker of another launcher; drop --nproc or unset WORLD_SIZE")
    if world > 1 and not nproc:
        for name in ("MASTER_ADDR", "MASTER_PORT"):  # what torch's env:// rendezvous reads
            if not os.environ.get(name):
                raise UserError(name, None, f"environment variable is not set but WORLD_SIZE={world}; torchrun sets "
                                            "both; unset WORLD_SIZE to run one process, or use --nproc N")
        _read("MASTER_PORT", 0, 1)
    return nproc or world
