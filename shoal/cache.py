"""Where shoal keeps what it measures or derives once per machine (token shards, CPU peak FLOP/s,
the planner's `local` profile). Imports no torch: the planner uses it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SHOAL_CACHE_DIR if set (tests point it at a temporary folder), else ~/.cache/shoal."""
    return Path(os.environ.get("SHOAL_CACHE_DIR") or Path.home() / ".cache" / "shoal").expanduser()  # "~/x" quoted
