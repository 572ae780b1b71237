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


def print_json(doc: dict, indent: int | None = 2) -> None:
    """A command's --json: one JSON object on stdout. Non-finite numbers (a run that died has an
    infinite difference) are written as null, so that strict parsers (jq, JSON.parse) read it."""
    import json
    import math

    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    print(json.dumps(finite(doc), indent=indent, allow_nan=False, default=str))
