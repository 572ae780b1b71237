"""Per-collective overhead of shoal's checker and watchdog vs PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL.

    python bench/bench_checker.py [--nproc 2] [--iters 200] [--bytes 1024] [--repeats 3]

Two kinds of launch on gloo, alternated `--repeats` times so drift in machine load hits both:
  * plain: in one process, rounds alternate between no debugging, shoal's watchdog only, and
    shoal's checker (enable/disable between rounds);
  * DETAIL: the same collectives with TORCH_DISTRIBUTED_DEBUG=DETAIL (set before init).
Overhead = median time per all_reduce minus the plain baseline of the same repeat (medians, not
means: on a shared machine the mean is mostly scheduler noise). Prints a table and the ratio
(shoal checker overhead) / (DETAIL overhead): below 1 means cheaper than DETAIL.
Small messages on purpose: the overhead is per call, and large messages only hide it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def time_all_reduce(iters: int, nbytes: int) -> float:
    """Median seconds per all_reduce: on a shared machine the mean is mostly scheduler noise."""
    import torch
    import torch.distributed as dist

    x = torch.ones(max(1, nbytes // 4))
    for _ in range(10):  # warm up connections and caches
        dist.all_reduce(x)
    dist.barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker(mode: str, out: Path, iters: int, nbytes: int, rounds: int) -> None:
    import torch.distributed as dist

    import shoal.debug

    dist.init_process_group("gloo")
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        plans = [("detail", None)] if mode == "detail" else [
            ("baseline", None), ("watchdog", dict(check_collectives=False, hang_timeout_s=300)),
            ("checker", dict(check_collectives=True, hang_timeout_s=300))]
        for name, settings in plans:
            if settings is not None:
                shoal.debug.enable(**settings)
            times.setdefault(name, []).append(time_all_reduce(iters, nbytes))
            if settings is not None:
                shoal.debug.disable()
    if dist.get_rank() == 0:
        out.write_text(json.dumps({k: statistics.median(v) for k, v in times.items()}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--bytes", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="alternations of the modes inside one launch")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, Path(args.out), args.iters, args.bytes, args.rounds)
        return

    from shoal.launch.local import launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            row = {}
            for mode in ("plain", "detail"):
                out = Path(tmp) / f"{mode}{rep}.json"
                env_before = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
                if mode == "detail":
                    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
                try:
                    code = launch([__file__, "--worker", mode, "--out", str(out), "--iters", str(args.iters),
                                   "--bytes", str(args.bytes), "--rounds", str(args.rounds)], args.nproc)
                finally:
                    os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
                    if env_before is not None:
                        os.environ["TORCH_DISTRIBUTED_DEBUG"] = env_before
                if code != 0:
                    sys.exit(f"bench worker ({mode}) failed with exit code {code}")
                row.update(json.loads(out.read_text()))
            results.append(row)
            print(f"repeat {rep + 1}/{args.repeats}: " + "  ".join(f"{k} {v * 1e6:.0f} us" for k, v in row.items()),
                  flush=True)

    def overhead(name: str) -> float:
        return statistics.median(r[name] - r["baseline"] for r in results)

    base = statistics.median(r["baseline"] for r in results)
    print(f"\nall_reduce of {args.bytes} B on {args.nproc} gloo ranks, median of {args.repeats} repeats")
    print(f"{'mode':<34}{'us/collective':>14}{'overhead us':>13}")
    print(f"{'no debugging':<34}{base * 1e6:>14.0f}{0:>13.0f}")
    for name, label in (("watchdog", "shoal watchdog only"), ("checker", "shoal checker + watchdog"),
                        ("detail", "TORCH_DISTRIBUTED_DEBUG=DETAIL")):
        t = statistics.median(r[name] for r in results)
        print(f"{label:<34}{t * 1e6:>14.0f}{overhead(name) * 1e6:>13.0f}")
    detail = overhead("detail")
    if detail > 0:
        print(f"\nratio: shoal checker overhead / DETAIL overhead = {overhead('checker') / detail:.2f}")
    else:
        print("\nratio: DETAIL showed no measurable overhead on this machine; no ratio")


if __name__ == "__main__":
    main()
