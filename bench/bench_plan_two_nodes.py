"""Predicted vs measured on the emulated two-node cluster (2 nodes x 2 ranks, a 400 Mbit/s link).

    sudo PYTHONPATH=. .venv/bin/python bench/bench_plan_two_nodes.py [--steps 6] [--out /tmp/shoal-two-nodes]

Builds the cluster (shoal/testing/emulated_cluster.py: two network namespaces joined by a veth
shaped with tc; needs root), measures its link between nodes with gloo (the numbers behind
recipes/hardware/emulated-two-node.toml), then trains the `tiny` preset (seq 256, global batch 16,
fp32) in three layouts with `shoal train --nnodes 2 --node-rank K --master ...` in each namespace,
one after another, holding `/tmp/shoal-cpu.lock` once for all of them (a shared machine). For each it prints the
planner's step time and peak memory for that hardware file (`shoal plan --validate RUN --hw-file
...`) beside the median measured step, and their ratios. Prints, never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_lock import load_average, machine_lock

REPO = Path(__file__).resolve().parents[1]
HW_FILE = REPO / "recipes" / "hardware" / "emulated-two-node.toml"
RECIPE = REPO / "recipes" / "tiny.toml"
PORT = 34110  # this benchmark's rendezvous port (+1 per layout)
LAYOUTS = [
    # (name, --set overrides): what crosses the 400 Mbit/s link
    ("dp4-z1", ["parallel.zero=1", "train.micro_batch=4"]),  # every gradient, reduced over 4 ranks
    ("tp2-dp2", ["parallel.tp=2", "parallel.zero=0", "train.micro_batch=8"]),  # TP inside, the DP all-reduce across
    ("tp2-pp2", ["parallel.tp=2", "parallel.pp=2", "parallel.pp_schedule=1f1b", "train.micro_batch=4"]),  # stage sends
]


def probe_worker(rank: int, init_file: str, out_file: str) -> None:
    """One rank of the link probe: gloo all_reduce of 4 bytes (latency) and 16 MiB (bus bandwidth)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    small, big = torch.zeros(1), torch.zeros(4 * 2**20)
    for _ in range(5):
        dist.all_reduce(small)
    t0 = time.perf_counter()
    for _ in range(30):
        dist.all_reduce(small)
    latency = (time.perf_counter() - t0) / 30 / 2  # a 2-rank ring all_reduce is 2 steps
    dist.all_reduce(big)
    t0 = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(big)
    busbw = big.numel() * 4 / ((time.perf_counter() - t0) / 3)  # nccl-tests: algbw * 2(n-1)/n = algbw at n=2
    if rank == 0:
        Path(out_file).write_text(json.dumps({"latency_s": latency, "busbw": busbw}))
    dist.destroy_process_group()


def probe_link(cluster) -> dict:
    """gloo between one rank on each node: what the hardware file's inter-node tier stands for."""
    with tempfile.TemporaryDirectory(prefix="shoal-probe-") as tmp:
        init, out = f"{tmp}/init", f"{tmp}/out.json"
        procs = [cluster.popen(node, [sys.executable, __file__, "--probe-rank", str(rank), init, out],
                               {"GLOO_SOCKET_IFNAME": node.ifname, "PYTHONPATH": str(REPO)})
                 for rank, node in enumerate(cluster.nodes)]
        if [p.wait(timeout=120) for p in procs] != [0, 0]:
            return {}
        return json.loads(Path(out).read_text())


def train(cluster, name: str, sets: list[str], port: int, steps: int, out: Path) -> str:
    """`shoal train --nnodes 2` on both nodes; '' when it trained, else the tail of its logs."""
    head = f"{cluster.nodes[0].addr}:{port}"
    common = [f"train.steps={steps}", "train.eval_every=0", "train.sample_tokens=0"]
    procs = []
    for k in (1, 0):  # node 1 first: it waits for node 0's rendezvous
        argv = [sys.executable, "-m", "shoal", "train", str(RECIPE), "--nnodes", "2", "--node-rank", str(k),
                "--master", head, "--nproc", "2", "--out", str(out), "--quiet", *[f"--set={s}" for s in sets + common]]
        log = (out.parent / f"{name}-node{k}.log").open("w")
        procs.append(cluster.popen(cluster.nodes[k], argv, {"PYTHONPATH": str(REPO)}, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=REPO))
    codes = [p.wait(timeout=600) for p in procs]
    if codes == [0, 0]:
        return ""
    return " | ".join((out.parent / f"{name}-node{k}.log").read_text().strip().splitlines()[-1:][0] for k in (1, 0))


def validate(run: Path, *hw: str) -> dict:
    cmd = [sys.executable, "-m", "shoal", "plan", "--validate", str(run), "--gpus-per-node", "2", "--json", *hw]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    if proc.returncode:
        raise SystemExit(f"validate {run}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)["validate"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="/tmp/shoal-two-nodes")
    ap.add_argument("--probe-rank", nargs=3, metavar=("RANK", "INIT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe_rank:
        probe_worker(int(args.probe_rank[0]), args.probe_rank[1], args.probe_rank[2])
        return 0
    from shoal.testing.emulated_cluster import cannot_make_namespaces, emulated_cluster

    why = cannot_make_namespaces()
    if why:
        print(f"no emulated cluster: {why}")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average {load_average()}")
    trained = []
    # One hold of the machine's lock for the probe and the three runs (~4 minutes): on a shared
    # machine, taking it once per run queues the benchmark behind everyone four times.
    with emulated_cluster() as cluster, machine_lock():
        print(f"load average when the lock was taken {load_average()}")
        link = probe_link(cluster)
        if link:
            print(f"link between nodes (gloo all_reduce, 1 rank per node): latency {link['latency_s'] * 1e6:.0f} us "
                  f"per step, bus bandwidth {link['busbw'] / 1e6:.1f} MB/s")
        for i, (name, sets) in enumerate(LAYOUTS):
            run = out / name
            t0 = time.time()
            failed = train(cluster, name, sets, PORT + i, args.steps, run)
            print(f"{name}: {'failed: ' + failed if failed else 'trained'} in {time.time() - t0:.0f} s")
            if not failed:
                trained.append((name, run))
    print(f"\n{'layout':10} {'':28} {'pred (s)':>9} {'meas (s)':>9} {'ratio':>6} | {'pred GiB':>8} {'meas GiB':>8} "
          f"{'ratio':>6} | stored (local) ratio")
    for name, run in trained:
        c = validate(run, "--hw-file", str(HW_FILE))
        stored = validate(run)
        print(f"{name:10} {c['layout']:28} {c['predicted_step_s']:9.3f} {c['measured_step_s']:9.3f} {c['step_ratio']:6.2f} | "
              f"{c['predicted_peak_gib']:8.2f} {c['measured_peak_gib']:8.2f} {c['memory_ratio']:6.2f} | "
              f"{stored['step_ratio']:.2f}")
    print(f"load average {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
