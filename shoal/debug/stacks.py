"""Python stacks of this process's threads, taken from another thread.

`sys._current_frames()` works while the main thread is blocked inside a C++ collective (c10d
releases the GIL while it waits), which is exactly when a hang report needs it.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

from shoal.debug.callsite import short_path


_SELF_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _frames(frame, limit: int | None) -> list[dict]:
    summary = [f for f in traceback.extract_stack(frame) if not f.filename.startswith(_SELF_DIR)]  # not ours
    if limit is not None:
        summary = summary[-limit:]
    return [{"site": f"{short_path(f.filename)}:{f.lineno} in {f.name}", "line": (f.line or "").strip()} for f in summary]


def threads(limit: int | None = None) -> list[dict]:
    """[{name, main, frames: [{site, line}, ...innermost last]}] for every thread but shoal.debug's own."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident, "").startswith("shoal-debug"):
            continue
        out.append({"name": names.get(ident, f"thread {ident}"), "main": ident == main, "frames": _frames(frame, limit)})
    out.sort(key=lambda t: not t["main"])  # main thread first
    return out


def format_threads(stacks: list[dict], indent: str = "  ") -> str:
    lines = []
    for t in stacks:
        lines.append(f"{indent}thread {t['name']!r}{' (main)' if t['main'] else ''}, innermost last:")
        for f in t["frames"]:
            lines.append(f"{indent}  {f['site']}" + (f": {f['line']}" if f["line"] else ""))
    return "\n".join(lines)
