"""The denominator of MFU: the device's peak matmul throughput.

GPUs: the hardware catalog's dense BF16 peak (fp32 runs use the same number, as MFU reports do).
CPUs have no honest datasheet number, so a short matmul calibration is measured once per
(CPU model, threads, dtype, torch version) and cached as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from shoal.cache import cache_dir


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_matmul_flops(dtype: torch.dtype, device: str | torch.device = "cpu", size: int = 1024,
                         seconds: float = 0.5) -> float:
    """Best observed FLOP/s of a square matmul (on CPU: with the current thread count)."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b  # warm up
    sync()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        a @ b
        sync()
        best = max(best, 2 * size**3 / (time.perf_counter() - t0))
    return best


def cpu_peak_flops(dtype: torch.dtype = torch.float32, remeasure: bool = False) -> float:
    key = f"{_cpu_name()}|threads={torch.get_num_threads()}|{dtype}|torch={torch.__version__}"
    path = cache_dir() / "cpu_peak_flops.json"
    table = {}
    if path.exists():
        try:
            table = json.loads(path.read_text())
        except ValueError:
            table = {}
    if key not in table or remeasure:
        table[key] = measure_matmul_flops(dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        os.replace(tmp, path)  # atomic: several ranks may calibrate at once
    return table[key]


def peak_flops(device: torch.device, precision: str) -> float:
    """Peak FLOP/s of one rank's device for MFU."""
    if device.type == "cuda":
        from shoal.planner.hardware import lookup_gpu

        entry = lookup_gpu(torch.cuda.get_device_name(device))
        if entry is not None:
            return entry.peak_bf16_flops
        return measure_matmul_flops(torch.bfloat16, device, size=8192)  # a GPU the catalog does not know
    return cpu_peak_flops(torch.float32 if precision == "fp32" else torch.bfloat16)
