"""Saving figures: PNG and SVG files, the PNG's bytes for the HTML page, and SVG that is the same
bytes every time it is drawn (fixed hash salt, no date), so committed pictures can be checked.
Each SVG names shoal as its creator (SVG_CREATOR), so a command asked to write over an existing
.svg can tell its own picture from a person's."""

from __future__ import annotations

import os
from pathlib import Path


SVG_CREATOR = "shoal (drawn with Matplotlib)"


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "shoal"  # element ids stop depending on a random salt
    return plt


def save(fig, stem: Path, formats=("png", "svg"), dpi: int = 110) -> list[Path]:
    """Write stem.png / stem.svg and close the figure."""
    plt = pyplot()
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        meta = {"Date": None, "Creator": SVG_CREATOR} if fmt == "svg" else {"Software": None}
        # written beside, then renamed over: a command stopped while it draws leaves the earlier picture or
        # none, not a truncated one
        partial = path.with_name(f".{path.name}.partial")
        try:
            fig.savefig(partial, format=fmt, dpi=dpi, bbox_inches="tight", metadata=meta)
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        paths.append(path)
    plt.close(fig)
    return paths
