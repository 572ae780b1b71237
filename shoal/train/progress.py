"""What a person sees while a run trains: the live progress display, and the summary table at the end."""

from __future__ import annotations

import sys
import time


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
