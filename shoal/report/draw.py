"""Saving figures: PNG and SVG files, the PNG's bytes for the HTML page, and SVG that is the same
bytes every time it is drawn (fixed hash salt, no date), so committed pictures can be checked."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "shoal"  # element ids stop depending on a random salt
    return plt


def save(fig, stem: Path, formats=("png", "svg")) -> list[Path]:
    """Write stem.png / stem.svg and close the figure."""
    plt = pyplot()
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        meta = {"Date": None} if fmt == "svg" else {"Software": None}
        fig.savefig(path, dpi=110, bbox_inches="tight", metadata=meta)
        paths.append(path)
    plt.close(fig)
    return paths
