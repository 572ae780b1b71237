"""A whole run read back from its folder, for `shoal report`: its rows, its run.json, its
checkpoints and restarts, and whether it is still running.

A directory that is not a run (missing, empty, someone else's files), a damaged one (a field of
another kind than the trainer writes, see metrics.ROW_KINDS and run_info.INFO_KINDS) or a run that
stopped before its last step (killed) is a UserError with one line saying which, so the CLI exits
2. A run still being written (its metrics file changed recently) is read as far as it goes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.errors import UserError
from shoal.rundir.kinds import damaged
from shoal.rundir.metrics import read_rows, torn
from shoal.rundir.names import CHECKPOINTS, METRICS, MODEL, RUN_INFO, list_checkpoints
from shoal.rundir.run_info import read_info, starts

LOAD_NEEDS = ("config.train.steps", "config.checkpoint")
"""The run.json fields load_run reads (a report needs more: shoal/report/run_report.py)."""

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

    @property
    def starts(self) -> tuple[int, ...]:
        """The step each attempt started from, for rundir.metrics.steady."""
        return starts(self.info)


def load_run(path: Path, allow_partial: bool = False, now: float | None = None, need: tuple[str, ...] = ()) -> Run:
    """The run at `path`, or a UserError naming what is wrong with it; `need`: the run.json fields
    the caller reads, beyond LOAD_NEEDS (dotted paths)."""
    where = str(path)
    if not path.exists():
        raise UserError("run_dir", where, "does not exist; give the --out directory of a `shoal train` run")
    if not path.is_dir():
        raise UserError("run_dir", where, "is a file; give the --out directory of a `shoal train` run")
    entries = list(path.iterdir())
    if not entries:
        raise UserError("run_dir", where, f"is empty: no run has written here yet ({METRICS} appears at step 1)")
    metrics, info_path = path / METRICS, path / RUN_INFO
    if not metrics.is_file() and not info_path.is_file():
        names = ", ".join(sorted(e.name for e in entries)[:4])
        raise UserError("run_dir", where, f"is not a shoal run (no {METRICS} or {RUN_INFO}; it holds {names}); "
                                          "give the --out directory of a `shoal train` run")
    info = read_info(path, LOAD_NEEDS + need)
    rows, cut = read_rows(metrics, where), torn(metrics)
    if info is not None:
        _check_ranks(rows, max([info["world"], *(s.get("world", 0) for s in info.get("starts", []))]), where)
    now = time.time() if now is None else now
    run = Run(path, rows, info)
    run.in_progress = _still_running(run, metrics, info_path, now)
    finished = (path / MODEL).is_dir() and (run.total_steps is None or run.last_step >= run.total_steps)
    if not finished and not run.in_progress and not allow_partial:
        raise _stopped(run, metrics, cut)
    if cut:
        run.notes.append(f"the last line of {METRICS} was cut off (written while reading, or the run was killed)")
    if not finished:
        run.notes.append(f"the run is {'still running' if run.in_progress else 'incomplete'}: "
                         f"this report shows the {len(rows)} steps written so far")
    if info is None:
        run.notes.append(f"no {RUN_INFO} (a run from an older shoal): no rank grid, schedule or prediction")
    run.checkpoints = _checkpoint_steps(run)
    run.restarts = _restarts(run)
    return run


def _stopped(run: Run, metrics: Path, cut: bool) -> UserError:
    """Why a run no longer running is not finished, in the words that fit what is on disk."""
    got = f"step {run.last_step}" + (f" of {run.total_steps}" if run.total_steps else "")
    if (run.path / MODEL).is_dir():  # it did finish, and its rows were lost after: resuming brings none back
        what = "is missing" if not metrics.is_file() else "is empty" if not run.rows else f"ends at {got}"
        return UserError("run_dir", str(metrics), f"{what}, though the run wrote its final {MODEL}/ (it was "
                                                  "emptied, cut or removed after the run): restore it from a copy, "
                                                  "or pass --partial to report the steps it has")
    why = ("its last line is cut off" if cut else f"its {METRICS} is empty: it logged no step" if not run.rows
           else f"no final {MODEL}/ was written")
    return UserError("run_dir", str(run.path), f"is a run that stopped at {got} and is no longer running ({why}): "
                                               "resume it with the same `shoal train ... --out` command, "
                                               "or pass --partial to report the steps it has")


def _check_ranks(rows: list[dict], world: int, where: str) -> None:
    """Ranks a row names (the slowest, the stragglers) are ranks of this run: below the largest
    world any of its attempts ran with (run.json's starts; a resume may change it)."""
    for n, row in enumerate(rows, 1):
        for rank in [row.get("slowest_rank", 0), *row.get("stragglers", [])]:
            if not 0 <= rank < world:
                raise damaged(where, f"{METRICS} line {n} slowest_rank/stragglers", rank, f"a rank from 0 to {world - 1}")


def _still_running(run: Run, metrics: Path, info_path: Path, now: float) -> bool:
    newest = max((p.stat().st_mtime for p in (metrics, info_path) if p.is_file()), default=0.0)
    times = [r["step_time_s"] for r in run.rows[-20:]]
    patience = max(STALE_AFTER_S, 20 * statistics.median(times)) if times else STALE_AFTER_S
    return not (run.path / MODEL).is_dir() and now - newest < patience


def _checkpoint_steps(run: Run) -> list[int]:
    """Steps with a checkpoint: those kept on disk, and every checkpoint.every-th step the run reached."""
    steps = set()
    ckpt = run.info["config"]["checkpoint"] if run.info else {}
    root = Path(ckpt.get("dir") or CHECKPOINTS)
    root = root if root.is_absolute() else run.path / root
    steps.update(step for step, _ in list_checkpoints(root))
    every = ckpt.get("every", 0)
    if every > 0:  # from the rows, not range(every, last_step): a damaged row's step may be huge
        steps.update(r["step"] for r in run.rows if r["step"] > 0 and r["step"] % every == 0)
    return sorted(steps)


def _restarts(run: Run) -> list[int]:
    """Steps where an attempt resumed: run.json's later starts, and rows whose step goes backwards."""
    steps = set(run.starts[1:])
    steps.update(b["step"] - 1 for a, b in zip(run.rows, run.rows[1:]) if b["step"] <= a["step"])
    return sorted(steps)
