"""Per-step metrics: the JSONL file, the live progress display and the final summary table."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

from shoal.train.rundir import no_space_left


def reset_peak_mem(device: torch.device) -> None:
    """Start the peak over, so it is this run's when one process trains several (benchmarks, tests)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: the peak resident set (VmHWM) restarts from the current one
    except OSError:
        pass  # other systems: the process's lifetime peak (ru_maxrss) it is


def peak_mem_bytes(device: torch.device) -> int:
    """Peak allocated device memory on CUDA; peak resident set size of this process on CPU, since
    reset_peak_mem."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024  # kB
    except (OSError, StopIteration, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


WARMUP_STEPS = 2
"""Steps of a process left out of the summary's throughput: the first ones allocate memory, warm
caches and (on GPU) pick kernels, so they are slower than every step after them."""


class MetricsLog:
    """Appends one JSON object per step to <out>/metrics.jsonl (only rank 0 writes); every rank keeps
    the step times for the summary's steady-state throughput.

    Each row goes out in one os.write of a whole line on an O_APPEND descriptor, so a crash can
    cut off at most the last line, and never interleaves two half lines. On resume the checkpointer
    drops the rows past the checkpoint (and a torn last line), so no step is ever logged twice.
    """

    def __init__(self, path: Path, enabled: bool = True, append: bool = False):
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self._fd = os.open(path, flags, 0o644) if enabled else None
        self.step_times: list[float] = []

    def write(self, row: dict, sync: bool = False) -> None:
        self.step_times.append(row["step_time_s"])
        if self._fd is None:
            return
        line = (json.dumps(row) + "\n").encode()
        with no_space_left(self.path):
            while line:  # one write takes it all, except on a nearly full disk (then ENOSPC follows)
                line = line[os.write(self._fd, line):]
            if sync:
                os.fsync(self._fd)

    def steady_step_time(self) -> tuple[float, int]:
        """(mean step time after the warm-up steps, how many steps were left out). A run too short
        to have steps after the warm-up keeps them all (and says 0 were left out)."""
        skip = WARMUP_STEPS if len(self.step_times) > WARMUP_STEPS else 0
        steady = self.step_times[skip:]
        return (sum(steady) / len(steady) if steady else float("nan")), skip

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def row_step_of(line: str) -> int | None:
    """The step of one metrics.jsonl line; None for a line that is not a row: cut short by a crash,
    NUL bytes from a file system that lost its tail, or another shape (a step of 1e400 is inf)."""
    try:
        row_step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return row_step if isinstance(row_step, int) and not isinstance(row_step, bool) else None


def logged_rows(path: Path) -> list[tuple[int, str]]:
    """(step, line) of each whole row of metrics.jsonl, in file order; lines that are no such row
    (row_step_of), and bytes that are not UTF-8, are left out."""
    if not path.is_file():
        return []
    return [(row_step, line) for line in path.read_bytes().decode(errors="replace").splitlines()
            if (row_step := row_step_of(line)) is not None]


def last_logged_step(path: Path) -> int:
    """The highest step metrics.jsonl has a row for (0 if none, or no file)."""
    return max((row_step for row_step, _ in logged_rows(path)), default=0)


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the rows up to `step` (each step once), drop later ones and any torn line: the file then
    reads like one uninterrupted run. Rewritten under a temporary name and renamed into place."""
    if not path.is_file():
        return
    keep, seen = [], set()
    for row_step, line in logged_rows(path):
        if row_step <= step and row_step not in seen:
            seen.add(row_step)
            keep.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(keep))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Progress:
    """A rich progress bar on a terminal; a plain log line every few steps otherwise. Both show the
    time left, the last evaluation, and events (a checkpoint written) as they happen; the
    checkpointer says where a run resumed."""

    def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.total, self.start, self.enabled = total_steps, start_step, enabled
        self.interactive = enabled and sys.stderr.isatty()
        self.every = max(1, total_steps // 20)
        self.t0 = time.perf_counter()
        self.last_eval: float | None = None
        self._bar = None
        if self.interactive:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"), TimeRemainingColumn(), transient=False,
            )
            self._task = self._bar.add_task("train", total=total_steps, completed=start_step, stats="")
            self._bar.start()

    def update(self, row: dict) -> None:
        if not self.enabled:
            return
        self.last_eval = row.get("eval_loss", self.last_eval)
        stats = f"loss {row['loss']:.3f}  {row['tokens_per_s']:,.0f} tok/s  MFU {row['mfu']:.1%}"
        if self.last_eval is not None:
            stats += f"  eval {self.last_eval:.3f}"
        if self._bar is not None:
            self._bar.update(self._task, completed=row["step"], stats=stats)
        elif row["step"] % self.every == 0 or row["step"] == self.total or "eval_loss" in row:
            elapsed = time.perf_counter() - self.t0
            left = elapsed / max(1, row["step"] - self.start) * (self.total - row["step"])
            print(f"step {row['step']:>6}/{self.total}  {stats}  lr {row['lr']:.2e}  {elapsed:.0f}s  "
                  f"eta {_duration(left)}", flush=True)

    def event(self, text: str) -> None:
        """One line between the progress updates, e.g. 'checkpoint written at step 40'."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="run summary", show_header=False)
    table.add_column(justify="right", style="bold")
    table.add_column()
    for key, value in summary.items():
        if isinstance(value, float):  # 60,012 tokens/s, not .4g's "6e+04"
            value = f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
        table.add_row(key, str(value))
    Console(stderr=False).print(table)
    if "output" in summary:
        print(f"pictures of this run: shoal report {summary['output']}")
