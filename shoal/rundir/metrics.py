"""<out>/metrics.jsonl: one JSON row per step. Its one writer, its readers, and the one statistic of
a run's speed (`steady`) that the run summary, `shoal report` and `shoal plan --validate` all show.

Each row goes out in one os.write of a whole line on an O_APPEND descriptor, so a crash can cut off
at most the last line, and never interleaves two half lines. On resume the checkpointer drops the
rows past the checkpoint (and a torn last line) with `truncate_metrics`, so no step is logged twice.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import UserError
from shoal.rundir.disk import no_space_left
from shoal.rundir.kinds import check_fields, damaged
from shoal.rundir.names import METRICS

REQUIRED = ("step", "loss", "step_time_s")
ROW_KINDS = {  # shoal/train/trainer.py's row (`replicas` and wire fields are read by nobody here)
    "step": int, "loss": float, "eval_loss": float, "lr": float, "grad_norm": float, "tokens": int,
    "tokens_per_s": float, "step_time_s": float, "mfu": float, "peak_mem_bytes": float, "model_state_bytes": float,
    "comm_bytes": {str: float}, "comm_bytes_by_dtype": {str: float}, "comm_bytes_by_dim": {str: float},
    "memory_by_rank": {str: [(float, None)]},  # None: not measured on that rank
    "compute_time_spread": float, "slowest_rank": int, "stragglers": [int],
    "predicted_peak_mem_bytes": float, "predicted_step_time_s": float, "predicted_mfu": float}
MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "peak")
"""memory_by_rank's lists (shoal/train/memory.py), one number per rank each."""

WARMUP_STEPS = 2
"""Steps after each start that say nothing of the run's speed: the first ones allocate memory, warm
caches and (on GPU) pick kernels, so they are slower than every step after them."""


class MetricsLog:
    """Appends one row per step to <out>/metrics.jsonl (only where `enabled`: rank 0), and hands it
    to the `backends` (TensorBoard, W&B: shoal/train/metric_backends.py); every rank keeps the speed
    of the steps it logged, for the run summary's `steady()`."""

    def __init__(self, out: Path, enabled: bool = True, append: bool = False, backends: list = ()):
        self.path, self._backends = out / METRICS, list(backends)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self._fd = os.open(self.path, flags, 0o644) if enabled else None
        self._folder = _identity(out) if enabled else None  # which folder --out is, to notice it go or move
        self._speed: list[tuple] = []  # (step, step_time_s, tokens_per_s, mfu): what steady() reads, not whole rows

    def write(self, row: dict, sync: bool = False) -> None:
        self._speed.append(tuple(row.get(k) for k in _SPEED))
        if self._fd is None:
            return
        line = (json.dumps(row) + "\n").encode()
        with no_space_left(self.path):
            while line:  # one write takes it all, except on a nearly full disk (then ENOSPC follows)
                line = line[os.write(self._fd, line):]
            if sync:
                os.fsync(self._fd)
        for backend in self._backends:
            backend.write(row)
            if sync:  # as far as the checkpoint, like the file
                backend.flush()
        # Writes to a deleted file succeed, and nobody would ever read them; a moved folder leaves the
        # run writing metrics there and checkpoints into a new folder at the old path.
        if os.fstat(self._fd).st_nlink == 0 or _identity(self.path.parent) != self._folder:
            raise self._lost(row.get("step"))

    def _lost(self, step) -> UserError:
        """The run folder (or its metrics file) was deleted, moved or replaced under the running run:
        stop, rather than recreate checkpoints/ and model/ in a folder with no metrics, run.json or lock."""
        return UserError("--out", str(self.path.parent), f"was deleted, moved or replaced (or its {METRICS}) while the "
                         f"run was writing into it; stopped after step {step}, writing nothing more; start again "
                         "with a new --out")

    def steady(self, start: int) -> "Steady":
        """The speed of the steps this process logged, the first WARMUP_STEPS after `start` left out."""
        return steady([dict(zip(_SPEED, speed)) for speed in self._speed], starts=(start,))

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
        self._backends = []
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_SPEED = ("step", "step_time_s", "tokens_per_s", "mfu")


