"""The pictures of docs/guide.md, drawn by shoal's own code: `make docs` runs this module.

    python -m shoal.report.guide_figures docs/img        # draw every picture (SVG) + figures.json
    python -m shoal.report.guide_figures --check docs/img  # exit 1 if a committed picture is stale

Each picture comes with the numbers it draws; figures.json holds them all. The check recomputes
the numbers (no drawing, so it is fast and does not depend on the matplotlib version) and compares
them with the committed figures.json: a change to the planner, the schedules or the rank grid that
changes a picture fails the check until `make docs` is run again.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from pathlib import Path

GiB = 2**30


def _state_parts(psi: float, dp: int, zero: int) -> dict:
    from shoal.planner.memory import model_state_bytes

    w, g, o = model_state_bytes(psi, dp, zero, "bf16")
    return {"params": w / GiB, "grads": g / GiB, "optimizer": o / GiB}


def bytes_per_param_data() -> dict:
    from shoal.model.analytics import param_counts
    from shoal.model.config import get_preset

    psi = param_counts(get_preset("llama3-8b")).total
    return {"model": "llama3-8b", "params": psi, "gib": _state_parts(psi, 1, 0), "h100_gib": 80e9 / GiB}


def zero_data() -> dict:
    d = bytes_per_param_data()
    return {"model": d["model"], "dp": 8, "stages": {z: _state_parts(d["params"], 8, z) for z in range(4)},
            "h100_gib": d["h100_gib"]}


PIPELINES = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 2))


def pipeline_data(schedule: str, virtual: int, pp: int = 4, m: int = 8) -> dict:
    from shoal.report.schedule import simulate

    tl = simulate(schedule, pp, m, virtual)
    return {"schedule": schedule, "pp": pp, "microbatches": m, "virtual": virtual,
            "bubble": round(tl.bubble_fraction, 6),
            "blocks": [[b.rank, b.stage, b.microbatch, b.kind, b.start, b.end] for b in tl.blocks]}


GRIDS = {
    # name: (dp_replicate, dp_shard, tp, pp, ep, per_node)
    "grid_tp": (1, 2, 4, 1, 1, 8),
    "grid_ep": (1, 8, 1, 1, 4, 8),
    "grid_cluster": (2, 2, 4, 2, 1, 8),
}


def _dims(spec):
    from shoal.parallel.mesh import ParallelDims

    dr, ds, tp, pp, ep, _ = spec
    return ParallelDims(dr, ds, tp, pp, ep, dr * ds * tp * pp)


def grid_data(name: str) -> dict:
    from shoal.report.rank_grid import grid_geometry

    geo = grid_geometry(_dims(GRIDS[name]), GRIDS[name][5])
    return {"groups": geo["groups"], "crossing": geo["crossing"], "nodes": geo["nodes"]}


def _scaling_points():
    from shoal.model.config import get_preset
    from shoal import hardware
    from shoal.planner import scaling
    from shoal.planner.workload import Cluster, Workload
    from shoal.planner.search import Fixed

    workload = Workload(get_preset("llama3-8b"), 8192, 512)
    cluster = Cluster(hardware.get_gpu("h100"), 8, 8)
    return scaling.sweep(workload, cluster, scaling.gpu_counts(8, 2048), Fixed(), base_gpus=64)


def scaling_data(points=None) -> dict:
    from shoal.planner.scaling import knee

    points = points or _scaling_points()
    out = {}
    for mode in ("fixed-global-batch", "fixed-per-gpu-batch"):
        mine = [p for p in points if p.mode == mode]
        out[mode] = {"tokens_per_s": {p.n_gpus: round(p.tokens_per_s, 1) for p in mine},
                     "layouts": {p.n_gpus: p.best.layout.short() if p.best else None for p in mine},
                     "knee": list(knee(mine))}
    return out


def all_data() -> dict:
    """Every picture's numbers, in the form they have once written (int keys become strings)."""
    return json.loads(_all_data_json())


