"""Right vs wrong placement on the emulated two-node cluster: the same layout, other ranks in each group.

    sudo python bench/bench_placement.py [--steps 10] [--repeats 1] [--preset tiny] [--port 32100]

Builds the two-node cluster of shoal/testing/emulated_cluster.py (two network namespaces, 2 ranks
each, joined by a veth shaped to 400 Mbit/s: ~20x slower than inside a node) and runs
`shoal train --nnodes 2 --node-rank K --master ...` on both nodes for each pair below. Only
parallel.rank_order differs within a pair, so the one thing that changes is which group's traffic
crosses the slow link:

  tp2 x dp2: TP inside each node, DP across (tp-dp-pp)  vs  TP across, DP inside (dp-tp-pp)
  pp2 x dp2: PP across, DP inside (tp-dp-pp)            vs  DP across, PP inside (pp-dp-tp)

Step time is the run's steady step time (shoal.rundir.metrics.steady: the median after the 2 warm-up steps).
Both nodes share this machine's 2 cores, so the compute part is slow and the same in each pair;
the ratio is what placement costs here, not what it costs on GPUs. Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAIRS = [  # (layout, [(placement, settings)]): the first of each pair is shoal's default rank order
    ("tp2 x dp2", [("TP inside a node, DP across", ["parallel.tp=2", "parallel.rank_order=tp-dp-pp"]),
                   ("TP across nodes, DP inside", ["parallel.tp=2", "parallel.rank_order=dp-tp-pp"])]),
    ("pp2 x dp2", [("PP across nodes, DP inside", ["parallel.pp=2", "parallel.rank_order=tp-dp-pp"]),
                   ("DP across nodes, PP inside", ["parallel.pp=2", "parallel.rank_order=pp-dp-tp"])]),
]


def run_on_two_nodes(cluster, out: Path, sets: list[str], port: int) -> float:
    """Train on both nodes; the median steady step time (s) from the run's metrics.jsonl."""
    procs = []
    for k in (1, 0):
        argv = [sys.executable, "-m", "shoal", "train", "--nnodes", "2", "--node-rank", str(k), "--master",
                f"{cluster.nodes[0].addr}:{port}", "--nproc", "2", "--out", str(out), "--quiet",
                *(f"--set={s}" for s in sets)]
        log = (out.parent / f"{out.name}.node{k}.log").open("w")
        procs.append(cluster.popen(cluster.nodes[k], argv, {}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=900) for p in procs]
    if codes != [0, 0]:
        raise SystemExit(f"{out.name}: exit codes {codes}; see {out.parent}/{out.name}.node*.log")
    from shoal.rundir.metrics import read_rows, steady

    return steady(read_rows(out)).step_time_s  # what the run summary, the report and plan --validate show


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1, help="runs of each placement (alternating); the median is shown")
    p.add_argument("--preset", default="tiny", help="model preset (tiny: 4.5M parameters)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--port", type=int, default=32100, help="first rendezvous port (one per run)")
    a = p.parse_args()

    from shoal.testing.emulated_cluster import cannot_make_namespaces, emulated_cluster

    if why := cannot_make_namespaces():
        raise SystemExit(f"bench_placement: no emulated cluster: {why}")
    base = [f"model.preset={a.preset}", f"train.steps={a.steps}", f"train.seq_len={a.seq_len}",
            f"train.global_batch={a.global_batch}", "train.eval_every=0", "train.sample_tokens=0",
            "train.memory_check=false"]
    work = Path(tempfile.mkdtemp(prefix="placement-bench-"))
    times: dict[str, list[float]] = {}
    port = a.port
    with emulated_cluster() as cluster:
        for rep in range(a.repeats):
            for layout, placements in PAIRS:
                for name, sets in placements:
                    out = work / f"r{rep}-{len(times)}"
                    times.setdefault(f"{layout}|{name}", []).append(run_on_two_nodes(cluster, out, base + sets, port))
                    port += 1
                    print(f"  {layout}, {name}: {times[f'{layout}|{name}'][-1]:.3f} s/step", file=sys.stderr, flush=True)
    shutil.rmtree(work, ignore_errors=True)

    from shoal.rundir.metrics import WARMUP_STEPS

    print(f"\n2 nodes x 2 ranks, inter-node link 400 Mbit/s; model {a.preset}, seq {a.seq_len}, global batch "
          f"{a.global_batch}; median step time over steps {WARMUP_STEPS + 1}..{a.steps}"
          + (f", median of {a.repeats} runs" if a.repeats > 1 else ""))
    print(f"{'layout':10s} | {'default rank order':28s} | {'s/step':>7s} | {'other rank order':28s} | {'s/step':>7s} | "
          f"other/default")
    for layout, ((default, _), (other, _)) in PAIRS:
        d, o = (statistics.median(times[f"{layout}|{n}"]) for n in (default, other))
        print(f"{layout:10s} | {default:28s} | {d:7.3f} | {other:28s} | {o:7.3f} | {o / d:.2f}x")


if __name__ == "__main__":
    main()
