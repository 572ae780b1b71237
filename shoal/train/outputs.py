"""What each step leaves behind: its metrics row, its progress line, and a checkpoint when one is due.

The order keeps the disk consistent: the row is on disk (fsynced) at least as far as any
checkpoint, and the weights are checked before they are saved, so an update that overflowed never
reaches a checkpoint (shoal/train/nonfinite.py). The NaN/Inf guard lives here because stopping
for it must first finish the save in flight and close the progress bar.
"""

from __future__ import annotations

from pathlib import Path

from shoal.rundir.metrics import MetricsLog
from shoal.train.metric_backends import open_backends
from shoal.train.nonfinite import NonFiniteGuard
from shoal.train.progress import Progress


class Outputs:
    def __init__(self, job, rt, out: Path, ckpt, start: int, *, show: bool, append: bool):
        t = job.cfg.train
        self.rt, self.ckpt, self.async_save = rt, ckpt, job.cfg.checkpoint.async_save
        backends = open_backends(job.cfg.metrics, out, start, job.cfg.to_dict()) if rt.is_main else []
        self.log = MetricsLog(out, enabled=rt.is_main, append=append, backends=backends)
        self.progress = Progress(t.steps, start, enabled=show and rt.is_main)
        self.guard = NonFiniteGuard(t.on_nonfinite, before_stop=self.close, report=rt.is_main)

    def keep(self, row: dict, params, *, stopping: bool = False) -> None:
        """After a step: its row and progress line, then the checkpoint when one is due (or now,
        `stopping` on SIGTERM), its weights checked first."""
        step = row["step"]
        due = self.ckpt.due(step)
        self.log.write(row, sync=due or stopping)  # on disk at least as far as the checkpoint
        self.progress.update(row)
        if due or stopping:
            self.guard.check_weights(step, params, self.rt)  # an update that overflowed never reaches disk
        self.ckpt.maybe_save(step, row["loss"], stopping=stopping)
        if due:
            self.progress.event(f"checkpoint at step {step} ({'saving in the background' if self.async_save else 'saved'})")

    def close(self) -> None:
        """Waits for a save still being written in the background, then ends the display and the log."""
        for done in (self.ckpt, self.progress, self.log):
            done.close()
