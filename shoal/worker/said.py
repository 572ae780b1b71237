"""A worker's one-line refusal when it is not the worker that prints it.

Each node's first worker (local rank 0) prints a UserError; the others do not, or every refusal that all
ranks find alike would print once per rank. A refusal only another rank finds (in the share of a file that
rank alone reads) would then go unsaid, the job exiting 2 without a word. So such a rank leaves its line in
the folder shoal's launcher names (SAID_DIR_ENV), and the launcher prints the line of the worker that failed
first when no first worker refused too (launch/local.py). Every refusing rank leaves its line, the first worker
too: its peers, whose next collective fails for it, find it there and stop without a report of their own
(a_peer_refused). Under torchrun, which names no folder, nothing changes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SAID_DIR_ENV = "SHOAL_SAID_DIR"


def make_said_dir() -> str:
    """A new folder for this launcher's workers' lines, named after this process (said_pattern)."""
    return tempfile.mkdtemp(prefix=f"shoal-said-{os.getpid()}-")


def said_pattern(launcher: int) -> str:
    """A glob of the folders launcher process `launcher` makes (make_said_dir): what its forkserver removes
    when the launcher dies by SIGKILL (shoal/launch/forkserver_lifetime.py)."""
    return os.path.join(tempfile.gettempdir(), f"shoal-said-{launcher}-*")


def leave_line(line: str) -> None:
    """Leave this worker's refusal for the launcher (nothing to do without its folder)."""
    folder = os.environ.get(SAID_DIR_ENV)
    if not folder:
        return
    try:
        Path(folder, f"rank{os.environ.get('RANK', '0')}").write_text(line)
    except OSError:  # the folder went with its launcher: nobody is left to print it
        pass


def left_line(folder: str | os.PathLike, rank: int) -> str | None:
    """The line worker `rank` left in `folder`, if it left one."""
    try:
        return Path(folder, f"rank{rank}").read_text().strip() or None
    except OSError:
        return None


def a_peer_refused() -> bool:
    """Whether another worker of this launcher left a refusal line: then the collective that just failed here
    failed because that worker stopped, and its one line says why. No wait is needed: a refusing worker leaves
    its line before it exits, and its connections close only when it does."""
    folder = os.environ.get(SAID_DIR_ENV)
    if not folder:
        return False
    mine = f"rank{os.environ.get('RANK', '0')}"
    try:
        return any(name != mine for name in os.listdir(folder))
    except OSError:  # the folder went with its launcher
        return False
