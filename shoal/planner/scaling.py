"""Scaling curve: the best layout at each GPU count, and where adding GPUs stops paying off.

Two sweeps. At a fixed global batch, more GPUs mean fewer micro-batches per pipeline and less
compute per rank per step, so bubbles and communication grow until throughput stalls — the
communication wall. At a fixed per-GPU batch (weak scaling) the batch grows with the GPUs and the
per-GPU efficiency shows what the network costs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shoal.errors import UserError
from shoal.planner.evaluate import Plan
from shoal.layout import MAX_GPUS
from shoal.planner.workload import Cluster, Workload
from shoal.planner.search import Fixed, search

DIMINISHING = 0.8
"""Per-GPU efficiency below which we say adding GPUs has stopped paying off."""


@dataclass(frozen=True)
class ScalePoint:
    n_gpus: int
    mode: str
    """'fixed-global-batch' or 'fixed-per-gpu-batch'."""
    global_batch: int
    best: Plan | None
    why_none: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.best.tokens_per_s if self.best else 0.0

    @property
    def per_gpu(self) -> float:
        return self.tokens_per_s / self.n_gpus


MAX_SPAN = 2**14
"""The widest sweep, B/A: 15 GPU counts, one GPU to a 16,384-GPU cluster. Each count is two searches of up to
seconds each (more with a large per-GPU batch), so `--scale 1:10000000` (25 counts) ran 90 s before this bound."""


def parse_scale(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise UserError("scale", text, "write A:B with two GPU counts, e.g. --scale 8:16384") from None
    if a < 1 or b < a or b > MAX_GPUS:
        raise UserError("scale", text, f"need 1 <= A <= B <= {MAX_GPUS:,}, e.g. --scale 8:16384")
    if b > a * MAX_SPAN:
        raise UserError("scale", text, f"sweeps {len(gpu_counts(a, b))} GPU counts, two searches each; B/A is at "
                                       f"most {MAX_SPAN:,}: try --scale {a}:{a * MAX_SPAN} or "
                                       f"{-(-b // MAX_SPAN)}:{b}")
    return a, b


def gpu_counts(a: int, b: int) -> list[int]:
    """a, 2a, 4a, ... up to b (and b itself)."""
    out, n = [], a
    while n < b:
        out.append(n)
        n *= 2
    out.append(b)
    return out


def sweep(workload: Workload, cluster: Cluster, counts: list[int], fixed: Fixed, *, base_gpus: int,
          rank_by: str = "throughput") -> list[ScalePoint]:
    """Best layout at every count, at the given global batch and at the per-GPU batch of base_gpus."""
    fixed = dataclasses.replace(fixed, dp=None)  # dp follows the GPU count
    per_gpu = workload.global_batch / base_gpus
    points = []
    for mode in ("fixed-global-batch", "fixed-per-gpu-batch"):
        for n in counts:
            batch = workload.global_batch if mode == "fixed-global-batch" else max(1, round(per_gpu * n))
            wl = dataclasses.replace(workload, global_batch=batch)
            try:
                result = search(wl, dataclasses.replace(cluster, n_gpus=n), fixed, rank_by=rank_by, keep=1, misses=1)
            except UserError as e:
                points.append(ScalePoint(n, mode, batch, None, f"no layout divides: {e.fix}"))
                continue
            if result.best is None:
                miss = result.closest_misses[0].reasons[0] if result.closest_misses else "nothing fits"
                points.append(ScalePoint(n, mode, batch, None, f"nothing fits; closest {miss}"))
            else:
                points.append(ScalePoint(n, mode, batch, result.best))
    return points


def efficiency(points: list[ScalePoint]) -> dict[int, float]:
    """Per-GPU throughput relative to the best per-GPU throughput of the sweep (one mode's points)."""
    base = max((p.per_gpu for p in points if p.best), default=0.0)
    return {p.n_gpus: (p.per_gpu / base if base and p.best else 0.0) for p in points}


def knee(points: list[ScalePoint]) -> tuple[int | None, int | None]:
    """(first count past the per-GPU peak whose efficiency is below DIMINISHING, first count that adds
    no throughput over a smaller one) for one mode's points."""
    eff = efficiency(points)
    peak = max((p.n_gpus for p in points if p.best and eff[p.n_gpus] >= 1.0), default=0)
    diminishing = next((p.n_gpus for p in points if p.best and p.n_gpus > peak and eff[p.n_gpus] < DIMINISHING), None)
    wall, prev = None, 0.0
    for p in points:
        if p.best and prev and p.tokens_per_s <= prev * 1.02:
            wall = p.n_gpus
            break
        prev = max(prev, p.tokens_per_s)
    return diminishing, wall
