"""How fast is the planner's search, and how close to published runs? Prints, never asserts (DESIGN.md).

    .venv/bin/python bench/bench_planner.py                # search speed
    .venv/bin/python bench/bench_planner.py --calibration  # also the published-vs-predicted table

The target from the planner issue: a full search for llama3-405b on 16,384 H100s in under a second.
The calibration rows are the ones tests/unit/test_planner_calibration.py checks with tolerances.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from shoal.model.config import PRESETS
from shoal.planner.compute import head_time, layer_time
from shoal.hardware.lookup import get_gpu
from shoal.planner.workload import Cluster, Workload
from shoal.planner.memory import _activation_bytes_by_kind, rank_params
from shoal.planner.search import Fixed, search

CASES = [
    ("llama3-405b", 8192, 2048, "h100", 16384),
    ("llama3-70b", 8192, 1024, "h100", 1024),
    ("llama3-8b", 8192, 512, "h100", 64),
    ("deepseek-v3", 4096, 15360, "h100", 2048),
    ("mixtral-8x7b", 4096, 512, "h100", 64),
]


def _clear_caches() -> None:
    for fn in (layer_time, head_time, rank_params, _activation_bytes_by_kind):
        fn.cache_clear()


def bench(model: str, seq: int, batch: int, gpu: str, n: int, repeats: int = 5) -> None:
    wl = Workload(PRESETS[model], seq, batch)
    cl = Cluster(get_gpu(gpu), n, get_gpu(gpu).gpus_per_node)
    cold, warm = [], []
    for _ in range(repeats):
        _clear_caches()
        t0 = time.perf_counter()
        result = search(wl, cl, Fixed())
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        search(wl, cl, Fixed())
        warm.append(time.perf_counter() - t0)
    best = result.best
    print(f"{model:13s} {n:6d} x {gpu:5s} | {result.evaluated:6d} layouts ({result.fitting} fit, "
          f"{result.dominated} dominated) | cold {statistics.median(cold):.3f} s, warm {statistics.median(warm):.3f} s | "
          f"{result.evaluated / statistics.median(cold):,.0f} layouts/s | best {best.layout.short() if best else '-'}"
          + (f", MFU {best.mfu:.1%}" if best else ""))


def calibration() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from shoal.model import analytics
    from shoal.planner.evaluate import evaluate
    from shoal.layout import Layout
    from tests.unit import test_planner_calibration as cal

    a100, h100 = get_gpu("a100"), get_gpu("h100")
    rows = []
    for h, a, l, tp, pp, n, B, pub in cal.NARAYANAN:
        wl = Workload(cal.gpt(h, a, l), 2048, B, attention="unfused")
        best = search(wl, Cluster(a100, n, 8), Fixed(tp=tp, pp=pp, zero=0, activation_checkpoint="full",
                                                     sequence_parallel=False)).best
        pred = analytics.megatron_flops_per_iteration(B, 2048, l, h, 51200) / best.time.step / n / 1e12
        rows.append((f"Narayanan T1 h={h} L={l}, {n} A100",
                     "TFLOP/s/GPU", pub, pred, best.layout.short()))
    for h, a, l, tp, pp, n, B, mb, v, full, present in cal.KORTHIKANTI_T5:
        wl = Workload(cal.gpt(h, a, l), 2048, B, attention="unfused")
        for rc, sp, pub in (("full", False, full), ("selective", True, present)):
            lay = Layout(dp_shard=1, tp=tp, pp=pp, zero=0, micro_batch=mb, pp_schedule="interleaved-1f1b" if v > 1 else "1f1b",
                         pp_virtual_stages=v, activation_checkpoint=rc, sequence_parallel=sp)
            rows.append((f"Korthikanti T5 {l}L/{h}, {n} A100, {rc}", "s/iteration", pub,
                         evaluate(wl, lay, Cluster(a100, n, 8)).time.step, lay.short()))
    for sp, rc, fwd, bwd in ((False, "none", 7.7, 11.9), (True, "none", 7.2, 11.8), (False, "full", 7.7, 19.5),
                             (False, "selective", 7.7, 13.2), (True, "selective", 7.2, 13.1)):
        f, b = cal._layer_ms(sp, rc)
        rows.append((f"Korthikanti T4 22B layer, {rc}{' +SP' if sp else ''}", "ms fwd+bwd", fwd + bwd, f + b, "tp8 mb4"))
    for n, dp, pub in ((8192, 64, 430), (16384, 128, 400)):
        best = search(Workload(PRESETS["llama3-405b"], 8192, 2048), Cluster(h100, n, 8),
                      Fixed(tp=8, pp=16, dp=dp, micro_batch=1)).best
        rows.append((f"Llama 3 405B, {n} H100", "TFLOP/s/GPU", pub, best.model_tflops_per_gpu, best.layout.short()))
    print(f"\n{'run':48s} {'metric':12s} {'published':>10s} {'predicted':>10s} {'error':>7s}  layout")
    for name, metric, pub, pred, lay in rows:
        print(f"{name:48s} {metric:12s} {pub:10.2f} {pred:10.2f} {100 * (pred / pub - 1):+6.1f}%  {lay}")


if __name__ == "__main__":
    print("full layout search, median of 5 (cold: kernel-time caches cleared first)")
    for case in CASES:
        bench(*case)
    if "--calibration" in sys.argv:
        calibration()
