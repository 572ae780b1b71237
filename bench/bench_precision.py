"""fp16 and fp8 against bf16, and what offload costs. Prints, never asserts.

    .venv/bin/python bench/bench_precision.py                      # 200 steps of `tiny`, then offload (~15 min)
    .venv/bin/python bench/bench_precision.py --steps 50 --skip-offload
    .venv/bin/python bench/bench_precision.py --skip-curves --offload-steps 20

Loss curves: the same run (model, data, seed, schedule) in bf16, fp16 (dynamic loss scaling) and
fp8 (torchao float8, tensorwise and rowwise; emulated off CUDA), one process each, and in fp32: how
far fp32 lands from bf16 is the noise floor, what a different rounding alone does to the same run
(the trajectories part after a few steps and do not meet again). Printed: the
training loss every --every steps, then at the end the mean of the last 10 training losses and the
held-out loss, each with its gap to bf16 as a ratio ((x - bf16) / bf16; the issue's goal: within
1%), fp16's skipped steps and final loss scale, and seconds per step.

Offload: the same fp32 run on --nproc ranks (dp_shard, zero=3) with parallel.offload=none, params,
and params + train.activation_offload, through `shoal train`: rank 0's peak memory (device memory
on CUDA; resident set size on CPU, where the host *is* the device, so offload cannot save any) and
the median step time, with the ratios to offload=none, and whether the losses match.

Small steps (4 x 64 tokens) by default because fp16 is slow on a CPU: without AVX512-FP16 or AMX-FP16
a float16 matmul takes ~100x a bf16 one (~2 s per step here against 0.1 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPES = {  # name -> --set overrides beyond the common ones
    "bf16": ["train.precision=bf16"],
    "fp32": ["train.precision=fp32"],  # the noise floor: how far another rounding alone moves the same run
    "fp16": ["train.precision=fp16"],
    "fp8-tensorwise": ["train.precision=fp8", "train.fp8_recipe=tensorwise"],
    "fp8-rowwise": ["train.precision=fp8", "train.fp8_recipe=rowwise"],
}
OFFLOADS = {"none": [], "params": ["parallel.offload=params"],
            "params+activations": ["parallel.offload=params", "train.activation_offload=true"]}


def common(args, steps: int) -> list[str]:
    return [f"model.preset={args.preset}", f"train.steps={steps}", f"train.global_batch={args.batch}",
            f"train.seq_len={args.seq_len}", "train.eval_every=0", f"train.eval_batches={args.eval_batches}",
            "train.sample_tokens=0",
            "checkpoint.every=0", f"train.warmup_steps={min(20, steps // 10)}"]


def curves(args, root: Path) -> None:
    import torch

    from shoal.config import load_config
    from shoal.rundir.metrics import read_rows
    from shoal.train.trainer import train

    torch.set_num_threads(args.threads)
    runs = {}
    for name, extra in RECIPES.items():
        if name not in args.recipes:
            continue
        started = time.perf_counter()
        summary = train(load_config(None, common(args, args.steps) + extra), root / name, show=False)
        rows = read_rows(root / name)
        runs[name] = dict(losses=[r["loss"] for r in rows], eval=summary["eval loss"], last=rows[-1],
                          seconds=(time.perf_counter() - started) / args.steps)
        print(f"  {name}: {runs[name]['seconds']:.2f} s/step", flush=True)
    names = list(runs)
    print(f"\ntraining loss ({args.preset}, {args.batch}x{args.seq_len} tokens/step, {args.steps} steps)")
    print("step   " + "".join(f"{n:>16}" for n in names))
    for i in list(range(args.every - 1, args.steps, args.every)) or [args.steps - 1]:
        print(f"{i + 1:<7}" + "".join(f"{runs[n]['losses'][i]:>16.4f}" for n in names))
    ref = runs.get("bf16")
    print("\nat the end" + " " * 9 + "last-10 train loss   gap vs bf16    eval loss   gap vs bf16   s/step   extra")
    for n in names:
        r = runs[n]
        tail = statistics.mean(r["losses"][-10:])
        gap = f"{(tail - statistics.mean(ref['losses'][-10:])) / statistics.mean(ref['losses'][-10:]):+.2%}" if ref else "-"
        egap = f"{(r['eval'] - ref['eval']) / ref['eval']:+.2%}" if ref else "-"
        extra = (f"skipped {r['last']['skipped_steps']}, scale {r['last']['loss_scale']:g}"
                 if "loss_scale" in r["last"] else "")
        print(f"{n:<19}{tail:>18.4f}{gap:>14}{r['eval']:>13.4f}{egap:>14}{r['seconds']:>9.2f}   {extra}")


def offload(args, root: Path) -> None:
    from shoal.rundir.metrics import read_rows

    results = {}
    for name, extra in OFFLOADS.items():
        out = root / f"offload-{name}"
        sets = common(args, args.offload_steps) + [f"parallel.dp_shard={args.nproc}", "parallel.zero=3"] + extra
        cmd = [sys.executable, "-m", "shoal", "train", "--nproc", str(args.nproc), "--out", str(out), "--quiet",
               *[a for s in sets for a in ("--set", s)]]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if r.returncode:
            print(f"  {name}: failed ({r.returncode})\n{r.stderr[-2000:]}")
            return
        rows = read_rows(out)
        steady = rows[len(rows) // 4:]  # without the first steps (allocation, warm-up)
        results[name] = dict(peak=max(row["peak_mem_bytes"] for row in rows),
                             step=statistics.median(row["step_time_s"] for row in steady),
                             losses=[row["loss"] for row in rows])
    base = results["none"]
    print(f"\noffload ({args.preset}, {args.nproc} ranks dp_shard zero=3, fp32, {args.offload_steps} steps; rank 0)")
    print(f"{'offload':<20}{'peak MiB':>10}{'x none':>8}{'step s':>9}{'x none':>8}   losses vs none")
    for name, r in results.items():
        diff = max(abs(a - b) for a, b in zip(r["losses"], base["losses"]))
        print(f"{name:<20}{r['peak'] / 2**20:>10.0f}{r['peak'] / base['peak']:>8.2f}{r['step']:>9.3f}"
              f"{r['step'] / base['step']:>8.2f}   max |diff| {diff:.1e}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--eval-batches", type=int, default=16, help="held-out batches (of --batch sequences) at the end")
    p.add_argument("--every", type=int, default=50, help="print the training loss every this many steps")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {', '.join(RECIPES)}")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--offload-steps", type=int, default=20)
    p.add_argument("--skip-curves", action="store_true")
    p.add_argument("--skip-offload", action="store_true")
    p.add_argument("--dir", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    args = p.parse_args()
    args.recipes = args.recipes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or Path(tmp)
        if not args.skip_curves:
            curves(args, root)
        if not args.skip_offload:
            offload(args, root)


if __name__ == "__main__":
    main()
