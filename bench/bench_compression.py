"""Gradient compression side by side: same model, seed and tokens per method, on DDP over loopback.

    python bench/bench_compression.py [--nproc 2] [--steps 300] [--seeds 0 1] [--methods none,bf16,...]

For each method and seed, trains `model.preset` (debug: ~0.3M parameters) from the same seed on
the same batches, then prints, paired by seed against grad_compression=none: the final eval-loss
gap, the gradient bytes each rank sent per step (counted on the wire, by dtype, see metrics.jsonl)
and their ratio to the uncompressed fp32 all-reduce, and tokens/s. Loopback has no slow link, so
tokens/s here shows the compressors' compute cost, not their wall-clock gain on a slow network.
All runs of a seed share one launch of N workers (forming a process group costs seconds). Runs
already finished in --out are read, not run again: long comparisons can be split into several
invocations (e.g. one seed or a few methods each) and the last one prints the whole table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = {  # name -> settings
    "none": [],
    "bf16": ["parallel.grad_compression=bf16"],
    "int8": ["parallel.grad_compression=int8"],
    "topk10%": ["parallel.grad_compression=topk", "parallel.topk_density=0.1", "parallel.topk_warmup=30"],
    "topk10%w0": ["parallel.grad_compression=topk", "parallel.topk_density=0.1", "parallel.topk_warmup=0"],
    "topk1%": ["parallel.grad_compression=topk", "parallel.topk_density=0.01", "parallel.topk_warmup=30"],
    "powersgd4": ["parallel.grad_compression=powersgd", "parallel.powersgd_rank=4", "parallel.powersgd_warmup=10"],
    "powersgd1": ["parallel.grad_compression=powersgd", "parallel.powersgd_rank=1", "parallel.powersgd_warmup=10"],
}


def settings(a, seed: int, method: str) -> list[str]:
    return [f"model.preset={a.model}", f"train.steps={a.steps}", f"train.seed={seed}", f"train.seq_len={a.seq_len}",
            f"train.global_batch={a.global_batch}", f"train.lr={a.lr}", "train.warmup_steps=20", "train.eval_every=0",
            f"train.eval_batches={a.eval_batches}", "train.sample_tokens=0", "train.memory_check=false",
            f"parallel.dp_replicate={a.nproc}", "parallel.dp_shard=1", "parallel.zero=0"] + METHODS[method]


def worker(out: Path, runs: list[tuple[str, list[str]]]) -> None:
    """Inside each of the N workers: every (name, settings) run in turn, in one process group."""
    from shoal.config import load_config
    from shoal.train.distributed import shutdown
    from shoal.train.trainer import train

    for name, sets in runs:
        train(load_config(None, sets), out / name, show=False, keep_process_group=True)
    shutdown()


def summarize(out: Path, name: str) -> dict:
    from shoal.rundir.metrics import read_rows

    rows = read_rows(out / name)
    steady = rows[10:-1] or rows  # past the warm-up steps; the last one also evaluates
    sent = statistics.mean(r.get("grad_bytes", sum(r["comm_bytes"].values())) for r in steady)
    plain = statistics.mean(r.get("grad_bytes_uncompressed", sum(r["comm_bytes"].values())) for r in steady)
    dtypes = sorted({k for r in steady for k in r["comm_bytes_by_dtype"]})
    return {"eval_loss": rows[-1]["eval_loss"], "sent": sent, "plain": plain, "dtypes": dtypes,
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady)}


def arguments(doc: str, methods, steps: int) -> argparse.ArgumentParser:
    """The settings every method runs with (bench_diloco.py takes the same); `methods`: the names
    --methods runs by default."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--methods", default=",".join(methods))
    p.add_argument("--model", default="debug")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--out", default="", help="keep the runs here (default: a temporary directory)")
    return p


def run_all(a, out: Path, methods: list[str], summarize) -> dict[tuple[str, int], dict]:
    """Train each method for each seed on a.nproc local ranks (this file's --worker runs them; the
    settings travel in argv), skipping runs an earlier invocation finished; {(method, seed): summary}."""
    results: dict[tuple[str, int], dict] = {}
    for seed in a.seeds:
        runs = [(f"{m}-seed{seed}", settings(a, seed, m)) for m in methods
                if not (out / f"{m}-seed{seed}" / "model").exists()]
        code = (f"import sys; from shoal.launch.local import launch; "
                f"sys.exit(launch({[__file__, '--worker', str(out), json.dumps(runs)]!r}, {a.nproc}))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO) if runs else None
        if r is not None and r.returncode:
            raise SystemExit(r.stdout[-2000:] + r.stderr[-3000:])
        for m in methods:
            results[m, seed] = summarize(out, f"{m}-seed{seed}")
    return results


def main() -> None:
    p = arguments(__doc__, METHODS, steps=300)
    p.add_argument("--worker", nargs=2, metavar=("OUT", "RUNS_JSON"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(Path(a.worker[0]), json.loads(a.worker[1]))
    methods = ["none"] + [m for m in a.methods.split(",") if m != "none"]
    out = Path(a.out or tempfile.mkdtemp(prefix="shoal-bench-compression-"))
    results = run_all(a, out, methods, summarize)
    tokens = a.steps * a.global_batch * a.seq_len
    print(f"{a.model} model, {a.nproc} ranks (DDP, gloo loopback), {a.steps} steps = {tokens:,} tokens, "
          f"seeds {a.seeds}; gap paired by seed; bytes: gradient bytes one rank sends per step")
    print(f"{'method':<11}{'eval loss':>10}{'gap':>9}{'bytes/step':>12}{'fp32 AR':>10}{'fewer':>8}{'tok/s':>9}  on the wire")
    for m in methods:
        rs = [results[m, s] for s in a.seeds]
        gaps = [results[m, s]["eval_loss"] / results["none", s]["eval_loss"] - 1 for s in a.seeds]
        sent, plain = statistics.mean(r["sent"] for r in rs), statistics.mean(r["plain"] for r in rs)
        print(f"{m:<11}{statistics.mean(r['eval_loss'] for r in rs):>10.4f}{statistics.mean(gaps):>+9.2%}"
              f"{sent:>12,.0f}{plain:>10,.0f}{plain / sent:>7.1f}x{statistics.mean(r['tokens_per_s'] for r in rs):>9,.0f}"
              f"  {', '.join(rs[0]['dtypes'])}")
    print(f"runs: {out}")


if __name__ == "__main__":
    main()
