"""Pictures of one training run from its metrics.jsonl (see shoal/report/run_dir.py)."""

from __future__ import annotations

import statistics
from pathlib import Path

from shoal.planner.render import MEMORY_PARTS
from shoal.report.draw import pyplot, save
from shoal.report.plan_figures import COLORS

GiB = 2**30
COMM_COLORS = {"all_reduce": "#4c72b0", "all_gather": "#55a868", "reduce_scatter": "#8172b2",
               "all_to_all": "#dd8452", "broadcast": "#c44e52", "send": "#937860", "recv": "#da8bc3"}


def _marks(ax, run, label: bool) -> None:
    """Evaluation, checkpoint and restart steps as vertical lines on a step axis."""
    evals = [r["step"] for r in run.rows if "eval_loss" in r]
    for steps, color, style, name in ((evals, "#8172b2", ":", "evaluation"), (run.checkpoints, "#55a868", "--", "checkpoint"),
                                      (run.restarts, "#c44e52", "-", "restart")):
        for i, s in enumerate(steps):
            ax.axvline(s, color=color, linestyle=style, linewidth=1.2 if name == "restart" else 0.8,
                       label=name if label and i == 0 else None)


def _attempts(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) with a gap (NaN) where a restart goes back to an earlier step, so each
    attempt is its own line instead of a line drawn back across the redone steps."""
    xs, ys = [], []
    for prev, row in zip([None, *rows], rows):
        if prev is not None and row["step"] <= prev["step"]:
            xs.append(float("nan"))
            ys.append(float("nan"))
        xs.append(row["step"])
        ys.append(row.get(key, 0.0))
    return xs, ys


def training_figure(run, stem: Path) -> list[Path]:
    """Loss and eval loss; tokens/s and MFU; over steps, with evaluations, checkpoints and restarts marked."""
    plt = pyplot()
    fig, (ax_loss, ax_tps) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax_loss.plot(*_attempts(run.rows, "loss"), ".-", ms=3, color="#4c72b0", label="train loss")
    ev = [r for r in run.rows if "eval_loss" in r]
    if ev:
        ax_loss.plot([r["step"] for r in ev], [r["eval_loss"] for r in ev], "s", color="#dd8452", label="eval loss")
    _marks(ax_loss, run, label=True)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (nats/token)")
    ax_loss.set_title("loss")
    ax_loss.legend(fontsize=7)
    ax_tps.plot(*_attempts(run.rows, "tokens_per_s"), ".-", ms=3, color="#55a868", label="tokens/s")
    ax_tps.set_xlabel("step")
    ax_tps.set_ylabel("tokens/s (whole job)")
    ax_mfu = ax_tps.twinx()
    steps, mfu = _attempts(run.rows, "mfu")
    ax_mfu.plot(steps, [100 * v for v in mfu], ".--", ms=3, color="#c44e52", label="MFU")
    ax_mfu.set_ylabel("MFU (% of the job's peak, model FLOPs)")
    _marks(ax_tps, run, label=False)
    ax_tps.set_title("throughput")
    h1, l1 = ax_tps.get_legend_handles_labels()
    h2, l2 = ax_mfu.get_legend_handles_labels()
    ax_tps.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower right")
    for ax in (ax_loss, ax_tps):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, stem)


def memory_figure(measured: dict, predicted, stem: Path) -> list[Path]:
    """Stacked bars: the planner's breakdown of the busiest rank beside rank 0's measurement."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 2.8))
    left = 0.0
    for part in MEMORY_PARTS:
        v = getattr(predicted, part) / GiB
        ax.barh("predicted\n(planner)", v, left=left, color=COLORS[part], label=part)
        left += v
    state, peak = measured["model_state_bytes"] / GiB, measured["peak_mem_bytes"] / GiB
    ax.barh("measured\n(rank 0)", state, color="#4c72b0", hatch="//", edgecolor="white",
            label="params+grads+optimizer (measured)")
    ax.barh("measured\n(rank 0)", max(0.0, peak - state), left=state, color="#bbbbbb",
            label=f"rest of the peak ({measured['what']})")
    ax.set_xlabel("GiB per rank (2^30 bytes)")
    ax.set_title("memory per rank")
    ax.legend(ncol=3, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
    return save(fig, stem)


def comm_figure(run, stem: Path) -> list[Path]:
    """Bytes each step sent, by collective (stacked)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    kinds = sorted({k for r in run.rows for k in r.get("comm_bytes", {})})
    steps = [r["step"] for r in run.rows]
    bottom = [0.0] * len(steps)
    for kind in kinds:
        vals = [r.get("comm_bytes", {}).get(kind, 0) / 2**20 for r in run.rows]
        ax.bar(steps, vals, bottom=bottom, color=COMM_COLORS.get(kind), label=kind, width=0.8)
        bottom = [a + b for a, b in zip(bottom, vals)]
    if not kinds:
        ax.text(0.5, 0.5, "no collectives (one rank)", transform=ax.transAxes, ha="center")
    ax.set_xlabel("step")
    ax.set_ylabel("MiB sent per step (rank 0)")
    ax.set_title("communication by collective")
    if kinds:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    return save(fig, stem)


def straggler_figure(run, stem: Path, world: int | None = None) -> list[Path]:
    """Slowest rank's compute time over the median per step, and how often each rank was the slowest."""
    plt = pyplot()
    rows = [r for r in run.rows if "compute_time_spread" in r]
    fig, (ax, ax_r) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [2, 1]})
    ax.plot([r["step"] for r in rows], [r["compute_time_spread"] for r in rows], ".-", color="#c44e52")
    ax.axhline(1 / 0.7, color="gray", linestyle=":", linewidth=1, label="straggler threshold (0.7x median speed)")
    ax.set_xlabel("step")
    ax.set_ylabel("slowest / median compute time")
    ax.set_title("step-time spread across ranks")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    world = world or max([r["slowest_rank"] for r in rows] + [0]) + 1
    counts = [sum(r["slowest_rank"] == k for r in rows) for k in range(world)]
    ax_r.bar([str(k) for k in range(world)], counts, color="#8c8c8c")
    ax_r.set_xlabel("rank")
    ax_r.set_ylabel("steps as the slowest rank")
    ax_r.set_title("who was slowest")
    fig.tight_layout()
    return save(fig, stem)


