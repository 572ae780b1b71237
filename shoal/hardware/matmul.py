"""The one matmul timer: `shoal doctor --peak`, the planner's local profile and the straggler
benchmark all time a square matmul here."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MatmulRate:
    best: float  # FLOP/s of the fastest single matmul: what the hardware can do
    mean: float  # FLOP/s over the whole run: what it sustains (a straggler shows here)
    reps: int


def matmul_flops(size: int = 1024, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 seconds: float = 0.5, min_reps: int = 3) -> MatmulRate:
    """Time `size`^3 matmuls for `seconds` (at least `min_reps` of them), after one warm-up.

    On a CPU the current torch thread count applies; CUDA work is synchronized around each one.
    """
    device = torch.device(device)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    a @ b  # warm up: the first call picks kernels and allocates
    sync()
    best, reps, start = float("inf"), 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    flop = 2 * size**3
    return MatmulRate(flop / best, flop * reps / (time.perf_counter() - start), reps)
