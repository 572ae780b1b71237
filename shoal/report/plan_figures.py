"""Pictures of a plan: memory breakdown, step-time breakdown, scaling curve (PNG and SVG).

Matplotlib with the Agg backend, imported only when a figure is asked for.
"""

from __future__ import annotations

from pathlib import Path

from shoal.hardware.gpu import GiB
from shoal.planner.render import MEMORY_PARTS, TIME_PARTS
from shoal.planner.scaling import efficiency, knee
from shoal.report.draw import pyplot, save

COLORS = {
    "params": "#4c72b0", "grads": "#55a868", "optimizer": "#8172b2", "activations": "#dd8452",
    "logits": "#c44e52", "buffers": "#937860", "overhead": "#8c8c8c",
    "compute": "#4c72b0", "recompute": "#64b5cd", "tp_comm": "#dd8452", "pp_comm": "#da8bc3",
    "ep_comm": "#ccb974", "fsdp_comm": "#937860", "bubble": "#c44e52", "dp_comm": "#55a868",
    "optimizer_t": "#8172b2", "tail": "#2f2f2f", "cp_comm": "#8c613c", "offload": "#a1c9f4",
}


def memory_figure(plans, stem: Path, formats=("png", "svg")) -> list[Path]:
    """Stacked bars: where each layout's memory goes, against the device's capacity."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(plans) + 2.0))
    labels = [p.layout.short() for p in plans][::-1]
    left = [0.0] * len(plans)
    for part in MEMORY_PARTS:
        vals = [getattr(p.memory, part) / GiB for p in plans][::-1]
        ax.barh(labels, vals, left=left, color=COLORS[part], label=part)
        left = [a + b for a, b in zip(left, vals)]
    cap = plans[0].memory.capacity / GiB
    ax.axvline(cap, color="black", linestyle="--", linewidth=1)
    ax.text(cap, len(plans) - 0.5, f" {cap:.0f} GiB", va="bottom", fontsize=8)
    ax.set_xlabel("GiB per GPU (busiest pipeline stage)")
    ax.set_title("Memory per GPU")
    ax.legend(ncol=7, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    return save(fig, stem, formats, dpi=130)


def time_figure(plans, stem: Path, formats=("png", "svg")) -> list[Path]:
    """Stacked bars: each layout's step time split into compute, communication, bubble, optimizer."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(plans) + 2.0))
    labels = [p.layout.short() for p in plans][::-1]
    left = [0.0] * len(plans)
    for part in TIME_PARTS:
        vals = [getattr(p.time, part) for p in plans][::-1]
        if not any(vals):
            continue
        ax.barh(labels, vals, left=left, color=COLORS["optimizer_t" if part == "optimizer" else part], label=part)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel("seconds per step")
    ax.set_title("Step time")
    ax.legend(ncol=5, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    return save(fig, stem, formats, dpi=130)


def scaling_figure(points, stem: Path, formats=("png", "svg")) -> list[Path]:
    """Throughput and per-GPU efficiency against GPU count, for both sweeps."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, style in (("fixed-global-batch", "o-"), ("fixed-per-gpu-batch", "s--")):
        pts = [p for p in points if p.mode == mode and p.best]
        if not pts:
            continue
        eff = efficiency([p for p in points if p.mode == mode])
        ns = [p.n_gpus for p in pts]
        ax1.plot(ns, [p.tokens_per_s for p in pts], style, label=mode)
        ax2.plot(ns, [eff[n] for n in ns], style, label=mode)
        dim, wall = knee([p for p in points if p.mode == mode])
        if wall:
            ax1.axvline(wall, color="gray", linestyle=":", linewidth=1)
            ax1.text(wall, ax1.get_ylim()[1], " wall", fontsize=8, va="top")
        if dim:
            ax2.axvline(dim, color="gray", linestyle=":", linewidth=1)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("tokens/s (best layout)")
    ax2.set_ylabel("per-GPU throughput / best per-GPU")
    ax2.axhline(0.8, color="gray", linewidth=0.5)
    fig.suptitle("Scaling: where adding GPUs stops paying off")
    return save(fig, stem, formats, dpi=130)
