"""debug.profile_steps: torch.profiler around a range of optimizer steps on the ranks asked for.

The trainer calls `at(step)` before each step and `close()` after the loop. The profiler starts
before the first asked step, marks each step (`ProfilerStep#N`, N the optimizer step, so a trace
of steps 3-4 says 3 and 4; the mark of the last step ends when the profiler stops), stops after the last, and the rank writes its Chrome/Perfetto trace and
a summary (shoal/rundir/profile_summary.py) into <out>/profile/. Steps outside the range run
without the profiler: it slows the steps it records.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from shoal.config import DebugConfig
from shoal.rundir.observability import profile_ranks, profile_step_range
from shoal.rundir.profile_summary import trace_path, write_summary

TOP_OPS = 15


class StepProfiler:
    def __init__(self, debug: DebugConfig, rank: int, out: Path, device: torch.device):
        steps = profile_step_range(debug.profile_steps)
        ranks = None if debug.profile_ranks.strip() == "all" else profile_ranks(debug.profile_ranks)
        self._range = steps if steps and (ranks is None or rank in ranks) else None
        self._debug, self._rank, self._out, self._device = debug, rank, out, device
        self._prof = self._mark = None
        self._last = None

    def at(self, step: int) -> None:
        """Before optimizer step `step` (called again for a step that is redone: no effect)."""
        if self._range is None or step == self._last:
            return
        self._last = step
        first, last = self._range
        if step == first and self._prof is None:
            self._start()
        if self._prof is not None and step > last:
            self._finish()
        elif self._prof is not None:
            self._close_mark()
            # torch.profiler's own step marks count its step() calls; this one says the optimizer step
            self._mark = torch.profiler.record_function(f"ProfilerStep#{step}")
            self._mark.__enter__()

    def close(self) -> None:
        """After the loop: a range that ends with the run's last step is written here."""
        if self._prof is not None:
            self._finish()

    def _close_mark(self) -> None:
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        # Kineto prints a line per start and stop on stderr (its USDT level, above every named one);
        # read when the profiler first starts, so a user's own setting still wins.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._device.type == "cuda" else [])
        self._prof = profile(activities=activities, record_shapes=False, profile_memory=self._debug.profile_memory,
                             with_stack=self._debug.profile_stacks)
        self._prof.start()

    def _finish(self) -> None:
        self._close_mark()
        prof, self._prof = self._prof, None
        prof.stop()
        path = trace_path(self._out, self._rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        on_gpu = self._device.type == "cuda"
        averages = sorted(prof.key_averages(), key=lambda a: -(a.self_device_time_total if on_gpu else a.self_cpu_time_total))
        top = [{"name": a.key, "calls": a.count,
                "self_us": float(a.self_device_time_total if on_gpu else a.self_cpu_time_total)}
               for a in averages if not a.key.startswith("ProfilerStep")][:TOP_OPS]
        write_summary(self._out, self._rank, top)
