"""Gradient compression on a slow link: plain data parallelism vs each method, in wall-clock time.

    sudo python bench/bench_slow_link.py [--steps 12] [--model tiny] [--methods none,bf16,...] [--hsdp]

Builds the emulated two-node cluster (shoal/testing/emulated_cluster.py: two network namespaces
joined by a veth shaped to 400 Mbit/s), runs `torchrun --nnodes 2` with one rank per node, so all
data-parallel traffic (DDP, dp_replicate=2) crosses the shaped link, and trains the same model from
the same seed with each method of bench_compression.py's table, one after another in one process
group. Prints per method: median tokens/s over the steps after the first two, its ratio to plain,
and the gradient bytes one rank sent per step against the fp32 all-reduce's (metrics.jsonl).
--hsdp: two ranks per node instead, FSDP2 zero=2 sharded within each node (dp_shard=2) and
replicated across the link (dp_replicate=2), where int8/topk/powersgd compress the cross-node
all-reduce (parallel/compression_fsdp.py). Needs root (namespaces). The compressors' warm-ups are cut to 2 steps so the timed steps compress.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compression import METHODS  # noqa: E402  (one table of methods for both benchmarks)

REPO = Path(__file__).resolve().parents[1]
PORT = 33611  # c10d rendezvous on node a (inside the namespaces)
SHORT_WARMUPS = ["parallel.topk_warmup=2", "parallel.powersgd_warmup=2"]


def settings(a, method: str) -> list[str]:
    return [f"model.preset={a.model}", f"train.steps={a.steps}", "train.seed=0", f"train.seq_len={a.seq_len}",
            f"train.global_batch={a.global_batch}", "train.warmup_steps=2", "train.eval_every=0",
            "train.eval_batches=1", "train.sample_tokens=0", "train.memory_check=false",
            "parallel.dp_replicate=2"] + (["parallel.dp_shard=2", "parallel.zero=2"] if a.hsdp else
                                           ["parallel.dp_shard=1", "parallel.zero=0"]) + METHODS[method] + SHORT_WARMUPS


def worker(out: Path, runs: list[tuple[str, list[str]]]) -> None:
    """Inside each of the two ranks (one per node): every run in turn, in one process group."""
    from shoal.config import load_config
    from shoal.train.distributed import shutdown
    from shoal.train.trainer import train

    for name, sets in runs:
        train(load_config(None, sets), out / name, show=False, keep_process_group=True)
    shutdown()


def gradient_bytes(row: dict) -> int:
    """Plain runs carry no grad_bytes: their gradient collectives are the reduce-scatters and all-reduces
    (neither layout here has tensor parallelism; the gradient norm's all-reduce adds a few bytes)."""
    return row["comm_bytes"].get("reduce_scatter", 0) + row["comm_bytes"].get("all_reduce", 0)


def summarize(run: Path) -> dict:
    from shoal.rundir.metrics import read_rows

    rows = read_rows(run)
    timed = rows[2:-1] or rows  # past start-up; the last step also evaluates
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "sent": statistics.mean(r.get("grad_bytes", gradient_bytes(r)) for r in timed),
            "plain": statistics.mean(r.get("grad_bytes_uncompressed", gradient_bytes(r)) for r in timed),
            "step_s": statistics.median(r["step_time_s"] for r in timed)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--model", default="tiny")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--methods", default="none,bf16,int8,topk10%,topk1%,powersgd4")
    p.add_argument("--hsdp", action="store_true", help="2 ranks per node: dp_shard=2 inside, dp_replicate=2 across")
    p.add_argument("--out", default="", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--worker", nargs=2, metavar=("OUT", "RUNS_JSON"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(Path(a.worker[0]), json.loads(a.worker[1]))
    from shoal.testing.emulated_cluster import RATE, cannot_make_namespaces, emulated_cluster

    if why := cannot_make_namespaces():
        raise SystemExit(f"bench_slow_link: no emulated cluster: {why}")
    methods = ["none"] + [m for m in a.methods.split(",") if m != "none"]
    out = Path(a.out or tempfile.mkdtemp(prefix="shoal-bench-slow-link-"))
    out.mkdir(parents=True, exist_ok=True)
    runs = [(m, settings(a, m)) for m in methods]
    argv = [__file__, "--worker", str(out), json.dumps(runs)]
    with emulated_cluster() as cluster:
        logs = [(out / f"node{k}.log").open("w") for k in range(2)]
        procs = [cluster.torchrun(k, 2 if a.hsdp else 1, PORT, f"slow-link-{time.time():.0f}", argv, stdout=logs[k],
                                  stderr=subprocess.STDOUT, cwd=REPO) for k in range(2)]
        codes = [p.wait(timeout=3600) for p in procs]
    if codes != [0, 0]:
        raise SystemExit("\n".join((out / f"node{k}.log").read_text()[-3000:] for k in range(2)))
    results = {m: summarize(out / m) for m in methods}
    base = results["none"]
    layout = "2 ranks (HSDP: zero=2 within, replicas across)" if a.hsdp else "1 rank (DDP)"
    print(f"{a.model} model, 2 nodes x {layout} over a {RATE} link, {a.steps} steps of "
          f"{a.global_batch}x{a.seq_len} tokens; median over steps 3..{a.steps - 1}")
    print(f"{'method':<11}{'tok/s':>9}{'vs plain':>10}{'step s':>9}{'bytes/step':>13}{'fewer':>8}")
    for m in methods:
        r = results[m]
        print(f"{m:<11}{r['tokens_per_s']:>9,.0f}{r['tokens_per_s'] / base['tokens_per_s']:>9.2f}x{r['step_s']:>9.3f}"
              f"{r['sent']:>13,.0f}{r['plain'] / r['sent']:>7.1f}x")
    print(f"runs: {out}")


if __name__ == "__main__":
    main()
