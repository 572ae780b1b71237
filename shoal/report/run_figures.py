"""Pictures of one training run from its metrics.jsonl (see shoal/report/run_dir.py)."""

from __future__ import annotations

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
    """Loss and eval loss; tokens/s and MFU; learning rate; gradient norm; over steps, with
    evaluations, checkpoints and restarts marked."""
    plt = pyplot()
    fig, ((ax_loss, ax_tps), (ax_lr, ax_norm)) = plt.subplots(2, 2, figsize=(11, 7.2))
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
    for ax, key, color, title, label in ((ax_lr, "lr", "#8172b2", "learning rate", "learning rate"),
                                         (ax_norm, "grad_norm", "#dd8452", "gradient norm",
                                          "gradient L2 norm (before clipping)")):
        rows = [r for r in run.rows if r.get(key) is not None]
        ax.plot(*_attempts(rows, key), ".-", ms=3, color=color)
        _marks(ax, run, label=False)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.set_title(title)
        if not rows:
            ax.text(0.5, 0.5, f"no {key} in metrics.jsonl", ha="center", va="center", transform=ax.transAxes)
    for ax in (ax_loss, ax_tps, ax_lr, ax_norm):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, stem)


MAX_RANK_BARS = 32
"""Ranks drawn one bar each; beyond this, the ones with the highest peaks (named in the caption)."""


def latest_memory_by_rank(run) -> dict[str, list] | None:
    """The newest per-rank memory a run recorded (rows carry it only when it moved), or None."""
    return next((r["memory_by_rank"] for r in reversed(run.rows) if "memory_by_rank" in r), None)


def ranks_to_draw(by_rank: dict[str, list]) -> list[int]:
    peak = by_rank["peak"]
    if len(peak) <= MAX_RANK_BARS:
        return list(range(len(peak)))
    return sorted(sorted(range(len(peak)), key=lambda r: -(peak[r] or 0))[:MAX_RANK_BARS])


def memory_figure(measured: dict, predicted, stem: Path, by_rank: dict[str, list] | None = None) -> list[Path]:
    """Stacked bars: the planner's breakdown of the busiest rank (when there is a prediction), then
    every rank's measurement:
    parameters, gradients, optimizer state, activations (what autograd saved, measured on the first
    step) and the rest of the peak. Runs from before per-rank memory show rank 0's state and peak."""
    plt = pyplot()
    ranks = ranks_to_draw(by_rank) if by_rank else []
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.3 * max(2, len(ranks) + 1)))
    seen: set[str] = set()

    def bar(label: str, part: str, value: float, left: float, legend: str | None = None, hatch: str | None = "//",
            color: str | None = None) -> float:
        """One segment; each part named once in the legend. Measured segments are hatched."""
        ax.barh(label, value, left=left, color=color or COLORS.get(part, "#bbbbbb"), hatch=hatch, edgecolor="white",
                label=None if part in seen else (legend or part))
        seen.add(part)
        return left + value

    left = 0.0
    for part in MEMORY_PARTS if predicted else ():
        left = bar("predicted\n(planner)", part, getattr(predicted, part) / GiB, left, hatch=None)
    rest = f"rest of the peak ({measured['what']})"
    if by_rank:
        for r in ranks:
            label, left = f"rank {r}", 0.0
            for part in ("params", "grads", "optimizer", "activations"):
                left = bar(label, part, (by_rank[part][r] or 0) / GiB, left)
            bar(label, "rest", max(0.0, (by_rank["peak"][r] or 0) / GiB - left), left, legend=rest)
    else:
        state, peak = measured["model_state_bytes"] / GiB, measured["peak_mem_bytes"] / GiB
        bar("measured\n(rank 0)", "state", state, 0.0, legend="params+grads+optimizer (measured)", color="#4c72b0")
        bar("measured\n(rank 0)", "rest", max(0.0, peak - state), state, legend=rest)
    ax.invert_yaxis()
    ax.set_xlabel("GiB per rank (2^30 bytes); hatched: measured")
    ax.set_title("memory per rank")
    ax.legend(ncol=4, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.6 / max(2, len(ranks) + 1)),
              frameon=False)
    return save(fig, stem)


def comm_figure(run, stem: Path) -> list[Path]:
    """Left: bytes each step sent, by collective (stacked). Right: the steady steps' mean by
    parallel dimension (the group that carried it), stacked by collective."""
    from shoal.rundir.metrics import steady_rows

    plt = pyplot()
    fig, (ax, ax_dim) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [3, 2]})
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
    ax.set_title("by collective")
    if kinds:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    by_dim = mean_bytes_by_dim(steady_rows(run.rows, run.starts))
    dims = sorted({d for kind_dim in by_dim for d in [kind_dim.split(":")[1]]})
    left = {d: 0.0 for d in dims}
    for kind in sorted({kd.split(":")[0] for kd in by_dim}):
        vals = [by_dim.get(f"{kind}:{d}", 0) / 2**20 for d in dims]
        ax_dim.barh(dims, vals, left=[left[d] for d in dims], color=COMM_COLORS.get(kind), label=kind)
        for d, v in zip(dims, vals):
            left[d] += v
    if not dims:
        ax_dim.text(0.5, 0.5, "not recorded (one rank, or a run\nfrom before bytes by dimension)",
                    transform=ax_dim.transAxes, ha="center", va="center", fontsize=8)
    ax_dim.set_xlabel("MiB per steady step (rank 0)")
    ax_dim.set_title("by parallel dimension")
    ax_dim.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return save(fig, stem)


def mean_bytes_by_dim(rows: list[dict]) -> dict[str, float]:
    """{"collective:dimension": mean bytes per step} over rows that recorded comm_bytes_by_dim."""
    rows = [r for r in rows if "comm_bytes_by_dim" in r]
    keys = {k for r in rows for k in r["comm_bytes_by_dim"]}
    return {k: sum(r["comm_bytes_by_dim"].get(k, 0) for r in rows) / len(rows) for k in keys}


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
    # every rank when run.json says how many; else the ranks the rows name (an old run's numbers are unchecked)
    ranks = range(world) if world else sorted({r["slowest_rank"] for r in rows} | {0})
    counts = [sum(r["slowest_rank"] == k for r in rows) for k in ranks]
    ax_r.bar([str(k) for k in ranks], counts, color="#8c8c8c")
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
    """The run's speed over its steady steps (rundir.metrics.steady: the medians the run summary and
    `plan --validate` show too), and its peak memory over every step."""
    from shoal.rundir.metrics import steady

    speed = steady(run.rows, run.starts)
    return {"step_time_s": speed.step_time_s, "mfu": speed.mfu or 0.0,
            "peak_mem_bytes": max(r.get("peak_mem_bytes", 0) for r in run.rows),
            "model_state_bytes": max(r.get("model_state_bytes", 0) for r in run.rows),
            "what": "resident set size" if (run.info or {}).get("device", "cpu") == "cpu" else "CUDA allocator"}