def _identity(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of the folder at this path now; None where there is none."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass(frozen=True)
class Steady:
    """A run's speed over its undisturbed steps: medians, since on a shared machine a few steps
    stretched by other work would otherwise decide it, and a plan is for an undisturbed step."""

    steps: int
    """Rows it is over."""
    warmup: int
    """Rows left out at each start (0 for a run too short to have any after them)."""
    step_time_s: float
    tokens_per_s: float
    mfu: float | None
    """Model FLOPs utilisation as logged (None when the rows carry none)."""


def steady_rows(rows: list[dict], starts=(0,)) -> list[dict]:
    """The rows that describe the run's speed: the last attempt's row per step, without the first
    WARMUP_STEPS after each start (the step an attempt resumed from; 0 for a fresh run). A run too
    short to have steps after them keeps them all."""
    last = {r["step"]: r for r in rows}  # a restart re-does steps; the later row wins
    warm = {start + k for start in starts for k in range(1, WARMUP_STEPS + 1)}
    ordered = [last[s] for s in sorted(last)]
    return [r for r in ordered if r["step"] not in warm] or ordered


def steady(rows: list[dict], starts=(0,)) -> Steady:
    """The median step time, tokens/s and MFU over steady_rows (NaN for no rows)."""
    kept = steady_rows(rows, starts)

    def median(key: str):
        values = [r[key] for r in kept if r.get(key) is not None]
        return statistics.median(values) if values else None

    left_out = len({r["step"] for r in rows}) - len(kept)
    step_time, tokens_per_s = median("step_time_s"), median("tokens_per_s")
    return Steady(len(kept), WARMUP_STEPS if left_out else 0, math.nan if step_time is None else step_time,
                  math.nan if tokens_per_s is None else tokens_per_s, median("mfu"))


def read_rows(path: Path, where: str = "", need: tuple[str, ...] = REQUIRED) -> list[dict]:
    """The rows of a metrics.jsonl (or of the one in the run folder `path`), every field checked
    for the kind the trainer writes. A last line cut off (being written, or a killed writer's last
    words: see torn) is left out; any other bad line means a foreign or damaged file, a UserError
    naming it (`where`: the run folder to name). Blank lines are skipped; no file is no rows."""
    path = path / METRICS if path.is_dir() else path
    where = where or str(path.parent)
    need = tuple(dict.fromkeys(("step", *need)))  # whatever else a reader needs: every row is keyed by its step
    if not path.is_file():
        return []
    lines = path.read_text(errors="replace").split("\n")  # a bad byte fails the line's JSON below
    lines.pop()  # "" after the last newline, or a torn line
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if not isinstance(row, dict) or any(k not in row for k in need):
            raise UserError("run_dir", where, f"{METRICS} line {n} is not a shoal metrics row "
                                              f"(needs {', '.join(need)}); is this a shoal run directory?")
        check_fields(row, ROW_KINDS, f"{METRICS} line {n}", where)
        mem = row.get("memory_by_rank")
        if mem is not None and (len(lengths := {len(mem.get(k, [])) for k in MEMORY_KINDS}) != 1 or 0 in lengths):
            raise damaged(where, f"{METRICS} line {n} memory_by_rank", mem,
                          f"one list per kind ({', '.join(MEMORY_KINDS)}), all of one length")
        rows.append(row)
    return rows


def torn(path: Path) -> bool:
    """Whether the file's last line is cut off (no newline at its end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


def row_step_of(line: str) -> int | None:
    """The step of one metrics.jsonl line; None for a line that is not a row: cut short by a crash,
    NUL bytes from a file system that lost its tail, or another shape (a step of 1e400 is inf)."""
    try:
        row_step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return row_step if isinstance(row_step, int) and not isinstance(row_step, bool) else None


def _logged_rows(path: Path) -> list[tuple[int, str]]:
    """(step, line) of each whole row, in file order; what is no such row (row_step_of), and bytes
    that are not UTF-8, left out: what resume can still use of a damaged file."""
    if not path.is_file():
        return []
    return [(row_step, line) for line in path.read_bytes().decode(errors="replace").splitlines()
            if (row_step := row_step_of(line)) is not None]


def last_logged_step(out: Path) -> int:
    """The highest step <out>/metrics.jsonl has a row for (0 if none, or no file)."""
    return max((row_step for row_step, _ in _logged_rows(out / METRICS)), default=0)


def truncate_metrics(out: Path, step: int) -> None:
    """Keep the rows of <out>/metrics.jsonl up to `step` (each step once), drop later ones and any
    torn line: the file then reads like one uninterrupted run. Rewritten under a temporary name and
    renamed into place."""
    path = out / METRICS
    if not path.is_file():
        return
    keep, seen = [], set()
    for row_step, line in _logged_rows(path):
        if row_step <= step and row_step not in seen:
            seen.add(row_step)
            keep.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(keep))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def has_rows(out: Path) -> bool:
    """Whether <out> holds a metrics file with anything in it (an earlier run's)."""
    path = out / METRICS
    return path.is_file() and path.stat().st_size > 0
