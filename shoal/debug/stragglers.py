"""Stragglers: a rank slower than 0.7x the median speed is named.

`slow_ranks` is the pure rule, shared by `shoal doctor` (compute and link benchmarks) and by
training, where `step_spread(compute_time_s)` is called once per step: one all_gather of a float,
returns the spread for metrics.jsonl and warns (once per rank, in one line) about a straggler.

The warning is for a rank that is slow and stays slow: below the threshold for PERSIST_STEPS steps in
a row (a single slow step is a garbage collection or the OS scheduling something else), and, where
more CPU ranks share this machine than it has cores (`shoal verify`'s 4 ranks on a 2-core laptop),
below the threshold divided by the ranks per core: time-sharing a core makes a rank that much slower
by construction. metrics.jsonl keeps every step's raw verdict at THRESHOLD.
"""

from __future__ import annotations

import os
import statistics
import warnings

THRESHOLD = 0.7  # speed relative to the median below which a rank is a straggler
PERSIST_STEPS = 3  # consecutive slow steps before a rank is warned about


class StragglerWarning(UserWarning):
    pass


def slow_ranks(speed: dict[int, float] | list[float], threshold: float = THRESHOLD) -> dict[int, float]:
    """{rank: speed / median speed} for each rank below `threshold` x the median (higher = faster)."""
    speed = dict(enumerate(speed)) if isinstance(speed, list) else speed
    median = statistics.median(speed.values())
    if median <= 0:
        return {}
    return {r: s / median for r, s in sorted(speed.items()) if s / median < threshold}


def spread(times_s: list[float]) -> dict:
    """Per-rank times (lower = faster) -> the numbers a metrics row carries."""
    median = statistics.median(times_s)
    slowest = max(range(len(times_s)), key=times_s.__getitem__)
    speed = {r: (1.0 / t if t > 0 else float("inf")) for r, t in enumerate(times_s)}
    return {
        "compute_time_median_s": median,
        "compute_time_spread": times_s[slowest] / median if median > 0 else 1.0,  # max / median
        "slowest_rank": slowest,
        "stragglers": sorted(slow_ranks(speed)),
    }


_warned: set[int] = set()
_streak: dict[int, int] = {}  # rank -> consecutive steps below the warning threshold


def ranks_per_core() -> float:
    """Local ranks per usable CPU core (at least 1): how much time-sharing slows each CPU rank."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1.0, local / cores)


def gather_per_rank(values: list[float], group=None) -> list[list[float]]:
    """Every rank's `values` (the same count on each), in group rank order: one all_gather of float64s.
    Collective over `group` (default: the world); without a process group, this rank's alone."""
    import torch
    import torch.distributed as dist

    from shoal.comm.renamed import all_gather_single

    if not dist.is_initialized():
        return [list(values)]
    on_gpu = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    n, k = dist.get_world_size(group), len(values)
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = torch.empty(n * k, dtype=torch.float64, device=device)
    all_gather_single(out, mine, group=group)
    flat = out.tolist()
    return [flat[i * k:(i + 1) * k] for i in range(n)]


def step_spread(compute_time_s: float, group=None) -> dict:
    """Gather every rank's compute time for this step and judge it (`judge_spread`)."""
    return judge_spread([row[0] for row in gather_per_rank([compute_time_s], group)], group)


def judge_spread(times: list[float], group=None) -> dict:
    """Per-rank compute times of one step (gathered over `group`, default: the world) -> the fields
    of a metrics row: {"compute_time_median_s", "compute_time_spread" (max/median), "slowest_rank",
    "stragglers"}; warns about a rank that stays slower than 0.7x the median (see the module
    docstring for when exactly)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return spread(times)
    on_gpu = dist.get_backend(group) == "nccl"
    n = len(times)
    out = spread(times)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    out["slowest_rank"] = ranks[out["slowest_rank"]]
    out["stragglers"] = [ranks[i] for i in out["stragglers"]]
    if dist.get_rank() == ranks[0]:
        sharing = 1.0 if on_gpu else ranks_per_core()
        median = out["compute_time_median_s"]
        by_rank = dict(zip(ranks, times))
        for r in persistent_stragglers(by_rank, THRESHOLD / sharing):
            why = f" ({THRESHOLD} / {sharing:g} ranks per core)" if sharing > 1 else ""
            _warn(f"rank {r} is a straggler: its step compute time {by_rank[r] * 1e3:.1f} ms is "
                  f"{by_rank[r] / median:.2f}x the median ({median * 1e3:.1f} ms), slower than "
                  f"{THRESHOLD / sharing:.2g}x the median speed{why} for {PERSIST_STEPS} steps in a row")
    return out


def persistent_stragglers(times_s: dict[int, float], limit: float) -> list[int]:
    """Ranks slower than `limit` x the median speed in each of the last PERSIST_STEPS calls, each
    named once per process (a persistent straggler should not flood the log)."""
    slow = slow_ranks({r: (1.0 / t if t > 0 else float("inf")) for r, t in times_s.items()}, limit)
    out = []
    for r in times_s:
        _streak[r] = _streak.get(r, 0) + 1 if r in slow else 0
        if _streak[r] >= PERSIST_STEPS and r not in _warned:
            _warned.add(r)
            out.append(r)
    return out


def _warn(message: str) -> None:
    """warnings.warn (so it can be filtered and recorded), printed as one line without a source line:
    only the formatting of this category changes, so catch_warnings(record=True) still sees it."""
    if warnings.formatwarning is not _format_one_line:
        _format_one_line.previous = warnings.formatwarning
        warnings.formatwarning = _format_one_line
    warnings.warn(message, StragglerWarning, stacklevel=3)


def _format_one_line(message, category, filename, lineno, line=None) -> str:
    if issubclass(category, StragglerWarning):
        return f"shoal: warning: {message}\n"
    return _format_one_line.previous(message, category, filename, lineno, line)
