"""The pipeline schedule drawn per rank over time (shoal/report/schedule.py lays it out)."""

from __future__ import annotations

from pathlib import Path

from shoal.report.draw import pyplot, save
from shoal.report.schedule import KIND_NAME, Timeline

COLORS = {"F": "#4c72b0", "B": "#55a868", "I": "#8fd19e", "W": "#ccb974"}


def schedule_figure(tl: Timeline, stem: Path, title: str = "", formats=("png", "svg")) -> list[Path]:
    from matplotlib.patches import Patch, Rectangle

    plt = pyplot()
    width = min(16.0, max(6.0, tl.makespan * 0.28))
    fig, ax = plt.subplots(figsize=(width, 0.55 * tl.pp + 1.6))
    ax.add_patch(Rectangle((0, -0.5), tl.makespan, tl.pp, facecolor="#eeeeee", edgecolor="none"))  # idle
    for b in tl.blocks:
        y = tl.pp - 1 - b.rank
        ax.add_patch(Rectangle((b.start, y - 0.4), b.end - b.start, 0.8, facecolor=COLORS[b.kind],
                               edgecolor="white", linewidth=0.6))
        label = f"{b.microbatch}" if tl.virtual == 1 else f"{b.microbatch}s{b.stage}"
        ax.text((b.start + b.end) / 2, y, label, ha="center", va="center", fontsize=6 if tl.virtual == 1 else 5,
                color="white")
    ax.set_xlim(0, tl.makespan)
    ax.set_ylim(-0.5, tl.pp - 0.5)
    ax.set_yticks(range(tl.pp), [f"pp rank {r}" for r in reversed(range(tl.pp))])
    ax.set_xlabel("time (forward = 1 unit; a full backward = 2)")
    kinds = sorted({b.kind for b in tl.blocks}, key="FBIW".index)
    handles = [Patch(color=COLORS[k], label=KIND_NAME[k]) for k in kinds] + [Patch(color="#eeeeee", label="idle")]
    ax.legend(handles=handles, ncol=len(handles), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28),
              frameon=False)
    v = f", {tl.virtual} stages per rank" if tl.virtual > 1 else ""
    ax.set_title(title or f"{tl.schedule}: {tl.pp} ranks, {tl.microbatches} micro-batches{v} - "
                          f"bubble {tl.bubble_fraction:.1%}", fontsize=10)
    return save(fig, stem, formats)