def predicted_figure(measured: dict, pred, stem: Path) -> list[Path]:
    """Predicted vs measured step time, peak memory and MFU, each as a pair of bars."""
    plt = pyplot()
    pairs = [("step time (s)", pred.step_time_s, measured["step_time_s"]),
             ("peak memory (GiB)", pred.memory.total / GiB, measured["peak_mem_bytes"] / GiB),
             ("MFU (%)", None if pred.mfu is None else 100 * pred.mfu, 100 * measured["mfu"])]
    fig, axes = plt.subplots(1, 3, figsize=(10, 2.8))
    for ax, (name, p, m) in zip(axes, pairs):
        ax.bar(["predicted", "measured"], [p or 0, m], color=["#8c8c8c", "#4c72b0"])
        if p is None:
            ax.text(0, 0, "no prediction", ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"planner ({pred.hardware}) vs this run (steady-state median)", fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def steady_measurement(run) -> dict:
    """Median step time, MFU and peak memory over the steady steps (warm-up left out)."""
    from shoal.report.run_dir import steady_rows

    rows = steady_rows(run.rows)
    return {"step_time_s": statistics.median(r["step_time_s"] for r in rows),
            "mfu": statistics.median(r.get("mfu", 0.0) for r in rows),
            "peak_mem_bytes": max(r.get("peak_mem_bytes", 0) for r in run.rows),
            "model_state_bytes": max(r.get("model_state_bytes", 0) for r in run.rows),
            "what": "resident set size" if (run.info or {}).get("device", "cpu") == "cpu" else "CUDA allocator"}
