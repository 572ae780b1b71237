"""Wall clock over a slow link: plain data parallelism vs DiLoCo, on the emulated two-node cluster.

    python bench/bench_diloco_slow_link.py [--steps 200] [--methods diloco50,...]   (root: namespaces)

One rank per "node" (dp_replicate=2: one replica group per node), the nodes joined by a veth shaped
to 400 Mbit/s (shoal/testing/emulated_cluster.py, docs/cluster.md). Each method trains
bench_compression.py's model with the same seed and tokens; prints tokens/s over the steady steps
(outer steps included) and its ratio to plain DDP, beside the bytes ratio (bench_diloco.py
measures the loss gap).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_compression as bc  # noqa: E402
import bench_diloco  # noqa: E402,F401  (registers the DiLoCo methods with bench_compression)

PORT = 32611  # this bench's rendezvous port


def tokens_per_s(out: Path, name: str) -> tuple[float, float]:
    from shoal.rundir.metrics import read_rows

    rows = read_rows(out / name)
    steady = rows[10:-1]  # past warm-up; the mean step time counts DiLoCo's outer steps in it
    tokens = rows[0]["tokens"]  # per step
    return (tokens / statistics.mean(r["step_time_s"] for r in steady),
            statistics.mean(sum(r["comm_bytes"].values()) for r in rows))


def main() -> None:
    from shoal.testing.emulated_cluster import cannot_make_namespaces, emulated_cluster

    a = bc.arguments(__doc__, {"diloco50-m0.5": None, "stream50x5-m0.5-int8": None}, steps=200).parse_args()
    why = cannot_make_namespaces()
    if why:
        raise SystemExit(f"no emulated cluster: {why}")
    methods = ["none"] + [m for m in a.methods.split(",") if m != "none"]
    out = Path(a.out or tempfile.mkdtemp(prefix="shoal-bench-diloco-link-"))
    out.mkdir(parents=True, exist_ok=True)
    a.nproc = 2  # bc.settings: dp_replicate = 2, one rank on each node
    runs = [(f"{m}-seed{s}", bc.settings(a, s, m)) for s in a.seeds for m in methods]
    argv = [bc.__file__, "--worker", str(out), json.dumps(runs)]
    with emulated_cluster() as cluster:
        procs = [cluster.torchrun(k, 1, PORT, f"diloco-{time.time():.0f}", argv, cwd=bc.REPO,
                                  stdout=(out / f"node{k}.log").open("w"), stderr=subprocess.STDOUT) for k in (0, 1)]
        codes = [p.wait(timeout=3600) for p in procs]
    if codes != [0, 0]:
        raise SystemExit("\n".join((out / f"node{k}.log").read_text()[-3000:] for k in (0, 1)))
    print(f"{a.model} model, 2 nodes x 1 rank over a 400 Mbit/s veth, {a.steps} steps, seeds {a.seeds}")
    print(f"{'method':<22}{'tok/s':>9}{'vs plain':>10}{'bytes/step':>12}{'fewer':>8}")
    base = {s: tokens_per_s(out, f"none-seed{s}") for s in a.seeds}
    for m in methods:
        got = [tokens_per_s(out, f"{m}-seed{s}") for s in a.seeds]
        speed = statistics.mean(g[0] / base[s][0] for g, s in zip(got, a.seeds))
        fewer = statistics.mean(base[s][1] / g[1] for g, s in zip(got, a.seeds))
        print(f"{m:<22}{statistics.mean(g[0] for g in got):>9,.0f}{speed:>9.2f}x"
              f"{statistics.mean(g[1] for g in got):>12,.0f}{fewer:>7.1f}x")
    print(f"runs: {out}")


if __name__ == "__main__":
    main()
