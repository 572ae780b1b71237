"""Reading a run directory for `shoal report`: metrics.jsonl, run.json and the checkpoints.

A directory that is not a run (missing, empty, someone else's files) or a run that stopped
before its last step (killed) is a UserError with one line saying which, so the CLI exits 2.
A run still being written (its metrics file changed recently) is read as far as it goes.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.errors import UserError

METRICS = "metrics.jsonl"
RUN_INFO = "run.json"  # written by shoal/train/run_info.py
REQUIRED = ("step", "loss", "step_time_s")
STALE_AFTER_S = 120.0
"""A run whose metrics file has not changed for max(this, 20 step times) is no longer running."""


@dataclass
class Run:
    path: Path
    rows: list[dict]
    info: dict | None
    """run.json (None for runs from before it existed: no rank grid, schedule or prediction)."""
    checkpoints: list[int] = field(default_factory=list)
    restarts: list[int] = field(default_factory=list)
    """Steps a later attempt started from (resumed after a failure or a stop)."""
    in_progress: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def total_steps(self) -> int | None:
        return self.info["config"]["train"]["steps"] if self.info else None

    @property
    def last_step(self) -> int:
        return self.rows[-1]["step"] if self.rows else 0


def load_run(path: Path, allow_partial: bool = False, now: float | None = None) -> Run:
    """The run at `path`, or a UserError naming what is wrong with it."""
    where = str(path)
    if not path.exists():
        raise UserError("run_dir", where, "does not exist; give the --out directory of a `shoal train` run")
    if not path.is_dir():
        raise UserError("run_dir", where, "is a file; give the --out directory of a `shoal train` run")
    entries = list(path.iterdir())
    if not entries:
        raise UserError("run_dir", where, "is empty: no run has written here yet (metrics.jsonl appears at step 1)")
    metrics, info_path = path / METRICS, path / RUN_INFO
    if not metrics.is_file() and not info_path.is_file():
        names = ", ".join(sorted(e.name for e in entries)[:4])
        raise UserError("run_dir", where, f"is not a shoal run (no {METRICS} or {RUN_INFO}; it holds {names}); "
                                          "give the --out directory of a `shoal train` run")
    info = _read_info(info_path, where) if info_path.is_file() else None
    rows, torn = _read_rows(metrics, where) if metrics.is_file() else ([], False)
    now = time.time() if now is None else now
    run = Run(path, rows, info)
    run.in_progress = _still_running(run, metrics, info_path, now)
    finished = (path / "model").is_dir() and (run.total_steps is None or run.last_step >= run.total_steps)
    if not finished and not run.in_progress and not allow_partial:
        got = f"step {run.last_step}" + (f" of {run.total_steps}" if run.total_steps else "")
        why = "its last line is cut off" if torn else "no final model/ was written"
        raise UserError("run_dir", where, f"is a run that stopped at {got} and is no longer running ({why}): "
                                          "resume it with the same `shoal train ... --out` command, "
                                          "or pass --partial to report the steps it has")
    if torn:
        run.notes.append(f"the last line of {METRICS} was cut off (written while reading, or the run was killed)")
    if not finished:
        run.notes.append(f"the run is {'still running' if run.in_progress else 'incomplete'}: "
                         f"this report shows the {len(rows)} steps written so far")
    if info is None:
        run.notes.append(f"no {RUN_INFO} (a run from an older shoal): no rank grid, schedule or prediction")
    run.checkpoints = _checkpoint_steps(run)
    run.restarts = _restarts(run)
    return run


def _read_info(path: Path, where: str) -> dict:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError("run_dir", where, f"has an unreadable {RUN_INFO} ({type(e).__name__}); "
                                          "it is not a shoal run, or the file was damaged") from None
    if not isinstance(info, dict) or info.get("shoal_run") != 1:
        raise UserError("run_dir", where, f"has a {RUN_INFO} that shoal did not write; give the --out "
                                          "directory of a `shoal train` run")
    return info


def _read_rows(path: Path, where: str) -> tuple[list[dict], bool]:
    """(rows, whether the last line was cut off). Any other bad line means a foreign file."""
    lines = path.read_text(errors="replace").split("\n")
    torn = False
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:  # no newline at the end: a line being written (or a killed writer's last words)
        lines.pop()
        torn = True
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or any(k not in row for k in REQUIRED):
            raise UserError("run_dir", where, f"{METRICS} line {n} is not a shoal metrics row "
                                              f"(needs {', '.join(REQUIRED)}); is this a shoal run directory?")
        rows.append(row)
    return rows, torn


def _still_running(run: Run, metrics: Path, info_path: Path, now: float) -> bool:
    newest = max((p.stat().st_mtime for p in (metrics, info_path) if p.is_file()), default=0.0)
    times = [r["step_time_s"] for r in run.rows[-20:]]
    patience = max(STALE_AFTER_S, 20 * statistics.median(times)) if times else STALE_AFTER_S
    return not (run.path / "model").is_dir() and now - newest < patience


def _checkpoint_steps(run: Run) -> list[int]:
    """Steps with a checkpoint: those kept on disk, and every checkpoint.every-th step the run reached."""
    from shoal.checkpoint.store import list_checkpoints

    steps = set()
    ckpt = run.info["config"]["checkpoint"] if run.info else {}
    root = Path(ckpt.get("dir") or "checkpoints")
    root = root if root.is_absolute() else run.path / root
    steps.update(step for step, _ in list_checkpoints(root))
    every = ckpt.get("every", 0)
    if every:
        steps.update(s for s in range(every, run.last_step + 1, every))
    return sorted(steps)


def _restarts(run: Run) -> list[int]:
    """Steps where an attempt resumed: run.json's later starts, and rows whose step goes backwards."""
    steps = {s["step"] for s in (run.info or {}).get("starts", [])[1:]}
    steps.update(b["step"] - 1 for a, b in zip(run.rows, run.rows[1:]) if b["step"] <= a["step"])
    return sorted(steps)


def steady_rows(rows: list[dict]) -> list[dict]:
    """The rows that describe the run's speed: the last attempt's row per step, warm-up left out."""
    from shoal.train.metrics import WARMUP_STEPS

    last = {r["step"]: r for r in rows}  # a restart re-does steps; the later row wins
    ordered = [last[s] for s in sorted(last)]
    return ordered[WARMUP_STEPS:] if len(ordered) > WARMUP_STEPS else ordered
