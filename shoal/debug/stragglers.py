"""Stragglers: a rank slower than 0.7x the median speed is named.

`slow_ranks` is the pure rule, shared by `shoal doctor` (compute and link benchmarks) and by
training, where `step_spread(compute_time_s)` is called once per step: one all_gather of a float,
returns the spread for metrics.jsonl and warns (once per rank) about a straggler.
"""

from __future__ import annotations

import statistics
import warnings

THRESHOLD = 0.7  # speed relative to the median below which a rank is a straggler


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


def step_spread(compute_time_s: float, group=None) -> dict:
    """Gather every rank's compute time for this step; warn about ranks slower than 0.7x the median.

    Collective over `group` (default: the world): every rank calls it at the same point. Returns
    {"compute_time_median_s", "compute_time_spread" (max/median), "slowest_rank", "stragglers"}.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return spread([compute_time_s])
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    n = dist.get_world_size(group)
    mine = torch.tensor([compute_time_s], dtype=torch.float64, device=device)
    times = torch.empty(n, dtype=torch.float64, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(times, mine, group=group)
    out = spread(times.tolist())
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    out["slowest_rank"] = ranks[out["slowest_rank"]]
    out["stragglers"] = [ranks[i] for i in out["stragglers"]]
    if dist.get_rank() == ranks[0]:
        for r in out["stragglers"]:
            if r not in _warned:  # once per rank: a persistent straggler should not flood the log
                _warned.add(r)
                median = out["compute_time_median_s"]
                t = times[ranks.index(r)].item()
                warnings.warn(f"rank {r} is a straggler: its step compute time {t * 1e3:.1f} ms is "
                              f"{t / median:.2f}x the median ({median * 1e3:.1f} ms), slower than "
                              f"{THRESHOLD}x the median speed", StragglerWarning, stacklevel=2)
    return out