@lru_cache(maxsize=1)
def _all_data_json() -> str:  # computed once per process: the scaling sweep takes seconds
    data = {"bytes_per_param": bytes_per_param_data(), "zero_stages": zero_data(), "scaling": scaling_data()}
    data.update({f"pipeline_{s.replace('-', '_')}": pipeline_data(s, v) for s, v in PIPELINES})
    data.update({name: grid_data(name) for name in GRIDS})
    return json.dumps(data)


def _bars(stem: Path, rows: dict[str, dict], title: str, line: float | None, formats) -> list[Path]:
    from shoal.report.draw import pyplot, save
    from shoal.report.plan_figures import COLORS

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.6))
    labels = list(rows)[::-1]
    left = [0.0] * len(labels)
    for part in ("params", "grads", "optimizer"):
        vals = [rows[k][part] for k in labels]
        ax.barh(labels, vals, left=left, color=COLORS[part], label={"params": "weights (bf16, 2 B)", "grads":
                "gradients (bf16, 2 B)", "optimizer": "fp32 master + Adam m, v (12 B)"}[part])
        left = [a + b for a, b in zip(left, vals)]
    if line:
        ax.axvline(line, color="black", linestyle="--", linewidth=1)
        ax.text(line, len(labels) - 0.5, " one H100 (80 GB)", fontsize=8, va="bottom")
    ax.set_xlabel("GiB per GPU for weights, gradients and optimizer state (no activations yet)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    return save(fig, stem, formats)


def draw(out: Path, formats=("svg",)) -> list[Path]:
    from shoal.report.rank_grid import rank_grid_figure
    from shoal.report.plan_figures import scaling_figure
    from shoal.report.schedule import simulate
    from shoal.report.schedule_figure import schedule_figure

    out.mkdir(parents=True, exist_ok=True)
    data = all_data()
    paths = []
    b = data["bytes_per_param"]
    paths += _bars(out / "bytes_per_param", {"llama3-8b, one GPU": b["gib"]},
                   f"16 bytes per parameter: {b['params'] / 1e9:.1f}B parameters need "
                   f"{sum(b['gib'].values()):.0f} GiB before a single activation", b["h100_gib"], formats)
    z = data["zero_stages"]
    paths += _bars(out / "zero_stages", {f"ZeRO-{k}" if k != "0" else "plain DP (ZeRO-0)": v for k, v in z["stages"].items()},
                   f"{z['model']} on {z['dp']} data-parallel GPUs: what each ZeRO stage shards", z["h100_gib"], formats)
    for s, v in PIPELINES:
        paths += schedule_figure(simulate(s, 4, 8, v), out / f"pipeline_{s.replace('-', '_')}", formats=formats)
    titles = {"grid_tp": "tp 4 x dp 2 on one node of 8", "grid_ep": "8 ranks: dp 8, ep 4 inside it (MoE)",
              "grid_cluster": "pp 2 x dp 2x2 x tp 4 on 4 nodes of 8"}
    for name, spec in GRIDS.items():
        paths += rank_grid_figure(_dims(spec), spec[5], out / name, title=titles[name], formats=formats)
    paths += scaling_figure(_scaling_points(), out / "scaling", formats=formats)
    (out / "figures.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return paths + [out / "figures.json"]


def stale(out: Path) -> list[str]:
    """Names of the pictures whose committed numbers differ from what the code draws now."""
    path = out / "figures.json"
    if not path.is_file():
        return ["figures.json (missing)"]
    committed, now = json.loads(path.read_text()), all_data()
    names = sorted(set(committed) | set(now))
    return [n for n in names if committed.get(n) != now.get(n) or not any(out.glob(f"{n}.svg"))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shoal.report.guide_figures")
    p.add_argument("out", type=Path, help="folder of the guide's pictures (docs/img)")
    p.add_argument("--check", action="store_true", help="exit 1 if a committed picture is stale")
    args = p.parse_args(argv)
    if args.check:
        bad = stale(args.out)
        if bad:
            print(f"stale guide pictures: {', '.join(bad)}; run `make docs` and commit docs/img", file=sys.stderr)
            return 1
        return 0
    for path in draw(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
