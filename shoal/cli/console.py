"""The rich Console every command prints tables with.

Rich lays tables out for 80 columns when stdout is not a terminal, which cuts preset names and
config values short in `shoal presets | less` or a CI log; piped output gets a wide page instead
(COLUMNS, when set, still wins).
"""

from __future__ import annotations

import os

PIPED_WIDTH = 200


def console(**kwargs):
    from rich.console import Console

    con = Console(**kwargs)
    if con.is_terminal or "COLUMNS" in os.environ or "width" in kwargs:
        return con
    return Console(width=PIPED_WIDTH, **kwargs)
