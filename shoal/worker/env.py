"""The launcher's environment (WORLD_SIZE, RANK, LOCAL_RANK, OMP_NUM_THREADS, ...), checked once before
anything reads it.

torchrun, Slurm and Kubernetes set these; a person may too, by hand or left over in a shell. A
value that is not a sensible integer is a user mistake, reported before any worker starts.
"""

from __future__ import annotations

import os

from shoal.errors import UserError

_FIX = "torchrun sets it; unset it to run one process, or give an integer"


def _read(name: str, default: int, low: int, high: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise UserError(name, raw, f"environment variable is not an integer; {_FIX}") from None
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise UserError(name, raw, f"environment variable must be {bound}; {_FIX}")
    return value


def master_port() -> int | None:
    """MASTER_PORT when set (torch's env:// rendezvous reads it), checked to be a TCP port."""
    return _read("MASTER_PORT", 0, 1, 65535) if os.environ.get("MASTER_PORT") else None


def omp_threads() -> int:
    """OMP_NUM_THREADS as OpenMP reads it: a thread count, or one per nesting level ("8,4"); the
    first count, 1 when unset. OpenMP ignores anything else with a warning when torch loads, so
    shoal/cli/main.py checks it before any command runs."""
    raw = os.environ.get("OMP_NUM_THREADS")
    if raw is None:
        return 1
    counts = [c.strip().removeprefix("+") for c in raw.split(",")]
    if not all(c.isascii() and c.isdigit() and int(c) > 0 for c in counts):
        raise UserError("OMP_NUM_THREADS", raw, "environment variable must be a positive thread count, e.g. 4 "
                                                "(or one per nesting level, 8,4); unset it for shoal's default")
    return int(counts[0])


def world_size(nproc: int = 0) -> int:
    """The job's world size: --nproc when it starts local workers, else WORLD_SIZE (1 when unset),
    after checking that the launcher's variables are integers that agree with each other."""
    world = _read("WORLD_SIZE", 1, 1)
    rank = _read("RANK", 0, 0)
    if rank >= world:
        raise UserError("RANK", os.environ.get("RANK"), f"environment variable must be below WORLD_SIZE={world}; {_FIX}")
    local_world = _read("LOCAL_WORLD_SIZE", 1, 1, world if "WORLD_SIZE" in os.environ else None)
    _read("LOCAL_RANK", 0, 0, local_world - 1 if "LOCAL_WORLD_SIZE" in os.environ else None)
    if _read("TORCHELASTIC_RESTART_COUNT", 0, 0) and "WORLD_SIZE" not in os.environ and not nproc:
        # restart_count() > 0 makes a run continue from its newest checkpoint whatever --resume says
        raise UserError("TORCHELASTIC_RESTART_COUNT", os.environ["TORCHELASTIC_RESTART_COUNT"],
                        "environment variable is set but WORLD_SIZE is not, so no elastic agent restarted this "
                        "process (a leftover from a worker's environment?); unset it")
    if nproc and "WORLD_SIZE" in os.environ:  # this process is already one worker of some launcher
        raise UserError("--nproc", nproc, f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set, so this is already a "
                                          "worker of another launcher; drop --nproc or unset WORLD_SIZE")
    if world > 1 and not nproc:
        for name in ("MASTER_ADDR", "MASTER_PORT"):  # what torch's env:// rendezvous reads
            if not os.environ.get(name):
                raise UserError(name, None, f"environment variable is not set but WORLD_SIZE={world}; torchrun sets "
                                            "both; unset WORLD_SIZE to run one process, or use --nproc N")
        master_port()
    return nproc or world


def local_world_size(default: int) -> int:
    """Ranks on this node: the launcher's LOCAL_WORLD_SIZE (torchrun and shoal's launchers set it;
    world_size() checked it), else `default`."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", default))
