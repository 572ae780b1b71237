"""Measure this machine for the planner's `local` profile: matmul rate, memory bandwidth, gloo links.

Run as `python -m shoal.measure.local_profile --out PATH` (the planner does this in a subprocess, so
the planner itself never imports torch.distributed). Takes a few seconds:
- matmul FLOP/s on one thread, bf16 and fp32 (one rank per core is how shoal runs on a CPU);
- copy bandwidth (read + write) of a 64 MiB tensor on one thread;
- the dispatch cost of one eager op that autograd records (a tiny multiply);
- all_reduce between two local processes over gloo: a 4-byte one for latency, a 16 MiB one for
  bus bandwidth (nccl-tests convention: busbw = bytes / time * 2(n-1)/n, which is bytes / time for n = 2).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import tempfile
import time
from pathlib import Path


def _best_time(fn, repeats: int) -> float:
    fn()  # warm up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_matmul(dtype_name: str, n: int = 512, repeats: int = 5) -> float:
    import torch

    from shoal.measure.matmul import matmul_flops

    return matmul_flops(n, getattr(torch, dtype_name), seconds=0.0, min_reps=repeats).best


def measure_copy(nbytes: int = 64 * 2**20, repeats: int = 5) -> float:
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = _best_time(lambda: dst.copy_(src), repeats)
    return 2.0 * nbytes / t  # read + write


def measure_op_overhead(repeats: int = 2000) -> float:
    """Seconds of dispatch per eager op: a tiny multiply recorded by autograd, where the arithmetic is nothing."""
    import torch

    a = torch.ones(8, requires_grad=True)

    def ops():
        for _ in range(repeats):
            torch.mul(a, 2.0)

    return _best_time(ops, 3) / repeats


def _gloo_worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    from shoal.comm.ops import busbw as bus_bandwidth

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    small = torch.zeros(1)
    big = torch.zeros(4 * 2**20)  # 16 MiB of fp32
    for _ in range(5):
        dist.all_reduce(small)
    dist.barrier()
    t0 = time.perf_counter()
    reps = 50
    for _ in range(reps):
        dist.all_reduce(small)
    latency_op = (time.perf_counter() - t0) / reps
    dist.all_reduce(big)
    dist.barrier()
    reps = 4
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(big)
    big_op = (time.perf_counter() - t0) / reps
    if rank == 0:
        nbytes = big.numel() * 4
        bw = bus_bandwidth("all_reduce", nbytes, big_op, world)
        # A ring all_reduce has 2(n-1) steps; the alpha of the alpha-beta model is per step.
        Path(out_file).write_text(json.dumps({"gloo_busbw": bw, "gloo_latency": latency_op / (2 * (world - 1))}))
    dist.destroy_process_group()


def measure_gloo(world: int = 2) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_file = os.path.join(tmp, "init"), os.path.join(tmp, "out.json")
        mp.spawn(_gloo_worker, args=(world, init_file, out_file), nprocs=world, join=True)
        return json.loads(Path(out_file).read_text())


def memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2**30


def measure() -> dict:
    import torch

    torch.set_num_threads(1)
    profile = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": memory_bytes(),
        "matmul_fp32_flops": measure_matmul("float32"),
        "matmul_bf16_flops": measure_matmul("bfloat16"),
        "copy_bandwidth": measure_copy(),
        "op_overhead": measure_op_overhead(),
    }
    profile.update(measure_gloo())
    return profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="measure this machine for `shoal plan --gpu local`")
    parser.add_argument("--out", required=True, help="where to write the profile (JSON)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    profile = measure()
    profile["seconds"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(profile, indent=2))
    print(json.dumps(profile, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
